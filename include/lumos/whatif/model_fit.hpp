#pragma once
// Calibration against the traced configuration itself: once `model::calibrate` has fitted the
// per-kernel parameters, two host- and optimizer-level parameters are set so that the
// kernel-level model of the configuration the traces ran (found by structure discovery) spends
// what the traces spent per iteration:
//  - CPU dispatch per op (cpu.forward_op_ns = cpu.backward_op_ns): the traced rank's host time
//    in the iteration (its window less the waits for the GPU: synchronize calls and launches
//    blocked by a full queue; the framework's time between ops included) over the ops the model
//    launches for that configuration (every forward/backward op of the embedding, layers and
//    head per micro-batch, and the optimizer's), minus the launch call. A framework that runs
//    more, smaller kernels than the model (PyTorch eager with autocast casts) is charged per
//    modelled op what it really spent, so a prediction of another layer count or micro-batch
//    count scales the real host cost;
//  - memory-bound bandwidth (one factor on memory.elementwise/norm/softmax_bw_fraction): the
//    traced rank's memory-bound GPU time in the forward and backward passes against the model's
//    memory-bound ops of the traced configuration;
//  - optimizer bandwidth (memory.optimizer_bw_fraction): the traced rank's optimizer-phase GPU
//    time against the model's optimizer ops for the traced parameters per rank (PyTorch's
//    foreach AdamW makes several passes over the states where Megatron's fused step makes one).
// Only where the traces show what is needed; else the profile is left as it is, with the reason.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/calibrate.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/trace/runtime_calls.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace lumos::whatif {

/// What `fit_to_traced_configuration` measured and set.
struct model_fit {
  std::vector<std::string> notes;  ///< one line per parameter set or left as it was, with why
  double host_ns_per_iteration = 0;
  double modelled_ops_per_iteration = 0;
  double optimizer_gpu_ns = 0;
  double collectives_per_iteration = 0;  ///< communication ops of the traced rank's iteration
  double memory_gpu_ns = 0;  ///< memory-bound GPU ops of the passes (forward, backward) per iteration
  double parameters_per_rank = 0;
};

namespace detail {

/// Host time of the iteration [begin, end) of `t` (rank-local): its length less the time the
/// host waited for the GPU — synchronize calls, and the part of each launch call beyond four
/// times the median launch (a full launch queue blocks the call until the GPU drains it). Unlike
/// the sum of the CPU ops, this keeps the framework's own time between ops (Python, module
/// calls), which is part of what a CPU-bound step costs.
[[nodiscard]] inline double host_dispatch_ns(const trace::rank_trace& t, time_ns begin, time_ns end) {
  auto in_window = [&](const trace::event& e) {
    return e.ph == trace::phase::complete && e.cat == trace::category::cuda_runtime && e.ts >= begin && e.ts < end;
  };
  auto is_launch = [](std::string_view n) { return trace::is_kernel_launch_call(n) || trace::is_async_copy_call(n); };
  std::vector<time_ns> launches;
  for (const auto& e : t.events) {
    if (in_window(e) && is_launch(t.name(e))) launches.push_back(e.dur);
  }
  time_ns stall_from = std::numeric_limits<time_ns>::max();
  if (!launches.empty()) {
    std::nth_element(launches.begin(), launches.begin() + static_cast<std::ptrdiff_t>(launches.size() / 2), launches.end());
    stall_from = 4 * launches[launches.size() / 2];
  }
  double wait = 0;
  for (const auto& e : t.events) {
    if (!in_window(e)) continue;
    const auto n = t.name(e);
    if (n.find("Synchronize") != std::string_view::npos) {
      wait += static_cast<double>(std::min(e.end(), end) - e.ts);
    } else if (is_launch(n) && e.dur > stall_from) {
      wait += static_cast<double>(e.dur - stall_from);
    }
  }
  return std::max(0.0, static_cast<double>(end - begin) - wait);
}

/// The x in [lo, hi] where `f`, which falls as x grows (a modelled time against a bandwidth),
/// equals `target`, by bisection; the nearer bound when the target lies outside f's range.
template <class F>
[[nodiscard]] double solve_falling(const F& f, double target, double lo, double hi) {
  if (f(hi) >= target) return hi;
  if (f(lo) <= target) return lo;
  for (int i = 0; i < 60 && hi - lo > 1e-9; ++i) {
    const double mid = 0.5 * (lo + hi);
    (f(mid) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

/// Measures into `out` the traced iteration of `job.ranks[rank]`: its host time, communication
/// ops, and optimizer-phase and memory-bound pass GPU time. Sets `st` and `shape` to the traces'.
/// Throws `lumos::error` when the traced configuration is not known.
inline void measure_traced_rank(model_fit& out, job_structure& st, shape_config& shape, const trace::job& job, std::size_t rank) {
  const graph::built_job b = graph::build_graph(job);
  st = discover_structure(job, b, {});
  shape = traced_shape(st);
  if (!st.model.layers.known()) throw error("the layer count is unknown (" + st.model.layers.source + ")");
  if (rank >= st.ranks.size() || rank >= b.ranks.size()) throw error("no rank " + std::to_string(rank) + " in the traces");
  const auto& rs = st.ranks[rank];
  const time_ns offset = b.ranks[rank].offset;
  out.host_ns_per_iteration = host_dispatch_ns(job.ranks[rank], rs.iteration_start - offset, rs.iteration_end - offset);
  const trace::rank_trace& t0 = job.ranks[rank];
  for (const auto& g : st.gpu_ops) {
    if (g.rank != rank) continue;
    if (g.comm) {
      out.collectives_per_iteration += 1;
      continue;
    }
    const auto& e = t0.events[g.op];
    if (g.phase == phase_kind::optimizer) out.optimizer_gpu_ns += static_cast<double>(e.dur);
    const bool in_pass = g.phase == phase_kind::forward || g.phase == phase_kind::backward;
    if (in_pass && classify(graph::task_kind::gpu_compute, t0.name(e)) == op_bound::memory) out.memory_gpu_ns += static_cast<double>(e.dur);
  }
}

/// The traced configuration as the kernel-level model reads it, and what one iteration of the
/// traced rank ran of it.
struct traced_iteration {
  model::transformer m;
  model::parallel_config par;
  model::hardware hw;
  std::int64_t micro_batches = 1;
  int stage = 0;
  int chunks = 1;
  double fwd_passes = 0, bwd_passes = 0;  ///< each over the layers of one chunk
  double layers_per_pass = 0;
  bool has_optimizer = false;

  /// The rank's stage and passes (a forward-only step has no backward ops and no optimizer);
  /// `m` and `par` validated.
  void count_passes(const job_structure& st, const rank_structure& rs) {
    stage = rs.stage.value.value_or(0);
    chunks = std::max(st.parallel.chunks.value.value_or(1), 1);
    for (const auto& ps : rs.passes) {
      (ps.op.kind == pipeline::op_kind::forward ? fwd_passes : bwd_passes) += 1;
    }
    if (rs.passes.empty()) fwd_passes = bwd_passes = static_cast<double>(micro_batches * chunks);
    has_optimizer = std::any_of(rs.phases.begin(), rs.phases.end(), [](const phase_span& p) { return p.kind == phase_kind::optimizer; });
    layers_per_pass = static_cast<double>(m.layers / par.pp) / chunks;
  }

  /// Sum of `value(op)` over the ops of `k` that the iteration runs (its layers, and the
  /// embedding or head on the first or last stage), optimizer aside.
  template <class Value>
  [[nodiscard]] double sum(const model::kernel_level& k, Value value) const {
    auto over = [&](const model::op_list& l, double forward_weight, double backward_weight) {
      double v = 0;
      for (const auto& o : l.ops) {
        const bool fwd = o.phase == model::op_phase::forward && !o.recompute;
        v += value(o) * (fwd ? forward_weight : backward_weight);
      }
      return v;
    };
    double v = over(k.layer(m, par, hw), fwd_passes * layers_per_pass, bwd_passes * layers_per_pass);
    if (stage == 0) v += over(k.embedding(m, par, hw), fwd_passes / chunks, bwd_passes / chunks);
    if (stage == par.pp - 1) v += over(k.head(m, par, hw), fwd_passes / chunks, bwd_passes / chunks);
    return v;
  }
};

/// The model of the traced configuration `shape` and `st` (the vocabulary from the logits GEMM:
/// 0 when none was seen) on `hw`, its passes not yet counted.
[[nodiscard]] inline traced_iteration traced_configuration(const trace::job& job, const job_structure& st, const shape_config& shape,
                                                           const model::hardware& hw) {
  traced_iteration it;
  it.hw = hw;
  model::transformer& m = it.m;
  m.name = "traced";
  m.layers = *st.model.layers.value;
  m.hidden = shape.hidden, m.ffn = shape.ffn, m.heads = shape.heads, m.kv_heads = shape.heads, m.seq = shape.seq;
  const std::int64_t vocab_local = traced_vocab_local(job, st, shape);
  m.vocab = vocab_local > 0 ? vocab_local * shape.tp : 0;
  model::parallel_config& par = it.par;
  par.tp = shape.tp;
  par.pp = std::max(st.parallel.pp.value.value_or(1), 1);
  par.dp = std::max(st.parallel.dp.value.value_or(1), 1);
  par.micro_batch = shape.micro_batch;
  it.micro_batches = std::max(st.parallel.micro_batches.value.value_or(1), 1);
  par.global_batch = par.micro_batch * par.dp * it.micro_batches;
  return it;
}

/// Sets the CPU dispatch per op of `c` so that `ops` modelled ops take the traced host time.
inline void fit_cpu_dispatch(model::calibration& c, model_fit& out, double ops, const std::string& from) {
  if (out.host_ns_per_iteration <= 0 || ops <= 0) return;
  const double per_op = std::max(0.0, out.host_ns_per_iteration / ops - c.profile.cpu_launch_ns);
  c.profile.cpu_forward_op_ns = c.profile.cpu_backward_op_ns = per_op;
  c.profile.cpu_collective_ns = per_op + c.profile.cpu_launch_ns;
  c.profile.cpu_layer_glue_ns = 0;
  const std::string why = from + "the iteration's host time (its window less synchronize calls and blocked launches) / the model's ops, minus one launch";
  for (const char* k : {"cpu.forward_op_ns", "cpu.backward_op_ns", "cpu.collective_ns"}) c.profile.provenance[k] = why;
  c.profile.provenance["cpu.layer_glue_ns"] = from + "0: folded into the per-op time";
  char line[256];
  std::snprintf(line, sizeof line,
                "CPU dispatch %.1f us per modelled op: %.3f ms of host time per iteration over %.0f modelled ops (%.0f of them collectives)",
                per_op / 1e3, out.host_ns_per_iteration / 1e6, ops, out.collectives_per_iteration);
  out.notes.emplace_back(line);
}

/// Sets one factor on the elementwise, norm and softmax bandwidth fractions of `c` so that the
/// model's memory-bound ops of the passes take the traced time (a framework may run more of them
/// than the model: PyTorch's autocast casts, bias adds, copies).
inline void fit_memory_bandwidth(model::calibration& c, model_fit& out, const traced_iteration& it, const std::string& from) {
  if (out.memory_gpu_ns <= 0) return;
  const double e0 = c.profile.elementwise_bw, n0 = c.profile.norm_bw, s0 = c.profile.softmax_bw;
  auto modelled = [&](double k) {
    model::cost_profile p = c.profile;
    p.elementwise_bw = std::min(1.0, e0 * k), p.norm_bw = std::min(1.0, n0 * k), p.softmax_bw = std::min(1.0, s0 * k);
    return it.sum(model::kernel_level{p}, [](const model::op_cost& o) {
      return o.kind == model::op_class::elementwise || o.kind == model::op_class::norm ? static_cast<double>(o.duration) : 0.0;
    });
  };
  // Up to the factor that saturates every fraction at 1, each clamped on its own: bounded by
  // the largest fraction, the unused softmax one (0.7 in the H100 preset; FlashAttention
  // models have no softmax kernel) stopped an H100 job's fit at x1.43, short of its time.
  const double k = solve_falling(modelled, out.memory_gpu_ns, 1e-3, 1.0 / std::max(1e-3, std::min({e0, n0, s0})));
  c.profile.elementwise_bw = std::min(1.0, e0 * k), c.profile.norm_bw = std::min(1.0, n0 * k), c.profile.softmax_bw = std::min(1.0, s0 * k);
  const std::string why = from + "x" + std::to_string(k) +
                          " on the per-kernel fits, so that the model's memory-bound ops of the passes take the traced memory-bound GPU time";
  for (const char* key : {"memory.elementwise_bw_fraction", "memory.norm_bw_fraction", "memory.softmax_bw_fraction"}) {
    c.profile.provenance[key] = why;
  }
  char line[256];
  std::snprintf(line, sizeof line, "memory-bound ops of the passes: bandwidth fractions x%.3f (%.3f ms of such GPU time per iteration)", k,
                out.memory_gpu_ns / 1e6);
  out.notes.emplace_back(line);
}

/// Sets the optimizer bandwidth of `c` so that the model's optimizer ops for the traced
/// parameters per rank take the traced optimizer-phase time; a note when there is none.
inline void fit_optimizer_bandwidth(model::calibration& c, model_fit& out, const traced_iteration& it, const std::string& from) {
  if (out.optimizer_gpu_ns <= 0) {
    out.notes.emplace_back("optimizer bandwidth kept: no optimizer-phase GPU op in the traced iteration");
    return;
  }
  auto modelled = [&](double bw) {
    model::cost_profile p = c.profile;
    p.optimizer_bw = bw;
    const model::op_list ol = model::kernel_level{p}.optimizer(it.m, it.par, it.hw, it.stage);
    double ns = 0;
    for (const auto& o : ol.ops) ns += static_cast<double>(o.duration);
    return ns;
  };
  c.profile.optimizer_bw = solve_falling(modelled, out.optimizer_gpu_ns, 0.01, 1.0);
  c.profile.provenance["memory.optimizer_bw_fraction"] =
      from + "the optimizer phase's GPU time against the model's optimizer ops for the traced parameters per rank";
  char line[256];
  std::snprintf(line, sizeof line, "optimizer %.3f of HBM peak: %.3f ms of optimizer GPU time per iteration for %.1f M parameters per rank",
                c.profile.optimizer_bw, out.optimizer_gpu_ns / 1e6, out.parameters_per_rank / 1e6);
  out.notes.emplace_back(line);
}

}  // namespace detail

/// Sets the CPU dispatch, the memory-bound factor and the optimizer bandwidth of `c.profile` from
/// the configuration of `job`, measured on `job.ranks[rank]` (see the header comment); `source`
/// names the traces in the provenance. Deterministic. Never throws for what the traces lack: it
/// says so in the notes.
inline model_fit fit_to_traced_configuration(model::calibration& c, const trace::job& job, const std::string& source,
                                             std::size_t rank = 0) {
  model_fit out;
  job_structure st;
  shape_config shape;
  try {
    detail::measure_traced_rank(out, st, shape, job, rank);
  } catch (const error& e) {
    out.notes.push_back(std::string("CPU dispatch and optimizer bandwidth kept (the traced configuration is not known: ") + e.what() + ")");
    return out;
  }
  detail::traced_iteration it = detail::traced_configuration(job, st, shape, model::hardware_preset(c.profile.hardware));
  const std::string from = "fitted to the traced configuration of " + source + " (" + std::to_string(it.m.layers) + " layers, hidden " +
                           std::to_string(it.m.hidden) + ", " + std::to_string(it.micro_batches) + " micro-batches): ";
  try {
    if (it.m.vocab <= 0) it.m.vocab = 1;  // no logits GEMM seen: a negligible embedding
    it.m.validate();
    it.par.validate(it.m, it.hw);
    const model::kernel_level kl{c.profile};
    it.count_passes(st, st.ranks[rank]);
    double ops = it.sum(kl, [](const model::op_cost&) { return 1.0; });
    if (it.has_optimizer) ops += static_cast<double>(kl.optimizer(it.m, it.par, it.hw, it.stage).ops.size());
    // The model's collectives (TP, DP, p2p) are host tasks of their own (cpu.collective_ns, set to
    // one op's dispatch and launch below): counted as the traced rank's communication ops.
    ops += out.collectives_per_iteration;
    out.modelled_ops_per_iteration = ops;
    detail::fit_cpu_dispatch(c, out, ops, from);
    detail::fit_memory_bandwidth(c, out, it, from);
    out.parameters_per_rank = static_cast<double>(model::stage_parameters_per_rank(it.m, it.par, it.stage));
    detail::fit_optimizer_bandwidth(c, out, it, from);
    model::validate(c.profile);
  } catch (const error& e) {
    out.notes.push_back(std::string("CPU dispatch and optimizer bandwidth kept: ") + e.what());
  }
  return out;
}

}  // namespace lumos::whatif

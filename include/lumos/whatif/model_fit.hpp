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
  auto is_launch = [](std::string_view n) {
    return n == "cudaLaunchKernel" || n == "cuLaunchKernel" || n == "cudaLaunchKernelExC" || n == "cudaMemcpyAsync" ||
           n == "cudaMemsetAsync";
  };
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
    const graph::built_job b = graph::build_graph(job);
    st = discover_structure(job, b, {});
    shape = traced_shape(st);
    if (!st.model.layers.known()) throw error("the layer count is unknown (" + st.model.layers.source + ")");
    if (rank >= st.ranks.size() || rank >= b.ranks.size()) throw error("no rank " + std::to_string(rank) + " in the traces");
    const auto& rs = st.ranks[rank];
    const time_ns offset = b.ranks[rank].offset;
    out.host_ns_per_iteration = detail::host_dispatch_ns(job.ranks[rank], rs.iteration_start - offset, rs.iteration_end - offset);
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
  } catch (const error& e) {
    out.notes.push_back(std::string("CPU dispatch and optimizer bandwidth kept (the traced configuration is not known: ") + e.what() + ")");
    return out;
  }
  const auto& par_f = st.parallel;
  const model::hardware hw = model::hardware_preset(c.profile.hardware);
  model::transformer m;
  m.name = "traced";
  m.layers = *st.model.layers.value;
  m.hidden = shape.hidden, m.ffn = shape.ffn, m.heads = shape.heads, m.kv_heads = shape.heads, m.seq = shape.seq;
  const std::int64_t vocab_local = traced_vocab_local(job, st, shape);
  m.vocab = vocab_local > 0 ? vocab_local * shape.tp : 0;
  model::parallel_config par;
  par.tp = shape.tp;
  par.pp = std::max(par_f.pp.value.value_or(1), 1);
  par.dp = std::max(par_f.dp.value.value_or(1), 1);
  par.micro_batch = shape.micro_batch;
  const std::int64_t micro_batches = std::max(par_f.micro_batches.value.value_or(1), 1);
  par.global_batch = par.micro_batch * par.dp * micro_batches;
  const std::string from = "fitted to the traced configuration of " + source + " (" + std::to_string(m.layers) + " layers, hidden " +
                           std::to_string(m.hidden) + ", " + std::to_string(micro_batches) + " micro-batches): ";
  try {
    if (m.vocab <= 0) m.vocab = 1;  // no logits GEMM seen: a negligible embedding
    m.validate();
    par.validate(m, hw);
    const model::kernel_level kl{c.profile};
    const int stage = st.ranks[rank].stage.value.value_or(0);
    // What the traced iteration ran on this rank: its forward and backward passes (a
    // forward-only step has no backward ops and no optimizer), each over the layers of one chunk.
    const auto& rs = st.ranks[rank];
    const int chunks = std::max(par_f.chunks.value.value_or(1), 1);
    double fwd_passes = 0, bwd_passes = 0;
    for (const auto& ps : rs.passes) {
      (ps.op.kind == pipeline::op_kind::forward ? fwd_passes : bwd_passes) += 1;
    }
    if (rs.passes.empty()) fwd_passes = bwd_passes = static_cast<double>(micro_batches * chunks);
    const bool has_optimizer = std::any_of(rs.phases.begin(), rs.phases.end(), [](const phase_span& p) { return p.kind == phase_kind::optimizer; });
    const double layers_per_pass = static_cast<double>(m.layers / par.pp) / chunks;
    // Sum of `value(op)` over the model's ops of the traced iteration.
    auto per_iteration = [&](const model::kernel_level& k, auto value) {
      auto sum = [&](const model::op_list& l, double forward_weight, double backward_weight) {
        double v = 0;
        for (const auto& o : l.ops) {
          const bool fwd = o.phase == model::op_phase::forward && !o.recompute;
          v += value(o) * (fwd ? forward_weight : backward_weight);
        }
        return v;
      };
      double v = sum(k.layer(m, par, hw), fwd_passes * layers_per_pass, bwd_passes * layers_per_pass);
      if (stage == 0) v += sum(k.embedding(m, par, hw), fwd_passes / chunks, bwd_passes / chunks);
      if (stage == par.pp - 1) v += sum(k.head(m, par, hw), fwd_passes / chunks, bwd_passes / chunks);
      return v;
    };
    double ops = per_iteration(kl, [](const model::op_cost&) { return 1.0; });
    if (has_optimizer) ops += static_cast<double>(kl.optimizer(m, par, hw, stage).ops.size());
    // The model's collectives (TP, DP, p2p) are host tasks of their own (cpu.collective_ns, set to
    // one op's dispatch and launch below): counted as the traced rank's communication ops.
    ops += out.collectives_per_iteration;
    out.modelled_ops_per_iteration = ops;
    if (out.host_ns_per_iteration > 0 && ops > 0) {
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
    // Memory-bound kernels of the passes: one factor on the elementwise, norm and softmax
    // bandwidth fractions so that the model's memory-bound ops of the passes take the traced
    // time (a framework may run more of them than the model: PyTorch's autocast casts, bias
    // adds, copies).
    if (out.memory_gpu_ns > 0) {
      const double e0 = c.profile.elementwise_bw, n0 = c.profile.norm_bw, s0 = c.profile.softmax_bw;
      auto modelled = [&](double k) {
        model::cost_profile p = c.profile;
        p.elementwise_bw = std::min(1.0, e0 * k), p.norm_bw = std::min(1.0, n0 * k), p.softmax_bw = std::min(1.0, s0 * k);
        return per_iteration(model::kernel_level{p}, [](const model::op_cost& o) {
          return o.kind == model::op_class::elementwise || o.kind == model::op_class::norm ? static_cast<double>(o.duration) : 0.0;
        });
      };
      // Up to the factor that saturates every fraction at 1, each clamped on its own: bounded by
      // the largest fraction, the unused softmax one (0.7 in the H100 preset; FlashAttention
      // models have no softmax kernel) stopped an H100 job's fit at x1.43, short of its time.
      const double k = detail::solve_falling(modelled, out.memory_gpu_ns, 1e-3, 1.0 / std::max(1e-3, std::min({e0, n0, s0})));
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
    out.parameters_per_rank = static_cast<double>(model::stage_parameters_per_rank(m, par, stage));
    if (out.optimizer_gpu_ns > 0) {
      auto modelled = [&](double bw) {
        model::cost_profile p = c.profile;
        p.optimizer_bw = bw;
        const model::op_list ol = model::kernel_level{p}.optimizer(m, par, hw, stage);
        double ns = 0;
        for (const auto& o : ol.ops) ns += static_cast<double>(o.duration);
        return ns;
      };
      c.profile.optimizer_bw = detail::solve_falling(modelled, out.optimizer_gpu_ns, 0.01, 1.0);
      c.profile.provenance["memory.optimizer_bw_fraction"] =
          from + "the optimizer phase's GPU time against the model's optimizer ops for the traced parameters per rank";
      char line[256];
      std::snprintf(line, sizeof line, "optimizer %.3f of HBM peak: %.3f ms of optimizer GPU time per iteration for %.1f M parameters per rank",
                    c.profile.optimizer_bw, out.optimizer_gpu_ns / 1e6, out.parameters_per_rank / 1e6);
      out.notes.emplace_back(line);
    } else {
      out.notes.emplace_back("optimizer bandwidth kept: no optimizer-phase GPU op in the traced iteration");
    }
    model::validate(c.profile);
  } catch (const error& e) {
    out.notes.push_back(std::string("CPU dispatch and optimizer bandwidth kept: ") + e.what());
  }
  return out;
}

}  // namespace lumos::whatif

#pragma once
// The pipeline what-if (`lumos whatif --pp N --vp N --schedule NAME`): a PASS-LEVEL model. The
// baseline replay gives, per pass of every rank, its replayed host span (its launch calls) and GPU
// span (its kernels); structure discovery gives
// the passes' micro-batches and chunks and the layer task groups inside them. From these it
// measures one layer's forward and backward cost, each kind of stage's non-layer work (embedding
// on the first virtual stage, loss on the last), the gap between two passes of a stage, and the
// latency of a cross-stage dependency (the trace's own send/recv, else the NCCL model by bytes).
// The target pipeline is then, per stage, a host thread and a stream with one task per pass each
// (the GPU task starts a launch latency after its host task), in the order the schedule policy gives (pipeline/), with `pipeline::dependency_of` edges carrying that latency,
// replayed by the engine. The prediction is the baseline replay plus the change of this model
// between the traces' configuration and the target (so the identity is exact, and what the model
// leaves out — head, optimizer, DP tail — is kept as replayed). It does not yet copy the layers'
// CPU launches and kernels into a new fine-grained graph (see docs/whatif.md).

#include <lumos/core/error.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// The target pipeline; unset fields keep the traces'.
struct pipeline_target {
  std::optional<int> pp, vp, micro_batches, layers;
  std::optional<synth::schedule_policy> schedule;  ///< any `pipeline::PipelineSchedule` (`synth::policy_of<S>()`)
};

/// A cost on the host (the launch calls of a pass) and on the GPU (its kernels), ns.
struct host_device {
  time_ns cpu = 0, gpu = 0;
};

/// Costs measured on the baseline replay (ns).
struct pass_costs {
  host_device layer_forward, layer_backward;  ///< one layer of one micro-batch
  double weight_fraction = 0.5;  ///< share of a layer's backward that is weight gradient (ZB W)
  std::string weight_source;
  /// Non-layer work of a pass by (kind: 0 F / 1 B, first virtual stage, last virtual stage).
  std::map<std::tuple<int, bool, bool>, host_device> extra;
  time_ns gap_forward = 0, gap_backward = 0;  ///< host time between two passes of a stage (the least)
  time_ns launch_latency = 0;                 ///< a pass's first launch → its first kernel
  /// Cross-stage dependency: consumer's first launch ≥ producer's end + latency, the producer's
  /// end being its last kernel (`from_gpu`) or, when the trace's consumers start before that
  /// (a send issued from the host ahead of the GPU), its last launch.
  time_ns latency_forward = 0, latency_backward = 0;
  bool from_gpu = true;
  std::string latency_source;
  time_ns replay_span = 0;  ///< first pass start → last pass end over the ranks, replayed
  std::vector<std::string> notes;
};

struct stage_prediction {
  int stage = 0;
  time_ns busy = 0, end = 0;  ///< GPU pass work; last pass end (from the first pass start)
};

/// A pass-level schedule simulated: makespan, per-stage busy time and end, bubble fraction.
struct pipeline_simulation {
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();
  pipeline::schedule_shape shape{};
  int layers_per_chunk = 0;
  time_ns makespan = 0;
  double bubble_fraction = 0;  ///< 1 − Σ busy / (p · makespan), GPU
  std::vector<stage_prediction> stages;
  std::size_t p2p_transfers = 0;
};

struct pipeline_prediction {
  pipeline_simulation baseline, predicted;  ///< the model for the traces' configuration and the target
  pass_costs costs;
  time_ns baseline_iteration = 0;  ///< the replay the prediction is anchored on
  time_ns iteration_ns = 0;        ///< baseline_iteration + predicted.makespan · (replay span / baseline.makespan) − replay span
  std::vector<std::string> changes;
};

namespace detail {

[[nodiscard]] inline bool name_has(std::string_view name, std::string_view what) {
  std::string l(name);
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l.find(what) != std::string::npos;
}

/// Extra of (kind, first, last), composed from the observed classes when the target has a stage
/// kind the trace did not: a middle stage takes the smallest observed extra of its kind; a stage
/// that is both first and last takes first + last − middle.
[[nodiscard]] inline host_device class_extra(const pass_costs& c, int kind, bool first, bool last) {
  if (const auto it = c.extra.find({kind, first, last}); it != c.extra.end()) return it->second;
  host_device smallest{std::numeric_limits<time_ns>::max(), std::numeric_limits<time_ns>::max()};
  for (const auto& [k, v] : c.extra) {
    if (std::get<0>(k) == kind) smallest.cpu = std::min(smallest.cpu, v.cpu), smallest.gpu = std::min(smallest.gpu, v.gpu);
  }
  if (smallest.cpu == std::numeric_limits<time_ns>::max()) smallest = {};
  if (!first && !last) return smallest;
  if (first && last) {
    const host_device a = class_extra(c, kind, true, false), b = class_extra(c, kind, false, true);
    return {std::max<time_ns>(0, a.cpu + b.cpu - smallest.cpu), std::max<time_ns>(0, a.gpu + b.gpu - smallest.gpu)};
  }
  return smallest;
}

struct span {
  time_ns begin = std::numeric_limits<time_ns>::max(), end = std::numeric_limits<time_ns>::min();
  [[nodiscard]] bool empty() const noexcept { return begin > end; }
  void add(time_ns b, time_ns e) noexcept { begin = std::min(begin, b), end = std::max(end, e); }
};

/// s / n rounded to whole ns.
[[nodiscard]] inline time_ns mean_ns(double s, double n) { return static_cast<time_ns>(std::llround(s / n)); }

/// Replayed host and GPU spans of each pass, `[rank index][pass]`.
struct pass_spans {
  std::vector<std::vector<span>> cpu, gpu;
};

/// Where a rank's pass work ends on the host: the optimizer's launches follow the last pass on
/// the host while its kernels still run, and are not the pass's.
[[nodiscard]] inline time_ns pass_cutoff(const rank_structure& rs) {
  time_ns cutoff = std::numeric_limits<time_ns>::max();
  for (const auto& ph : rs.phases) {
    if (ph.kind == phase_kind::optimizer || ph.kind == phase_kind::other) {
      bool after = true;
      for (const auto& ps : rs.passes) after = after && ph.start >= ps.start;
      if (after) cutoff = std::min(cutoff, ph.start);
    }
  }
  return cutoff;
}

/// The replayed spans of every pass: of the kernels (not communication) whose launch call
/// falls in the pass's window, and of those calls (passes are runs of launches, so the latest
/// pass starting before the call owns it).
[[nodiscard]] inline pass_spans measure_pass_spans(const graph::task_graph& g, const report::task_times& times, const job_structure& st) {
  std::vector<graph::task_id> launched_by(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launched_by[e.to] = e.from;
  }
  std::map<int, std::size_t> index_of;
  for (std::size_t i = 0; i < st.ranks.size(); ++i) index_of[st.ranks[i].rank] = i;
  std::vector<std::vector<graph::task_id>> on_rank(st.ranks.size());
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] != graph::task_kind::gpu_compute || launched_by[t] == graph::no_task) continue;
    if (const auto it = index_of.find(g.rank[t]); it != index_of.end()) on_rank[it->second].push_back(t);
  }
  pass_spans out;
  out.cpu.resize(st.ranks.size()), out.gpu.resize(st.ranks.size());
  for (std::size_t ri = 0; ri < st.ranks.size(); ++ri) {
    const auto& passes = st.ranks[ri].passes;
    out.cpu[ri].resize(passes.size()), out.gpu[ri].resize(passes.size());
    const time_ns cutoff = pass_cutoff(st.ranks[ri]);
    for (const graph::task_id t : on_rank[ri]) {
      const graph::task_id call = launched_by[t];
      const time_ns at = g.observed_start[call];
      if (at >= cutoff) continue;
      std::size_t best = passes.size();
      for (std::size_t k = 0; k < passes.size(); ++k) {
        if (passes[k].start <= at && at <= passes[k].end && (best == passes.size() || passes[k].start >= passes[best].start)) best = k;
      }
      if (best == passes.size()) continue;
      out.cpu[ri][best].add(times.begin_of(call), times.end_of(call));
      out.gpu[ri][best].add(times.begin_of(t), times.end_of(t));
    }
  }
  return out;
}

/// Summed replayed layer costs per pass kind (forward, backward, and W of traces that ran a
/// zero-bubble schedule), with the GPU time of the backward layers' kernels named wgrad and not.
struct layer_sums {
  double cpu[3] = {0, 0, 0}, gpu[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  double wgrad = 0, bgrad = 0;
};

/// The layers' costs summed: the replayed increment of consecutive layers of a pass, on the host
/// (launch calls) and on the GPU; the first layer of a pass by its own span.
[[nodiscard]] inline layer_sums sum_layer_costs(const graph::task_graph& g, const report::task_times& times, const job_structure& st) {
  layer_sums out;
  using layer_key = std::tuple<int, int, int, int>;  // rank, pass kind, pass, layer
  std::map<layer_key, std::pair<span, span>> layer_span;
  for (const auto& lg : st.layer_groups) {
    span c, k;
    for (const graph::task_id t : lg.tasks) {
      if (g.kind[t] == graph::task_kind::gpu_compute) {
        k.add(times.begin_of(t), times.end_of(t));
        if (lg.op.kind == pipeline::op_kind::backward) {
          (name_has(g.task_name(t), "wgrad") ? out.wgrad : out.bgrad) += static_cast<double>(times.duration_of(t));
        }
      } else if (g.kind[t] == graph::task_kind::cpu) {
        c.add(times.begin_of(t), times.end_of(t));
      }
    }
    if (k.empty() || c.empty()) continue;
    layer_span[{lg.rank, static_cast<int>(lg.op.kind), lg.op.micro_batch * 4096 + lg.op.chunk, lg.layer}] = {c, k};
  }
  for (const auto& [key, sp] : layer_span) {
    const auto [rank, kind, pass, layer] = key;
    const auto prev = layer_span.find({rank, kind, pass, kind == 0 ? layer - 1 : layer + 1});  // backward runs layers in reverse
    if (prev != layer_span.end()) {
      out.cpu[kind] += static_cast<double>(sp.first.end - prev->second.first.end);
      out.gpu[kind] += static_cast<double>(sp.second.end - prev->second.second.end);
    } else {
      out.cpu[kind] += static_cast<double>(sp.first.end - sp.first.begin);
      out.gpu[kind] += static_cast<double>(sp.second.end - sp.second.begin);
    }
    out.count[kind] += 1;
  }
  return out;
}

/// A layer's backward as a backward pass's span over its layers, non-layer work included, added
/// to `sums`: backward layers are found only when the backward repeats a block exactly L times
/// (docs/whatif.md).
inline void sum_backward_pass_spans(layer_sums& sums, const job_structure& st, const pass_spans& spans) {
  for (std::size_t ri = 0; ri < st.ranks.size(); ++ri) {
    const auto lpp = st.ranks[ri].layers_per_pass.value.value_or(0);
    const auto &cpu = spans.cpu[ri], &gpu = spans.gpu[ri];
    for (std::size_t k = 0; k < st.ranks[ri].passes.size(); ++k) {
      if (st.ranks[ri].passes[k].op.kind != pipeline::op_kind::backward || lpp <= 0 || gpu[k].empty() || cpu[k].empty()) continue;
      sums.cpu[1] += static_cast<double>(cpu[k].end - cpu[k].begin) / lpp;
      sums.gpu[1] += static_cast<double>(gpu[k].end - gpu[k].begin) / lpp;
      sums.count[1] += 1;
    }
  }
}

/// Sets a layer's forward and backward cost and its weight-gradient share in `out` from `sums`;
/// returns what a backward pass of the traces runs per layer (all of the layer's backward, or its B).
inline host_device set_layer_costs(pass_costs& out, const layer_sums& sums) {
  out.layer_forward = {mean_ns(sums.cpu[0], sums.count[0]), mean_ns(sums.gpu[0], sums.count[0])};
  out.layer_backward = {mean_ns(sums.cpu[1], sums.count[1]), mean_ns(sums.gpu[1], sums.count[1])};
  const host_device traced_backward = out.layer_backward;
  if (sums.count[2] > 0) {
    // The traces' own W passes: a layer's backward is its B and its W.
    const host_device w{mean_ns(sums.cpu[2], sums.count[2]), mean_ns(sums.gpu[2], sums.count[2])};
    out.layer_backward = {traced_backward.cpu + w.cpu, traced_backward.gpu + w.gpu};
    out.weight_fraction = out.layer_backward.gpu > 0 ? static_cast<double>(w.gpu) / static_cast<double>(out.layer_backward.gpu) : 0.5;
    out.weight_source = "the traces' own W passes (zero bubble): their share of a layer's backward GPU time";
  } else if (sums.wgrad > 0) {
    out.weight_fraction = sums.wgrad / (sums.wgrad + sums.bgrad);
    out.weight_source = "GPU time of the layers' backward kernels named wgrad";
  } else {
    out.weight_source = "no weight-gradient kernel named in the trace: half of each layer's backward";
  }
  return traced_backward;
}

/// Each pass's host and GPU span by (stage, kind: 0 F / 1 B, micro-batch, chunk).
using stage_pass_spans = std::map<std::tuple<int, int, int, int>, std::pair<span, span>>;

/// Sets in `out` the non-layer work of each class of pass, the least host gap between two passes
/// of a stage, the launch latency and the replayed span; `traced_backward` is a layer's work in a
/// traced backward pass. Returns the passes' spans by stage, for the cross-stage latencies.
inline stage_pass_spans measure_pass_extras(pass_costs& out, const job_structure& st, const pass_spans& spans,
                                            const host_device& traced_backward) {
  const int p = st.parallel.pp.value.value_or(1);
  const int V = p * st.parallel.chunks.value.value_or(1);
  std::map<std::tuple<int, bool, bool>, std::array<double, 3>> extra;
  constexpr time_ns big = std::numeric_limits<time_ns>::max();
  time_ns gap[2] = {big, big}, launch = big;
  stage_pass_spans by_stage_op;
  time_ns first = big, last = std::numeric_limits<time_ns>::min();
  for (std::size_t ri = 0; ri < st.ranks.size(); ++ri) {
    const auto& rs = st.ranks[ri];
    const int stage = rs.stage.value.value_or(0);
    const auto lpp = static_cast<time_ns>(rs.layers_per_pass.value.value_or(0));
    std::size_t prev = rs.passes.size();
    for (std::size_t k = 0; k < rs.passes.size(); ++k) {
      const auto& ps = rs.passes[k];
      const span &c = spans.cpu[ri][k], &x = spans.gpu[ri][k];
      if (x.empty() || c.empty() || ps.op.kind == pipeline::op_kind::weight) continue;
      const int kind = ps.op.kind == pipeline::op_kind::forward ? 0 : 1;
      const int vs = ps.op.chunk * p + stage;
      const host_device& layer = kind == 0 ? out.layer_forward : traced_backward;
      auto& acc = extra[{kind, vs == 0, vs == V - 1}];
      acc[0] += static_cast<double>(std::max<time_ns>(0, c.end - c.begin - lpp * layer.cpu));
      acc[1] += static_cast<double>(std::max<time_ns>(0, x.end - x.begin - lpp * layer.gpu));
      acc[2] += 1;
      by_stage_op[{stage, kind, ps.op.micro_batch, ps.op.chunk}] = {c, x};
      first = std::min(first, std::min(c.begin, x.begin)), last = std::max(last, x.end);
      launch = std::min(launch, x.begin - c.begin);
      // The least: a longer gap waited for another stage, which the dependency edges model.
      if (prev < rs.passes.size()) gap[kind] = std::min(gap[kind], c.begin - spans.cpu[ri][prev].end);
      prev = k;
    }
  }
  for (const auto& [key, acc] : extra) out.extra[key] = {mean_ns(acc[0], acc[2]), mean_ns(acc[1], acc[2])};
  for (int k = 0; k < 2; ++k) gap[k] = gap[k] == big ? 0 : std::max<time_ns>(0, gap[k]);
  out.gap_forward = gap[0], out.gap_backward = gap[1];
  out.launch_latency = launch == big ? 0 : std::max<time_ns>(0, launch);
  out.replay_span = last > first ? last - first : 0;
  return by_stage_op;
}

/// Sets the cross-stage latencies of `out`: the shortest replayed wait of the trace's own
/// send/recv, else `p2p_model_ns` plus the host gap between two passes (`out`'s gaps set).
inline void measure_stage_latency(pass_costs& out, const job_structure& st, const stage_pass_spans& by_stage_op, time_ns p2p_model_ns,
                                  const std::string& p2p_model_source) {
  const int p = st.parallel.pp.value.value_or(1);
  const pipeline::schedule_shape shape{p, st.parallel.micro_batches.value.value_or(1), st.parallel.chunks.value.value_or(1)};
  constexpr time_ns big = std::numeric_limits<time_ns>::max();
  time_ns lat_gpu[2] = {big, big}, lat_cpu[2] = {big, big};
  for (const auto& [key, sp] : by_stage_op) {
    const auto [stage, kind, mb, chunk] = key;
    const pipeline::op o{kind == 0 ? pipeline::op_kind::forward : pipeline::op_kind::backward, mb, chunk};
    const auto dep = pipeline::dependency_of(shape, stage, o);
    if (!dep || !dep->crosses_stages(stage)) continue;
    const auto from = by_stage_op.find({dep->on.stage, dep->on.what.kind == pipeline::op_kind::forward ? 0 : 1, dep->on.what.micro_batch,
                                        dep->on.what.chunk});
    if (from == by_stage_op.end()) continue;
    lat_gpu[kind] = std::min(lat_gpu[kind], sp.first.begin - from->second.second.end);
    lat_cpu[kind] = std::min(lat_cpu[kind], sp.first.begin - from->second.first.end);
  }
  if (lat_gpu[0] != big && lat_gpu[1] != big) {
    out.from_gpu = lat_gpu[0] >= 0 && lat_gpu[1] >= 0;
    out.latency_forward = std::max<time_ns>(0, out.from_gpu ? lat_gpu[0] : lat_cpu[0]);
    out.latency_backward = std::max<time_ns>(0, out.from_gpu ? lat_gpu[1] : lat_cpu[1]);
    out.latency_source = std::string("the trace's own send/recv: the shortest replayed wait from the producer's ") +
                         (out.from_gpu ? "last kernel" : "last launch (its consumers start before its last kernel ends)") +
                         " to the consumer's first launch";
  } else {
    out.latency_forward = out.latency_backward = p2p_model_ns + std::max(out.gap_forward, out.gap_backward);
    out.latency_source = p2p_model_source + " after the producer's last kernel, plus the host gap between two passes";
  }
}

}  // namespace detail

/// Measures `pass_costs` on a replayed job: `g` its graph, `times` the replay, `st` its
/// structure (discovered on the same graph). Needs a recognised schedule and layer task groups.
/// `p2p_model_ns`: latency of a cross-stage transfer when the trace has none.
[[nodiscard]] inline pass_costs measure_pass_costs(const graph::task_graph& g, const report::task_times& times, const job_structure& st,
                                                   time_ns p2p_model_ns, const std::string& p2p_model_source) {
  if (st.layer_groups.empty() || !st.model.layers.known()) {
    throw error("whatif --pp/--schedule: the traces' transformer layers were not found (" + st.model.layers.source +
                "); `lumos inspect --structure` shows what was found");
  }
  pass_costs out;
  const detail::pass_spans spans = detail::measure_pass_spans(g, times, st);
  detail::layer_sums sums = detail::sum_layer_costs(g, times, st);
  if (sums.count[1] == 0) {
    detail::sum_backward_pass_spans(sums, st, spans);
    out.notes.push_back("no backward layer boundaries found: a layer's backward is a backward pass's span / layers per pass");
  }
  if (sums.count[0] == 0 || sums.count[1] == 0) throw error("whatif --pp/--schedule: no forward or no backward layer found in the trace");
  const host_device traced_backward = detail::set_layer_costs(out, sums);
  const detail::stage_pass_spans by_stage_op = detail::measure_pass_extras(out, st, spans, traced_backward);
  detail::measure_stage_latency(out, st, by_stage_op, p2p_model_ns, p2p_model_source);
  return out;
}

/// Replays the pass-level graph of `schedule` on `shape` with `layers_per_chunk` layers per chunk:
/// per stage a host thread (one task per pass: its launches) and a stream (one task per pass:
/// its kernels, from the pass's first launch + the launch latency, ending no earlier than its
/// last launch + the launch latency), passes in the schedule
/// policy's order, `pipeline::dependency_of` edges across stages with the measured latency.
[[nodiscard]] inline pipeline_simulation simulate_passes(const pass_costs& c, const synth::schedule_policy& schedule,
                                                         const pipeline::schedule_shape& shape, int layers_per_chunk) {
  const auto orders = schedule.orders(shape);  // validates the shape
  const bool split = schedule.splits_backward;
  const int p = shape.stages, v = shape.chunks, V = p * v;
  graph::task_graph g;
  // (stage, kind, mb, chunk) → host task, GPU task
  std::map<std::tuple<int, int, int, int>, std::pair<graph::task_id, graph::task_id>> task_of;
  pipeline_simulation out;
  out.schedule = schedule, out.shape = shape, out.layers_per_chunk = layers_per_chunk;
  out.stages.resize(static_cast<std::size_t>(p));
  const auto lc = static_cast<double>(layers_per_chunk);
  auto scaled = [](time_ns x, double f) { return static_cast<time_ns>(std::llround(static_cast<double>(x) * f)); };
  for (int s = 0; s < p; ++s) {
    const graph::processor_id host = g.add_processor({graph::processor_kind::cpu_thread, s, s, 1, "stage " + std::to_string(s) + " host"});
    const graph::processor_id stream = g.add_processor({graph::processor_kind::gpu_stream, s, s, 7, "stage " + std::to_string(s) + " stream"});
    bool first_op = true;
    out.stages[static_cast<std::size_t>(s)].stage = s;
    for (const pipeline::op& o : orders[static_cast<std::size_t>(s)]) {
      const int vs = o.chunk * p + s;
      host_device cost;
      if (o.kind == pipeline::op_kind::forward) {
        const host_device e = detail::class_extra(c, 0, vs == 0, vs == V - 1);
        cost = {e.cpu + scaled(c.layer_forward.cpu, lc), e.gpu + scaled(c.layer_forward.gpu, lc)};
      } else {
        // ZB: B keeps 1 − w of a layer's backward and the pass's extra; W the rest.
        const double f = o.kind == pipeline::op_kind::weight ? c.weight_fraction : (split ? 1.0 - c.weight_fraction : 1.0);
        const host_device e = o.kind == pipeline::op_kind::weight ? host_device{} : detail::class_extra(c, 1, vs == 0, vs == V - 1);
        cost = {e.cpu + scaled(c.layer_backward.cpu, lc * f), e.gpu + scaled(c.layer_backward.gpu, lc * f)};
      }
      const time_ns gap = first_op ? 0 : (o.kind == pipeline::op_kind::forward ? c.gap_forward : c.gap_backward);
      first_op = false;
      const std::string name = pipeline::format_op(o, v > 1);
      const graph::task_id h =
          g.add_task({.kind = graph::task_kind::cpu, .processor = host, .duration = cost.cpu, .idle_gap = gap, .name = name, .rank = s});
      const graph::task_id k =
          g.add_task({.kind = graph::task_kind::gpu_compute, .processor = stream, .duration = cost.gpu, .name = name, .rank = s});
      g.add_edge(h, k, c.launch_latency, graph::edge_kind::launch, graph::edge_flags::from_start);
      // Nor can its kernels end before the last of them is launched: a host-bound pass ends
      // with its launches (the max-plus bound of the per-kernel FIFO, slack when GPU-bound).
      g.add_edge(h, k, c.launch_latency, graph::edge_kind::launch, graph::edge_flags::finish);
      task_of[{s, static_cast<int>(o.kind), o.micro_batch, o.chunk}] = {h, k};
      out.stages[static_cast<std::size_t>(s)].busy += cost.gpu;
    }
  }
  for (int s = 0; s < p; ++s) {
    for (const pipeline::op& o : orders[static_cast<std::size_t>(s)]) {
      const auto dep = pipeline::dependency_of(shape, s, o);
      if (!dep) continue;
      const auto& from = task_of.at({dep->on.stage, static_cast<int>(dep->on.what.kind), dep->on.what.micro_batch, dep->on.what.chunk});
      const auto& to = task_of.at({s, static_cast<int>(o.kind), o.micro_batch, o.chunk});
      if (!dep->crosses_stages(s)) {
        g.add_edge(c.from_gpu ? from.second : from.first, to.first, 0, graph::edge_kind::dependency);
        continue;
      }
      ++out.p2p_transfers;
      const time_ns delay = o.kind == pipeline::op_kind::forward ? c.latency_forward : c.latency_backward;
      g.add_edge(c.from_gpu ? from.second : from.first, to.first, delay, graph::edge_kind::dependency);
    }
  }
  const graph::compiled_graph compiled = graph::compile(g);
  sim::replay_engine engine;
  sim::record_timeline timeline;
  out.makespan = engine.run(compiled, timeline);
  double busy = 0;
  for (const auto& [key, t] : task_of) {
    auto& st = out.stages[static_cast<std::size_t>(std::get<0>(key))];
    st.end = std::max(st.end, timeline.finish_of(compiled.position_of(t.second)));
  }
  for (const auto& st : out.stages) busy += static_cast<double>(st.busy);
  out.bubble_fraction = out.makespan > 0 ? 1.0 - busy / (static_cast<double>(p) * static_cast<double>(out.makespan)) : 0.0;
  return out;
}

/// Bytes of the activation one cross-stage transfer moves (hidden x sequence x micro-batch, at the
/// traces' precision); 0 when the shape is not known.
[[nodiscard]] inline std::int64_t p2p_bytes(const job_structure& st) {
  const auto& md = st.model;
  if (!md.hidden.known() || !md.seq.known() || !md.micro_batch_size.known()) return 0;
  const std::int64_t elt = md.dtype.value.value_or("bf16") == "fp32" ? 4 : 2;
  return *md.hidden.value * *md.seq.value * *md.micro_batch_size.value * elt;
}

/// A cross-stage transfer by the NCCL model when the trace has none: one activation of
/// micro-batch × sequence × hidden; with the sentence that says so (or why it is free).
[[nodiscard]] inline std::pair<time_ns, std::string> p2p_model_time(const job_structure& st, const model::hardware& hw,
                                                                    bool intra_node = true) {
  if (const std::int64_t bytes = p2p_bytes(st); bytes > 0) {
    return {model::nccl_model{}.p2p_time({bytes, intra_node}, hw), "NCCL model for " + std::to_string(bytes) + " bytes"};
  }
  return {0, "no send/recv in the trace and no activation size (hidden, seq, micro-batch unknown): transfers free"};
}

/// The pipeline what-if of a replayed job (see the header comment). `baseline_iteration` is the
/// replayed iteration the prediction is anchored on. Throws `lumos::error` (CLI exit 2) when the
/// traces' schedule or layers are unknown, the layers do not divide over the target's stages and
/// chunks, or the schedule cannot run the target's shape.
[[nodiscard]] inline pipeline_prediction predict_pipeline(const graph::task_graph& g, const report::task_times& times,
                                                          const job_structure& st, time_ns baseline_iteration,
                                                          const pipeline_target& target, const model::hardware& hw) {
  const auto& par = st.parallel;
  if (!par.schedule.known() || !par.micro_batches.known()) {
    throw error("whatif --pp/--schedule: the traces' pipeline schedule is not known (" + par.schedule.source +
                "); `lumos inspect --structure` shows what was found");
  }
  if (!st.model.layers.known()) throw error("whatif --pp/--schedule: the traces' layer count is not known (" + st.model.layers.source + ")");
  const int L = *st.model.layers.value;
  const pipeline::schedule_shape from{par.pp.value.value_or(1), *par.micro_batches.value, par.chunks.value.value_or(1)};
  const synth::schedule_policy from_schedule = *par.schedule.value;
  const synth::schedule_policy to_schedule = target.schedule.value_or(from_schedule);
  // A schedule with model chunks keeps the traces' chunks, and has at least two unless told.
  pipeline::schedule_shape to{target.pp.value_or(from.stages), target.micro_batches.value_or(from.micro_batches),
                              target.vp.value_or(to_schedule.supports_chunks ? from.chunks : 1)};
  if (to_schedule.supports_chunks && to.chunks < 2 && !target.vp) to.chunks = 2;
  const int L_to = target.layers.value_or(L);
  if (to.stages <= 0 || to.chunks <= 0 || to.micro_batches <= 0) throw error("whatif --pp/--vp: stages, chunks and micro-batches must be positive");
  if (L_to % (to.stages * to.chunks) != 0) {
    throw error("whatif --pp " + std::to_string(to.stages) + (to.chunks > 1 ? " --vp " + std::to_string(to.chunks) : std::string()) +
                ": " + std::to_string(L_to) + " layers do not divide over " + std::to_string(to.stages * to.chunks) +
                " stages x chunks");
  }
  if (L % (from.stages * from.chunks) != 0) throw error("whatif --pp: the traces' layers do not divide over their own stages");
  to_schedule.validate(to);
  const auto [p2p_model, p2p_source] = p2p_model_time(st, hw);
  pipeline_prediction out;
  out.costs = measure_pass_costs(g, times, st, p2p_model, p2p_source);
  out.baseline = simulate_passes(out.costs, from_schedule, from, L / (from.stages * from.chunks));
  out.predicted = simulate_passes(out.costs, to_schedule, to, L_to / (to.stages * to.chunks));
  out.baseline_iteration = baseline_iteration;
  // The model's makespan for the traces' own pipeline is off the replayed span of its passes by
  // what a pass-level model leaves out per pass (a host-bound pass's launch pattern, say): the
  // target's is corrected in the same proportion, so the change scales with the passes the
  // target runs (and the identity stays exact).
  const double calibration = out.baseline.makespan > 0 && out.costs.replay_span > 0
                                 ? static_cast<double>(out.costs.replay_span) / static_cast<double>(out.baseline.makespan)
                                 : 1.0;
  const auto target_span = static_cast<time_ns>(std::llround(static_cast<double>(out.predicted.makespan) * calibration));
  const time_ns change = out.predicted.makespan == out.baseline.makespan
                             ? 0
                             : target_span - (out.costs.replay_span > 0 ? out.costs.replay_span : out.baseline.makespan);
  out.iteration_ns = std::max<time_ns>(0, baseline_iteration + change);
  char line[768];
  std::snprintf(line, sizeof line,
                "PP %d -> %d, %s -> %s, %d -> %d micro-batches, %d -> %d chunk(s): layers re-partitioned %d -> %d per stage%s, "
                "the order regenerated by the schedule policy, %zu cross-stage transfers (%.1f us activation, %.1f us gradient: %s)",
                from.stages, to.stages, std::string(from_schedule.name).c_str(), std::string(to_schedule.name).c_str(), from.micro_batches, to.micro_batches, from.chunks, to.chunks,
                L / from.stages, L_to / to.stages, to.chunks > 1 ? (" (" + std::to_string(L_to / (to.stages * to.chunks)) + " per chunk)").c_str() : "",
                out.predicted.p2p_transfers, static_cast<double>(out.costs.latency_forward) / 1e3,
                static_cast<double>(out.costs.latency_backward) / 1e3, out.costs.latency_source.c_str());
  out.changes.emplace_back(line);
  std::snprintf(line, sizeof line,
                "pass-level model (per stage one host task and one GPU task per pass; not yet the layers' launches and kernels "
                "copied): a layer %.1f us forward, %.1f us backward on the GPU (replayed); passes %.1f/%.1f us apart on the "
                "host; the model gives %.3f ms for the "
                "traces' pipeline (replayed passes span %.3f ms) and %.3f ms for the target (%.3f ms in the replay's proportion), bubble "
                "%.1f%% -> %.1f%%; prediction = replayed iteration %.3f ms %+.3f ms",
                static_cast<double>(out.costs.layer_forward.gpu) / 1e3, static_cast<double>(out.costs.layer_backward.gpu) / 1e3,
                static_cast<double>(out.costs.gap_forward) / 1e3, static_cast<double>(out.costs.gap_backward) / 1e3,
                static_cast<double>(out.baseline.makespan) / 1e6, static_cast<double>(out.costs.replay_span) / 1e6,
                static_cast<double>(out.predicted.makespan) / 1e6, static_cast<double>(target_span) / 1e6,
                100 * out.baseline.bubble_fraction, 100 * out.predicted.bubble_fraction,
                static_cast<double>(baseline_iteration) / 1e6, static_cast<double>(change) / 1e6);
  out.changes.emplace_back(line);
  out.changes.insert(out.changes.end(), out.costs.notes.begin(), out.costs.notes.end());
  if (to_schedule.splits_backward) {
    out.changes.push_back("backward split into B and W for " + std::string(to_schedule.title) + ": W = " +
                          std::to_string(static_cast<int>(std::lround(100 * out.costs.weight_fraction))) + "% of a layer's backward (" +
                          out.costs.weight_source + ")");
  }
  return out;
}

}  // namespace lumos::whatif

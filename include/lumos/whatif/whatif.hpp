#pragma once
// Trace-driven what-if (`lumos whatif`): the graph built from a job's traces, rewritten for
// another configuration by an ordered list of rewrite passes over one context (context.hpp), and
// replayed. Everything the trace measured that the change does not touch — CPU dispatch, launch
// gaps, kernels of unchanged shape, measured collectives, the kept overheads — stays; the waits
// are recomputed by the replay.
//
// The shipped passes, in the order they run (each in its topic's header):
//   shape            shape.hpp             hidden/FFN/heads/sequence/micro-batch/TP kernels, and
//                                          the parameter-proportional work of a layer or stage change
//   tensor parallel  tensor_parallel.hpp   TP groups resized; from TP 1, Megatron's TP collectives
//   precision        precision.hpp         fp8: the layers' linear GEMMs rescaled, TE's cast kernels inserted
//   context parallel context_parallel.hpp  CP: the key/value exchanges re-timed, inserted or emptied; gradients over DP x CP
//   MoE              moe.hpp               expert parallelism, experts, top-k, expert FFN, routing
//   fsdp             fsdp.hpp              FSDP on/off (the distributed optimizer's buckets), reshard
//                                          after forward; --dp on FSDP traces described (resized below)
//   gradient buckets gradient_buckets.hpp  a split's distributed-optimizer buckets, per stage
//   data parallel    data_parallel.hpp     gradient collectives resized, or inserted from DP 1
//   global batch     data_parallel.hpp     the micro-batches per replica the global batch implies
//   stage plan       pipeline_change.hpp   how the pipeline change is made (graph or model)
//   node placement   data_parallel.hpp     transfers whose node span changes, re-timed
//   layers           layers.hpp            layers repeated or removed in place
//   micro-batches    micro_batches.hpp     micro-batch periods or passes repeated or removed
//   stage split      pipeline_change.hpp   the stages cut in the graph, or the pass-level model
//   GPU              gpu_change.hpp        every GPU op at the target GPU's rates
// A pass sees what the passes before it decided (the shapes, the micro-batch count, where layers
// were copied): the TP collectives and fp8 casts are inserted before the layers are copied so
// that the copies carry them, and the GPU change runs last, on every op the others made.

#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/calibrate.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/context_parallel.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/fsdp.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/layers.hpp>
#include <lumos/whatif/moe.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/pipeline_change.hpp>
#include <lumos/whatif/precision.hpp>
#include <lumos/whatif/summary.hpp>
#include <lumos/whatif/tensor_parallel.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

namespace lumos::whatif {

/// The shipped passes, in the order a what-if runs them (see the header comment).
using shipped_passes = std::tuple<shape_pass, tensor_parallel_pass, precision_pass, context_parallel_pass, moe_pass, fsdp_pass, gradient_bucket_pass, data_parallel_pass, batch_pass, stage_plan_pass,
                                  node_placement_pass, layers_pass, micro_batch_pass, stage_split_pass, gpu_pass>;

namespace detail {

/// Runs `pass` on `b` when it is wanted; its changes go to `out`. Returns whether it ran.
template <Rewrite Pass>
bool run_pass(Pass& pass, context& ctx, graph::built_job& b, std::vector<change>& out) {
  if (!pass.wanted(std::as_const(ctx))) return false;
  change_list made = pass.apply(ctx, b);
  out.insert(out.end(), std::make_move_iterator(made.begin()), std::make_move_iterator(made.end()));
  return true;
}

/// `pass.after_replay`, for a pass that ran and has one.
template <Rewrite Pass>
void after_replay(Pass& pass, context& ctx, whatif_result& out, bool ran) {
  if constexpr (requires { pass.after_replay(ctx, out); }) {
    if (ran) pass.after_replay(ctx, out);
  }
}

/// The structure reported with the prediction: the traces' (the first discovered, on the
/// unedited graph), else discovered on the baseline's graph.
inline void report_structure(const context& ctx, whatif_result& out) {
  if (ctx.traced_structure()) {
    out.structure = ctx.traced_structure();
    return;
  }
  try {
    out.structure = discover_structure(ctx.job, out.baseline.built, ctx.discovery_options());
  } catch (const error& e) {
    out.changes.push_back(note("structure", "structure", std::string("structure discovery failed: ") + e.what()));
  }
}

/// The prediction's pipeline bubble (`whatif_result::bubble_fraction`) and where it comes from.
inline void report_bubble(const context& ctx, whatif_result& out) {
  const auto& st = out.structure;
  if (out.pipeline) {
    out.bubble_fraction = out.pipeline->predicted.bubble_fraction;
    out.bubble_source = "pass-level pipeline model of the target";
  } else if (out.stages) {
    time_ns begin = std::numeric_limits<time_ns>::max();
    for (const auto& r : out.predicted.ranks) begin = std::min(begin, r.simulated.window.begin);
    out.bubble_fraction = split_bubble(*out.stages, out.predicted.simulated_times(), begin);
    out.bubble_source = "the rewritten graph's replay: 1 - mean compute-stream busy time of its ranks / the pipeline phase (step "
                        "start to the end of the last pass)";
  } else if (st && st->parallel.pp.value.value_or(0) == 1) {
    out.bubble_fraction = 0.0;
    out.bubble_source = "no pipeline parallelism";
  } else if (st && st->parallel.pp.known()) {
    // The pass-level model of the target on the traces' passes. Not on the prediction's graph:
    // structure discovery's task ids are the unedited graph's, and a layer change renumbers them.
    try {
      pipeline_target t;
      t.layers = ctx.options.layers;
      const pipeline_prediction model =
          predict_pipeline(out.baseline.built.graph, out.baseline.simulated_times(), *st, out.baseline.simulated_ns, t, ctx.comm_hw);
      out.bubble_fraction = model.predicted.bubble_fraction;
      out.bubble_source = "pass-level pipeline model of the target with the traces' pass costs";
    } catch (const error& e) {
      out.bubble_source = e.what();
    }
  } else {
    out.bubble_source = "pipeline stages not known";
  }
}

/// Memory per GPU and MFU of the traced and the predicted configuration, when the traces' shape
/// is known.
inline void report_summary(const context& ctx, whatif_result& out) {
  if (!out.structure) return;
  const whatif_options& o = ctx.options;
  std::optional<shape_config> from = ctx.shape_from, to = ctx.shape_to;
  if (!from) {
    try {
      from = to = traced_shape(*out.structure);
    } catch (const error&) {
      return;  // the shape is unknown: no memory or MFU figures
    }
  }
  // MoE layers without a dense MLP (FFN 0): the dense transformer the figures count is not theirs.
  if (from->ffn == 0) return;
  parallel_target target;
  target.pp = o.pp, target.dp = o.dp, target.micro_batches = ctx.micro_batches, target.chunks = o.vp, target.schedule = o.schedule;
  if (ctx.buckets_inserted) target.distributed_optimizer = true;
  target.precision = o.precision;  // fp8's weight copies, scaling state and fp8-saved inputs (whatif --precision)
  if (o.fsdp || o.reshard_after_forward || o.hsdp) {
    const fsdp_memory traced = traced_fsdp_memory(*out.structure);
    target.fsdp = fsdp_memory{o.fsdp.value_or(traced.on), o.reshard_after_forward.value_or(traced.reshard_after_forward), o.hsdp.value_or(traced.hsdp)};
  }
  if (o.pipeline_asked()) {
    // As the pipeline change: the traces' schedule when they have stages, else 1F1B; interleaved
    // with --vp, and with two chunks without it.
    const auto& traced = out.structure->parallel.schedule.value;
    target.schedule = o.schedule.value_or(o.vp.value_or(1) > 1 ? synth::policy_of<pipeline::interleaved_one_f_one_b>()
                                          : ctx.split.staged && traced ? *traced
                                                                       : synth::policy_of<pipeline::one_f_one_b>());
    if (!o.vp) target.chunks = target.schedule->supports_chunks ? 2 : 1;
  }
  out.shape = summarize(ctx.job, *out.structure, *from, *to, o.layers, o.from_gpu, o.gpu, out.baseline.simulated_ns,
                        out.predicted.simulated_ns, target);
  if (!out.shape->memory_warning.empty()) out.changes.push_back(note("summary", "memory", out.shape->memory_warning));
}

// The step of the prediction on a host 0.8x and 1.25x as fast, when its critical path is mostly
// host work (its largest share): the prediction keeps the traced host (or --host-speed's),
// which is an assumption, and where the step follows the host the user should see how much.
// Replays copies of the predicted graph, whose ranks are the traced ones: not after a pipeline
// change (the stages cut or merged in the graph, or the pass-level model), and none when the
// step does not follow the host.
inline std::vector<whatif_result::host_point> host_sensitivity(const trace::job& job, const whatif_result& out,
                                                                 const std::vector<report::rank_steps>& steps, const whatif_options& o) {
  const path_shares* p = out.why.predicted ? &*out.why.predicted : nullptr;
  if (p == nullptr || p->cpu < std::max({p->gpu_compute, p->communication, p->waits})) return {};
  std::vector<whatif_result::host_point> points;
  for (const double speed : {0.8, 1.25}) {
    report::replay_options r = o.predicted_replay();
    r.scales.cpu /= speed;
    r.profiler.reset();  // the step only
    points.push_back({speed, report::replay_built(job, out.predicted.built, steps, r).simulated_ns});
  }
  return points;
}

/// The replayed prediction's step without the profiler over its step (1 when there is none).
[[nodiscard]] inline double unprofiled_share(const report::replay_session& s) {
  return s.simulated_ns > 0 ? static_cast<double>(s.unprofiled_ns) / static_cast<double>(s.simulated_ns) : 1.0;
}

/// The prediction's step without the profiler, after the passes finished it: where a pass set
/// the iteration from a model (the pass-level pipeline) or added ranks evaluated on the replayed
/// timeline (stages cut in the graph), those take the share the replay found (`share`,
/// `unprofiled_share` of the replay before them).
inline void report_unprofiled(whatif_result& out, double share) {
  auto scaled = [share](time_ns t) { return static_cast<time_ns>(std::llround(static_cast<double>(t) * share)); };
  report::replay_session& p = out.predicted;
  time_ns ranks = 0;
  for (report::rank_replay& r : p.ranks) {
    if (r.unprofiled_ns == 0 && r.simulated_ns > 0) r.unprofiled_ns = scaled(r.simulated_ns);
    ranks = std::max(ranks, r.unprofiled_ns);
  }
  p.unprofiled_ns = out.pipeline ? scaled(p.simulated_ns) : std::min(ranks, p.simulated_ns);
}

/// The host speed of `o.host_profile` against `job`'s traced host: the medians of the cheap ATen
/// ops the profile's host entry and the traces share.
[[nodiscard]] inline model::host_speed_estimate target_host_speed(const trace::job& job, const whatif_options& o) {
  const model::cost_profile& p = *o.host_profile;
  if (o.host_speed != 1.0) throw error("whatif: give the target host as a speed or as a profile, not both");
  if (p.host_ops.empty()) {
    throw error("profile '" + p.name + "' has no host entry (host_ops): fit one with `lumos calibrate` on a trace recorded on the target host");
  }
  const auto est = model::relative_host_speed(p.host_ops, model::host_entry(job.ranks));
  if (!est) throw error("the host entry of profile '" + p.name + "' shares fewer than 5 ATen ops with the traces: their hosts cannot be compared");
  return *est;
}

}  // namespace detail

/// Runs the baseline of `job` and the what-if that `passes` make of it, in their order: each
/// pass that is wanted rewrites the graph built from the traces, the result is replayed, and the
/// passes that define `after_replay` finish the prediction.
template <Rewrite... Passes>
[[nodiscard]] whatif_result run_passes(const trace::job& job, const whatif_options& o, std::tuple<Passes...> passes) {
  if (o.host_profile) {
    const model::host_speed_estimate host = detail::target_host_speed(job, o);
    whatif_options at_speed = o;
    at_speed.host_profile.reset();
    at_speed.host_speed = host.speed;
    whatif_result out = run_passes(job, at_speed, std::move(passes));
    out.host_profile = o.host_profile->name;
    out.host_ops = host.ops;
    return out;
  }
  context ctx(job, o);
  whatif_result out;
  out.baseline = report::replay_job(job, o.replay);
  const std::vector<report::rank_steps> steps = report::find_steps(job);
  graph::built_job b = graph::build_graph(job, o.replay.build);
  if (o.needs_structure()) (void)ctx.structure(b);
  out.changes = ctx.notes;
  std::array<bool, sizeof...(Passes)> ran{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((ran[I] = detail::run_pass(std::get<I>(passes), ctx, b, out.changes)), ...);
  }(std::index_sequence_for<Passes...>{});
  out.predicted = report::replay_built(job, std::move(b), steps, o.predicted_replay());
  const double unprofiled_share = detail::unprofiled_share(out.predicted);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (detail::after_replay(std::get<I>(passes), ctx, out, ran[I]), ...);
  }(std::index_sequence_for<Passes...>{});
  detail::report_unprofiled(out, unprofiled_share);
  detail::report_structure(ctx, out);
  detail::report_bubble(ctx, out);
  detail::report_summary(ctx, out);
  out.why = attribute(out.baseline, out.predicted, out.predicted.simulated_ns, !out.pipeline);
  out.host_speed = o.host_speed;
  if (!out.pipeline && !out.stages) out.host_sensitivity = detail::host_sensitivity(job, out, steps, o);
  return out;
}

/// Runs the baseline and the what-if of `job`: the shipped passes, then `extra` (a user's
/// rewrites, in the order given).
template <Rewrite... Extra>
[[nodiscard]] whatif_result run_whatif(const trace::job& job, const whatif_options& o, Extra... extra) {
  return run_passes(job, o, std::tuple_cat(shipped_passes{}, std::tuple<Extra...>{std::move(extra)...}));
}

}  // namespace lumos::whatif

#pragma once
// The pipeline what-if (`lumos whatif --pp N [--vp V] [--schedule S]`, and a micro-batch count
// change on traces with stages) as two passes: `stage_plan_pass` decides how the change is made
// — in the graph, each target stage cut out of the traced ranks (pipeline_graph.hpp), or by the
// pass-level model of the new pipeline on the replayed passes (pipeline.hpp) — and
// `stage_split_pass` makes it: the split before the replay, or the model after it.

#include <lumos/core/error.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/pipeline.hpp>
#include <lumos/whatif/pipeline_graph.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/weight_gradients.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace lumos::whatif {

/// Pass: decides how the pipeline change is made (`ctx.split`), once the passes before it have
/// settled the micro-batches per replica. The default schedule is the traces' own when they have
/// stages, else 1F1B (interleaved with `--vp`); the target's stages are the traces' when only the
/// schedule changes. From traces without stages to GPipe, 1F1B, interleaved or zero-bubble stages
/// the change is made in the graph; with another count of micro-batches per replica their periods
/// are repeated or removed first (the micro-batch pass), and the split then orders the new count.
/// With traced stages a micro-batch change alone is a split too. For a zero-bubble target it finds
/// the weight gradients (`ctx.weight_tasks`) on the graph before any layer copy.
struct stage_plan_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept { return ctx.options.pipeline_asked() || ctx.micro_batches; }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const whatif_options& o = ctx.options;
    const job_structure& st = ctx.structure(b);
    split_choice& s = ctx.split;
    s.staged = st.parallel.pp.value.value_or(1) > 1;
    // A schedule orders stages: on traces without them it needs the stages to make.
    if (o.pipeline_asked() && !o.pp && !s.staged) {
      throw error(std::string("whatif ") + (o.schedule ? "--schedule" : "--vp") + " without --pp: the traces have no pipeline stages (" +
                  (st.parallel.pp.value ? "PP 1" : "PP unknown") + ", " + st.parallel.pp.source +
                  "); give --pp N (N >= 2) for the stages to schedule");
    }
    s.asked = o.pipeline_asked() || (ctx.micro_batches && s.staged);
    const auto& traced_schedule = st.parallel.schedule.value;
    s.schedule = o.schedule.value_or(o.vp.value_or(1) > 1           ? synth::policy_of<pipeline::interleaved_one_f_one_b>()
                                     : s.staged && traced_schedule ? *traced_schedule
                                                                   : synth::policy_of<pipeline::one_f_one_b>());
    s.vp = o.vp.value_or(s.schedule.supports_chunks ? 2 : 1);
    const int traced_pp = ctx.traced_pp();
    s.pp = o.pp ? *o.pp : s.staged ? traced_pp : 0;
    if (s.asked && s.pp > 0) {
      s.refused = stage_split_unsupported(st, s.pp, s.vp, s.schedule, ctx.micro_batches.value_or(0), &ctx.job, o.layers.value_or(0));
    }
    s.in_graph = s.asked && s.pp > 0 && s.refused.empty();
    // Fewer stages than traced: each merged stage is made from one traced stage, its layers
    // repeated to the block's count (the layer pass), then the split drops the other stages' ranks.
    s.merging = s.in_graph && s.pp < traced_pp;
    s.accumulate = ctx.micro_batches && (s.staged ? s.in_graph : !o.pipeline_asked() || s.in_graph);
    s.layers = s.merging ? o.layers.value_or(*st.model.layers.value) : o.layers.value_or(0);
    if (s.in_graph && s.schedule.splits_backward) {
      ctx.weight_tasks = weight_gradient_tasks(ctx.job, b, st, traced_shape(st));
      if (std::find(ctx.weight_tasks.begin(), ctx.weight_tasks.end(), std::uint8_t{1}) == ctx.weight_tasks.end()) {
        throw error("whatif --schedule " + std::string(s.schedule.title) +
                    ": no weight-gradient GEMM found in the layers' backward passes (their operators need recorded shapes, "
                    "`lumos inspect --structure`), so the backward passes cannot be split into B and W");
      }
    }
    return {};
  }
};
static_assert(Rewrite<stage_plan_pass>);

/// The all-reduce of the tied input and output embeddings between the end stages of a split of
/// traces without stages (the GPT-style model the parameter counts assume): the embedding's fp32
/// gradient, V/TP x hidden of the predicted shape, every step. Unset, with the reason in `why`,
/// when the traces have stages (theirs is kept and re-timed), the MLP is gated (Llama's untied
/// embeddings) or no logits GEMM sizes it.
[[nodiscard]] inline std::optional<tied_embedding_reduce> tied_reduce(context& ctx, const graph::built_job& b, std::string& why) {
  try {
    if (ctx.split.staged) throw error("the traces' own is kept");
    const job_structure& st = ctx.structure(b);
    if (st.model.gated_mlp) throw error("the layers' MLP is gated (Llama-style), whose models untie their embeddings");
    const shape_config sc = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
    const shape_config to = ctx.shape_to ? *ctx.shape_to : sc;
    const std::int64_t vocab_local = traced_vocab_local(ctx.job, st, sc);
    if (vocab_local <= 0) {
      why = "no logits GEMM found to size it by";
      return std::nullopt;
    }
    const shape_costs& costs = ctx.costs(b);
    tied_embedding_reduce t;
    t.bytes = vocab_local * sc.tp / std::max(1, to.tp) * to.hidden * 4;
    const auto bytes = static_cast<double>(t.bytes);
    t.intra = static_cast<time_ns>(std::llround(collective_ns(model::collective::all_reduce, bytes, 2, costs.profile.intra)));
    t.inter = static_cast<time_ns>(std::llround(collective_ns(model::collective::all_reduce, bytes, 2, costs.profile.inter)));
    return t;
  } catch (const error& e) {
    why = e.what();
    return std::nullopt;
  }
}

/// The ranks of a replayed split into the prediction: the traced ranks of merged stages that the
/// split dropped leave it (their maps and plans with them), and each added stage's ranks join it,
/// their plans evaluated on the prediction's timeline.
inline void adopt_stage_ranks(const context& ctx, whatif_result& out, stage_split& split) {
  auto& p = out.predicted;
  if (std::find(split.dropped.begin(), split.dropped.end(), std::uint8_t{1}) != split.dropped.end()) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < p.ranks.size(); ++i) {
      if (i < split.dropped.size() && split.dropped[i]) continue;
      if (kept != i) {
        p.ranks[kept] = std::move(p.ranks[i]);
        p.plans[kept] = std::move(p.plans[i]);
        p.built.ranks[kept] = std::move(p.built.ranks[i]);
        if (i < p.held_out.size()) p.held_out[kept] = std::move(p.held_out[i]);
      }
      ++kept;
    }
    p.ranks.resize(kept), p.plans.resize(kept), p.built.ranks.resize(kept);
    if (!p.held_out.empty()) p.held_out.resize(kept);
    p.measured_ns = p.simulated_ns = 0;
    for (const auto& r : p.ranks) p.measured_ns = std::max(p.measured_ns, r.measured_ns), p.simulated_ns = std::max(p.simulated_ns, r.simulated_ns);
  }
  const report::task_times simulated = p.simulated_times();
  const report::task_times measured = report::observed_times(p.built.graph);
  for (std::size_t k = 0; k < split.plans.size(); ++k) {
    const report::iteration_plan& plan = split.plans[k];
    const std::size_t i = split.traced_index[k];
    report::rank_replay r;
    r.rank = plan.rank;
    r.file = ctx.job.ranks[i].file + " (stage " + std::to_string(split.stage[k]) + ")";
    r.step = plan.step;
    r.measured = report::evaluate(plan, measured);
    r.simulated = report::evaluate(plan, simulated, ctx.options.predicted_replay().scales.cpu);
    r.measured_ns = r.measured.window.length();
    r.simulated_ns = r.simulated.window.length();
    r.error = report::relative_error(r.simulated_ns, r.measured_ns);
    p.simulated_ns = std::max(p.simulated_ns, r.simulated_ns);
    p.ranks.push_back(std::move(r));
    p.plans.push_back(plan);
  }
  p.error = report::relative_error(p.simulated_ns, p.measured_ns);
  split.plans.clear();
}

/// Pass: the pipeline change `stage_plan_pass` decided. In the graph, before the replay: each
/// target stage cut out of the traced ranks (`split_stages`), with Megatron's send/recv between
/// stages timed by the p2p model, the tied embedding's all-reduce, and the micro-batch and layer
/// copies of the passes before it. Otherwise, after the replay: the pass-level model of the new
/// pipeline on the replayed passes, added as a difference to the replay.
class stage_split_pass {
 public:
  [[nodiscard]] bool wanted(const context& ctx) const noexcept {
    return ctx.split.in_graph || ctx.options.pipeline_asked() || (ctx.micro_batches && ctx.split.staged);
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) {
    if (!ctx.split.in_graph) return {};
    const whatif_options& o = ctx.options;
    const split_choice& s = ctx.split;
    const job_structure& st = ctx.structure(b);
    change_list out;
    const model::hardware& hw = ctx.comm_hw;
    const auto [intra, source] = p2p_model_time(st, hw, true);
    p2p_latency p2p{intra, p2p_model_time(st, hw, false).first, hw.nvlink_domain_size()};
    p2p.host = static_cast<time_ns>(std::llround(ctx.costs(b).profile.cpu_collective_ns));
    p2p.bytes = p2p_bytes(st);
    std::string tied_missing;
    const std::optional<tied_embedding_reduce> tied = tied_reduce(ctx, b, tied_missing);
    if (!tied && !s.staged) {
      out.push_back(note("stage split", "tied embedding", "no all-reduce of the tied embedding between the end stages added: " + tied_missing));
    }
    const auto plans = report::plan_iterations(ctx.job, b, o.replay.step);
    const int tp_to = ctx.shape_to ? ctx.shape_to->tp : st.parallel.tp.value.value_or(1);
    const int dp_to = ctx.target_gradient_group();  // a stage's ranks are TP x DP x CP
    std::optional<micro_batch_remap> remap;
    if (ctx.period_copies && ctx.period_copies->from != ctx.period_copies->to) {
      const micro_batch_copies& pc = *ctx.period_copies;
      remap = micro_batch_remap{&pc.copies, pc.from, pc.to, pc.first, pc.end};
    }
    const bool copied_layers = (o.layers || s.merging) && ctx.layer_copies;
    split_ = split_stages(b, ctx.job, st, plans, s.pp, s.vp, s.schedule, p2p, source, tied ? &*tied : nullptr, tp_to * dp_to,
                          remap ? &*remap : nullptr, ctx.weight_tasks.empty() ? nullptr : &ctx.weight_tasks,
                          copied_layers ? &*ctx.layer_copies : nullptr, s.layers);
    const auto& traced_schedule = st.parallel.schedule.value;
    const std::string from = "PP " + std::to_string(ctx.traced_pp()) +
                             (traced_schedule && s.staged ? ", " + std::string(traced_schedule->title) : std::string());
    const std::string to = "PP " + std::to_string(s.pp) + ", " + std::string(s.schedule.title) +
                           (s.vp > 1 ? ", " + std::to_string(s.vp) + " chunks" : std::string());
    out.push_back(changed("stage split", "pipeline", from, to, split_->change,
                          {count_figure("p2p transfers", split_->p2p), figure{"tasks", static_cast<double>(split_->tasks_before),
                                                                               static_cast<double>(split_->tasks_after), ""}}));
    return out;
  }

  /// Adds the split's stages to the replayed prediction, or models the pipeline change.
  void after_replay(context& ctx, whatif_result& out) {
    if (split_) {
      adopt_stage_ranks(ctx, out, *split_);
      out.stages = std::move(split_);
      return;
    }
    const whatif_options& o = ctx.options;
    const std::string& refused = ctx.split.refused;
    if (ctx.traced_cp() > 1 || ctx.target_cp() > 1) {
      // Its passes are timed on the compute stream alone: the ring exchanges beside the attention
      // drop out (ZB-H1 traces at CP 2 to 1F1B: 3.5 % fast).
      throw error("whatif: with context parallelism (CP " + std::to_string(ctx.traced_cp()) + " -> " + std::to_string(ctx.target_cp()) +
                  ") a pipeline change must be made in the graph, and this one is not (" +
                  (refused.empty() ? std::string("the traces' pipeline is kept") : refused) +
                  "): the pass-level pipeline model does not time the key/value exchanges");
    }
    if (!refused.empty()) out.changes.push_back(note("stage split", "pipeline", "pipeline change by the pass-level model, not in the graph: " + refused));
    out.pipeline_reason = refused;
    pipeline_target t;
    t.pp = o.pp, t.vp = o.vp, t.schedule = o.schedule, t.micro_batches = ctx.micro_batches, t.layers = o.layers;
    pipeline_prediction pp;
    try {
      pp = predict_pipeline(out.predicted.built.graph, out.predicted.simulated_times(), *ctx.known_structure(), out.predicted.simulated_ns, t,
                            ctx.comm_hw);
    } catch (const error& e) {
      if (refused.empty()) throw;
      throw error(std::string(e.what()) + "; nor can the graph be cut into stages: " + refused);
    }
    for (const std::string& line : pp.changes) out.changes.push_back(note("pipeline model", "pipeline", line));
    out.predicted.simulated_ns = pp.iteration_ns;
    out.pipeline = std::move(pp);
  }

 private:
  std::optional<stage_split> split_;
};
static_assert(Rewrite<stage_split_pass>);

}  // namespace lumos::whatif

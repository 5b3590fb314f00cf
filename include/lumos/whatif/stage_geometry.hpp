#pragma once
// The geometry of the fine-grained stage split (`split_stages`, whatif/pipeline_graph.hpp):
// whether a job can be split for a target (`stage_split_unsupported`), the target with the edits
// already made on the graph (`stage_split_target`), and the shape of the split (`stage_geometry`):
// stages, chunks, micro-batches, layers per chunk, and how target stages stand for traced ones.
// From traces with P stages to a multiple of them (or another schedule on the same P), each
// traced stage σ is cut into the block of target stages [σ·k, σ·k + k), each traced rank keeping
// its number on the first stage of its block. To fewer stages (a divisor of P, at least 2), each
// target stage is made from one traced stage of the block it merges (`merge_source_stage`), whose
// layers the caller has repeated to the block's count; the other traced ranks are dropped.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

/// Merging `traced` pipeline stages into `pp` (a divisor of them, at least 2): the traced stage whose
/// ranks target stage s is made from — the first of the block it merges, but for the last target
/// stage the traced last, which holds the head and the loss (split_stages).
[[nodiscard]] constexpr int merge_source_stage(int traced, int pp, int s) noexcept {
  return s == pp - 1 ? traced - 1 : s * (traced / pp);
}

/// Why the fine-grained rewrite does not apply to `st` with this target (empty when it does);
/// `micro_batches`: per replica in the target when it changes (0: the traces').
/// `job` (the traces `st` was discovered on), when given, is read for what a traced transfer is.
[[nodiscard]] inline std::string stage_split_unsupported(const job_structure& st, int pp, int vp, const synth::schedule_policy& schedule,
                                                         int micro_batches = 0, const trace::job* job = nullptr, int layers = 0) {
  const auto& par = st.parallel;
  const int traced_pp = par.pp.value.value_or(1);
  if (traced_pp > 1) {
    // From traces with stages each traced stage is cut into pp / traced_pp stages (one: the
    // schedule alone changes, or the micro-batches: stage_micro_batches_to), each with model
    // chunks too; or blocks of traced_pp / pp stages are merged, each made from one of them.
    if (!par.pp.known() || !par.world.known()) return "the traces' stages or world size are not known";
    const bool merging = traced_pp > pp;
    if (merging ? traced_pp % pp != 0 : pp % traced_pp != 0) return "the target's stages are neither a multiple nor a divisor of the traces'";
    if (merging && pp < 2) {
      return "merging every stage into one is not built (no traced rank holds both the embedding and the head; the pass-level "
             "model has no stages to keep apart)";
    }
    if (par.chunks.value.value_or(1) != 1) return "the traces run model chunks";
    // The first micro-batch's forward pass holds the step's first host work (the step's window is
    // measured from it) and the last's backward the overlapped gradient reduction: both must stay.
    if (micro_batches == 1 && par.micro_batches.value.value_or(1) > 1) {
      return "one micro-batch per replica would be left, and the traces' first (the step's first host work) and last (the "
             "gradient reduction it overlaps) must both stay";
    }
    if (*par.world.value % traced_pp != 0) return "the traces' world does not divide over their stages";
    const int per_stage = *par.world.value / traced_pp;
    for (const auto& r : st.ranks) {
      if (!r.stage.known()) return "a rank's stage is not known";
      if (r.rank / per_stage != *r.stage.value) return "the ranks are not numbered with the stages outermost (Megatron's order)";
    }
    for (const gpu_op_context& c : st.gpu_ops) {
      if (c.p2p && job != nullptr && c.rank < job->ranks.size() && detail::transfer_side(job->ranks[c.rank], c.cpu_op) == 0) {
        return "a traced transfer is not under a CPU operator that names it a send or a receive (nccl:send / nccl:recv)";
      }
    }
  } else if (pp < 2) {
    return "the target has one stage";
  }
  if (schedule.supports_chunks ? vp < 2 : vp != 1) return "model chunks need the interleaved schedule";
  if (!par.micro_batches.known()) return "the traces' micro-batches are not known";
  if (!st.model.layers.known() || st.layer_groups.empty()) return "the traces' layers were not found";
  if ((layers > 0 ? layers : *st.model.layers.value) % (pp * vp) != 0) return "the layers do not divide over the stages and chunks";
  const int m = *par.micro_batches.value;
  try {
    schedule.validate({pp, micro_batches > 0 ? micro_batches : m, vp});
  } catch (const error& e) {
    return e.what();
  }
  if (micro_batches > 0 && micro_batches != m && m < 2 && traced_pp > 1) return "the traces ran one micro-batch, so its period cannot be repeated";
  // Traces that ran a zero-bubble schedule have a W pass per micro-batch beside its B (on every
  // rank, or on none).
  const std::size_t w = detail::weight_passes(st);
  if (w != 0 && traced_pp < 2) return "the traces have W passes but no stages";
  // Merged back into their backward passes, the traces' sends would still leave after B, where a
  // schedule without W passes sends after the whole backward (tried: ZB-H1 traces of gpt3-15b TP 2
  // PP 2 to 1F1B were -3.2 %, -0.5 % by the pass-level model).
  if (w != 0 && !schedule.splits_backward) return "from the traces' W passes to a schedule without them is not made in the graph";
  for (const auto& r : st.ranks) {
    if (r.passes.size() != static_cast<std::size_t>((w != 0 ? 3 : 2) * m) || detail::weight_passes(r) != (w != 0 ? static_cast<std::size_t>(m) : 0)) {
      return "a rank's passes are not one forward and one backward (and, zero bubble, one W) per micro-batch";
    }
    for (const auto& p : r.passes) {
      if (p.op.chunk != 0) return "a rank's passes are not of one model chunk";
      // A stage takes its layers' work from every pass: the backward's must be delimited too (by
      // a block repeated once per layer, which one layer per pass does not show).
      if (!p.layers.known() || *p.layers.value <= 0) {
        return "rank " + std::to_string(r.rank) + ": the layers of its " +
               (p.op.kind == pipeline::op_kind::forward ? "forward" : p.op.kind == pipeline::op_kind::weight ? "W" : "backward") +
               " passes are not delimited (" + p.layers.source + ")";
      }
    }
  }
  return {};
}

/// The target of a stage split and the edits already made on the graph it splits. `remap`: a
/// micro-batch change made on the graph (the structure's tasks are those before it);
/// `layer_copies` and `layers_to`: a layer change made on it instead, or first
/// (`edited_graph::copies` of `repeat_groups`, the new layer count); `weight`: per task of the
/// structure's graph, 1 for a weight gradient (`weight_gradient_tasks`; the zero-bubble schedules
/// need it). `ranks_per_stage`: the target's TP × DP (0: the traced world's).
struct stage_split_target {
  int pp = 2, vp = 1;
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();
  int ranks_per_stage = 0;
  const micro_batch_remap* remap = nullptr;
  const std::vector<std::uint8_t>* weight = nullptr;
  const std::vector<std::vector<graph::task_id>>* layer_copies = nullptr;
  int layers_to = 0;
};

/// The shape of a stage split: the target's stages, chunks and micro-batches, the traced stages
/// (P) and how target stages stand for them, and how ranks are numbered. Stage s of traced rank r
/// sits where Megatron places rank s·W + r (W = `width`); its number in the output is that one
/// without traced stages, and with them the traced rank's own on the first stage of its block, the
/// others numbered from the traced world up.
struct stage_geometry {
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();
  int pp = 1, vp = 1;
  int micro_batches = 1;       ///< per replica, in the target (m)
  int layers = 0;              ///< the model's layers in the target
  int traced_layers = 0;       ///< the traces'
  int per_chunk = 0;           ///< layers of one virtual stage (chunk c of stage s is virtual stage c·pp + s)
  int traced_pp = 1;           ///< the traces' stages (P)
  int cut = 1;                 ///< target stages per traced stage (1 when merging)
  int merge = 1;               ///< traced stages per target stage (1 unless merging)
  int traced_width = 0;        ///< traced ranks per traced stage (0 without traced stages)
  int width = 0;               ///< ranks per stage as Megatron places them (W)
  bool merging = false;        ///< fewer stages than traced
  bool cross_blocks = false;   ///< every transfer of the new order is added (chunks or merging from traced stages)
  bool zero_bubble = false;    ///< the schedule splits each backward into B and W
  bool traced_weight = false;  ///< the traces ran W passes of their own
  std::vector<int> stage_of;   ///< per index into job.ranks: its traced stage
  std::unordered_map<int, std::size_t> index_of_rank;  ///< rank number -> index into job.ranks

  /// The traced stage target stage `s` is made from.
  [[nodiscard]] int source_stage(int s) const noexcept { return merging ? merge_source_stage(traced_pp, pp, s) : s / cut; }
  /// The target stage traced stage `sigma` is on (the first of its block when cut; −1 when
  /// merging drops it).
  [[nodiscard]] int first_stage(int sigma) const noexcept {
    if (!merging) return sigma * cut;
    const int s = sigma / merge;
    return source_stage(s) == sigma ? s : -1;
  }
  /// A traced rank's stage, from its number (stage_split_unsupported checked that discovery agrees).
  [[nodiscard]] int traced_stage(int rank) const noexcept { return traced_pp > 1 && rank >= 0 ? rank / traced_width : 0; }
  /// Megatron's number of stage s of traced rank `rank` (pipeline stages outermost), which places
  /// it on its node; from traces without stages also its number in the output.
  [[nodiscard]] int megatron_rank(int rank, int s) const noexcept {
    return rank < 0 ? rank : (traced_pp > 1 ? rank % traced_width : rank) + s * width;
  }
  /// The number of stage s of traced rank `rank` in the output.
  [[nodiscard]] int new_rank(int rank, int s) const noexcept {
    if (rank < 0 || traced_pp == 1) return megatron_rank(rank, s);
    if (merging) return rank;
    const int sigma = rank / traced_width, j = s - sigma * cut;
    return j == 0 ? rank : traced_pp * traced_width + (sigma * (cut - 1) + j - 1) * traced_width + rank % traced_width;
  }
  /// The pass a code belongs to: a W is part of its backward pass.
  [[nodiscard]] std::int32_t pass_of(std::int32_t c) const noexcept {
    return c != detail::label_pre && c != detail::label_post && c >= 2 * micro_batches ? c - micro_batches : c;
  }
  /// The unit of a schedule op: its pass code · vp + its chunk.
  [[nodiscard]] std::int32_t unit_of_op(const pipeline::op& o) const noexcept {
    return detail::pass_code_of(o, micro_batches, o.micro_batch) * vp + o.chunk;
  }
};


/// The geometry of splitting the job `st` describes for `target` (stage_split_unsupported must
/// have found nothing against it).
[[nodiscard]] inline stage_geometry stage_geometry_of(const trace::job& job, const job_structure& st, const stage_split_target& target) {
  stage_geometry geo;
  geo.schedule = target.schedule;
  geo.pp = target.pp, geo.vp = target.vp;
  geo.micro_batches = target.remap != nullptr ? target.remap->to : *st.parallel.micro_batches.value;
  geo.traced_layers = *st.model.layers.value;
  geo.layers = target.layers_to > 0 ? target.layers_to : geo.traced_layers;
  geo.per_chunk = geo.layers / (geo.pp * geo.vp);
  const int P = st.parallel.pp.value.value_or(1);
  geo.traced_pp = P;
  // Fewer stages than traced (a divisor of them): each target stage is made from one traced stage
  // of the block it merges, whose layers the caller repeated (layer_copies) to the block's count;
  // the first target stage from traced stage 0 (the embedding), the last from the traced last (the
  // head and the loss), the others from their block's first. The other traced ranks are dropped.
  geo.merging = P > geo.pp;
  geo.cut = geo.merging ? 1 : geo.pp / P;
  geo.merge = geo.merging ? P / geo.pp : 1;
  // Model chunks from traces with stages: each traced stage's layers fill its block's chunks (the
  // layers are alike, so which traced layer stands for which does not matter); every transfer of
  // the interleaved order is added, across blocks too, and the traced ones are dropped (each
  // carried one pass's activation, where chunks need one per chunk and one from the last stage
  // back to the first). Merging stages likewise replaces every transfer: the traced ones ran to
  // the dropped stages.
  geo.cross_blocks = P > 1 && (geo.vp > 1 || geo.merging);
  geo.traced_width = P > 1 ? *st.parallel.world.value / P : 0;
  geo.zero_bubble = target.schedule.splits_backward;
  geo.traced_weight = detail::weight_passes(st) > 0;
  const std::size_t R = job.ranks.size();
  geo.stage_of.assign(R, 0);
  for (std::size_t i = 0; i < R; ++i) {
    geo.index_of_rank[job.ranks[i].rank] = i;
    geo.stage_of[i] = geo.traced_stage(job.ranks[i].rank);
  }
  // Ranks per stage: the target's TP x DP when given (a DP change keeps the traced ranks, which
  // stand for every replica, but places the stages that far apart), else the traced world.
  geo.width = std::max(target.ranks_per_stage, P > 1 ? geo.traced_width : st.parallel.world.value.value_or(0));
  if (P == 1) {
    for (const auto& r : job.ranks) geo.width = std::max(geo.width, r.rank + 1);
  }
  return geo;
}

}  // namespace lumos::whatif

#pragma once
// The fine-grained pipeline what-if of traces without pipeline stages (`lumos whatif --pp N` on a
// PP 1 job, to GPipe, 1F1B, interleaved 1F1B, ZB-H1 or ZB-H2): the traced graph is cut into N
// stages, each a copy of every traced rank that keeps its own layers' launches and kernels, runs
// its passes (per model chunk, interleaved; each backward pass split into B and W by its weight
// gradients, zero bubble) in the order the schedule policy gives, and waits for its neighbour's
// activation or gradient. A change of the micro-batches per replica is made on the graph first
// (whatif/micro_batches.hpp) and reaches the split as a `micro_batch_remap`.
//
// From traces with P stages to a multiple of them (or another schedule on the same P), each traced
// stage σ is cut the same way into the block of target stages [σ·k, σ·k + k): a traced transfer
// between two stages stays, on the end stage of each block that faces its peer (it belongs to the
// pass it feeds or drains, told by its nccl:recv / nccl:send operator), only transfers within a
// block are added, and a host synchronization waits for what its thread enqueued before it in
// the new order. Each traced rank keeps its number on the first stage of its block. Another
// count of micro-batches per replica on traces with stages is made first by repeating or removing
// passes in place (`stage_micro_batches_to`), and the split (on the same stages, or more) orders
// the new count. To fewer stages (a divisor of P, at least 2), each target stage is made from one
// traced stage of the block it merges (`merge_source_stage`: the first, and the traced last for the
// last target stage), whose layers the caller has repeated to the block's count; the other traced
// ranks are dropped and every transfer of the new order is added.
//
// Each task is labelled with the pass it belongs to: a GPU op by structure discovery's pass of its
// launch, a launch call by the op it launched, every other task by the last labelled task before it
// on its processor (work before the first pass and after the last — the optimizer, say — is kept
// whole on every stage, at its place). In a pass, a layer's tasks stay on the stage that holds the
// layer; the other work of a forward pass before its first layer (the embedding) stays on the first
// stage, after its last layer (head, loss) on the last; in a backward pass the reverse; work between
// layers, and the data-parallel gradient collectives, stay on every stage. Every edge whose two tasks
// a stage keeps is kept unless the new order puts its source's pass after its target's (an edge the
// traces had between passes the schedule now swaps). A cross-stage transfer is what Megatron runs:
// the producer's host launches a send kernel on a p2p stream after the pass, which waits for the
// pass's last kernel on the compute stream; the consumer's host launches the receive on its own p2p
// stream before the pass and then waits for it and for its compute stream to drain (the
// torch.cuda.synchronize() after each batched transfer); send and receive are one p2p instance,
// joined, with the NCCL model's time. `lumos whatif --trace-out` writes them as the
// ncclDevKernel_SendRecv kernels, launches, event waits and stream synchronizations a trace
// shows, so the written job replays to the prediction. Stage s of traced rank r is rank s·W + r
// (pipeline stages outermost, as Megatron numbers them); stage 0 keeps the traced ranks' numbers.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

/// What `split_stages` made: the plans of the ranks it added (stages 1 and up, in rank order,
/// from the traced ranks' plans) and what it did.
struct stage_split {
  pipeline::schedule_kind schedule = pipeline::schedule_kind::one_f_one_b;
  int stages = 1, chunks = 1, micro_batches = 1;
  int world = 1;  ///< ranks per stage (W) as Megatron places them: stage s of column r is rank s·W + r
  std::vector<report::iteration_plan> plans;
  std::vector<std::size_t> traced_index;  ///< per plan: index into job.ranks of the rank it copies
  std::vector<int> stage;                 ///< per plan: its stage
  std::vector<graph::rank_map> maps;      ///< per plan: its events ↔ its stage's tasks (for writing it)
  /// Per index into job.ranks: 1 for a traced rank that is in no target stage (merging stages
  /// keeps one traced stage per merged block); its tasks are gone and its map points nowhere.
  std::vector<std::uint8_t> dropped;
  std::size_t p2p = 0, edges_dropped = 0, tasks_before = 0, tasks_after = 0;
  /// Collectives of the whole world without their peers in the traces, joined across the stages.
  std::size_t world_joined = 0;
  std::size_t weight_ops = 0;  ///< zero bubble: GPU ops of the backward passes moved to their W
  /// Zero bubble: per task of the split graph, 1 when it runs in a W pass (`--trace-out` writes
  /// the events around a backward's B and W tasks once around each, so that the written job's
  /// W passes are marked on their own).
  std::vector<std::uint8_t> weight_pass;
  std::string change;
  /// Per stage s and traced rank i (index s·R + i): the tasks of its passes on its compute stream,
  /// in order (the bubble is measured on them).
  std::vector<std::vector<graph::task_id>> pass_stream_tasks;
  /// Each added cross-stage transfer's host launch and the kernel it launched, per side: written
  /// by `--trace-out` under c10d's operator (`nccl:send` / `nccl:recv`), so that the written job
  /// tells its transfers apart as a traced one does (and a what-if of it can split its stages).
  struct transfer_launch {
    graph::task_id launch = graph::no_task, kernel = graph::no_task;
    bool send = false;
  };
  std::vector<transfer_launch> transfer_launches;
  /// The groups of the added stages' copies of communication ops that are no collective instance
  /// (their peers are absent from the job), renamed and renumbered as instances' copies are: one
  /// per copy, `complete` its task, `arrive` empty. `--trace-out` writes them
  /// (`report::simulated_job::lone_groups`).
  std::vector<graph::collective_instance> lone_groups;
};

/// Pipeline bubble of a replayed split: 1 − mean over its ranks of compute-stream busy time in the
/// pipeline phase / the phase, the phase running from `begin` (the step's start) to the end of the
/// last pass of any stage (`lumos predict`'s definition, on the fine-grained graph).
[[nodiscard]] inline double split_bubble(const stage_split& split, const report::task_times& t, time_ns begin) {
  time_ns end = begin;
  for (const auto& tasks : split.pass_stream_tasks) {
    for (const graph::task_id x : tasks) end = std::max(end, t.end_of(x));
  }
  if (end <= begin || split.pass_stream_tasks.empty()) return 0.0;
  double busy = 0;
  std::size_t ranks = 0;
  for (const auto& tasks : split.pass_stream_tasks) {
    if (tasks.empty()) continue;
    ++ranks;
    time_ns reach = begin;
    for (const graph::task_id x : tasks) {  // in stream order: intervals do not overlap out of order
      const time_ns b = std::max(reach, std::max(begin, t.begin_of(x))), e = std::min(end, t.end_of(x));
      if (e > b) busy += static_cast<double>(e - b);
      reach = std::max(reach, e);
    }
  }
  return ranks > 0 ? 1.0 - busy / (static_cast<double>(ranks) * static_cast<double>(end - begin)) : 0.0;
}

/// Merging `traced` pipeline stages into `pp` (a divisor of them, at least 2): the traced stage whose
/// ranks target stage s is made from — the first of the block it merges, but for the last target
/// stage the traced last, which holds the head and the loss (split_stages).
[[nodiscard]] constexpr int merge_source_stage(int traced, int pp, int s) noexcept {
  return s == pp - 1 ? traced - 1 : s * (traced / pp);
}

/// Why the fine-grained rewrite does not apply to `st` with this target (empty when it does);
/// `micro_batches`: per replica in the target when it changes (0: the traces').
/// `job` (the traces `st` was discovered on), when given, is read for what a traced transfer is.
[[nodiscard]] inline std::string stage_split_unsupported(const job_structure& st, int pp, int vp, pipeline::schedule_kind kind,
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
  if (kind == pipeline::schedule_kind::interleaved_one_f_one_b ? vp < 2 : vp != 1) return "model chunks need the interleaved schedule";
  if (!par.micro_batches.known()) return "the traces' micro-batches are not known";
  if (!st.model.layers.known() || st.layer_groups.empty()) return "the traces' layers were not found";
  if ((layers > 0 ? layers : *st.model.layers.value) % (pp * vp) != 0) return "the layers do not divide over the stages and chunks";
  const int m = *par.micro_batches.value;
  try {
    synth::validate_schedule(kind, {pp, micro_batches > 0 ? micro_batches : m, vp});
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
  if (w != 0 && !synth::splits_backward(kind)) return "from the traces' W passes to a schedule without them is not made in the graph";
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

/// The time of one cross-stage transfer, within a node and across nodes.
struct p2p_latency {
  time_ns intra = 0, inter = 0;
  int gpus_per_node = 8;
  time_ns host = 0;  ///< host time to post one send or receive (c10d / NCCL enqueue)
  std::int64_t bytes = 0;  ///< the activation (or its gradient) one transfer moves
  [[nodiscard]] time_ns between(int a, int b) const noexcept {
    return gpus_per_node > 0 && a / gpus_per_node == b / gpus_per_node ? intra : inter;
  }
};

/// The all-reduce of the tied embedding's gradient between the first and the last stage
/// (Megatron's embedding group), which a job without stages does not run: its size and its time
/// within a node and across two.
struct tied_embedding_reduce {
  std::int64_t bytes = 0;
  time_ns intra = 0, inter = 0;
};

namespace detail {

// "rank R ..." with R replaced by `to`; other names unchanged.
[[nodiscard]] inline std::string renumber_name(const std::string& name, int from, int to) {
  const std::string prefix = "rank " + std::to_string(from);
  if (from == to || !name.starts_with(prefix)) return name;
  if (name.size() > prefix.size() && name[prefix.size()] >= '0' && name[prefix.size()] <= '9') return name;
  return "rank " + std::to_string(to) + name.substr(prefix.size());
}

}  // namespace detail

/// Rewrites `b` (the graph of a job whose structure is `st`: without pipeline stages, or with
/// stages that `pp` is a multiple of) into `pp` stages run by schedule `kind` (see the header
/// comment). `plans` are the traced ranks' plans on `b` before the rewrite; a cross-stage transfer
/// takes `p2p.intra` between ranks of one node (`p2p.gpus_per_node` consecutive ranks),
/// `p2p.inter` across nodes, placed as Megatron numbers ranks: stage s of column r is rank s·W + r,
/// W the larger of `ranks_per_stage` and the traced ranks per stage (without traced stages that
/// is also the output's number; with them each traced rank keeps its own on the first stage of its
/// block and the others are numbered from the traced world up). `remap`: the micro-batch change
/// already made on `b` (the structure's tasks are those before it); `layer_copies` and
/// `layers_to`: a layer change already made on `b` instead (`edited_graph::copies` of
/// `repeat_groups`, the new layer count). `weight`: per task of the structure's graph, 1 for a
/// weight gradient (`weight_gradient_tasks`; needed by the zero-bubble schedules). Throws
/// `lumos::error` when `stage_split_unsupported` says why, or when a processor's passes are not in
/// pass order.
[[nodiscard]] inline stage_split split_stages(graph::built_job& b, const trace::job& job, const job_structure& st,
                                              const std::vector<report::iteration_plan>& plans, int pp, int vp,
                                              pipeline::schedule_kind kind, const p2p_latency& p2p, const std::string& latency_source,
                                              const tied_embedding_reduce* tied = nullptr, int ranks_per_stage = 0,
                                              const micro_batch_remap* remap = nullptr,
                                              const std::vector<std::uint8_t>* weight = nullptr,
                                              const std::vector<std::vector<graph::task_id>>* layer_copies = nullptr,
                                              int layers_to = 0) {
  if (layer_copies != nullptr && layers_to <= 0) throw error("whatif --pp: a layer change needs its layer count");
  if (const std::string why = stage_split_unsupported(st, pp, vp, kind, remap != nullptr ? remap->to : 0, &job, layers_to); !why.empty()) {
    throw error("whatif --pp: " + why);
  }
  const bool zero_bubble = synth::splits_backward(kind);
  if (zero_bubble && weight == nullptr) throw error("whatif --pp: a zero-bubble schedule needs the weight-gradient kernels");
  if (st.parallel.pp.value.value_or(1) > pp && layer_copies == nullptr) {
    throw error("whatif --pp: merging stages needs the kept stages' layers repeated first (layer_copies)");
  }
  using graph::task_id;
  using graph::no_task;
  const graph::task_graph& g = b.graph;
  const std::size_t n = g.task_count();
  const std::size_t np = g.processors.size();
  const int m = remap != nullptr ? remap->to : *st.parallel.micro_batches.value;
  const int L = layers_to > 0 ? layers_to : *st.model.layers.value;
  // The tasks the structure's task `t` (of the graph before a micro-batch or layer change) became.
  // With both (layers first, then micro-batch periods over the layer copies): every period copy of
  // every layer copy, layer copy by layer copy; `period_copy` gives each final task's index among
  // its period copies and their count, for the micro-batch it runs.
  std::vector<std::vector<task_id>> composed;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> period_copy;
  if (remap != nullptr && layer_copies != nullptr) {
    composed.resize(layer_copies->size());
    for (task_id t = 0; t < layer_copies->size(); ++t) {
      for (const task_id c : (*layer_copies)[t]) {
        if (c < remap->copies->size()) composed[t].insert(composed[t].end(), (*remap->copies)[c].begin(), (*remap->copies)[c].end());
      }
    }
    period_copy.assign(n, {0, 1});
    for (const auto& all : *remap->copies) {
      for (std::size_t k = 0; k < all.size(); ++k) {
        if (all[k] < n) period_copy[all[k]] = {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(all.size())};
      }
    }
  }
  const std::vector<std::vector<task_id>>* task_copies = !composed.empty() ? &composed : remap != nullptr ? remap->copies : layer_copies;
  std::vector<task_id> inverse;  // with copies: first copy -> task before
  if (task_copies != nullptr) {
    inverse.assign(n, no_task);
    for (task_id t = 0; t < task_copies->size(); ++t) {
      if (!(*task_copies)[t].empty()) inverse[(*task_copies)[t].front()] = t;
    }
  }
  auto copies_of = [&](task_id t) -> std::vector<task_id> {
    if (task_copies == nullptr) return {t};
    return t < task_copies->size() ? (*task_copies)[t] : std::vector<task_id>{};
  };
  const int per_chunk = L / (pp * vp);  // layers of one virtual stage (chunk c of stage s: c·pp + s)
  const int virtual_stages = pp * vp;
  const std::size_t R = job.ranks.size();
  // Traces with stages: traced stage σ becomes the block of target stages [σ·k, σ·k + k), each
  // holding L / pp of its layers; a transfer between two traced stages is the traced one, kept
  // between the blocks' end stages, and only transfers within a block are added.
  const int P = st.parallel.pp.value.value_or(1);
  // Fewer stages than traced (a divisor of them): each target stage is made from one traced stage
  // of the block it merges, whose layers the caller repeated (layer_copies) to the block's count;
  // the first target stage from traced stage 0 (the embedding), the last from the traced last (the
  // head and the loss), the others from their block's first. The other traced ranks are dropped.
  const bool merging = P > pp;
  const int k_sub = merging ? 1 : pp / P;
  const int k_merge = merging ? P / pp : 1;
  // The traced stage target stage s is made from, and the target stage traced stage σ is on (the
  // first of its block when it is cut; −1 when merging drops it).
  auto source_stage = [&](int s) { return merging ? merge_source_stage(P, pp, s) : s / k_sub; };
  auto first_stage = [&](int sigma) {
    if (!merging) return sigma * k_sub;
    const int s = sigma / k_merge;
    return source_stage(s) == sigma ? s : -1;
  };
  // Model chunks from traces with stages: each traced stage's layers fill its block's chunks (the
  // layers are alike, so which traced layer stands for which does not matter); every transfer of
  // the interleaved order is added, across blocks too, and the traced ones are dropped (each
  // carried one pass's activation, where chunks need one per chunk and one from the last stage
  // back to the first).
  // Merging stages likewise replaces every transfer: the traced ones ran to the dropped stages.
  const bool cross_blocks = P > 1 && (vp > 1 || merging);
  const int W0 = P > 1 ? *st.parallel.world.value / P : 0;  // traced ranks per stage
  // A traced rank's stage, from its number (stage_split_unsupported checked that discovery agrees).
  auto traced_stage = [&](int rank) { return P > 1 && rank >= 0 ? rank / W0 : 0; };
  std::vector<int> stage_of(R, 0);  // per index into job.ranks
  std::unordered_map<int, std::size_t> index_of_rank;
  for (std::size_t i = 0; i < R; ++i) {
    index_of_rank[job.ranks[i].rank] = i;
    stage_of[i] = traced_stage(job.ranks[i].rank);
  }

  stage_split out;
  out.schedule = kind;
  out.stages = pp, out.chunks = vp, out.micro_batches = m;
  // Ranks per stage: the target's TP x DP when given (a DP change keeps the traced ranks, which
  // stand for every replica, but places the stages that far apart), else the traced world.
  int W = std::max(ranks_per_stage, P > 1 ? W0 : st.parallel.world.value.value_or(0));
  if (P == 1) {
    for (const auto& r : job.ranks) W = std::max(W, r.rank + 1);
  }
  out.world = W;
  out.tasks_before = n;

  // Op code of copy c of pass k of rank i (task `t`): kind·m + micro-batch (the same on every rank).
  auto code_of_pass = [&](std::size_t i, std::int32_t k, std::size_t c, std::size_t copies, task_id t) -> std::int32_t {
    const pipeline::op& o = st.ranks[i].passes[static_cast<std::size_t>(k)].op;
    if (!period_copy.empty() && t < n) c = period_copy[t].first, copies = period_copy[t].second;
    return detail::pass_code_of(o, m, remap != nullptr ? remap->micro_batch(o.micro_batch, c, copies) : o.micro_batch);
  };

  // Labels: pass code of every task (label_pre / label_post outside the passes). A traced transfer
  // stays on the end stage of its block that faces its peer: placed as the pass's work before its
  // layers (a receive) or after them (a send).
  // The tasks that the task an event maps to (its first copy, after an edit) stands for.
  auto copies_of_first = [&](task_id first) {
    return task_copies != nullptr && inverse[first] != no_task ? copies_of(inverse[first]) : std::vector<task_id>{first};
  };
  detail::pass_labels labels = detail::explicit_pass_labels(
      b, job, st, P, copies_of_first,
      [&](std::size_t i, int pass, std::size_t c, std::size_t copies, task_id t) { return code_of_pass(i, pass, c, copies, t); });
  std::vector<std::int32_t>& code = labels.code;
  std::vector<std::uint8_t>& explicit_label = labels.explicit_label;
  const std::vector<std::uint8_t>& p2p_where = labels.p2p_where;
  // Zero bubble: the weight gradients of a backward pass are its W (code 2m + micro-batch). Traces
  // that ran a zero-bubble schedule label their W passes themselves.
  const bool traced_weight = detail::weight_passes(st) > 0;
  std::vector<std::uint8_t> is_weight(zero_bubble && !traced_weight ? n : 0, 0);
  if (zero_bubble && traced_weight) {
    for (task_id t = 0; t < n; ++t) out.weight_ops += explicit_label[t] && code[t] >= 2 * m && code[t] < 3 * m && g.kind[t] != graph::task_kind::cpu;
  } else if (zero_bubble) {
    for (task_id t = 0; t < weight->size(); ++t) {
      if (!(*weight)[t]) continue;
      for (const task_id c : copies_of(t)) {
        if (c < n) is_weight[c] = 1;
      }
    }
    for (task_id t = 0; t < n; ++t) {
      if (is_weight[t] && explicit_label[t] && code[t] >= m && code[t] < 2 * m) code[t] += m, ++out.weight_ops;
    }
  }
  // The pass a code belongs to: a W is part of its backward pass.
  auto pass_code = [&](std::int32_t c) {
    return c != detail::label_pre && c != detail::label_post && c >= 2 * m ? c - m : c;
  };
  std::vector<std::vector<task_id>> on(np);
  for (task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  // Codes run in pass order on each processor: without stages a micro-batch's F then B (F0 B0 F1
  // B1 ...); with stages, a rank's traced order is its schedule's.
  const std::vector<std::vector<std::int64_t>> traced_order = P > 1 ? detail::traced_pass_positions(st, R, m, remap)
                                                                    : std::vector<std::vector<std::int64_t>>{};
  auto traced_position = [&](std::int32_t c, int rank) -> std::int64_t {
    if (c == detail::label_pre) return -1;
    if (c == detail::label_post) return std::numeric_limits<std::int64_t>::max();
    if (!traced_weight) c = pass_code(c);  // a W the split made sits in its backward pass
    if (const auto it = index_of_rank.find(rank); P > 1 && it != index_of_rank.end()) return traced_order[it->second][static_cast<std::size_t>(c)];
    return c < m ? 2 * static_cast<std::int64_t>(c) : 2 * static_cast<std::int64_t>(c - m) + 1;
  };
  detail::fill_pass_labels(g, labels, on, traced_position);
  // Joins follow their participants.
  std::vector<const graph::collective_instance*> collective_of_join(n, nullptr);
  for (const auto& ci : g.collectives) {
    if (ci.join != no_task && !ci.complete.empty()) {
      collective_of_join[ci.join] = &ci;
      code[ci.join] = code[ci.complete.front()];
    }
  }
  for (task_id t = 0; t < n; ++t) {
    if (code[t] == detail::label_unknown) code[t] = detail::label_pre;
  }

  // Layer of each task, and the tasks every stage keeps: the data-parallel collectives (and
  // their launches).
  std::vector<std::int32_t> layer(n, -1);
  // With a layer change, copy j of traced layer k of a rank's chunk is layer (copies of the layers
  // before k) + j: repeated in place.
  std::map<std::tuple<int, int, int>, std::int32_t> first_index;  // (rank, chunk, traced layer) -> new index of its copy 0
  if (layer_copies != nullptr) {
    std::map<std::tuple<int, int, int>, std::int32_t> count;
    for (const auto& lg : st.layer_groups) {
      if (lg.tasks.empty() || lg.tasks.front() >= layer_copies->size()) continue;
      count[{lg.rank, lg.op.chunk, lg.layer}] = static_cast<std::int32_t>((*layer_copies)[lg.tasks.front()].size());
    }
    std::int32_t next = 0;
    std::pair<int, int> chunk{std::numeric_limits<int>::min(), 0};
    for (const auto& [key, c] : count) {  // in (rank, chunk, layer) order
      if (std::pair{std::get<0>(key), std::get<1>(key)} != chunk) chunk = {std::get<0>(key), std::get<1>(key)}, next = 0;
      first_index[key] = next;
      next += c;
    }
  }
  for (const auto& lg : st.layer_groups) {
    for (const task_id t : lg.tasks) {
      if (layer_copies == nullptr) {
        for (const task_id c : copies_of(t)) {
          if (c < n) layer[c] = lg.layer;
        }
        continue;
      }
      if (t >= layer_copies->size()) continue;
      const auto& lc = (*layer_copies)[t];
      const std::int32_t first = first_index[{lg.rank, lg.op.chunk, lg.layer}];
      for (std::size_t j = 0; j < lc.size(); ++j) {
        // Copy j of the layer, and each micro-batch period copy of it.
        const std::vector<task_id> own{lc[j]};
        for (const task_id c : remap != nullptr && lc[j] < remap->copies->size() ? (*remap->copies)[lc[j]] : own) {
          if (c < n) layer[c] = first + static_cast<std::int32_t>(j);
        }
      }
    }
  }
  std::vector<std::uint8_t> everywhere(n, 0);
  // Collectives of the whole world (the gradient norm's, say) span every stage: one join.
  std::vector<std::uint8_t> world_join(n, 0);
  std::vector<std::string> world_groups;
  {
    std::vector<std::string> dp_groups;
    // A group that spans the world but has a narrower role too (the TP group of a job with
    // one replica, the DP group of a job without TP) is that role's: split per stage.
    for (const auto& pg : st.groups) {
      bool dp = false, world = false, other = false;
      for (const auto& role : pg.roles) {
        if (!role.value) continue;
        dp = dp || *role.value == group_role::dp;
        world = world || *role.value == group_role::world;
        other = other || (*role.value != group_role::dp && *role.value != group_role::world);
      }
      if (dp && !other) dp_groups.push_back(pg.name);
      if (world && !dp && !other) dp_groups.push_back(pg.name), world_groups.push_back(pg.name);
    }
    for (const auto& ci : g.collectives) {
      if (std::find(dp_groups.begin(), dp_groups.end(), ci.group) == dp_groups.end()) continue;
      if (ci.join != no_task && std::find(world_groups.begin(), world_groups.end(), ci.group) != world_groups.end()) world_join[ci.join] = 1;
      for (const task_id t : ci.arrive) everywhere[t] = 1;
      for (const task_id t : ci.complete) everywhere[t] = 1;
      if (ci.join != no_task) everywhere[ci.join] = 1;
    }
    // Traces of one rank per stage hold no DP peers: their gradient collectives are lone ops,
    // not instances, whose group their args name. Left out, the zero-bubble rule below kept a
    // reduce-scatter in B, before the W that computes its gradients (gpt3-15b TP 2 PP 2 DP 2
    // without --unfold -> --schedule zb-h1: -1.44 %).
    for (const lone_collective& c : lone_collectives(job, b)) {
      if (std::find(dp_groups.begin(), dp_groups.end(), c.group) == dp_groups.end()) continue;
      for (const task_id first : {c.arrive, c.task}) {
        if (first == no_task) continue;
        for (const task_id t : copies_of_first(first)) everywhere[t] = 1;
      }
    }
    for (const graph::edge& e : g.edges) {
      if (e.kind == graph::edge_kind::launch && everywhere[e.to]) everywhere[e.from] = 1;
    }
    for (task_id t = 0; t < n; ++t) {
      if (everywhere[t]) layer[t] = -1;
    }
  }
  // Zero bubble: a gradient collective that waits for a weight gradient runs after that W: a
  // data-parallel group's, or a bucket's reduce-scatter that a DP change from one inserted in a
  // layer (which a p2p send or a TP collective that waited for the backward's last kernel is not).
  if (zero_bubble) {
    std::vector<std::uint8_t> inserted_bucket(n, 0);
    for (const auto& ci : g.collectives) {
      if (!ci.group.starts_with(inserted_gradient_group)) continue;
      for (const task_id t : ci.arrive) inserted_bucket[t] = 1;
      for (const task_id t : ci.complete) inserted_bucket[t] = 1;
    }
    for (const graph::edge& e : g.edges) {
      if (e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) continue;
      if (!(everywhere[e.to] || inserted_bucket[e.to]) || code[e.from] < 2 * m || code[e.from] == detail::label_post ||
          code[e.to] != code[e.from] - m) {
        continue;
      }
      code[e.to] = code[e.from];
      // Its arrive or its transfer (a matched op's complete, a lone op's gpu_comm), beside it on
      // its stream.
      const bool arrive = g.kind[e.to] == graph::task_kind::comm_arrive;
      const task_id pair = arrive ? e.to + 1 : e.to - 1;
      const bool paired = pair < n && g.processor[pair] == g.processor[e.to] &&
                          (arrive ? g.kind[pair] == graph::task_kind::comm_complete || g.kind[pair] == graph::task_kind::gpu_comm
                                  : g.kind[pair] == graph::task_kind::comm_arrive);
      if (paired) {
        code[pair] = code[e.from];
      }
    }
    for (const auto& ci : g.collectives) {
      if (ci.join != no_task && !ci.complete.empty()) code[ci.join] = code[ci.complete.front()];
    }
    // An inserted bucket's launch goes with it, as the host launches the W pass's kernels in W:
    // left in B, its host time delayed the final backward's launches (+1.1 % on a launch-bound
    // gpt3-15b of 4 layers of hidden 2048, TP 2 PP 2 -> DP 2 ZB-H1).
    for (const graph::edge& e : g.edges) {
      if (e.kind == graph::edge_kind::launch && inserted_bucket[e.to] && code[e.to] >= 2 * m && code[e.to] != detail::label_post) {
        code[e.from] = code[e.to];
      }
    }
  }
  // A task that a rewrite inserted into a layer (a tensor-parallel all-reduce after its GEMM, its
  // launch) has no event for structure discovery to group: on its processor, between two tasks of
  // one layer in one pass, it is that layer's. (The traces' own tasks there are in the layer's
  // group already: a group takes everything from its first task to its last.)
  for (graph::processor_id p = 0; p < np; ++p) {
    const auto& list = on[p];
    std::vector<std::int32_t> before_layer(list.size(), -1);
    for (std::size_t x = 1; x < list.size(); ++x) {
      const task_id prev = list[x - 1];
      const bool same_pass = pass_code(code[prev]) == pass_code(code[list[x]]);
      before_layer[x] = !same_pass ? -1 : layer[prev] >= 0 ? layer[prev] : before_layer[x - 1];
    }
    std::int32_t after = -1;
    for (std::size_t x = list.size(); x-- > 0;) {
      const task_id t = list[x];
      const bool same_pass = x + 1 < list.size() && pass_code(code[list[x + 1]]) == pass_code(code[t]);
      if (!same_pass) after = -1;
      if (layer[t] >= 0) {
        after = layer[t];
        continue;
      }
      if (!everywhere[t] && code[t] != detail::label_pre && code[t] != detail::label_post && after >= 0 && before_layer[x] == after) {
        layer[t] = after;
      }
    }
  }
  // A GPU op that a rewrite inserted on a stream of its own (a data-parallel bucket's
  // reduce-scatter, launched inside the layer that closes the bucket) is its launch's layer's; an
  // arrive takes its complete, beside it on its stream, along.
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::launch || layer[e.from] < 0 || layer[e.to] >= 0 || everywhere[e.to]) continue;
    layer[e.to] = layer[e.from];
    const task_id pair = e.to + 1;
    if (g.kind[e.to] == graph::task_kind::comm_arrive && pair < n && g.processor[pair] == g.processor[e.to] &&
        g.kind[pair] == graph::task_kind::comm_complete && layer[pair] < 0) {
      layer[pair] = layer[e.from];
    }
  }
  // Where each non-layer task of a pass stands on its processor: before the pass's first layer
  // task there (0), between (1), after its last (2); 1 when the processor has none in the pass.
  std::vector<std::uint8_t> where(n, 1);
  for (graph::processor_id p = 0; p < np; ++p) {
    const auto& list = on[p];
    for (std::size_t x = 0; x < list.size();) {
      std::size_t y = x;
      while (y < list.size() && pass_code(code[list[y]]) == pass_code(code[list[x]])) ++y;
      std::size_t first = y, last = y;
      for (std::size_t z = x; z < y; ++z) {
        if (layer[list[z]] >= 0) {
          if (first == y) first = z;
          last = z;
        }
      }
      if (first != y) {
        for (std::size_t z = x; z < y; ++z) where[list[z]] = z < first ? 0 : z > last ? 2 : 1;
      }
      x = y;
    }
  }
  // The virtual stage of each task of a pass (−1: every stage): a layer's; the work before a
  // forward pass's first layer the first virtual stage's, after its last the last's (reversed
  // for a backward pass); work between layers every stage's, or with chunks the virtual stage
  // of the layer before it.
  std::vector<std::int32_t> virtual_stage(n, -1);
  for (graph::processor_id p = 0; p < np; ++p) {
    if (g.processors[p].kind == graph::processor_kind::barrier) continue;  // joins: below
    std::int32_t previous_layer = -1;
    std::int32_t run_code = detail::label_unknown;
    // The first and last virtual stage this processor's rank reaches (its traced stage's block).
    const int base = std::max(0, first_stage(traced_stage(g.processors[p].rank)));
    const int first_vs = P > 1 ? base : 0, last_vs = P > 1 ? (vp - 1) * pp + base + k_sub - 1 : virtual_stages - 1;
    for (const task_id t : on[p]) {
      const std::int32_t c = pass_code(code[t]);
      if (c != run_code) previous_layer = -1, run_code = c;
      if (everywhere[t] || c == detail::label_pre || c == detail::label_post) continue;
      const bool forward = c < m;
      const std::uint8_t at = p2p_where[t] != 1 ? p2p_where[t] : where[t];
      if (layer[t] >= 0) {
        // With traced stages, slot q of the block: stage base + q mod k of chunk q / k.
        const int q = layer[t] / per_chunk;
        virtual_stage[t] = previous_layer = P > 1 ? q / k_sub * pp + base + q % k_sub : q;
      } else if (at == 0) {
        virtual_stage[t] = forward ? first_vs : last_vs;
      } else if (at == 2) {
        virtual_stage[t] = forward ? last_vs : first_vs;
      } else {
        virtual_stage[t] = vp > 1 ? previous_layer : -1;
      }
    }
  }
  // A join runs in its participants' unit.
  for (task_id t = 0; t < n; ++t) {
    if (collective_of_join[t] != nullptr) virtual_stage[t] = virtual_stage[collective_of_join[t]->complete.front()];
  }
  // Traces with stages: a collective between traced stages (a traced transfer, the tied
  // embedding's all-reduce) stays one instance across the blocks, its join kept where its first
  // participant is. A transfer's participants are placed by their pass (above); the others (the
  // tied embedding's) on the first stage for traced stage 0, the last for the last, else the first
  // of their block, with their launches.
  std::vector<std::int32_t> join_stage(n, -1);
  if (P > 1) {
    std::vector<std::uint8_t> fixed(n, 0);
    for (const auto& ci : g.collectives) {
      if (ci.join == no_task || ci.complete.empty() || world_join[ci.join]) continue;
      int lo = std::numeric_limits<int>::max(), hi = -1;
      for (const task_id c : ci.complete) lo = std::min(lo, traced_stage(g.rank[c])), hi = std::max(hi, traced_stage(g.rank[c]));
      if (lo == hi) continue;
      const bool transfer = p2p_where[ci.complete.front()] != 1 && virtual_stage[ci.complete.front()] >= 0;
      for (std::size_t x = 0; x < ci.complete.size() && !transfer; ++x) {
        const int sigma = traced_stage(g.rank[ci.complete[x]]);
        const int vs = sigma == 0 ? 0 : sigma == P - 1 ? pp - 1 : std::max(0, first_stage(sigma));
        for (const task_id a : {ci.arrive[x], ci.complete[x]}) virtual_stage[a] = vs, fixed[a] = 1;
      }
      virtual_stage[ci.join] = virtual_stage[ci.complete.front()];
      join_stage[ci.join] = virtual_stage[ci.join] < 0 ? -1 : virtual_stage[ci.join] % pp;  // a stage, not a chunk's virtual stage
    }
    for (const graph::edge& e : g.edges) {
      if (e.kind == graph::edge_kind::launch && fixed[e.to]) virtual_stage[e.from] = virtual_stage[e.to];
    }
  }
  auto keeps = [&](int s, task_id t) {
    if (cross_blocks && p2p_where[t] != 1) return false;  // a traced transfer (and its launch): replaced
    return virtual_stage[t] < 0 || virtual_stage[t] % pp == s;
  };
  // The unit each task runs in: its pass and chunk (code·vp + chunk), or before / after the passes.
  auto unit_of = [&](task_id t) -> std::int32_t {
    const std::int32_t c = code[t];
    if (c == detail::label_pre || c == detail::label_post) return c;
    return c * vp + (virtual_stage[t] < 0 ? 0 : virtual_stage[t] / pp);
  };
  auto unit_of_op = [&](const pipeline::op& o) { return detail::pass_code_of(o, m, o.micro_batch) * vp + o.chunk; };
  // A communication op's arrive goes with its complete; a join with its collective's first complete.
  std::vector<std::vector<std::uint8_t>> kept(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(n, 0));
  for (int s = 0; s < pp; ++s) {
    auto& k = kept[static_cast<std::size_t>(s)];
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] != graph::task_kind::join) k[t] = keeps(s, t) ? 1 : 0;
    }
    for (task_id t = 0; t + 1 < n; ++t) {
      if (g.kind[t] == graph::task_kind::comm_arrive && g.processor[t + 1] == g.processor[t]) k[t] = k[t + 1];
    }
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] == graph::task_kind::join) {
        const auto* ci = collective_of_join[t];
        // With traced stages a stage holds only its block's ranks: a join whose first participant
        // is elsewhere is not its.
        const bool here = ci == nullptr || traced_stage(g.rank[ci->complete.front()]) == source_stage(s);
        k[t] = world_join[t] ? s == 0 : ci != nullptr ? k[ci->complete.front()] && here : 1;
      }
    }
  }

  // Per traced rank: its compute stream (most layer kernels), the host thread of each pass kind
  // (most layer launches) and the stream of its data-parallel collectives (else of its other
  // collectives off the compute stream, else the compute stream): the cross-stage transfers and
  // the tied embedding's all-reduce go there.
  constexpr graph::processor_id no_processor = ~graph::processor_id{0};
  std::vector<graph::processor_id> main_stream(R, no_processor), dp_stream(R, no_processor);
  std::vector<std::array<graph::processor_id, 2>> main_thread(R, {no_processor, no_processor});
  std::unordered_map<graph::processor_id, std::size_t> index_of_processor;
  std::unordered_map<graph::processor_id, std::size_t> stream_rank;  // compute stream -> traced rank
  // Each main thread's rank and the pass kinds it launches (bit 0 forward, bit 1 backward).
  std::unordered_map<graph::processor_id, std::pair<std::size_t, int>> index_of_thread;
  {
    auto most = [](const std::map<graph::processor_id, std::size_t>& c) {
      graph::processor_id best = no_processor;
      std::size_t count = 0;
      for (const auto& [p, k] : c) {
        if (k > count) best = p, count = k;
      }
      return best;
    };
    std::vector<std::map<graph::processor_id, std::size_t>> stream_count(R), dp_count(R);
    std::vector<std::array<std::map<graph::processor_id, std::size_t>, 2>> thread_count(R);
    for (const auto& lg : st.layer_groups) {
      for (const task_id t0 : lg.tasks) {
        for (const task_id t : copies_of(t0)) {
          const auto it = t < n ? index_of_rank.find(g.rank[t]) : index_of_rank.end();
          if (it == index_of_rank.end()) continue;
          const auto k = g.kind[t];
          if (k == graph::task_kind::gpu_compute) ++stream_count[it->second][g.processor[t]];
          if (k == graph::task_kind::cpu || k == graph::task_kind::cpu_blocking) {
            ++thread_count[it->second][lg.op.kind == pipeline::op_kind::forward ? 0 : 1][g.processor[t]];
          }
        }
      }
    }
    for (task_id t = 0; t < n; ++t) {
      if (!everywhere[t] || g.kind[t] != graph::task_kind::comm_complete) continue;
      if (const auto it = index_of_rank.find(g.rank[t]); it != index_of_rank.end()) ++dp_count[it->second][g.processor[t]];
    }
    // Inserted gradient buckets are the data-parallel collectives too: with the traced ones
    // removed (gradient_buckets.hpp), the world's all-reduce alone must not pick its stream.
    for (const auto& ci : g.collectives) {
      if (!ci.group.starts_with(inserted_gradient_group)) continue;
      for (const task_id t : ci.complete) {
        if (const auto it = t < n ? index_of_rank.find(g.rank[t]) : index_of_rank.end(); it != index_of_rank.end()) {
          ++dp_count[it->second][g.processor[t]];
        }
      }
    }
    // Without traced data-parallel collectives, the stream of the rank's other collectives off its
    // compute stream (those a DP change from one replica inserted), if any.
    std::vector<std::map<graph::processor_id, std::size_t>> other_count(R);
    for (const auto& ci : g.collectives) {
      if (ci.kind == "sendrecv" || ci.kind == "send_recv") continue;
      for (const task_id t : ci.complete) {
        if (const auto it = t < n ? index_of_rank.find(g.rank[t]) : index_of_rank.end(); it != index_of_rank.end()) {
          ++other_count[it->second][g.processor[t]];
        }
      }
    }
    for (std::size_t i = 0; i < R; ++i) {
      main_stream[i] = most(stream_count[i]);
      main_thread[i] = {most(thread_count[i][0]), most(thread_count[i][1])};
      if (main_stream[i] == no_processor || main_thread[i][0] == no_processor || main_thread[i][1] == no_processor) {
        throw error("whatif --pp: rank " + std::to_string(job.ranks[i].rank) + " has no layer kernels or launches to join its stages by");
      }
      other_count[i].erase(main_stream[i]);
      dp_stream[i] = !dp_count[i].empty() ? most(dp_count[i]) : !other_count[i].empty() ? most(other_count[i]) : main_stream[i];
      stream_rank[main_stream[i]] = i;
      index_of_processor[dp_stream[i]] = i;
      for (int kind_index = 0; kind_index < 2; ++kind_index) {
        auto& entry = index_of_thread[main_thread[i][static_cast<std::size_t>(kind_index)]];
        entry.first = i, entry.second |= 1 << kind_index;
      }
    }
  }

  // Stage orders and each code's position in them.
  const pipeline::schedule_shape shape{pp, m, vp};
  const auto orders = synth::stage_orders(kind, shape);
  const auto units = static_cast<std::size_t>((zero_bubble ? 3 : 2) * m * vp);
  std::vector<std::vector<std::int64_t>> position(static_cast<std::size_t>(pp), std::vector<std::int64_t>(units, 0));
  // Which units of a stage receive their input from another stage, and which send their output.
  std::vector<std::vector<std::uint8_t>> receives(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(units, 0));
  std::vector<std::vector<std::uint8_t>> sends_to(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(units, 0));
  for (int s = 0; s < pp; ++s) {
    const auto& order = orders[static_cast<std::size_t>(s)];
    for (std::size_t x = 0; x < order.size(); ++x) {
      const auto u = static_cast<std::size_t>(unit_of_op(order[x]));
      position[static_cast<std::size_t>(s)][u] = static_cast<std::int64_t>(x);
      // Between traced stages the traced transfer stays: only transfers within a block are added.
      if (const auto dep = pipeline::dependency_of(shape, s, order[x]); dep && dep->crosses_stages(s) && (cross_blocks || source_stage(dep->on.stage) == source_stage(s))) {
        receives[static_cast<std::size_t>(s)][u] = 1;
        sends_to[static_cast<std::size_t>(dep->on.stage)][static_cast<std::size_t>(unit_of_op(dep->on.what))] = 1;
      }
    }
  }
  auto pos = [&](int s, std::int32_t u) -> std::int64_t {
    if (u == detail::label_pre) return -1;
    if (u == detail::label_post) return std::numeric_limits<std::int64_t>::max();
    return position[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)];
  };

  out.pass_stream_tasks.assign(static_cast<std::size_t>(pp) * R, {});
  // The new graph: per stage, every processor's tasks in the stage's order of passes.
  graph::task_graph ng;
  ng.strings = g.strings;
  std::vector<std::vector<task_id>> copy(static_cast<std::size_t>(pp), std::vector<task_id>(n, no_task));
  // Megatron's number of stage s of traced rank `rank` (pipeline stages outermost), which places
  // it on its node; from traces without stages also its number in the output.
  auto megatron_rank = [&](int rank, int s) { return rank < 0 ? rank : (P > 1 ? rank % W0 : rank) + s * W; };
  // The number of stage s of traced rank `rank` in the output. With traced stages, each traced
  // rank keeps its number on the first stage of its block (its files, plans and maps are the
  // job's), and the other stages of the block are numbered from the traced world up.
  auto new_rank = [&](int rank, int s) -> int {
    if (rank < 0 || P == 1) return megatron_rank(rank, s);
    if (merging) return rank;
    const int sigma = rank / W0, j = s - sigma * k_sub;
    return j == 0 ? rank : P * W0 + (sigma * (k_sub - 1) + j - 1) * W0 + rank % W0;
  };
  // First and last new task of (stage, processor, code), for the cross-stage transfers.
  std::map<std::tuple<int, graph::processor_id, std::int32_t>, std::pair<task_id, task_id>> ends;
  // The last new task of (stage, processor) before the run of a code, for the host's drain.
  std::map<std::tuple<int, graph::processor_id, std::int32_t>, task_id> before;
  // The host's launch of the send of (stage, traced rank, unit).
  std::map<std::tuple<int, std::size_t, std::int32_t>, task_id> send_launch;
  // The host's receive of (stage, traced rank, unit): its launch, then the synchronisation on the
  // receive's stream, then on the compute stream.
  struct receive_post {
    task_id launch = graph::no_task, on_transfer = graph::no_task, on_compute = graph::no_task;
    graph::processor_id thread = 0;  // the traced thread
  };
  std::map<std::tuple<int, std::size_t, std::int32_t>, receive_post> receives_posted;
  // Every host task the transfers added, per (stage, traced rank), for the added ranks' plans.
  std::map<std::pair<int, std::size_t>, std::vector<task_id>> host_added;
  // The tied embedding's all-reduce of (stage, traced rank): arrive and complete; its launch.
  std::map<std::pair<int, std::size_t>, std::pair<task_id, task_id>> tied_tasks;
  std::map<std::pair<int, std::size_t>, task_id> tied_launch;
  // Host tasks added right before a copied task (stage, original task): they take that task's
  // edges from other threads (a hand-off into the autograd thread, say), so that they run no
  // earlier than it could.
  std::map<std::pair<int, task_id>, task_id> placed_before;
  // The processors of each stage: with traced stages, only those of its block's traced ranks.
  std::vector<graph::processor_id> processor_at(static_cast<std::size_t>(pp) * np, no_processor);
  for (int s = 0; s < pp; ++s) {
    for (graph::processor_id p = 0; p < np; ++p) {
      graph::processor_info info = g.processors[p];
      if (P > 1 && info.rank >= 0 && traced_stage(info.rank) != source_stage(s)) continue;
      info.name = detail::renumber_name(info.name, info.rank, new_rank(info.rank, s));
      info.rank = new_rank(info.rank, s);
      processor_at[static_cast<std::size_t>(s) * np + p] = ng.add_processor(std::move(info));
    }
  }
  // With traced stages: each stage's processors' original tasks in their new order.
  std::vector<std::vector<task_id>> emitted(P > 1 ? static_cast<std::size_t>(pp) * np : 0);
  std::size_t total = 0;
  for (int s = 0; s < pp; ++s) total += static_cast<std::size_t>(std::count(kept[static_cast<std::size_t>(s)].begin(), kept[static_cast<std::size_t>(s)].end(), 1));
  ng.reserve(total, g.edge_count() * static_cast<std::size_t>(pp) + static_cast<std::size_t>(4 * m * pp) * R);
  for (int s = 0; s < pp; ++s) {
    const auto& k = kept[static_cast<std::size_t>(s)];
    auto& cp = copy[static_cast<std::size_t>(s)];
    for (graph::processor_id p = 0; p < np; ++p) {
      const auto& list = on[p];
      // Runs of one unit, emitted in the stage's order (stable: runs of equal position keep theirs).
      std::vector<std::pair<std::size_t, std::size_t>> runs;
      for (std::size_t x = 0; x < list.size();) {
        std::size_t y = x;
        while (y < list.size() && unit_of(list[y]) == unit_of(list[x])) ++y;
        runs.emplace_back(x, y);
        x = y;
      }
      std::stable_sort(runs.begin(), runs.end(), [&](const auto& a, const auto& c) {
        return pos(s, unit_of(list[a.first])) < pos(s, unit_of(list[c.first]));
      });
      const graph::processor_id np_id = processor_at[static_cast<std::size_t>(s) * np + p];
      if (np_id == no_processor) continue;
      task_id previous = no_task;
      // The tied embedding's all-reduce on the end stages: first of the work after the passes.
      const auto tied_here = tied != nullptr && pp > 1 && (s == 0 || s == pp - 1) ? index_of_processor.find(p) : index_of_processor.end();
      bool tied_done = tied_here == index_of_processor.end();
      auto emit_tied = [&] {
        const std::size_t i = tied_here->second;
        const int r0 = megatron_rank(job.ranks[i].rank, 0), r1 = megatron_rank(job.ranks[i].rank, pp - 1);
        graph::task_spec spec;
        spec.processor = np_id;
        spec.rank = new_rank(job.ranks[i].rank, s);
        spec.kind = graph::task_kind::comm_arrive;
        spec.name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
        const task_id a = ng.add_task(spec);
        spec.kind = graph::task_kind::comm_complete;
        spec.duration = p2p.gpus_per_node > 0 && r0 / p2p.gpus_per_node == r1 / p2p.gpus_per_node ? tied->intra : tied->inter;
        const task_id c = ng.add_task(spec);
        tied_tasks[{s, i}] = {a, c};
        tied_done = true;
      };
      const auto waits_here = index_of_thread.find(p);
      // The host thread that launches a traced rank's forward passes launches the tied
      // embedding's all-reduce, first of its work after the passes.
      const bool tied_host = tied != nullptr && pp > 1 && (s == 0 || s == pp - 1) && waits_here != index_of_thread.end() &&
                             (waits_here->second.second & 1) != 0;
      bool tied_launched = !tied_host;
      auto host_task = [&](std::string_view name, time_ns duration, int rank, time_ns at) {
        graph::task_spec spec;
        spec.kind = graph::task_kind::cpu;
        spec.processor = np_id;
        spec.name = name;
        spec.duration = duration;
        spec.rank = rank;
        spec.observed_start = spec.observed_end = at;
        const task_id t = ng.add_task(spec);
        host_added[{s, waits_here->second.first}].push_back(t);
        return t;
      };
      auto launch_tied = [&](time_ns at) {
        const std::size_t i = waits_here->second.first;
        tied_launch[{s, i}] = host_task("cudaLaunchKernel", p2p.host, new_rank(job.ranks[i].rank, s), at);
        tied_launched = true;
      };
      // Whether this processor is the host thread that launches unit u's pass, and u is marked in
      // `of` (the units that receive, or send).
      auto launches = [&](std::int32_t u, const std::vector<std::vector<std::uint8_t>>& of) {
        if (waits_here == index_of_thread.end() || u == detail::label_pre || u == detail::label_post) return false;
        const bool forward = u < m * vp;
        return (waits_here->second.second & (forward ? 1 : 2)) != 0 && of[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)] != 0;
      };
      // A unit can have several runs on a processor (a backward pass's B and W alternate): its
      // receive goes before the first kept task of its first run, its send after its last run.
      std::int32_t received = detail::label_unknown;
      for (std::size_t r = 0; r < runs.size(); ++r) {
        const auto [x, y] = runs[r];
        const std::int32_t u = unit_of(list[x]);
        const bool last_run = r + 1 == runs.size() || unit_of(list[runs[r + 1].first]) != u;
        if (previous != no_task) before.try_emplace({s, p, u}, previous);  // before the first run of the unit
        if (!tied_done && u == detail::label_post) emit_tied();
        if (!tied_launched && u == detail::label_post && x < y) {
          launch_tied(g.observed_start[list[x]]);
          placed_before[{s, list[x]}] = tied_launch[{s, waits_here->second.first}];
        }
        task_id first = no_task, last = no_task;
        for (std::size_t z = x; z < y; ++z) {
          const task_id t = list[z];
          if (!k[t]) continue;
          if (received != u && launches(u, receives)) {
            received = u;
            // A pass that receives its input: the host launches the receive, then waits for it
            // and for its compute stream to drain (Megatron's torch.cuda.synchronize() after the
            // batched send/recv), in the step from its start.
            const int rank = new_rank(g.rank[t], s);
            receive_post rp;
            rp.launch = host_task("cudaLaunchKernel", p2p.host, rank, g.observed_start[t]);
            rp.on_transfer = host_task("cudaStreamSynchronize", 0, rank, g.observed_start[t]);
            rp.on_compute = host_task("cudaStreamSynchronize", 0, rank, g.observed_start[t]);
            rp.thread = p;
            receives_posted[{s, waits_here->second.first, u}] = rp;
            placed_before[{s, t}] = rp.launch;
          }
          graph::task_spec spec = detail::spec_of(g, t);
          spec.processor = np_id;
          spec.rank = new_rank(g.rank[t], s);
          spec.name = {};
          spec.name_id = g.name[t];
          cp[t] = ng.add_task(spec);
          if (P > 1) emitted[static_cast<std::size_t>(s) * np + p].push_back(t);
          if (const auto ms = stream_rank.find(p); ms != stream_rank.end() && code[t] != detail::label_pre && code[t] != detail::label_post) {
            out.pass_stream_tasks[static_cast<std::size_t>(s) * R + ms->second].push_back(cp[t]);
          }
          if (first == no_task) first = cp[t];
          last = cp[t];
        }
        if (first != no_task) {
          const auto [e, fresh] = ends.try_emplace({s, p, u}, first, last);
          if (!fresh) e->second.second = last;
          previous = last;
        }
        const auto unit_end = ends.find({s, p, u});
        if (last_run && unit_end != ends.end() && launches(u, sends_to)) {
          // A pass whose output another stage reads: the host launches the send after it.
          send_launch[{s, waits_here->second.first, u}] = host_task(
              "cudaLaunchKernel", p2p.host, new_rank(job.ranks[waits_here->second.first].rank, s), ng.observed_end[unit_end->second.second]);
        }
      }
      if (!tied_done) emit_tied();
      if (!tied_launched) launch_tied(list.empty() ? 0 : g.observed_end[list.back()]);
    }
  }
  out.tasks_after = ng.task_count();
  // With traced stages, a host synchronization waits for what its thread enqueued before it in the
  // new order, not in the traced one: a synchronize after a traced receive waited for the pass the
  // traced schedule ran before it (torch.cuda.synchronize() drains every stream). Each traced
  // edge from a stream op its own thread launched into a synchronization is re-targeted to the
  // last op the thread has launched on that stream by then on the stage (none: dropped). An edge
  // from an op another thread launched (the backward's, on the autograd thread) in another pass
  // is re-targeted to the last op of the stream in the passes the stage runs before the
  // synchronization's.
  std::map<std::pair<int, std::size_t>, task_id> resync;  // (stage, edge index) -> new source
  if (P > 1) {
    std::vector<task_id> launched_by(n, no_task);
    std::vector<std::vector<task_id>> launches_of(n);
    std::vector<std::vector<std::size_t>> sync_in(n), sync_other(n);
    for (std::size_t x = 0; x < g.edges.size(); ++x) {
      const graph::edge& e = g.edges[x];
      if (e.kind == graph::edge_kind::launch) launched_by[e.to] = e.from, launches_of[e.from].push_back(e.to);
    }
    for (std::size_t x = 0; x < g.edges.size(); ++x) {
      const graph::edge& e = g.edges[x];
      if (e.kind != graph::edge_kind::sync || launched_by[e.from] == no_task) continue;
      if (g.processor[launched_by[e.from]] == g.processor[e.to]) {
        sync_in[e.to].push_back(x);
      } else if (unit_of(e.from) != unit_of(e.to)) {
        sync_other[e.to].push_back(x);
      }
    }
    for (int s = 0; s < pp; ++s) {
      const auto& cp = copy[static_cast<std::size_t>(s)];
      for (graph::processor_id p = 0; p < np; ++p) {
        const auto pk = g.processors[p].kind;
        if (pk == graph::processor_kind::gpu_stream || pk == graph::processor_kind::barrier) continue;
        std::unordered_map<graph::processor_id, task_id> last;  // per stream: the last op launched on it
        for (const task_id y : emitted[static_cast<std::size_t>(s) * np + p]) {
          for (const std::size_t x : sync_in[y]) {
            const auto it = last.find(g.processor[g.edges[x].from]);
            resync[{s, x}] = it == last.end() ? no_task : it->second;
          }
          for (const std::size_t x : sync_other[y]) {
            // The stream's tasks on the stage run in the order of their passes.
            const auto& on_stream = emitted[static_cast<std::size_t>(s) * np + g.processor[g.edges[x].from]];
            const std::int64_t at = pos(s, unit_of(y));
            const auto end = std::partition_point(on_stream.begin(), on_stream.end(), [&](task_id t) { return pos(s, unit_of(t)) < at; });
            resync[{s, x}] = end == on_stream.begin() ? no_task : *(end - 1);
          }
          for (task_id z : launches_of[y]) {
            if (cp[z] == no_task) continue;
            // A communication op is waited for at its complete, beside its arrive on the stream.
            if (g.kind[z] == graph::task_kind::comm_arrive && z + 1 < n && g.processor[z + 1] == g.processor[z]) ++z;
            last[g.processor[z]] = z;
          }
        }
      }
    }
  }
  // A world collective's join is stage 0's.
  // A join across traced stages is its kept stage's.
  auto copy_of = [&](int s, task_id t) {
    return world_join[t] ? copy[0][t] : join_stage[t] >= 0 ? copy[static_cast<std::size_t>(join_stage[t])][t] : copy[static_cast<std::size_t>(s)][t];
  };
  // The last op on t's processor, traced before t, that stage s keeps and runs no later in its
  // order than `target`'s unit (none: no_task).
  auto last_before_on_stream = [&](int s, task_id t, task_id target) {
    const auto& line = on[g.processor[t]];
    for (auto it = std::lower_bound(line.begin(), line.end(), t); it != line.begin();) {
      const task_id y = *--it;
      if (pos(s, unit_of(y)) <= pos(s, unit_of(target)) && copy_of(s, y) != no_task) return y;
    }
    return no_task;
  };
  for (std::size_t x = 0; x < g.edges.size(); ++x) {
    const graph::edge& traced_edge = g.edges[x];
    for (int s = 0; s < pp; ++s) {
      graph::edge e = traced_edge;
      if (const auto r = resync.find({s, x}); r != resync.end()) {
        if (r->second == no_task) continue;
        e.from = r->second;
      }
      task_id from = copy_of(s, e.from);
      const task_id to = copy_of(s, e.to);
      if (from == no_task || to == no_task) continue;
      if (pos(s, unit_of(e.from)) > pos(s, unit_of(e.to))) {
        // A weight gradient moved to its W pass (zero bubble) was the last op of its backward
        // on its stream, which the pass's send waited for (an event recorded after it): that
        // wait now binds the last op the stream runs before it, in the pass that stays. Dropped,
        // the send ran without waiting for the backward: ZB-H1 of llama3-8b TP 2 PP 2 (lumos
        // synth --detail kernel) was 0.9 % faster than the schedule traced directly.
        const task_id stays = zero_bubble && code[e.from] >= 2 * m ? last_before_on_stream(s, e.from, e.to) : no_task;
        if (stays == no_task) {
          ++out.edges_dropped;
          continue;
        }
        e.from = stays, from = copy_of(s, stays);
      }
      if (s > 0 && world_join[e.from] && world_join[e.to]) continue;
      if (join_stage[e.from] >= 0 && join_stage[e.to] >= 0 && s != join_stage[e.from]) continue;
      ng.add_edge(from, to, e.delay, e.kind, e.flags());
      if (g.processor[e.from] == g.processor[e.to]) continue;
      if (const auto pb = placed_before.find({s, e.to}); pb != placed_before.end()) {
        ng.add_edge(from, pb->second, e.delay, e.kind, e.flags());
      }
    }
  }
  for (const graph::collective_instance& ci : g.collectives) {
    if (ci.join != no_task && (world_join[ci.join] || join_stage[ci.join] >= 0)) {
      const bool world = world_join[ci.join] != 0;
      graph::collective_instance nc = ci;
      nc.join = copy_of(0, ci.join);
      nc.arrive.clear(), nc.complete.clear(), nc.group_ranks.clear();
      for (int s = 0; s < pp; ++s) {
        const auto& cp = copy[static_cast<std::size_t>(s)];
        for (std::size_t x = 0; x < ci.arrive.size(); ++x) {
          if (cp[ci.arrive[x]] != no_task && cp[ci.complete[x]] != no_task) {
            nc.arrive.push_back(cp[ci.arrive[x]]), nc.complete.push_back(cp[ci.complete[x]]);
            if (!world) nc.group_ranks.push_back(ng.rank[cp[ci.complete[x]]]);
          }
        }
        for (const int r : ci.group_ranks) {
          if (world && (P == 1 || traced_stage(r) == source_stage(s))) nc.group_ranks.push_back(new_rank(r, s));
        }
      }
      if (!world && p2p_where[ci.complete.front()] != 1 && ci.complete.size() == 2 && nc.complete.size() == 2) {
        // A traced transfer whose two stages now sit on nodes of another kind (within one, across
        // two): its transfer time scaled by the model's ratio.
        const time_ns traced_time = p2p.between(g.rank[ci.complete[0]], g.rank[ci.complete[1]]);
        auto megatron_of = [&](task_id c) {
          int s = 0;
          while (s + 1 < pp && copy[static_cast<std::size_t>(s)][c] == no_task) ++s;
          return megatron_rank(g.rank[c], s);
        };
        const time_ns after = p2p.between(megatron_of(ci.complete[0]), megatron_of(ci.complete[1]));
        if (traced_time > 0 && after != traced_time) {
          for (const task_id c : nc.complete) {
            ng.duration[c] = static_cast<time_ns>(std::llround(static_cast<double>(ng.duration[c]) * static_cast<double>(after) / static_cast<double>(traced_time)));
          }
        }
      }
      if (nc.join != no_task) ng.collectives.push_back(std::move(nc));
      continue;
    }
    for (int s = 0; s < pp; ++s) {
      const auto& cp = copy[static_cast<std::size_t>(s)];
      graph::collective_instance nc = ci;
      if (ci.join != no_task && cp[ci.join] == no_task) continue;
      nc.join = ci.join != no_task ? cp[ci.join] : no_task;
      nc.arrive.clear(), nc.complete.clear();
      for (std::size_t x = 0; x < ci.arrive.size(); ++x) {
        if (cp[ci.arrive[x]] != no_task && cp[ci.complete[x]] != no_task) nc.arrive.push_back(cp[ci.arrive[x]]), nc.complete.push_back(cp[ci.complete[x]]);
      }
      if (nc.complete.empty()) continue;
      for (int& r : nc.group_ranks) r = new_rank(r, s);
      if (s > 0 && !merging) nc.group += ".pp" + std::to_string(s);  // merged: each traced group is on one stage
      ng.collectives.push_back(std::move(nc));
    }
  }
  // Communication ops whose peers are absent from the job (traces of one rank per stage hold a
  // TP group's ops without its other ranks) are no instance: each stage's copy is named and
  // numbered here as an instance's copy is above. Written back under the traced name, a stage's
  // TP all-reduces would be joined with the traced stage's on reading (a cycle through the
  // pipeline's transfers).
  if (!merging) {
    std::vector<std::optional<detail::comm_args_source>> args(R);
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] != graph::task_kind::gpu_comm || t >= g.source.size() || g.source[t] == ~0U) continue;
      const auto at = index_of_rank.find(g.rank[t]);
      if (at == index_of_rank.end()) continue;
      const trace::rank_trace& tr = job.ranks[at->second];
      if (g.source[t] >= tr.events.size()) continue;
      if (!args[at->second]) args[at->second].emplace(tr);
      const std::uint32_t src = args[at->second]->of(g.source[t]);
      const std::string_view group = tr.arg_text(src, trace::arg_key::process_group_name);
      if (group.empty()) continue;
      const std::vector<int> ranks = graph::detail::parse_rank_list(tr.arg_text(src, trace::arg_key::process_group_ranks));
      const std::string comm = detail::comm_kind(tr.name(tr.events[g.source[t]]), tr.arg_text(src, trace::arg_key::collective_name));
      if (P == 1 && std::find(world_groups.begin(), world_groups.end(), group) != world_groups.end()) {
        // A collective of the whole world (the gradient norm's) whose peers the traces do not
        // hold (one traced rank for symmetric ones): the stages are its peers now, so their
        // copies are one instance that completes once the last stage arrives, as in a job with
        // stages, where the stage that finishes its backward passes first waits there.
        const std::uint32_t ev = g.source[t];
        const auto& arrive_of = b.ranks[at->second].arrive_of_event;
        const task_id arrive = ev < arrive_of.size() ? arrive_of[ev] : no_task;
        if (arrive == no_task) continue;
        graph::processor_info barrier;
        barrier.kind = graph::processor_kind::barrier;
        barrier.rank = -1;
        barrier.name = std::string(group) + " join";
        graph::task_spec js;
        js.kind = graph::task_kind::join;
        js.processor = ng.add_processor(std::move(barrier));
        js.name = comm;
        js.rank = -1;
        const task_id join = ng.add_task(js);
        graph::collective_instance nc;
        nc.kind = comm;
        nc.group = std::string(group);
        nc.bytes = tr.arg(src, trace::arg_key::in_msg_nelems).value_or(0);
        nc.join = join;
        nc.match = "added by the pipeline what-if (a collective of the whole world, joined across the stages)";
        time_ns last = std::numeric_limits<time_ns>::min();
        for (int s = 0; s < pp; ++s) {
          const task_id a = copy[static_cast<std::size_t>(s)][arrive], c = copy[static_cast<std::size_t>(s)][t];
          if (a == no_task || c == no_task) continue;
          for (const int r : ranks) nc.group_ranks.push_back(new_rank(r, s));
          nc.arrive.push_back(a);
          nc.complete.push_back(c);
          ng.add_edge(a, join, 0, graph::edge_kind::collective);
          ng.add_edge(join, c, 0, graph::edge_kind::collective);
          last = std::max(last, ng.observed_start[a]);
        }
        ng.observed_start[join] = ng.observed_end[join] = nc.arrive.empty() ? 0 : last;
        ++out.world_joined;
        ng.collectives.push_back(std::move(nc));
        continue;
      }
      for (int s = 1; s < pp; ++s) {
        const task_id c = copy[static_cast<std::size_t>(s)][t];
        if (c == no_task) continue;
        graph::collective_instance nc;
        nc.kind = comm;
        nc.group = std::string(group) + ".pp" + std::to_string(s);
        for (const int r : ranks) nc.group_ranks.push_back(new_rank(r, s));
        nc.complete = {c};
        out.lone_groups.push_back(std::move(nc));
      }
    }
  }

  // Cross-stage transfers: a send kernel on the producer's stream to the next (or previous)
  // stage, after the producer's last kernel of the pass, and a receive kernel on the consumer's
  // stream from it, joined as one p2p instance; the consumer's host waits for the receive and
  // for its compute stream. Sends are queued in the producer's order, receives in the
  // consumer's, and each (direction, producer stage and chunk, traced rank) is one group whose
  // k-th send pairs with its k-th receive, as NCCL orders a communicator's p2p operations.
  struct transfer {
    std::size_t i = 0, i_from = 0;  // the traced ranks of the receiving and the sending stage
    int from = 0, to = 0, chunk = 0;
    std::int32_t from_unit = 0, to_unit = 0;
    bool forward = true;
    task_id producer = no_task, send = no_task;
    receive_post receive;
    task_id send_arrive = no_task, recv_arrive = no_task;
  };
  // A receive is posted once the stage's previous pass has been launched on the other host
  // thread too (the autograd thread's backward, say, follows the forward the main thread
  // launched), not as soon as its own thread is free.
  for (const auto& [key, rp] : receives_posted) {
    const auto& [s, i, u] = key;
    const std::int64_t at = pos(s, u);
    if (at <= 0) continue;
    const std::int32_t previous_unit = unit_of_op(orders[static_cast<std::size_t>(s)][static_cast<std::size_t>(at - 1)]);
    for (const graph::processor_id q : main_thread[i]) {
      if (q == rp.thread) continue;
      if (const auto e = ends.find({s, q, previous_unit}); e != ends.end()) {
        ng.add_edge(e->second.second, rp.launch, 0, graph::edge_kind::thread_handoff);
      }
    }
  }
  std::vector<transfer> transfers;
  for (std::size_t i = 0; i < R; ++i) {
    for (int consumer = 0; consumer < pp; ++consumer) {
      for (const pipeline::op& o : orders[static_cast<std::size_t>(consumer)]) {
        const auto dep = pipeline::dependency_of(shape, consumer, o);
        if (!dep || !dep->crosses_stages(consumer) || source_stage(consumer) != stage_of[i]) continue;
        if (!cross_blocks && source_stage(dep->on.stage) != source_stage(consumer)) continue;
        transfer x;
        x.i = x.i_from = i, x.from = dep->on.stage, x.to = consumer;
        if (P > 1 && source_stage(dep->on.stage) != stage_of[i]) {
          // The sender is the traced rank of the same column on the producing block's stage.
          const auto it = index_of_rank.find(source_stage(dep->on.stage) * W0 + job.ranks[i].rank % W0);
          if (it == index_of_rank.end()) continue;
          x.i_from = it->second;
        }
        x.from_unit = unit_of_op(dep->on.what), x.to_unit = unit_of_op(o);
        x.chunk = dep->on.what.chunk;
        x.forward = o.kind == pipeline::op_kind::forward;
        const auto from = ends.find({x.from, main_stream[x.i_from], x.from_unit});
        const auto send = send_launch.find({x.from, x.i_from, x.from_unit});
        const auto receive = receives_posted.find({x.to, i, x.to_unit});
        if (from == ends.end() || send == send_launch.end() || receive == receives_posted.end()) continue;
        x.producer = from->second.second, x.send = send->second, x.receive = receive->second;
        transfers.push_back(x);
      }
    }
  }
  // The p2p streams of (stage, traced rank): 0 receives from the previous stage, 1 from the
  // next, 2 sends to the next, 3 to the previous; numbered after the rank's traced streams.
  std::map<std::tuple<int, std::size_t, int>, graph::processor_id> p2p_streams;
  std::vector<std::int64_t> stream_base(R, 0);
  for (graph::processor_id p = 0; p < np; ++p) {
    const auto& info = g.processors[p];
    if (info.kind != graph::processor_kind::gpu_stream) continue;
    for (std::size_t i = 0; i < R; ++i) {
      if (info.rank == job.ranks[i].rank) stream_base[i] = std::max(stream_base[i], info.index + 1);
    }
  }
  auto p2p_stream = [&](int s, std::size_t i, int which) {
    const auto [it, fresh] = p2p_streams.try_emplace({s, i, which}, 0);
    if (fresh) {
      static constexpr std::array<const char*, 4> what = {"p2p recv prev", "p2p recv next", "p2p send next", "p2p send prev"};
      graph::processor_info info;
      info.kind = graph::processor_kind::gpu_stream;
      info.rank = new_rank(job.ranks[i].rank, s);
      info.owner = g.processors[main_stream[i]].owner;
      info.index = stream_base[i] + which;
      info.name = "rank " + std::to_string(info.rank) + " stream " + std::to_string(info.index) + " (" +
                  what[static_cast<std::size_t>(which)] + ")";
      it->second = ng.add_processor(std::move(info));
    }
    return it->second;
  };
  const string_id p2p_kernel = ng.strings.intern("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)");
  auto comm_pair = [&](graph::processor_id stream, int rank, time_ns duration, time_ns at) {
    graph::task_spec spec;
    spec.processor = stream;
    spec.rank = rank;
    spec.name_id = p2p_kernel;
    spec.kind = graph::task_kind::comm_arrive;
    spec.observed_start = spec.observed_end = at;
    const task_id a = ng.add_task(spec);
    spec.kind = graph::task_kind::comm_complete;
    spec.duration = duration;
    (void)ng.add_task(spec);  // the complete: the arrive's next id
    return a;
  };
  std::vector<std::size_t> by(transfers.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  auto order_by = [&](auto key) { std::stable_sort(by.begin(), by.end(), [&](std::size_t a, std::size_t c) { return key(transfers[a]) < key(transfers[c]); }); };
  auto time_of = [&](const transfer& x) {
    return p2p.between(megatron_rank(job.ranks[x.i_from].rank, x.from), megatron_rank(job.ranks[x.i].rank, x.to));
  };
  order_by([&](const transfer& x) { return std::tuple(x.from, x.i_from, x.forward, pos(x.from, x.from_unit)); });
  for (const std::size_t k : by) {
    transfer& x = transfers[k];
    const int rank = new_rank(job.ranks[x.i_from].rank, x.from);
    x.send_arrive = comm_pair(p2p_stream(x.from, x.i_from, x.forward ? 2 : 3), rank, time_of(x), ng.observed_end[x.send]);
    ng.add_edge(x.send, x.send_arrive, p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
    ng.add_edge(x.producer, x.send_arrive, 0, graph::edge_kind::dependency);
  }
  order_by([&](const transfer& x) { return std::tuple(x.to, x.i, x.forward, pos(x.to, x.to_unit)); });
  for (const std::size_t k : by) {
    transfer& x = transfers[k];
    const int rank = new_rank(job.ranks[x.i].rank, x.to);
    x.recv_arrive = comm_pair(p2p_stream(x.to, x.i, x.forward ? 0 : 1), rank, time_of(x), ng.observed_end[x.receive.launch]);
    ng.add_edge(x.receive.launch, x.recv_arrive, p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
    ng.add_edge(x.recv_arrive + 1, x.receive.on_transfer, 0, graph::edge_kind::sync);
    if (const auto drain = before.find({x.to, main_stream[x.i], x.to_unit}); drain != before.end()) {
      ng.add_edge(drain->second, x.receive.on_compute, 0, graph::edge_kind::sync);
    }
  }
  order_by([&](const transfer& x) { return std::tuple(x.i, x.forward, x.from, x.chunk, pos(x.from, x.from_unit)); });
  std::string group;
  graph::processor_id group_barrier = 0;
  std::int64_t sequence = 0;
  for (const std::size_t k : by) {
    const transfer& x = transfers[k];
    const int rank = job.ranks[x.i].rank;
    const std::string name = std::string(x.forward ? "pp.fwd." : "pp.bwd.") + std::to_string(x.from) + "-" + std::to_string(x.to) +
                             ".c" + std::to_string(x.chunk) + ".r" + std::to_string(rank);
    if (name != group) {
      group = name, sequence = 0;
      graph::processor_info info;
      info.kind = graph::processor_kind::barrier;
      info.rank = -1;
      info.name = "group " + name;
      group_barrier = ng.add_processor(std::move(info));
    }
    graph::task_spec js;
    js.kind = graph::task_kind::join;
    js.processor = group_barrier;
    js.name = "send_recv";
    js.rank = -1;
    js.observed_start = js.observed_end = std::max(ng.observed_end[x.send], ng.observed_end[x.receive.launch]);
    const task_id join = ng.add_task(js);
    graph::collective_instance ci;
    ci.kind = "send_recv";
    ci.group = name;
    ci.group_ranks = {new_rank(job.ranks[x.i_from].rank, x.from), new_rank(rank, x.to)};
    ci.bytes = p2p.bytes;
    ci.sequence = sequence++;
    ci.join = join;
    ci.match = "added by the pipeline what-if (cross-stage transfer)";
    out.transfer_launches.push_back({x.send, x.send_arrive + 1, true});
    out.transfer_launches.push_back({x.receive.launch, x.recv_arrive + 1, false});
    for (const task_id a : {x.send_arrive, x.recv_arrive}) {
      ci.arrive.push_back(a);
      ci.complete.push_back(a + 1);
      ng.add_edge(a, join, 0, graph::edge_kind::collective);
      ng.add_edge(join, a + 1, 0, graph::edge_kind::collective);
    }
    ng.collectives.push_back(std::move(ci));
    ++out.p2p;
  }

  // The tied embedding's all-reduce: joined across the end stages, after each one's last pass
  // (its last kernel on the compute stream), before the work after the passes there.
  std::size_t tied_count = 0;
  for (std::size_t i = 0; i < R && tied != nullptr && pp > 1; ++i) {
    const auto a = tied_tasks.find({0, i}), b_ = tied_tasks.find({pp - 1, i});
    if (a == tied_tasks.end() || b_ == tied_tasks.end()) continue;
    graph::processor_info barrier;
    barrier.kind = graph::processor_kind::barrier;
    barrier.rank = -1;
    barrier.name = "embd." + std::to_string(job.ranks[i].rank) + " join";
    const graph::processor_id bp = ng.add_processor(std::move(barrier));
    graph::task_spec js;
    js.kind = graph::task_kind::join;
    js.processor = bp;
    js.name = "allreduce";
    js.rank = -1;
    const task_id join = ng.add_task(js);
    graph::collective_instance ci;
    ci.kind = "allreduce";
    ci.group = "embd." + std::to_string(job.ranks[i].rank);
    // Its fp32 elements, as a traced instance counts them (In msg nelems): the size `--trace-out`
    // writes, which a what-if of the written job prices at 4 bytes each by the kernel's name.
    ci.bytes = tied->bytes / 4;
    ci.join = join;
    ci.match = "added by the pipeline what-if (tied embedding)";
    time_ns last_arrival = 0;
    for (const auto& [stage, ac] : {std::pair{0, a->second}, std::pair{pp - 1, b_->second}}) {
      ci.group_ranks.push_back(new_rank(job.ranks[i].rank, stage));
      ci.arrive.push_back(ac.first);
      ci.complete.push_back(ac.second);
      ng.add_edge(ac.first, join, 0, graph::edge_kind::collective);
      ng.add_edge(join, ac.second, 0, graph::edge_kind::collective);
      if (const auto l = tied_launch.find({stage, i}); l != tied_launch.end()) {
        ng.add_edge(l->second, ac.first, p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
      }
      if (const auto e = ends.find({stage, main_stream[i], unit_of_op(orders[static_cast<std::size_t>(stage)].back())}); e != ends.end()) {
        ng.add_edge(e->second.second, ac.first, 0, graph::edge_kind::dependency);
        const time_ns at = ng.observed_end[e->second.second];
        ng.observed_start[ac.first] = ng.observed_end[ac.first] = ng.observed_start[ac.second] = ng.observed_end[ac.second] = at;
        last_arrival = std::max(last_arrival, at);
      }
      if (const auto e = ends.find({stage, main_stream[i], detail::label_post}); e != ends.end()) {
        ng.add_edge(ac.second, e->second.first, 0, graph::edge_kind::dependency);
      }
    }
    ng.observed_start[join] = ng.observed_end[join] = last_arrival;
    ng.collectives.push_back(std::move(ci));
    ++tied_count;
  }

  // Maps: the traced ranks read their home stage (stage 0; with traced stages the first of their
  // block), the added ranks their own stage; kept overheads follow every copy.
  auto home = [&](std::size_t i) { return first_stage(stage_of[i]); };
  auto added = [&](std::size_t i, int s) { return P > 1 ? source_stage(s) == stage_of[i] && s != home(i) : s > 0; };
  for (int s = 0; s < pp; ++s) {
    const auto& cp = copy[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < plans.size() && i < R; ++i) {
      if (!added(i, s)) continue;
      graph::rank_map m2 = b.ranks[i];
      m2.rank = new_rank(m2.rank, s);
      for (auto& t : m2.task_of_event) t = t == no_task ? t : cp[t];
      for (auto& t : m2.arrive_of_event) t = t == no_task ? t : cp[t];
      out.maps.push_back(std::move(m2));
    }
  }
  out.dropped.assign(R, 0);
  for (std::size_t i = 0; i < b.ranks.size(); ++i) {
    const int at = i < R ? home(i) : 0;
    if (at < 0) {  // merged away: none of its tasks is in the new graph
      out.dropped[i] = 1;
      std::fill(b.ranks[i].task_of_event.begin(), b.ranks[i].task_of_event.end(), no_task);
      std::fill(b.ranks[i].arrive_of_event.begin(), b.ranks[i].arrive_of_event.end(), no_task);
      continue;
    }
    const auto& cp = copy[static_cast<std::size_t>(at)];
    for (auto& t : b.ranks[i].task_of_event) t = t == no_task ? t : cp[t];
    for (auto& t : b.ranks[i].arrive_of_event) t = t == no_task ? t : cp[t];
  }
  std::vector<graph::kept_delay> kd;
  for (const auto& k : b.kept) {
    for (int s = 0; s < pp; ++s) {
      if (const task_id c = copy[static_cast<std::size_t>(s)][k.task]; c != no_task) kd.push_back({c, k.kind, k.amount, k.at});
    }
  }
  b.kept = std::move(kd);

  // Plans of the added ranks: the traced rank's plan on each stage's copies.
  for (int s = 0; s < pp; ++s) {
    const auto& cp = copy[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < plans.size() && i < R; ++i) {
      if (!added(i, s)) continue;
      const report::iteration_plan& from = plans[i];
      report::iteration_plan p;
      p.rank = new_rank(from.rank, s);
      p.step = from.step;
      p.annotated = from.annotated;
      p.lead_idle = from.lead_idle, p.lead_busy = from.lead_busy, p.tail_idle = from.tail_idle, p.tail_busy = from.tail_busy;
      auto map_list = [&](const std::vector<task_id>& v) {
        std::vector<task_id> o;
        for (const task_id t : v) {
          if (cp[t] != no_task) o.push_back(cp[t]);
        }
        return o;
      };
      p.cpu = map_list(from.cpu);
      if (const auto h = host_added.find({s, i}); h != host_added.end()) p.cpu.insert(p.cpu.end(), h->second.begin(), h->second.end());
      p.gpu = map_list(from.gpu);
      p.compute = map_list(from.compute);
      for (const auto& [a, c] : from.comm) {
        if (cp[a] != no_task && cp[c] != no_task) p.comm.emplace_back(cp[a], cp[c]);
      }
      for (const transfer& x : transfers) {
        if (x.i != i || (x.from != s && x.to != s)) continue;
        for (const task_id a : {x.from == s ? x.send_arrive : no_task, x.to == s ? x.recv_arrive : no_task}) {
          if (a != no_task) p.gpu.push_back(a + 1), p.comm.emplace_back(a, a + 1);
        }
      }
      // First and last CPU task: the copies, or the earliest / latest kept task of the same thread.
      auto pick = [&](task_id t, bool earliest) {
        if (t == no_task) return no_task;
        if (cp[t] != no_task) return cp[t];
        const graph::processor_id proc = processor_at[static_cast<std::size_t>(s) * np + g.processor[t]];
        task_id best = no_task;
        for (const task_id c : p.cpu) {
          if (ng.processor[c] != proc) continue;
          if (best == no_task || (earliest ? c < best : c > best)) best = c;
        }
        return best;
      };
      p.first_cpu = pick(from.first_cpu, true);
      p.last_cpu = pick(from.last_cpu, false);
      // The step before keeps its end where its last CPU task is kept.
      if (from.previous && (from.previous->last_cpu == no_task || cp[from.previous->last_cpu] != no_task)) {
        report::step_end e = *from.previous;
        if (e.last_cpu != no_task) e.last_cpu = cp[e.last_cpu];
        e.gpu = map_list(e.gpu);
        p.previous = std::move(e);
      }
      if (const auto t = tied_tasks.find({s, i}); t != tied_tasks.end() && s == pp - 1) {
        p.gpu.push_back(t->second.second);
        p.comm.emplace_back(t->second.first, t->second.second);
      }
      out.plans.push_back(std::move(p));
      out.traced_index.push_back(i);
      out.stage.push_back(s);
    }
  }
  if (zero_bubble) {
    out.weight_pass.assign(ng.task_count(), 0);
    for (const auto& cp : copy) {
      for (task_id t = 0; t < n; ++t) {
        if (cp[t] != no_task && code[t] != detail::label_pre && code[t] != detail::label_post && code[t] >= 2 * m) out.weight_pass[cp[t]] = 1;
      }
    }
  }
  b.graph = std::move(ng);

  std::string tied_note;
  if (tied != nullptr && tied_count > 0) {
    char t[256];
    std::snprintf(t, sizeof t,
                  "; %zu all-reduces of the tied embedding's gradient between the first and last stage added (%lld bytes, %.1f us "
                  "within a node, %.1f us across nodes)",
                  tied_count, static_cast<long long>(tied->bytes), static_cast<double>(tied->intra) / 1e3,
                  static_cast<double>(tied->inter) / 1e3);
    tied_note = t;
  }
  if (out.world_joined > 0) {
    tied_note += "; " + std::to_string(out.world_joined) + " collective" + (out.world_joined == 1 ? "" : "s") +
                 " of the whole world whose peers the traces lack joined across the stages";
  }
  if (zero_bubble && traced_weight) {
    tied_note += "; the traces' own W passes kept (" + std::to_string(out.weight_ops) + " GPU ops)";
  } else if (zero_bubble) {
    tied_note += "; each backward pass split into B and W: " + std::to_string(out.weight_ops) +
                 " weight-gradient kernels (GEMMs with the tokens in K, bias sums, LayerNorm and embedding weight gradients) run in the W passes";
  }
  std::string numbering = "stage s of traced rank r is rank s*" + std::to_string(W) + " + r";
  if (merging) {
    numbering = "stages " + std::to_string(k_merge) + "s.." + std::to_string(k_merge) + "s+" + std::to_string(k_merge - 1) +
                " of the traces merged into stage s, made from the traced ranks of stage " + std::to_string(k_merge) +
                "s (of stage " + std::to_string(P - 1) + " for the last: the head and the loss) with their layers repeated " +
                std::to_string(k_merge) + " times, which keep their numbers; the ranks of the other traced stages dropped; nodes "
                "placed as Megatron's rank s*" + std::to_string(W) + " + r mod " + std::to_string(W0) +
                "; the traced transfers replaced by the new order's (added)";
  } else if (P > 1) {
    numbering = "traced stage s is stages " + std::to_string(k_sub) + "s.." + std::to_string(k_sub) + "s+" + std::to_string(k_sub - 1) +
                ", each traced rank on the first of them, the others numbered from " + std::to_string(P * W0) +
                " up; nodes placed as Megatron's rank s*" + std::to_string(W) + " + r mod " + std::to_string(W0) +
                (cross_blocks ? "; each traced stage's layers fill its stages' " + std::to_string(vp) +
                                    " chunks, the traced transfers replaced by the interleaved order's (added, as within a block)"
                              : std::string("; the traced transfers between stages kept, re-timed when their stages' nodes change"));
  }
  char line[1536];
  std::snprintf(line, sizeof line,
                "PP %d -> %d, fine-grained (the traced launches and kernels): layers re-partitioned %d -> %d per stage%s, %d ranks -> "
                "%d (%s), each stage's passes in %s order (%d micro-batches), %zu added "
                "cross-stage transfers as send/recv kernels on p2p streams (%.1f us within a node, %.1f us across nodes of %d GPUs: "
                "%s; the receiving host then waits for the receive and its compute stream), %zu -> %zu tasks, %zu edges between passes the new order swaps dropped%s",
                P, pp, *st.model.layers.value / P, per_chunk * vp, vp > 1 ? (" in " + std::to_string(vp) + " chunks of " + std::to_string(per_chunk)).c_str() : "",
                static_cast<int>(R), static_cast<int>(R) * k_sub / k_merge, numbering.c_str(),
                std::string(pipeline::schedule_title(kind)).c_str(), m, out.p2p, static_cast<double>(p2p.intra) / 1e3,
                static_cast<double>(p2p.inter) / 1e3, p2p.gpus_per_node, latency_source.c_str(), out.tasks_before, out.tasks_after,
                out.edges_dropped, tied_note.c_str());
  out.change = line;
  return out;
}

}  // namespace lumos::whatif

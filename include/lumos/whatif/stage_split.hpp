#pragma once
// What the fine-grained stage split (`split_stages`, whatif/pipeline_graph.hpp) made: the added
// ranks' plans and maps, the counts of what it added and dropped (`stage_split`), its pipeline
// bubble on a replay (`split_bubble`) and the sentence that says what it did
// (`stage_split_change`); and the costs its cross-stage transfers and the tied embedding's
// all-reduce take (`p2p_latency`, `tied_embedding_reduce`).

#include <lumos/core/time.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/whatif/stage_geometry.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lumos::whatif {

/// What `split_stages` made: the plans of the ranks it added (stages 1 and up, in rank order,
/// from the traced ranks' plans) and what it did.
struct stage_split {
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();
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
  std::size_t tied_reduces = 0;  ///< all-reduces of the tied embedding's gradient added between the end stages
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

/// The time of one cross-stage transfer, within a node and across nodes.
struct p2p_latency {
  time_ns intra = 0, inter = 0;
  int gpus_per_node = 8;  ///< consecutive ranks that share `intra` (the NVLink domain)
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

/// What emission needs besides the plan: the cross-stage transfer's time and where it comes
/// from (a sentence), and, for a job without traced stages, the tied embedding's all-reduce (none:
/// not added).
struct stage_transfer_costs {
  p2p_latency p2p = {};
  std::string latency_source = {};
  const tied_embedding_reduce* tied = nullptr;
};

/// The sentence that says what a split of `traced_ranks` traced ranks with geometry `geo` did
/// (`stage_split::change`).
[[nodiscard]] inline std::string stage_split_change(const stage_geometry& geo, const stage_split& out, const stage_transfer_costs& costs,
                                                    std::size_t traced_ranks) {
  const tied_embedding_reduce* tied = costs.tied;
  const p2p_latency& p2p = costs.p2p;
  const int P = geo.traced_pp, pp = geo.pp, vp = geo.vp, W = geo.width, W0 = geo.traced_width;
  const int k_sub = geo.cut, k_merge = geo.merge, per_chunk = geo.per_chunk;
  std::string tied_note;
  if (tied != nullptr && out.tied_reduces > 0) {
    char t[256];
    std::snprintf(t, sizeof t,
                  "; %zu all-reduces of the tied embedding's gradient between the first and last stage added (%lld bytes, %.1f us "
                  "within a node, %.1f us across nodes)",
                  out.tied_reduces, static_cast<long long>(tied->bytes), static_cast<double>(tied->intra) / 1e3,
                  static_cast<double>(tied->inter) / 1e3);
    tied_note = t;
  }
  if (out.world_joined > 0) {
    tied_note += "; " + std::to_string(out.world_joined) + " collective" + (out.world_joined == 1 ? "" : "s") +
                 " of the whole world whose peers the traces lack joined across the stages";
  }
  if (geo.zero_bubble && geo.traced_weight) {
    tied_note += "; the traces' own W passes kept (" + std::to_string(out.weight_ops) + " GPU ops)";
  } else if (geo.zero_bubble) {
    tied_note += "; each backward pass split into B and W: " + std::to_string(out.weight_ops) +
                 " weight-gradient kernels (GEMMs with the tokens in K, bias sums, LayerNorm and embedding weight gradients) run in the W passes";
  }
  std::string numbering = "stage s of traced rank r is rank s*" + std::to_string(W) + " + r";
  if (geo.merging) {
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
                (geo.cross_blocks ? "; each traced stage's layers fill its stages' " + std::to_string(vp) +
                                        " chunks, the traced transfers replaced by the interleaved order's (added, as within a block)"
                                  : std::string("; the traced transfers between stages kept, re-timed when their stages' nodes change"));
  }
  const int R = static_cast<int>(traced_ranks);
  char line[1536];
  std::snprintf(line, sizeof line,
                "PP %d -> %d, fine-grained (the traced launches and kernels): layers re-partitioned %d -> %d per stage%s, %d ranks -> "
                "%d (%s), each stage's passes in %s order (%d micro-batches), %zu added "
                "cross-stage transfers as send/recv kernels on p2p streams (%.1f us within a node, %.1f us across nodes of %d GPUs: "
                "%s; the receiving host then waits for the receive and its compute stream), %zu -> %zu tasks, %zu edges between passes the new order swaps dropped%s",
                P, pp, geo.traced_layers / P, per_chunk * vp, vp > 1 ? (" in " + std::to_string(vp) + " chunks of " + std::to_string(per_chunk)).c_str() : "",
                R, R * k_sub / k_merge, numbering.c_str(), std::string(geo.schedule.title).c_str(), geo.micro_batches,
                out.p2p, static_cast<double>(p2p.intra) / 1e3, static_cast<double>(p2p.inter) / 1e3, p2p.gpus_per_node,
                costs.latency_source.c_str(), out.tasks_before, out.tasks_after, out.edges_dropped, tied_note.c_str());
  return line;
}

}  // namespace lumos::whatif

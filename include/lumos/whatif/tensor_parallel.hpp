#pragma once
// The tensor-parallel part of a model-shape what-if (`lumos whatif --tp N`): which targets are
// valid, how a TP collective's time follows its group size, and how the predicted job is formed
// from the traced ranks. The per-rank GEMM, attention and memory-bound rescaling is the same as
// for the shape flags (shape.hpp): with TP t, a rank holds FFN/t, heads/t (and the vocabulary
// shard V/t) — column-parallel GEMMs have N/t, row-parallel ones K/t.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/editor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace lumos::whatif {

/// The collective a communication op runs, from its kind as `detail::comm_kind` names it.
[[nodiscard]] inline model::collective modelled_collective(std::string_view kind) noexcept {
  if (kind == "allgather") return model::collective::all_gather;
  if (kind == "reducescatter") return model::collective::reduce_scatter;
  if (kind == "alltoall") return model::collective::all_to_all;
  if (kind == "broadcast") return model::collective::broadcast;
  return model::collective::all_reduce;
}

/// NCCL time (ns, unrounded) of `c` moving `bytes` over `n` ranks on `link`; n ≤ 1 moves
/// nothing and costs the link's base latency only (a group of one still enqueues the kernel).
[[nodiscard]] inline double collective_ns(model::collective c, double bytes, std::int64_t n,
                                          const model::nccl_link& link) {
  if (n <= 1) return std::min(link.simple_base_ns, link.ll_base_ns);
  return model::nccl_flat_ns(c, std::max(bytes, 1.0), n, link);
}

/// The bytes a collective of measured time `measured_ns` over `n` ranks moved, when its args
/// do not say: the inverse of `collective_ns` (bisection; 0 when the time is below the
/// latency), so that the op's own measurement calibrates the size it is rescaled from.
[[nodiscard]] inline double bytes_for_time(model::collective c, double measured_ns, std::int64_t n,
                                           const model::nccl_link& link) {
  if (n <= 1 || measured_ns <= collective_ns(c, 1.0, n, link)) return 0.0;
  double lo = 1.0, hi = 1.0;
  while (collective_ns(c, hi, n, link) < measured_ns && hi < 1e15) hi *= 2.0;
  for (int i = 0; i < 100 && hi - lo > 1.0; ++i) {
    const double mid = 0.5 * (lo + hi);
    (collective_ns(c, mid, n, link) < measured_ns ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

/// Checks a tensor-parallel target against the full model: heads and FFN must divide by it.
/// Throws `lumos::error`.
inline void validate_tp(int to_tp, std::int64_t heads, std::int64_t ffn) {
  if (to_tp <= 0)
    throw error("whatif --tp: the tensor-parallel size must be positive (got " + std::to_string(to_tp) + ")");
  if (heads % to_tp != 0) {
    throw error("whatif --tp " + std::to_string(to_tp) + ": the model's " + std::to_string(heads) +
                " attention heads do not divide over " + std::to_string(to_tp) + " tensor-parallel ranks");
  }
  if (ffn % to_tp != 0) {
    throw error("whatif --tp " + std::to_string(to_tp) + ": the FFN width " + std::to_string(ffn) +
                " does not divide over " + std::to_string(to_tp) + " tensor-parallel ranks");
  }
}

/// What a tensor-parallel collective inserted by a change from TP 1 does.
enum class tp_message : std::uint8_t {
  activation, ///< all-reduce of tokens x hidden in the activation dtype
  loss_max,   ///< all-reduce (max) of the tokens in fp32: the vocabulary-parallel cross-entropy's logit maximum
  loss_sum,   ///< all-reduce of the tokens in fp32: its target logit, then its sum of exponentials
  gather,     ///< sequence parallelism: all-gather of tokens x hidden (each rank holds 1/TP of the tokens)
  scatter,    ///< sequence parallelism: reduce-scatter of tokens x hidden
};
inline constexpr std::size_t tp_message_count = 5;

/// A tensor-parallel collective to insert after GPU task `after`. Without sequence parallelism
/// Megatron runs an all-reduce of the activation after the row-parallel attention output and
/// FC2 forward (also when recomputed), the column-parallel QKV and FC1 input gradients, the
/// vocabulary-parallel embedding lookup and the logits' input gradient; and three fp32 ones over
/// the tokens in the vocabulary-parallel cross-entropy, which follows the logits GEMM (max,
/// target logit, sum of exponentials). With it, each all-reduce of the activation becomes a
/// reduce-scatter, and an all-gather precedes each column-parallel GEMM forward (QKV, FC1, the
/// logits), each row-parallel input gradient (FC2, attention output), the weight gradients of
/// the column-parallel GEMMs (their input, gathered again) and the embedding's backward.
struct tp_hook {
  graph::task_id after = graph::no_task;
  tp_message message = tp_message::activation;
};

/// A tensor-parallel collective that a change from TP 1 adds: its kind (as a collective instance
/// names it), its transfer (NCCL model), the host time of its c10d/NCCL enqueue and the launch
/// call.
struct tp_collective {
  std::string kind = "allreduce";
  time_ns transfer = 0;
  time_ns host = 0;    ///< CPU time before the launch call
  time_ns launch = 0;  ///< the launch call itself
  std::string kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL";
};

/// Inserts each of `hooks` with its collective `kind[message]`: a collective right after its
/// GPU task on that stream (Megatron runs the TP collectives in the compute stream's order) and
/// its launch on the CPU thread right after that task's launch, with the same launch latency;
/// several after one task follow each other in the order given. A TP group is folded onto its
/// traced rank (TP ranks are symmetric), so each instance has that one participant, in a group of
/// its own (`tp.folded.R`, no join: no peer to wait for, the transfer is its time); written out
/// (`--trace-out`) it reads back the same way.
[[nodiscard]] inline edited_graph insert_tp_hooks(const graph::task_graph& g, const std::vector<tp_hook>& hooks,
                                                  const std::array<tp_collective, tp_message_count>& kind) {
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> launch_of(g.task_count(), none);  // launch edge into a task
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    if (g.edges[i].kind == graph::edge_kind::launch) launch_of[g.edges[i].to] = i;
  }
  auto of = [&](const tp_hook& h) -> const tp_collective& { return kind[static_cast<std::size_t>(h.message)]; };
  std::vector<insertion> ins;
  ins.reserve(3 * hooks.size());
  for (const tp_hook& h : hooks) {
    const graph::task_id k = h.after;
    const tp_collective& c = of(h);
    // Observed at the instant the task they follow ended: the reports place a task in its
    // iteration by these (an inserted collective at time 0 fell outside every step, so its
    // time counted as idle in the breakdown).
    if (launch_of[k] != none) {
      const graph::task_id from = g.edges[launch_of[k]].from;
      ins.push_back({.after = from,
                     .spec = {.kind = graph::task_kind::cpu, .duration = c.launch, .busy_gap = c.host, .rank = g.rank[k],
                              .observed_start = g.observed_end[from], .observed_end = g.observed_end[from]},
                     .name = "cudaLaunchKernel"});
    }
    const time_ns at = g.observed_end[k];
    ins.push_back({.after = k, .spec = {.kind = graph::task_kind::comm_arrive, .rank = g.rank[k], .observed_start = at, .observed_end = at},
                   .name = c.kernel});
    ins.push_back({.after = k,
                   .spec = {.kind = graph::task_kind::comm_complete, .duration = c.transfer, .rank = g.rank[k],
                            .observed_start = at, .observed_end = at},
                   .name = c.kernel});
  }
  edited_graph e = insert_after(g, ins);
  std::map<int, std::int64_t> sequence;  // per rank's folded group
  std::size_t i = 0;
  for (const tp_hook& h : hooks) {
    const graph::task_id k = h.after;
    if (launch_of[k] != none) {
      const graph::edge& l = g.edges[launch_of[k]];
      e.graph.add_edge(e.inserted[i], e.inserted[i + 1], l.delay, graph::edge_kind::launch, l.flags());
      ++i;
    }
    graph::collective_instance ci;
    ci.kind = of(h).kind;
    ci.group = "tp.folded." + std::to_string(g.rank[k]);
    // Left unknown (0): the trace writer states sizes in elements, which it can only do for
    // model-built jobs; a what-if read from the written traces takes the size from the time.
    ci.bytes = 0;
    ci.sequence = sequence[g.rank[k]]++;
    ci.arrive = {e.inserted[i]};
    ci.complete = {e.inserted[i + 1]};
    ci.match = "inserted by a TP change from 1 (the group folded onto its traced rank)";
    e.graph.collectives.push_back(std::move(ci));
    i += 2;
  }
  return e;
}

/// How the predicted job stands for a TP change: tensor-parallel ranks are symmetric (each
/// runs the same kernels on its shard), so the traced ranks are kept and each stands for its
/// position in the new TP group — rank r of a new group would replay as traced rank
/// r mod old TP — instead of copying ranks; the job's rank count changes by new/old TP.
[[nodiscard]] inline std::string tp_fold_note(int from_tp, int to_tp, std::size_t ranks_traced,
                                              std::int64_t world_from) {
  const std::int64_t world_to = world_from * to_tp / from_tp;
  std::string s = "TP " + std::to_string(from_tp) + " -> " + std::to_string(to_tp) + ": the job has " +
                  std::to_string(world_to) + " ranks instead of " + std::to_string(world_from) +
                  "; tensor-parallel ranks are symmetric, so the " + std::to_string(ranks_traced) +
                  " traced rank(s) are kept (folded): ";
  if (to_tp > from_tp) {
    s += "rank r of a new TP group replays as traced rank r mod " + std::to_string(from_tp);
  } else {
    s += "the first " + std::to_string(to_tp) +
         " ranks of each traced TP group form a new group; the others replay the same";
  }
  s += from_tp == 1 ? "; the TP collectives are inserted (below)"
                    : "; each TP collective keeps its bytes per rank and runs over " + std::to_string(to_tp) + " ranks";
  return s;
}

} // namespace lumos::whatif

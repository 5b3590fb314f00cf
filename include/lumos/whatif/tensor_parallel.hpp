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
#include <lumos/whatif/detail/tp_hook.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/editor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// A collective of kind `kind` (as a collective instance names it) and `transfer` ns, written as
/// `kernel`, launched with the profile's host time per collective.
[[nodiscard]] inline tp_collective launched_collective(std::string kind, time_ns transfer, std::string kernel,
                                                       const model::cost_profile& profile) {
  tp_collective c;
  c.kind = std::move(kind);
  c.transfer = transfer;
  c.launch = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  c.host = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - c.launch);
  c.kernel = std::move(kernel);
  return c;
}

/// Inserts each of `hooks` with its collective `kind[message]`: a collective right after its
/// GPU task on that stream (Megatron runs the TP collectives in the compute stream's order) and
/// its launch on the CPU thread right after that task's launch, with the same launch latency;
/// several after one task follow each other in the order given. A TP group is folded onto its
/// traced rank (TP ranks are symmetric), so each instance has that one participant, in a group of
/// its own (`tp.folded.R`, no join: no peer to wait for, the transfer is its time); written out
/// (`--trace-out`) it reads back the same way. `group` and `match` name the folded group and say
/// what inserted it (another group folded the same way, context parallelism's all-gathers).
[[nodiscard]] inline edited_graph insert_tp_hooks(const graph::task_graph& g, const std::vector<tp_hook>& hooks,
                                                  const std::array<tp_collective, tp_message_count>& kind,
                                                  std::string_view group = "tp.folded.",
                                                  std::string_view match = "inserted by a TP change from 1 (the group folded onto its traced rank)") {
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
    // Its size left unknown (0): the trace writer states sizes in elements, which it can only do
    // for model-built jobs; a what-if read from the written traces takes the size from the time.
    add_folded_collective(e.graph, of(h).kind, std::string(group) + std::to_string(g.rank[k]), {}, 0, sequence[g.rank[k]]++,
                          e.inserted[i], e.inserted[i + 1], match);
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

/// The traced TP groups' members, `from` of them, as `to` (the members beyond the traced ranks
/// numbered past the largest, as `resize_data_parallel` numbers a DP group's): what `--trace-out`
/// writes as the collectives' group, so that the written (folded) job reads back as the target.
inline void resize_tp_groups(graph::task_graph& g, const job_structure& st, int from, int to) {
  const std::set<std::string> tp_groups = groups_with_role(st, group_role::tp);
  for (auto& ci : g.collectives) {
    if (!tp_groups.count(ci.group) || static_cast<int>(ci.group_ranks.size()) != from) continue;
    int next = *std::max_element(ci.group_ranks.begin(), ci.group_ranks.end()) + 1;
    while (static_cast<int>(ci.group_ranks.size()) < to) ci.group_ranks.push_back(next++);
    ci.group_ranks.resize(static_cast<std::size_t>(to));
  }
}

/// From TP 1 to `to.tp`: Megatron's tensor-parallel collectives (`tp_hook`: tokens x hidden of
/// the target shape, or the cross-entropy's tokens in fp32, over the TP group by the NCCL model,
/// with the profile's host time per collective) inserted at `hooks` (found by the shape rewrite).
/// Returns what was inserted.
inline change insert_tp_collectives(graph::built_job& b, const std::vector<tp_hook>& hooks, const shape_config& to,
                                    const shape_costs& costs) {
  const double tokens = static_cast<double>(to.tokens());
  const double bytes = tokens * static_cast<double>(to.hidden) * costs.element_bytes;
  const auto& link = to.tp > costs.hw.nvlink_domain_size() ? costs.profile.inter : costs.profile.intra;
  const std::string dtype = costs.dtype == model::precision::fp16 ? "f16" : "bf16";
  auto made = [&](model::collective coll, double size, std::string kind, std::string kernel) {
    return launched_collective(std::move(kind), static_cast<time_ns>(std::llround(collective_ns(coll, size, to.tp, link))),
                               std::move(kernel), costs.profile);
  };
  using model::collective;
  const std::array<tp_collective, tp_message_count> kind = {
      made(collective::all_reduce, bytes, "allreduce", "ncclDevKernel_AllReduce_Sum_" + dtype + "_RING_LL"),
      made(collective::all_reduce, tokens * 4, "allreduce", "ncclDevKernel_AllReduce_Max_f32_RING_LL"),
      made(collective::all_reduce, tokens * 4, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
      made(collective::all_gather, bytes, "allgather", "ncclDevKernel_AllGather_RING_LL"),
      made(collective::reduce_scatter, bytes, "reducescatter", "ncclDevKernel_ReduceScatter_Sum_" + dtype + "_RING_LL")};
  std::array<std::size_t, tp_message_count> count{};
  for (const tp_hook& h : hooks) ++count[static_cast<std::size_t>(h.message)];
  (void)adopt(b, insert_tp_hooks(b.graph, hooks, kind));
  auto us = [&](tp_message m) { return static_cast<double>(kind[static_cast<std::size_t>(m)].transfer) / 1e3; };
  const std::size_t loss = count[1] + count[2];
  char line[768];
  if (to.sp) {
    std::snprintf(line, sizeof line,
                  "TP 1 -> %d with sequence parallelism: %zu tensor-parallel collectives inserted: %zu reduce-scatters of the "
                  "activation (after the attention output and FC2 GEMMs of every forward and recomputed forward, the QKV and FC1 "
                  "input gradients, the embedding lookup, the logits' input gradient), %.3f us; %zu all-gathers (before the QKV, "
                  "FC1 and logits GEMMs, the FC2 and attention-output input gradients, the QKV, FC1 and logits weight gradients, "
                  "the embedding's backward), %.3f us; %.0f bytes each over %d ranks by the NCCL model; %zu all-reduces of the "
                  "cross-entropy (3 after each logits GEMM), %.0f bytes each, %.3f us; %.1f us of host time each",
                  to.tp, count[4] + count[3] + loss, count[4], us(tp_message::scatter), count[3], us(tp_message::gather), bytes,
                  to.tp, loss, tokens * 4, us(tp_message::loss_max), static_cast<double>(kind[0].host + kind[0].launch) / 1e3);
  } else {
    std::snprintf(line, sizeof line,
                  "TP 1 -> %d: %zu tensor-parallel all-reduces inserted: %zu of the activation (after the attention output "
                  "and FC2 GEMMs of every forward and recomputed forward, the QKV and FC1 input gradients, the embedding "
                  "lookup, the logits' input gradient), %.0f bytes each, %.3f us by the NCCL model over %d ranks; %zu of "
                  "the cross-entropy (3 after each logits GEMM), %.0f bytes each, %.3f us; %.1f us of host time each",
                  to.tp, count[0] + loss, count[0], bytes, us(tp_message::activation), to.tp, loss, tokens * 4,
                  us(tp_message::loss_max), static_cast<double>(kind[0].host + kind[0].launch) / 1e3);
  }
  return changed("tensor parallel", "TP collectives", "0", std::to_string(hooks.size()), line,
                 {count_figure("collectives inserted", hooks.size()), time_figure("activation collective transfer", 0, kind[0].transfer)});
}

/// Pass: a tensor-parallel change. The traced ranks stand for the target's TP group (folded),
/// their TP collectives run over the new group; from TP 1, Megatron's TP collectives are
/// inserted where the shape pass found them, and the structure is discovered again (the later
/// passes copy them with their layers).
struct tensor_parallel_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept {
    return ctx.shape_from && ctx.shape_to && (ctx.shape_from->tp != ctx.shape_to->tp || !ctx.tp_hooks.empty());
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const shape_config& from = *ctx.shape_from;
    const shape_config& to = *ctx.shape_to;
    change_list out;
    if (to.tp != from.tp) {
      const job_structure& st = ctx.structure(b);
      const auto world = st.parallel.world.value.value_or(static_cast<int>(ctx.job.ranks.size()));
      out.push_back(changed("tensor parallel", "TP", std::to_string(from.tp), std::to_string(to.tp),
                            tp_fold_note(from.tp, to.tp, ctx.job.ranks.size(), world)));
      resize_tp_groups(b.graph, st, from.tp, to.tp);
    }
    if (!ctx.tp_hooks.empty()) {
      out.push_back(insert_tp_collectives(b, ctx.tp_hooks, to, ctx.costs(b)));
      ctx.refresh(b);
    }
    return out;
  }
};
static_assert(Rewrite<tensor_parallel_pass>);

} // namespace lumos::whatif

#pragma once
// The collectives a MoE what-if (whatif/moe.hpp) re-times or removes: the EP all-to-alls and the
// expert-data-parallel gradient collectives, their groups in the target (Megatron's rank order),
// and what the rewrite did.

#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/detail/shape_groups.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/tensor_parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// What the MoE rewrite of a graph did.
struct moe_stats {
  std::size_t expert_gemms = 0, routers = 0, routes = 0, permutes = 0, activations = 0;
  std::size_t all_to_alls = 0, removed = 0;  ///< all-to-alls re-timed, removed
  std::size_t inserted = 0, joined = 0;      ///< all-to-alls inserted from EP 1; of them joined over their EP group
  std::size_t expert_gradients = 0, gradients_removed = 0;  ///< expert-DP gradient collectives re-timed, removed
  time_ns gradient_before = 0, gradient_after = 0;
  std::size_t optimizer = 0;       ///< optimizer kernels rescaled by the parameters per rank
  std::size_t launch_runs = 0, launches_removed = 0, launches_added = 0;  ///< per-expert launches (detail/moe_launches.hpp)
  std::size_t folded = 0;  ///< grouped operators whose per-expert launches are folded into their host time
  time_ns host_before = 0, host_after = 0;
  time_ns expert_before = 0, expert_after = 0, a2a_before = 0, a2a_after = 0;
  double copies_from = 0, copies_to = 0;  ///< copies per rank, the slowest traced rank's
};

namespace detail {

/// The data-parallel index of global rank `rank` (Megatron's order: TP innermost, then DP x CP).
[[nodiscard]] inline int dp_index_of(int rank, int tp, int dpcp) noexcept { return (rank / std::max(1, tp)) % std::max(1, dpcp); }

/// The members of the expert-parallel group of `ep` ranks that global rank `rank` is in.
[[nodiscard]] inline std::vector<int> ep_members(int rank, int tp, int dpcp, int ep) {
  const int position = dp_index_of(rank, tp, dpcp) % std::max(1, ep);
  const int first = rank - position * std::max(1, tp);
  std::vector<int> out;
  for (int i = 0; i < ep; ++i) out.push_back(first + i * std::max(1, tp));
  return out;
}

/// One collective of the traces a MoE what-if re-times or removes: a matched instance (its
/// completes carry the transfer) or a lone op whose peers are absent from the job (a folded or
/// partial job: one gpu_comm task).
struct moe_comm {
  std::vector<graph::task_id> transfer, arrive;
  graph::task_id join = graph::no_task;
  model::collective kind = model::collective::all_to_all;
  double bytes = 0;       ///< its message in bytes (0: unknown)
  int rank = 0;           ///< a member's global rank
  int members = 0;        ///< its group's size
  std::size_t instance = ~std::size_t{0};  ///< index into the graph's collectives, or none (lone)
  bool expert = false;    ///< an expert-DP gradient collective
  std::string group;      ///< its process group's name
};

/// The all-to-alls (every one: the EP dispatch and combine) and the gradient collectives of the
/// DP groups (`expert` set for the expert-DP ones) of `b`, matched or lone. O(tasks + events).
[[nodiscard]] inline std::vector<moe_comm> moe_comms(const trace::job& job, const graph::built_job& b, const job_structure& st) {
  const graph::task_graph& g = b.graph;
  const std::set<std::string> experts = expert_dp_groups(st), dp = groups_with_role(st, group_role::dp);
  auto wanted = [&](model::collective k, const std::string& group) {
    const bool gradient = k == model::collective::reduce_scatter || k == model::collective::all_reduce || k == model::collective::all_gather;
    return k == model::collective::all_to_all || (gradient && dp.count(group));
  };
  std::vector<moe_comm> out;
  for (std::size_t i = 0; i < g.collectives.size(); ++i) {
    const graph::collective_instance& ci = g.collectives[i];
    const auto kind = collective_of_kind(ci.kind);
    if (!kind || ci.complete.empty() || !wanted(*kind, ci.group)) continue;
    // The graph's message sizes are elements (`In msg nelems`); the NCCL model takes bytes.
    const double bytes = static_cast<double>(ci.bytes * element_bytes_of(ci, g));
    out.push_back({.transfer = ci.complete, .arrive = ci.arrive, .join = ci.join, .kind = *kind, .bytes = bytes,
                   .rank = !ci.group_ranks.empty() ? *std::min_element(ci.group_ranks.begin(), ci.group_ranks.end()) : g.rank[ci.complete.front()],
                   .members = static_cast<int>(ci.group_ranks.size()), .instance = i, .expert = experts.count(ci.group) > 0, .group = ci.group});
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    const auto kind = collective_of_kind(c.kind == "sendrecv" ? std::string("alltoall") : c.kind);
    if (!kind || (c.kind == "sendrecv" && c.group_size <= 2) || !wanted(*kind, c.group)) continue;  // a send/recv pair: pipeline
    const double bytes = static_cast<double>(c.elements * c.element_bytes);
    moe_comm m{.transfer = {c.task}, .arrive = {}, .join = graph::no_task, .kind = *kind, .bytes = bytes, .rank = g.rank[c.task],
               .members = static_cast<int>(c.group_size), .expert = experts.count(c.group) > 0, .group = c.group};
    if (c.arrive != graph::no_task) m.arrive = {c.arrive};
    out.push_back(std::move(m));
  }
  return out;
}

/// The members of the target's group of `c` (the EP group of an all-to-all, the expert-DP group
/// of an expert gradient collective) and of its traced one; `dpcp_from`, `dpcp_to`: DP x CP.
[[nodiscard]] inline std::pair<std::vector<int>, std::vector<int>> moe_members(const moe_comm& c, const moe_config& from, const moe_config& to,
                                                                               int tp, int dpcp_from, int dpcp_to) {
  const int tps = std::max(1, tp);
  if (c.kind == model::collective::all_to_all) return {ep_members(c.rank, tps, dpcp_from, from.ep), ep_members(c.rank, tps, dpcp_from, to.ep)};
  // Megatron's expert-data-parallel group: the ranks at the same TP index and EP position.
  // A later pipeline stage starts TP x DP x CP ranks on in each numbering: the target's members
  // are numbered as the target's ranks (a larger stage moves them to another node).
  const int d = dp_index_of(c.rank, tps, dpcp_from), stage = c.rank / (tps * std::max(1, dpcp_from));
  const int base = stage * tps * std::max(1, dpcp_from), base_to = stage * tps * std::max(1, dpcp_to);
  std::vector<int> old_members, members;
  for (int j = 0; j < std::max(1, dpcp_from / from.ep); ++j) old_members.push_back(base + ((j * from.ep + d % from.ep) * tps + c.rank % tps));
  for (int j = 0; j < dpcp_to / to.ep; ++j) members.push_back(base_to + ((j * to.ep + d % to.ep) * tps + c.rank % tps));
  return {old_members, members};
}

/// Re-times `c` for the target (see the header comment): an all-to-all's message x the top-k
/// ratio over the target's EP group, an expert gradient collective's x the expert parameters
/// per rank (`params`) over its expert-DP group, by `nccl` on `hw`, as a ratio on its measured
/// time; a matched instance's group members renumbered as the target's.
inline void retime_moe_comm(graph::task_graph& g, const moe_comm& c, const moe_config& from, const moe_config& to, int tp, int dpcp_from,
                            int dpcp_to, double params, const model::nccl_model& nccl, const model::hardware& hw, moe_stats& st) {
  const bool a2a = c.kind == model::collective::all_to_all;
  const double factor = a2a ? static_cast<double>(to.top_k) / static_cast<double>(from.top_k) : params;
  const auto [old_members, members] = moe_members(c, from, to, tp, dpcp_from, dpcp_to);
  time_ns measured = 0;
  for (const graph::task_id t : c.transfer) measured = std::max(measured, g.duration[t]);
  double bytes = c.bytes;
  if (bytes <= 0) {
    // Unrecorded: the size the model gives the measured time over the traced group.
    const auto& link = static_cast<int>(old_members.size()) * tp > hw.nvlink_domain_size() ? nccl.profile.inter : nccl.profile.intra;
    bytes = bytes_for_time(c.kind, static_cast<double>(measured), static_cast<std::int64_t>(old_members.size()), link);
  }
  const auto size = [](double v) { return std::max<std::int64_t>(1, std::llround(v)); };
  const time_ns t1 = nccl.collective_time({c.kind, size(bytes), model::placement_of(old_members, hw)}, hw);
  const time_ns t2 = nccl.collective_time({c.kind, size(bytes * factor), model::placement_of(members, hw)}, hw);
  const double ratio = t1 > 0 ? static_cast<double>(t2) / static_cast<double>(t1) : 1.0;
  for (const graph::task_id t : c.transfer) {
    (a2a ? st.a2a_before : st.gradient_before) += g.duration[t];
    g.duration[t] = static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * ratio));
    (a2a ? st.a2a_after : st.gradient_after) += g.duration[t];
  }
  if (c.instance < g.collectives.size()) {
    graph::collective_instance& ci = g.collectives[c.instance];
    if (ci.bytes > 0) ci.bytes = size(static_cast<double>(ci.bytes) * factor);
    if (!ci.group_ranks.empty()) ci.group_ranks = members;
  }
  ++(a2a ? st.all_to_alls : st.expert_gradients);
}

/// Removes the collectives `which` of `b` with their joins and launch calls, and applies the
/// disjoint editor groups `groups` in the same edit; `transfer` sums the transfer time removed.
/// Renumbers the graph's tasks.
inline std::vector<std::vector<graph::task_id>> remove_moe_comms(graph::built_job& b, const std::vector<moe_comm>& which,
                                                                 time_ns& transfer, std::vector<repeat_group> groups = {}) {
  graph::task_graph& g = b.graph;
  std::vector<graph::task_id> launcher(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launcher[e.to] = e.from;
  }
  std::vector<std::uint8_t> gone(g.task_count(), 0);
  for (const moe_comm& c : which) {
    for (const auto* list : {&c.arrive, &c.transfer}) {
      for (const graph::task_id t : *list) {
        gone[t] = 1;
        if (list == &c.transfer) transfer += g.duration[t];
        if (launcher[t] != graph::no_task && g.kind[launcher[t]] == graph::task_kind::cpu) gone[launcher[t]] = 1;
      }
    }
    if (c.join != graph::no_task) gone[c.join] = 1;
  }
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (gone[t]) groups.push_back({.tasks = {t}, .count = 0});
  }
  return adopt(b, repeat_groups(g, groups));
}

}  // namespace detail

}  // namespace lumos::whatif

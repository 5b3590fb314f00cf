#pragma once
// Expert parallelism from EP 1 (`lumos whatif --ep N` on traces with no all-to-all): the token
// dispatch and combine of Megatron's alltoall dispatcher inserted into each MoE layer pass of
// every rank, where the dispatcher runs them: the dispatch after the permutation, right before
// the rank's first expert GEMM, the combine right after its last expert GEMM, before the
// unpermutation (backward: the combine's gradient before the experts' backward, the dispatch's
// after it). Each is an all-to-all on the compute stream (nothing of the layer runs while its
// tokens travel), launched from the host right before (after) the experts' launches with the
// profile's collective host time, its transfer the NCCL model's all-to-all of the rank's tokens
// x top-k x hidden over the target's EP group (a group that spans nodes costs the cross-node
// link). The instances join over the EP group (Megatron's: EP consecutive data-parallel ranks at
// one TP index) where every member's traces are in the job, on a new process group named
// `ep.inserted.FIRST` (its first member); a member absent from the job (a folded job) leaves each
// rank's instance to itself, its time the model's. The dropless dispatcher's token-count
// all-gather is not inserted: a process group of its own in the written traces would read back
// as another parallelism (an all-gather inside the forward passes), and it is small.

#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/whatif/editor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// The group name (and first member after it) of the all-to-alls an EP change from 1 inserts.
inline constexpr std::string_view inserted_ep_group = "ep.inserted.";

namespace detail {

/// The expert GEMMs of one MoE layer pass of one rank (a layer, a micro-batch, a phase): the
/// dispatch goes before the first, the combine after the last.
struct dispatch_site {
  graph::task_id first = graph::no_task, last = graph::no_task;  ///< GPU tasks, stream order
  int rank = 0;                                                   ///< global rank
  double bytes = 0;                                               ///< the rank's tokens x top-k x hidden, in bytes
};

/// Where the two all-to-alls of `s` go in the graph `g` they were found in, held as tasks that
/// an edit keeps: the first expert GEMM and its launch call (the dispatch goes before both), and
/// the first task after the last expert GEMM on its stream and after its launch call on the host
/// (the combine goes before both). `none` where a processor has nothing there.
struct dispatch_anchor {
  graph::task_id gpu_before = graph::no_task, cpu_before = graph::no_task;  ///< dispatch
  graph::task_id gpu_after = graph::no_task, cpu_after = graph::no_task;    ///< combine: the task it precedes
  time_ns delay = 0;                                                        ///< the experts' launch edge's
  graph::edge_flags flags = graph::edge_flags::none;
  int rank = 0;
  double bytes = 0;
};

/// The anchors of `sites` in `g` (see `dispatch_anchor`). O(tasks + edges).
[[nodiscard]] inline std::vector<dispatch_anchor> dispatch_anchors(const graph::task_graph& g, const std::vector<dispatch_site>& sites) {
  std::vector<std::uint32_t> launch_of(g.task_count(), ~std::uint32_t{0});
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    if (g.edges[i].kind == graph::edge_kind::launch && g.kind[g.edges[i].from] == graph::task_kind::cpu) launch_of[g.edges[i].to] = i;
  }
  std::vector<graph::task_id> next(g.task_count(), graph::no_task), last(g.processors.size(), graph::no_task);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (last[g.processor[t]] != graph::no_task) next[last[g.processor[t]]] = t;
    last[g.processor[t]] = t;
  }
  std::vector<dispatch_anchor> out;
  for (const dispatch_site& s : sites) {
    const std::uint32_t l1 = launch_of[s.first], l2 = launch_of[s.last];
    if (l1 == ~std::uint32_t{0} || l2 == ~std::uint32_t{0}) continue;
    const graph::edge& e = g.edges[l1];
    out.push_back({.gpu_before = s.first, .cpu_before = e.from, .gpu_after = next[s.last], .cpu_after = next[g.edges[l2].from],
                   .delay = e.delay, .flags = e.flags(), .rank = s.rank, .bytes = s.bytes});
  }
  return out;
}

/// What `insert_dispatch` made.
struct dispatch_insertion {
  std::size_t all_to_alls = 0, joined = 0;  ///< inserted; of them joined over their EP group
  time_ns transfer = 0;                     ///< the all-to-alls' transfer time, summed
};

/// Inserts the dispatch and combine of each anchor of `anchors` into `b` (see the header
/// comment): the tasks it names are mapped through `copies` (where an edit since `anchors` were
/// taken put them; empty: none), the transfers timed by `nccl` on `hw` over the EP group of `ep`
/// ranks that `members` gives each global rank, the launches with `profile`'s host times; their
/// instances record elements of `element_bytes` each, as traced ones do. Task ids change
/// (`adopt`). O(tasks + edges).
template <class Members>
[[nodiscard]] dispatch_insertion insert_dispatch(graph::built_job& b, const std::vector<dispatch_anchor>& anchors,
                                                 const std::vector<std::vector<graph::task_id>>& copies, Members&& members,
                                                 const model::nccl_model& nccl, const model::hardware& hw,
                                                 const model::cost_profile& profile, double element_bytes) {
  graph::task_graph& g = b.graph;
  const auto kept = [&](graph::task_id t) {
    if (t == graph::no_task || copies.empty()) return t;
    return t < copies.size() && !copies[t].empty() ? copies[t].front() : graph::no_task;
  };
  std::vector<graph::task_id> prev(g.task_count(), graph::no_task), last(g.processors.size(), graph::no_task);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    prev[t] = last[g.processor[t]];
    last[g.processor[t]] = t;
  }
  const time_ns launch = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch);
  struct placed {
    const dispatch_anchor* a;
    time_ns transfer;
    std::size_t at;  ///< its first insertion
  };
  std::vector<insertion> ins;
  std::vector<placed> done;
  // A launch call before `cpu`, then an arrive and a complete of `transfer` before `gpu`.
  const auto launched = [&](graph::task_id cpu, graph::task_id gpu, time_ns transfer, const char* kernel) {
    ins.push_back({.after = prev[cpu],
                   .spec = {.kind = graph::task_kind::cpu, .duration = launch, .busy_gap = host, .rank = g.rank[cpu],
                            .observed_start = g.observed_start[cpu], .observed_end = g.observed_start[cpu]},
                   .name = "cudaLaunchKernel"});
    for (const graph::task_kind k : {graph::task_kind::comm_arrive, graph::task_kind::comm_complete}) {
      ins.push_back({.after = prev[gpu],
                     .spec = {.kind = k, .duration = k == graph::task_kind::comm_complete ? transfer : 0, .rank = g.rank[gpu],
                              .observed_start = g.observed_start[gpu], .observed_end = g.observed_start[gpu]},
                     .name = kernel});
    }
  };
  for (const dispatch_anchor& a : anchors) {
    const graph::task_id gb = kept(a.gpu_before), cb = kept(a.cpu_before), ga = kept(a.gpu_after), ca = kept(a.cpu_after);
    if (gb == graph::no_task || cb == graph::no_task || ga == graph::no_task || ca == graph::no_task) continue;
    if (prev[gb] == graph::no_task || prev[cb] == graph::no_task || prev[ga] == graph::no_task || prev[ca] == graph::no_task) continue;
    const std::vector<int> group = members(a.rank);
    const auto bytes = std::max<std::int64_t>(1, std::llround(a.bytes));
    const time_ns transfer = nccl.collective_time({model::collective::all_to_all, bytes, model::placement_of(group, hw)}, hw);
    const std::size_t at = ins.size();
    // Dispatch before the experts, combine after them.
    launched(cb, gb, transfer, "ncclDevKernel_AllToAll");
    launched(ca, ga, transfer, "ncclDevKernel_AllToAll");
    done.push_back({&a, transfer, at});
  }
  edited_graph e = insert_after(g, ins);
  dispatch_insertion out;
  // Per EP group (its first member), the inserted all-to-alls of each member in order.
  struct member_calls {
    std::vector<int> members;
    std::map<int, std::vector<std::pair<graph::task_id, graph::task_id>>> of;  // rank -> (arrive, complete)
    std::int64_t bytes = 0;
  };
  std::map<int, member_calls> groups;
  for (std::size_t i = 0; i < done.size(); ++i) {
    const dispatch_anchor& a = *done[i].a;
    for (std::size_t j = 0; j < 2; ++j) {
      const std::size_t x = done[i].at + 3 * j;
      const graph::task_id call = e.inserted[x], arrive = e.inserted[x + 1], complete = e.inserted[x + 2];
      e.graph.add_edge(call, arrive, a.delay, graph::edge_kind::launch, a.flags);
      e.graph.add_edge(arrive, complete, 0, graph::edge_kind::dependency);
      const std::vector<int> group = members(a.rank);
      member_calls& mc = groups[group.front()];
      mc.members = group;
      // As a traced collective records it: elements and their size (what `In msg nelems` says).
      mc.bytes = std::max<std::int64_t>(1, std::llround(a.bytes / std::max(1.0, element_bytes)));
      mc.of[a.rank].emplace_back(arrive, complete);
      out.transfer += done[i].transfer;
      ++out.all_to_alls;
    }
  }
  for (auto& [first, mc] : groups) {
    const std::string name = std::string(inserted_ep_group) + std::to_string(first);
    // Joined when every member is in the job with as many all-to-alls; else each rank alone.
    bool whole = mc.of.size() == mc.members.size();
    for (const auto& [rank, calls] : mc.of) whole = whole && calls.size() == mc.of.begin()->second.size();
    const std::size_t n = mc.of.begin()->second.size();
    if (whole) {
      for (std::size_t k = 0; k < n; ++k) {
        graph::collective_instance ci{.kind = "alltoall", .group = name, .group_ranks = mc.members, .bytes = mc.bytes,
                                      .element_bytes = std::llround(std::max(1.0, element_bytes)), .sequence = static_cast<std::int64_t>(k),
                                      .arrive = {}, .complete = {}, .join = graph::no_task,
                                      .match = "inserted by an EP change from 1, joined over its EP group"};
        const graph::processor_id barrier = e.graph.add_processor(
            {graph::processor_kind::barrier, -1, 0, static_cast<std::int64_t>(e.graph.collectives.size()),
             "alltoall #" + std::to_string(k) + " of group " + name});
        ci.join = e.graph.add_task({.kind = graph::task_kind::join, .processor = barrier, .name = "alltoall", .rank = -1});
        for (const auto& [rank, calls] : mc.of) {
          ci.arrive.push_back(calls[k].first);
          ci.complete.push_back(calls[k].second);
          e.graph.add_edge(calls[k].first, ci.join, 0, graph::edge_kind::collective);
          e.graph.add_edge(ci.join, calls[k].second, 0, graph::edge_kind::collective);
        }
        e.graph.collectives.push_back(std::move(ci));
        out.joined += mc.of.size();
      }
      continue;
    }
    for (const auto& [rank, calls] : mc.of) {
      for (std::size_t k = 0; k < calls.size(); ++k) {
        e.graph.collectives.push_back({.kind = "alltoall", .group = name + "." + std::to_string(rank), .group_ranks = mc.members, .bytes = mc.bytes,
                                       .element_bytes = std::llround(std::max(1.0, element_bytes)), .sequence = static_cast<std::int64_t>(k),
                                       .arrive = {calls[k].first}, .complete = {calls[k].second},
                                       .join = graph::no_task,
                                       .match = "inserted by an EP change from 1 (the EP group folded onto its traced rank)"});
      }
    }
  }
  (void)adopt(b, std::move(e));
  return out;
}

}  // namespace detail
}  // namespace lumos::whatif

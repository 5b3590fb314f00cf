#pragma once
// Expert gradients from an expert-data-parallel group of one rank (`lumos whatif --ep N` on traces
// with EP = DP x CP, which hold one replica of each expert shard and reduce no expert gradient):
// the target's routed-expert gradients are reduced over its expert-data-parallel group as `lumos
// synth` builds it (Megatron's distributed optimizer): buckets of the routed experts' parameters
// over the same segments as the dense buckets (the layers, last first; none in the head and the
// embedding), each reduce-scatter of fp32 gradients after the op that ends the segment closing
// it, and after the optimizer's last kernel the updated bf16 parameters all-gathered. They run on
// the rank's data-parallel stream after the dense buckets of the same segment (the traced
// stream's collectives launched before the next op of the compute stream precede each), the
// all-gathers after the dense ones; a rank without a traced data-parallel stream (or with none of
// its collectives before the first expert bucket) gets a stream of its own. The optimizer's first
// op waits for the last reduce-scatter and the host's wait that ends the step for the last
// all-gather. Transfers are the NCCL model's over the expert-data-parallel group at its Megatron
// ranks; each group is folded onto its traced rank, as gradient_buckets.hpp folds DP groups.
// Traces that all-reduce their dense gradients (DDP, no distributed optimizer) get each expert
// bucket all-reduced instead, as `lumos synth` builds such a job, and no all-gather.

#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gradient_buckets.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

/// The group name (then the traced rank) of the expert gradient collectives an EP change inserts.
inline constexpr std::string_view inserted_expert_group = "expert_dp.inserted.";

/// What `insert_expert_gradients` did.
struct expert_gradient_insertion {
  std::size_t buckets = 0, ranks = 0;  ///< buckets (a reduce-scatter and an all-gather each), ranks that got them
  std::size_t own_streams = 0;         ///< ranks whose collectives went onto a stream of their own
  std::int64_t params_first = 0;       ///< expert parameters reduced by the first rank that got buckets
  time_ns scatter_first = 0, gather_first = 0;  ///< their reduce-scatters' and all-gathers' transfers
  int group = 0;                       ///< the expert-data-parallel group's size
  /// Each reduce-scatter as the tasks a layer change copies with the layer closing its bucket
  /// (`bucket_insertion::in_layers`, for `attach_to_layers`).
  std::vector<std::array<graph::task_id, 4>> in_layers;
  /// Where each task of the graph before the insertion went (`adopt`), for the tasks an earlier
  /// insertion put in the layers.
  std::vector<std::vector<graph::task_id>> moved;
};

namespace detail {

/// Per global rank, the processor its data-parallel collectives (groups `dp`) run on: matched
/// ones (also the buckets a pass inserted, `inserted_gradient_group`), or `lone` ones whose peers
/// are absent (a folded job).
[[nodiscard]] inline std::map<int, graph::processor_id> traced_dp_streams(const graph::task_graph& g, const std::vector<lone_collective>& lone,
                                                                          const std::set<std::string>& dp) {
  std::map<int, graph::processor_id> out;
  for (const graph::collective_instance& ci : g.collectives) {
    if (!dp.count(ci.group) && !ci.group.starts_with(inserted_gradient_group)) continue;
    for (const graph::task_id t : ci.complete) out.emplace(g.rank[t], g.processor[t]);
  }
  for (const lone_collective& c : lone) {
    if (dp.count(c.group)) out.emplace(g.rank[c.task], g.processor[c.task]);
  }
  return out;
}

/// Where the expert collectives of plan `p` go on the traced stream `stream` of `g`: per bucket,
/// the stream's task it follows (the last whose collective was launched before the op after the
/// bucket's, on the compute stream), and the stream's last task for the all-gathers. Empty when a
/// bucket has none before it.
[[nodiscard]] inline std::vector<graph::task_id> expert_bucket_places(const graph::task_graph& g, const launch_edges& launches,
                                                                      const rank_buckets& p, graph::processor_id stream) {
  std::vector<graph::task_id> on, next(g.task_count(), graph::no_task), last(g.processors.size(), graph::no_task);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.processor[t] == stream) on.push_back(t);
    if (last[g.processor[t]] != graph::no_task) next[last[g.processor[t]]] = t;
    last[g.processor[t]] = t;
  }
  if (on.empty()) return {};
  // The GPU op a stream task waits for (an inserted bucket's closing op, `insert_gradient_buckets`).
  std::vector<graph::task_id> hook(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::cross_stream && g.processor[e.to] == stream && g.kind[e.from] == graph::task_kind::gpu_compute) {
      hook[e.to] = e.from;
    }
  }
  // When each stream task's collective was launched: its launch call's start, or, when it waits
  // for a GPU op, that op's launch if later. A bucket a pass inserted is launched just before its
  // closing op (inside the segment), yet it is ready only after that op: an expert bucket closed
  // by the op before goes ahead of it, as Megatron's hooks run them (the first layer's experts
  // before the embedding's bucket).
  std::vector<time_ns> launched(on.size());
  for (std::size_t i = 0; i < on.size(); ++i) {
    const graph::task_id t = on[i];
    // A task no call launched is part of the collective before it (an arrive's complete).
    if (launches.launched(t)) {
      launched[i] = g.observed_start[g.edges[launches.of[t]].from];
      const graph::task_id h = hook[t];
      if (h != graph::no_task && launches.launched(h)) launched[i] = std::max(launched[i], g.observed_start[g.edges[launches.of[h]].from]);
    } else {
      launched[i] = i > 0 ? launched[i - 1] : g.observed_start[t];
    }
  }
  std::vector<graph::task_id> out;
  for (const gradient_bucket& k : p.buckets) {
    const graph::task_id n = next[k.after];
    const time_ns limit = n == graph::no_task ? g.observed_end[k.after]
                          : launches.launched(n) ? g.observed_start[g.edges[launches.of[n]].from]
                                                 : g.observed_start[n];
    graph::task_id at = graph::no_task;
    for (std::size_t i = 0; i < on.size(); ++i) {
      if (launched[i] < limit) at = on[i];
    }
    if (at == graph::no_task) return {};
    out.push_back(at);
  }
  out.push_back(on.back());
  return out;
}

/// Inserts plan `p`'s collectives after the traced stream's tasks `places` (`expert_bucket_places`)
/// as insertions into `ins`; returns the index of its first.
[[nodiscard]] inline std::size_t place_expert_collectives(const graph::task_graph& g, const rank_buckets& p,
                                                          const std::vector<graph::task_id>& places, std::vector<insertion>& ins,
                                                          std::string_view reduce_kernel) {
  const std::size_t first = ins.size();
  const auto add = [&](graph::task_id after, time_ns transfer, std::string_view kernel) {
    for (const graph::task_kind k : {graph::task_kind::comm_arrive, graph::task_kind::comm_complete}) {
      ins.push_back({.after = after,
                     .spec = {.kind = k, .duration = k == graph::task_kind::comm_complete ? transfer : 0, .rank = g.rank[after],
                              .observed_start = g.observed_end[after], .observed_end = g.observed_end[after]},
                     .name = std::string(kernel)});
    }
  };
  for (std::size_t i = 0; i < p.buckets.size(); ++i) add(places[i], p.buckets[i].scatter, reduce_kernel);
  for (const time_ns t : p.gathers) add(places.back(), t, "ncclDevKernel_AllGather_RING_LL");
  return first;
}

/// Writes the edges and collective instances of plan `p`, whose arrives and completes are the
/// inserted tasks from `first` on (`place_expert_collectives`), its launch calls taken in order
/// from `next_call` (`bucket_launches`); each reduce-scatter recorded in `in_layers`.
inline void link_expert_collectives(const graph::task_graph& g, edited_graph& e, const launch_edges& launches, const rank_buckets& p,
                                    std::size_t first, std::size_t& next_call, int rank, const char* reduce_kind,
                                    std::vector<std::array<graph::task_id, 4>>& in_layers) {
  graph::task_graph& ng = e.graph;
  std::int64_t sequence = 0;
  graph::task_id previous = graph::no_task;
  const auto collective = [&](graph::task_id op, const char* kind, std::int64_t elements) {
    const graph::task_id arrive = e.inserted[first], complete = e.inserted[first + 1];
    first += 2;
    if (launches.launched(op)) {
      const graph::edge& l = g.edges[launches.of[op]];
      ng.add_edge(e.inserted[next_call++], arrive, l.delay, graph::edge_kind::launch, l.flags());
    }
    add_folded_collective(ng, kind, std::string(inserted_expert_group) + std::to_string(rank), p.members, elements, sequence++, arrive,
                          complete, "inserted by an EP change from one expert-data-parallel rank (the group folded onto its traced rank)");
    previous = complete;
    return arrive;
  };
  for (const gradient_bucket& k : p.buckets) {
    const graph::task_id call = launches.launched(k.after) ? e.inserted[next_call] : graph::no_task;
    const graph::task_id a = collective(k.after, reduce_kind, k.params);
    ng.add_edge(e.first(k.after), a, 0, graph::edge_kind::cross_stream);
    in_layers.push_back({e.first(k.after), call, a, e.inserted[first - 1]});
  }
  if (p.gate != graph::no_task) ng.add_edge(previous, e.first(p.gate), 0, graph::edge_kind::cross_stream);
  for (const graph::task_id t : p.after_sync) ng.add_edge(previous, e.first(t), 0, graph::edge_kind::cross_stream);
  if (p.step == graph::no_task) return;
  for (std::size_t i = 0; i < p.gathers.size(); ++i) {
    const graph::task_id a = collective(p.step, "allgather", p.gathered[i]);
    if (i == 0) ng.add_edge(e.first(p.step), a, 0, graph::edge_kind::cross_stream);
  }
  if (p.host_wait != graph::no_task) {
    const graph::edge& w = g.edges[p.host_wait_edge];
    ng.add_edge(previous, e.first(p.host_wait), w.delay, graph::edge_kind::sync, w.flags());
  }
}

}  // namespace detail

/// Inserts the reduction of the routed experts' gradients into `b` (see the header comment):
/// `expert_params` per MoE layer and rank in the target, `bucket_params` Megatron's bucket size,
/// `members(rank)` the target's expert-data-parallel group of a global rank. `st` must be
/// `discover_structure` of `b` (built from `job`) as it is, `shape` its traced shape (its TP),
/// `layout` the target's layers (the all-gathers'); `all_reduce`: DDP's reduction (all-reduces,
/// no all-gather). Task ids of `b` change (`adopt`). O(tasks + edges) per rank with buckets.
template <class Members>
[[nodiscard]] expert_gradient_insertion insert_expert_gradients(const trace::job& job, graph::built_job& b, const job_structure& st,
                                                                const shape_config& shape, const bucket_target& layout,
                                                                std::int64_t expert_params, std::int64_t bucket_params, Members&& members,
                                                                const model::nccl_model& nccl, const model::hardware& hw,
                                                                const model::cost_profile& profile, bool all_reduce = false) {
  expert_gradient_insertion out;
  const model::collective reduce = all_reduce ? model::collective::all_reduce : model::collective::reduce_scatter;
  const char* reduce_kind = all_reduce ? "allreduce" : "reducescatter";
  const std::string_view reduce_kernel = all_reduce ? "ncclDevKernel_AllReduce_Sum_f32_RING_LL" : "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL";
  bucket_insertion planned;
  planned.bucket_params = bucket_params;
  detail::bucket_planner planner(b, st, shape, 0, st.model.gated_mlp, 1, nccl, hw, layout, planned);
  planner.params.layer = expert_params, planner.params.embedding = 0, planner.params.experts = true;
  std::vector<detail::rank_buckets> plans;
  for (std::size_t ri = 0; ri < b.ranks.size() && ri < st.ranks.size(); ++ri) {
    auto plan = planner.plan_rank(ri);
    if (!plan) continue;
    // The planner timed the DP group's; the experts' group is another.
    plan->members = members(b.ranks[ri].rank);
    const model::group_placement placement = model::placement_of(plan->members, hw);
    for (detail::gradient_bucket& k : plan->buckets) k.scatter = nccl.collective_time({reduce, k.params * 4, placement}, hw);
    if (all_reduce) plan->gathers.clear(), plan->gathered.clear();  // every rank steps its whole shard
    for (std::size_t i = 0; i < plan->gathers.size(); ++i) {
      plan->gathers[i] = nccl.collective_time({model::collective::all_gather, plan->gathered[i] * 2, placement}, hw);
    }
    plans.push_back(std::move(*plan));
  }
  if (plans.empty()) return out;
  const detail::launch_edges launches(b.graph);
  const std::map<int, graph::processor_id> streams =
      detail::traced_dp_streams(b.graph, lone_collectives(job, b), groups_with_role(st, group_role::dp));
  std::vector<std::vector<graph::task_id>> places(plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const int rank = b.graph.rank[plans[i].buckets.front().after];
    if (const auto s = streams.find(rank); s != streams.end()) places[i] = detail::expert_bucket_places(b.graph, launches, plans[i], s->second);
    if (places[i].empty()) {
      plans[i].stream = detail::add_inserted_stream(b, plans[i].buckets.front().after, "expert data-parallel");
      ++out.own_streams;
    }
  }
  const auto launch_ns = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host_ns = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch_ns);
  std::vector<insertion> ins = detail::bucket_launches(b.graph, plans, launches, launch_ns, host_ns);
  std::vector<std::size_t> first(plans.size(), 0);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (!places[i].empty()) first[i] = detail::place_expert_collectives(b.graph, plans[i], places[i], ins, reduce_kernel);
  }
  edited_graph e = insert_after(b.graph, ins);
  std::size_t next_call = 0;
  bucket_insertion written;  // the own-stream writer's reduce-scatters in their layers
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const detail::rank_buckets& p = plans[i];
    const int rank = b.graph.rank[p.buckets.front().after];
    if (places[i].empty()) {
      detail::dp_stream_writer w{b.graph, e, launches, p, next_call, rank};
      w.group = inserted_expert_group;
      w.match = "inserted by an EP change from one expert-data-parallel rank (the group folded onto its traced rank)";
      w.reduce_kind = reduce_kind, w.reduce_kernel = reduce_kernel;
      w.write(written);
    } else {
      detail::link_expert_collectives(b.graph, e, launches, p, first[i], next_call, rank, reduce_kind, out.in_layers);
    }
    out.buckets += p.buckets.size();
    ++out.ranks;
  }
  out.in_layers.insert(out.in_layers.end(), written.in_layers.begin(), written.in_layers.end());
  const detail::rank_buckets& p0 = plans.front();
  out.group = static_cast<int>(p0.members.size());
  for (const detail::gradient_bucket& k : p0.buckets) out.params_first += k.params, out.scatter_first += k.scatter;
  for (const time_ns t : p0.gathers) out.gather_first += t;
  out.moved = adopt(b, std::move(e));
  return out;
}

}  // namespace lumos::whatif

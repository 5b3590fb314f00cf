#pragma once
// The fully-sharded data-parallel what-if (`lumos whatif --fsdp on|off`, `--reshard-after-forward
// on|off`, and `--dp N` on FSDP traces). What structure discovery found of FSDP
// (whatif/structure/fsdp.hpp) says which collectives are the units' parameter all-gathers and
// gradient reduce-scatters; the pass rewrites them as `lumos synth --fsdp` and `predict` build
// them (synth/detail/program_emission.hpp):
//   --dp N            the shard group becomes N ranks. Each unit keeps its all-gathers and
//                     reduce-scatters (one per unit and pass); their transfer time follows the
//                     profile's NCCL model of the group at its new size and placement (a group
//                     that leaves the node pays the inter-node link), the message of a unit being
//                     the same and each rank's shard 1/N of it. That is the data-parallel pass's
//                     resize of the DP group's collectives (data_parallel.hpp), which this pass
//                     leaves to it, and the optimizer's kernels step 1/N of the parameters
//                     (`shard_optimizer`). The compute that waited for a gather first gets an
//                     edge from it (`bind_gather_waits`), so that it waits for the new end.
//   --fsdp off        the target runs Megatron's distributed optimizer (ZeRO-1, `predict`'s default
//                     without --fsdp): every gather and reduce-scatter of the shard group is
//                     removed (`strip_gradient_collectives`) and the distributed optimizer's
//                     buckets inserted for the target's replicas (`insert_target_buckets`,
//                     gradient_buckets.hpp): reduce-scatters as the final backward pass completes
//                     their layers, all-gathers after the optimizer step. The optimizer steps 1/N
//                     of the parameters under both, so its kernels stay.
//   --reshard-after-forward off   the backward passes' all-gathers (those launched for a
//                     backward pass, the prefetched first one included) are removed: the forward's
//                     gathered parameters stay for the backward.
//   --fsdp on         from DDP or distributed-optimizer traces: the DP group's gradient
//                     collectives are removed (`strip_gradient_collectives`: DDP's all-reduce
//                     buckets, or ZeRO-1's reduce-scatters and all-gathers after the step) and
//                     FSDP's per-unit all-gathers and reduce-scatters inserted over the target's DP
//                     ranks (`insert_fsdp_collectives`, fsdp_insertion.hpp), with or without the
//                     backward's gathers (--reshard-after-forward). The optimizer steps 1/N of the
//                     parameters: ZeRO-1's did already, DDP's kernels are sharded here.
//   --hsdp H          on FSDP or HSDP traces (and --dp on HSDP traces): shard groups of H ranks,
//                     replicated over dp / H groups whose all-reduces are inserted (hsdp.hpp).
//                     --fsdp off on HSDP traces removes the replica all-reduces with the rest.
// Not rewritten (an error says so): --reshard-after-forward on from traces whose backward passes
// do not gather, --fsdp on from traces with one replica or with --layers or a pipeline change,
// --hsdp from traces without FSDP, --hsdp 1, and HSDP rewrites of traces with context
// parallelism, or with --layers or a pipeline change.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/fsdp_insertion.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/hsdp.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// The tasks that launched each task of `g` (no_task where none did).
[[nodiscard]] inline std::vector<graph::task_id> launch_calls(const graph::task_graph& g) {
  std::vector<graph::task_id> out(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) out[e.to] = e.from;
  }
  return out;
}

/// Per task of `b`, 1 for a communication op launched for a backward pass: in one, before its
/// last compute op, or after the last compute op of a pass (a prefetch, inside the pass's
/// markers or between two passes) when the next compute op launched is a backward pass's.
/// O(GPU ops x log passes).
[[nodiscard]] inline std::vector<std::uint8_t> launched_for_backward(const graph::built_job& b, const job_structure& st) {
  std::vector<std::uint8_t> out(b.graph.task_count(), 0);
  std::map<std::size_t, std::set<int>> later;  // rank -> passes with a compute op launched later
  std::map<std::size_t, int> next;              // rank -> the pass of the next compute op launched
  for (auto it = st.gpu_ops.rbegin(); it != st.gpu_ops.rend(); ++it) {
    const gpu_op_context& c = *it;
    if (c.rank >= b.ranks.size() || c.rank >= st.ranks.size()) continue;
    if (!c.comm) {
      if (c.pass >= 0) later[c.rank].insert(c.pass), next[c.rank] = c.pass;
      continue;
    }
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
    const auto& passes = st.ranks[c.rank].passes;
    const bool inside = c.pass >= 0 && later[c.rank].contains(c.pass);
    const auto n = next.find(c.rank);
    const int pass = inside ? c.pass : n != next.end() ? n->second : -1;
    if (pass >= 0 && static_cast<std::size_t>(pass) < passes.size()) {
      out[map[c.op]] = passes[static_cast<std::size_t>(pass)].op.kind != pipeline::op_kind::forward;
    }
  }
  return out;
}

}  // namespace detail

/// The GPU tasks of the shard groups' all-gathers in `b` (matched across ranks or not).
[[nodiscard]] inline std::vector<graph::task_id> shard_gathers(const graph::built_job& b, const trace::job& job, const job_structure& st) {
  const std::set<std::string> shard = fsdp_group_names(st).shard;
  std::vector<graph::task_id> out;
  for (const graph::collective_instance& ci : b.graph.collectives) {
    if (!shard.contains(ci.group) || ci.kind != "allgather") continue;
    out.insert(out.end(), ci.arrive.begin(), ci.arrive.end());
    out.insert(out.end(), ci.complete.begin(), ci.complete.end());
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (shard.contains(c.group) && c.kind == "allgather") out.push_back(c.task), out.push_back(c.arrive);
  }
  std::erase(out, graph::no_task);
  return out;
}

namespace detail {

/// The shard group's gathers as the waits for them are found: which tasks they are, their ends
/// on the GPU (`kinds`: the task kinds whose end counts) and their own launch latency.
struct gather_ends {
  std::vector<std::uint8_t> is_gather;
  std::vector<std::pair<time_ns, graph::task_id>> ends;  ///< by end
  /// The least launch delay onto a gather: their idle stream shows the bare latency (none: max).
  std::int32_t latency = std::numeric_limits<std::int32_t>::max();

  gather_ends(const graph::task_graph& g, const std::vector<graph::task_id>& gathers, std::initializer_list<graph::task_kind> kinds)
      : is_gather(g.task_count(), 0) {
    for (const graph::task_id t : gathers) {
      is_gather[t] = 1;
      if (std::find(kinds.begin(), kinds.end(), g.kind[t]) != kinds.end()) ends.emplace_back(g.observed_end[t], t);
    }
    std::sort(ends.begin(), ends.end());
    for (const graph::edge& e : g.edges) {
      if (e.kind == graph::edge_kind::launch && is_gather[e.to]) latency = std::min(latency, std::max<std::int32_t>(e.delay, 0));
    }
  }

  /// The gather that `t` started within 1 us of the end of, on another stream of its rank: the
  /// trace rounds a waiting op's start to just before the gather's end, where no edge is inferred
  /// (no_task: none).
  [[nodiscard]] graph::task_id waited_by(const graph::task_graph& g, graph::task_id t) const {
    constexpr time_ns rounding = 1000;
    const time_ns at = g.observed_start[t];
    for (auto it = std::lower_bound(ends.begin(), ends.end(), std::pair{at - rounding, graph::task_id{0}});
         it != ends.end() && it->first <= at + rounding; ++it) {
      if (g.rank[it->second] == g.rank[t] && g.processor[it->second] != g.processor[t]) return it->second;
    }
    return graph::no_task;
  }

  /// Caps at the gathers' launch latency every launch delay onto a stream with an op in `waited`:
  /// the stream's learnt typical latency may be that wait, which every launch edge onto it keeps
  /// (clipped to its slack). Returns the ops whose launch delay it capped.
  std::vector<graph::task_id> cap_launches(graph::task_graph& g, const std::vector<std::uint8_t>& waited) const {
    std::vector<std::uint8_t> stream_waited(g.processors.size(), 0);
    for (const graph::edge& e : g.edges) {
      if (e.kind == graph::edge_kind::launch && !is_gather[e.to] && waited[e.to]) stream_waited[g.processor[e.to]] = 1;
    }
    std::vector<graph::task_id> capped;
    for (graph::edge& e : g.edges) {
      if (e.kind != graph::edge_kind::launch || e.delay <= latency || is_gather[e.to] || !stream_waited[g.processor[e.to]]) continue;
      e.delay = latency, capped.push_back(e.to);
    }
    return capped;
  }
};

}  // namespace detail

/// Before `gathers` are removed, the waits for them go: the edges from a gather to an op on
/// another processor (the unit's compute waiting for its parameters, which the target holds
/// already) are dropped rather than moved to the task before the gather on its stream, as
/// removing it would. Such an op may also hold the wait as its launch latency, when the trace
/// rounds its start to just before the gather's end (no edge then) and its stream has no other
/// idle-GPU launch to learn a latency from (the first kernel of a step that starts with a gather):
/// the launch delay of an op that waited for a gather, by an edge or starting within 1 us of one's
/// end on another stream of its rank, is capped at the gathers' own launch latency, which their
/// idle stream shows, and so is every launch delay onto its stream (`gather_ends::cap_launches`).
/// Returns the waits released. O(edges + launches x log gathers).
inline std::size_t release_gather_waits(graph::task_graph& g, const std::vector<graph::task_id>& gathers) {
  const detail::gather_ends ge(g, gathers, {graph::task_kind::gpu_comm});
  if (ge.latency == std::numeric_limits<std::int32_t>::max()) return 0;
  std::vector<std::uint8_t> waited(g.task_count(), 0);
  auto across = [&](const graph::edge& e) {
    return e.kind != graph::edge_kind::launch && ge.is_gather[e.from] && !ge.is_gather[e.to] && g.processor[e.from] != g.processor[e.to];
  };
  for (const graph::edge& e : g.edges) {
    if (across(e)) waited[e.to] = 1;
  }
  const std::size_t dropped = std::erase_if(g.edges, across);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (!ge.is_gather[t] && graph::is_gpu(g.kind[t]) && ge.waited_by(g, t) != graph::no_task) waited[t] = 1;
  }
  return dropped + ge.cap_launches(g, waited).size();
}

/// Before `gathers` are re-timed (a resized or re-placed shard group), the ops that waited for
/// one get an edge from it, so the wait moves with the gather's new end. The trace rounds such an
/// op's start to just before the gather's end, so the graph may have no edge for it and hold the
/// traced gather's end as the op's launch delay or stream gap instead: a compute op starting
/// within 1 us of a gather's end on another stream of its rank gets a cross-stream edge from it,
/// its stream gap capped at its stream's typical gap (the median), and the launch delays onto its
/// stream at the gathers' own launch latency (`gather_ends::cap_launches`); an op there whose
/// capped delay held a wait for another stream's op that ended within 1 us of its start (a
/// pipeline receive) gets an edge from that op. Returns the edges added. O(tasks x log tasks +
/// edges).
inline std::size_t bind_gather_waits(graph::task_graph& g, const std::vector<graph::task_id>& gathers) {
  const detail::gather_ends ge(g, gathers, {graph::task_kind::gpu_comm, graph::task_kind::comm_complete});
  if (ge.ends.empty()) return 0;
  std::set<std::pair<graph::task_id, graph::task_id>> bound;
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::launch && ge.is_gather[e.from]) bound.emplace(e.from, e.to);
  }
  std::vector<std::vector<time_ns>> gaps(g.processors.size());
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] == graph::task_kind::gpu_compute) gaps[g.processor[t]].push_back(g.idle_gap[t]);
  }
  std::vector<time_ns> typical(g.processors.size(), 0);
  for (std::size_t p = 0; p < gaps.size(); ++p) {
    if (gaps[p].empty()) continue;
    auto mid = gaps[p].begin() + static_cast<std::ptrdiff_t>(gaps[p].size() / 2);
    std::nth_element(gaps[p].begin(), mid, gaps[p].end());
    typical[p] = *mid;
  }
  std::vector<std::uint8_t> waited(g.task_count(), 0);
  std::size_t added = 0;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] != graph::task_kind::gpu_compute) continue;
    const graph::task_id w = ge.waited_by(g, t);
    if (w == graph::no_task) continue;
    waited[t] = 1;
    g.idle_gap[t] = std::min(g.idle_gap[t], typical[g.processor[t]]);
    if (bound.contains({w, t})) continue;
    g.add_edge(w, t, std::max<time_ns>(g.observed_start[t] - g.observed_end[w], 0), graph::edge_kind::cross_stream);
    ++added;
  }
  if (ge.latency == std::numeric_limits<std::int32_t>::max()) return added;
  // Another op on those streams may hold the wait for a transfer the trace rounded alike (a
  // pipeline receive) as its launch delay, which the cap takes: it gets its edge too.
  const std::vector<graph::task_id> capped = ge.cap_launches(g, waited);
  std::vector<std::uint8_t> was_capped(g.task_count(), 0);
  for (const graph::task_id t : capped) was_capped[t] = !waited[t];
  std::vector<graph::task_id> gpu_ops;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] == graph::task_kind::gpu_compute || g.kind[t] == graph::task_kind::gpu_comm || g.kind[t] == graph::task_kind::comm_complete) {
      gpu_ops.push_back(t);
    }
  }
  const detail::gather_ends others(g, gpu_ops, {graph::task_kind::gpu_compute, graph::task_kind::gpu_comm, graph::task_kind::comm_complete});
  std::set<std::pair<graph::task_id, graph::task_id>> into_capped;
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::launch && was_capped[e.to]) into_capped.emplace(e.from, e.to);
  }
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (!was_capped[t]) continue;
    const graph::task_id w = others.waited_by(g, t);
    if (w == graph::no_task || into_capped.contains({w, t})) continue;
    g.add_edge(w, t, std::max<time_ns>(g.observed_start[t] - g.observed_end[w], 0), graph::edge_kind::cross_stream);
    ++added;
  }
  return added;
}

/// Removes the all-gathers of `st.fsdp`'s shard group launched for backward passes
/// (`launched_for_backward`), each with its launch call and join, matched across ranks or not
/// (`lone_collectives`: the ranks folded onto one). Returns how many; task ids of `b` change when
/// any is (`adopt`). O(tasks + edges).
inline std::size_t remove_backward_gathers(graph::built_job& b, const trace::job& job, const job_structure& st) {
  const graph::task_graph& g = b.graph;
  const std::vector<graph::task_id> call = detail::launch_calls(g);
  const std::vector<std::uint8_t> backward = detail::launched_for_backward(b, st);
  const std::set<std::string> shard = fsdp_group_names(st).shard;
  std::vector<repeat_group> groups;
  auto remove = [&](std::vector<graph::task_id> tasks, graph::task_id first) {
    if (!backward[first]) return;
    const std::size_t gpu = tasks.size();
    for (std::size_t k = 0; k < gpu; ++k) {
      if (tasks[k] != graph::no_task) tasks.push_back(call[tasks[k]]);
    }
    std::erase(tasks, graph::no_task);
    std::sort(tasks.begin(), tasks.end());
    tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
    groups.push_back({std::move(tasks), 0});
  };
  for (const graph::collective_instance& ci : g.collectives) {
    if (!shard.contains(ci.group) || ci.kind != "allgather" || ci.complete.empty()) continue;
    std::vector<graph::task_id> tasks = ci.arrive;
    tasks.insert(tasks.end(), ci.complete.begin(), ci.complete.end());
    tasks.push_back(ci.join);
    remove(std::move(tasks), ci.complete.front());
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (shard.contains(c.group) && c.kind == "allgather" && c.task != graph::no_task) remove({c.arrive, c.task}, c.task);
  }
  if (groups.empty()) return 0;
  std::vector<graph::task_id> removed;
  for (const repeat_group& r : groups) removed.insert(removed.end(), r.tasks.begin(), r.tasks.end());
  (void)release_gather_waits(b.graph, removed);
  (void)adopt(b, repeat_groups(b.graph, groups));
  return groups.size();
}

/// Pass: fully sharded data parallelism (see the header comment). Runs before the gradient
/// buckets and the data-parallel pass: after `--fsdp off` they see the distributed optimizer's
/// buckets it inserted.
struct fsdp_pass {
  [[nodiscard]] bool wanted(const context& ctx) const {
    const whatif_options& o = ctx.options;
    if (o.fsdp || o.hsdp || o.reshard_after_forward) return true;
    const auto& st = ctx.known_structure();
    return o.dp && st && st->fsdp.found();
  }

  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const whatif_options& o = ctx.options;
    const job_structure& st = ctx.structure(b);
    const fsdp_structure& f = st.fsdp;
    if (!f.found()) {
      if (o.hsdp) {
        throw error("whatif --hsdp: the traces do not run FSDP (`lumos inspect --structure` shows no fsdp); hybrid sharding is "
                    "rewritten from FSDP or HSDP traces only (with --fsdp on, write the FSDP job with --trace-out first; lumos predict "
                    "--hsdp models it)");
      }
      if (o.fsdp.value_or(false)) return turn_on(ctx, b);
      if (o.reshard_after_forward) throw error("whatif --reshard-after-forward: the traces do not run FSDP (`lumos inspect --structure` shows no fsdp)");
      return {note("fsdp", "FSDP", "--fsdp off: the traces do not shard parameters; nothing to change")};
    }
    const bool hybrid = f.replicas.value.value_or(1) > 1;
    const int traced_dp = st.parallel.dp.value.value_or(f.shard.value.value_or(1));
    // The shard group holds DP x CP ranks under context parallelism: --dp counts replicas.
    const int dp = o.dp || ctx.target_cp() != ctx.traced_cp() ? ctx.target_gradient_group() : traced_dp;
    if (!o.fsdp.value_or(true)) return turn_off(ctx, b, dp, hybrid);
    change_list out;
    if (o.reshard_after_forward) out.push_back(reshard(ctx, b, *o.reshard_after_forward));
    // The gathers are re-timed below (the shard group resized or re-placed): the waits for them
    // must follow their new ends.
    if (o.hsdp || dp != traced_dp) (void)bind_gather_waits(b.graph, shard_gathers(b, ctx.job, ctx.structure(b)));
    if (o.hsdp || (hybrid && dp != traced_dp)) {
      const change_list h = rewrite_hsdp(ctx, b);
      out.insert(out.end(), h.begin(), h.end());
    } else if (dp != traced_dp) {
      out.push_back(resized(ctx.structure(b).fsdp, traced_dp, dp));
    }
    if (out.empty()) out.push_back(note("fsdp", "FSDP", "--fsdp on: the traces run FSDP already (" + f.source + "); nothing to change"));
    return out;
  }

  /// `--dp` on FSDP traces: what the data-parallel pass makes of the units' collectives.
  [[nodiscard]] static change resized(const fsdp_structure& f, int from, int to) {
    char line[640];
    std::snprintf(line, sizeof line,
                  "FSDP shard group %d -> %d ranks: each of the %d units keeps its all-gathers and reduce-scatters (%d and %d per "
                  "iteration), a unit's message the same and each rank's shard of it 1/%d instead of 1/%d; their transfer times are "
                  "resized by the data-parallel pass (the NCCL model of the group at its new size and placement), and the "
                  "optimizer's kernels step 1/%d of the parameters",
                  from, to, f.units.value.value_or(0), f.all_gathers.value.value_or(0), f.reduce_scatters.value.value_or(0), to, from, to);
    return changed("fsdp", "shard group", std::to_string(from), std::to_string(to), line,
                   {count_figure("all-gathers per iteration", static_cast<std::size_t>(f.all_gathers.value.value_or(0))),
                    count_figure("reduce-scatters per iteration", static_cast<std::size_t>(f.reduce_scatters.value.value_or(0)))});
  }

  /// `--reshard-after-forward on|off`.
  [[nodiscard]] static change reshard(context& ctx, graph::built_job& b, bool on) {
    const fsdp_structure& f = ctx.structure(b).fsdp;
    const std::string traced = f.reshard_after_forward.value.value_or("unknown");
    if (on) {
      if (traced == "on") return note("fsdp", "reshard after forward", "--reshard-after-forward on: the traces' backward passes gather already");
      throw error("whatif --reshard-after-forward on: the traces' backward passes do not gather (" + f.reshard_after_forward.source +
                  "); inserting backward all-gathers is not built yet");
    }
    if (traced == "off") return note("fsdp", "reshard after forward", "--reshard-after-forward off: the traces' backward passes do not gather");
    const std::size_t removed = remove_backward_gathers(b, ctx.job, ctx.structure(b));
    ctx.refresh(b);
    return changed("fsdp", "reshard after forward", "on", "off",
                   "reshard after forward on -> off: the forward's gathered parameters stay for the backward, so the " +
                       std::to_string(removed) + " all-gathers launched for backward passes (the prefetched first included) are removed",
                   {count_figure("all-gathers removed", removed)});
  }

  /// `--fsdp on` from DDP or distributed-optimizer traces: their gradient collectives replaced by
  /// FSDP's per-unit ones (fsdp_insertion.hpp) over the target's DP ranks.
  [[nodiscard]] static change_list turn_on(context& ctx, graph::built_job& b) {
    const whatif_options& o = ctx.options;
    const job_structure& st = ctx.structure(b);
    const int traced_dp = st.parallel.dp.value.value_or(1);
    // As for FSDP traces: under context parallelism the shard group is DP x CP ranks.
    const int dp = o.dp || ctx.target_cp() != ctx.traced_cp() ? ctx.target_gradient_group() : traced_dp;
    const bool zero1 = runs_distributed_optimizer(st);
    const bool ddp = traced_ddp(st);
    if (traced_dp <= 1 || (!zero1 && !ddp)) {
      throw error("whatif --fsdp on: the traces reduce no data-parallel gradients by DDP's all-reduces or the distributed optimizer's "
                  "reduce-scatters (" + (traced_dp <= 1 ? st.parallel.dp.source : st.gradients.method.source) +
                  "); FSDP is inserted only in place of those (lumos predict --fsdp on models it)");
    }
    if (dp <= 1) throw error("whatif --fsdp on --dp " + std::to_string(dp) + ": a shard group of one rank shards nothing");
    if (st.moe.layers.value.value_or(0) > 0) throw error("whatif --fsdp on: FSDP of a MoE model is not modelled (lumos synth refuses it too)");
    if (o.layers || o.pipeline_asked()) {
      throw error("whatif --fsdp on from traces without FSDP, together with --layers or a pipeline change, is not built yet "
                  "(each runs alone)");
    }
    const shape_config from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
    const std::int64_t vocab = traced_vocab_local(ctx.job, st, from) * from.tp;
    const std::size_t removed = strip_gradient_collectives(b, ctx.job, st, ddp);
    if (removed == 0) throw error("whatif --fsdp on: no gradient collective of the data-parallel group to remove");
    ctx.refresh(b);
    const job_structure& stripped = ctx.structure(b);
    const shape_costs& costs = ctx.costs(b);
    const model::nccl_model model_of_costs{costs.profile};
    const bool reshard = o.reshard_after_forward.value_or(true);
    const fsdp_insertion fi = insert_fsdp_collectives(b, stripped, ctx.shape_to ? *ctx.shape_to : from, vocab, stripped.model.gated_mlp, dp,
                                                      reshard, ctx.nccl ? ctx.nccl->first : model_of_costs,
                                                      ctx.nccl ? ctx.nccl->second : costs.hw, costs.profile);
    if (fi.gathers == 0 || fi.scatters == 0) {
      throw error("whatif --fsdp on: no FSDP unit found to gather and reduce-scatter (" +
                  (fi.skipped.empty() ? std::string("no forward or backward pass found") : fi.skipped.front()) + ")");
    }
    ctx.refresh(b);
    ctx.fsdp_inserted = true;
    change_list out;
    out.push_back(turned_on(fi, removed, ddp, traced_dp, dp, reshard, bucket_profile_name(ctx, b)));
    // DDP's optimizer stepped every parameter; FSDP's steps the rank's 1/N (the distributed
    // optimizer's already stepped 1/DP: a DP change resizes it with the data-parallel pass).
    if (ddp) {
      const shape_stats sh = shard_optimizer(b, ctx.structure(b), 1, dp, costs.profile.min_kernel_ns, true);
      char line[256];
      std::snprintf(line, sizeof line, "the optimizer steps the rank's 1/%d of the parameters: %zu optimizer kernels %.3f -> %.3f ms", dp,
                    sh.optimizer, static_cast<double>(sh.before) / 1e6, static_cast<double>(sh.after) / 1e6);
      out.push_back(changed("fsdp", "optimizer share", "1", "1/" + std::to_string(dp), line,
                            {time_figure("optimizer kernel time", sh.before, sh.after)}));
    }
    return out;
  }

  /// The `changes` record of `turn_on`.
  [[nodiscard]] static change turned_on(const fsdp_insertion& fi, std::size_t removed, bool ddp, int traced_dp, int dp, bool reshard,
                                        const std::string& profile) {
    char why[1024];
    std::snprintf(why, sizeof why,
                  "%s -> FSDP: the traced gradient collectives (%zu on the traced ranks: %s) removed, and FSDP's per-unit "
                  "collectives inserted as lumos synth --fsdp on builds them over a shard group of %d ranks (the traces' %d): each "
                  "unit (the embedding, each layer, the head) all-gathered (bf16 parameters) before its forward%s, prefetched one "
                  "unit ahead, and its fp32 gradients reduce-scattered after its backward, on an FSDP stream of each rank, the "
                  "optimizer waiting for the last (%zu all-gathers and %zu reduce-scatters on %zu rank(s); the first rank: %zu "
                  "units a pass, %.3f ms of all-gathers and %.3f ms of reduce-scatters by the %s profile's NCCL model)%s",
                  ddp ? "DDP" : "the distributed optimizer (ZeRO-1)", removed,
                  ddp ? "all-reduce buckets" : "bucket reduce-scatters and the all-gathers after the step", dp, traced_dp,
                  reshard ? " and again before its backward (reshard after forward)" : "", fi.gathers, fi.scatters, fi.ranks, fi.units,
                  static_cast<double>(fi.gather_first) / 1e6, static_cast<double>(fi.scatter_first) / 1e6, profile.c_str(),
                  fi.skipped.empty() ? "" : "; not on some passes");
    std::string text = why;
    if (!fi.skipped.empty()) text += " (" + fi.skipped.front() + ")";
    return changed("fsdp", "FSDP", "off", "on", text,
                   {count_figure("collectives removed", removed), count_figure("all-gathers inserted", fi.gathers),
                    count_figure("reduce-scatters inserted", fi.scatters)});
  }

  /// `--fsdp off`: the shard group's collectives (and `hybrid`, HSDP's replica all-reduces)
  /// replaced by the distributed optimizer's buckets.
  [[nodiscard]] static change_list turn_off(context& ctx, graph::built_job& b, int dp, bool hybrid) {
    const job_structure& st = ctx.structure(b);
    const shape_config from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
    const std::int64_t vocab = traced_vocab_local(ctx.job, st, from) * from.tp;
    const int gathers = st.fsdp.all_gathers.value.value_or(0), scatters = st.fsdp.reduce_scatters.value.value_or(0);
    const int shard = st.fsdp.shard.value.value_or(dp);
    (void)release_gather_waits(b.graph, shard_gathers(b, ctx.job, st));
    const std::size_t removed = strip_gradient_collectives(b, ctx.job, st, hybrid);
    if (removed == 0) throw error("whatif --fsdp off: no all-gather or reduce-scatter of the shard group to remove");
    ctx.refresh(b);
    const bucket_insertion bi = insert_target_buckets(ctx, b, dp, from, vocab);
    if (bi.buckets == 0) throw error("whatif --fsdp off: " + describe_buckets(bi, dp, bucket_profile_name(ctx, b), false));
    char why[640];
    std::snprintf(why, sizeof why,
                  "FSDP -> the distributed optimizer (ZeRO-1): the shard group's %d all-gathers and %d reduce-scatters per iteration%s "
                  "(%zu collectives on the traced ranks) removed, parameters stay whole on every rank (the optimizer still steps 1/%d "
                  "of them), and Megatron's gradient buckets for %d replicas inserted",
                  gathers, scatters, hybrid ? " and HSDP's replica all-reduces" : "", removed, dp, dp);
    change_list out;
    out.push_back(changed("fsdp", "FSDP", "on", "off", why,
                          {count_figure("collectives removed", removed), count_figure("buckets inserted", bi.buckets)}));
    out.push_back(bucket_change(bi, dp, bucket_profile_name(ctx, b), ctx.options.layers.has_value(), "the buckets"));
    if (hybrid) {
      // HSDP's optimizer stepped the shard group's share; the distributed optimizer's steps 1/DP.
      const shape_stats sh = shard_optimizer(b, ctx.structure(b), shard, dp, ctx.costs(b).profile.min_kernel_ns, true);
      char line[256];
      std::snprintf(line, sizeof line, "the optimizer steps the rank's 1/%d of the parameters instead of HSDP's 1/%d: %zu optimizer kernels %.3f -> %.3f ms",
                    dp, shard, sh.optimizer, static_cast<double>(sh.before) / 1e6, static_cast<double>(sh.after) / 1e6);
      out.push_back(changed("fsdp", "optimizer share", "1/" + std::to_string(shard), "1/" + std::to_string(dp), line,
                            {time_figure("optimizer kernel time", sh.before, sh.after)}));
    }
    return out;
  }
};
static_assert(Rewrite<fsdp_pass>);

}  // namespace lumos::whatif

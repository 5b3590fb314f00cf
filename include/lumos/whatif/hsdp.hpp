#pragma once
// Hybrid sharding (HSDP) from FSDP traces: `lumos whatif --hsdp H` on FSDP or HSDP traces, and
// `--dp N` on HSDP traces. The target shards each unit's parameters, gradients and optimizer
// states over shard groups of H consecutive DP ranks and replicates them across the N / H shard
// groups, as `lumos synth --fsdp on --hsdp H` builds it (synth/detail/program_emission.hpp,
// `fsdp_reduce`):
//  - the shard groups' all-gathers and reduce-scatters stay, each re-timed by the profile's NCCL
//    model at H ranks and their placement, as the data-parallel pass resizes a DP group
//    (`resize_data_parallel` over the shard groups alone), a unit's message the same;
//  - after each model chunk's final gradient pass (its last micro-batch), each unit's reduced shard
//    is all-reduced over its replica group: the N / H ranks holding the same shard, H DP ranks
//    apart at their Megatron ranks (`model::placement_of`), a message of the unit's gradients / H,
//    on a stream of its own (another communicator), launched with the unit's reduce-scatter and
//    waiting for it; what waited for the reduce-scatter (the optimizer) waits for the all-reduce;
//  - the optimizer steps 1/H of the parameters (`shard_optimizer`).
// Traced replica all-reduces (HSDP traces) are removed first, what waited for each then waiting
// for the reduce-scatter before it, and inserted again for the target's replica group (none at H = N).
// Each rank's inserted all-reduces form their own folded group (`hsdp.inserted.RANK`).

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/fsdp_insertion.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// The group name (and the rank after it) of the all-reduces an HSDP insertion makes.
inline constexpr std::string_view inserted_hsdp_group = "hsdp.inserted.";

/// The data-parallel groups of an FSDP job by what they do: the shard groups reduce-scatter the
/// units' gradients; HSDP's replica groups all-reduce them and never reduce-scatter.
struct fsdp_groups {
  std::set<std::string> shard, replica;
};

/// The shard and replica groups of `st`, by their collectives per iteration (every rank's own
/// group of a folded or unfolded job, not only the facet's `group` and `replica_group`).
[[nodiscard]] inline fsdp_groups fsdp_group_names(const job_structure& st) {
  fsdp_groups out;
  for (const process_group& g : st.groups) {
    if (std::none_of(g.roles.begin(), g.roles.end(), [](const auto& r) { return r.value == group_role::dp; })) continue;
    bool scatters = false, reduces = false;
    for (const auto& [what, count] : g.collectives) {
      scatters = scatters || (count > 0 && what.starts_with("reducescatter"));
      reduces = reduces || (count > 0 && what.starts_with("allreduce"));
    }
    if (scatters) out.shard.insert(g.name);
    else if (reduces) out.replica.insert(g.name);
  }
  if (!st.fsdp.group.empty()) out.shard.insert(st.fsdp.group);
  if (!st.fsdp.replica_group.empty()) out.replica.insert(st.fsdp.replica_group);
  return out;
}

/// What `insert_replica_reduces` did.
struct hsdp_insertion {
  std::size_t reduces = 0;        ///< all-reduces inserted over every traced rank
  std::size_t ranks = 0;          ///< traced ranks that got them
  std::size_t reduces_first = 0;  ///< the first rank's
  std::int64_t elements_first = 0;
  time_ns reduce_first = 0;  ///< their summed transfer time
  std::vector<std::string> skipped;
};

namespace detail {

/// Before HSDP's replica all-reduces `removed` (groups of tasks) go, what waited for one of them
/// waits for the reduce-scatter it followed: of `scatters` (the shard groups' reduce-scatters, their
/// GPU tasks), the last on its rank to end before it started. The traces need not hold the
/// all-reduce's wait for it as an edge (a launch delay may stand for it). O(edges + removed x log
/// scatters).
inline void wait_for_scatters(graph::task_graph& g, const std::vector<repeat_group>& removed, const std::vector<graph::task_id>& scatters) {
  std::map<int, std::vector<std::pair<time_ns, graph::task_id>>> ends;  // rank -> (end, task), sorted
  for (const graph::task_id t : scatters) ends[g.rank[t]].emplace_back(g.observed_end[t], t);
  for (auto& [rank, v] : ends) std::sort(v.begin(), v.end());
  std::vector<std::int64_t> group_of(g.task_count(), -1);
  std::vector<std::map<int, time_ns>> start(removed.size());  // per group and rank, its GPU tasks' first start
  for (std::size_t i = 0; i < removed.size(); ++i) {
    for (const graph::task_id t : removed[i].tasks) {
      group_of[t] = static_cast<std::int64_t>(i);
      if (g.processors[g.processor[t]].kind != graph::processor_kind::gpu_stream) continue;
      const auto [it, fresh] = start[i].emplace(g.rank[t], g.observed_start[t]);
      if (!fresh) it->second = std::min(it->second, g.observed_start[t]);
    }
  }
  std::vector<graph::edge> added;
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch || group_of[e.from] < 0 || group_of[e.to] >= 0 || g.processor[e.from] == g.processor[e.to]) continue;
    const auto& starts = start[static_cast<std::size_t>(group_of[e.from])];
    const auto at = starts.find(g.rank[e.to]);
    const auto v = ends.find(g.rank[e.to]);
    if (at == starts.end() || v == ends.end()) continue;
    const auto it = std::upper_bound(v->second.begin(), v->second.end(), std::pair{at->second, graph::no_task});
    if (it == v->second.begin()) continue;
    graph::edge x = e;
    x.from = std::prev(it)->second;
    added.push_back(x);
  }
  g.edges.insert(g.edges.end(), added.begin(), added.end());
}

/// One unit's reduce-scatter of a rank's final gradient pass.
struct unit_scatter {
  graph::task_id launched = graph::no_task;  ///< the GPU task its launch call launched
  graph::task_id complete = graph::no_task;  ///< the task whose end is the reduced shard
  std::int64_t params = 0;                   ///< the unit's gradients, in elements
  std::int64_t element_bytes = 4;
};

/// Per traced rank (index into `b.ranks`), the reduce-scatters of the shard groups `shard` that
/// its final gradient passes (each model chunk's last backward, or weight-gradient pass of a
/// split backward) launched, in launch order. O(GPU ops + collectives).
[[nodiscard]] inline std::vector<std::vector<unit_scatter>> final_scatters(const graph::built_job& b, const trace::job& job,
                                                                           const job_structure& st, const std::set<std::string>& shard) {
  const graph::task_graph& g = b.graph;
  std::vector<int> pass_of(g.task_count(), -1);
  for (const gpu_op_context& c : st.gpu_ops) {
    if (!c.comm || c.rank >= b.ranks.size()) continue;
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op < map.size() && map[c.op] != graph::no_task) pass_of[map[c.op]] = c.pass;
  }
  std::map<int, std::size_t> index_of;  // global rank -> traced rank
  for (std::size_t ri = 0; ri < b.ranks.size(); ++ri) index_of[b.ranks[ri].rank] = ri;
  // Per traced rank, its final gradient pass of each model chunk (an interleaved stage's chunks
  // each end their gradients at their own last micro-batch).
  std::vector<std::set<int>> final_passes(b.ranks.size());
  for (std::size_t ri = 0; ri < b.ranks.size() && ri < st.ranks.size(); ++ri) {
    const auto& passes = st.ranks[ri].passes;
    const bool split = std::any_of(passes.begin(), passes.end(), [](const pass_info& p) { return p.op.kind == pipeline::op_kind::weight; });
    std::map<int, int> last;  // chunk -> its last gradient pass
    for (std::size_t p = 0; p < passes.size(); ++p) {
      const pipeline::op& o = passes[p].op;
      if (o.kind == (split ? pipeline::op_kind::weight : pipeline::op_kind::backward)) last[o.chunk] = static_cast<int>(p);
    }
    for (const auto& [chunk, p] : last) final_passes[ri].insert(p);
  }
  std::vector<std::vector<unit_scatter>> out(b.ranks.size());
  const launch_edges launches(g);
  auto add = [&](graph::task_id arrive, graph::task_id complete, std::int64_t elements, std::int64_t element_bytes) {
    if (complete == graph::no_task) return;
    const auto ri = index_of.find(g.rank[complete]);
    if (ri == index_of.end()) return;
    const int pass = arrive != graph::no_task && pass_of[arrive] >= 0 ? pass_of[arrive] : pass_of[complete];
    if (pass < 0 || !final_passes[ri->second].contains(pass)) return;
    const graph::task_id launched = arrive != graph::no_task && launches.launched(arrive) ? arrive : complete;
    out[ri->second].push_back({launched, complete, elements, element_bytes});
  };
  for (const graph::collective_instance& ci : g.collectives) {
    if (!shard.contains(ci.group) || collective_of_kind(ci.kind) != model::collective::reduce_scatter) continue;
    for (std::size_t k = 0; k < ci.complete.size(); ++k) add(k < ci.arrive.size() ? ci.arrive[k] : graph::no_task, ci.complete[k], ci.bytes, element_bytes_of(ci, g));
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (shard.contains(c.group) && collective_of_kind(c.kind) == model::collective::reduce_scatter) add(c.arrive, c.task, c.elements, c.element_bytes);
  }
  for (auto& r : out) {
    std::sort(r.begin(), r.end(), [&](const unit_scatter& x, const unit_scatter& y) {
      return std::pair{g.observed_start[x.launched], x.launched} < std::pair{g.observed_start[y.launched], y.launched};
    });
  }
  return out;
}

/// The `replicas` ranks of the replica group of traced rank `rank` (on stage `stage` of a job
/// with `tp_traced` TP ranks) in a target of TP `tp`, `shard`-rank shard groups and
/// `shard` x `replicas` DP ranks, at their Megatron ranks: the DP ranks `shard` apart that hold the
/// rank's shard.
[[nodiscard]] inline std::vector<int> replica_group_members(int rank, int stage, int tp, int tp_traced, int shard, int replicas) {
  const std::vector<int> dp = dp_group_members(rank, stage, tp, tp_traced, shard * replicas);
  const int index = rank % std::max(1, tp_traced * shard * replicas) / std::max(1, tp_traced) % shard;
  std::vector<int> out;
  for (int i = 0; i < replicas; ++i) out.push_back(dp[static_cast<std::size_t>(index + i * shard)]);
  return out;
}

}  // namespace detail

/// Removes the all-reduces of HSDP's replica groups (those of more than 1024 elements: a gradient
/// norm is a few scalars) from `b`, what waited for each then waiting for the reduce-scatter before
/// it (`wait_for_scatters`).
/// Returns how many; task ids of `b` change when any is (`adopt`).
inline std::size_t strip_replica_reduces(graph::built_job& b, const trace::job& job, const job_structure& st) {
  const fsdp_groups groups = fsdp_group_names(st);
  std::vector<graph::task_id> scatters;
  for (const graph::collective_instance& ci : b.graph.collectives) {
    if (groups.shard.contains(ci.group) && collective_of_kind(ci.kind) == model::collective::reduce_scatter) {
      scatters.insert(scatters.end(), ci.complete.begin(), ci.complete.end());
    }
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (groups.shard.contains(c.group) && collective_of_kind(c.kind) == model::collective::reduce_scatter) scatters.push_back(c.task);
  }
  std::erase(scatters, graph::no_task);
  return strip_collectives(
      b, job, groups.replica,
      [](std::string_view kind, std::int64_t elements) {
        return collective_of_kind(kind) == model::collective::all_reduce && (elements <= 0 || elements > 1024);
      },
      [&](graph::task_graph& g, const std::vector<repeat_group>& removed) { detail::wait_for_scatters(g, removed, scatters); });
}

/// Inserts, on every traced rank, the all-reduce of each unit's reduced shard over a replica group
/// of `replicas` ranks after the reduce-scatters of its final gradient passes (see the header
/// comment), for shard groups of `shard` ranks at TP `tp`. `st` must be `discover_structure` of
/// `b` as it is. Task ids of `b` change (`adopt`). Returns what was inserted.
[[nodiscard]] inline hsdp_insertion insert_replica_reduces(graph::built_job& b, const trace::job& job, const job_structure& st, int shard,
                                                           int replicas, int tp, const model::nccl_model& nccl, const model::hardware& hw,
                                                           const model::cost_profile& profile) {
  hsdp_insertion out;
  const std::vector<std::vector<detail::unit_scatter>> scatters = detail::final_scatters(b, job, st, fsdp_group_names(st).shard);
  const graph::task_graph& g = b.graph;
  const int tp_traced = std::max(1, st.parallel.tp.value.value_or(1));
  std::vector<detail::rank_buckets> plans(scatters.size());
  for (std::size_t ri = 0; ri < scatters.size(); ++ri) {
    if (scatters[ri].empty()) {
      out.skipped.push_back("rank " + std::to_string(b.ranks[ri].rank) + ": no reduce-scatter in its final gradient pass");
      continue;
    }
    const int stage = ri < st.ranks.size() ? st.ranks[ri].stage.value.value_or(0) : 0;
    plans[ri].members = detail::replica_group_members(b.ranks[ri].rank, stage, tp, tp_traced, shard, replicas);
    plans[ri].stream = detail::add_inserted_stream(b, scatters[ri].front().complete, "HSDP all-reduce");
  }
  const detail::launch_edges launches(g);
  std::vector<insertion> ins;
  for (const auto& units : scatters) {
    for (const detail::unit_scatter& u : units) {
      if (launches.launched(u.launched)) ins.push_back(detail::collective_launch(g, g.edges[launches.of[u.launched]].from, profile));
    }
  }
  // What waited for each reduce-scatter of a unit (the optimizer) waits for its all-reduce.
  std::map<graph::task_id, std::vector<std::uint32_t>> waits;
  for (const auto& units : scatters) {
    for (const detail::unit_scatter& u : units) waits[u.complete];
  }
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    const graph::edge& x = g.edges[i];
    if (x.kind == graph::edge_kind::launch || g.processor[x.to] == g.processor[x.from] || g.rank[x.to] != g.rank[x.from]) continue;
    if (const auto it = waits.find(x.from); it != waits.end()) it->second.push_back(i);
  }
  edited_graph e = insert_after(g, ins);
  graph::task_graph& ng = e.graph;
  std::size_t next_call = 0;
  for (std::size_t ri = 0; ri < scatters.size(); ++ri) {
    if (scatters[ri].empty()) continue;
    const model::group_placement placement = model::placement_of(plans[ri].members, hw);
    detail::dp_stream_writer w{g, e, launches, plans[ri], next_call, b.ranks[ri].rank};
    w.group = inserted_hsdp_group, w.match = "inserted by --hsdp (the replica group folded onto its traced rank)";
    for (const detail::unit_scatter& u : scatters[ri]) {
      const std::int64_t elements = u.params / shard;
      const time_ns t = nccl.collective_time({model::collective::all_reduce, u.params * u.element_bytes / shard, placement}, hw);
      const graph::task_id arrive = w.collective(u.launched, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t, elements);
      ng.add_edge(e.first(u.complete), arrive, 0, graph::edge_kind::cross_stream);
      for (const std::uint32_t i : waits.at(u.complete)) {
        const graph::edge& x = g.edges[i];
        ng.add_edge(w.previous, e.first(x.to), x.delay, x.kind, x.flags());
      }
      ++out.reduces;
      if (out.ranks == 0) ++out.reduces_first, out.elements_first += elements, out.reduce_first += t;
    }
    ++out.ranks;
  }
  (void)adopt(b, std::move(e));
  return out;
}

/// `--hsdp` on FSDP or HSDP traces and `--dp` on HSDP traces (see the header comment): the
/// `changes` records. Sets `ctx.dp_from`/`dp_to` and `ctx.hsdp_rewritten`, which leaves the
/// gradient collectives to this rewrite rather than the data-parallel pass.
[[nodiscard]] inline change_list rewrite_hsdp(context& ctx, graph::built_job& b) {
  const whatif_options& o = ctx.options;
  const job_structure& st = ctx.structure(b);
  const fsdp_structure& f = st.fsdp;
  if (!f.shard.known()) throw error("whatif --hsdp: the traces' shard group size is unknown (" + f.shard.source + ")");
  if (ctx.traced_cp() != 1 || ctx.target_cp() != 1) throw error("whatif --hsdp with context parallelism is not built yet");
  if (o.layers || o.pipeline_asked()) throw error("whatif --hsdp or --dp on HSDP traces, together with --layers or a pipeline change, is not built yet");
  const int shard_from = *f.shard.value, replicas_from = f.replicas.value.value_or(1);
  const int dp_from = shard_from * replicas_from, dp = o.dp.value_or(dp_from);
  const int shard = o.hsdp.value_or(replicas_from > 1 ? shard_from : dp);
  if (dp % shard != 0) {
    throw error("whatif --hsdp " + std::to_string(shard) + ": it must divide the DP ranks (" + std::to_string(dp) +
                "): dp / hsdp shard groups replicate each other");
  }
  if (shard == 1) {
    throw error("whatif --hsdp 1: a shard group of one rank (no gathers or reduce-scatters, each unit's whole gradients "
                "all-reduced over every DP rank) is not built yet");
  }
  const int replicas = dp / shard;
  if (shard == shard_from && replicas == replicas_from) {
    return {note("fsdp", "HSDP", "--hsdp " + std::to_string(shard) + ": the traces shard over groups of " + std::to_string(shard) + " ranks x " +
                                     std::to_string(replicas) + " replicas already; nothing to change")};
  }
  change_list out;
  const std::size_t removed = replicas_from > 1 ? strip_replica_reduces(b, ctx.job, st) : 0;
  if (removed > 0) ctx.refresh(b);
  if (shard != shard_from) {
    // The shard groups alone, at the traced shard size: the data-parallel pass's resize of them.
    const std::set<std::string> names = fsdp_group_names(ctx.structure(b)).shard;
    job_structure shards = with_dp_groups(ctx.structure(b), [&](const std::string& name) { return names.contains(name); });
    shards.parallel.dp.value = shard_from;
    const dp_rewrite_stats d = resize_gradient_group(ctx, b, shards, shard);
    const shape_stats sh = shard_optimizer(b, ctx.structure(b), shard_from, shard, ctx.costs(b).profile.min_kernel_ns, true);
    char line[512];
    std::snprintf(line, sizeof line,
                  "HSDP shard group %d -> %d ranks: the %zu all-gathers and reduce-scatters of the shard groups re-timed by the %s "
                  "profile's NCCL model at %d ranks (%.3f -> %.3f ms), a unit's message the same; the optimizer steps 1/%d of the "
                  "parameters (%zu optimizer kernels %.3f -> %.3f ms)",
                  shard_from, shard, d.collectives, d.profile.c_str(), shard, static_cast<double>(d.before) / 1e6,
                  static_cast<double>(d.after) / 1e6, shard, sh.optimizer, static_cast<double>(sh.before) / 1e6,
                  static_cast<double>(sh.after) / 1e6);
    out.push_back(changed("fsdp", "HSDP shard group", std::to_string(shard_from), std::to_string(shard), line,
                          {time_figure("shard group transfer time", d.before, d.after), time_figure("optimizer kernel time", sh.before, sh.after)}));
  }
  hsdp_insertion hi;
  if (replicas > 1) {
    const shape_costs& costs = ctx.costs(b);
    const model::nccl_model model_of_costs{costs.profile};
    const int tp = ctx.shape_to ? ctx.shape_to->tp : st.parallel.tp.value.value_or(1);
    hi = insert_replica_reduces(b, ctx.job, ctx.structure(b), shard, replicas, tp, ctx.nccl ? ctx.nccl->first : model_of_costs,
                                ctx.nccl ? ctx.nccl->second : costs.hw, costs.profile);
    if (hi.reduces == 0) {
      throw error("whatif --hsdp: no unit reduce-scatter found in a final gradient pass to all-reduce after (" +
                  (hi.skipped.empty() ? std::string("no rank") : hi.skipped.front()) + ")");
    }
    ctx.refresh(b);
    ctx.fsdp_inserted = true;
  }
  char why[1024];
  std::snprintf(why, sizeof why,
                "HSDP %d x %d -> %d x %d (shard group x replicas): %zu traced replica all-reduces removed; %zu all-reduces inserted "
                "on %zu rank(s) as lumos synth --fsdp on --hsdp %d builds them: after the final gradient pass, each unit's reduced "
                "shard (1/%d of its gradients) all-reduced over its %d replicas (DP ranks %d apart at their Megatron ranks) on a "
                "stream of their own, launched with the unit's reduce-scatter and waiting for it, the optimizer waiting for the "
                "last (the first rank: %zu all-reduces of %.1f M elements, %.3f ms by the NCCL model)%s",
                shard_from, replicas_from, shard, replicas, removed, hi.reduces, hi.ranks, shard, shard, replicas, shard, hi.reduces_first,
                static_cast<double>(hi.elements_first) / 1e6, static_cast<double>(hi.reduce_first) / 1e6,
                hi.skipped.empty() ? "" : "; not on some ranks");
  std::string text = why;
  if (!hi.skipped.empty()) text += " (" + hi.skipped.front() + ")";
  out.push_back(changed("fsdp", "HSDP", std::to_string(shard_from) + " x " + std::to_string(replicas_from),
                        std::to_string(shard) + " x " + std::to_string(replicas), text,
                        {count_figure("replica all-reduces removed", removed), count_figure("replica all-reduces inserted", hi.reduces)}));
  ctx.dp_from = dp_from, ctx.dp_to = dp;
  ctx.hsdp_rewritten = true;
  return out;
}

}  // namespace lumos::whatif

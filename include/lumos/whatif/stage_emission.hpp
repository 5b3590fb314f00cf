#pragma once
// Emission of the fine-grained stage split (`split_stages`, whatif/pipeline_graph.hpp): the new
// graph built from a `stage_plan` (whatif/stage_plan.hpp). Each stage gets a copy of every
// processor of its traced ranks holding the tasks the plan keeps there, in the stage's order of
// passes; the traced edges between kept tasks follow (dropped where the new order puts the
// source's pass after the target's), as do the collective instances, renamed per stage. A
// cross-stage transfer is what Megatron runs: the producer's host launches a send kernel on a p2p
// stream after the pass, which waits for the pass's last kernel on the compute stream; the
// consumer's host launches the receive on its own p2p stream before the pass and then waits for
// it and for its compute stream to drain (the torch.cuda.synchronize() after each batched
// transfer); send and receive are one p2p instance, joined, with the NCCL model's time. Without
// traced stages, the tied embedding's gradient all-reduce is added between the end stages. The
// rank maps, kept overheads and iteration plans of the added ranks follow the copies.

#include <lumos/core/error.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/stage_plan.hpp>
#include <lumos/whatif/stage_split.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

namespace detail {

// "rank R ..." with R replaced by `to`; other names unchanged.
[[nodiscard]] inline std::string renumber_name(const std::string& name, int from, int to) {
  const std::string prefix = "rank " + std::to_string(from);
  if (from == to || !name.starts_with(prefix)) return name;
  if (name.size() > prefix.size() && name[prefix.size()] >= '0' && name[prefix.size()] <= '9') return name;
  return "rank " + std::to_string(to) + name.substr(prefix.size());
}

// The host's receive before a pass that receives its input: its launch, then the
// synchronization on the receive's stream, then on the compute stream.
struct receive_post {
  graph::task_id launch = graph::no_task, on_transfer = graph::no_task, on_compute = graph::no_task;
  graph::processor_id thread = 0;  // the traced thread
};

// A planned transfer bound to the tasks emitted for it.
struct emitted_transfer {
  planned_transfer plan;
  graph::task_id producer = graph::no_task, send = graph::no_task;  // the producer's last kernel; the send's launch
  receive_post receive;
  graph::task_id send_arrive = graph::no_task, recv_arrive = graph::no_task;
};

// Builds the split graph from a plan, step by step (`run` gives the order); its maps record where
// each traced task went and what was added, for the steps after.
struct stage_emitter {
  using task_id = graph::task_id;
  using unit_key = std::tuple<int, graph::processor_id, std::int32_t>;  // (stage, traced processor, unit)
  using rank_unit = std::tuple<int, std::size_t, std::int32_t>;        // (stage, traced rank, unit)

  graph::built_job& b;
  const graph::task_graph& g;
  const trace::job& job;
  const stage_plan& plan;
  const stage_geometry& geo;
  const std::vector<report::iteration_plan>& plans;
  const stage_transfer_costs& costs;
  std::size_t n = 0, np = 0, R = 0;
  graph::task_graph ng;
  std::vector<std::vector<task_id>> copy;         // per stage and traced task: its copy
  std::vector<graph::processor_id> processor_at;  // per (stage, traced processor): its copy
  std::map<unit_key, std::pair<task_id, task_id>> ends;  // first and last new task of a unit's runs
  std::map<unit_key, task_id> before;                    // the last new task before a unit's first run
  std::map<rank_unit, task_id> send_launch;              // the host's launch of a unit's send
  std::map<rank_unit, receive_post> receives_posted;     // the host's receive before a unit
  std::map<std::pair<int, std::size_t>, std::vector<task_id>> host_added;  // host tasks added, per (stage, traced rank)
  std::map<std::pair<int, std::size_t>, std::pair<task_id, task_id>> tied_tasks;  // the tied all-reduce's arrive, complete
  std::map<std::pair<int, std::size_t>, task_id> tied_launch;
  // Host tasks added right before a copied task (stage, traced task): they take that task's
  // edges from other threads (a hand-off into the autograd thread, say), so that they run no
  // earlier than it could.
  std::map<std::pair<int, task_id>, task_id> placed_before;
  std::vector<emitted_transfer> transfers;
  stage_split out;

  stage_emitter(graph::built_job& built, const trace::job& j, const stage_plan& p, const std::vector<report::iteration_plan>& traced_plans,
                const stage_transfer_costs& c)
      : b(built), g(built.graph), job(j), plan(p), geo(p.geometry), plans(traced_plans), costs(c), n(built.graph.task_count()),
        np(built.graph.processors.size()), R(j.ranks.size()),
        copy(static_cast<std::size_t>(p.geometry.pp), std::vector<task_id>(built.graph.task_count(), graph::no_task)),
        processor_at(static_cast<std::size_t>(p.geometry.pp) * built.graph.processors.size(), no_processor) {}

  // The copy of each processor on each stage that has it.
  void add_processors() {
    ng.strings = g.strings;
    for (int s = 0; s < geo.pp; ++s) {
      for (graph::processor_id q = 0; q < np; ++q) {
        if (!plan.present[static_cast<std::size_t>(s) * np + q]) continue;
        graph::processor_info info = g.processors[q];
        info.name = renumber_name(info.name, info.rank, geo.new_rank(info.rank, s));
        info.rank = geo.new_rank(info.rank, s);
        processor_at[static_cast<std::size_t>(s) * np + q] = ng.add_processor(std::move(info));
      }
    }
  }

  // A host task of traced rank i on stage s, on the thread `id`, added for the transfers.
  task_id host_task(int s, graph::processor_id id, std::size_t i, std::string_view name, time_ns duration, int rank, time_ns at) {
    graph::task_spec spec;
    spec.kind = graph::task_kind::cpu;
    spec.processor = id;
    spec.name = name;
    spec.duration = duration;
    spec.rank = rank;
    spec.observed_start = spec.observed_end = at;
    const task_id t = ng.add_task(spec);
    host_added[{s, i}].push_back(t);
    return t;
  }

  // The tied embedding's all-reduce of traced rank i on end stage s (its stream `id`).
  void emit_tied(int s, graph::processor_id id, std::size_t i) {
    const int r0 = geo.megatron_rank(job.ranks[i].rank, 0), r1 = geo.megatron_rank(job.ranks[i].rank, geo.pp - 1);
    const p2p_latency& p2p = costs.p2p;
    graph::task_spec spec;
    spec.processor = id;
    spec.rank = geo.new_rank(job.ranks[i].rank, s);
    spec.kind = graph::task_kind::comm_arrive;
    spec.name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
    const task_id a = ng.add_task(spec);
    spec.kind = graph::task_kind::comm_complete;
    spec.duration = p2p.gpus_per_node > 0 && r0 / p2p.gpus_per_node == r1 / p2p.gpus_per_node ? costs.tied->intra : costs.tied->inter;
    const task_id c = ng.add_task(spec);
    tied_tasks[{s, i}] = {a, c};
  }

  void launch_tied(int s, graph::processor_id id, std::size_t i, time_ns at) {
    tied_launch[{s, i}] = host_task(s, id, i, "cudaLaunchKernel", costs.p2p.host, geo.new_rank(job.ranks[i].rank, s), at);
  }

  // A pass that receives its input: the host launches the receive, then waits for it and for its
  // compute stream to drain (Megatron's torch.cuda.synchronize() after the batched send/recv), in
  // the step from its start; before the pass's first kept task `t` on thread q of traced rank i.
  void post_receive(int s, graph::processor_id q, graph::processor_id id, std::size_t i, task_id t, std::int32_t u) {
    const int rank = geo.new_rank(g.rank[t], s);
    receive_post rp;
    rp.launch = host_task(s, id, i, "cudaLaunchKernel", costs.p2p.host, rank, g.observed_start[t]);
    rp.on_transfer = host_task(s, id, i, "cudaStreamSynchronize", 0, rank, g.observed_start[t]);
    rp.on_compute = host_task(s, id, i, "cudaStreamSynchronize", 0, rank, g.observed_start[t]);
    rp.thread = q;
    receives_posted[{s, i, u}] = rp;
    placed_before[{s, t}] = rp.launch;
  }

  // The copy of traced task t on stage s, on its processor's copy `id`.
  task_id copy_task(int s, graph::processor_id q, graph::processor_id id, task_id t) {
    graph::task_spec spec = spec_of(g, t);
    spec.processor = id;
    spec.rank = geo.new_rank(g.rank[t], s);
    spec.name = {};
    spec.name_id = g.name[t];
    const task_id c = copy[static_cast<std::size_t>(s)][t] = ng.add_task(spec);
    const std::int32_t code = plan.code[t];
    if (const auto ms = plan.stream_rank.find(q); ms != plan.stream_rank.end() && code != label_pre && code != label_post) {
      out.pass_stream_tasks[static_cast<std::size_t>(s) * R + ms->second].push_back(c);
    }
    return c;
  }

  // Processor q's copy on stage s: its kept tasks run by run in the stage's order, the receives
  // its host thread posts before a pass, the sends it launches after one, and on the end stages
  // the tied embedding's all-reduce, first of the work after the passes (on the rank's
  // data-parallel stream; launched by the thread that launches its forward passes).
  void emit_processor(int s, graph::processor_id q) {
    const graph::processor_id id = processor_at[static_cast<std::size_t>(s) * np + q];
    if (id == no_processor) return;
    const auto& list = plan.on[q];
    const auto& k = plan.kept[static_cast<std::size_t>(s)];
    const bool end_stage = costs.tied != nullptr && geo.pp > 1 && (s == 0 || s == geo.pp - 1);
    const auto tied_here = end_stage ? plan.index_of_processor.find(q) : plan.index_of_processor.end();
    bool tied_done = tied_here == plan.index_of_processor.end();
    const auto waits_here = plan.index_of_thread.find(q);
    const bool host = waits_here != plan.index_of_thread.end();
    const std::size_t i = host ? waits_here->second.first : 0;
    bool tied_launched = !(end_stage && host && (waits_here->second.second & 1) != 0);
    // Whether this processor is the host thread that launches unit u's pass, and u is marked in
    // `of` (the units that receive, or send).
    auto launches = [&](std::int32_t u, const std::vector<std::vector<std::uint8_t>>& of) {
      if (!host || u == label_pre || u == label_post) return false;
      const bool forward = u < geo.micro_batches * geo.vp;
      return (waits_here->second.second & (forward ? 1 : 2)) != 0 && of[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)] != 0;
    };
    // A unit can have several runs on a processor (a backward pass's B and W alternate): its
    // receive goes before the first kept task of its first run, its send after its last run.
    std::int32_t received = label_unknown;
    task_id previous = graph::no_task;
    const auto& runs = plan.runs[static_cast<std::size_t>(s) * np + q];
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const auto [x, y, u] = runs[r];
      const bool last_run = r + 1 == runs.size() || runs[r + 1].unit != u;
      if (previous != graph::no_task) before.try_emplace({s, q, u}, previous);  // before the first run of the unit
      if (!tied_done && u == label_post) emit_tied(s, id, tied_here->second), tied_done = true;
      if (!tied_launched && u == label_post && x < y) {
        launch_tied(s, id, i, g.observed_start[list[x]]), tied_launched = true;
        placed_before[{s, list[x]}] = tied_launch[{s, i}];
      }
      task_id first = graph::no_task, last = graph::no_task;
      for (std::uint32_t z = x; z < y; ++z) {
        const task_id t = list[z];
        if (!k[t]) continue;
        if (received != u && launches(u, plan.receives)) received = u, post_receive(s, q, id, i, t, u);
        last = copy_task(s, q, id, t);
        if (first == graph::no_task) first = last;
      }
      if (first != graph::no_task) {
        const auto [e, fresh] = ends.try_emplace({s, q, u}, first, last);
        if (!fresh) e->second.second = last;
        previous = last;
      }
      const auto unit_end = ends.find({s, q, u});
      if (last_run && unit_end != ends.end() && launches(u, plan.sends_to)) {
        // A pass whose output another stage reads: the host launches the send after it.
        send_launch[{s, i, u}] = host_task(s, id, i, "cudaLaunchKernel", costs.p2p.host, geo.new_rank(job.ranks[i].rank, s),
                                           ng.observed_end[unit_end->second.second]);
      }
    }
    if (!tied_done) emit_tied(s, id, tied_here->second);
    if (!tied_launched) launch_tied(s, id, i, list.empty() ? 0 : g.observed_end[list.back()]);
  }

  void emit_tasks() {
    std::size_t total = 0;
    for (const auto& k : plan.kept) total += static_cast<std::size_t>(std::count(k.begin(), k.end(), 1));
    ng.reserve(total, g.edge_count() * static_cast<std::size_t>(geo.pp) + static_cast<std::size_t>(4 * geo.micro_batches * geo.pp) * R);
    for (int s = 0; s < geo.pp; ++s) {
      for (graph::processor_id q = 0; q < np; ++q) emit_processor(s, q);
    }
  }

  // A world collective's join is stage 0's; a join across traced stages is its kept stage's.
  [[nodiscard]] task_id copy_of(int s, task_id t) const {
    const std::int32_t js = plan.join_stage[t];
    return plan.world_join[t] ? copy[0][t] : js >= 0 ? copy[static_cast<std::size_t>(js)][t] : copy[static_cast<std::size_t>(s)][t];
  }

  // The last op on t's processor, traced before t, that stage s keeps and runs no later in its
  // order than `target`'s unit (none: no_task).
  [[nodiscard]] task_id last_before_on_stream(int s, task_id t, task_id target) const {
    const auto& line = plan.on[g.processor[t]];
    for (auto it = std::lower_bound(line.begin(), line.end(), t); it != line.begin();) {
      const task_id y = *--it;
      if (plan.pos(s, plan.unit_of(y)) <= plan.pos(s, plan.unit_of(target)) && copy_of(s, y) != graph::no_task) return y;
    }
    return graph::no_task;
  }

  // Every traced edge between two tasks a stage keeps, on that stage (a synchronization
  // re-targeted as the plan says), unless the new order puts its source's pass after its
  // target's. The host tasks placed before a task take its edges from other threads.
  void emit_edges() {
    const int m = geo.micro_batches;
    for (std::size_t x = 0; x < g.edges.size(); ++x) {
      const graph::edge& traced_edge = g.edges[x];
      for (int s = 0; s < geo.pp; ++s) {
        graph::edge e = traced_edge;
        if (const auto r = plan.resync.find({s, x}); r != plan.resync.end()) {
          if (r->second == graph::no_task) continue;
          e.from = r->second;
        }
        task_id from = copy_of(s, e.from);
        const task_id to = copy_of(s, e.to);
        if (from == graph::no_task || to == graph::no_task) continue;
        if (plan.pos(s, plan.unit_of(e.from)) > plan.pos(s, plan.unit_of(e.to))) {
          // A weight gradient moved to its W pass (zero bubble) was the last op of its backward
          // on its stream, which the pass's send waited for (an event recorded after it): that
          // wait now binds the last op the stream runs before it, in the pass that stays. Dropped,
          // the send ran without waiting for the backward: ZB-H1 of llama3-8b TP 2 PP 2 (lumos
          // synth --detail kernel) was 0.9 % faster than the schedule traced directly.
          const task_id stays = geo.zero_bubble && plan.code[e.from] >= 2 * m ? last_before_on_stream(s, e.from, e.to) : graph::no_task;
          if (stays == graph::no_task) {
            ++out.edges_dropped;
            continue;
          }
          e.from = stays, from = copy_of(s, stays);
        }
        if (s > 0 && plan.world_join[e.from] && plan.world_join[e.to]) continue;
        if (plan.join_stage[e.from] >= 0 && plan.join_stage[e.to] >= 0 && s != plan.join_stage[e.from]) continue;
        ng.add_edge(from, to, e.delay, e.kind, e.flags());
        if (g.processor[e.from] == g.processor[e.to]) continue;
        if (const auto pb = placed_before.find({s, e.to}); pb != placed_before.end()) ng.add_edge(from, pb->second, e.delay, e.kind, e.flags());
      }
    }
  }

  // A collective of the whole world, or one across traced stages: one instance over every
  // stage's copies of its participants. A traced transfer whose two stages now sit on nodes of
  // another kind (within one, across two) has its time scaled by the model's ratio.
  void emit_joined_collective(const graph::collective_instance& ci) {
    const bool world = plan.world_join[ci.join] != 0;
    graph::collective_instance nc = ci;
    nc.join = copy_of(0, ci.join);
    nc.arrive.clear(), nc.complete.clear(), nc.group_ranks.clear();
    for (int s = 0; s < geo.pp; ++s) {
      const auto& cp = copy[static_cast<std::size_t>(s)];
      for (std::size_t x = 0; x < ci.arrive.size(); ++x) {
        if (cp[ci.arrive[x]] != graph::no_task && cp[ci.complete[x]] != graph::no_task) {
          nc.arrive.push_back(cp[ci.arrive[x]]), nc.complete.push_back(cp[ci.complete[x]]);
          if (!world) nc.group_ranks.push_back(ng.rank[cp[ci.complete[x]]]);
        }
      }
      for (const int r : ci.group_ranks) {
        if (world && (geo.traced_pp == 1 || geo.traced_stage(r) == geo.source_stage(s))) nc.group_ranks.push_back(geo.new_rank(r, s));
      }
    }
    if (!world && plan.p2p_where[ci.complete.front()] != 1 && ci.complete.size() == 2 && nc.complete.size() == 2) {
      const time_ns traced_time = costs.p2p.between(g.rank[ci.complete[0]], g.rank[ci.complete[1]]);
      auto megatron_of = [&](task_id c) {
        int s = 0;
        while (s + 1 < geo.pp && copy[static_cast<std::size_t>(s)][c] == graph::no_task) ++s;
        return geo.megatron_rank(g.rank[c], s);
      };
      const time_ns after = costs.p2p.between(megatron_of(ci.complete[0]), megatron_of(ci.complete[1]));
      if (traced_time > 0 && after != traced_time) {
        for (const task_id c : nc.complete) {
          ng.duration[c] = static_cast<time_ns>(
              std::llround(static_cast<double>(ng.duration[c]) * static_cast<double>(after) / static_cast<double>(traced_time)));
        }
      }
    }
    if (nc.join != graph::no_task) ng.collectives.push_back(std::move(nc));
  }

  // The traced collective instances: one per stage over its copies (renamed per stage but on
  // merged stages, where each traced group is on one stage), or one across the stages.
  void emit_collectives() {
    for (const graph::collective_instance& ci : g.collectives) {
      if (ci.join != graph::no_task && (plan.world_join[ci.join] || plan.join_stage[ci.join] >= 0)) {
        emit_joined_collective(ci);
        continue;
      }
      for (int s = 0; s < geo.pp; ++s) {
        const auto& cp = copy[static_cast<std::size_t>(s)];
        graph::collective_instance nc = ci;
        if (ci.join != graph::no_task && cp[ci.join] == graph::no_task) continue;
        nc.join = ci.join != graph::no_task ? cp[ci.join] : graph::no_task;
        nc.arrive.clear(), nc.complete.clear();
        for (std::size_t x = 0; x < ci.arrive.size(); ++x) {
          if (cp[ci.arrive[x]] != graph::no_task && cp[ci.complete[x]] != graph::no_task) {
            nc.arrive.push_back(cp[ci.arrive[x]]), nc.complete.push_back(cp[ci.complete[x]]);
          }
        }
        if (nc.complete.empty()) continue;
        for (int& r : nc.group_ranks) r = geo.new_rank(r, s);
        if (s > 0 && !geo.merging) nc.group += ".pp" + std::to_string(s);
        ng.collectives.push_back(std::move(nc));
      }
    }
  }

  // A collective of the whole world (the gradient norm's) whose peers the traces do not hold (one
  // traced rank for symmetric ones): the stages are its peers now, so the copies of traced task t
  // (of rank index i, event `src`'s args) are one instance that completes once the last stage
  // arrives, as in a job with stages, where the stage that finishes its backward passes first
  // waits there.
  void join_world_collective(task_id t, std::size_t i, const trace::rank_trace& tr, std::uint32_t src, std::string_view group,
                             const std::vector<int>& ranks, const std::string& comm) {
    const std::uint32_t ev = g.source[t];
    const auto& arrive_of = b.ranks[i].arrive_of_event;
    const task_id arrive = ev < arrive_of.size() ? arrive_of[ev] : graph::no_task;
    if (arrive == graph::no_task) return;
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
    for (int s = 0; s < geo.pp; ++s) {
      const task_id a = copy[static_cast<std::size_t>(s)][arrive], c = copy[static_cast<std::size_t>(s)][t];
      if (a == graph::no_task || c == graph::no_task) continue;
      for (const int r : ranks) nc.group_ranks.push_back(geo.new_rank(r, s));
      nc.arrive.push_back(a);
      nc.complete.push_back(c);
      ng.add_edge(a, join, 0, graph::edge_kind::collective);
      ng.add_edge(join, c, 0, graph::edge_kind::collective);
      last = std::max(last, ng.observed_start[a]);
    }
    ng.observed_start[join] = ng.observed_end[join] = nc.arrive.empty() ? 0 : last;
    ++out.world_joined;
    ng.collectives.push_back(std::move(nc));
  }

  // Communication ops whose peers are absent from the job (traces of one rank per stage hold a
  // TP group's ops without its other ranks) are no instance: each stage's copy is named and
  // numbered here as an instance's copy is (emit_collectives). Written back under the traced
  // name, a stage's TP all-reduces would be joined with the traced stage's on reading (a cycle
  // through the pipeline's transfers).
  void emit_lone_groups() {
    if (geo.merging) return;
    std::vector<std::optional<comm_args_source>> args(R);
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] != graph::task_kind::gpu_comm || t >= g.source.size() || g.source[t] == ~0U) continue;
      const auto at = geo.index_of_rank.find(g.rank[t]);
      if (at == geo.index_of_rank.end()) continue;
      const trace::rank_trace& tr = job.ranks[at->second];
      if (g.source[t] >= tr.events.size()) continue;
      if (!args[at->second]) args[at->second].emplace(tr);
      const std::uint32_t src = args[at->second]->of(g.source[t]);
      const std::string_view group = tr.arg_text(src, trace::arg_key::process_group_name);
      if (group.empty()) continue;
      const std::vector<int> ranks = graph::detail::parse_rank_list(tr.arg_text(src, trace::arg_key::process_group_ranks));
      const std::string comm = comm_kind(tr.name(tr.events[g.source[t]]), tr.arg_text(src, trace::arg_key::collective_name));
      if (geo.traced_pp == 1 && std::find(plan.world_groups.begin(), plan.world_groups.end(), group) != plan.world_groups.end()) {
        join_world_collective(t, at->second, tr, src, group, ranks, comm);
        continue;
      }
      for (int s = 1; s < geo.pp; ++s) {
        const task_id c = copy[static_cast<std::size_t>(s)][t];
        if (c == graph::no_task) continue;
        graph::collective_instance nc;
        nc.kind = comm;
        nc.group = std::string(group) + ".pp" + std::to_string(s);
        for (const int r : ranks) nc.group_ranks.push_back(geo.new_rank(r, s));
        nc.complete = {c};
        out.lone_groups.push_back(std::move(nc));
      }
    }
  }

  // A receive is posted once the stage's previous pass has been launched on the other host
  // thread too (the autograd thread's backward, say, follows the forward the main thread
  // launched), not as soon as its own thread is free.
  void emit_receive_handoffs() {
    for (const auto& [key, rp] : receives_posted) {
      const auto& [s, i, u] = key;
      const std::int64_t at = plan.pos(s, u);
      if (at <= 0) continue;
      const std::int32_t previous_unit = geo.unit_of_op(plan.orders[static_cast<std::size_t>(s)][static_cast<std::size_t>(at - 1)]);
      for (const graph::processor_id q : plan.main_thread[i]) {
        if (q == rp.thread) continue;
        if (const auto e = ends.find({s, q, previous_unit}); e != ends.end()) {
          ng.add_edge(e->second.second, rp.launch, 0, graph::edge_kind::thread_handoff);
        }
      }
    }
  }

  // The planned transfers whose producer's pass, send launch and receive were emitted.
  void bind_transfers() {
    for (const planned_transfer& x : plan.transfers) {
      const auto from = ends.find({x.from, plan.main_stream[x.i_from], x.from_unit});
      const auto send = send_launch.find({x.from, x.i_from, x.from_unit});
      const auto receive = receives_posted.find({x.to, x.i, x.to_unit});
      if (from == ends.end() || send == send_launch.end() || receive == receives_posted.end()) continue;
      emitted_transfer e;
      e.plan = x, e.producer = from->second.second, e.send = send->second, e.receive = receive->second;
      transfers.push_back(e);
    }
  }

  // Cross-stage transfers: a send kernel on the producer's stream to the next (or previous)
  // stage, after the producer's last kernel of the pass, and a receive kernel on the consumer's
  // stream from it; the consumer's host waits for the receive and for its compute stream. Sends
  // are queued in the producer's order, receives in the consumer's. The p2p streams of (stage,
  // traced rank): 0 receives from the previous stage, 1 from the next, 2 sends to the next, 3 to
  // the previous; numbered after the rank's traced streams.
  void emit_transfer_kernels(std::vector<std::size_t>& by) {
    const p2p_latency& p2p = costs.p2p;
    std::map<std::tuple<int, std::size_t, int>, graph::processor_id> p2p_streams;
    std::vector<std::int64_t> stream_base(R, 0);
    for (graph::processor_id q = 0; q < np; ++q) {
      const auto& info = g.processors[q];
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
        info.rank = geo.new_rank(job.ranks[i].rank, s);
        info.owner = g.processors[plan.main_stream[i]].owner;
        info.index = stream_base[i] + which;
        info.name = "rank " + std::to_string(info.rank) + " stream " + std::to_string(info.index) + " (" + what[static_cast<std::size_t>(which)] + ")";
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
    auto time_of = [&](const planned_transfer& x) {
      return p2p.between(geo.megatron_rank(job.ranks[x.i_from].rank, x.from), geo.megatron_rank(job.ranks[x.i].rank, x.to));
    };
    order_transfers(by, [&](const planned_transfer& x) { return std::tuple(x.from, x.i_from, x.forward, plan.pos(x.from, x.from_unit)); });
    for (const std::size_t k : by) {
      emitted_transfer& x = transfers[k];
      const int rank = geo.new_rank(job.ranks[x.plan.i_from].rank, x.plan.from);
      x.send_arrive = comm_pair(p2p_stream(x.plan.from, x.plan.i_from, x.plan.forward ? 2 : 3), rank, time_of(x.plan), ng.observed_end[x.send]);
      ng.add_edge(x.send, x.send_arrive, p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
      ng.add_edge(x.producer, x.send_arrive, 0, graph::edge_kind::dependency);
    }
    order_transfers(by, [&](const planned_transfer& x) { return std::tuple(x.to, x.i, x.forward, plan.pos(x.to, x.to_unit)); });
    for (const std::size_t k : by) {
      emitted_transfer& x = transfers[k];
      const int rank = geo.new_rank(job.ranks[x.plan.i].rank, x.plan.to);
      x.recv_arrive = comm_pair(p2p_stream(x.plan.to, x.plan.i, x.plan.forward ? 0 : 1), rank, time_of(x.plan), ng.observed_end[x.receive.launch]);
      ng.add_edge(x.receive.launch, x.recv_arrive, p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
      ng.add_edge(x.recv_arrive + 1, x.receive.on_transfer, 0, graph::edge_kind::sync);
      if (const auto drain = before.find({x.plan.to, plan.main_stream[x.plan.i], x.plan.to_unit}); drain != before.end()) {
        ng.add_edge(drain->second, x.receive.on_compute, 0, graph::edge_kind::sync);
      }
    }
  }

  // Stable-sorts the transfer indices `by` by `key` of each transfer's plan.
  template <class Key>
  void order_transfers(std::vector<std::size_t>& by, Key&& key) const {
    std::stable_sort(by.begin(), by.end(), [&](std::size_t a, std::size_t c) { return key(transfers[a].plan) < key(transfers[c].plan); });
  }

  // Each send and its receive joined as one p2p instance. Each (direction, producer stage and
  // chunk, traced rank) is one group whose k-th send pairs with its k-th receive, as NCCL orders a
  // communicator's p2p operations.
  void emit_transfer_joins(std::vector<std::size_t>& by) {
    order_transfers(by, [&](const planned_transfer& x) { return std::tuple(x.i, x.forward, x.from, x.chunk, plan.pos(x.from, x.from_unit)); });
    std::string group;
    graph::processor_id group_barrier = 0;
    std::int64_t sequence = 0;
    for (const std::size_t k : by) {
      const emitted_transfer& x = transfers[k];
      const int rank = job.ranks[x.plan.i].rank;
      const std::string name = std::string(x.plan.forward ? "pp.fwd." : "pp.bwd.") + std::to_string(x.plan.from) + "-" +
                               std::to_string(x.plan.to) + ".c" + std::to_string(x.plan.chunk) + ".r" + std::to_string(rank);
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
      ci.group_ranks = {geo.new_rank(job.ranks[x.plan.i_from].rank, x.plan.from), geo.new_rank(rank, x.plan.to)};
      ci.bytes = costs.p2p.bytes;
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
  }

  void emit_transfers() {
    std::vector<std::size_t> by(transfers.size());
    std::iota(by.begin(), by.end(), std::size_t{0});
    emit_transfer_kernels(by);
    emit_transfer_joins(by);
  }

  // The tied embedding's all-reduce: joined across the end stages, after each one's last pass
  // (its last kernel on the compute stream), before the work after the passes there. Returns
  // how many were added.
  std::size_t emit_tied_reduces() {
    std::size_t count = 0;
    const int pp = geo.pp;
    for (std::size_t i = 0; i < R && costs.tied != nullptr && pp > 1; ++i) {
      const auto a = tied_tasks.find({0, i}), z = tied_tasks.find({pp - 1, i});
      if (a == tied_tasks.end() || z == tied_tasks.end()) continue;
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
      ci.bytes = costs.tied->bytes / 4;
      ci.join = join;
      ci.match = "added by the pipeline what-if (tied embedding)";
      time_ns last_arrival = 0;
      for (const auto& [stage, ac] : {std::pair{0, a->second}, std::pair{pp - 1, z->second}}) {
        ci.group_ranks.push_back(geo.new_rank(job.ranks[i].rank, stage));
        ci.arrive.push_back(ac.first);
        ci.complete.push_back(ac.second);
        ng.add_edge(ac.first, join, 0, graph::edge_kind::collective);
        ng.add_edge(join, ac.second, 0, graph::edge_kind::collective);
        if (const auto l = tied_launch.find({stage, i}); l != tied_launch.end()) {
          ng.add_edge(l->second, ac.first, costs.p2p.host, graph::edge_kind::launch, graph::edge_flags::from_start);
        }
        const std::int32_t last_unit = geo.unit_of_op(plan.orders[static_cast<std::size_t>(stage)].back());
        if (const auto e = ends.find({stage, plan.main_stream[i], last_unit}); e != ends.end()) {
          ng.add_edge(e->second.second, ac.first, 0, graph::edge_kind::dependency);
          const time_ns at = ng.observed_end[e->second.second];
          ng.observed_start[ac.first] = ng.observed_end[ac.first] = ng.observed_start[ac.second] = ng.observed_end[ac.second] = at;
          last_arrival = std::max(last_arrival, at);
        }
        if (const auto e = ends.find({stage, plan.main_stream[i], label_post}); e != ends.end()) {
          ng.add_edge(ac.second, e->second.first, 0, graph::edge_kind::dependency);
        }
      }
      ng.observed_start[join] = ng.observed_end[join] = last_arrival;
      ng.collectives.push_back(std::move(ci));
      ++count;
    }
    return count;
  }

  // The stage whose copy traced rank i's maps read: stage 0, with traced stages the first of its
  // block (−1: merged away).
  [[nodiscard]] int home(std::size_t i) const { return geo.first_stage(geo.stage_of[i]); }
  // Whether stage s's copy of traced rank i is an added rank.
  [[nodiscard]] bool added(std::size_t i, int s) const {
    return geo.traced_pp > 1 ? geo.source_stage(s) == geo.stage_of[i] && s != home(i) : s > 0;
  }

  // Maps: the traced ranks read their home stage, the added ranks their own stage; kept
  // overheads follow every copy.
  void remap_ranks() {
    using graph::no_task;
    for (int s = 0; s < geo.pp; ++s) {
      const auto& cp = copy[static_cast<std::size_t>(s)];
      for (std::size_t i = 0; i < plans.size() && i < R; ++i) {
        if (!added(i, s)) continue;
        graph::rank_map m2 = b.ranks[i];
        m2.rank = geo.new_rank(m2.rank, s);
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
      for (int s = 0; s < geo.pp; ++s) {
        if (const task_id c = copy[static_cast<std::size_t>(s)][k.task]; c != no_task) kd.push_back({c, k.kind, k.amount, k.at});
      }
    }
    b.kept = std::move(kd);
  }

  // The plan of stage s's copy of traced rank i: the traced rank's plan on the stage's copies,
  // with the host tasks, transfers and tied all-reduce added there.
  [[nodiscard]] report::iteration_plan added_plan(int s, std::size_t i) const {
    using graph::no_task;
    const auto& cp = copy[static_cast<std::size_t>(s)];
    const report::iteration_plan& from = plans[i];
    report::iteration_plan p;
    p.rank = geo.new_rank(from.rank, s);
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
    for (const emitted_transfer& x : transfers) {
      if (x.plan.i != i || (x.plan.from != s && x.plan.to != s)) continue;
      for (const task_id a : {x.plan.from == s ? x.send_arrive : no_task, x.plan.to == s ? x.recv_arrive : no_task}) {
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
    if (const auto t = tied_tasks.find({s, i}); t != tied_tasks.end() && s == geo.pp - 1) {
      p.gpu.push_back(t->second.second);
      p.comm.emplace_back(t->second.first, t->second.second);
    }
    return p;
  }

  void add_plans() {
    for (int s = 0; s < geo.pp; ++s) {
      for (std::size_t i = 0; i < plans.size() && i < R; ++i) {
        if (!added(i, s)) continue;
        out.plans.push_back(added_plan(s, i));
        out.traced_index.push_back(i);
        out.stage.push_back(s);
      }
    }
  }

  // Zero bubble: the tasks of the split graph that run in a W pass.
  void mark_weight_passes() {
    if (!geo.zero_bubble) return;
    out.weight_pass.assign(ng.task_count(), 0);
    for (const auto& cp : copy) {
      for (task_id t = 0; t < n; ++t) {
        const std::int32_t c = plan.code[t];
        if (cp[t] != graph::no_task && c != label_pre && c != label_post && c >= 2 * geo.micro_batches) out.weight_pass[cp[t]] = 1;
      }
    }
  }

  // Every step in order; the split graph replaces `b`'s.
  stage_split run() {
    out.schedule = geo.schedule;
    out.stages = geo.pp, out.chunks = geo.vp, out.micro_batches = geo.micro_batches;
    out.world = geo.width;
    out.tasks_before = n;
    out.weight_ops = plan.weight_ops;
    out.pass_stream_tasks.assign(static_cast<std::size_t>(geo.pp) * R, {});
    add_processors();
    emit_tasks();
    out.tasks_after = ng.task_count();
    emit_edges();
    emit_collectives();
    emit_lone_groups();
    emit_receive_handoffs();
    bind_transfers();
    emit_transfers();
    out.tied_reduces = emit_tied_reduces();
    remap_ranks();
    add_plans();
    mark_weight_passes();
    b.graph = std::move(ng);
    out.change = stage_split_change(geo, out, costs, R);
    return std::move(out);
  }
};

}  // namespace detail

/// Builds the split graph of `plan` (made by `plan_stages` on `b`, not edited since) into `b`:
/// the graph, its rank maps (the traced ranks' point to their home stage's copies; dropped ranks'
/// to nothing) and its kept overheads. `plans`: the traced ranks' iteration plans on `b` before,
/// from which the added ranks' are made. Returns what was made (`stage_split`). Throws
/// `lumos::error` when `b` is not the graph planned. O(tasks × stages + edges × stages).
[[nodiscard]] inline stage_split emit_stages(graph::built_job& b, const trace::job& job, const stage_plan& plan,
                                             const std::vector<report::iteration_plan>& plans, const stage_transfer_costs& costs) {
  if (b.graph.task_count() != plan.tasks || b.graph.processors.size() != plan.processors) {
    throw error("whatif --pp: the graph to split is not the one planned (" + std::to_string(b.graph.task_count()) + " tasks, " +
                std::to_string(plan.tasks) + " planned)");
  }
  return detail::stage_emitter(b, job, plan, plans, costs).run();
}

}  // namespace lumos::whatif

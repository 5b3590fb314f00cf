#pragma once
// Critical path of a replay: the chain of tasks and edges that fixed the end of an iteration,
// with its time attributed to CPU, launch, GPU compute, GPU communication, synchronisation
// wait and idle gaps (docs/replay.md, "Metrics").

#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/sim/replay.hpp>

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

namespace lumos::report {

/// Where critical-path time goes.
/// `sync_wait`: a GPU op or a thread held by another stream or thread beyond a typical gap;
/// `peer_wait`: a communication op waiting for partners absent from the job (kept as measured);
/// `launch` and `idle` (CPU idle, stream gaps, sync tails) are overheads a what-if keeps.
enum class path_category : std::uint8_t { cpu, launch, gpu_compute, gpu_comm, sync_wait, peer_wait, idle };
inline constexpr std::size_t path_category_count = 7;

[[nodiscard]] constexpr std::string_view to_string(path_category c) noexcept {
  constexpr std::array<std::string_view, path_category_count> names = {"cpu",       "launch",    "gpu_compute", "gpu_comm",
                                                                       "sync_wait", "peer_wait", "idle"};
  return names[static_cast<std::size_t>(c)];
}

/// One piece of the path: [begin, end) spent in `category`, on or into `task`.
struct path_segment {
  graph::task_id task = graph::no_task;
  path_category category = path_category::idle;
  time_ns begin = 0;
  time_ns end = 0;
};

struct critical_path {
  std::vector<path_segment> segments;  ///< in time order
  std::array<time_ns, path_category_count> total{};
  time_ns begin = 0, end = 0;
};

namespace detail {

[[nodiscard]] inline path_category own_category(graph::task_kind k) noexcept {
  switch (k) {
    case graph::task_kind::cpu: return path_category::cpu;
    case graph::task_kind::cpu_blocking: return path_category::idle;  // the return of a sync: an overhead
    case graph::task_kind::gpu_compute: return path_category::gpu_compute;
    case graph::task_kind::gpu_comm:
    case graph::task_kind::comm_complete: return path_category::gpu_comm;
    case graph::task_kind::comm_arrive:
    case graph::task_kind::join: return path_category::sync_wait;
  }
  return path_category::idle;
}

[[nodiscard]] inline path_category edge_category(graph::edge_kind k) noexcept {
  switch (k) {
    case graph::edge_kind::launch: return path_category::launch;
    case graph::edge_kind::thread_handoff: return path_category::idle;
    case graph::edge_kind::collective: return path_category::peer_wait;
    case graph::edge_kind::cross_stream:
    case graph::edge_kind::sync:
    case graph::edge_kind::dependency: return path_category::sync_wait;
  }
  return path_category::idle;
}

}  // namespace detail

/// Walks back from `last` (the task whose finish ends the window) to `stop_at` (the window's
/// start), following at each task the constraint that fixed its finish, then its start.
/// O(tasks + edges) for the indexes, then linear in the path length.
[[nodiscard]] inline critical_path trace_critical_path(const graph::task_graph& g, const graph::compiled_graph& c,
                                                       const sim::record_timeline& t, graph::task_id last,
                                                       time_ns stop_at) {
  critical_path path;
  if (last == graph::no_task) return path;
  if (g.edges_released()) {
    throw error("critical path: the graph's edges were released after the compile (report::replay_options::release_edges)");
  }
  const std::size_t n = g.task_count();
  // Incoming edges by task, and the previous task of each task on its processor.
  std::vector<std::uint32_t> in_begin(n + 1, 0);
  for (const auto& e : g.edges) ++in_begin[e.to + 1];
  for (std::size_t i = 0; i < n; ++i) in_begin[i + 1] += in_begin[i];
  std::vector<std::uint32_t> in_edge(g.edges.size());
  {
    std::vector<std::uint32_t> fill(in_begin.begin(), in_begin.end() - 1);
    for (std::uint32_t k = 0; k < g.edges.size(); ++k) in_edge[fill[g.edges[k].to]++] = k;
  }
  std::vector<graph::task_id> previous(n, graph::no_task);
  {
    std::vector<graph::task_id> seen(g.processors.size(), graph::no_task);
    for (std::uint32_t pos = 0; pos < c.size(); ++pos) {
      const graph::task_id id = c.task[pos];
      previous[id] = seen[g.processor[id]];
      seen[g.processor[id]] = id;
    }
  }
  auto start_of = [&](graph::task_id id) { return t.start_of(c.position_of(id)); };
  auto end_of = [&](graph::task_id id) { return t.finish_of(c.position_of(id)); };
  auto add = [&](graph::task_id id, path_category cat, time_ns b, time_ns e) {
    if (e > b) path.segments.push_back({id, cat, b, e});
  };

  // The walk is at one end of `cur`: its finish (then: what fixed it, and its own duration) or
  // its start (then: which edge or processor predecessor fixed it).
  graph::task_id cur = last;
  bool at_finish = true;
  path.end = end_of(cur);
  while (cur != graph::no_task) {
    const time_ns s = start_of(cur), f = end_of(cur);
    if (at_finish) {
      if (f <= stop_at) break;
      const time_ns own = c.duration(c.position_of(cur));
      graph::task_id waited = graph::no_task;
      if (f > s + own) {  // a finish edge (a wait for the GPU) fixed the finish
        for (std::uint32_t k = in_begin[cur]; k < in_begin[cur + 1]; ++k) {
          const auto& e = g.edges[in_edge[k]];
          if (e.finish && end_of(e.from) + e.delay == f) {
            waited = e.from;
            break;
          }
        }
      }
      if (waited != graph::no_task) {
        add(cur, path_category::idle, end_of(waited), f);  // the call's return after the wait (its tail)
        cur = waited;
        continue;
      }
      add(cur, detail::own_category(g.kind[cur]), s, f);
      at_finish = false;
      continue;
    }
    if (s <= stop_at) break;
    // The start: busy CPU time right before it, then a start edge or the processor (its
    // previous task plus the idle gap).
    const time_ns busy = c.post(g, c.position_of(cur));
    const time_ns ready = s - busy;
    add(cur, path_category::cpu, ready, s);
    graph::task_id next = graph::no_task;
    for (std::uint32_t k = in_begin[cur]; k < in_begin[cur + 1]; ++k) {
      const auto& e = g.edges[in_edge[k]];
      const time_ns base = e.from_start ? start_of(e.from) : end_of(e.from);
      if (!e.finish && base + e.delay == ready) {
        next = e.from;
        add(cur, detail::edge_category(e.kind), base, ready);
        at_finish = !e.from_start;  // a launch edge continues from the call's start
        break;
      }
    }
    if (next == graph::no_task) {
      next = previous[cur];
      add(cur, path_category::idle, next != graph::no_task ? end_of(next) : 0, ready);
      at_finish = true;
    }
    cur = next;
  }
  std::reverse(path.segments.begin(), path.segments.end());
  // Keep what lies inside the window.
  for (auto& seg : path.segments) seg.begin = std::max(seg.begin, stop_at);
  std::erase_if(path.segments, [](const path_segment& seg) { return seg.end <= seg.begin; });
  path.begin = path.segments.empty() ? path.end : path.segments.front().begin;
  for (const auto& seg : path.segments) path.total[static_cast<std::size_t>(seg.category)] += seg.end - seg.begin;
  return path;
}

/// The critical path of one rank's iteration in a replay: from the task that ends its window.
[[nodiscard]] inline critical_path iteration_critical_path(const graph::task_graph& g, const graph::compiled_graph& c,
                                                           const sim::record_timeline& t, const iteration_plan& plan,
                                                           const window_result& simulated) {
  const task_times times = simulated_times(t, c);
  graph::task_id last = plan.last_cpu;
  const time_ns cpu_end = last != graph::no_task ? times.end_of(last) + plan.tail_idle + plan.tail_busy : std::numeric_limits<time_ns>::min();
  time_ns last_end = cpu_end;
  // A GPU op that ends with the annotation is what the annotation waited for: the walk starts
  // from it (an annotation written to end with the step's last kernel ends exactly there).
  for (const auto id : plan.gpu) {
    if (times.end_of(id) > last_end || (times.end_of(id) == last_end && last == plan.last_cpu)) {
      last_end = times.end_of(id);
      last = id;
    }
  }
  if (!plan.annotated) {
    for (const auto id : plan.cpu) {
      if (times.end_of(id) > last_end) {
        last_end = times.end_of(id);
        last = id;
      }
    }
  }
  critical_path path = trace_critical_path(g, c, t, last, simulated.window.begin);
  if (last == plan.last_cpu && last != graph::no_task && cpu_end > path.end) {
    // The annotation's tail after its last task (CPU work or idle the trace did not break down).
    const time_ns from = std::max(path.end, simulated.window.begin);
    path.segments.push_back({last, plan.tail_busy > plan.tail_idle ? path_category::cpu : path_category::idle, from, cpu_end});
    path.total[static_cast<std::size_t>(path.segments.back().category)] += cpu_end - from;
    if (path.segments.size() == 1) path.begin = from;
    path.end = cpu_end;
  }
  return path;
}

}  // namespace lumos::report

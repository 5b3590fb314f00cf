#pragma once
// Iteration windows and per-rank / per-job results of a replay (FIDELITY.md "Metrics").

#include <lumos/core/error.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/summary.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace lumos::report {

/// Times of every task (by task id) in one timeline: the measured one (observed) or a replay.
struct task_times {
  const large_vector<time_ns>* start = nullptr;
  const large_vector<time_ns>* finish = nullptr;
  const graph::compiled_graph* positions = nullptr;  ///< null: indexed by task id directly

  [[nodiscard]] time_ns begin_of(graph::task_id t) const noexcept {
    return (*start)[positions ? positions->position[t] : t];
  }
  [[nodiscard]] time_ns end_of(graph::task_id t) const noexcept {
    return (*finish)[positions ? positions->position[t] : t];
  }
};

[[nodiscard]] inline task_times observed_times(const graph::task_graph& g) {
  return {&g.observed_start, &g.observed_end, nullptr};
}

/// Which tasks make up one rank's iteration, chosen once from the measured timeline and then
/// evaluated on any timeline (so measured and simulated windows use the same definition).
struct iteration_plan {
  int rank = 0;
  std::string step;                 ///< "ProfilerStep#N", or "trace window"
  bool annotated = false;
  graph::task_id first_cpu = graph::no_task;  ///< first CPU task inside the annotation
  graph::task_id last_cpu = graph::no_task;   ///< last CPU task inside it
  time_ns lead = 0;                 ///< annotation start → first task start (observed)
  time_ns tail = 0;                 ///< last task end → annotation end (observed)
  std::vector<graph::task_id> cpu;  ///< every CPU task of the rank inside the window (whole-trace: all)
  std::vector<graph::task_id> gpu;  ///< GPU ops launched inside the annotation (whole trace: all)
  std::vector<std::pair<graph::task_id, graph::task_id>> comm;  ///< (arrive or op, complete or op)
  std::vector<graph::task_id> compute;
};

/// A window on one timeline, and what happened in it.
struct window_result {
  interval window;
  breakdown split;
  utilization sm;
};

[[nodiscard]] inline window_result evaluate(const iteration_plan& p, const task_times& t) {
  window_result r;
  time_ns begin = std::numeric_limits<time_ns>::max(), end = std::numeric_limits<time_ns>::min();
  if (p.annotated) {
    begin = t.begin_of(p.first_cpu) - p.lead;
    end = t.end_of(p.last_cpu) + p.tail;
  } else {
    for (const auto id : p.cpu) {
      begin = std::min(begin, t.begin_of(id));
      end = std::max(end, t.end_of(id));
    }
    for (const auto id : p.gpu) begin = std::min(begin, t.begin_of(id));
  }
  for (const auto id : p.gpu) end = std::max(end, t.end_of(id));
  if (begin > end) begin = end = 0;
  r.window = {begin, end};
  std::vector<interval> compute, comm, all;
  compute.reserve(p.compute.size());
  for (const auto id : p.compute) compute.push_back({t.begin_of(id), t.end_of(id)});
  for (const auto& [a, c] : p.comm) comm.push_back({t.begin_of(a), t.end_of(c)});
  all = compute;
  all.insert(all.end(), comm.begin(), comm.end());
  r.split = compute_breakdown(std::move(compute), std::move(comm), r.window);
  r.sm = sm_utilization(std::move(all), r.window);
  return r;
}

/// Plans every rank's iteration: `step` picks ProfilerStep#N (default: the last one every rank
/// has); a rank without ProfilerStep annotations uses its whole trace window.
[[nodiscard]] inline std::vector<iteration_plan> plan_iterations(const trace::job& job, const graph::built_job& b,
                                                                 std::optional<int> step = std::nullopt) {
  const graph::task_graph& g = b.graph;
  // Default step: the largest number present on every rank that has steps.
  std::optional<int> chosen = step;
  if (!chosen) {
    std::optional<int> common;
    for (const auto& r : job.ranks) {
      const auto steps = trace::profiler_steps(r);
      if (steps.empty()) continue;
      int best = std::numeric_limits<int>::min();
      for (const auto& s : steps) best = std::max(best, s.number);
      common = common ? std::min(*common, best) : best;
    }
    chosen = common;
  }
  // Tasks of each rank, split by side.
  std::vector<iteration_plan> plans(job.ranks.size());
  std::vector<std::vector<graph::task_id>> cpu_of(job.ranks.size()), gpu_of(job.ranks.size());
  std::vector<int> rank_index_of;  // rank number → index
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    const int rk = job.ranks[i].rank;
    if (rk >= 0) {
      if (static_cast<std::size_t>(rk) >= rank_index_of.size()) rank_index_of.resize(static_cast<std::size_t>(rk) + 1, -1);
      rank_index_of[static_cast<std::size_t>(rk)] = static_cast<int>(i);
    }
  }
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    const int rk = g.rank[t];
    if (rk < 0 || static_cast<std::size_t>(rk) >= rank_index_of.size() || rank_index_of[static_cast<std::size_t>(rk)] < 0) continue;
    const auto i = static_cast<std::size_t>(rank_index_of[static_cast<std::size_t>(rk)]);
    const auto k = g.kind[t];
    if (k == graph::task_kind::cpu || k == graph::task_kind::cpu_blocking) cpu_of[i].push_back(t);
    else if (k != graph::task_kind::join) gpu_of[i].push_back(t);
  }
  // When each GPU op was launched: the observed start of its launching call.
  std::vector<time_ns> launch_time(g.task_count(), std::numeric_limits<time_ns>::min());
  for (const auto& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launch_time[e.to] = g.observed_start[e.from];
  }
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    const trace::rank_trace& r = job.ranks[i];
    const graph::rank_map& map = b.ranks[i];
    iteration_plan& p = plans[i];
    p.rank = r.rank;
    const trace::profiler_step* annotation = nullptr;
    const auto steps = trace::profiler_steps(r);
    if (step && !steps.empty()) {
      const bool found = std::any_of(steps.begin(), steps.end(), [&](const auto& s) { return s.number == *step; });
      if (!found) throw error(r.file + ": no ProfilerStep#" + std::to_string(*step) + " (the trace has " +
                              steps.front().name + " to " + steps.back().name + ")");
    }
    for (const auto& s : steps) {
      if (chosen && s.number == *chosen) annotation = &s;
    }
    time_ns a_begin = 0, a_end = 0;
    std::uint32_t lane = 0;
    if (annotation != nullptr) {
      p.step = annotation->name;
      a_begin = annotation->start + map.offset;
      a_end = annotation->start + annotation->dur + map.offset;
      lane = r.events[annotation->event].lane;
    } else {
      p.step = "trace window";
    }
    // CPU tasks inside the annotation; the first and last on the annotation's own thread.
    for (const auto t : cpu_of[i]) {
      if (annotation == nullptr) {
        p.cpu.push_back(t);
        continue;
      }
      if (g.observed_start[t] < a_begin || g.observed_end[t] > a_end) continue;
      p.cpu.push_back(t);
      const auto src = g.source[t];
      const bool on_lane = src != ~0U ? r.events[src].lane == lane : false;
      if (!on_lane) continue;
      if (p.first_cpu == graph::no_task || g.observed_start[t] < g.observed_start[p.first_cpu]) p.first_cpu = t;
      if (p.last_cpu == graph::no_task || g.observed_end[t] >= g.observed_end[p.last_cpu]) p.last_cpu = t;
    }
    if (annotation != nullptr && p.first_cpu == graph::no_task) {
      // No runtime call on the annotation's thread: use every CPU task inside it.
      for (const auto t : p.cpu) {
        if (p.first_cpu == graph::no_task || g.observed_start[t] < g.observed_start[p.first_cpu]) p.first_cpu = t;
        if (p.last_cpu == graph::no_task || g.observed_end[t] >= g.observed_end[p.last_cpu]) p.last_cpu = t;
      }
    }
    p.annotated = annotation != nullptr && p.first_cpu != graph::no_task;
    if (p.annotated) {
      p.lead = g.observed_start[p.first_cpu] - a_begin;
      p.tail = a_end - g.observed_end[p.last_cpu];
    }
    // GPU ops launched inside the annotation: their launch (or, without one, their start) is in it.
    for (const auto t : gpu_of[i]) {
      const auto k = g.kind[t];
      if (k == graph::task_kind::comm_arrive) continue;  // taken with its complete
      const auto src = g.source[t];
      const graph::task_id arrive = (k == graph::task_kind::comm_complete && src != ~0U) ? map.arrive_of_event[src] : graph::no_task;
      const graph::task_id first = arrive != graph::no_task ? arrive : t;
      const time_ns enqueue = launch_time[first] != std::numeric_limits<time_ns>::min() ? launch_time[first] : g.observed_start[first];
      if (p.annotated && (enqueue < a_begin || enqueue > a_end)) continue;
      p.gpu.push_back(t);
      if (k == graph::task_kind::gpu_compute) {
        p.compute.push_back(t);
      } else if (k == graph::task_kind::comm_complete) {
        p.comm.push_back({first, t});
        if (arrive != graph::no_task) p.gpu.push_back(arrive);
      } else {
        p.comm.push_back({t, t});
      }
    }
  }
  return plans;
}

}  // namespace lumos::report

#pragma once
// Leave-one-step-out validation (docs/replay.md, "Leave-one-step-out"): the graph of step N, with its overheads, is given the measured op durations of step
// M of the same trace; replaying it predicts step M, which the trace measured. The truth was
// produced by the GPU, not by the code under test.

#include <lumos/graph/task_graph.hpp>
#include <lumos/report/iteration.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace lumos::report {

/// How many tasks of the target step found their counterpart in the source step.
struct substitution {
  std::size_t matched = 0;
  std::size_t unmatched = 0;  ///< kept their own durations (the steps differ there)
  std::size_t source = 0;     ///< tasks of the source step that could be matched
  /// The two steps ran the same ops (within 5 %): the step's structure stands for the other's.
  /// Steps differ when the profiler starts mid-step, a compiled graph changes, or allocator and
  /// logging calls come and go.
  [[nodiscard]] bool comparable() const noexcept {
    const std::size_t target = matched + unmatched;
    const std::size_t diff = target > source ? target - source : source - target;
    return 20 * unmatched <= target && 20 * diff <= target;
  }
};

/// Gives the tasks of `into` (one rank's plan of step N) the measured durations of the same
/// tasks in `from` (the same rank's plan of step M): the k-th task of a name on a processor in
/// N takes the own time of the k-th task of that name on that processor in M. Substituted:
/// GPU op durations (kernels, copies, transfers, and the peer wait of communication ops whose
/// partners are absent) and CPU busy time (runtime calls and the operator time before them).
/// Kept from N: idle gaps, launch latencies, stream gaps, sync tails — the overheads.
/// O(tasks of both steps · log + edges).
inline substitution substitute_durations(graph::task_graph& g, const iteration_plan& into, const iteration_plan& from) {
  using key = std::pair<graph::processor_id, string_id>;
  auto group = [&](const iteration_plan& p) {
    std::vector<graph::task_id> tasks = p.cpu;
    tasks.insert(tasks.end(), p.gpu.begin(), p.gpu.end());
    std::sort(tasks.begin(), tasks.end(), [&](graph::task_id a, graph::task_id b) {
      return g.observed_start[a] != g.observed_start[b] ? g.observed_start[a] < g.observed_start[b] : a < b;
    });
    std::map<key, std::vector<graph::task_id>> groups;
    for (const graph::task_id t : tasks) groups[{g.processor[t], g.name[t]}].push_back(t);
    return groups;
  };
  // The kept peer wait of an unmatched communication op is the delay of its arrive → op edge.
  std::map<graph::task_id, std::size_t> wait_edge;
  for (std::size_t e = 0; e < g.edges.size(); ++e) {
    if (g.edges[e].kind == graph::edge_kind::collective && g.kind[g.edges[e].to] == graph::task_kind::gpu_comm) {
      wait_edge[g.edges[e].to] = e;
    }
  }
  const auto target = group(into);
  const auto source = group(from);
  substitution out;
  for (const auto& [k, tasks] : source) {
    for (const graph::task_id t : tasks) out.source += g.kind[t] != graph::task_kind::comm_arrive && g.kind[t] != graph::task_kind::cpu_blocking;
  }
  for (const auto& [k, tasks] : target) {
    const auto it = source.find(k);
    const std::size_t n = it == source.end() ? 0 : it->second.size();
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const graph::task_id t = tasks[i];
      if (g.kind[t] == graph::task_kind::comm_arrive || g.kind[t] == graph::task_kind::cpu_blocking) continue;
      if (i >= n) {
        ++out.unmatched;
        continue;
      }
      const graph::task_id s = it->second[i];
      ++out.matched;
      g.duration[t] = g.duration[s];
      if (g.kind[t] == graph::task_kind::cpu) g.busy_gap[t] = g.busy_gap[s];
      if (g.kind[t] == graph::task_kind::gpu_comm) {
        const auto wt = wait_edge.find(t), ws = wait_edge.find(s);
        if (wt != wait_edge.end() && ws != wait_edge.end()) g.edges[wt->second].delay = g.edges[ws->second].delay;
      }
    }
  }
  return out;
}

/// Measured GPU busy time of a plan: the sum of its ops' own measured durations (compute and
/// communication, waits included), for the "scale by GPU busy time" baseline.
[[nodiscard]] inline time_ns measured_gpu_busy(const graph::task_graph& g, const iteration_plan& p) {
  time_ns total = 0;
  for (const graph::task_id t : p.compute) total += g.observed_end[t] - g.observed_start[t];
  for (const auto& [a, c] : p.comm) total += g.observed_end[c] - g.observed_start[a];
  return total;
}

}  // namespace lumos::report

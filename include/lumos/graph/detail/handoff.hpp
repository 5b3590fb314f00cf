#pragma once
// Hand-offs: CPU → CPU edges across threads of one rank.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::handoffs(std::size_t r, std::vector<cpu_task_info>& tasks) {
  task_graph& g = part_of(r);
  rank_state& s = ranks_[r];
  if (tasks.empty()) return;
  std::vector<std::size_t> by_end(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) by_end[i] = i;
  // Stably by end (ties in task order): each thread's tasks, in the order they were made, end
  // nearly in order, so the sort merges a few runs.
  sort_runs(by_end.begin(), by_end.end(), [&](std::size_t a, std::size_t b) { return tasks[a].end < tasks[b].end; });
  std::vector<bool> first_on_lane(tasks.size(), false);
  {
    std::vector<bool> seen;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].lane_slot >= seen.size()) seen.resize(tasks[i].lane_slot + 1, false);
      if (!seen[tasks[i].lane_slot]) first_on_lane[i] = seen[tasks[i].lane_slot] = true;
    }
  }
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const task_id t = tasks[i].task;
    const time_ns idle = g.idle_gap[t];
    if (!first_on_lane[i] && idle < options_.handoff_threshold) continue;
    // Latest task of another thread that ended before this task's busy prelude began.
    const time_ns ready = tasks[i].start - tasks[i].busy;
    const time_ns previous_end = first_on_lane[i] ? std::numeric_limits<time_ns>::min() : ready - idle;
    auto it = std::partition_point(by_end.begin(), by_end.end(), [&](std::size_t j) { return tasks[j].end <= ready; });
    std::size_t source = tasks.size();
    while (it != by_end.begin()) {
      --it;
      if (tasks[*it].end < previous_end) break;
      if (tasks[*it].lane_slot != tasks[i].lane_slot) {
        source = *it;
        break;
      }
    }
    if (source == tasks.size()) continue;
    // The hand-off keeps the measured idle time after the other thread's task: an overhead
    // of this thread (what it did not record), warped by the selective what-ifs.
    const detail::time_warp& warp = s.warps[tasks[i].lane_slot];
    const time_ns delay = warp.empty() ? ready - tasks[source].end : warp.length(tasks[source].end, ready);
    g.add_edge(tasks[source].task, t, delay, edge_kind::thread_handoff);
    g.idle_gap[t] = 0;
    ++s.counts.handoffs;
  }
}

}  // namespace lumos::graph

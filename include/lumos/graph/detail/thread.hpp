#pragma once
// CPU tasks of one thread, with their launch calls and blocking waits.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::build_thread(std::size_t r, std::uint32_t slot, const awaited_map& awaited, std::vector<cpu_task_info>& cpu_tasks) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  task_graph& g = part_of(r);
  // Not a structured binding: the lambdas below capture `events` (clang 14 refuses bindings there).
  const std::uint32_t lane_id = s.cpu_lanes[slot].first;
  const std::vector<event_index>& events = s.cpu_lanes[slot].second;
  const trace::lane& lane = t.lanes[lane_id];
  std::string pname = "rank " + std::to_string(t.rank) + " thread " + std::to_string(lane.tid);
  if (lane.thread_name != no_string) pname += " (" + std::string(t.str(lane.thread_name)) + ")";
  const processor_id p = g.add_processor({processor_kind::cpu_thread, t.rank, lane.pid, lane.tid, pname});
  ++s.counts.threads;

  // Busy time: the union of the thread's operator intervals.
  std::vector<std::pair<time_ns, time_ns>> busy;
  time_ns last_end = std::numeric_limits<time_ns>::min();
  for (const event_index i : events) {
    const trace::event& e = t.events[i];
    if (e.cat == trace::category::cpu_op || detail::is_runtime(e.cat)) last_end = std::max(last_end, end_of(r, i));
    if (e.cat != trace::category::cpu_op) continue;
    const time_ns b = start_of(r, i), en = end_of(r, i);
    if (!busy.empty() && b <= busy.back().second) {
      busy.back().second = std::max(busy.back().second, en);
    } else {
      busy.push_back({b, en});
    }
  }
  // Busy and idle time between two instants, after the selective what-ifs (`warp`).
  const detail::time_warp& warp = s.warps[slot];
  std::size_t cursor = 0;
  auto split_gap = [&](time_ns from, time_ns to) -> std::pair<time_ns, time_ns> {  // (idle, busy)
    time_ns total = 0, warped = 0;
    while (cursor < busy.size() && busy[cursor].second <= from) ++cursor;
    for (std::size_t j = cursor; j < busy.size() && busy[j].first < to; ++j) {
      const time_ns b = std::max(from, busy[j].first), e = std::min(to, busy[j].second);
      if (e <= b) continue;
      total += e - b;
      warped += warp.empty() ? e - b : warp.length(b, e);
    }
    const time_ns gap = std::max<time_ns>(0, to - from);
    const time_ns idle = warp.empty() ? gap - total : warp.length(from, std::max(from, to)) - warped;
    return {std::max<time_ns>(0, idle), warped};
  };
  auto own = [&](time_ns begin, time_ns end) { return warp.empty() ? end - begin : warp.length(begin, end); };

  // The profiler's events each task covers (rank_map::recorded): those started before its end.
  std::size_t recorded_cursor = 0;
  auto record_events = [&](task_kind kind, time_ns end, event_index source) {
    recorded_events counts{.source = source, .blocking = kind == task_kind::cpu_blocking};
    const auto bump = [](std::uint16_t& n) { n = static_cast<std::uint16_t>(n == 0xFFFF ? n : n + 1); };
    for (; recorded_cursor < events.size() && start_of(r, events[recorded_cursor]) < end; ++recorded_cursor) {
      const trace::category c = t.events[events[recorded_cursor]].cat;
      bump(c == trace::category::python_function ? counts.python : detail::is_runtime(c) ? counts.runtime : counts.ops);
    }
    if (source != no_event) s.recorded.push_back(counts);
  };
  time_ns previous_end = 0;  // job time 0 for the first task
  task_id owner = no_task;   // the anchor an overlapping (nested) call belongs to
  time_ns owner_end = std::numeric_limits<time_ns>::min();
  auto add = [&](task_kind kind, time_ns duration, time_ns begin, time_ns end, string_id name, event_index source) {
    const auto [idle, b] = split_gap(previous_end, begin);
    const task_id id = g.add_task({.kind = kind, .processor = p, .duration = duration, .idle_gap = idle, .busy_gap = b, .name_id = name,
                                  .rank = t.rank, .source = source, .observed_start = begin, .observed_end = end});
    if (idle > 0) s.kept.push_back({id, overhead_kind::cpu_idle, idle});
    record_events(kind, end, source);
    cpu_tasks.push_back({id, slot, begin, end, b});
    ++s.counts.cpu_tasks;
    previous_end = std::max(previous_end, end);
    return id;
  };
  event_index run_last = no_event;  // the last query of the poll being folded, if any
  for (const event_index i : events) {
    const trace::event& e = t.events[i];
    if (!detail::is_runtime(e.cat)) continue;
    time_ns b = start_of(r, i);
    const time_ns en = end_of(r, i);
    if (run_last != no_event || (owner != no_task && b < owner_end)) {  // a folded query, or a call nested in the previous one
      s.task_of_event[i] = owner;
      if (i == run_last) run_last = no_event;
      continue;
    }
    // A poll: the run of queries from this one to its successful last query is one wait.
    event_index call = i;
    if (const auto run = s.poll_runs.find(i); run != s.poll_runs.end()) call = run->second;
    const time_ns call_end = end_of(r, call);
    const auto waited = awaited.find(call);
    if (waited.empty()) {
      owner = add(task_kind::cpu, own(b, en), b, en, graph_name(r, e.name), i);
      owner_end = en;
      s.task_of_event[i] = owner;
      continue;
    }
    ++s.counts.blocking_calls;
    // The call's own time after the wait (the replay contract, item 3: docs/replay.md) is its tail, an overhead; the
    // wait comes from the finish edges. A call that waits for an op it launched itself (a
    // synchronous copy) is split: it issues the copy in about a launch latency, then waits.
    time_ns latest = std::numeric_limits<time_ns>::min();
    bool own_op = false;
    for (const event_index o : waited) {
      latest = std::max(latest, end_of(r, o));
      own_op = own_op || t.events[o].correlation == t.events[call].correlation;
    }
    const bool removed = !warp.empty() && warp.at(b) == 0.0;  // inside an op scaled to 0
    if (own_op) {
      time_ns issue_end = call_end;
      for (const event_index o : waited) {
        const stream_overheads& oh = s.overheads[{t.events[o].device, t.events[o].stream}];
        issue_end = std::min(issue_end, std::max(b, std::min(start_of(r, o), b + oh.launch_latency)));
      }
      const task_id issue = add(task_kind::cpu, own(b, issue_end), b, issue_end, graph_name(r, e.name), i);
      s.launch_task[e.correlation] = issue;
      b = issue_end;
    }
    const time_ns tail = std::max<time_ns>(0, call_end - std::max(latest, b));
    owner = add(task_kind::cpu_blocking, removed ? 0 : own(call_end - tail, call_end), b, call_end, graph_name(r, t.events[call].name), call);
    if (removed) s.removed_calls.insert(owner);
    if (tail > 0 && !removed) s.kept.push_back({owner, overhead_kind::sync_tail, g.duration[owner]});
    if (call != i) {
      ++s.counts.poll_waits;
      s.task_of_event[i] = owner;
      run_last = call;
    }
    owner_end = call_end;
    s.task_of_event[call] = owner;
  }
  // The thread's trailing CPU work, so that hand-offs from this thread see its real end.
  if (last_end > previous_end) add(task_kind::cpu, 0, last_end, last_end, g.strings.intern("thread end"), no_event);
}

}  // namespace lumos::graph

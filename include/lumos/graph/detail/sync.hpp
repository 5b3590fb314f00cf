#pragma once
// Synchronisation: the GPU ops each blocking call (sync, blocking copy, poll) waited for.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

// The GPU ops a call waited for, keyed by the call's event. Exact from cuda_sync rows when the
// trace has them, inferred from the timing otherwise (see docs/replay.md). A run of event or
// stream queries with no other runtime call between them is one poll: its last query is the
// one that succeeded, and the whole run is its wait (`rank_state::poll_runs`: first query → last).
template <trace::CommClassifier Comm>
auto trace_graph_builder<Comm>::find_blocking_calls(std::size_t r) -> awaited_map {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  awaited_map awaited;
  // The last op enqueued on each stream before time `at` (rank-local ts).
  auto last_enqueued = [&](const std::vector<event_index>& ops, time_ns at) -> event_index {
    auto it = std::partition_point(ops.begin(), ops.end(), [&](event_index o) { return s.enqueue[o] < at; });
    return it == ops.begin() ? no_event : *(it - 1);
  };
  for (const auto& [lane, events] : s.cpu_lanes) {
    event_index run_first = no_event;  // first query of the current run of queries
    std::size_t run_length = 0;
    for (std::size_t k = 0; k < events.size(); ++k) {
      const event_index c = events[k];
      const trace::event& call = t.events[c];
      if (!detail::is_runtime(call.cat)) continue;
      const std::string_view name = t.name(call);
      const bool device_sync = trace::is_device_sync_call(name);
      const bool stream_sync = trace::is_stream_sync_call(name);
      const bool event_sync = trace::is_event_sync_call(name);
      const bool copy = trace::is_copy_call(name);
      bool poll = false;
      if (detail::is_poll(name)) {
        if (run_first == no_event) run_first = c, run_length = 0;
        ++run_length;
        bool next_poll = false;
        for (std::size_t j = k + 1; j < events.size(); ++j) {
          if (!detail::is_runtime(t.events[events[j]].cat)) continue;
          next_poll = detail::is_poll(t.name(t.events[events[j]]));
          break;
        }
        poll = !next_poll && run_length > 1;  // a lone query is a check, not a wait
      } else {
        run_first = no_event;
      }
      if (!device_sync && !stream_sync && !event_sync && !copy && !poll) continue;
      // The call waited from its start, or a poll from its run's first query.
      const time_ns wait_from = poll ? t.events[run_first].ts : call.ts;

      std::vector<event_index> ops;
      if (copy) {
        // A copy blocks when its own GPU op ended before the call returned.
        for (const event_index o : s.ops_by_corr.find(call.correlation)) {
          if (t.events[o].end() <= call.end() && t.events[o].end() > call.ts) ops.push_back(o);
        }
      }
      const auto rows = copy ? std::span<const event_index>{} : s.sync_by_corr.find(call.correlation);
      if (!rows.empty()) {
        // Exact: the cuda_sync row names the stream waited on. Its last op counts even when it
        // had ended before the call began (the call did not block): under a what-if that
        // slows the GPU the same call waits, and in the replay of the trace the edge is slack.
        for (const event_index row : rows) {
          const auto on = t.arg(row, trace::arg_key::wait_on_stream);
          const int stream = on && *on >= 0 ? static_cast<int>(*on) : t.events[row].stream;
          for (const auto& [key, sops] : s.streams) {
            if (!device_sync && key.stream != stream) continue;
            const event_index o = last_enqueued(sops, wait_from);
            if (o != no_event) ops.push_back(o);
          }
        }
      }
      if (!copy && ops.empty()) {
        // Inferred: among the last op enqueued on each stream before the wait began, the ones
        // that ended while it lasted; a stream or event sync or a poll waited for the latest.
        event_index best = no_event;
        for (const auto& [key, sops] : s.streams) {
          const event_index o = last_enqueued(sops, wait_from);
          if (o == no_event) continue;
          const trace::event& op = t.events[o];
          if (device_sync && op.end() <= call.end()) {
            // A device sync waits for every stream: each one's last op, also one already done
            // (as for an exact row above).
            ops.push_back(o);
            continue;
          }
          if (op.end() <= wait_from || op.end() > call.end() || call.end() - op.end() > options_.sync_tolerance) continue;
          if (device_sync) {
            ops.push_back(o);
          } else if (best == no_event || op.end() > t.events[best].end()) {
            best = o;
          }
        }
        if (best != no_event) ops.push_back(best);
      }
      std::sort(ops.begin(), ops.end());
      ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
      if (ops.empty()) continue;
      for (const event_index o : ops) awaited.add(c, o);  // each call is on one lane: met once
      if (poll) s.poll_runs[run_first] = c;
    }
  }
  awaited.seal(t.events.size());
  return awaited;
}

}  // namespace lumos::graph

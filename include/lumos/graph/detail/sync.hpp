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
  find_queue_blocked_launches(r, awaited);
  awaited.seal(t.events.size());
  return awaited;
}

// Launch calls that blocked on a full launch queue: the runtime holds a bounded number of
// unfinished ops, and a launch onto a full queue returns only once the GPU has finished one of
// them. Such a call is a wait for that op, not host work: under a what-if that speeds the GPU up
// the call returns earlier (or does not block at all).
//
// Found from the trace alone, per stream, then (for the calls not found so) per device, since a
// runtime may bound the ops of a stream or of a whole device: the queue depth at each launch
// call's start (ops enqueued from the oldest unfinished one on: a queue frees its entries in
// order, so on a device an op that finished early on another stream does not free a slot before
// the ops enqueued ahead of it), the observed capacity (a stream's largest depth; on a device the
// depth its long launches meet, see below), and the launches made while the queue was at most
// half full (their
// durations are what a launch costs when it does not block). The queue was full when at least a
// quarter of the launches made within 5 % of the capacity (at least one op) took longer than the
// 95th percentile of the free ones (five times the free launches' rate); each of those longer
// launches then waited for the queue's oldest op when that one ended while the call blocked, else
// for the op that ended last before it returned (within `sync_tolerance`),
// and keeps only its time after that op as its own (build_thread: the tail of a blocking call).
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::find_queue_blocked_launches(std::size_t r, awaited_map& awaited) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  constexpr std::size_t min_samples = 8;  // fewer free launches or full-queue launches: no evidence
  std::vector<std::size_t> long_depths;
  std::vector<time_ns> free_durations, ended_by;  // ended_by[i]: latest end of the first i+1 enqueued
  std::vector<std::pair<time_ns, event_index>> ended;  // (end, op), by end
  std::vector<std::pair<time_ns, event_index>> queue;  // (enqueue, op), by enqueue
  struct launch {
    event_index call;
    std::size_t depth;
    event_index head;  ///< the oldest unfinished op when the call started (no_event: none)
  };
  std::vector<launch> launches;
  std::unordered_set<event_index> found;  // calls found blocked
  // Per device with several streams, its ops by end (a call freed by another stream's op is the
  // device pass's).
  std::map<int, std::vector<event_index>> devices;
  std::map<int, int> streams_of;
  for (const auto& [key, ops] : s.streams) {
    auto& d = devices[key.device];
    d.insert(d.end(), ops.begin(), ops.end());
    ++streams_of[key.device];
  }
  std::map<int, std::vector<std::pair<time_ns, event_index>>> device_ends;
  for (const auto& [device, ops] : devices) {
    if (streams_of[device] < 2) continue;
    auto& d = device_ends[device];
    for (const event_index o : ops) d.emplace_back(t.events[o].end(), o);
    std::sort(d.begin(), d.end());
  }
  // The launches onto the queue whose ops (by start) are `ops`, on `device` (all of its ops when
  // `whole_device`).
  auto detect = [&](const std::vector<event_index>& ops, int device, bool whole_device) {
    if (ops.size() < 2 * min_samples) return;
    ended.clear();
    queue.clear();
    ended_by.clear();
    launches.clear();
    for (const event_index o : ops) {
      ended.emplace_back(t.events[o].end(), o);
      queue.emplace_back(s.enqueue[o], o);
    }
    std::sort(ended.begin(), ended.end());
    std::sort(queue.begin(), queue.end());
    for (const auto& [at, o] : queue) ended_by.push_back(std::max(ended_by.empty() ? time_ns{0} : ended_by.back(), t.events[o].end()));
    std::size_t capacity = 0;
    for (const event_index o : ops) {
      const event_index c = s.runtime_by_corr.first(t.events[o].correlation, no_event);
      if (c == no_event || s.enqueue[o] != t.events[c].ts || (!launches.empty() && launches.back().call == c)) continue;
      const std::string_view name = t.name(t.events[c]);
      if (!detail::is_kernel_launch(name) && !name.starts_with("cudaMemsetAsync") && !name.starts_with("hipMemsetAsync")) continue;
      const time_ns at = t.events[c].ts;
      const auto in = static_cast<std::size_t>(std::lower_bound(queue.begin(), queue.end(), std::pair{at, event_index{0}}) - queue.begin());
      // The oldest op (by enqueue) not finished at `at`: the first whose prefix of ends reaches past it.
      const auto first = static_cast<std::size_t>(std::upper_bound(ended_by.begin(), ended_by.end(), at) - ended_by.begin());
      const std::size_t depth = in > first ? in - first : 0;
      capacity = std::max(capacity, depth);
      launches.push_back({c, depth, in > first ? queue[first].second : no_event});
    }
    free_durations.clear();
    for (const launch& l : launches) {
      if (2 * l.depth <= capacity) free_durations.push_back(t.events[l.call].dur);
    }
    if (free_durations.size() < min_samples) return;
    const auto p95 = free_durations.begin() + static_cast<std::ptrdiff_t>(free_durations.size() * 95 / 100);
    std::nth_element(free_durations.begin(), p95, free_durations.end());
    const time_ns free_p95 = *p95;
    if (whole_device) {
      // A device's capacity: the depth its long launches of the upper half meet (their 10th
      // percentile), not the largest depth met, which a burst of ops enqueued by one call (a CUDA
      // graph) or an op long waiting on another stream can push past it.
      long_depths.clear();
      for (const launch& l : launches) {
        if (2 * l.depth > capacity && t.events[l.call].dur > free_p95) long_depths.push_back(l.depth);
      }
      if (long_depths.size() < min_samples) return;
      const auto p10 = long_depths.begin() + static_cast<std::ptrdiff_t>(long_depths.size() / 10);
      std::nth_element(long_depths.begin(), p10, long_depths.end());
      capacity = *p10;
    }
    const std::size_t slack = std::max<std::size_t>(1, capacity / 20);
    const auto at_capacity = [&](const launch& l) { return l.depth + slack >= capacity; };
    std::size_t full = 0, full_long = 0;
    for (const launch& l : launches) {
      if (!at_capacity(l)) continue;
      ++full;
      if (t.events[l.call].dur > free_p95) ++full_long;
    }
    if (full < min_samples || 4 * full_long < full) return;
    for (const launch& l : launches) {
      const trace::event& call = t.events[l.call];
      if (!at_capacity(l) || call.dur <= free_p95 || found.contains(l.call)) continue;
      // The queue's oldest op, when the call returned as it ended; else the op that ended last
      // before the call returned.
      const time_ns head_end = l.head != no_event ? t.events[l.head].end() : time_ns{0};
      const auto it = std::upper_bound(ended.begin(), ended.end(), std::pair{call.end(), ~event_index{0}});
      if (it == ended.begin()) continue;
      const auto [freed_end, freed] = whole_device && head_end > call.ts && head_end <= call.end() && call.end() - head_end <= options_.sync_tolerance
                                              ? std::pair{head_end, l.head}
                                              : *(it - 1);
      if (freed_end <= call.ts || call.end() - freed_end > options_.sync_tolerance) continue;
      // A call that returned long after its stream's op ended (more than a free launch takes)
      // while an op of another stream ended in between was freed by that one: left to the device.
      if (const auto d = device_ends.find(device); !whole_device && d != device_ends.end() && call.end() - freed_end > free_p95) {
        const auto last = std::upper_bound(d->second.begin(), d->second.end(), std::pair{call.end(), ~event_index{0}});
        if (last != d->second.begin() && (last - 1)->first > freed_end) continue;
      }
      awaited.add(l.call, freed);
      found.insert(l.call);
      ++s.counts.queue_blocked_launches;
      s.counts.queue_blocked_wait += freed_end - call.ts;
    }
  };
  for (const auto& [key, ops] : s.streams) detect(ops, key.device, false);
  for (auto& [device, ops] : devices) {
    if (streams_of[device] < 2) continue;  // one stream: done
    std::sort(ops.begin(), ops.end(), [&](event_index a, event_index b) { return t.events[a].ts < t.events[b].ts || (t.events[a].ts == t.events[b].ts && a < b); });
    detect(ops, device, true);
  }
}

}  // namespace lumos::graph

#pragma once
// Cross-stream dependencies: which GPU ops on other streams each op waited for.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

// Cross-stream producers of each GPU op (consumer event → producer events).
template <trace::CommClassifier Comm>
auto trace_graph_builder<Comm>::find_cross_stream(std::size_t r) -> producer_map {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  producer_map producers;
  auto last_enqueued_on = [&](int stream, int device, time_ns at) -> event_index {
    const auto it = s.streams.find({device, stream});
    if (it == s.streams.end()) return no_event;
    const auto& ops = it->second;
    auto pos = std::partition_point(ops.begin(), ops.end(), [&](event_index o) { return s.enqueue[o] < at; });
    return pos == ops.begin() ? no_event : *(pos - 1);
  };
  // The GPU ops each thread launched, in launch order.
  for (const auto& [lane, events] : s.cpu_lanes) {
    std::vector<std::pair<time_ns, event_index>> launches;  // (launch start, op)
    for (const event_index c : events) {
      if (!detail::is_runtime(t.events[c].cat)) continue;
      for (const event_index o : s.ops_by_corr.find(t.events[c].correlation)) launches.push_back({t.events[c].ts, o});
    }
    auto next_launch = [&](time_ns after) -> event_index {
      auto it = std::partition_point(launches.begin(), launches.end(), [&](const auto& l) { return l.first <= after; });
      return it == launches.end() ? no_event : it->second;
    };
    auto last_launch_before = [&](time_ns before, int not_stream) -> event_index {
      auto it = std::partition_point(launches.begin(), launches.end(), [&](const auto& l) { return l.first < before; });
      while (it != launches.begin()) {
        --it;
        if (t.events[it->second].stream != not_stream) return it->second;
      }
      return no_event;
    };
    event_index last_record = no_event;
    for (const event_index c : events) {
      const trace::event& call = t.events[c];
      if (!detail::is_runtime(call.cat)) continue;
      const std::string_view name = t.name(call);
      if (trace::is_event_record_call(name)) {
        last_record = c;
        continue;
      }
      if (!trace::is_stream_wait_event_call(name)) continue;
      // Exact pairing from a cuda_sync "Stream Wait Event" row, when present.
      event_index producer = no_event, consumer = no_event;
      bool exact = false;
      for (const event_index row : s.sync_by_corr.find(call.correlation)) {
        const auto on = t.arg(row, trace::arg_key::wait_on_stream);
        const auto rec = t.arg(row, trace::arg_key::wait_on_event_record_correlation);
        if (!on || *on < 0) continue;
        time_ns record_time = call.ts;
        if (rec) {
          const event_index recorded = s.runtime_by_corr.first(*rec, no_event);
          if (recorded != no_event) record_time = t.events[recorded].ts;
        }
        producer = last_enqueued_on(static_cast<int>(*on), t.events[row].device, record_time);
        const int waiting = t.events[row].stream;
        for (auto it = std::partition_point(launches.begin(), launches.end(), [&](const auto& l) { return l.first <= call.ts; });
             it != launches.end(); ++it) {
          if (t.events[it->second].stream == waiting) {
            consumer = it->second;
            break;
          }
        }
        exact = true;
      }
      if (!exact) {
        // Inferred: the waiting stream is that of the thread's next launch; the recording
        // stream is that of its last launch before the cudaEventRecord (or, without one,
        // before the wait) on another stream; the producer is the last op enqueued there.
        consumer = next_launch(call.ts);
        if (consumer != no_event) {
          const int waiting = t.events[consumer].stream;
          const time_ns record_at = last_record != no_event ? t.events[last_record].ts : call.ts;
          const event_index before = last_launch_before(record_at, waiting);
          if (before != no_event) producer = last_enqueued_on(t.events[before].stream, t.events[before].device, record_at);
        }
      }
      if (producer == no_event || consumer == no_event || t.events[producer].stream == t.events[consumer].stream) {
        ++s.counts.cross_stream_unresolved;
        continue;
      }
      producers.add(consumer, producer);
      ++(exact ? s.counts.cross_stream_exact : s.counts.cross_stream_inferred);
    }
  }
  producers.seal(t.events.size());
  return producers;
}

}  // namespace lumos::graph

#pragma once
// GPU edges: launch, stream order and cross-stream edges, with the gaps and delays kept.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

// Launch, stream-order and cross-stream constraints of every GPU op, turned into gaps and edge
// delays (docs/replay.md, *Delays*). Each constraint expects the op at its base (launch call,
// stream predecessor's end, producer's end) plus the typical overhead learnt for the stream;
// the constraint that expects it latest bound it in the measurement and keeps its exact
// measured delay, so an unchanged replay reproduces the measured start. The others keep their
// typical overhead (clipped to the measured slack): a queued kernel follows its stream, not
// its launch, and the queue drains when the GPU gets faster. A delay beyond the 95th
// percentile of its kind is not an overhead: an op on another stream that ended within a
// typical gap before the start explains it as a cross-stream wait (most traces have no
// record/wait pairs for every wait); otherwise it is kept and reported as unexplained.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::gpu_edges(std::size_t r, const producer_map& producers) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  task_graph& g = part_of(r);
  auto launch_of = [&](event_index o) -> event_index {
    return s.runtime_by_corr.first(t.events[o].correlation, no_event);
  };
  // Every GPU op of the rank by end time, for the implicit-wait search.
  std::vector<std::pair<time_ns, event_index>> by_end;
  if (options_.implicit_waits) {
    for (const auto& [key, ops] : s.streams) {
      for (const event_index o : ops) by_end.push_back({end_of(r, o), o});
    }
    sort_runs(by_end.begin(), by_end.end(), std::less<>{});  // stream by stream, ends are nearly in order
  }
  // Per launch call, the last stream (numbered from 1) that one of its ops ran on: a launch met
  // again on the same stream launched several ops (a CUDA graph).
  std::vector<std::uint32_t> launched_on(t.events.size(), 0);
  std::uint32_t stream_number = 0;
  for (const auto& [key, ops] : s.streams) {
    const stream_overheads& oh = s.overheads[key];
    ++stream_number;
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const event_index o = ops[k];
      const task_id first = s.arrive_of_event[o] != no_task ? s.arrive_of_event[o] : s.task_of_event[o];
      const time_ns start = start_of(r, o);
      enum { none, stream, launch, dep } binding = none;
      time_ns expected = std::numeric_limits<time_ns>::min();
      auto consider = [&](auto kind, time_ns at) {
        if (at > expected) expected = at, binding = kind;
      };
      const time_ns prev_end = k > 0 ? end_of(r, ops[k - 1]) : 0;
      if (k > 0) consider(stream, prev_end + oh.gap);
      std::vector<std::pair<event_index, time_ns>> deps;
      event_index dep_binding = no_event;
      for (const event_index pr : producers.find(o)) {
        const time_ns pe = end_of(r, pr);
        if (pe > start) {  // the producer ended after the consumer began: not a real wait
          ++s.counts.cross_stream_unresolved;
          continue;
        }
        deps.push_back({pr, pe});
        if (pe + oh.gap > expected) dep_binding = pr;
        consider(dep, pe + oh.gap);
      }
      const event_index l = launch_of(o);
      const time_ns anchor = s.anchor[o] == no_anchor ? no_anchor : job_time(r, s.anchor[o]);
      if (anchor != no_anchor) consider(launch, anchor + oh.launch_latency);
      if (l != no_event && start < start_of(r, l)) {
        violation(s.counts, start_of(r, l) - start, where(r, o) + " starts " + std::to_string(start_of(r, l) - start) +
                                              " ns before its launch call (" + std::string(t.name(t.events[l])) + ")");
      }
      // A delay beyond what its kind allows: look for the op that held this one back.
      const time_ns allowed = binding == launch ? oh.launch_high - oh.launch_latency : oh.gap_high - oh.gap;
      if (binding != none && start - expected > allowed && options_.implicit_waits) {
        auto it = std::upper_bound(by_end.begin(), by_end.end(), std::make_pair(start, std::numeric_limits<event_index>::max()));
        while (it != by_end.begin()) {
          --it;
          if (it->first < start - oh.gap_high || it->first <= expected - oh.gap) break;
          const trace::event& other = t.events[it->second];
          if (other.stream == key.stream || other.device != key.device || other.ts >= t.events[o].ts) continue;
          deps.push_back({it->second, it->first});
          dep_binding = it->second;
          binding = dep;
          expected = it->first + oh.gap;
          ++s.counts.cross_stream_implicit;
          break;
        }
      }
      const time_ns excess = binding == none ? 0 : start - expected;
      const bool unexplained = binding != none && excess > (binding == launch ? oh.launch_high - oh.launch_latency : oh.gap_high - oh.gap);
      if (unexplained) {
        ++s.counts.ops_unexplained;
        s.kept.push_back({first, overhead_kind::unexplained, excess});
      }
      switch (binding) {
        case stream: ++s.counts.ops_queued; break;
        case launch: ++s.counts.ops_launch_bound; break;
        case dep: ++s.counts.ops_dependency_bound; break;
        case none: break;
      }
      auto keep = [&](overhead_kind kind, time_ns amount) {
        amount -= unexplained ? excess : 0;
        if (amount > 0) s.kept.push_back({first, kind, amount});
      };
      // Stream order: the measured gap when it bound the op, else the typical gap. A negative
      // slack is a measured overlap with the predecessor (programmatic dependent launch on
      // Hopper/Blackwell lets a kernel start before the previous one ends): kept.
      if (k == 0) {
        g.idle_gap[first] = binding == none ? start : 0;  // nothing else anchors it
      } else {
        const time_ns slack = start - prev_end;
        if (slack < 0) ++s.counts.stream_overlaps;
        if (-slack > options_.overlap_tolerance) {
          violation(s.counts, -slack, where(r, o) + " starts " + std::to_string(-slack) + " ns before the op before it on stream " +
                                std::to_string(key.stream) + " ends");
        }
        g.idle_gap[first] = binding == stream ? slack : std::min(oh.gap, slack);
        if (binding == stream) keep(overhead_kind::stream_gap, slack);
      }
      if (l != no_event) {
        // The edge counts from the launching task's start (or its end after a blocked
        // launch); a launch nested in another call counts from that call.
        const task_id launch_task = launch_task_for(r, l);
        const bool from_start = anchor == start_of(r, l) || launch_task != s.task_of_event[l];
        const time_ns latency = start - (from_start ? g.observed_start[launch_task] : g.observed_end[launch_task]);
        const time_ns delay = binding == launch ? latency : std::min(oh.launch_latency, latency);
        g.add_edge(launch_task, first, delay, edge_kind::launch, from_start ? edge_flags::from_start : edge_flags::none);
        if (binding == launch) keep(overhead_kind::launch_latency, latency);
        ++s.counts.launch_edges;
        const bool shared_launch = std::exchange(launched_on[l], stream_number) == stream_number ||
                                   s.ops_by_corr.find(t.events[o].correlation).size() > 1;
        if (shared_launch) ++s.counts.graph_launch_ops;
      } else {
        ++s.counts.ops_without_launch;
      }
      for (const auto& [pr, pe] : deps) {
        const time_ns delay = pr == dep_binding && binding == dep ? start - pe : std::min(oh.gap, start - pe);
        g.add_edge(task_of(r, pr), first, delay, edge_kind::cross_stream);
        if (pr == dep_binding && binding == dep) keep(overhead_kind::stream_gap, start - pe);
      }
    }
  }
}

}  // namespace lumos::graph

#pragma once
// Indexing each rank before any task exists: the job origin, CPU lanes, streams, correlation
// tables, and the selective what-ifs (`op_scales`) over each thread's time.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

template <trace::CommClassifier Comm>
[[nodiscard]] auto trace_graph_builder<Comm>::job_origin() const -> time_ns {
  // One pass over each rank's events, ranks in parallel (a 512-rank job has 14 M events): its
  // first operation, and whether it has any. An empty trace (no events, or metadata only) would
  // replay as a 0 ms iteration: bad input, reported for the first such rank in rank order.
  constexpr time_ns none = std::numeric_limits<time_ns>::max();
  std::vector<time_ns> first(job_.ranks.size(), none);
  for_each_rank([&](std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    bool any = false;
    time_ns earliest = none;
    for (const trace::event& e : t.events) {
      if (e.ph != trace::phase::complete) continue;
      any = true;
      if (trace::is_cpu_side(e.cat) || trace::is_gpu_op(e.cat)) earliest = std::min(earliest, e.ts);
    }
    if (!any) throw error(t.file + ": the trace holds no operations (no complete 'X' event): nothing to build an execution graph from");
    if (earliest != none) first[r] = t.base_ns + earliest;
  });
  const time_ns origin = first.empty() ? none : *std::min_element(first.begin(), first.end());
  return origin == none ? 0 : origin;
}

// What matching the collectives across ranks reads, made for every rank before any is built:
// which ops communicate, their order of enqueueing, and the ops that carry their arguments. The
// rest of a rank's indexes (`index_streams`) is made with its analysis, a few ranks at a time:
// made here for all ranks, they held 550 MiB of a 512-rank job beside its events.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::index_rank(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  s.offset = t.base_ns - out_.origin;
  const std::size_t n = t.events.size();
  s.is_comm.assign(n, 0);
  s.instance.assign(n, -1);
  // (correlation, op) of the communication ops, to find the call that launched each (the
  // first runtime call of its correlation, as runtime_by_corr.first).
  std::vector<std::pair<std::int64_t, event_index>> by_corr;
  for (event_index i = 0; i < n; ++i) {
    const trace::event& e = t.events[i];
    if (e.ph != trace::phase::complete) continue;
    if (trace::is_cpu_side(e.cat)) {
      if (e.cat == trace::category::cpu_op && e.external_id >= 0 && t.arg(i, trace::arg_key::collective_name)) {
        s.collective_op_by_external.add(e.external_id, i);
      }
    } else if (trace::is_gpu_op(e.cat) && is_comm_(t, i)) {
      s.is_comm[i] = 1;
      by_corr.push_back({e.correlation, i});
    }
  }
  s.collective_op_by_external.seal();
  std::sort(by_corr.begin(), by_corr.end());
  std::vector<time_ns> enqueue(by_corr.size(), std::numeric_limits<time_ns>::min());
  for (event_index i = 0; i < n && !by_corr.empty(); ++i) {
    const trace::event& e = t.events[i];
    if (e.ph != trace::phase::complete || !trace::is_cpu_side(e.cat) || !detail::is_runtime(e.cat) || e.correlation < 0) continue;
    auto it = std::lower_bound(by_corr.begin(), by_corr.end(), std::pair{e.correlation, event_index{0}});
    for (; it != by_corr.end() && it->first == e.correlation; ++it) {
      time_ns& q = enqueue[static_cast<std::size_t>(it - by_corr.begin())];
      if (q == std::numeric_limits<time_ns>::min()) q = e.ts;
    }
  }
  std::vector<std::pair<time_ns, event_index>> order(by_corr.size());
  for (std::size_t k = 0; k < by_corr.size(); ++k) {
    const event_index o = by_corr[k].second;
    order[k] = {enqueue[k] != std::numeric_limits<time_ns>::min() ? enqueue[k] : t.events[o].ts, o};
  }
  std::sort(order.begin(), order.end());
  s.comm_ops.resize(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) s.comm_ops[k] = order[k].second;
}

// The rest of a rank's indexes, made when its analysis starts (and released once its tasks are
// added): the task maps, its streams with each op's enqueue time and launch anchor, and the
// runtime calls by correlation.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::index_streams(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  const std::size_t n = t.events.size();
  s.task_of_event.assign(n, no_task);
  s.arrive_of_event.assign(n, no_task);
  s.enqueue.assign(n, 0);
  for (event_index i = 0; i < n; ++i) {
    const trace::event& e = t.events[i];
    if (e.ph != trace::phase::complete) continue;
    if (trace::is_cpu_side(e.cat)) {
      if (detail::is_runtime(e.cat) && e.correlation >= 0) s.runtime_by_corr.add(e.correlation, i);
    } else if (trace::is_gpu_op(e.cat)) {
      s.streams[{e.device, e.stream}].push_back(i);
    }
  }
  s.runtime_by_corr.seal();
  s.anchor.assign(n, no_anchor);
  for (auto& [key, ops] : s.streams) {
    sort_by_start(t, ops);
    for (const event_index o : ops) {
      const event_index launch = s.runtime_by_corr.first(t.events[o].correlation, no_event);
      s.enqueue[o] = launch != no_event ? t.events[launch].ts : t.events[o].ts;
      if (launch == no_event) continue;
      // Latency counts from the call's start (the replay contract, item 4: docs/replay.md), or from its end when a
      // kernel launch blocked (lazy module loading) and the op could only start after it.
      const trace::event& call = t.events[launch];
      const bool blocked = call.dur > options_.blocked_launch && detail::is_kernel_launch(t.name(call));
      s.anchor[o] = blocked ? call.end() : call.ts;  // rank-local: the offset is final only at build time
    }
  }
}

// What only `build_rank` reads, made when it starts (and released when it ends, so that one
// rank's maps are alive at a time): CPU events per thread by time, GPU ops and cuda_sync rows by
// correlation.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::index_launches(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  const std::size_t n = t.events.size();
  std::unordered_map<std::uint32_t, std::size_t> lane_slot;
  for (event_index i = 0; i < n; ++i) {
    const trace::event& e = t.events[i];
    if (e.ph != trace::phase::complete) continue;
    if (trace::is_cpu_side(e.cat)) {
      auto [it, fresh] = lane_slot.try_emplace(e.lane, s.cpu_lanes.size());
      if (fresh) s.cpu_lanes.push_back({e.lane, {}});
      s.cpu_lanes[it->second].second.push_back(i);
    } else if (trace::is_gpu_op(e.cat)) {
      if (e.correlation >= 0) s.ops_by_corr.add(e.correlation, i);
    } else if (e.cat == trace::category::cuda_sync && e.correlation >= 0) {
      s.sync_by_corr.add(e.correlation, i);
    }
  }
  s.ops_by_corr.seal();
  s.sync_by_corr.seal();
  for (auto& [lane, events] : s.cpu_lanes) sort_by_start(t, events);
  std::sort(s.cpu_lanes.begin(), s.cpu_lanes.end(), [&](const auto& a, const auto& b) {
    return t.events[a.second.front()].ts < t.events[b.second.front()].ts;
  });
}

// Per-thread multipliers and per-op factors of the selective what-ifs (`op_scales`).
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::apply_op_scales(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  s.warps.assign(s.cpu_lanes.size(), {});
  if (options_.op_scales.empty()) return;
  s.gpu_factor.assign(t.events.size(), 1.0);
  for (std::size_t slot = 0; slot < s.cpu_lanes.size(); ++slot) {
    std::vector<std::tuple<time_ns, time_ns, double>> spans;
    for (const op_scale& pattern : options_.op_scales) {
      time_ns open_end = std::numeric_limits<time_ns>::min();
      for (const event_index i : s.cpu_lanes[slot].second) {  // by start: outermost first
        const trace::event& e = t.events[i];
        if (t.name(e).find(pattern.text) == std::string_view::npos) continue;
        const time_ns b = start_of(r, i), en = end_of(r, i);
        if (b < open_end && !spans.empty()) {  // nested in (or overlapping) the previous match
          std::get<1>(spans.back()) = std::max(std::get<1>(spans.back()), en);
        } else {
          spans.emplace_back(b, en, pattern.factor);
        }
        open_end = std::max(open_end, en);
      }
    }
    if (!spans.empty()) ++s.counts.op_scaled_cpu;
    s.warps[slot].build(std::move(spans));
  }
  std::unordered_map<std::uint32_t, std::size_t> slot_of_lane;
  for (std::size_t slot = 0; slot < s.cpu_lanes.size(); ++slot) slot_of_lane[s.cpu_lanes[slot].first] = slot;
  for (const auto& [key, ops] : s.streams) {
    for (const event_index o : ops) {
      double f = 1.0;
      for (const op_scale& pattern : options_.op_scales) {
        if (t.name(t.events[o]).find(pattern.text) != std::string_view::npos) f *= pattern.factor;
      }
      // Everything a matched CPU op launched is nested in it.
      if (const event_index call = s.runtime_by_corr.first(t.events[o].correlation, no_event); call != no_event) {
        f *= s.warps[slot_of_lane[t.events[call].lane]].at(start_of(r, call));
      }
      s.gpu_factor[o] = f;
      if (f != 1.0) ++s.counts.op_scaled_gpu;
    }
  }
}

}  // namespace lumos::graph

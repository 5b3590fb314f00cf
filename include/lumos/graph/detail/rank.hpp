#pragma once
// Building one rank: the order of its passes, its GPU tasks, and the overheads each stream
// is learnt to have.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

// Each rank's analysis and tasks read only its own trace and state, so worker threads make
// them, each rank in a graph of its own (`part_of`), up to a few ranks ahead of the calling
// thread, which appends the parts to the graph in rank order (`merge_rank`): the graph is the
// same for any number of threads, and only a few ranks' indexes are alive at a time. A rank
// whose analysis or build throws is rethrown when its turn comes.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::build_ranks() {
  const std::size_t n = job_.ranks.size();
  const std::size_t workers = std::min<std::size_t>(thread_count() - 1, n > 1 ? n - 1 : 0);
  auto make = [this](std::size_t r) {
    analyse_rank(r);
    build_rank(r);
    release_indexes(r);
  };
  auto merge = [this](std::size_t r) {
    merge_rank(r);
    if (options_.events_done) options_.events_done(r), lend_freed_pages(r);
    trim_heap(r);
  };
  if (workers == 0) {
    parts_.resize(1);
    for (std::size_t r = 0; r < n; ++r) make(r), merge(r);
    return;
  }
  const std::size_t window = 2 * workers;  // ranks made ahead of the one being merged
  parts_.resize(window);
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::uint8_t> ready(n, 0);
  std::vector<std::exception_ptr> failed(n);
  std::size_t next = 0, merged = 0;
  bool stop = false;
  auto work = [&] {
    while (true) {
      std::size_t r = 0;
      {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return stop || next >= n || next < merged + window; });
        if (stop || next >= n) return;
        r = next++;
      }
      try {
        make(r);
      } catch (...) {
        failed[r] = std::current_exception();
      }
      {
        std::lock_guard lock(m);
        ready[r] = 1;
      }
      cv.notify_all();
    }
  };
  std::vector<std::jthread> pool;
  // Declared after the pool, so destroyed before it: stops the workers however this returns.
  struct stopper {
    std::mutex& m;
    std::condition_variable& cv;
    bool& stop;
    ~stopper() {
      {
        std::lock_guard lock(m);
        stop = true;
      }
      cv.notify_all();
    }
  } stop_workers{m, cv, stop};
  pool.reserve(workers);
  for (std::size_t w = 0; w < workers; ++w) pool.emplace_back(work);
  for (std::size_t r = 0; r < n; ++r) {
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return ready[r] != 0; });
    }
    if (failed[r]) std::rethrow_exception(failed[r]);
    merge(r);
    {
      std::lock_guard lock(m);
      ++merged;
    }
    cv.notify_all();
  }
}

// What the trace says before any task exists: CPU events by thread and GPU ops by correlation,
// the selective what-ifs over its time, the GPU ops each blocking call waited for, the
// cross-stream producers of each op, the overheads of each stream and the transfer part of
// unmatched communication. Touches only rank r's state.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::analyse_rank(std::size_t r) {
  rank_state& s = ranks_[r];
  index_streams(r);
  index_launches(r);
  apply_op_scales(r);
  s.awaited = find_blocking_calls(r);
  if (options_.cross_stream) s.producers = find_cross_stream(r);
  learn_overheads(r, s.producers);
  unmatched_transfers(r);
}

template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::build_rank(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  task_graph& g = part_of(r);
  const int rank = t.rank;
  const awaited_map& awaited = s.awaited;
  const producer_map& producers = s.producers;
  g.reserve(t.events.size() + t.events.size() / 16, t.events.size());  // as `build` does for the graph
  s.metadata_op = metadata_op_median(t);

  // 2. CPU tasks, thread by thread (1. is the rank's analysis).
  std::vector<cpu_task_info> cpu_tasks;
  for (std::uint32_t slot = 0; slot < s.cpu_lanes.size(); ++slot) {
    build_thread(r, slot, awaited, cpu_tasks);
  }

  // 3. GPU tasks, stream by stream (edges come in step 4, once every task exists).
  for (const auto& [key, ops] : s.streams) {
    const processor_id p = g.add_processor({processor_kind::gpu_stream, rank, key.device, key.stream,
                                            "rank " + std::to_string(rank) + " stream " + std::to_string(key.stream)});
    ++s.counts.streams;
    stream_overheads oh = s.overheads[key];
    oh.rank = rank;
    s.counts.overheads.push_back(oh);
    for (const event_index o : ops) {
      const trace::event& e = t.events[o];
      const time_ns b = start_of(r, o), en = end_of(r, o);
      const time_ns dur = scale_time(e.dur, s.factor(o));
      const string_id name = graph_name(r, e.name);
      if (s.instance[o] >= 0) {
        s.arrive_of_event[o] = g.add_task({.kind = task_kind::comm_arrive, .processor = p, .name_id = name, .rank = rank,
                                          .source = o, .observed_start = b, .observed_end = b});
        s.task_of_event[o] = g.add_task({.kind = task_kind::comm_complete, .processor = p, .duration = dur, .name_id = name,
                                        .rank = rank, .source = o, .observed_start = b, .observed_end = en});
      } else if (s.is_comm[o]) {
        // Partners absent: the op is its arrival, a peer wait kept as measured, then the
        // transfer (the only part `comm=F` scales).
        ++s.counts.collectives_unmatched;
        const time_ns transfer = std::min(e.dur, s.transfer[o]);
        s.arrive_of_event[o] = g.add_task({.kind = task_kind::comm_arrive, .processor = p, .name_id = name, .rank = rank,
                                          .source = o, .observed_start = b, .observed_end = b});
        s.task_of_event[o] = g.add_task({.kind = task_kind::gpu_comm, .processor = p,
                                        .duration = scale_time(transfer, s.factor(o)), .name_id = name, .rank = rank,
                                        .source = o, .observed_start = en - transfer, .observed_end = en});
        const time_ns wait = scale_time(e.dur - transfer, s.factor(o));
        g.add_edge(s.arrive_of_event[o], s.task_of_event[o], wait, edge_kind::collective);
        if (wait > 0) s.kept.push_back({s.task_of_event[o], overhead_kind::peer_wait, wait});
      } else {
        s.task_of_event[o] = g.add_task({.kind = task_kind::gpu_compute, .processor = p, .duration = dur, .name_id = name,
                                        .rank = rank, .source = o, .observed_start = b, .observed_end = en});
      }
      ++s.counts.gpu_tasks;
    }
  }

  // 4. GPU dependencies: launch, stream order and cross-stream edges, with gaps and delays.
  gpu_edges(r, producers);

  // 5. GPU → CPU: finish edges into the blocking calls; the return after the wait is the
  //    call's tail, an overhead (the replay contract, item 3).
  for (const event_index call : awaited.keys()) {
    const auto ops = awaited.find(call);
    const task_id wait = s.task_of_event[call];
    if (s.removed_calls.count(wait) != 0) continue;  // inside an op scaled to 0: no wait left
    const time_ns tail = g.duration[wait];
    for (const event_index o : ops) {
      g.add_edge(s.task_of_event[o], wait, tail, edge_kind::sync, edge_flags::finish);
      ++s.counts.sync_edges;
    }
  }

  // 6. CPU → CPU hand-offs across threads of this rank.
  handoffs(r, cpu_tasks);
}

// Overheads of each stream, learnt from its measured timeline (docs/replay.md, *Delays*):
// - the idle-GPU launch latency, from ops whose launch call began after their stream and
//   their cross-stream producers were done (nothing but the launch could hold them);
// - the inter-kernel gap, from ops that were queued: their launch would have let them start
//   before their stream predecessor ended.
// Medians are the typical values, 95th percentiles the bound beyond which a delay is not
// an overhead of that kind.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::learn_overheads(std::size_t r, const producer_map& producers) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  std::map<stream_key, std::vector<time_ns>> latencies, gaps;
  std::vector<time_ns> all_latencies, all_gaps;
  auto producers_end = [&](event_index o) {
    time_ns latest = std::numeric_limits<time_ns>::min();
    for (const event_index p : producers.find(o)) {
      if (t.events[p].end() <= t.events[o].ts) latest = std::max(latest, end_of(r, p));
    }
    return latest;
  };
  for (const auto& [key, ops] : s.streams) {
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const event_index o = ops[k];
      if (s.anchor[o] == no_anchor) continue;
      const time_ns a = job_time(r, s.anchor[o]);
      // Only the first op of a multi-op launch (CUDA graph) says something about latency.
      if (k > 0 && t.events[ops[k - 1]].correlation == t.events[o].correlation) continue;
      const time_ns prev_end = k > 0 ? end_of(r, ops[k - 1]) : std::numeric_limits<time_ns>::min();
      if (a >= prev_end && a >= producers_end(o)) latencies[key].push_back(start_of(r, o) - a);
    }
    all_latencies.insert(all_latencies.end(), latencies[key].begin(), latencies[key].end());
  }
  const time_ns rank_latency = detail::median(all_latencies, options_.default_launch_latency);
  const time_ns rank_latency_high = detail::quantile(all_latencies, 0.95, 2 * rank_latency);
  for (const auto& [key, ops] : s.streams) {
    const time_ns latency = detail::median(latencies[key], rank_latency);
    for (std::size_t k = 1; k < ops.size(); ++k) {
      const event_index o = ops[k];
      const time_ns prev_end = end_of(r, ops[k - 1]);
      const bool queued = (s.anchor[o] == no_anchor || job_time(r, s.anchor[o]) + latency <= prev_end) && producers_end(o) <= prev_end;
      if (queued) gaps[key].push_back(std::max<time_ns>(0, start_of(r, o) - prev_end));
    }
    all_gaps.insert(all_gaps.end(), gaps[key].begin(), gaps[key].end());
  }
  const time_ns rank_gap = detail::median(all_gaps, options_.default_stream_gap);
  const time_ns rank_gap_high = detail::quantile(all_gaps, 0.95, 2 * rank_gap);
  for (const auto& [key, ops] : s.streams) {
    stream_overheads& oh = s.overheads[key];
    oh.device = key.device;
    oh.stream = key.stream;
    oh.launch_samples = latencies[key].size();
    oh.launch_latency = detail::median(latencies[key], rank_latency);
    oh.launch_high = std::max(oh.launch_latency, detail::quantile(latencies[key], 0.95, rank_latency_high));
    oh.gap_samples = gaps[key].size();
    oh.gap = detail::median(gaps[key], rank_gap);
    oh.gap_high = std::max(oh.gap, detail::quantile(gaps[key], 0.95, rank_gap_high));
  }
}

}  // namespace lumos::graph

#pragma once
// Builds the execution graph of a whole job from its Kineto traces: tasks on CPU threads and
// GPU streams, every dependency kind of design/ARCHITECTURE.md, and collectives joined across
// ranks. The rules are documented in docs/replay.md; the numbers that tune them are in
// `build_options`.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/trace/comm.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/job.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::graph {

/// Tunables of the trace → graph rules.
struct build_options {
  /// A CPU task that follows at least this much idle time on its thread waits for the latest
  /// task of another thread of its rank that ended before it (autograd and worker hand-offs).
  time_ns handoff_threshold = 100'000;
  /// A launch call longer than this blocked (launches take microseconds; this one waited, e.g.
  /// on lazy module loading): its op counts its latency from the call's end, not its start.
  time_ns blocked_launch = 1'000'000;
  /// Launch latency used when a stream has no launch-bound op to learn it from.
  time_ns default_launch_latency = 5'000;
  /// An op counts as launch-bound in the measurement when nothing on its stream or its
  /// cross-stream producers ended within this time before it started.
  time_ns bound_tolerance = 1'000;
  /// A blocking call counts as having waited for a GPU op that ended at most this long before
  /// the call returned.
  time_ns sync_tolerance = 2'000'000;
  /// Join matched collectives across ranks (off: every communication kernel keeps its duration).
  bool match_collectives = true;
  /// Pair cudaEventRecord with cudaStreamWaitEvent into cross-stream edges (off: ablation only).
  bool cross_stream = true;
};

/// What the builder found and how it decided; reported by `lumos replay`.
struct build_stats {
  std::size_t cpu_tasks = 0, gpu_tasks = 0, threads = 0, streams = 0;
  std::size_t launch_edges = 0;          ///< runtime call → GPU op
  std::size_t graph_launch_ops = 0;      ///< GPU ops sharing a launch with others (CUDA graphs)
  std::size_t ops_without_launch = 0;    ///< launched before the recording window
  std::size_t cross_stream_exact = 0;    ///< from cuda_sync "Stream Wait Event" records
  std::size_t cross_stream_inferred = 0; ///< record/wait pairing inferred from launch order
  std::size_t cross_stream_unresolved = 0;
  std::size_t blocking_calls = 0;        ///< syncs, blocking copies, successful polls
  std::size_t sync_edges = 0;
  std::size_t handoffs = 0;              ///< CPU → CPU edges across threads
  std::size_t collectives_matched = 0;   ///< instances joined across ranks
  std::size_t collective_participants = 0;
  std::size_t collectives_unmatched = 0; ///< communication ops whose partners are absent
  std::string collective_matching;       ///< how instances were matched
  std::size_t stream_overlaps = 0;       ///< ops that started before their stream predecessor ended
};

/// Per-rank mapping between trace events and graph tasks.
struct rank_map {
  int rank = 0;
  time_ns offset = 0;  ///< job time = event ts + offset
  std::vector<task_id> task_of_event;  ///< event index → its task (GPU op: its complete task)
  std::vector<task_id> arrive_of_event;  ///< communication ops joined across ranks: their arrive task
};

/// A job's graph plus the maps back to its traces.
struct built_job {
  task_graph graph;
  std::vector<rank_map> ranks;  ///< same order as job.ranks
  time_ns origin = 0;           ///< absolute ns of job time 0
  build_stats stats;
};

namespace detail {

[[nodiscard]] inline bool is_runtime(trace::category c) noexcept {
  return c == trace::category::cuda_runtime || c == trace::category::cuda_driver;
}

// Collective type of a communication kernel from its name: ncclKernel_AllReduce_..., 
// ncclDevKernel_AllGather_..., or the collective args.
[[nodiscard]] inline std::string collective_type(std::string_view name, std::string_view arg) {
  if (!arg.empty()) {
    std::string s(arg);
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::erase(s, '_');
    return s;
  }
  for (std::string_view kind : {"AllReduce", "AllGather", "ReduceScatter", "SendRecv", "Broadcast", "AllToAll", "Reduce",
                                "Send", "Recv"}) {
    if (name.find(kind) != std::string_view::npos) {
      std::string s(kind);
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    }
  }
  if (name.find("all_reduce") != std::string_view::npos) return "allreduce";
  if (name.find("all_gather") != std::string_view::npos) return "allgather";
  return "comm";
}

[[nodiscard]] inline std::vector<int> parse_rank_list(std::string_view text) {
  std::vector<int> ranks;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] < '0' || text[i] > '9')) ++i;
    int v = 0;
    const auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
    if (ec != std::errc{}) break;
    ranks.push_back(v);
    i = static_cast<std::size_t>(p - text.data());
  }
  return ranks;
}

[[nodiscard]] inline time_ns median(std::vector<time_ns> v, time_ns fallback) {
  if (v.empty()) return fallback;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace detail

/// Builds the graph of `job`. `Comm` decides which GPU ops are communication.
template <trace::CommClassifier Comm = trace::default_comm_classifier>
class trace_graph_builder {
 public:
  explicit trace_graph_builder(const trace::job& job, build_options options = {}, Comm is_comm = {})
      : job_(job), options_(options), is_comm_(is_comm) {}

  [[nodiscard]] built_job build() {
    out_.origin = job_origin();
    ranks_.resize(job_.ranks.size());
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) index_rank(r);
    if (options_.match_collectives) match_collectives();
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) build_rank(r);
    finish_collectives();
    out_.ranks.resize(job_.ranks.size());
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) {
      out_.ranks[r].rank = job_.ranks[r].rank;
      out_.ranks[r].offset = ranks_[r].offset;
      out_.ranks[r].task_of_event = std::move(ranks_[r].task_of_event);
      out_.ranks[r].arrive_of_event = std::move(ranks_[r].arrive_of_event);
    }
    return std::move(out_);
  }

 private:
  using event_index = std::uint32_t;
  static constexpr event_index no_event = ~event_index{0};

  struct stream_key {
    int device;
    int stream;
    auto operator<=>(const stream_key&) const = default;
  };

  // Everything indexed about one rank before tasks are made.
  struct rank_state {
    time_ns offset = 0;
    std::vector<std::pair<std::uint32_t, std::vector<event_index>>> cpu_lanes;  // lane → events by time
    std::map<stream_key, std::vector<event_index>> streams;                     // GPU ops by start
    std::unordered_map<std::int64_t, event_index> runtime_by_corr;
    std::unordered_map<std::int64_t, std::vector<event_index>> ops_by_corr;
    std::unordered_map<std::int64_t, std::vector<event_index>> sync_by_corr;    // cuda_sync rows
    std::unordered_map<std::int64_t, event_index> collective_op_by_external;    // record_param_comms
    std::vector<std::uint8_t> is_comm;                                           // per event
    std::vector<std::int32_t> instance;  // per event: collective instance (matched ops), or -1
    std::vector<task_id> task_of_event;
    std::vector<task_id> arrive_of_event;
    std::vector<time_ns> enqueue;        // per GPU op: start of its launch call (or its own start)
  };

  // ---- indexing ---------------------------------------------------------------------------

  [[nodiscard]] time_ns job_origin() const {
    time_ns origin = std::numeric_limits<time_ns>::max();
    for (const auto& r : job_.ranks) {
      for (const auto& e : r.events) {
        if (e.ph == trace::phase::complete && (trace::is_cpu_side(e.cat) || trace::is_gpu_op(e.cat))) {
          origin = std::min(origin, r.base_ns + e.ts);
        }
      }
    }
    return origin == std::numeric_limits<time_ns>::max() ? 0 : origin;
  }

  void index_rank(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    s.offset = t.base_ns - out_.origin;
    const std::size_t n = t.events.size();
    s.is_comm.assign(n, 0);
    s.instance.assign(n, -1);
    s.task_of_event.assign(n, no_task);
    s.arrive_of_event.assign(n, no_task);
    s.enqueue.assign(n, 0);
    std::unordered_map<std::uint32_t, std::size_t> lane_slot;
    for (event_index i = 0; i < n; ++i) {
      const trace::event& e = t.events[i];
      if (e.ph != trace::phase::complete) continue;
      if (trace::is_cpu_side(e.cat)) {
        auto [it, fresh] = lane_slot.try_emplace(e.lane, s.cpu_lanes.size());
        if (fresh) s.cpu_lanes.push_back({e.lane, {}});
        s.cpu_lanes[it->second].second.push_back(i);
        if (detail::is_runtime(e.cat) && e.correlation >= 0) s.runtime_by_corr.try_emplace(e.correlation, i);
        if (e.cat == trace::category::cpu_op && e.external_id >= 0 && t.arg(i, trace::arg_key::collective_name)) {
          s.collective_op_by_external.try_emplace(e.external_id, i);
        }
      } else if (trace::is_gpu_op(e.cat)) {
        s.streams[{e.device, e.stream}].push_back(i);
        if (e.correlation >= 0) s.ops_by_corr[e.correlation].push_back(i);
        s.is_comm[i] = is_comm_(t, i) ? 1 : 0;
      } else if (e.cat == trace::category::cuda_sync && e.correlation >= 0) {
        s.sync_by_corr[e.correlation].push_back(i);
      }
    }
    auto by_time = [&](event_index a, event_index b) {
      const auto& x = t.events[a];
      const auto& y = t.events[b];
      if (x.ts != y.ts) return x.ts < y.ts;
      if (x.dur != y.dur) return x.dur > y.dur;  // parents before children
      return a < b;
    };
    for (auto& [lane, events] : s.cpu_lanes) std::sort(events.begin(), events.end(), by_time);
    std::sort(s.cpu_lanes.begin(), s.cpu_lanes.end(), [&](const auto& a, const auto& b) {
      return t.events[a.second.front()].ts < t.events[b.second.front()].ts;
    });
    for (auto& [key, ops] : s.streams) {
      std::sort(ops.begin(), ops.end(), by_time);
      for (const event_index o : ops) {
        const auto it = s.runtime_by_corr.find(t.events[o].correlation);
        s.enqueue[o] = it != s.runtime_by_corr.end() ? t.events[it->second].ts : t.events[o].ts;
      }
    }
  }

  [[nodiscard]] time_ns job_time(std::size_t r, time_ns ts) const noexcept { return ts + ranks_[r].offset; }
  [[nodiscard]] time_ns start_of(std::size_t r, event_index i) const noexcept { return job_time(r, job_.ranks[r].events[i].ts); }
  [[nodiscard]] time_ns end_of(std::size_t r, event_index i) const noexcept { return job_time(r, job_.ranks[r].events[i].end()); }

  // ---- collectives ------------------------------------------------------------------------

  struct participant {
    std::size_t rank_index;
    event_index op;
  };
  struct instance_plan {
    collective_instance info;
    std::vector<participant> members;
  };

  void match_collectives() {
    // Key per communication op: (group, type, sequence within group and type on its rank).
    std::map<std::tuple<std::string, std::string, std::int64_t>, std::vector<participant>> by_key;
    bool any_args = false, any_fallback = false;
    std::map<std::tuple<std::string, std::string, std::int64_t>, std::pair<std::vector<int>, std::int64_t>> meta;
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) {
      const trace::rank_trace& t = job_.ranks[r];
      rank_state& s = ranks_[r];
      std::vector<event_index> comm_ops;
      for (const auto& [key, ops] : s.streams) {
        for (const event_index o : ops) {
          if (s.is_comm[o]) comm_ops.push_back(o);
        }
      }
      std::sort(comm_ops.begin(), comm_ops.end(), [&](event_index a, event_index b) {
        return s.enqueue[a] != s.enqueue[b] ? s.enqueue[a] < s.enqueue[b] : a < b;
      });
      std::map<std::pair<std::string, std::string>, std::int64_t> counters;
      for (const event_index o : comm_ops) {
        // Collective args live on the kernel (newer PyTorch) or on its record_param_comms op.
        std::size_t source = o;
        if (!t.arg(o, trace::arg_key::process_group_name) && t.events[o].external_id >= 0) {
          const auto it = s.collective_op_by_external.find(t.events[o].external_id);
          if (it != s.collective_op_by_external.end()) source = it->second;
        }
        std::string group;
        if (const auto g = t.arg(source, trace::arg_key::process_group_name)) {
          group = std::string(t.str(static_cast<string_id>(*g)));
          any_args = true;
        } else {
          any_fallback = true;
        }
        const std::string type =
            detail::collective_type(t.name(t.events[o]), t.arg_text(source, trace::arg_key::collective_name));
        const std::int64_t seq = counters[{group, type}]++;
        const auto key = std::make_tuple(group, type, seq);
        by_key[key].push_back({r, o});
        auto& m = meta[key];
        if (m.first.empty()) m.first = detail::parse_rank_list(t.arg_text(source, trace::arg_key::process_group_ranks));
        if (m.second == 0) {
          if (const auto nel = t.arg(source, trace::arg_key::in_msg_nelems)) m.second = *nel;
        }
      }
    }
    for (auto& [key, members] : by_key) {
      // A rank appearing twice under one key means the sequences diverged: keep it unmatched.
      std::vector<std::size_t> seen;
      bool clash = false;
      for (const auto& m : members) {
        if (std::find(seen.begin(), seen.end(), m.rank_index) != seen.end()) clash = true;
        seen.push_back(m.rank_index);
      }
      if (members.size() < 2 || clash) continue;
      instance_plan plan;
      plan.info.group = std::get<0>(key).empty() ? "world" : std::get<0>(key);
      plan.info.kind = std::get<1>(key);
      plan.info.sequence = std::get<2>(key);
      plan.info.group_ranks = meta[key].first;
      plan.info.bytes = meta[key].second;  // elements when only nelems is known; 0 if unknown
      plan.info.match = std::get<0>(key).empty() ? "world group + order of same-type kernels" : "process group + sequence";
      plan.members = members;
      const auto id = static_cast<std::int32_t>(plans_.size());
      for (const auto& m : members) ranks_[m.rank_index].instance[m.op] = id;
      plans_.push_back(std::move(plan));
    }
    auto& st = out_.stats;
    st.collective_matching = any_args && any_fallback ? "process group + sequence where args exist, else world group + order"
                             : any_args              ? "process group + sequence (collective args)"
                             : any_fallback          ? "world group + order of same-type kernels (no collective args in the traces)"
                                                     : "no communication ops";
  }

  // ---- building one rank -----------------------------------------------------------------

  struct cpu_task_info {
    task_id task;
    std::uint32_t lane_slot;
    time_ns start, end, busy;  // observed, job time
  };

  void build_rank(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    task_graph& g = out_.graph;
    const int rank = t.rank;

    // 1. Blocking calls: which GPU ops each waits for (decided before tasks are made).
    std::unordered_map<event_index, std::vector<event_index>> awaited = find_blocking_calls(r);

    // 2. CPU tasks, thread by thread.
    std::vector<cpu_task_info> cpu_tasks;
    for (std::uint32_t slot = 0; slot < s.cpu_lanes.size(); ++slot) {
      build_thread(r, slot, awaited, cpu_tasks);
    }

    // 3. GPU tasks, stream by stream (edges come in step 4, once every task exists).
    for (const auto& [key, ops] : s.streams) {
      const processor_id p = g.add_processor({processor_kind::gpu_stream, rank, key.device, key.stream,
                                              "rank " + std::to_string(rank) + " stream " + std::to_string(key.stream)});
      ++out_.stats.streams;
      for (const event_index o : ops) {
        const trace::event& e = t.events[o];
        const time_ns b = start_of(r, o), en = end_of(r, o);
        if (s.instance[o] >= 0) {
          s.arrive_of_event[o] = g.add_task(p, task_kind::comm_arrive, 0, 0, 0, t.name(e), rank, o, b, b);
          s.task_of_event[o] = g.add_task(p, task_kind::comm_complete, e.dur, 0, 0, t.name(e), rank, o, b, en);
        } else {
          const task_kind k = s.is_comm[o] ? task_kind::gpu_comm : task_kind::gpu_compute;
          if (s.is_comm[o]) ++out_.stats.collectives_unmatched;
          s.task_of_event[o] = g.add_task(p, k, e.dur, 0, 0, t.name(e), rank, o, b, en);
        }
        ++out_.stats.gpu_tasks;
      }
    }

    // 4. GPU dependencies: launch, stream order and cross-stream edges, with gaps and delays.
    const auto producers = options_.cross_stream ? find_cross_stream(r) : std::unordered_map<event_index, std::vector<event_index>>{};
    gpu_edges(r, producers);

    // 5. GPU → CPU: finish edges into the blocking calls.
    for (const auto& [call, ops] : awaited) {
      const task_id wait = s.task_of_event[call];
      const time_ns call_end = end_of(r, call);
      time_ns latest = std::numeric_limits<time_ns>::min();
      for (const event_index o : ops) latest = std::max(latest, end_of(r, o));
      const time_ns tail = call_end - std::max(latest, g.observed_start[wait]);
      for (const event_index o : ops) {
        g.add_edge(s.task_of_event[o], wait, std::max<time_ns>(tail, 0), edge_kind::sync, true);
        ++out_.stats.sync_edges;
      }
    }

    // 6. CPU → CPU hand-offs across threads of this rank.
    handoffs(cpu_tasks);
  }

  // The GPU ops a call waited for, keyed by the call's event. Exact from cuda_sync rows when the
  // trace has them, inferred from the timing otherwise (see docs/replay.md).
  std::unordered_map<event_index, std::vector<event_index>> find_blocking_calls(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    std::unordered_map<event_index, std::vector<event_index>> awaited;
    // The last op enqueued on each stream before time `at` (rank-local ts).
    auto last_enqueued = [&](const std::vector<event_index>& ops, time_ns at) -> event_index {
      auto it = std::partition_point(ops.begin(), ops.end(), [&](event_index o) { return s.enqueue[o] < at; });
      return it == ops.begin() ? no_event : *(it - 1);
    };
    for (const auto& [lane, events] : s.cpu_lanes) {
      for (std::size_t k = 0; k < events.size(); ++k) {
        const event_index c = events[k];
        const trace::event& call = t.events[c];
        if (!detail::is_runtime(call.cat)) continue;
        const std::string_view name = t.name(call);
        const bool device_sync = name == "cudaDeviceSynchronize" || name == "cudaCtxSynchronize";
        const bool stream_sync = name == "cudaStreamSynchronize" || name == "cuStreamSynchronize";
        const bool event_sync = name == "cudaEventSynchronize" || name == "cuEventSynchronize";
        const bool copy = name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy");
        // A poll that succeeded ends a run of queries: the next anchor is not another query.
        bool poll = false;
        if (name == "cudaEventQuery" || name == "cudaStreamQuery") {
          bool previous_poll = false, next_poll = false;
          for (std::size_t j = k; j-- > 0;) {
            if (!detail::is_runtime(t.events[events[j]].cat)) continue;
            const auto n = t.name(t.events[events[j]]);
            previous_poll = n == "cudaEventQuery" || n == "cudaStreamQuery";
            break;
          }
          for (std::size_t j = k + 1; j < events.size(); ++j) {
            if (!detail::is_runtime(t.events[events[j]].cat)) continue;
            const auto n = t.name(t.events[events[j]]);
            next_poll = n == "cudaEventQuery" || n == "cudaStreamQuery";
            break;
          }
          poll = previous_poll && !next_poll;
        }
        if (!device_sync && !stream_sync && !event_sync && !copy && !poll) continue;

        std::vector<event_index> ops;
        if (copy) {
          // A copy blocks when its own GPU op ended before the call returned.
          const auto it = s.ops_by_corr.find(call.correlation);
          if (it != s.ops_by_corr.end()) {
            for (const event_index o : it->second) {
              if (t.events[o].end() <= call.end() && t.events[o].end() > call.ts) ops.push_back(o);
            }
          }
        }
        const auto rows = copy ? s.sync_by_corr.end() : s.sync_by_corr.find(call.correlation);
        if (rows != s.sync_by_corr.end()) {
          // Exact: the cuda_sync row names the stream waited on.
          for (const event_index row : rows->second) {
            const auto on = t.arg(row, trace::arg_key::wait_on_stream);
            const int stream = on && *on >= 0 ? static_cast<int>(*on) : t.events[row].stream;
            for (const auto& [key, sops] : s.streams) {
              if (!device_sync && key.stream != stream) continue;
              const event_index o = last_enqueued(sops, call.ts);
              if (o != no_event && t.events[o].end() > call.ts) ops.push_back(o);
            }
          }
        }
        if (!copy && ops.empty()) {
          // Inferred: among the last op enqueued on each stream before the call, the ones that
          // ended while the call was blocked; a stream or event sync waited for the latest.
          event_index best = no_event;
          for (const auto& [key, sops] : s.streams) {
            const event_index o = last_enqueued(sops, call.ts);
            if (o == no_event) continue;
            const trace::event& op = t.events[o];
            if (op.end() <= call.ts || op.end() > call.end() || call.end() - op.end() > options_.sync_tolerance) continue;
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
        if (!ops.empty()) awaited[c] = std::move(ops);
      }
    }
    return awaited;
  }

  void build_thread(std::size_t r, std::uint32_t slot, const std::unordered_map<event_index, std::vector<event_index>>& awaited,
                    std::vector<cpu_task_info>& cpu_tasks) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    task_graph& g = out_.graph;
    const auto& [lane_id, events] = s.cpu_lanes[slot];
    const trace::lane& lane = t.lanes[lane_id];
    std::string pname = "rank " + std::to_string(t.rank) + " thread " + std::to_string(lane.tid);
    if (lane.thread_name != no_string) pname += " (" + std::string(t.str(lane.thread_name)) + ")";
    const processor_id p = g.add_processor({processor_kind::cpu_thread, t.rank, lane.pid, lane.tid, pname});
    ++out_.stats.threads;

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
    std::size_t cursor = 0;
    auto busy_between = [&](time_ns from, time_ns to) {
      time_ns total = 0;
      while (cursor < busy.size() && busy[cursor].second <= from) ++cursor;
      for (std::size_t j = cursor; j < busy.size() && busy[j].first < to; ++j) {
        total += std::max<time_ns>(0, std::min(to, busy[j].second) - std::max(from, busy[j].first));
      }
      return total;
    };

    time_ns previous_end = 0;  // job time 0 for the first task
    task_id owner = no_task;   // the anchor an overlapping (nested) call belongs to
    time_ns owner_end = std::numeric_limits<time_ns>::min();
    auto add = [&](task_kind kind, time_ns duration, time_ns begin, time_ns end, std::string_view name, event_index source) {
      const time_ns gap = std::max<time_ns>(0, begin - previous_end);
      const time_ns b = busy_between(previous_end, begin);
      const task_id id = g.add_task(p, kind, duration, gap - b, b, name, t.rank, source, begin, end);
      cpu_tasks.push_back({id, slot, begin, end, b});
      ++out_.stats.cpu_tasks;
      previous_end = std::max(previous_end, end);
      return id;
    };
    for (const event_index i : events) {
      const trace::event& e = t.events[i];
      if (!detail::is_runtime(e.cat)) continue;
      const time_ns b = start_of(r, i), en = end_of(r, i);
      if (owner != no_task && b < owner_end) {  // a call nested in the previous one
        s.task_of_event[i] = owner;
        continue;
      }
      const auto wait = awaited.find(i);
      if (wait == awaited.end()) {
        owner = add(task_kind::cpu, e.dur, b, en, t.name(e), i);
      } else {
        ++out_.stats.blocking_calls;
        // The call's own time after the wait (FIDELITY.md item 3); the wait comes from the
        // finish edges. A call that waits for an op it launched itself is split in two.
        time_ns latest = std::numeric_limits<time_ns>::min();
        bool own_op = false;
        for (const event_index o : wait->second) {
          latest = std::max(latest, end_of(r, o));
          own_op = own_op || t.events[o].correlation == e.correlation;
        }
        if (own_op) {
          time_ns issue_end = en;
          for (const event_index o : wait->second) issue_end = std::min(issue_end, std::max(b, start_of(r, o)));
          const task_id issue = add(task_kind::cpu, issue_end - b, b, issue_end, t.name(e), i);
          launch_task_[{r, e.correlation}] = issue;
          owner = add(task_kind::cpu_blocking, en - std::max(latest, issue_end), issue_end, en, t.name(e), i);
        } else {
          owner = add(task_kind::cpu_blocking, en - std::max(latest, b), b, en, t.name(e), i);
        }
      }
      owner_end = en;
      s.task_of_event[i] = owner;
    }
    // The thread's trailing CPU work, so that hand-offs from this thread see its real end.
    if (last_end > previous_end) add(task_kind::cpu, 0, last_end, last_end, "thread end", no_event);
  }

  // Cross-stream producers of each GPU op (consumer event → producer events).
  std::unordered_map<event_index, std::vector<event_index>> find_cross_stream(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    std::unordered_map<event_index, std::vector<event_index>> producers;
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
        const auto it = s.ops_by_corr.find(t.events[c].correlation);
        if (it == s.ops_by_corr.end()) continue;
        for (const event_index o : it->second) launches.push_back({t.events[c].ts, o});
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
        if (name.starts_with("cudaEventRecord")) {
          last_record = c;
          continue;
        }
        if (name != "cudaStreamWaitEvent" && name != "cuStreamWaitEvent") continue;
        // Exact pairing from a cuda_sync "Stream Wait Event" row, when present.
        event_index producer = no_event, consumer = no_event;
        bool exact = false;
        if (const auto rows = s.sync_by_corr.find(call.correlation); rows != s.sync_by_corr.end()) {
          for (const event_index row : rows->second) {
            const auto on = t.arg(row, trace::arg_key::wait_on_stream);
            const auto rec = t.arg(row, trace::arg_key::wait_on_event_record_correlation);
            if (!on || *on < 0) continue;
            time_ns record_time = call.ts;
            if (rec) {
              const auto it = s.runtime_by_corr.find(*rec);
              if (it != s.runtime_by_corr.end()) record_time = t.events[it->second].ts;
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
          ++out_.stats.cross_stream_unresolved;
          continue;
        }
        producers[consumer].push_back(producer);
        ++(exact ? out_.stats.cross_stream_exact : out_.stats.cross_stream_inferred);
      }
    }
    return producers;
  }

  // Launch, stream-order and cross-stream constraints of every GPU op, turned into gaps and edge
  // delays so that an unchanged replay reproduces the measured start (the constraint that bound
  // the op keeps its exact measured slack; the others get their typical latency, clipped to
  // the measured slack).
  void gpu_edges(std::size_t r, const std::unordered_map<event_index, std::vector<event_index>>& producers) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    task_graph& g = out_.graph;
    struct constraint {
      time_ns launch_start = 0, launch_end = 0, prev_end = 0;
      event_index launch = no_event;
      bool has_prev = false;
    };
    auto launch_of = [&](event_index o) -> event_index {
      const auto it = s.runtime_by_corr.find(t.events[o].correlation);
      return it == s.runtime_by_corr.end() ? no_event : it->second;
    };
    // Typical launch latency per stream: the median over ops that were launch-bound.
    std::map<stream_key, time_ns> typical;
    std::vector<time_ns> all;
    for (const auto& [key, ops] : s.streams) {
      std::vector<time_ns> lat;
      for (std::size_t k = 0; k < ops.size(); ++k) {
        const event_index o = ops[k];
        const event_index l = launch_of(o);
        if (l == no_event) continue;
        const time_ns st = t.events[o].ts;
        if (k > 0 && st - t.events[ops[k - 1]].end() <= options_.bound_tolerance) continue;
        bool dep_bound = false;
        if (const auto it = producers.find(o); it != producers.end()) {
          for (const event_index pr : it->second) dep_bound = dep_bound || st - t.events[pr].end() <= options_.bound_tolerance;
        }
        if (!dep_bound) lat.push_back(st - launch_anchor(t.events[l]));
      }
      all.insert(all.end(), lat.begin(), lat.end());
      typical[key] = detail::median(lat, -1);
    }
    const time_ns rank_typical = detail::median(all, options_.default_launch_latency);

    for (const auto& [key, ops] : s.streams) {
      const time_ns lat_typ = typical[key] >= 0 ? typical[key] : rank_typical;
      std::unordered_map<event_index, int> uses_of_launch;
      for (std::size_t k = 0; k < ops.size(); ++k) {
        const event_index o = ops[k];
        const bool joined = s.instance[o] >= 0;
        const task_id first = joined ? s.arrive_of_event[o] : s.task_of_event[o];
        const time_ns start = start_of(r, o);
        // Candidates with their minimal delays; the largest bound the op.
        enum { none, stream, launch, dep } binding = none;
        time_ns best = std::numeric_limits<time_ns>::min();
        time_ns prev_end = 0;
        if (k > 0) {
          prev_end = end_of(r, ops[k - 1]);
          best = prev_end;
          binding = stream;
        }
        const event_index l = launch_of(o);
        task_id launch_task = no_task;
        time_ns latency = 0;
        bool from_call_start = true;
        if (l != no_event) {
          launch_task = launch_task_for(r, l);
          // Latency counts from the call's start (FIDELITY.md item 4), or from its end when the
          // call blocked (e.g. lazy module loading) and the op could only start after it returned.
          from_call_start = !blocked_launch(g.observed_start[launch_task], g.observed_end[launch_task]);
          const time_ns anchor = from_call_start ? g.observed_start[launch_task] : g.observed_end[launch_task];
          latency = start - anchor;
          const time_ns c = anchor + std::min(lat_typ, latency);
          if (c > best) {
            best = c;
            binding = launch;
          }
          if (uses_of_launch[l]++ > 0 || s.ops_by_corr[t.events[o].correlation].size() > 1) ++out_.stats.graph_launch_ops;
        } else {
          ++out_.stats.ops_without_launch;
        }
        std::vector<std::pair<event_index, time_ns>> deps;
        event_index dep_binding = no_event;
        if (const auto it = producers.find(o); it != producers.end()) {
          for (const event_index pr : it->second) {
            const time_ns pe = end_of(r, pr);
            if (pe > start) {  // the producer ended after the consumer began: not a real wait
              ++out_.stats.cross_stream_unresolved;
              continue;
            }
            deps.push_back({pr, pe});
            if (pe > best) {
              best = pe;
              binding = dep;
              dep_binding = pr;
            }
          }
        }
        // Stream order: the measured gap after the predecessor only when it bound the op.
        if (k == 0) {
          g.idle_gap[first] = binding == none ? start : 0;  // nothing else anchors it
        } else {
          // A negative slack is a measured overlap with the predecessor (programmatic dependent
          // launch on Hopper/Blackwell lets a kernel start before the previous one ends): kept.
          const time_ns slack = start - prev_end;
          if (slack < 0) ++out_.stats.stream_overlaps;
          g.idle_gap[first] = binding == stream ? slack : 0;
        }
        if (launch_task != no_task) {
          const time_ns lat = binding == launch ? latency : std::min(lat_typ, latency);
          g.add_edge(launch_task, first, lat, edge_kind::launch, false, from_call_start);
          ++out_.stats.launch_edges;
        }
        for (const auto& [pr, pe] : deps) {
          const time_ns delay = pr == dep_binding ? start - pe : 0;
          g.add_edge(task_of(r, pr), first, delay, edge_kind::cross_stream);
        }
      }
    }
  }

  [[nodiscard]] task_id task_of(std::size_t r, event_index o) const { return ranks_[r].task_of_event[o]; }

  // A launch call that lasted longer than `blocked_launch`: its op was enqueued near its end.
  [[nodiscard]] bool blocked_launch(time_ns call_start, time_ns call_end) const noexcept {
    return call_end - call_start > options_.blocked_launch;
  }

  // The point of a launch call an op's latency is measured from (rank-local time).
  [[nodiscard]] time_ns launch_anchor(const trace::event& call) const noexcept {
    return blocked_launch(call.ts, call.end()) ? call.end() : call.ts;
  }

  [[nodiscard]] task_id launch_task_for(std::size_t r, event_index call) const {
    const auto it = launch_task_.find({r, job_.ranks[r].events[call].correlation});
    return it != launch_task_.end() ? it->second : ranks_[r].task_of_event[call];
  }

  void handoffs(std::vector<cpu_task_info>& tasks) {
    task_graph& g = out_.graph;
    if (tasks.empty()) return;
    std::vector<std::size_t> by_end(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) by_end[i] = i;
    std::sort(by_end.begin(), by_end.end(), [&](std::size_t a, std::size_t b) {
      return tasks[a].end != tasks[b].end ? tasks[a].end < tasks[b].end : a < b;
    });
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
      g.add_edge(tasks[source].task, t, ready - tasks[source].end, edge_kind::thread_handoff);
      g.idle_gap[t] = 0;
      ++out_.stats.handoffs;
    }
  }

  // ---- joins ------------------------------------------------------------------------------

  void finish_collectives() {
    task_graph& g = out_.graph;
    for (instance_plan& plan : plans_) {
      // Each join gets a processor of its own: joins must not be ordered among themselves (the
      // participants' streams already order a group's collectives).
      const processor_id barrier = g.add_processor(
          {processor_kind::barrier, -1, 0, static_cast<std::int64_t>(g.collectives.size()),
           plan.info.kind + " #" + std::to_string(plan.info.sequence) + " of group " + plan.info.group});
      // The transfer is the shortest participant: the last to arrive waited least.
      time_ns transfer = std::numeric_limits<time_ns>::max();
      for (const participant& m : plan.members) transfer = std::min(transfer, job_.ranks[m.rank_index].events[m.op].dur);
      const task_id join = g.add_task(barrier, task_kind::join, 0, 0, 0, plan.info.kind, -1, ~0U);
      plan.info.join = join;
      for (const participant& m : plan.members) {
        const task_id a = ranks_[m.rank_index].arrive_of_event[m.op];
        const task_id c = ranks_[m.rank_index].task_of_event[m.op];
        g.duration[c] = transfer;
        g.add_edge(a, join, 0, edge_kind::collective);
        g.add_edge(join, c, 0, edge_kind::collective);
        plan.info.arrive.push_back(a);
        plan.info.complete.push_back(c);
        ++out_.stats.collective_participants;
      }
      // The join happens when the last participant arrives.
      time_ns last = std::numeric_limits<time_ns>::min();
      for (const task_id a : plan.info.arrive) last = std::max(last, g.observed_start[a]);
      g.observed_start[join] = g.observed_end[join] = last;
      g.collectives.push_back(std::move(plan.info));
      ++out_.stats.collectives_matched;
    }
  }

  const trace::job& job_;
  build_options options_;
  Comm is_comm_;
  std::vector<rank_state> ranks_;
  std::vector<instance_plan> plans_;
  std::map<std::pair<std::size_t, std::int64_t>, task_id> launch_task_;  // split blocking copies
  built_job out_;
};

/// Builds the execution graph of `job` with the default communication classifier.
[[nodiscard]] inline built_job build_graph(const trace::job& job, const build_options& options = {}) {
  return trace_graph_builder<>(job, options).build();
}

}  // namespace lumos::graph

#pragma once
// Builds the execution graph of a whole job from its Kineto traces: tasks on CPU threads and
// GPU streams, every dependency kind of design/ARCHITECTURE.md, and collectives joined across
// ranks. The rules are documented in docs/replay.md; the numbers that tune them are in
// `build_options`.

#include <lumos/core/error.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/trace/comm.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/summary.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <tuple>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace lumos::graph {

/// A selective what-if (`--scale op:TEXT=F`): every CPU event (operator, annotation, runtime
/// call) whose name contains `text` has its time, and everything nested in it, multiplied by
/// `factor`; so has every GPU op whose name contains `text` or that was launched from inside
/// such a CPU event. 0 removes the time (a blocking call inside a removed op no longer waits).
struct op_scale {
  std::string text;
  double factor = 1.0;
};

/// Tunables of the trace → graph rules. None of them decides whether a delay is an overhead
/// or a wait: that comes from distributions measured on each trace (docs/replay.md, *Delays*).
struct build_options {
  /// A CPU task that follows at least this much idle time on its thread waits for the latest
  /// task of another thread of its rank that ended before it (autograd and worker hand-offs).
  time_ns handoff_threshold = 100'000;
  /// A kernel launch call longer than this blocked (launches take microseconds; this one
  /// waited, e.g. on lazy module loading): its op counts its latency from the call's end.
  time_ns blocked_launch = 1'000'000;
  /// Idle-GPU launch latency when neither the stream nor its rank has a kernel launched onto an
  /// idle stream to learn it from.
  time_ns default_launch_latency = 5'000;
  /// Inter-kernel gap on a busy stream when neither the stream nor its rank has a queued kernel
  /// to learn it from.
  time_ns default_stream_gap = 2'000;
  /// A blocking call counts as having waited for a GPU op that ended at most this long before
  /// the call returned (inference without `cuda_sync` rows only).
  time_ns sync_tolerance = 2'000'000;
  /// Join matched collectives across ranks (off: every communication kernel keeps its duration).
  bool match_collectives = true;
  /// Pair cudaEventRecord with cudaStreamWaitEvent into cross-stream edges (off: ablation only).
  bool cross_stream = true;
  /// Find cross-stream waits that no record/wait pair explains (see docs/replay.md).
  bool implicit_waits = true;
  /// Selective what-ifs, applied when the graph is built.
  std::vector<op_scale> op_scales;
  /// A stream overlap (an op starting before its predecessor ended) longer than this breaks
  /// causality; shorter ones are programmatic dependent launch (Hopper/Blackwell) or rounding.
  time_ns overlap_tolerance = 5'000;
  /// Causality violations are errors (`lumos replay --strict`) instead of a diagnostic.
  bool strict = false;
  /// Shift each rank's clock by the offset its collectives imply (`lumos replay --align-clocks`).
  bool align_clocks = false;
};

/// A delay kept from the trace that a what-if does not move (FIDELITY.md item 8), by kind.
enum class overhead_kind : std::uint8_t {
  launch_latency,  ///< call start → op start of an op launched onto an idle stream
  stream_gap,      ///< gap after the stream predecessor of a queued op
  cpu_idle,        ///< idle time on a CPU thread not covered by operators (data loading, Python)
  sync_tail,       ///< the return of a blocking call after the GPU op it waited for
  peer_wait,       ///< wait inside a communication op whose partners are absent from the job
  unexplained,     ///< the part of a GPU op's delay that no dependency and no typical overhead explains
};
inline constexpr std::size_t overhead_kind_count = 6;

[[nodiscard]] constexpr std::string_view to_string(overhead_kind k) noexcept {
  constexpr std::array<std::string_view, overhead_kind_count> names = {"launch_latency", "stream_gap", "cpu_idle",
                                                                       "sync_tail",      "peer_wait",  "unexplained"};
  return names[static_cast<std::size_t>(k)];
}

/// One kept delay: `amount` of `kind` in front of (or inside) `task`.
struct kept_delay {
  task_id task = no_task;
  overhead_kind kind = overhead_kind::cpu_idle;
  time_ns amount = 0;
};

/// The overheads learnt from one stream's measured timeline.
struct stream_overheads {
  int rank = 0, device = 0, stream = 0;
  time_ns launch_latency = 0;   ///< median over ops launched onto the idle stream
  time_ns launch_high = 0;      ///< 95th percentile of the same
  std::size_t launch_samples = 0;
  time_ns gap = 0;              ///< median gap after the predecessor over queued ops
  time_ns gap_high = 0;         ///< 95th percentile of the same
  std::size_t gap_samples = 0;
};

/// What the builder found and how it decided; reported by `lumos replay`.
struct build_stats {
  std::size_t cpu_tasks = 0, gpu_tasks = 0, threads = 0, streams = 0;
  std::size_t launch_edges = 0;          ///< runtime call → GPU op
  std::size_t graph_launch_ops = 0;      ///< GPU ops sharing a launch with others (CUDA graphs)
  std::size_t ops_without_launch = 0;    ///< launched before the recording window
  std::size_t cross_stream_exact = 0;    ///< from cuda_sync "Stream Wait Event" records
  std::size_t cross_stream_inferred = 0; ///< record/wait pairing inferred from launch order
  std::size_t cross_stream_implicit = 0; ///< waits found from timing alone (no record/wait pair)
  std::size_t cross_stream_unresolved = 0;
  std::size_t blocking_calls = 0;        ///< syncs, blocking copies, successful polls
  std::size_t poll_waits = 0;            ///< runs of event/stream queries folded into one wait
  std::size_t sync_edges = 0;
  std::size_t handoffs = 0;              ///< CPU → CPU edges across threads
  std::size_t collectives_matched = 0;   ///< instances joined across ranks
  std::size_t collective_participants = 0;
  std::size_t collectives_unmatched = 0; ///< communication ops whose partners are absent
  std::size_t p2p_eager = 0;             ///< matched p2p transfers whose sender ended before the receiver began
  std::size_t unmatched_transfer_same_op = 0;  ///< transfer: shortest instance of the same op in another step
  std::size_t unmatched_transfer_same_size = 0;///< transfer: shortest op of the same kind, size and group
  std::size_t unmatched_kept_whole = 0;  ///< no second observation: the whole duration is transfer
  std::string collective_matching;       ///< how instances were matched
  std::size_t stream_overlaps = 0;       ///< ops that started before their stream predecessor ended
  /// Timestamps no execution can produce (a clock anomaly or a corrupted trace): an op that
  /// starts before its launch call, a stream overlap longer than `overlap_tolerance`, a
  /// collective participant that ends before another one starts. Counted, the worst described;
  /// `build_options::strict` makes them errors.
  /// Per rank (job order): the smallest shift (≤ 0 ns) of its clock under which no participant
  /// of a matched collective ends before another one arrives — the last arrival cannot follow
  /// the earliest completion. All zero when the clocks agree (ranks of one host share a clock).
  std::vector<time_ns> clock_offsets;
  bool clock_offsets_consistent = true;  ///< false: no shifts satisfy every join (mismatched collectives?)
  bool clocks_aligned = false;           ///< the offsets were applied
  std::size_t causality_violations = 0;
  time_ns worst_violation = 0;           ///< by how much the worst one breaks its rule
  std::string worst_violation_text;
  std::size_t ops_queued = 0;            ///< GPU ops whose stream bound them (launch queue)
  std::size_t ops_launch_bound = 0;      ///< GPU ops whose launch bound them (idle stream)
  std::size_t ops_dependency_bound = 0;  ///< GPU ops a cross-stream producer bound
  std::size_t ops_unexplained = 0;       ///< GPU ops with a delay beyond the 95th percentile, kept
  std::size_t op_scaled_gpu = 0, op_scaled_cpu = 0;  ///< tasks touched by `op_scales`
  std::vector<stream_overheads> overheads;  ///< per stream, in processor order
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
  std::vector<kept_delay> kept;  ///< every overhead kept from the trace (FIDELITY.md item 8)
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

[[nodiscard]] inline time_ns quantile(std::vector<time_ns> v, double q, time_ns fallback) {
  if (v.empty()) return fallback;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  const auto at = v.begin() + static_cast<std::ptrdiff_t>(std::min(k, v.size() - 1));
  std::nth_element(v.begin(), at, v.end());
  return *at;
}

[[nodiscard]] inline time_ns median(std::vector<time_ns> v, time_ns fallback) { return quantile(std::move(v), 0.5, fallback); }

[[nodiscard]] inline bool is_poll(std::string_view name) noexcept {
  return name == "cudaEventQuery" || name == "cudaStreamQuery" || name == "cuEventQuery" || name == "cuStreamQuery";
}

[[nodiscard]] inline bool is_kernel_launch(std::string_view name) noexcept {
  return name.find("Launch") != std::string_view::npos;
}

// Piecewise-constant multiplier over one thread's time line: the product of the factors of the
// `op_scales` whose events cover each instant. Identity (and free) when no pattern matched.
class time_warp {
 public:
  // `spans` are (begin, end, factor) of matched events; spans of one pattern may nest.
  void build(std::vector<std::tuple<time_ns, time_ns, double>> spans) {
    points_.clear();
    factor_.clear();
    if (spans.empty()) return;
    std::vector<time_ns> cuts;
    for (const auto& [b, e, f] : spans) cuts.push_back(b), cuts.push_back(e);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    points_ = cuts;
    factor_.assign(cuts.size(), 1.0);
    // Callers pass, per pattern, the union of its events (a pattern applies once however
    // deeply its events nest); spans of different patterns multiply.
    for (const auto& [b, e, f] : spans) {
      auto i = static_cast<std::size_t>(std::lower_bound(points_.begin(), points_.end(), b) - points_.begin());
      for (; i + 1 < points_.size() && points_[i] < e; ++i) factor_[i] *= f;
    }
  }
  [[nodiscard]] bool empty() const noexcept { return points_.empty(); }
  // The multiplier at instant t (of the segment starting at or before t).
  [[nodiscard]] double at(time_ns t) const noexcept {
    if (points_.empty() || t < points_.front() || t >= points_.back()) return 1.0;
    const auto i = static_cast<std::size_t>(std::upper_bound(points_.begin(), points_.end(), t) - points_.begin()) - 1;
    return factor_[i];
  }
  // The length of [from, to) after the multipliers.
  [[nodiscard]] time_ns length(time_ns from, time_ns to) const noexcept {
    if (to <= from) return std::max<time_ns>(0, to - from);
    if (points_.empty() || to <= points_.front() || from >= points_.back()) return to - from;
    double total = 0;
    time_ns cur = from;
    auto i = static_cast<std::size_t>(std::upper_bound(points_.begin(), points_.end(), from) - points_.begin());
    while (cur < to) {
      const time_ns next = i < points_.size() ? std::min(to, points_[i]) : to;
      const double f = (i == 0 || i >= points_.size()) ? 1.0 : factor_[i - 1];
      total += static_cast<double>(next - cur) * f;
      cur = next;
      ++i;
    }
    return static_cast<time_ns>(std::llround(total));
  }

 private:
  std::vector<time_ns> points_;
  std::vector<double> factor_;  // factor_[i] applies on [points_[i], points_[i + 1])
};

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
    estimate_clock_offsets();
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) build_rank(r);
    finish_collectives();
    if (options_.strict && out_.stats.causality_violations > 0) {
      throw error(std::to_string(out_.stats.causality_violations) + " causality violation" +
                  (out_.stats.causality_violations == 1 ? "" : "s") + " (--strict); the worst: " + out_.stats.worst_violation_text);
    }
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
    std::vector<time_ns> anchor;         // per GPU op: where its launch latency counts from (rank-local ts)
    std::vector<double> gpu_factor;      // per GPU op: product of the op_scales that apply to it
    std::vector<detail::time_warp> warps;        // per CPU lane slot: op_scales over the thread's time
    std::map<stream_key, stream_overheads> overheads;
    std::unordered_map<event_index, time_ns> transfer;  // unmatched communication ops: transfer part
  };
  static constexpr time_ns no_anchor = std::numeric_limits<time_ns>::min();

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
    s.anchor.assign(n, no_anchor);
    for (auto& [key, ops] : s.streams) {
      std::sort(ops.begin(), ops.end(), by_time);
      for (const event_index o : ops) {
        const auto it = s.runtime_by_corr.find(t.events[o].correlation);
        s.enqueue[o] = it != s.runtime_by_corr.end() ? t.events[it->second].ts : t.events[o].ts;
        if (it == s.runtime_by_corr.end()) continue;
        // Latency counts from the call's start (FIDELITY.md item 4), or from its end when a
        // kernel launch blocked (lazy module loading) and the op could only start after it.
        const trace::event& call = t.events[it->second];
        const bool blocked = call.dur > options_.blocked_launch && detail::is_kernel_launch(t.name(call));
        s.anchor[o] = blocked ? call.end() : call.ts;  // rank-local: the offset is final only at build time
      }
    }
  }

  // Per-thread multipliers and per-op factors of the selective what-ifs (`op_scales`).
  void apply_op_scales(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    s.gpu_factor.assign(t.events.size(), 1.0);
    s.warps.assign(s.cpu_lanes.size(), {});
    if (options_.op_scales.empty()) return;
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
      if (!spans.empty()) ++out_.stats.op_scaled_cpu;
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
        if (const auto it = s.runtime_by_corr.find(t.events[o].correlation); it != s.runtime_by_corr.end()) {
          f *= s.warps[slot_of_lane[t.events[it->second].lane]].at(start_of(r, it->second));
        }
        s.gpu_factor[o] = f;
        if (f != 1.0) ++out_.stats.op_scaled_gpu;
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
        // Point-to-point ops (send, recv, and both fused into one kernel) of a communicator are
        // issued in one order on both sides: the k-th of one rank pairs with the k-th of its
        // peer, whatever each side calls it.
        std::string type = detail::collective_type(t.name(t.events[o]), t.arg_text(source, trace::arg_key::collective_name));
        if (type == "send" || type == "recv" || type == "sendrecv" || type == "coalesced") type = "sendrecv";
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

  // Clock skew between hosts (docs/replay.md): difference constraints d_i − d_j ≤ end_j − start_i
  // for every pair of participants of every matched collective, solved by Bellman-Ford-style
  // relaxation from 0 — the largest solution ≤ 0, so ranks whose joins are already causal keep
  // their clocks. A relaxation still changing after as many passes as ranks means the
  // constraints have no solution (a negative cycle: collectives matched wrongly).
  void estimate_clock_offsets() {
    const std::size_t n = job_.ranks.size();
    std::vector<time_ns> d(n, 0);
    bool changed = true;
    std::size_t pass = 0;
    for (; changed && pass <= n; ++pass) {
      changed = false;
      for (const instance_plan& plan : plans_) {
        time_ns earliest_end = std::numeric_limits<time_ns>::max();
        for (const participant& m : plan.members) earliest_end = std::min(earliest_end, d[m.rank_index] + end_of(m.rank_index, m.op));
        for (const participant& m : plan.members) {
          const time_ns bound = earliest_end - start_of(m.rank_index, m.op);
          if (bound < d[m.rank_index]) {
            d[m.rank_index] = bound;
            changed = true;
          }
        }
      }
    }
    auto& st = out_.stats;
    st.clock_offsets_consistent = !changed;
    st.clock_offsets = st.clock_offsets_consistent ? d : std::vector<time_ns>(n, 0);
    if (options_.align_clocks && st.clock_offsets_consistent) {
      for (std::size_t r = 0; r < n; ++r) ranks_[r].offset += d[r];
      st.clocks_aligned = true;
    }
  }

  // ---- building one rank -----------------------------------------------------------------

  struct cpu_task_info {
    task_id task;
    std::uint32_t lane_slot;
    time_ns start, end, busy;  // observed, job time
  };

  using producer_map = std::unordered_map<event_index, std::vector<event_index>>;
  using awaited_map = std::unordered_map<event_index, std::vector<event_index>>;

  void build_rank(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    task_graph& g = out_.graph;
    const int rank = t.rank;

    // 1. What the trace says before any task exists: the selective what-ifs over its time, the
    //    GPU ops each blocking call waited for, the cross-stream producers of each op, and the
    //    overheads of each stream.
    apply_op_scales(r);
    poll_runs_.clear();
    const awaited_map awaited = find_blocking_calls(r);
    const producer_map producers = options_.cross_stream ? find_cross_stream(r) : producer_map{};
    learn_overheads(r, producers);
    unmatched_transfers(r);

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
      stream_overheads oh = s.overheads[key];
      oh.rank = rank;
      out_.stats.overheads.push_back(oh);
      for (const event_index o : ops) {
        const trace::event& e = t.events[o];
        const time_ns b = start_of(r, o), en = end_of(r, o);
        const time_ns dur = scale_time(e.dur, s.gpu_factor[o]);
        if (s.instance[o] >= 0) {
          s.arrive_of_event[o] = g.add_task(p, task_kind::comm_arrive, 0, 0, 0, t.name(e), rank, o, b, b);
          s.task_of_event[o] = g.add_task(p, task_kind::comm_complete, dur, 0, 0, t.name(e), rank, o, b, en);
        } else if (s.is_comm[o]) {
          // Partners absent: the op is its arrival, a peer wait kept as measured, then the
          // transfer (the only part `comm=F` scales).
          ++out_.stats.collectives_unmatched;
          const time_ns transfer = std::min(e.dur, s.transfer[o]);
          s.arrive_of_event[o] = g.add_task(p, task_kind::comm_arrive, 0, 0, 0, t.name(e), rank, o, b, b);
          s.task_of_event[o] = g.add_task(p, task_kind::gpu_comm, scale_time(transfer, s.gpu_factor[o]), 0, 0, t.name(e), rank,
                                          o, en - transfer, en);
          const time_ns wait = scale_time(e.dur - transfer, s.gpu_factor[o]);
          g.add_edge(s.arrive_of_event[o], s.task_of_event[o], wait, edge_kind::collective);
          if (wait > 0) out_.kept.push_back({s.task_of_event[o], overhead_kind::peer_wait, wait});
        } else {
          s.task_of_event[o] = g.add_task(p, task_kind::gpu_compute, dur, 0, 0, t.name(e), rank, o, b, en);
        }
        ++out_.stats.gpu_tasks;
      }
    }

    // 4. GPU dependencies: launch, stream order and cross-stream edges, with gaps and delays.
    gpu_edges(r, producers);

    // 5. GPU → CPU: finish edges into the blocking calls; the return after the wait is the
    //    call's tail, an overhead (FIDELITY.md item 3).
    for (const auto& [call, ops] : awaited) {
      const task_id wait = s.task_of_event[call];
      if (removed_calls_.count(wait) != 0) continue;  // inside an op scaled to 0: no wait left
      const time_ns tail = g.duration[wait];
      for (const event_index o : ops) {
        g.add_edge(s.task_of_event[o], wait, tail, edge_kind::sync, true);
        ++out_.stats.sync_edges;
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
  void learn_overheads(std::size_t r, const producer_map& producers) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    std::map<stream_key, std::vector<time_ns>> latencies, gaps;
    std::vector<time_ns> all_latencies, all_gaps;
    auto producers_end = [&](event_index o) {
      time_ns latest = std::numeric_limits<time_ns>::min();
      if (const auto it = producers.find(o); it != producers.end()) {
        for (const event_index p : it->second) {
          if (t.events[p].end() <= t.events[o].ts) latest = std::max(latest, end_of(r, p));
        }
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

  // The transfer part of each communication op whose partners are absent (FIDELITY.md item 8):
  // the shortest observed instance of the same op — the same position among the
  // communication ops of its stream and name in another profiler step — or, when the trace
  // gives message sizes, the shortest op of the same name, size and group. Without a second
  // observation the whole duration is taken as transfer, and the output says how often.
  void unmatched_transfers(std::size_t r) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    s.transfer.clear();
    const auto steps = trace::profiler_steps(t);
    auto step_of = [&](time_ns enqueue) -> int {
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (enqueue >= steps[i].start && enqueue < steps[i].start + steps[i].dur) return static_cast<int>(i);
      }
      return -1;
    };
    std::map<std::tuple<int, int, string_id, std::size_t>, std::vector<event_index>> same_op;  // device, stream, name, position
    std::map<std::tuple<string_id, std::int64_t, std::string>, std::vector<event_index>> same_size;
    for (const auto& [key, ops] : s.streams) {
      std::map<std::pair<int, string_id>, std::size_t> position;  // (step, name) → count
      for (const event_index o : ops) {
        if (!s.is_comm[o] || s.instance[o] >= 0) continue;
        const trace::event& e = t.events[o];
        const int step = step_of(s.enqueue[o]);
        if (step >= 0) same_op[{key.device, key.stream, e.name, position[{step, e.name}]++}].push_back(o);
        std::size_t source = o;
        if (!t.arg(o, trace::arg_key::in_msg_nelems) && e.external_id >= 0) {
          if (const auto it = s.collective_op_by_external.find(e.external_id); it != s.collective_op_by_external.end()) {
            source = it->second;
          }
        }
        if (const auto nel = t.arg(source, trace::arg_key::in_msg_nelems)) {
          same_size[{e.name, *nel, std::string(t.arg_text(source, trace::arg_key::process_group_name))}].push_back(o);
        }
        s.transfer[o] = e.dur;
      }
    }
    std::unordered_map<event_index, int> rule;
    auto shortest = [&](const std::vector<event_index>& ops, int which) {
      if (ops.size() < 2) return;
      time_ns best = std::numeric_limits<time_ns>::max();
      for (const event_index o : ops) best = std::min(best, t.events[o].dur);
      for (const event_index o : ops) {
        if (rule[o] != 0 && s.transfer[o] <= best) continue;
        s.transfer[o] = best;
        rule[o] = which;
      }
    };
    for (const auto& [k, ops] : same_size) shortest(ops, 2);
    for (const auto& [k, ops] : same_op) shortest(ops, 1);
    for (const auto& [o, d] : s.transfer) {
      const auto it = rule.find(o);
      const int which = it == rule.end() ? 0 : it->second;
      ++(which == 1 ? out_.stats.unmatched_transfer_same_op
         : which == 2 ? out_.stats.unmatched_transfer_same_size
                      : out_.stats.unmatched_kept_whole);
    }
  }

  // The GPU ops a call waited for, keyed by the call's event. Exact from cuda_sync rows when the
  // trace has them, inferred from the timing otherwise (see docs/replay.md). A run of event or
  // stream queries with no other runtime call between them is one poll: its last query is the
  // one that succeeded, and the whole run is its wait (`poll_runs_`: first query → last).
  awaited_map find_blocking_calls(std::size_t r) {
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
        const bool device_sync = name == "cudaDeviceSynchronize" || name == "cudaCtxSynchronize";
        const bool stream_sync = name == "cudaStreamSynchronize" || name == "cuStreamSynchronize";
        const bool event_sync = name == "cudaEventSynchronize" || name == "cuEventSynchronize";
        const bool copy = name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy");
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
              const event_index o = last_enqueued(sops, wait_from);
              if (o != no_event && t.events[o].end() > wait_from) ops.push_back(o);
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
        awaited[c] = std::move(ops);
        if (poll) poll_runs_[run_first] = c;
      }
    }
    return awaited;
  }

  void build_thread(std::size_t r, std::uint32_t slot, const awaited_map& awaited, std::vector<cpu_task_info>& cpu_tasks) {
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

    time_ns previous_end = 0;  // job time 0 for the first task
    task_id owner = no_task;   // the anchor an overlapping (nested) call belongs to
    time_ns owner_end = std::numeric_limits<time_ns>::min();
    auto add = [&](task_kind kind, time_ns duration, time_ns begin, time_ns end, std::string_view name, event_index source) {
      const auto [idle, b] = split_gap(previous_end, begin);
      const task_id id = g.add_task(p, kind, duration, idle, b, name, t.rank, source, begin, end);
      if (idle > 0) out_.kept.push_back({id, overhead_kind::cpu_idle, idle});
      cpu_tasks.push_back({id, slot, begin, end, b});
      ++out_.stats.cpu_tasks;
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
      if (const auto run = poll_runs_.find(i); run != poll_runs_.end()) call = run->second;
      const time_ns call_end = end_of(r, call);
      const auto wait = awaited.find(call);
      if (wait == awaited.end()) {
        owner = add(task_kind::cpu, own(b, en), b, en, t.name(e), i);
        owner_end = en;
        s.task_of_event[i] = owner;
        continue;
      }
      ++out_.stats.blocking_calls;
      // The call's own time after the wait (FIDELITY.md item 3) is its tail, an overhead; the
      // wait comes from the finish edges. A call that waits for an op it launched itself (a
      // synchronous copy) is split: it issues the copy in about a launch latency, then waits.
      time_ns latest = std::numeric_limits<time_ns>::min();
      bool own_op = false;
      for (const event_index o : wait->second) {
        latest = std::max(latest, end_of(r, o));
        own_op = own_op || t.events[o].correlation == t.events[call].correlation;
      }
      const bool removed = !warp.empty() && warp.at(b) == 0.0;  // inside an op scaled to 0
      if (own_op) {
        time_ns issue_end = call_end;
        for (const event_index o : wait->second) {
          const stream_overheads& oh = s.overheads[{t.events[o].device, t.events[o].stream}];
          issue_end = std::min(issue_end, std::max(b, std::min(start_of(r, o), b + oh.launch_latency)));
        }
        const task_id issue = add(task_kind::cpu, own(b, issue_end), b, issue_end, t.name(e), i);
        launch_task_[{r, e.correlation}] = issue;
        b = issue_end;
      }
      const time_ns tail = std::max<time_ns>(0, call_end - std::max(latest, b));
      owner = add(task_kind::cpu_blocking, removed ? 0 : own(call_end - tail, call_end), b, call_end, t.name(t.events[call]), call);
      if (removed) removed_calls_.insert(owner);
      if (tail > 0 && !removed) out_.kept.push_back({owner, overhead_kind::sync_tail, g.duration[owner]});
      if (call != i) {
        ++out_.stats.poll_waits;
        s.task_of_event[i] = owner;
        run_last = call;
      }
      owner_end = call_end;
      s.task_of_event[call] = owner;
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
  // delays (docs/replay.md, *Delays*). Each constraint expects the op at its base (launch call,
  // stream predecessor's end, producer's end) plus the typical overhead learnt for the stream;
  // the constraint that expects it latest bound it in the measurement and keeps its exact
  // measured delay, so an unchanged replay reproduces the measured start. The others keep their
  // typical overhead (clipped to the measured slack): a queued kernel follows its stream, not
  // its launch, and the queue drains when the GPU gets faster. A delay beyond the 95th
  // percentile of its kind is not an overhead: an op on another stream that ended within a
  // typical gap before the start explains it as a cross-stream wait (most traces have no
  // record/wait pairs for every wait); otherwise it is kept and reported as unexplained.
  void gpu_edges(std::size_t r, const producer_map& producers) {
    const trace::rank_trace& t = job_.ranks[r];
    rank_state& s = ranks_[r];
    task_graph& g = out_.graph;
    auto launch_of = [&](event_index o) -> event_index {
      const auto it = s.runtime_by_corr.find(t.events[o].correlation);
      return it == s.runtime_by_corr.end() ? no_event : it->second;
    };
    // Every GPU op of the rank by end time, for the implicit-wait search.
    std::vector<std::pair<time_ns, event_index>> by_end;
    if (options_.implicit_waits) {
      for (const auto& [key, ops] : s.streams) {
        for (const event_index o : ops) by_end.push_back({end_of(r, o), o});
      }
      std::sort(by_end.begin(), by_end.end());
    }
    for (const auto& [key, ops] : s.streams) {
      const stream_overheads& oh = s.overheads[key];
      std::unordered_map<event_index, int> uses_of_launch;
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
        if (const auto it = producers.find(o); it != producers.end()) {
          for (const event_index pr : it->second) {
            const time_ns pe = end_of(r, pr);
            if (pe > start) {  // the producer ended after the consumer began: not a real wait
              ++out_.stats.cross_stream_unresolved;
              continue;
            }
            deps.push_back({pr, pe});
            if (pe + oh.gap > expected) dep_binding = pr;
            consider(dep, pe + oh.gap);
          }
        }
        const event_index l = launch_of(o);
        const time_ns anchor = s.anchor[o] == no_anchor ? no_anchor : job_time(r, s.anchor[o]);
        if (anchor != no_anchor) consider(launch, anchor + oh.launch_latency);
        if (l != no_event && start < start_of(r, l)) {
          violation(start_of(r, l) - start, where(r, o) + " starts " + std::to_string(start_of(r, l) - start) +
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
            ++out_.stats.cross_stream_implicit;
            break;
          }
        }
        const time_ns excess = binding == none ? 0 : start - expected;
        const bool unexplained = binding != none && excess > (binding == launch ? oh.launch_high - oh.launch_latency : oh.gap_high - oh.gap);
        if (unexplained) {
          ++out_.stats.ops_unexplained;
          out_.kept.push_back({first, overhead_kind::unexplained, excess});
        }
        switch (binding) {
          case stream: ++out_.stats.ops_queued; break;
          case launch: ++out_.stats.ops_launch_bound; break;
          case dep: ++out_.stats.ops_dependency_bound; break;
          case none: break;
        }
        auto keep = [&](overhead_kind kind, time_ns amount) {
          amount -= unexplained ? excess : 0;
          if (amount > 0) out_.kept.push_back({first, kind, amount});
        };
        // Stream order: the measured gap when it bound the op, else the typical gap. A negative
        // slack is a measured overlap with the predecessor (programmatic dependent launch on
        // Hopper/Blackwell lets a kernel start before the previous one ends): kept.
        if (k == 0) {
          g.idle_gap[first] = binding == none ? start : 0;  // nothing else anchors it
        } else {
          const time_ns slack = start - prev_end;
          if (slack < 0) ++out_.stats.stream_overlaps;
          if (-slack > options_.overlap_tolerance) {
            violation(-slack, where(r, o) + " starts " + std::to_string(-slack) + " ns before the op before it on stream " +
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
          g.add_edge(launch_task, first, delay, edge_kind::launch, false, from_start);
          if (binding == launch) keep(overhead_kind::launch_latency, latency);
          ++out_.stats.launch_edges;
          if (uses_of_launch[l]++ > 0 || s.ops_by_corr[t.events[o].correlation].size() > 1) ++out_.stats.graph_launch_ops;
        } else {
          ++out_.stats.ops_without_launch;
        }
        for (const auto& [pr, pe] : deps) {
          const time_ns delay = pr == dep_binding && binding == dep ? start - pe : std::min(oh.gap, start - pe);
          g.add_edge(task_of(r, pr), first, delay, edge_kind::cross_stream);
          if (pr == dep_binding && binding == dep) keep(overhead_kind::stream_gap, start - pe);
        }
      }
    }
  }

  [[nodiscard]] task_id task_of(std::size_t r, event_index o) const { return ranks_[r].task_of_event[o]; }

  void violation(time_ns amount, std::string text) {
    auto& st = out_.stats;
    ++st.causality_violations;
    if (amount > st.worst_violation || st.worst_violation_text.empty()) {
      st.worst_violation = amount;
      st.worst_violation_text = std::move(text);
    }
  }

  [[nodiscard]] std::string where(std::size_t r, event_index i) const {
    const trace::rank_trace& t = job_.ranks[r];
    return t.file + ": event #" + std::to_string(i) + " '" + std::string(t.name(t.events[i])) + "'";
  }

  [[nodiscard]] task_id launch_task_for(std::size_t r, event_index call) const {
    const auto it = launch_task_.find({r, job_.ranks[r].events[call].correlation});
    return it != launch_task_.end() ? it->second : ranks_[r].task_of_event[call];
  }

  void handoffs(std::size_t r, std::vector<cpu_task_info>& tasks) {
    task_graph& g = out_.graph;
    const rank_state& s = ranks_[r];
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
      // The hand-off keeps the measured idle time after the other thread's task: an overhead
      // of this thread (what it did not record), warped by the selective what-ifs.
      const detail::time_warp& warp = s.warps[tasks[i].lane_slot];
      const time_ns delay = warp.empty() ? ready - tasks[source].end : warp.length(tasks[source].end, ready);
      g.add_edge(tasks[source].task, t, delay, edge_kind::thread_handoff);
      g.idle_gap[t] = 0;
      ++out_.stats.handoffs;
    }
  }

  // ---- joins ------------------------------------------------------------------------------

  void finish_collectives() {
    task_graph& g = out_.graph;
    for (instance_plan& plan : plans_) {
      // A point-to-point transfer whose sender finished before its receiver started was sent
      // eagerly (NCCL buffers small messages): the receiver waits for the sender, the sender for
      // nobody. Joining them would make the traced order a deadlock (two ranks that each send
      // before they receive on one stream), so only the receiver depends on the sender.
      if (plan.info.kind == "sendrecv" && plan.members.size() == 2) {
        const participant& x = plan.members[0];
        const participant& y = plan.members[1];
        const bool x_first = end_of(x.rank_index, x.op) <= start_of(y.rank_index, y.op);
        const bool y_first = end_of(y.rank_index, y.op) <= start_of(x.rank_index, x.op);
        if (x_first || y_first) {
          const participant& sender = x_first ? x : y;
          const participant& receiver = x_first ? y : x;
          for (const participant& m : plan.members) {
            plan.info.arrive.push_back(ranks_[m.rank_index].arrive_of_event[m.op]);
            plan.info.complete.push_back(ranks_[m.rank_index].task_of_event[m.op]);
            ++out_.stats.collective_participants;
          }
          g.add_edge(ranks_[sender.rank_index].task_of_event[sender.op], ranks_[receiver.rank_index].task_of_event[receiver.op], 0,
                     edge_kind::collective);
          plan.info.match += " (eager: the receiver waits for the sender)";
          g.collectives.push_back(std::move(plan.info));
          ++out_.stats.collectives_matched;
          ++out_.stats.p2p_eager;
          continue;
        }
      }
      // Each join gets a processor of its own: joins must not be ordered among themselves (the
      // participants' streams already order a group's collectives).
      const processor_id barrier = g.add_processor(
          {processor_kind::barrier, -1, 0, static_cast<std::int64_t>(g.collectives.size()),
           plan.info.kind + " #" + std::to_string(plan.info.sequence) + " of group " + plan.info.group});
      // The transfer is the shortest participant: the last to arrive waited least.
      time_ns transfer = std::numeric_limits<time_ns>::max();
      for (const participant& m : plan.members) {
        transfer = std::min(transfer, scale_time(job_.ranks[m.rank_index].events[m.op].dur, ranks_[m.rank_index].gpu_factor[m.op]));
      }
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
      // The join happens when the last participant arrives; no participant can end before it.
      time_ns last = std::numeric_limits<time_ns>::min();
      for (const task_id a : plan.info.arrive) last = std::max(last, g.observed_start[a]);
      for (const participant& m : plan.members) {
        const task_id c = ranks_[m.rank_index].task_of_event[m.op];
        if (g.observed_end[c] < last) {
          violation(last - g.observed_end[c], where(m.rank_index, m.op) + " (" + plan.info.kind + " #" + std::to_string(plan.info.sequence) +
                                                  " of group " + plan.info.group + ") ends " + std::to_string(last - g.observed_end[c]) +
                                                  " ns before the last participant arrives (clock skew between hosts?)");
        }
      }
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
  std::unordered_map<event_index, event_index> poll_runs_;  // per rank: first query of a poll → its last
  std::unordered_set<task_id> removed_calls_;  // blocking calls inside an op scaled to 0
  built_job out_;
};

/// Builds the execution graph of `job` with the default communication classifier.
[[nodiscard]] inline built_job build_graph(const trace::job& job, const build_options& options = {}) {
  return trace_graph_builder<>(job, options).build();
}

}  // namespace lumos::graph

#pragma once
// What building a job's graph takes and gives: `build_options`, `build_stats`, `built_job`.
// The builder is graph/trace_builder.hpp.

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
#include <functional>
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
  /// Threads for building a multi-rank graph: ranks are indexed on all of them, and each
  /// rank's analysis of its trace and its tasks and edges are made on threads - 1 workers
  /// ahead of the calling thread, which appends them to the graph in rank order. 0: one worker
  /// per hardware thread (the appending is the short part, so the calling thread mostly
  /// waits); 1: everything on the calling thread. The graph does not depend on it. A custom `CommClassifier` is called from
  /// several threads at once (through a const reference).
  unsigned threads = 0;
  /// Called with a rank's index (in `job.ranks`) once the builder reads none of its events
  /// again: on the calling thread, in rank order, right after the rank's tasks are added. A
  /// caller that owns the job and needs no events afterwards frees them there
  /// (`trace::rank_trace::drop_events`), so that the events of the ranks still to come and
  /// the graph of those done are held at once, never all of both (`lumos replay`:
  /// `report::replay_options::release_events`).
  std::function<void(std::size_t)> events_done;
  /// Whether `built_job::ranks` keeps each rank's maps from event index to task
  /// (`rank_map::task_of_event`, `arrive_of_event`), which the passes that go back to the events
  /// read: the trace writer, the HTML report, the trace-driven what-ifs. A caller that frees
  /// the events (`events_done`) has nothing for them to index; off, they are left empty and
  /// freed with the builder (109 MiB of a 512-rank job's 15 M tasks).
  bool keep_event_maps = true;
};

/// A delay kept from the trace that a what-if does not move (docs/replay.md, "Delays"), by kind.
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
  /// The task's measured start (job time), which the delay lies right before: set when the
  /// graph is built, so that reports place it after the graph's observed times are released
  /// (`task_graph::release_observations`).
  time_ns at = 0;
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
  std::size_t queue_blocked_launches = 0;  ///< launch calls that waited on a full launch queue (also in blocking_calls)
  time_ns queue_blocked_wait = 0;          ///< their time before the op they waited for ended (the whole trace)
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

/// The host-side events the profiler recorded for one CPU task: those that started on its thread
/// after the previous task ended and before it ended (its busy prelude and the call itself).
/// Keyed by the task's source event and whether it is the blocking part of a split call, so that
/// copies of the task a what-if makes (which keep the source) find it. Counts saturate at 65535.
struct recorded_events {
  std::uint32_t source = 0;  ///< the task's source event index
  bool blocking = false;     ///< the task is a `cpu_blocking` one (a split call has two tasks)
  std::uint16_t ops = 0;     ///< `cpu_op` and `user_annotation` ranges
  std::uint16_t runtime = 0; ///< `cuda_runtime` and `cuda_driver` calls
  std::uint16_t python = 0;  ///< `python_function` frames (with_stack)

  [[nodiscard]] friend constexpr bool operator<(const recorded_events& a, const recorded_events& b) noexcept {
    return a.source != b.source ? a.source < b.source : a.blocking < b.blocking;
  }
};

/// Per-rank mapping between trace events and graph tasks.
struct rank_map {
  int rank = 0;
  time_ns offset = 0;  ///< job time = event ts + offset
  std::vector<task_id> task_of_event;  ///< event index → its task (GPU op: its complete task)
  std::vector<task_id> arrive_of_event;  ///< communication ops joined across ranks: their arrive task
  /// Per CPU task with a source event, sorted: what the profiler recorded around it
  /// (model/profiler_cost.hpp removes the profiler's time from it). Kept with or without the
  /// event maps: 12 bytes a CPU task.
  std::vector<recorded_events> recorded;
  /// The host's speed as this rank's trace shows it: the median duration of its operators that
  /// only make a new view of a tensor (`metadata_op_median`); 0 when it has fewer than
  /// `metadata_ops_needed` of them. Their time is the dispatcher's and the profiler's per-op work
  /// on this host, which model/profiler_cost.hpp scales the profiler's cost by.
  time_ns metadata_op = 0;
};

/// Operators that make a view of a tensor and nothing else: no kernel, no allocation, no copy
/// (`aten::reshape` can copy, so it is not one).
inline constexpr std::array<std::string_view, 18> metadata_op_names{
    "aten::view",    "aten::t",      "aten::transpose", "aten::as_strided",     "aten::_unsafe_view", "aten::expand",
    "aten::unsqueeze", "aten::squeeze", "aten::permute",  "aten::slice",          "aten::select",       "aten::detach",
    "aten::alias",   "aten::_reshape_alias", "aten::view_as", "aten::split",    "aten::chunk",        "aten::narrow"};
inline constexpr std::size_t metadata_ops_needed = 16;

/// The median duration of `t`'s `cpu_op` events named in `metadata_op_names` (the lower middle
/// of an even count), 0 with fewer than `metadata_ops_needed`. O(events).
[[nodiscard]] inline time_ns metadata_op_median(const trace::rank_trace& t) {
  std::array<string_id, metadata_op_names.size()> ids{};
  std::transform(metadata_op_names.begin(), metadata_op_names.end(), ids.begin(), [&](std::string_view n) { return t.strings.find(n); });
  std::vector<time_ns> d;
  for (const trace::event& e : t.events) {
    if (e.cat == trace::category::cpu_op && e.name != no_string && std::find(ids.begin(), ids.end(), e.name) != ids.end()) d.push_back(e.dur);
  }
  if (d.size() < metadata_ops_needed) return 0;
  const auto mid = d.begin() + static_cast<std::ptrdiff_t>((d.size() - 1) / 2);
  std::nth_element(d.begin(), mid, d.end());
  return *mid;
}

/// A job's graph plus the maps back to its traces.
struct built_job {
  task_graph graph;
  std::vector<rank_map> ranks;  ///< same order as job.ranks
  time_ns origin = 0;           ///< absolute ns of job time 0
  build_stats stats;
  std::vector<kept_delay> kept;  ///< every overhead kept from the trace (docs/replay.md, "Delays")
};

}  // namespace lumos::graph

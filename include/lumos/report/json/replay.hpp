#pragma once
// A replay as JSON: the object `lumos replay --json` prints and the Python package's
// `Replay.to_dict()` holds (one writer, so the two agree bit for bit), and its parts — the 4-way
// breakdown, the kept overheads, the critical path — which other views (what-if) reuse.

#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/frozen.hpp>
#include <lumos/report/replay_report.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lumos::report {

/// `{"exposed_compute_ns", "overlapped_ns", "exposed_comm_ns", "other_ns", "exposed_comm_wait_ns"}`.
inline void breakdown_json(json_writer& w, const breakdown& b) {
  w.begin_object();
  w.field("exposed_compute_ns", b.exposed_compute).field("overlapped_ns", b.overlapped);
  w.field("exposed_comm_ns", b.exposed_comm).field("other_ns", b.other);
  w.field("exposed_comm_wait_ns", b.exposed_comm_wait);
  w.end_object();
}

/// One rank's kept overheads: total, the sum per kind and the largest ones with their task and
/// processor. `rank`, when given, is written first (a list of every rank's).
inline void frozen_json(json_writer& w, const graph::task_graph& g, const frozen_report& f, std::optional<int> rank = std::nullopt) {
  w.begin_object();
  if (rank) w.field("rank", *rank);
  w.field("total_ns", f.total());
  w.key("by_kind").begin_object();
  for (std::size_t k = 0; k < graph::overhead_kind_count; ++k) {
    w.field(std::string(graph::to_string(static_cast<graph::overhead_kind>(k))) + "_ns", f.by_kind[k]);
  }
  w.end_object();
  w.key("largest").begin_array();
  for (const auto& d : f.largest) {
    w.begin_object().field("kind", graph::to_string(d.kind)).field("amount_ns", d.amount).field("task", g.task_name(d.task));
    w.field("processor", g.processors[g.processor[d.task]].name).field("observed_start_ns", d.at).end_object();
  }
  w.end_array().end_object();
}

/// Every rank's kept overheads (`frozen`, in the order of `s.ranks`) as an array of
/// `frozen_json` objects, each with its rank number.
[[nodiscard]] inline std::string frozen_list_json(const replay_session& s, std::span<const frozen_report> frozen) {
  std::string out;
  json_writer w(out);
  w.begin_array();
  for (std::size_t i = 0; i < frozen.size() && i < s.ranks.size(); ++i) frozen_json(w, s.built.graph, frozen[i], s.ranks[i].rank);
  w.end_array();
  return out;
}

/// How a critical path's segments name their task: by name (`"task": NAME`, the CLI), or by id
/// and name (`"task": ID, "name": NAME`, the Python package, which indexes its timelines by id).
enum class path_task_fields : std::uint8_t { name, id_and_name };

/// A critical path: span, time per category and every segment. `rank`, when given, is written
/// first.
inline void critical_path_json(json_writer& w, const graph::task_graph& g, const critical_path& p, std::optional<int> rank = std::nullopt,
                               path_task_fields task = path_task_fields::name) {
  w.begin_object();
  if (rank) w.field("rank", *rank);
  w.field("begin_ns", p.begin).field("end_ns", p.end);
  w.key("attribution").begin_object();
  for (std::size_t c = 0; c < path_category_count; ++c) {
    w.field(std::string(to_string(static_cast<path_category>(c))) + "_ns", p.total[c]);
  }
  w.end_object();
  w.key("segments").begin_array();
  for (const auto& s : p.segments) {
    w.begin_object();
    if (task == path_task_fields::id_and_name) {
      w.field("task", s.task).field("name", g.task_name(s.task));
    } else {
      w.field("task", g.task_name(s.task));
    }
    w.field("processor", g.processors[g.processor[s.task]].name);
    w.field("category", to_string(s.category)).field("begin_ns", s.begin).field("end_ns", s.end).end_object();
  }
  w.end_array().end_object();
}

/// What `replay_json` writes beside the replay's own results. The defaults give the summary the
/// Python package holds; `lumos replay --json` asks for every part it computed.
struct replay_json_parts {
  std::span<const graph::op_scale> ops;   ///< the selective scales the replay ran with (`scales.ops`)
  bool sm_series = false;                 ///< each rank's SM utilisation per bucket
  std::span<const frozen_report> frozen;  ///< each rank's kept overheads (order of `ranks`), or none
  const critical_path* path = nullptr;    ///< a critical path (`critical_path`), and
  int path_rank = 0;                      ///< the rank it is of (`critical_path_rank`)
  const std::vector<std::filesystem::path>* trace_out = nullptr;  ///< files written (`trace_out`)
};

namespace detail {

inline void replay_rank_json(json_writer& w, const graph::task_graph& g, const rank_replay& r, const replay_json_parts& parts,
                             const frozen_report* frozen) {
  w.begin_object().field("rank", r.rank).field("file", r.file).field("step", r.step);
  w.field("measured_ns", r.measured_ns).field("simulated_ns", r.simulated_ns).field("error", r.error);
  w.key("breakdown");
  breakdown_json(w, r.simulated.split);
  w.key("breakdown_measured");
  breakdown_json(w, r.measured.split);
  w.field("sm_utilization", r.simulated.sm.mean).field("sm_utilization_measured", r.measured.sm.mean);
  if (r.measured_memory) {
    w.key("measured_memory").begin_object().field("peak_allocated_bytes", r.measured_memory->allocated)
        .field("peak_reserved_bytes", r.measured_memory->reserved).field("events", r.measured_memory->events).end_object();
  }
  if (parts.sm_series) {
    w.key("sm_utilization_series").begin_array();
    for (const double v : r.simulated.sm.series) w.value(v);
    w.end_array();
  }
  if (frozen != nullptr) {
    w.key("frozen");
    frozen_json(w, g, *frozen);
  }
  w.end_object();
}

// What the graph builder found: the graph's size, the dependencies by rule, causality, clocks,
// what bounds the GPU ops, the learnt overheads and the collectives.
inline void build_stats_json(json_writer& w, const graph::task_graph& g, const graph::build_stats& st) {
  w.key("graph").begin_object().field("tasks", g.task_count()).field("edges", g.edge_count());
  w.field("processors", g.processors.size()).end_object();
  w.key("dependencies").begin_object();
  w.field("launch", st.launch_edges).field("ops_without_launch", st.ops_without_launch).field("cuda_graph_ops", st.graph_launch_ops);
  w.field("cross_stream_exact", st.cross_stream_exact).field("cross_stream_inferred", st.cross_stream_inferred);
  w.field("cross_stream_implicit", st.cross_stream_implicit);
  w.field("cross_stream_unresolved", st.cross_stream_unresolved).field("blocking_calls", st.blocking_calls);
  w.field("poll_waits", st.poll_waits).field("queue_blocked_launches", st.queue_blocked_launches);
  w.field("queue_blocked_wait_ns", st.queue_blocked_wait);
  w.field("thread_handoffs", st.handoffs).field("stream_overlaps", st.stream_overlaps).end_object();
  w.key("causality").begin_object().field("violations", st.causality_violations).field("worst_ns", st.worst_violation);
  w.field("worst", st.worst_violation_text).end_object();
  w.key("clocks").begin_object().field("consistent", st.clock_offsets_consistent).field("aligned", st.clocks_aligned);
  w.key("offsets_ns").begin_array();
  for (const time_ns d : st.clock_offsets) w.value(d);
  w.end_array().end_object();
  w.key("gpu_ops_bound_by").begin_object().field("stream", st.ops_queued).field("launch", st.ops_launch_bound);
  w.field("dependency", st.ops_dependency_bound).field("unexplained", st.ops_unexplained).end_object();
  w.key("overheads").begin_array();
  for (const auto& oh : st.overheads) {
    w.begin_object().field("rank", oh.rank).field("device", oh.device).field("stream", oh.stream);
    w.field("launch_latency_ns", oh.launch_latency).field("launch_latency_p95_ns", oh.launch_high).field("launch_samples", oh.launch_samples);
    w.field("gap_ns", oh.gap).field("gap_p95_ns", oh.gap_high).field("gap_samples", oh.gap_samples).end_object();
  }
  w.end_array();
  w.key("collectives").begin_object().field("matched", st.collectives_matched).field("participants", st.collective_participants);
  w.field("unmatched_ops", st.collectives_unmatched).field("p2p_eager", st.p2p_eager).field("matching", st.collective_matching);
  w.key("unmatched_transfer").begin_object().field("same_op_other_step", st.unmatched_transfer_same_op);
  w.field("same_size_and_group", st.unmatched_transfer_same_size).field("kept_whole", st.unmatched_kept_whole).end_object();
  w.end_object();
}

// Leave-one-step-out: per rank, the prediction of the other step and its two baselines.
inline void held_out_json(json_writer& w, const replay_session& s) {
  w.key("held_out").begin_array();
  for (std::size_t i = 0; i < s.held_out.size(); ++i) {
    const auto& h = s.held_out[i];
    w.begin_object().field("rank", s.ranks[i].rank).field("structure_step", s.ranks[i].step).field("durations_step", h.from_step);
    w.field("measured_ns", h.measured_ns).field("predicted_ns", h.predicted_ns);
    w.field("error", relative_error(h.predicted_ns, h.measured_ns));
    w.field("baseline_same_step_ns", h.same_step_ns).field("baseline_same_step_error", relative_error(h.same_step_ns, h.measured_ns));
    w.field("baseline_gpu_busy_ns", h.gpu_busy_ratio_ns).field("baseline_gpu_busy_error", relative_error(h.gpu_busy_ratio_ns, h.measured_ns));
    w.field("tasks_matched", h.tasks.matched).field("tasks_unmatched", h.tasks.unmatched).field("tasks_source", h.tasks.source);
    w.field("comparable", h.tasks.comparable()).end_object();
  }
  w.end_array();
}

/// The host speed the profiler's cost follows (graph::rank_map::metadata_op): the median over
/// the ranks that measure it (the lower middle of an even count), 0 where none does.
[[nodiscard]] inline time_ns metadata_op_ns(const graph::built_job& b) {
  std::vector<time_ns> v;
  for (const graph::rank_map& r : b.ranks) {
    if (r.metadata_op > 0) v.push_back(r.metadata_op);
  }
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace detail

/// The replay `s` as one JSON object: the job's measured and simulated iteration and error, the
/// scales, every rank (iterations, breakdowns, SM utilisation), what the graph builder found,
/// the held-out prediction when the replay made one, and the `parts` asked for. O(ranks +
/// overheads + the parts' size).
inline void replay_json(json_writer& w, const replay_session& s, const replay_json_parts& parts = {}) {
  w.begin_object();
  w.key("job").begin_object().field("measured_ns", s.measured_ns).field("simulated_ns", s.simulated_ns).field("error", s.error);
  w.field("unprofiled_ns", s.unprofiled_ns).field("metadata_op_ns", detail::metadata_op_ns(s.built)).end_object();
  w.key("scales").begin_object().field("compute", s.scales.compute).field("comm", s.scales.comm).field("cpu", s.scales.cpu);
  w.key("ops").begin_array();
  for (const auto& o : parts.ops) w.begin_object().field("text", o.text).field("factor", o.factor).end_object();
  w.end_array().end_object();
  w.key("ranks").begin_array();
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    detail::replay_rank_json(w, s.built.graph, s.ranks[i], parts, i < parts.frozen.size() ? &parts.frozen[i] : nullptr);
  }
  w.end_array();
  detail::build_stats_json(w, s.built.graph, s.built.stats);
  if (!s.held_out.empty()) detail::held_out_json(w, s);
  if (parts.path != nullptr) {
    w.key("critical_path");
    critical_path_json(w, s.built.graph, *parts.path);
    w.field("critical_path_rank", parts.path_rank);
  }
  if (parts.trace_out != nullptr) {
    w.key("trace_out").begin_array();
    for (const auto& f : *parts.trace_out) w.value(f.string());
    w.end_array();
  }
  w.end_object();
}

/// The same, as one line of text (ending in a newline).
[[nodiscard]] inline std::string replay_json(const replay_session& s, const replay_json_parts& parts = {}) {
  std::string out;
  json_writer w(out);
  replay_json(w, s, parts);
  out += '\n';
  return out;
}

}  // namespace lumos::report

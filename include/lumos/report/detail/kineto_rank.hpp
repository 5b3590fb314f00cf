#pragma once
// The Kineto writer's view of one rank (report/trace_writer.hpp): the rank's source trace and
// event maps, its tasks and edges, the copies a what-if made of repeated events, and what the
// writer's parts (detail/kineto_tasks.hpp, detail/kineto_events.hpp) leave for each other.

#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/event.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::report::detail {

// Time map of one thread, measured → simulated, through its tasks' ends: linear where a gap
// shrank, a shift from the task before where it grew.
class time_warp {
 public:
  void add(time_ns measured, time_ns simulated) { points_.push_back({measured, simulated}); }
  void finish() {
    std::stable_sort(points_.begin(), points_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  [[nodiscard]] time_ns operator()(time_ns x) const {
    if (points_.empty()) return x;
    auto it = std::upper_bound(points_.begin(), points_.end(), x, [](time_ns v, const auto& p) { return v < p.first; });
    if (it == points_.begin()) return x + (points_.front().second - points_.front().first);
    if (it == points_.end()) return x + (points_.back().second - points_.back().first);
    const auto& [m0, s0] = *(it - 1);
    const auto& [m1, s1] = *it;
    if (m1 == m0) return s0;
    // A gap that grew (the thread waited longer, or a what-if put copies of repeated tasks in
    // it) keeps what it held at its measured distance from the task before: stretching it would
    // lengthen the operators' busy time and spread them over the copies.
    if (s1 - s0 >= m1 - m0) return s0 + (x - m0);
    const long double f = static_cast<long double>(x - m0) / static_cast<long double>(m1 - m0);
    return s0 + static_cast<time_ns>(f * static_cast<long double>(s1 - s0));
  }

 private:
  std::vector<std::pair<time_ns, time_ns>> points_;
};

// `ids`: added to the event's correlation and External id (a what-if's copy of a repeated task
// is written with ids of its own, which pair its launch, kernel and operator as the original's do).
// `edits`: the event's args written with other values (`simulated_job::edits`), or null.
inline void write_args_from_trace(json_writer& w, const trace::rank_trace& r, std::size_t i, std::int64_t ids = 0,
                                  std::int64_t record_ids = 0, const graph::collective_instance* group = nullptr,
                                  const std::vector<arg_edit>* edits = nullptr) {
  const trace::event& e = r.events[i];
  if (group != nullptr) {
    // The op's group as the graph has it (a what-if that made stages renamed and renumbered it).
    w.field("Process Group Name", group->group);
    if (!group->group_ranks.empty()) {
      std::string ranks = "[";
      for (std::size_t k = 0; k < group->group_ranks.size(); ++k) ranks += (k ? ", " : "") + std::to_string(group->group_ranks[k]);
      w.field("Process Group Ranks", ranks + "]").field("Group size", group->group_ranks.size());
    }
  }
  if (e.external_id >= 0) w.field("External id", e.external_id + ids);
  if (e.correlation >= 0 && e.ph == trace::phase::complete) w.field("correlation", e.correlation + ids);
  if (e.stream >= 0) w.field("stream", e.stream);
  if (e.device >= 0) w.field("device", static_cast<int>(e.device));
  const auto [b, en] = r.arg_range(i);
  for (std::uint32_t a = b; a < en; ++a) {
    const trace::arg_key k = r.arg_keys[a];
    if (group != nullptr && (k == trace::arg_key::process_group_name ||
                             (!group->group_ranks.empty() && (k == trace::arg_key::process_group_ranks || k == trace::arg_key::group_size)))) {
      continue;
    }
    w.key(trace::json_key(k));
    const arg_edit* edit = nullptr;
    for (std::size_t x = 0; edits != nullptr && x < edits->size() && edit == nullptr; ++x) {
      if ((*edits)[x].key == k) edit = &(*edits)[x];
    }
    if (edit != nullptr) {
      w.raw(edit->json);
    } else if (k == trace::arg_key::wait_on_event_record_correlation) {
      w.value(r.arg_values[a] + record_ids);  // the copy of the record it waits for, if that was repeated too
    } else if (!trace::is_string_arg(k)) {
      w.value(r.arg_values[a]);
    } else if (k == trace::arg_key::input_dims || k == trace::arg_key::grid || k == trace::arg_key::block) {
      w.raw(r.str(static_cast<string_id>(r.arg_values[a])));  // stored as raw JSON
    } else {
      w.value(r.str(static_cast<string_id>(r.arg_values[a])));
    }
  }
}

// Values keyed by task id for one rank's writing: a dense array over the rank's id range (the
// builders number a rank's tasks nearly contiguously), a hash map for ids outside it.
template <class V>
class task_map {
 public:
  explicit task_map(std::span<const graph::task_id> tasks) {
    if (tasks.empty()) return;
    const std::size_t range = std::size_t{tasks.back()} - tasks.front() + 1;
    if (range > 4 * tasks.size() + 4096) return;  // too sparse: everything in `other_`
    lo_ = tasks.front();
    values_.resize(range);
    present_.assign(range, 0);
  }
  void set(graph::task_id t, V v) {
    if (const std::size_t i = std::size_t{t} - lo_; t >= lo_ && i < values_.size()) {
      values_[i] = v;
      present_[i] = 1;
    } else {
      other_[t] = v;
    }
  }
  [[nodiscard]] const V* find(graph::task_id t) const {
    if (const std::size_t i = std::size_t{t} - lo_; t >= lo_ && i < values_.size()) return present_[i] ? &values_[i] : nullptr;
    const auto it = other_.find(t);
    return it != other_.end() ? &it->second : nullptr;
  }

 private:
  graph::task_id lo_ = 0;
  std::vector<V> values_;
  std::vector<std::uint8_t> present_;
  std::unordered_map<graph::task_id, V> other_;
};

// A written CPU task's source event (subset writing): where the trace had it and where it was
// written.
struct placed_event {
  time_ns ts, end, begin, finish;
  std::uint32_t order = 0;  // its place among the lane's written tasks, in written time
  std::uint32_t copy = 0;   // its copy of a repeated event (0: the traced one)
  std::uint8_t weight = 0;  // in a zero-bubble W pass (simulated_job::weight_pass)
};

// One rank being written: what every part of the writer reads, and the records they share.
//
// Copies: a what-if that repeats layers or micro-batches (whatif/editor.hpp) leaves several tasks
// with one source event. The k-th task of an event and kind (id order, which is the order on its
// processor) is its copy k. Copy 0 is written as the trace had it; copy k > 0 with its
// correlation and External id moved up by k * copy_ids, so that its launch, kernel and operator
// pair as the original's do; and the CPU events around a repeated run (its operators, its module
// scope) are written once per copy, moved with it.
class kineto_rank {
 public:
  static constexpr std::int64_t copy_ids = std::int64_t{1} << 42;

  kineto_rank(std::string& out, const simulated_job& sj, int r, const rank_index& ix)
      : job(sj), g(*sj.graph), index(ix), rank(r), w(out) {
    const std::size_t slot = index.slot(rank);
    out.clear();
    find_source();
    tasks = {index.tasks.data() + index.task_begin[slot], index.task_begin[slot + 1] - index.task_begin[slot]};
    rank_edges = {index.edges.data() + index.edge_begin[slot], index.edge_begin[slot + 1] - index.edge_begin[slot]};
    if (src != nullptr) find_copies();
    written.assign(src != nullptr ? src->events.size() : 0, 0);
  }

  const simulated_job& job;
  const graph::task_graph& g;
  const rank_index& index;
  const int rank;
  json_writer w;
  const trace::rank_trace* src = nullptr;  ///< the rank's trace (trace-built jobs), or null
  const graph::rank_map* map = nullptr;    ///< its event ↔ task map
  std::size_t plan_index = 0;              ///< its iteration plan in `job.plans`
  std::span<const graph::task_id> tasks;   ///< the rank's tasks, in id order
  std::span<const std::size_t> rank_edges; ///< the edges with an end on the rank

  std::vector<std::uint32_t> copy_k;  ///< per position in `tasks`: its copy (empty: nothing repeated)
  std::vector<std::uint32_t> copies;  ///< per source event: its copies (most over its tasks' kinds)
  std::unordered_map<std::uint64_t, std::pair<graph::task_id, graph::task_id>> copy_span;  ///< (event, k) -> first, last task

  std::map<std::uint32_t, time_warp> warps;  ///< by lane: measured → simulated time of its thread
  std::vector<std::uint8_t> written;         ///< per source event: written with its task
  std::map<std::uint32_t, std::vector<placed_event>> enclosed;  ///< subset: per lane, the CPU tasks written

  [[nodiscard]] static std::uint64_t copy_key(std::uint32_t ev, std::uint32_t k) { return (std::uint64_t{ev} << 21) | k; }
  [[nodiscard]] time_ns us(time_ns job_time) const { return job_time + job.origin; }
  [[nodiscard]] time_ns begin_of(graph::task_id t) const { return job.simulated.begin_of(t); }
  [[nodiscard]] time_ns end_of(graph::task_id t) const { return job.simulated.end_of(t); }

  /// A source event (trace-built jobs) at new times, with its category, name, row and args (its
  /// ids shifted for a copy).
  void source_event(std::size_t i, time_ns begin, time_ns end, std::int64_t ids = 0, std::int64_t record_ids = 0,
                    const graph::collective_instance* group = nullptr) {
    const trace::event& e = src->events[i];
    const trace::lane& lane = src->lanes[e.lane];
    w.begin_object().field("ph", "X").field("cat", src->str(e.cat_name)).field("name", src->name(e));
    w.field("pid", lane.pid_text != no_string ? 0 : lane.pid).field("tid", lane.tid_text != no_string ? 0 : lane.tid);
    w.key("ts").microseconds(us(begin)).key("dur").microseconds(end - begin);
    w.key("args").begin_object();
    const std::vector<arg_edit>* edits = nullptr;
    if (job.edits != nullptr) {
      if (const auto it = job.edits->find({src->rank, static_cast<std::uint32_t>(i)}); it != job.edits->end()) edits = &it->second;
    }
    write_args_from_trace(w, *src, i, ids, record_ids, group, edits);
    w.end_object().end_object();
  }

  /// The file's header up to the opening of `traceEvents`, and the thread names of its rows.
  void header() {
    w.begin_object();
    w.field("schemaVersion", 1);
    w.key("deviceProperties").begin_array();
    if (src != nullptr) {
      for (const auto& d : src->devices) {
        w.begin_object().field("id", d.id).field("name", d.name).field("totalGlobalMem", d.total_memory);
        w.field("computeMajor", d.compute_major).field("computeMinor", d.compute_minor).field("numSms", d.num_sms).end_object();
      }
    } else if (!job.device_name.empty()) {
      w.begin_object().field("id", 0).field("name", job.device_name).end_object();
    }
    w.end_array();
    w.key("distributedInfo").begin_object().field("backend", src != nullptr && !src->backend.empty() ? src->backend : "nccl");
    w.field("rank", rank);
    if (job.world_size > 0) {
      w.field("world_size", job.world_size);
    } else if (src != nullptr && src->world_size) {
      w.field("world_size", *src->world_size);
    }
    w.end_object();
    w.field("traceName", "simulated by lumos");
    w.key("traceEvents").begin_array();
    // Processor rows: process and thread names.
    std::map<std::pair<std::int64_t, std::int64_t>, std::string> rows;
    for (const auto& p : g.processors) {
      if (p.rank != rank || p.kind == graph::processor_kind::barrier) continue;
      const std::int64_t pid = p.owner;
      const std::int64_t tid = p.index;
      rows[{pid, tid}] = p.name;
    }
    for (const auto& [key, name] : rows) {
      w.begin_object().field("name", "thread_name").field("ph", "M").field("pid", key.first).field("tid", key.second);
      w.key("args").begin_object().field("name", name).end_object().end_object();
    }
  }

 private:
  // The rank's trace, event map and plan. By rank number: a what-if that drops traced ranks
  // (merged pipeline stages) keeps the others, in order, not at their index; a rank it added is
  // written from the traced rank it copies.
  void find_source() {
    if (job.source == nullptr) {
      for (std::size_t i = 0; job.plans != nullptr && i < job.plans->size(); ++i) {
        if ((*job.plans)[i].rank == rank) plan_index = i;
      }
      return;
    }
    for (std::size_t i = 0; i < job.source->ranks.size(); ++i) {
      if (job.source->ranks[i].rank == rank) src = &job.source->ranks[i];
    }
    for (std::size_t i = 0; src != nullptr && job.maps != nullptr && i < job.maps->size(); ++i) {
      if ((*job.maps)[i].rank == rank) map = &(*job.maps)[i];
    }
    for (std::size_t i = 0; src != nullptr && job.plans != nullptr && i < job.plans->size(); ++i) {
      if ((*job.plans)[i].rank == rank) {
        plan_index = i;
        break;
      }
    }
    if (src != nullptr && map == nullptr) src = nullptr;
    for (const auto& a : job.aliases) {
      if (src == nullptr && a.rank == rank) {
        src = &job.source->ranks[a.source];
        map = a.map;
        plan_index = a.plan;
      }
    }
  }

  // Numbers the copies of each source event (see the class comment).
  void find_copies() {
    std::unordered_map<std::uint64_t, std::uint32_t> count;  // (event, kind) -> tasks so far
    copies.assign(src->events.size(), 0);
    copy_k.assign(tasks.size(), 0);
    bool repeated = false;
    for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
      const std::uint32_t ev = g.source[tasks[ti]];
      if (ev == ~0U || ev >= copies.size()) continue;
      const std::uint32_t k = count[(std::uint64_t{ev} << 3) | static_cast<std::uint64_t>(g.kind[tasks[ti]])]++;
      copy_k[ti] = k;
      copies[ev] = std::max(copies[ev], k + 1);
      repeated = repeated || k > 0;
    }
    if (!repeated) {
      copy_k.clear();  // nothing repeated: the plain path
      return;
    }
    for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
      const std::uint32_t ev = g.source[tasks[ti]];
      if (ev == ~0U || ev >= copies.size()) continue;
      auto [it, fresh] = copy_span.try_emplace(copy_key(ev, copy_k[ti]), tasks[ti], tasks[ti]);
      if (!fresh) it->second.second = tasks[ti];
    }
  }
};

}  // namespace lumos::report::detail

#pragma once
// Writes a simulated job as Kineto-style JSON, one file per rank, that Perfetto opens and that
// `lumos inspect` / `lumos replay` read back. Replaying a written trace reproduces the replay
// that wrote it (tests/graph/test_trace_roundtrip.cpp).
// Writing the files (and gzip) is report/trace_files.hpp, outside lumos::core.
//
// Tasks that came from a trace keep their original names, categories and args; CPU events that
// are not tasks (operators, annotations) are placed by a piecewise-linear map of their thread's
// time from the measured to the simulated timeline. Tasks built from a model (no source event)
// are written as runtime calls and kernels, with correlation ids from their launch edges and
// collective args from their `collective_instance`. The ranks a pipeline what-if added are
// written from the traced rank each copies (`simulated_job::aliases`), each rank with only the
// events its stage kept (`simulated_job::subset`).

#include <lumos/core/error.hpp>
#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace lumos::report {

/// How a model-built task is written in a kernel-level trace (`trace_decorations`).
struct task_decoration {
  std::string kernel;      ///< GPU task: the kernel name written instead of the task's name
  std::string cpu_op;      ///< CPU launch task: the operator written around its runtime call
  std::string input_dims;  ///< its `Input Dims` (raw JSON, e.g. [[4096, 2048], [2048, 6144]])
  std::string input_type;  ///< its `Input type` (raw JSON, e.g. ["c10::BFloat16", "c10::BFloat16"])
  std::string runtime = "cudaLaunchKernel";  ///< the runtime call's name
  /// CPU task that blocks (a synchronize): written from the end of the thread's previous task,
  /// when the call was issued, to its end.
  bool blocking = false;
  /// CPU launch task: length of the runtime call, which ends the task; the operator's dispatch
  /// fills the rest. Negative: the call is the whole task.
  time_ns launch_ns = -1;
  // Collectives (the complete task):
  std::string collective;         ///< `Collective name`; empty: the instance's kind
  std::string group_description;  ///< `Process Group Description`
  std::string dtype;              ///< `dtype`, e.g. "BFloat16"
  std::int64_t element_bytes = 0; ///< `In msg nelems` = bytes / this (0: the byte count)
};

/// An annotation over a span of one rank's CPU tasks (from the start of `first` to the end of
/// `last`), e.g. a pass marker or a module scope.
struct span_annotation {
  int rank = 0;
  std::string name;
  std::string category = "user_annotation";
  graph::task_id first = graph::no_task, last = graph::no_task;
};

/// What makes a model-built job's trace look like a framework's: per task, how it is written;
/// annotations over spans of CPU tasks.
struct trace_decorations {
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> of_task;  ///< task → index into `list`, or `none`
  std::vector<task_decoration> list;
  std::vector<span_annotation> spans;

  [[nodiscard]] const task_decoration* find(graph::task_id t) const {
    return t < of_task.size() && of_task[t] != none ? &list[of_task[t]] : nullptr;
  }
};

/// The data a writer needs about one simulated job.
struct simulated_job {
  const graph::task_graph* graph = nullptr;
  task_times simulated;                          ///< the replay's times
  time_ns origin = 0;                            ///< absolute ns of job time 0
  const trace::job* source = nullptr;            ///< the traces the graph came from, if any
  const std::vector<graph::rank_map>* maps = nullptr;  ///< event ↔ task maps (with `source`)
  const std::vector<iteration_plan>* plans = nullptr;  ///< iteration windows to write as ProfilerStep
  std::vector<window_result> windows;            ///< simulated window of each plan
  int world_size = 0;
  std::string device_name;                       ///< for deviceProperties of model-built jobs
  double cpu_scale = 1.0;                        ///< the replay's `cpu` scale (busy lead and tail of a step)
  const trace_decorations* decorations = nullptr;  ///< model-built jobs: kernel-level detail
  /// A rank written from another rank's trace (a pipeline what-if's added stages): its number,
  /// the index in `source` of the traced rank it copies, its event ↔ task map, and its plan's
  /// index in `plans`.
  struct rank_source {
    int rank = 0;
    std::size_t source = 0;
    const graph::rank_map* map = nullptr;
    std::size_t plan = 0;
  };
  std::vector<rank_source> aliases;
  /// Each rank keeps only some of its trace's events, reordered (a pipeline what-if's stages):
  /// a CPU event that is no task is written around the written tasks it encloses, or not at all;
  /// the collective args of a communication op are its instance's in the graph.
  bool subset = false;
  /// Subset: per task, 1 when it runs in a zero-bubble W pass; an event around tasks of a B and a
  /// W pass (the backward's marker, a layer's scope) is written once around each.
  const std::vector<std::uint8_t>* weight_pass = nullptr;
  /// The collective args of a communication op are its instance's in the graph (as with
  /// `subset`): a what-if that folded a TP or DP change writes the target's group sizes.
  bool groups_from_graph = false;
  /// Subset: the groups of communication ops that are no collective instance, where the graph
  /// renamed them (each `complete` lists its ops; a pipeline what-if's stage copies of a TP group
  /// whose other ranks the traces lack). Other such ops keep their trace's args.
  const std::vector<graph::collective_instance>* lone_groups = nullptr;
};

namespace detail {

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
inline void write_args_from_trace(json_writer& w, const trace::rank_trace& r, std::size_t i, std::int64_t ids = 0,
                                  std::int64_t record_ids = 0, const graph::collective_instance* group = nullptr) {
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
    if (k == trace::arg_key::wait_on_event_record_correlation) {
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

}  // namespace detail

/// The simulated job of a trace replay, ready to write.
[[nodiscard]] inline simulated_job simulated_from(const replay_session& s, const trace::job& job) {
  simulated_job sj;
  sj.graph = &s.built.graph;
  sj.simulated = s.simulated_times();
  sj.origin = s.built.origin;
  sj.source = &job;
  sj.maps = &s.built.ranks;
  sj.plans = &s.plans;
  sj.cpu_scale = s.scales.cpu;
  return sj;
}

/// Every rank number of a job, in order.
[[nodiscard]] inline std::vector<int> rank_numbers(const trace::job& job) {
  std::vector<int> ranks;
  for (const auto& r : job.ranks) ranks.push_back(r.rank);
  return ranks;
}

/// Which tasks and edges each rank to write needs, found in one pass over the graph: scanning
/// the whole graph once per rank made writing a 512-rank job quadratic (minutes).
struct rank_index {
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<int> ranks;                 ///< the ranks indexed, as given
  std::vector<std::size_t> task_begin;    ///< tasks of ranks[i]: tasks[task_begin[i], task_begin[i + 1])
  std::vector<graph::task_id> tasks;      ///< every non-join task, in id order within a rank
  std::vector<std::size_t> edge_begin;    ///< same for `edges`
  std::vector<std::size_t> edges;         ///< edges with an end on the rank, in graph order
  std::vector<std::uint32_t> instance_of; ///< per task: its collective instance (the last listing it), or `none`

  [[nodiscard]] std::size_t slot(int rank) const {
    const auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) throw error("trace writer: rank " + std::to_string(rank) + " was not indexed");
    return static_cast<std::size_t>(it - ranks.begin());
  }
};

/// Indexes `g` for writing `ranks` (rank numbers; tasks of other ranks are left out).
[[nodiscard]] inline rank_index index_ranks(const graph::task_graph& g, const std::vector<int>& ranks) {
  rank_index ix;
  ix.ranks = ranks;
  std::unordered_map<int, std::uint32_t> slot_of;
  for (std::size_t i = 0; i < ranks.size(); ++i) slot_of.try_emplace(ranks[i], static_cast<std::uint32_t>(i));
  // Task ranks come in long runs: remember the last lookup.
  int last_rank = 0;
  std::uint32_t last_slot = slot_of.count(0) ? slot_of[0] : rank_index::none;
  auto slot = [&](int r) {
    if (r != last_rank) {
      const auto it = slot_of.find(r);
      last_rank = r;
      last_slot = it != slot_of.end() ? it->second : rank_index::none;
    }
    return last_slot;
  };
  // Counting sort into CSR, keeping graph order within a rank.
  const std::size_t n = ranks.size();
  ix.task_begin.assign(n + 1, 0);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] == graph::task_kind::join) continue;
    if (const auto s = slot(g.rank[t]); s != rank_index::none) ++ix.task_begin[s + 1];
  }
  ix.edge_begin.assign(n + 1, 0);
  for (const auto& e : g.edges) {
    const auto a = slot(g.rank[e.from]), b = slot(g.rank[e.to]);
    if (a != rank_index::none) ++ix.edge_begin[a + 1];
    if (b != rank_index::none && b != a) ++ix.edge_begin[b + 1];
  }
  for (std::size_t i = 0; i < n; ++i) ix.task_begin[i + 1] += ix.task_begin[i], ix.edge_begin[i + 1] += ix.edge_begin[i];
  ix.tasks.resize(ix.task_begin[n]);
  ix.edges.resize(ix.edge_begin[n]);
  std::vector<std::size_t> fill(ix.task_begin.begin(), ix.task_begin.end() - 1);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] == graph::task_kind::join) continue;
    if (const auto s = slot(g.rank[t]); s != rank_index::none) ix.tasks[fill[s]++] = t;
  }
  fill.assign(ix.edge_begin.begin(), ix.edge_begin.end() - 1);
  for (std::size_t i = 0; i < g.edges.size(); ++i) {
    const auto a = slot(g.rank[g.edges[i].from]), b = slot(g.rank[g.edges[i].to]);
    if (a != rank_index::none) ix.edges[fill[a]++] = i;
    if (b != rank_index::none && b != a) ix.edges[fill[b]++] = i;
  }
  ix.instance_of.assign(g.task_count(), rank_index::none);
  for (std::size_t c = 0; c < g.collectives.size(); ++c) {
    for (const auto t : g.collectives[c].complete) ix.instance_of[t] = static_cast<std::uint32_t>(c);
  }
  return ix;
}

/// Serialises rank `rank` (a rank number) of a simulated job as a Kineto trace into `out`
/// (cleared first: a writer of many ranks reuses one buffer); `index` holds the rank (see
/// `index_ranks`).
inline void kineto_json(std::string& out, const simulated_job& job, int rank, const rank_index& index) {
  const graph::task_graph& g = *job.graph;
  const std::size_t slot = index.slot(rank);
  out.clear();
  json_writer w(out);
  const trace::rank_trace* src = nullptr;
  const graph::rank_map* map = nullptr;
  std::size_t plan_index = 0;
  if (job.source != nullptr) {
    for (std::size_t i = 0; i < job.source->ranks.size(); ++i) {
      if (job.source->ranks[i].rank == rank) src = &job.source->ranks[i];
    }
    // The maps and plans of the traced ranks written, by rank number: a what-if that drops
    // traced ranks (merged pipeline stages) keeps the others, in order, not at their index.
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
  } else if (job.plans != nullptr) {
    for (std::size_t i = 0; i < job.plans->size(); ++i) {
      if ((*job.plans)[i].rank == rank) plan_index = i;
    }
  }
  auto us = [&](time_ns job_time) { return job_time + job.origin; };

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

  // Tasks of this rank, and the edges that touch it; trace-built tasks through their source events.
  const std::span<const graph::task_id> tasks(index.tasks.data() + index.task_begin[slot],
                                              index.task_begin[slot + 1] - index.task_begin[slot]);
  const std::span<const std::size_t> rank_edges(index.edges.data() + index.edge_begin[slot],
                                                index.edge_begin[slot + 1] - index.edge_begin[slot]);
  // A source event (trace-built jobs) at new times, with its category, name, row and args (its
  // ids shifted for a copy, see below).
  auto write_source_event = [&](std::size_t i, time_ns begin, time_ns end, std::int64_t ids = 0, std::int64_t record_ids = 0,
                                const graph::collective_instance* group = nullptr) {
    const trace::event& e = src->events[i];
    const trace::lane& lane = src->lanes[e.lane];
    w.begin_object().field("ph", "X").field("cat", src->str(e.cat_name)).field("name", src->name(e));
    w.field("pid", lane.pid_text != no_string ? 0 : lane.pid).field("tid", lane.tid_text != no_string ? 0 : lane.tid);
    w.key("ts").microseconds(us(begin)).key("dur").microseconds(end - begin);
    w.key("args").begin_object();
    detail::write_args_from_trace(w, *src, i, ids, record_ids, group);
    w.end_object().end_object();
  };
  // Copies: a what-if that repeats layers or micro-batches (whatif/editor.hpp) leaves several
  // tasks with one source event. The k-th task of an event and kind (id order, which is the
  // order on its processor) is its copy k. Copy 0 is written as the trace had it; copy k > 0
  // with its correlation and External id moved up by k * copy_ids, so that its launch, kernel
  // and operator pair as the original's do; and the CPU events around a repeated run (its
  // operators, its module scope) are written once per copy, moved with it.
  constexpr std::int64_t copy_ids = std::int64_t{1} << 42;
  std::vector<std::uint32_t> copy_k;            // per position in `tasks`
  std::vector<std::uint32_t> copies;            // per source event: its copies (most over its tasks' kinds)
  std::unordered_map<std::uint64_t, std::pair<graph::task_id, graph::task_id>> copy_span;  // (event, k) -> first, last task
  auto copy_key = [](std::uint32_t ev, std::uint32_t k) { return (std::uint64_t{ev} << 21) | k; };
  if (src != nullptr) {
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
    if (repeated) {
      for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
        const std::uint32_t ev = g.source[tasks[ti]];
        if (ev == ~0U || ev >= copies.size()) continue;
        auto [it, fresh] = copy_span.try_emplace(copy_key(ev, copy_k[ti]), tasks[ti], tasks[ti]);
        if (!fresh) it->second.second = tasks[ti];
      }
    } else {
      copy_k.clear();  // nothing repeated: the plain path
    }
  }
  std::unordered_map<std::uint64_t, std::uint8_t> written_copy;  // (event, k > 0) written
  std::map<std::uint32_t, detail::time_warp> warps;  // by lane (trace-built)
  std::vector<std::uint8_t> written(src != nullptr ? src->events.size() : 0, 0);
  // Trace-built jobs keep their own correlation ids; tasks a what-if added (a launch and its
  // kernel with no source event) are numbered from 2^40 up, clear of any the profiler wrote.
  std::int64_t next_corr = src != nullptr ? std::int64_t{1} << 40 : 1;
  detail::task_map<std::int64_t> corr_of(tasks);  // model-built or added: launch task → correlation
  for (const std::size_t i : rank_edges) {
    const auto& e = g.edges[i];
    if (e.kind == graph::edge_kind::launch && g.rank[e.from] == rank && g.source[e.from] == ~0U && !corr_of.find(e.from)) {
      corr_of.set(e.from, next_corr++);
    }
  }
  detail::task_map<std::int64_t> launch_corr(tasks);  // GPU task → its launch's correlation
  for (const std::size_t i : rank_edges) {
    const auto& e = g.edges[i];
    if (e.kind != graph::edge_kind::launch) continue;
    if (const std::int64_t* c = corr_of.find(e.from)) launch_corr.set(e.to, *c);
  }
  // Model-built: a dependency between two streams of this rank is written as PyTorch shows it:
  // a cudaEventRecord just inside the producer's launch call, a cudaStreamWaitEvent just before
  // the consumer's launch, and a cuda_sync "Stream Wait Event" row that pairs them exactly.
  struct stream_wait {
    graph::task_id producer, consumer;
    std::int64_t record_corr, wait_corr;
    bool record_with_wait = false;  // trace-built: the record is written just before the wait
  };
  detail::task_map<graph::task_id> launch_of(tasks);  // GPU task → its launch call
  for (const std::size_t i : rank_edges) {
    const auto& e = g.edges[i];
    if (e.kind == graph::edge_kind::launch && g.rank[e.to] == rank) launch_of.set(e.to, e.from);
  }
  std::multimap<graph::task_id, stream_wait> records_after, waits_before;  // keyed by launch call
  if (src == nullptr) {
    for (const std::size_t i : rank_edges) {
      const auto& e = g.edges[i];
      if ((e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) || e.finish) continue;
      if (g.rank[e.from] != rank || g.rank[e.to] != rank || g.processor[e.from] == g.processor[e.to]) continue;
      if (g.processors[g.processor[e.from]].kind != graph::processor_kind::gpu_stream ||
          g.processors[g.processor[e.to]].kind != graph::processor_kind::gpu_stream) {
        continue;
      }
      const graph::task_id* la = launch_of.find(e.from);
      const graph::task_id* lb = launch_of.find(e.to);
      if (la == nullptr || lb == nullptr || *la == *lb) continue;
      const stream_wait sw{e.from, e.to, next_corr, next_corr + 1};
      next_corr += 2;
      records_after.insert({*la, sw});
      waits_before.insert({*lb, sw});
    }
  } else {
    // Trace-built: a dependency of a GPU op a what-if added (no source event) on another stream
    // of this rank, recorded and waited for just before the added op's launch; the last op
    // queued on the producer's stream by then is the producer.
    for (const std::size_t i : rank_edges) {
      const auto& e = g.edges[i];
      if ((e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) || e.finish) continue;
      if (g.rank[e.from] != rank || g.rank[e.to] != rank || g.processor[e.from] == g.processor[e.to] || g.source[e.to] != ~0U) continue;
      if (g.processors[g.processor[e.from]].kind != graph::processor_kind::gpu_stream ||
          g.processors[g.processor[e.to]].kind != graph::processor_kind::gpu_stream) {
        continue;
      }
      const graph::task_id* lb = launch_of.find(e.to);
      if (lb == nullptr) continue;
      waits_before.insert({*lb, stream_wait{e.from, e.to, next_corr, next_corr + 1, true}});
      next_corr += 2;
    }
  }
  // A host task without an event that waits for GPU ops (sync edges: one a what-if added to a
  // trace-built job, or a model-built job's host wait) is written as the synchronize call it
  // stands for, lasting the wait, with the cuda_sync row that names what it waited for: read
  // back, the wait moves with the GPU work, where an idle gap before a zero-length call would
  // be kept as it was.
  struct host_wait {
    graph::task_id on = graph::no_task;
    bool device = false;  // it waits for several streams
  };
  detail::task_map<host_wait> waits_on(tasks);
  for (const std::size_t i : rank_edges) {
    const auto& e = g.edges[i];
    if (e.kind != graph::edge_kind::sync || g.rank[e.to] != rank || g.source[e.to] != ~0U) continue;
    if (const host_wait* h = waits_on.find(e.to)) {
      waits_on.set(e.to, {h->on, h->device || g.processor[h->on] != g.processor[e.from]});
    } else {
      waits_on.set(e.to, {e.from, false});
    }
  }
  auto write_runtime = [&](std::string_view name, const graph::processor_info& p, time_ns at, std::int64_t corr) {
    w.begin_object().field("ph", "X").field("cat", "cuda_runtime").field("name", name).field("pid", p.owner).field("tid", p.index);
    w.key("ts").microseconds(us(at)).key("dur").microseconds(0);
    w.key("args").begin_object().field("correlation", corr).end_object().end_object();
  };

  std::map<graph::processor_id, time_ns> cpu_end;  // end of each thread's last task written
  // Subset: per lane, the written CPU tasks' source events and where they were written.
  struct placed {
    time_ns ts, end, begin, finish;
    std::uint32_t order = 0;  // its place among the lane's written tasks, in written time
    std::uint32_t copy = 0;   // its copy of a repeated event (0: the traced one)
    std::uint8_t weight = 0;  // in a zero-bubble W pass (simulated_job::weight_pass)
  };
  auto weight_of = [&](graph::task_id t) -> std::uint8_t {
    return job.weight_pass != nullptr && t < job.weight_pass->size() ? (*job.weight_pass)[t] : std::uint8_t{0};
  };
  std::map<std::uint32_t, std::vector<placed>> enclosed;
  // Subset: a communication op's group as the graph has it (stages rename and renumber them).
  std::unordered_map<graph::task_id, const graph::collective_instance*> lone_group;
  if (job.subset && job.lone_groups != nullptr) {
    for (const graph::collective_instance& ci : *job.lone_groups) {
      for (const graph::task_id t : ci.complete) lone_group[t] = &ci;
    }
  }
  auto group_of = [&](graph::task_id t, graph::task_kind kind) -> const graph::collective_instance* {
    const bool comm = kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm;
    if (!(job.subset || job.groups_from_graph) || !comm) return nullptr;
    if (index.instance_of[t] != rank_index::none) return &g.collectives[index.instance_of[t]];
    const auto it = lone_group.find(t);
    return it != lone_group.end() ? it->second : nullptr;
  };
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const graph::task_id t = tasks[ti];
    const auto kind = g.kind[t];
    const time_ns s = job.simulated.begin_of(t), f = job.simulated.end_of(t);
    const std::uint32_t ev = g.source[t];
    if (src != nullptr && ev != ~0U) {
      const trace::event& e = src->events[ev];
      const std::uint32_t k = copy_k.empty() ? 0 : copy_k[ti];
      if (trace::is_cpu_side(e.cat)) cpu_end[g.processor[t]] = f;
      // The warp maps the trace's times to copy 0's; copies are moved from there.
      if (trace::is_cpu_side(e.cat) && k == 0) warps[e.lane].add(g.observed_start[t], s), warps[e.lane].add(g.observed_end[t], f);
      if (kind == graph::task_kind::comm_arrive) continue;  // written with its complete
      if (k > 0) {
        // A copy: its whole call (split calls: from the issue half to the wait half) or its op
        // (from its arrival), written once.
        const auto& [first, last] = copy_span.at(copy_key(ev, k));
        if (written_copy[copy_key(ev, k)]++ != 0) continue;
        const bool comm = kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm;
        const time_ns begin = trace::is_cpu_side(e.cat) || comm ? job.simulated.begin_of(first) : s;
        const time_ns end = trace::is_cpu_side(e.cat) ? job.simulated.end_of(last) : f;
        write_source_event(ev, begin, end, static_cast<std::int64_t>(k) * copy_ids, 0, group_of(t, kind));
        if (job.subset && trace::is_cpu_side(e.cat)) enclosed[e.lane].push_back({e.ts, e.end(), begin, end, 0, k, weight_of(t)});
        continue;
      }
      time_ns begin = s;
      if ((kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm) && map->arrive_of_event[ev] != graph::no_task) {
        begin = job.simulated.begin_of(map->arrive_of_event[ev]);  // the op occupies its stream from its arrival
      }
      if (written[ev]) {
        continue;  // the wait half of a split call: the issue half wrote the whole call
      }
      time_ns end = f;
      // A split call (issue and wait halves) ends with its wait half, unless a rewrite left that out.
      if (trace::is_cpu_side(e.cat) && map->task_of_event[ev] != t && map->task_of_event[ev] != graph::no_task) {
        end = job.simulated.end_of(map->task_of_event[ev]);
      }
      written[ev] = 1;
      write_source_event(ev, begin, end, 0, 0, group_of(t, kind));
      if (job.subset && trace::is_cpu_side(e.cat)) enclosed[e.lane].push_back({e.ts, e.end(), begin, end, 0, 0, weight_of(t)});
      continue;
    }
    // Model-built task.
    const auto& p = g.processors[g.processor[t]];
    if (kind == graph::task_kind::comm_arrive) continue;
    time_ns begin = s;
    const graph::collective_instance* ci = nullptr;
    if (kind == graph::task_kind::comm_complete) {
      ci = index.instance_of[t] != rank_index::none ? &g.collectives[index.instance_of[t]] : nullptr;
      if (ci != nullptr) {
        for (std::size_t k = 0; k < ci->complete.size(); ++k) {
          if (ci->complete[k] == t) begin = job.simulated.begin_of(ci->arrive[k]);
        }
      }
    }
    if (src != nullptr) {
      // Trace-built helpers without an event ("thread end") are not written; a launch that a
      // what-if added and its kernel (a collective's launch goes to its arrive) are, as a
      // model-built job's.
      graph::task_id launched = t;
      for (std::size_t k = 0; ci != nullptr && k < ci->complete.size(); ++k) {
        if (ci->complete[k] == t) launched = ci->arrive[k];
      }
      if (corr_of.find(t) == nullptr && launch_corr.find(launched) == nullptr && waits_on.find(t) == nullptr) continue;
    }
    const bool gpu = p.kind == graph::processor_kind::gpu_stream;
    const task_decoration* deco = job.decorations != nullptr ? job.decorations->find(t) : nullptr;
    for (auto [it, stop] = waits_before.equal_range(t); it != stop; ++it) {
      const stream_wait& sw = it->second;
      const auto& consumer = g.processors[g.processor[sw.consumer]];
      const auto& producer = g.processors[g.processor[sw.producer]];
      if (sw.record_with_wait) write_runtime("cudaEventRecord", p, s - 1, sw.record_corr);
      write_runtime("cudaStreamWaitEvent", p, s - 1, sw.wait_corr);
      w.begin_object().field("ph", "X").field("cat", "cuda_sync").field("name", "Stream Wait Event");
      w.field("pid", consumer.owner).field("tid", consumer.index).key("ts").microseconds(us(s - 1)).key("dur").microseconds(0);
      w.key("args").begin_object().field("cuda_sync_kind", "Stream Wait Event").field("stream", consumer.index);
      w.field("wait_on_stream", producer.index).field("wait_on_cuda_event_record_corr_id", sw.record_corr);
      w.field("correlation", sw.wait_corr).field("device", consumer.owner).end_object().end_object();
    }
    std::string_view name = g.task_name(t);
    if (deco != nullptr && gpu && !deco->kernel.empty()) name = deco->kernel;
    if (deco != nullptr && !gpu && deco->blocking) {
      if (const auto it = cpu_end.find(g.processor[t]); it != cpu_end.end()) begin = std::min(begin, it->second);
      name = deco->runtime;
    }
    // A decoration that names the call (a kernel-level job's synchronize) is written as it says.
    const host_wait* waiting = gpu || (deco != nullptr && deco->blocking) ? nullptr : waits_on.find(t);
    std::int64_t sync_corr = -1;
    if (waiting != nullptr) {
      // From the thread's previous task, when the call was issued, to the end of the wait.
      if (const auto it = cpu_end.find(g.processor[t]); it != cpu_end.end()) begin = std::min(begin, it->second);
      name = waiting->device ? "cudaDeviceSynchronize" : "cudaStreamSynchronize";
      sync_corr = next_corr++;
    }
    if (!gpu) cpu_end[g.processor[t]] = f;
    if (deco != nullptr && !gpu && !deco->cpu_op.empty()) {
      // The operator that dispatched the launch, around its runtime call; the call ends the task.
      w.begin_object().field("ph", "X").field("cat", "cpu_op").field("name", deco->cpu_op);
      w.field("pid", p.owner).field("tid", p.index);
      w.key("ts").microseconds(us(begin)).key("dur").microseconds(f - begin);
      w.key("args").begin_object();
      if (const std::int64_t* c = corr_of.find(t)) w.field("External id", *c);
      if (!deco->input_dims.empty()) w.key("Input Dims").raw(deco->input_dims);
      if (!deco->input_type.empty()) w.key("Input type").raw(deco->input_type);
      w.end_object().end_object();
      if (deco->launch_ns >= 0) begin = std::max(begin, f - deco->launch_ns);
      name = deco->runtime;
    }
    w.begin_object().field("ph", "X").field("cat", gpu ? "kernel" : "cuda_runtime").field("name", name);
    w.field("pid", p.owner).field("tid", p.index);
    w.key("ts").microseconds(us(begin)).key("dur").microseconds(f - begin);
    w.key("args").begin_object();
    if (gpu) {
      w.field("device", p.owner).field("stream", p.index);
      // A collective kernel is written once, for its complete; its launch went to its arrive.
      graph::task_id launched = t;
      if (ci != nullptr) {
        for (std::size_t k = 0; k < ci->complete.size(); ++k) {
          if (ci->complete[k] == t) launched = ci->arrive[k];
        }
      }
      if (const std::int64_t* c = launch_corr.find(launched)) {
        w.field("correlation", *c);
        if (deco != nullptr) w.field("External id", *c);  // its operator's
      }
      if (ci != nullptr) {
        const bool named = deco != nullptr && !deco->collective.empty();
        w.field("Collective name", named ? std::string_view(deco->collective) : std::string_view(ci->kind));
        w.field("Process Group Name", ci->group);
        if (deco != nullptr && !deco->group_description.empty()) w.field("Process Group Description", deco->group_description);
        if (deco != nullptr && !deco->dtype.empty()) w.field("dtype", deco->dtype);
        const std::int64_t elements = deco != nullptr && deco->element_bytes > 0 ? ci->bytes / deco->element_bytes : ci->bytes;
        if (ci->bytes > 0) w.field("In msg nelems", elements).field("Out msg nelems", elements);
        if (!ci->group_ranks.empty()) {
          std::string ranks = "[";
          for (std::size_t k = 0; k < ci->group_ranks.size(); ++k) ranks += (k ? ", " : "") + std::to_string(ci->group_ranks[k]);
          w.field("Process Group Ranks", ranks + "]").field("Group size", ci->group_ranks.size());
        }
      }
    } else if (const std::int64_t* c = corr_of.find(t)) {
      w.field("correlation", *c);
      if (deco != nullptr && !deco->cpu_op.empty()) w.field("External id", *c);
    } else if (sync_corr >= 0) {
      w.field("correlation", sync_corr);
    }
    w.end_object().end_object();
    if (waiting != nullptr) {
      const auto& on = g.processors[g.processor[waiting->on]];
      w.begin_object().field("ph", "X").field("cat", "cuda_sync").field("name", waiting->device ? "Device Synchronize" : "Stream Synchronize");
      w.field("pid", on.owner).field("tid", on.index).key("ts").microseconds(us(f)).key("dur").microseconds(0);
      w.key("args").begin_object().field("cuda_sync_kind", waiting->device ? "Device Synchronize" : "Stream Synchronize");
      w.field("stream", waiting->device ? std::int64_t{-1} : on.index).field("correlation", sync_corr).field("device", on.owner);
      w.end_object().end_object();
    }
    for (auto [it, stop] = records_after.equal_range(t); it != stop; ++it) {
      write_runtime("cudaEventRecord", p, std::max(s, f - 1), it->second.record_corr);
    }
  }

  // Trace-built: the CPU events that are not tasks, warped onto the simulated timeline.
  if (src != nullptr) {
    for (auto& [lane, warp] : warps) warp.finish();
    for (auto& [lane, v] : enclosed) {
      std::stable_sort(v.begin(), v.end(), [](const placed& a, const placed& c) { return a.begin < c.begin; });
      for (std::size_t k = 0; k < v.size(); ++k) v[k].order = static_cast<std::uint32_t>(k);
      std::stable_sort(v.begin(), v.end(), [](const placed& a, const placed& c) { return a.ts < c.ts; });
    }
    // Subset: per lane, the runtime calls of the whole trace, by start: an event's lead and tail
    // are measured to the first and last of them inside it, written here or not (a pass marker
    // keeps its own overhead, not the time of the layers another stage took).
    std::map<std::uint32_t, std::vector<std::pair<time_ns, time_ns>>> calls;
    if (job.subset) {
      for (const trace::event& e : src->events) {
        if (e.ph == trace::phase::complete && (e.cat == trace::category::cuda_runtime || e.cat == trace::category::cuda_driver)) {
          calls[e.lane].emplace_back(e.ts, e.end());
        }
      }
      for (auto& [lane, v] : calls) std::sort(v.begin(), v.end());
    }
    // Per thread: its events that are tasks, by start (only when something was repeated).
    std::map<std::uint32_t, std::vector<std::pair<time_ns, std::uint32_t>>> task_events;
    if (!copy_k.empty()) {
      for (std::uint32_t ev = 0; ev < src->events.size(); ++ev) {
        if (copies[ev] > 0 && trace::is_cpu_side(src->events[ev].cat)) task_events[src->events[ev].lane].push_back({src->events[ev].ts, ev});
      }
      for (auto& [lane, v] : task_events) std::sort(v.begin(), v.end());
    }
    // How many times to write event `e`: K when every task inside it on its thread has K > 1
    // copies (a repeated layer's operators and scope), else once (tasks a what-if removed count
    // for nothing). Sets the first and last of those tasks, whose copies place e's.
    std::uint32_t enclosed_first = 0, enclosed_last = 0;
    auto enclosed_copies = [&](const trace::event& e) -> std::uint32_t {
      const auto it = task_events.find(e.lane);
      if (it == task_events.end()) return 1;
      const auto& v = it->second;
      std::uint32_t n = 0;
      for (auto p = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::uint32_t{0}}); p != v.end() && p->first < e.end(); ++p) {
        if (src->events[p->second].end() > e.end()) continue;
        // A zero-length call at the instant e opens (a synchronize before a pass, at its first
        // layer's start) is not inside e by its times: it does not decide e's copies.
        if (src->events[p->second].dur == 0 && p->first == e.ts) continue;
        const std::uint32_t c = copies[p->second];
        if (n == 0) {
          n = c, enclosed_first = p->second;
        } else if (c != n) {
          return 1;
        }
        enclosed_last = p->second;
      }
      return n > 1 ? n : 1;
    };
    // The end of the last copy of the repeated tasks inside e, each with e's measured tail after
    // that task: an event written once around copied work (a pass marker around repeated layers)
    // ends after the copies, not where the warp, fitted on copy 0, puts the traced end.
    auto last_copy_end = [&](const trace::event& e) -> time_ns {
      time_ns last = std::numeric_limits<time_ns>::min();
      const auto it = task_events.find(e.lane);
      if (it == task_events.end()) return last;
      const auto& v = it->second;
      for (auto p = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::uint32_t{0}}); p != v.end() && p->first < e.end(); ++p) {
        const trace::event& x = src->events[p->second];
        if (x.end() > e.end() || copies[p->second] < 2) continue;
        const time_ns end = job.simulated.end_of(copy_span.at(copy_key(p->second, copies[p->second] - 1)).second);
        last = std::max(last, end + (e.end() - x.end()));
      }
      return last;
    };
    const iteration_plan* plan = job.plans != nullptr ? &(*job.plans)[plan_index] : nullptr;
    // Subset: the events placed around their written tasks, written once all are placed, each
    // then widened to the placed events it encloses in the trace (a pass marker whose first
    // written task is a later layer's launch starts no later than that layer's scope).
    static constexpr std::uint32_t every_copy = ~0U;
    struct around {
      std::size_t event;
      time_ns begin, end;
      std::uint32_t copy = every_copy;  // the copy of a repeated run it stands around, if it is one
      bool part = false;                // one of several runs of the event (an interleaved pass's chunk)
    };
    std::vector<around> placed_around;
    for (std::size_t i = 0; i < src->events.size(); ++i) {
      const trace::event& e = src->events[i];
      if (written[i] || e.ph != trace::phase::complete || !trace::is_cpu_side(e.cat)) continue;
      if (trace::is_gpu_op(e.cat)) continue;
      const auto it = warps.find(e.lane);
      const time_ns b0 = e.ts + map->offset, e0 = e.end() + map->offset;
      time_ns b = it != warps.end() ? it->second(b0) : b0;
      time_ns en = it != warps.end() ? it->second(e0) : e0;
      const bool step = plan != nullptr && plan->annotated && src->name(e) == plan->step && e.cat == trace::category::user_annotation;
      if (step) {  // exactly the simulated window's annotation
        b = job.simulated.begin_of(plan->first_cpu) - plan->lead_idle - scaled_part(plan->lead_busy, job.cpu_scale);
        en = job.simulated.end_of(plan->last_cpu) + plan->tail_idle + scaled_part(plan->tail_busy, job.cpu_scale);
      }
      const bool previous = plan != nullptr && plan->annotated && plan->previous && plan->previous->last_cpu != graph::no_task &&
                            src->name(e) == plan->previous->name && e.cat == trace::category::user_annotation;
      if (previous) {  // the previous step ends exactly where the window's begin saw it end
        en = job.simulated.end_of(plan->previous->last_cpu) + plan->previous->tail_idle +
             scaled_part(plan->previous->tail_busy, job.cpu_scale);
      }
      if (job.subset && !step) {
        // Around the written tasks it encloses, with its measured lead before the first of them
        // and tail after the last; not at all when it encloses none.
        // Written tasks it encloses that another one separates (the two chunks of a pass marker
        // in an interleaved order), or that run in a B and a W pass, make one event each.
        const auto lt = enclosed.find(e.lane);
        if (lt == enclosed.end()) continue;
        std::vector<const placed*> inside;
        for (auto q = std::lower_bound(lt->second.begin(), lt->second.end(), e.ts, [](const placed& x, time_ns v) { return x.ts < v; });
             q != lt->second.end() && q->ts < e.end(); ++q) {
          if (q->end <= e.end()) inside.push_back(&*q);
        }
        if (inside.empty()) continue;
        std::sort(inside.begin(), inside.end(), [](const placed* a, const placed* c) { return a->order < c->order; });
        // Around a repeated run (a layer's scope and operators, every task inside it copied n
        // times): once per copy, with the copy's ids, as without stages.
        const bool per_copy = !copy_k.empty() && enclosed_copies(e) > 1;
        std::vector<std::pair<time_ns, time_ns>> runs;  // simulated span of each run
        std::vector<std::uint32_t> run_copy;            // per run: its copy
        for (std::size_t k = 0; k < inside.size(); ++k) {
          if (k == 0 || inside[k]->order != inside[k - 1]->order + 1 || (per_copy && inside[k]->copy != inside[k - 1]->copy) ||
              inside[k]->weight != inside[k - 1]->weight) {
            runs.emplace_back(inside[k]->begin, inside[k]->finish);
            run_copy.push_back(per_copy ? inside[k]->copy : 0);
          }
          runs.back().first = std::min(runs.back().first, inside[k]->begin);
          runs.back().second = std::max(runs.back().second, inside[k]->finish);
        }
        if (previous) runs.resize(1);
        const time_ns lo = runs.front().first, hi = runs.back().second;
        time_ns first_ts = e.ts, last_end = e.end();
        if (const auto c = calls.find(e.lane); c != calls.end()) {
          const auto& v = c->second;
          const auto from = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::numeric_limits<time_ns>::min()});
          const auto to = std::lower_bound(from, v.end(), std::pair{e.end(), std::numeric_limits<time_ns>::min()});
          time_ns first = std::numeric_limits<time_ns>::max(), last = std::numeric_limits<time_ns>::min();
          for (auto q = from; q != to; ++q) {
            if (q->second <= e.end()) first = std::min(first, q->first), last = std::max(last, q->second);
          }
          if (first <= last) first_ts = first, last_end = last;
        }
        const time_ns lead = first_ts - e.ts, tail = e.end() - last_end;
        if (per_copy && !previous) {  // widened below, as one copy of the events inside it
          for (std::size_t k = 0; k < runs.size(); ++k) placed_around.push_back({i, runs[k].first - lead, runs[k].second + tail, run_copy[k]});
          continue;
        }
        if (runs.size() > 1) {
          for (const auto& [rb, re] : runs) placed_around.push_back({i, rb - lead, re + tail, every_copy, true});
          continue;
        }
        b = lo - lead;
        if (!previous) en = hi + tail;
        if (previous) {
          write_source_event(i, b, std::max(en, b));
        } else {
          placed_around.push_back({i, b, std::max(en, b)});
        }
        continue;
      }
      // Around a repeated run: once per copy, keeping its measured lead before its first task
      // and tail after its last (the warp, fitted on copy 0, would stretch copy 0 over the others).
      const std::uint32_t n = copy_k.empty() ? 1 : enclosed_copies(e);
      if (n == 1) {
        if (!copy_k.empty() && !step && !previous) en = std::max(en, last_copy_end(e));
        write_source_event(i, b, std::max(en, b));
        continue;
      }
      const time_ns lead = src->events[enclosed_first].ts - e.ts, tail = e.end() - src->events[enclosed_last].end();
      for (std::uint32_t k = 0; k < n; ++k) {
        const time_ns bk = job.simulated.begin_of(copy_span.at(copy_key(enclosed_first, k)).first) - lead;
        const time_ns ek = job.simulated.end_of(copy_span.at(copy_key(enclosed_last, k)).second) + tail;
        write_source_event(i, bk, std::max(ek, bk), static_cast<std::int64_t>(k) * copy_ids);
      }
    }
    if (!placed_around.empty()) {
      // Inner events first (shorter in the trace), so that a widened one widens what encloses it.
      std::vector<std::size_t> by_length(placed_around.size());
      std::iota(by_length.begin(), by_length.end(), std::size_t{0});
      std::stable_sort(by_length.begin(), by_length.end(), [&](std::size_t a, std::size_t c) {
        return src->events[placed_around[a].event].dur < src->events[placed_around[c].event].dur;
      });
      std::map<std::uint32_t, std::vector<std::size_t>> on_lane;  // per lane, by start in the trace
      for (std::size_t k = 0; k < placed_around.size(); ++k) on_lane[src->events[placed_around[k].event].lane].push_back(k);
      for (auto& [lane, v] : on_lane) {
        std::stable_sort(v.begin(), v.end(), [&](std::size_t a, std::size_t c) {
          return src->events[placed_around[a].event].ts < src->events[placed_around[c].event].ts;
        });
      }
      for (const std::size_t k : by_length) {
        around& outer = placed_around[k];
        const trace::event& e = src->events[outer.event];
        const auto& v = on_lane[e.lane];
        auto q = std::lower_bound(v.begin(), v.end(), e.ts, [&](std::size_t x, time_ns t) { return src->events[placed_around[x].event].ts < t; });
        for (; q != v.end() && src->events[placed_around[*q].event].ts < e.end(); ++q) {
          const trace::event& inner = src->events[placed_around[*q].event];
          if (*q == k || inner.end() > e.end() || inner.dur >= e.dur) continue;
          const std::uint32_t inner_copy = placed_around[*q].copy;
          if (outer.copy != every_copy && inner_copy != every_copy && inner_copy != outer.copy) continue;
          // A run of several widens only to what overlaps it (the other runs' layers are not its).
          if (outer.part && (placed_around[*q].begin >= outer.end || placed_around[*q].end <= outer.begin)) continue;
          outer.begin = std::min(outer.begin, placed_around[*q].begin);
          outer.end = std::max(outer.end, placed_around[*q].end);
        }
      }
      for (const around& a : placed_around) {
        write_source_event(a.event, a.begin, a.end, a.copy == every_copy ? 0 : static_cast<std::int64_t>(a.copy) * copy_ids);
      }
    }
    // GPU-side sync records, at their runtime call's simulated start (they carry the exact
    // record/wait pairing, which a re-read needs).
    std::map<std::int64_t, graph::task_id> call_of_correlation;
    for (const graph::task_id t : tasks) {
      const std::uint32_t ev = g.source[t];
      if (ev != ~0U && (src->events[ev].cat == trace::category::cuda_runtime || src->events[ev].cat == trace::category::cuda_driver)) {
        call_of_correlation.try_emplace(src->events[ev].correlation, t);
      }
    }
    for (std::size_t i = 0; i < src->events.size(); ++i) {
      const trace::event& e = src->events[i];
      if (e.ph != trace::phase::complete || (e.cat != trace::category::cuda_sync && e.cat != trace::category::cuda_event)) continue;
      const auto call = call_of_correlation.find(e.correlation);
      if (job.subset && call == call_of_correlation.end()) continue;  // its call is another stage's
      const time_ns at = call != call_of_correlation.end() ? job.simulated.begin_of(call->second) : e.ts + map->offset;
      write_source_event(i, at, at + e.dur);
      // A repeated call's record or wait: once per copy, at the copy's call, paired with the
      // copy of the record it waits for when that was repeated too.
      if (copy_k.empty() || call == call_of_correlation.end()) continue;
      const std::uint32_t call_event = g.source[call->second];
      std::uint32_t record_copies = 1;
      if (const auto rc = src->arg(i, trace::arg_key::wait_on_event_record_correlation)) {
        if (const auto r = call_of_correlation.find(*rc); r != call_of_correlation.end()) record_copies = copies[g.source[r->second]];
      }
      for (std::uint32_t k = 1; k < copies[call_event]; ++k) {
        const time_ns ak = job.simulated.begin_of(copy_span.at(copy_key(call_event, k)).first);
        const std::int64_t ids = static_cast<std::int64_t>(k) * copy_ids;
        write_source_event(i, ak, ak + e.dur, ids, k < record_copies ? ids : 0);
      }
    }
  } else {
    // Model-built: one ProfilerStep over the rank's simulated span, on its first CPU thread.
    interval win{std::numeric_limits<time_ns>::max(), std::numeric_limits<time_ns>::min()};
    if (job.plans != nullptr && plan_index < job.windows.size()) {
      win = job.windows[plan_index].window;
    } else {
      for (const graph::task_id t : tasks) {
        win.begin = std::min(win.begin, job.simulated.begin_of(t));
        win.end = std::max(win.end, job.simulated.end_of(t));
      }
      if (tasks.empty()) win = {0, 0};
    }
    std::int64_t pid = 0, tid = 0;
    for (const auto& p : g.processors) {
      if (p.rank == rank && p.kind == graph::processor_kind::cpu_thread) {
        pid = p.owner;
        tid = p.index;
        break;
      }
    }
    w.begin_object().field("ph", "X").field("cat", "user_annotation").field("name", "ProfilerStep#1");
    w.field("pid", pid).field("tid", tid).key("ts").microseconds(us(win.begin)).key("dur").microseconds(win.length());
    w.key("args").begin_object().end_object().end_object();
    if (job.decorations != nullptr) {
      for (const span_annotation& sp : job.decorations->spans) {
        if (sp.rank != rank || sp.first == graph::no_task || sp.last == graph::no_task) continue;
        const time_ns b = job.simulated.begin_of(sp.first), en = std::max(b, job.simulated.end_of(sp.last));
        w.begin_object().field("ph", "X").field("cat", sp.category).field("name", sp.name);
        w.field("pid", pid).field("tid", tid).key("ts").microseconds(us(b)).key("dur").microseconds(en - b);
        w.key("args").begin_object().end_object().end_object();
      }
    }
  }
  w.end_array();
  w.end_object();
  out += '\n';
}

/// The same, returned.
[[nodiscard]] inline std::string kineto_json(const simulated_job& job, int rank, const rank_index& index) {
  std::string out;
  kineto_json(out, job, rank, index);
  return out;
}

/// Serialises one rank (indexes the graph for it: to write many ranks, index them once with
/// `index_ranks` and use the overload above).
[[nodiscard]] inline std::string kineto_json(const simulated_job& job, int rank) {
  return kineto_json(job, rank, index_ranks(*job.graph, {rank}));
}

}  // namespace lumos::report

#pragma once
// A simulated job ready to be written as Kineto traces (report/trace_writer.hpp): its graph and
// replayed times, the traces it came from, how model-built tasks are written, and which tasks and
// edges each rank to write needs.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/event.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::report {

/// An arg of a traced event written with another value: a what-if that resized what the event
/// records (a MoE change's all-to-all messages and grouped GEMM shapes) writes the target's, so
/// that the written job reads back as the target.
struct arg_edit {
  trace::arg_key key = trace::arg_key::input_dims;
  std::string json;  ///< the value as raw JSON (a number, or a string with its quotes)
};

/// The edits of a job's traced events, keyed by (the trace's rank number, event index); an
/// edit replaces its key's value where the event records the key and is not written otherwise.
using arg_edits = std::map<std::pair<int, std::uint32_t>, std::vector<arg_edit>>;

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
  /// Args of traced events written with other values (their copies' too), or null.
  const arg_edits* edits = nullptr;
  /// Subset: the groups of communication ops that are no collective instance, where the graph
  /// renamed them (each `complete` lists its ops; a pipeline what-if's stage copies of a TP group
  /// whose other ranks the traces lack). Other such ops keep their trace's args.
  const std::vector<graph::collective_instance>* lone_groups = nullptr;
};

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

}  // namespace lumos::report

#pragma once
// task_graph — the mutable execution graph every path builds (a replayed trace, a rewritten
// trace, a job made from a model description). `compile()` turns it into the flat DAG that the
// replay engine walks.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lumos::graph {

/// Dense task index (32 bits: a graph holds up to 4·10⁹ tasks).
using task_id = std::uint32_t;
/// Dense processor index.
using processor_id = std::uint32_t;
inline constexpr task_id no_task = ~task_id{0};

/// What a processor is. A processor runs its tasks one at a time, in the order they were added.
enum class processor_kind : std::uint8_t {
  cpu_thread,  ///< (rank, pid, tid)
  gpu_stream,  ///< (rank, device, stream)
  barrier,     ///< a virtual processor that joins the participants of collectives
};

struct processor_info {
  processor_kind kind = processor_kind::cpu_thread;
  int rank = 0;
  std::int64_t owner = 0;  ///< pid for threads, device for streams, group for barriers
  std::int64_t index = 0;  ///< tid for threads, stream for streams
  std::string name;        ///< e.g. "rank 0 stream 7", or the thread name of the trace
};

/// What a task stands for; decides which scale applies and how time is attributed.
enum class task_kind : std::uint8_t {
  cpu,         ///< CPU work or a runtime call (busy time; `cpu=F` scales it)
  cpu_blocking,///< a runtime call that waits for the GPU (sync, blocking copy, successful poll)
  gpu_compute, ///< a kernel, memcpy or memset that is not communication (`compute=F`)
  gpu_comm,    ///< a communication kernel with no matched partners (`comm=F`)
  comm_arrive, ///< a participant reaching a collective (zero length)
  comm_complete,///< the transfer of a matched collective on one participant (`comm=F`)
  join,        ///< a zero-length barrier of a matched collective
};

[[nodiscard]] constexpr std::string_view to_string(task_kind k) noexcept {
  switch (k) {
    case task_kind::cpu: return "cpu";
    case task_kind::cpu_blocking: return "cpu_blocking";
    case task_kind::gpu_compute: return "gpu_compute";
    case task_kind::gpu_comm: return "gpu_comm";
    case task_kind::comm_arrive: return "comm_arrive";
    case task_kind::comm_complete: return "comm_complete";
    case task_kind::join: return "join";
  }
  return "?";
}

[[nodiscard]] constexpr bool is_gpu(task_kind k) noexcept {
  return k == task_kind::gpu_compute || k == task_kind::gpu_comm || k == task_kind::comm_arrive ||
         k == task_kind::comm_complete;
}

/// Why an edge exists. Kept for reports (critical-path attribution) and tests; the replay loop
/// only sees (predecessor, delay, start/finish).
enum class edge_kind : std::uint8_t {
  thread_handoff,  ///< CPU → CPU across threads (gap-based)
  launch,          ///< CPU runtime call → the GPU op(s) it launched
  cross_stream,    ///< cudaEventRecord → cudaStreamWaitEvent pairing
  sync,            ///< GPU op → the CPU call that waited for it (a finish edge)
  collective,      ///< arrive → join → complete across ranks
  dependency,      ///< any other data/control dependency (model-built jobs)
};

[[nodiscard]] constexpr std::string_view to_string(edge_kind k) noexcept {
  switch (k) {
    case edge_kind::thread_handoff: return "thread_handoff";
    case edge_kind::launch: return "launch";
    case edge_kind::cross_stream: return "cross_stream";
    case edge_kind::sync: return "sync";
    case edge_kind::collective: return "collective";
    case edge_kind::dependency: return "dependency";
  }
  return "?";
}

/// How an edge binds its target, beyond the default (a start edge from the predecessor's finish).
enum class edge_flags : std::uint8_t {
  none = 0,
  finish = 1,      ///< binds the target's finish, not its start (a sync: the call returns after the op)
  from_start = 2,  ///< counts the delay from the predecessor's start (a launch: the replay contract, item 4)
};
[[nodiscard]] constexpr edge_flags operator|(edge_flags a, edge_flags b) noexcept {
  return static_cast<edge_flags>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
[[nodiscard]] constexpr bool has(edge_flags set, edge_flags f) noexcept {
  return (static_cast<std::uint8_t>(set) & static_cast<std::uint8_t>(f)) != 0;
}

/// `to` cannot start (start edge) or finish (finish edge) before `from` finishes — or, for an
/// edge `from_start`, starts — plus `delay`. Launch edges count from the launching call's start
/// (the replay contract, item 4: docs/replay.md); every other kind from the predecessor's finish.
struct edge {
  task_id from = no_task;
  task_id to = no_task;
  std::int32_t delay = 0;  ///< ns, saturated to ±2.1 s
  edge_kind kind = edge_kind::dependency;
  bool finish = false;
  bool from_start = false;

  [[nodiscard]] constexpr edge_flags flags() const noexcept {
    return (finish ? edge_flags::finish : edge_flags::none) | (from_start ? edge_flags::from_start : edge_flags::none);
  }
};

/// Everything about one task, by name: `g.add_task({.kind = task_kind::cpu, .processor = p,
/// .duration = 5'000})`. Fields left out are 0 (no gaps, no observed times), an empty name,
/// rank 0 and no source event.
struct task_spec {
  task_kind kind = task_kind::cpu;
  processor_id processor = 0;
  time_ns duration = 0;        ///< own time (transfer time for comm_complete)
  time_ns idle_gap = 0;        ///< fixed time before the task on its processor
  time_ns busy_gap = 0;        ///< CPU busy time before the task (scaled by cpu)
  std::string_view name = {};
  string_id name_id = no_string;  ///< instead of `name`: a name already in the graph's `strings`
                                  ///< (builders keep the ids of names they add again and again)
  int rank = 0;
  std::uint32_t source = ~0U;  ///< event index in the rank's trace, or ~0
  time_ns observed_start = 0;  ///< measured start (job time), or the model's plan
  time_ns observed_end = 0;
};

/// Saturating conversion of a delay to the 32 bits an edge stores.
[[nodiscard]] constexpr std::int32_t clamp_delay(time_ns d) noexcept {
  if (d > std::numeric_limits<std::int32_t>::max()) return std::numeric_limits<std::int32_t>::max();
  if (d < std::numeric_limits<std::int32_t>::min()) return std::numeric_limits<std::int32_t>::min();
  return static_cast<std::int32_t>(d);
}

/// One collective (or point-to-point transfer) of the job: its participants' arrive/complete
/// task pairs, and what is known about it. Built by the trace builder when it matches
/// communication kernels across ranks, and by model-driven builders; used by reports and by
/// the trace writer (which emits one communication kernel per participant with these args).
struct collective_instance {
  std::string kind;              ///< "allreduce", "allgather", "reducescatter", "alltoall", "send", ... (collective_name_kind)
  std::string group;             ///< process group name ("0", "tp.3", ...)
  std::vector<int> group_ranks;  ///< global ranks of the group, when known
  /// Message size: `In msg nelems` of a traced collective (elements; see `element_bytes`), bytes
  /// of a modelled one (0 when unknown).
  std::int64_t bytes = 0;
  /// Bytes per element of a traced collective's message, from its `dtype` arg (0 when the trace
  /// does not say: the kernel's name may, see whatif::element_bytes_of).
  std::int64_t element_bytes = 0;
  std::int64_t sequence = 0;     ///< position among the group's collectives
  std::vector<task_id> arrive;   ///< per participant present in the graph
  std::vector<task_id> complete; ///< same order as `arrive`
  task_id join = no_task;        ///< the barrier task, when the participants are joined
  std::string match;             ///< how participants were matched (reported to the user)
};

/// The mutable execution graph. Tasks are added per processor in execution order; edges in any
/// order. Durations and gaps are the unscaled, observed (or modelled) values:
///   start  = max(end of the previous task on the processor + idle_gap,
///                max over start edges (pred end, or pred start, + delay)) + busy_gap·cpu_scale
///   finish = max(start + duration·scale(kind), max over finish edges (pred end + delay))
/// (busy time is the CPU work right before a task: it follows whatever the thread waited for).
/// The first task of a processor measures its gaps from time 0 (the job's origin).
/// Metadata (`name`, `rank`, `source`, observed times) is for reports; the replay ignores it.
/// A copy is independent of its source (it owns its strings): what-if variants edit copies.
struct task_graph {
  std::vector<processor_info> processors;

  // One entry per task (structure of arrays).
  large_vector<processor_id> processor;
  large_vector<task_kind> kind;
  large_vector<time_ns> duration;   ///< own time (transfer time for comm_complete)
  large_vector<time_ns> idle_gap;   ///< fixed time before the task on its processor
  large_vector<time_ns> busy_gap;   ///< CPU busy time before the task (scaled by cpu)
  large_vector<string_id> name;     ///< into `strings`
  large_vector<std::int32_t> rank;
  large_vector<std::uint32_t> source;  ///< event index in the rank's trace, or ~0
  large_vector<time_ns> observed_start;  ///< measured start (job time), or the model's plan
  large_vector<time_ns> observed_end;

  large_vector<edge> edges;
  std::vector<collective_instance> collectives;
  string_table strings;

  [[nodiscard]] std::size_t task_count() const noexcept { return processor.size(); }
  /// The edges added, including any that `release_edges` freed.
  [[nodiscard]] std::size_t edge_count() const noexcept { return edges.size() + released_edges_; }

  /// Makes room for `tasks` more tasks and `more_edges` more edges (a builder that knows its
  /// size avoids the copies and page faults of growing ten columns one task at a time).
  void reserve(std::size_t tasks, std::size_t more_edges) {
    const std::size_t n = task_count() + tasks;
    processor.reserve(n), kind.reserve(n), duration.reserve(n), idle_gap.reserve(n), busy_gap.reserve(n);
    name.reserve(n), rank.reserve(n), source.reserve(n), observed_start.reserve(n), observed_end.reserve(n);
    edges.reserve(edge_count() + more_edges);
  }

  processor_id add_processor(processor_info info) {
    processors.push_back(std::move(info));
    return static_cast<processor_id>(processors.size() - 1);
  }

  /// Appends a task to processor `spec.processor` (after every task already on it).
  // Flattened: the builder adds millions of tasks, and the ten column appends are otherwise ten
  // out-of-line calls each.
  [[gnu::flatten]] task_id add_task(const task_spec& spec) {
    if (spec.processor >= processors.size()) {
      throw error("task_graph: processor " + std::to_string(spec.processor) + " does not exist");
    }
    if (processor.size() >= no_task) throw error("task_graph: more than 4294967294 tasks");
    if (durations_released() || observations_released()) throw error("task_graph: a task added after its columns were released");
    if (spec.name_id != no_string && spec.name_id >= strings.size()) {
      throw error("task_graph: name id " + std::to_string(spec.name_id) + " is not in the graph's strings");
    }
    processor.push_back(spec.processor);
    kind.push_back(spec.kind);
    duration.push_back(spec.duration);
    idle_gap.push_back(spec.idle_gap);
    busy_gap.push_back(spec.busy_gap);
    name.push_back(spec.name_id != no_string ? spec.name_id : strings.intern(spec.name));
    rank.push_back(spec.rank);
    source.push_back(spec.source);
    observed_start.push_back(spec.observed_start);
    observed_end.push_back(spec.observed_end);
    return static_cast<task_id>(processor.size() - 1);
  }

  void add_edge(task_id from, task_id to, time_ns delay, edge_kind k, edge_flags flags = edge_flags::none) {
    if (edges_released_) throw error("task_graph: an edge added after the edges were released");
    edges.push_back({from, to, clamp_delay(delay), k, has(flags, edge_flags::finish), has(flags, edge_flags::from_start)});
  }

  /// Where `append` put the other graph's first processor and first task.
  struct appended {
    processor_id first_processor = 0;
    task_id first_task = 0;
  };

  /// Appends every processor, task, edge and collective of `part` after this graph's: its
  /// processor and task ids offset by this graph's counts, its names interned here in the order
  /// of `part`'s ids (so a graph built in parts, appended in order, names its strings exactly as
  /// the graph built in one piece). Builders make parts on several threads, then append them.
  appended append(const task_graph& part) {
    if (durations_released() || observations_released() || edges_released_ || part.durations_released() ||
        part.observations_released() || part.edges_released()) {
      throw error("task_graph: append to or from a graph whose columns were released");
    }
    const appended at{static_cast<processor_id>(processors.size()), static_cast<task_id>(task_count())};
    const std::size_t n = part.task_count();
    if (n >= std::size_t{no_task} - at.first_task) throw error("task_graph: more than 4294967294 tasks");
    std::vector<string_id> names(part.strings.size());
    for (string_id i = 0; i < names.size(); ++i) names[i] = strings.intern(part.strings[i]);
    processors.insert(processors.end(), part.processors.begin(), part.processors.end());
    const auto append_mapped = [n](auto& column, const auto& from, auto&& map) {
      const std::size_t old = column.size();
      column.resize(old + n);
      for (std::size_t i = 0; i < n; ++i) column[old + i] = map(from[i]);
    };
    append_mapped(processor, part.processor, [&](processor_id p) { return static_cast<processor_id>(p + at.first_processor); });
    append_mapped(name, part.name, [&](string_id s) { return names[s]; });
    for (auto [column, from] : {std::pair{&duration, &part.duration}, {&idle_gap, &part.idle_gap}, {&busy_gap, &part.busy_gap},
                                {&observed_start, &part.observed_start}, {&observed_end, &part.observed_end}}) {
      column->insert(column->end(), from->begin(), from->end());
    }
    kind.insert(kind.end(), part.kind.begin(), part.kind.end());
    rank.insert(rank.end(), part.rank.begin(), part.rank.end());
    source.insert(source.end(), part.source.begin(), part.source.end());
    const std::size_t first_edge = edges.size();
    edges.insert(edges.end(), part.edges.begin(), part.edges.end());
    for (std::size_t i = first_edge; i < edges.size(); ++i) edges[i].from += at.first_task, edges[i].to += at.first_task;
    for (collective_instance c : part.collectives) {
      for (auto* ids : {&c.arrive, &c.complete}) {
        for (task_id& t : *ids) t += at.first_task;
      }
      if (c.join != no_task) c.join += at.first_task;
      collectives.push_back(std::move(c));
    }
    return at;
  }

  /// Empties the graph and its strings, keeping the columns' capacity (a builder that makes
  /// parts one after another reuses their memory).
  void clear() {
    processors.clear();
    for (auto* column : {&duration, &idle_gap, &busy_gap, &observed_start, &observed_end}) column->clear();
    processor.clear(), kind.clear(), name.clear(), rank.clear(), source.clear();
    edges.clear();
    collectives.clear();
    strings = string_table{};
    released_edges_ = 0;
    edges_released_ = false;
  }

  /// Frees the duration and busy-gap columns, once the graph is compiled and nothing will read
  /// them again: the compiled records hold both (scaled), and the reports read those. Every
  /// other column stays. A graph without them cannot be compiled again (`compile` says so) and
  /// is no longer a what-if's input; `report::replay_options::release_durations` does this
  /// for `lumos replay` (229 MiB of a 512-rank job's 15 M tasks, at the replay's peak).
  void release_durations() {
    duration = decltype(duration){};
    busy_gap = decltype(busy_gap){};
  }
  [[nodiscard]] bool durations_released() const noexcept { return duration.size() != processor.size(); }

  /// Frees what ties the tasks to the trace: the observed start and end times and the source
  /// event indices. The replay and its breakdowns read neither (they read the compiled records
  /// and the simulated times); the measured windows, the iteration plans, written traces and the
  /// HTML report do. `report::replay_options::release_observations` does this for `lumos
  /// replay` once the measured windows are evaluated, before the compile (286 MiB of a 512-rank
  /// job's 15 M tasks, at the compile's peak). Reading a released column is out of bounds:
  /// callers check `observations_released()`.
  void release_observations() {
    observed_start = decltype(observed_start){};
    observed_end = decltype(observed_end){};
    source = decltype(source){};
  }
  [[nodiscard]] bool observations_released() const noexcept { return observed_start.size() != processor.size(); }

  /// Frees the edges, once the compiled graph's predecessor lists hold them
  /// (`compile_releasing`): the replay and its breakdowns read those; the critical path,
  /// written traces, the HTML report and what-ifs read the edges (141 MiB of a 512-rank job).
  /// `edge_count()` still counts them.
  void release_edges() {
    released_edges_ += edges.size();
    edges = decltype(edges){};
    edges_released_ = true;
  }
  [[nodiscard]] bool edges_released() const noexcept { return edges_released_; }

  [[nodiscard]] std::string_view task_name(task_id t) const noexcept { return strings[name[t]]; }

  /// "rank R <processor name>: <task name> (task T)", for messages.
  [[nodiscard]] std::string describe(task_id t) const {
    return processors[processor[t]].name + ": " + std::string(task_name(t)) + " (task " + std::to_string(t) + ")";
  }

  /// Bytes held (for reports and tests).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    // processor, kind, the three own times (duration, idle and busy gaps), name, rank, source,
    // and the two observed times.
    const std::size_t per_task = sizeof(processor_id) + sizeof(task_kind) + 3 * sizeof(time_ns) + sizeof(string_id) +
                                 sizeof(std::int32_t) + sizeof(std::uint32_t) + 2 * sizeof(time_ns);
    const std::size_t released = (durations_released() ? 2 * sizeof(time_ns) : 0) +
                                 (observations_released() ? 2 * sizeof(time_ns) + sizeof(std::uint32_t) : 0);
    return processor.capacity() * (per_task - released) + edges.capacity() * sizeof(edge) + strings.memory_bytes();
  }

 private:
  std::size_t released_edges_ = 0;
  bool edges_released_ = false;
};

static_assert(std::is_copy_constructible_v<task_graph> && std::is_copy_assignable_v<task_graph>);

}  // namespace lumos::graph

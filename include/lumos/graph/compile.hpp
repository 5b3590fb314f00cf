#pragma once
// compile() — turns a task_graph into the flat, topologically ordered DAG the replay walks.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace lumos::graph {

/// Duration multipliers of the replay contract, item 6 (docs/replay.md): `compute` for GPU compute ops, `comm` for
/// transfer times, `cpu` for CPU busy time. Gaps (idle), latencies (edge delays) and the tails
/// of blocking calls are overheads and never scaled (item 8).
struct scales {
  double compute = 1.0;
  double comm = 1.0;
  double cpu = 1.0;
};

/// One predecessor of a task in the compiled graph: `time` indexes the replay's interleaved
/// time array — 2·position for the predecessor's start, 2·position + 1 for its finish — so the
/// loop reads either without a branch; `delay` is added to that time. 8 bytes.
struct pred_ref {
  std::uint32_t time;
  std::int32_t delay;
};
static_assert(sizeof(pred_ref) == 8);

/// Per-task durations for the compiled graph: `duration(g, t, s)` is the own time of task t
/// under scales s. The default applies the scales to the task_graph's durations; what-if models
/// (e.g. an alpha-beta model for collectives) substitute their own.
template <class D>
concept DurationModel = requires(const D& d, const task_graph& g, task_id t, const scales& s) {
  { d.duration(g, t, s) } -> std::convertible_to<time_ns>;
};

[[nodiscard]] inline time_ns scale_time(time_ns t, double factor) noexcept {
  if (factor == 1.0) return t;
  return static_cast<time_ns>(std::llround(static_cast<double>(t) * factor));
}

/// The default duration model: observed (or planned) durations times the scale of their kind.
struct scaled_durations {
  [[nodiscard]] time_ns duration(const task_graph& g, task_id t, const scales& s) const noexcept {
    const time_ns d = g.duration[t];
    switch (g.kind[t]) {
      case task_kind::cpu:
        return scale_time(d, s.cpu);
      case task_kind::cpu_blocking:  // the return after a wait: an overhead (docs/replay.md, "Delays")
        return d;
      case task_kind::gpu_compute:
        return scale_time(d, s.compute);
      case task_kind::gpu_comm:
      case task_kind::comm_complete:
        return scale_time(d, s.comm);
      case task_kind::comm_arrive:
      case task_kind::join:
        return d;
    }
    return d;
  }
};
static_assert(DurationModel<scaled_durations>);

/// What the replay loop reads for one task, packed into 24 bytes so that the loop walks one
/// stream of records (plus the predecessors and the times it writes). A task's busy CPU
/// prelude (`post`) is folded into its gap and its start-edge delays:
/// max(free + gap, pred + delay) + post = max(free + gap + post, pred + delay + post).
struct task_record {
  time_ns gap;               ///< idle time after the processor's previous task, plus `post`
  time_ns duration;          ///< own time, scaled
  std::uint32_t processor_and_finishes;  ///< processor (low 24 bits), finish edges (high 8)
  std::uint32_t pred_end;    ///< one past the task's last predecessor; the first is the
                             ///< previous record's `pred_end` (0 for the first task)

  static constexpr std::uint32_t processor_bits = 24;
  [[nodiscard]] constexpr std::uint32_t processor() const noexcept { return processor_and_finishes & ((1U << processor_bits) - 1); }
  [[nodiscard]] constexpr std::uint32_t finishes() const noexcept { return processor_and_finishes >> processor_bits; }
};
static_assert(sizeof(task_record) == 24);

/// A task's place in the compiled (topological) order, which the replay engine and its timelines
/// index, as opposed to its `task_id` in the task_graph: a distinct type, so that neither is taken
/// for the other (`compiled_graph::position_of`, `task_at`; `sim::record_timeline::start_of`).
enum class position : std::uint32_t {};
[[nodiscard]] constexpr std::uint32_t index(position p) noexcept { return static_cast<std::uint32_t>(p); }

/// The flat DAG: tasks in a topological order (every predecessor and every earlier task of the
/// same processor comes first). Hot data the loop reads is one array of 24-byte records; the
/// predecessors are CSR (the last `finishes()` of a task's range are finish edges) with 32-bit
/// indices; the maps between positions and task ids are separate, cold arrays.
/// Memory: 32 bytes per task plus 8 per edge.
struct compiled_graph {
  std::uint32_t processor_count = 0;
  output_vector<task_record> tasks;     ///< per position
  output_vector<pred_ref> preds;
  large_vector<task_id> task;           ///< position index → task id in the task_graph
  output_vector<graph::position> positions;  ///< task id → position

  [[nodiscard]] graph::position position_of(task_id t) const noexcept { return positions[t]; }
  [[nodiscard]] task_id task_at(graph::position p) const noexcept { return task[index(p)]; }
  [[nodiscard]] time_ns duration(graph::position p) const noexcept { return tasks[index(p)].duration; }
  /// The busy CPU prelude folded into the record at `p` (reports): its gap less the idle gap of
  /// `g`, the graph this was compiled from. Not stored: 8 bytes a task that only a critical-path
  /// walk reads, a few times per segment.
  [[nodiscard]] time_ns post(const task_graph& g, graph::position p) const noexcept {
    return tasks[index(p)].gap - g.idle_gap[task_at(p)];
  }

  [[nodiscard]] std::size_t size() const noexcept { return tasks.size(); }
  [[nodiscard]] std::size_t edge_count() const noexcept { return preds.size(); }
  [[nodiscard]] std::uint32_t processor(std::uint32_t i) const noexcept { return tasks[i].processor(); }
  [[nodiscard]] time_ns duration(std::uint32_t i) const noexcept { return tasks[i].duration; }
  [[nodiscard]] std::uint32_t pred_begin(std::uint32_t i) const noexcept { return i == 0 ? 0 : tasks[i - 1].pred_end; }
  [[nodiscard]] std::uint32_t pred_end(std::uint32_t i) const noexcept { return tasks[i].pred_end; }
  [[nodiscard]] std::uint32_t finish_count(std::uint32_t i) const noexcept { return tasks[i].finishes(); }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return tasks.capacity() * sizeof(task_record) + preds.capacity() * sizeof(pred_ref) + task.capacity() * sizeof(task_id) + positions.capacity() * sizeof(graph::position);
  }
};

namespace detail {

// Names the tasks of one cycle among the tasks Kahn's algorithm could not order.
[[noreturn]] inline void report_cycle(const task_graph& g, const large_vector<std::uint32_t>& indegree,
                                      const large_vector<std::uint32_t>& in_begin,
                                      const large_vector<std::uint32_t>& in_edge) {
  const std::size_t n = g.task_count();
  std::vector<task_id> previous_on_processor(n, no_task);
  {
    std::vector<task_id> last(g.processors.size(), no_task);
    for (task_id t = 0; t < n; ++t) previous_on_processor[t] = std::exchange(last[g.processor[t]], t);
  }
  task_id t = 0;
  while (t < n && indegree[t] == 0) ++t;
  // Walk to unordered predecessors until a task repeats: that walk ends on a cycle.
  std::vector<std::uint32_t> seen(n, 0);
  std::vector<task_id> walk;
  std::uint32_t step = 1;
  while (seen[t] == 0) {
    seen[t] = step++;
    walk.push_back(t);
    task_id next = no_task;
    const task_id prev = previous_on_processor[t];
    if (prev != no_task && indegree[prev] != 0) next = prev;
    for (std::uint32_t e = in_begin[t]; next == no_task && e < in_begin[t + 1]; ++e) {
      if (indegree[g.edges[in_edge[e]].from] != 0) next = g.edges[in_edge[e]].from;
    }
    if (next == no_task) break;  // cannot happen: an unordered task has an unordered predecessor
    t = next;
  }
  // `walk` followed predecessors, so the cycle in execution order is walk reversed, from its
  // last task back to the repeated task `t`.
  std::vector<task_id> cycle;
  for (auto it = walk.rbegin(); it != walk.rend(); ++it) {
    cycle.push_back(*it);
    if (*it == t) break;
  }
  cycle.push_back(walk.back());
  // A cycle through a long run of one stream would make a message of megabytes: its ends name it.
  constexpr std::size_t shown = 8;
  std::string msg = "the execution graph has a cycle of " + std::to_string(cycle.size() - 1) + " tasks: ";
  for (std::size_t i = 0; i < cycle.size(); ++i) {
    if (cycle.size() > 2 * shown && i == shown) {
      msg += "... (" + std::to_string(cycle.size() - 2 * shown) + " more) -> ";
      i = cycle.size() - shown;
    }
    msg += g.describe(cycle[i]);
    if (i + 1 < cycle.size()) msg += " -> ";
  }
  throw error(msg);
}

// Kahn's algorithm, taking among the ready tasks the one added first (the smallest id):
// the order is the insertion order wherever that is topological, and stays close to it
// elsewhere. Builders add a processor's tasks together (a trace rank's thread, then its
// streams) or in time order (generated jobs), so neighbouring positions read neighbouring
// columns; a FIFO order interleaves every processor of a large job and misses the cache (the
// 512-rank job compiled 2.5x slower). When every edge already leads to a later task (generated
// and model-built jobs), that is the order, without the heap. Appends to `order`; `ready` is
// scratch.
template <class Counts, class Next, class Offsets, class Targets, class Ready, class Order>
void topological_order(Counts& indegree, const Next& next_on_processor, const Offsets& out_begin, const Targets& out_to,
                       Ready& ready, Order& order) {
  const std::size_t n = indegree.size();
  bool in_order = true;  // every edge leads to a later task: the insertion order itself
  for (task_id t = 0; in_order && t < n; ++t) {
    for (std::uint32_t e = out_begin[t]; e < out_begin[t + 1]; ++e) in_order = in_order && out_to[e] > t;
  }
  if (in_order) {
    for (task_id t = 0; t < n; ++t) order.push_back(t);
    return;
  }
  // The smallest ready id, without a heap of every ready task: a scan in id order finds those
  // at or above it, and only a task released behind the scan (a host wait for the GPU ops after
  // it, say) goes into the heap `ready`, whose tasks are then all below any the scan finds. The
  // order is the same; the 512-rank job's heap held thousands of tasks at a time.
  const auto first_added = std::greater<>{};
  constexpr task_id prefetch_distance = 16;
  ready.clear();
  task_id scan = 0;
  auto release = [&](task_id u) {
    if (--indegree[u] == 0 && u < scan) {
      ready.push_back(u);
      std::push_heap(ready.begin(), ready.end(), first_added);
    }
  };
  while (true) {
    task_id t = 0;
    if (!ready.empty()) {
      std::pop_heap(ready.begin(), ready.end(), first_added);
      t = ready.back();
      ready.pop_back();
    } else {
      while (scan < n && indegree[scan] != 0) ++scan;
      if (scan == n) break;
      t = scan++;
      // Most tasks come from the scan, in id order: the counts their edges will release a few
      // tasks ahead are fetched now, not missed in cache then.
      if (const task_id ahead = t + prefetch_distance; ahead < n) {
        for (std::uint32_t e = out_begin[ahead]; e < out_begin[ahead + 1]; ++e) __builtin_prefetch(&indegree[out_to[e]], 1);
      }
    }
    order.push_back(t);
    if (next_on_processor[t] != no_task) release(next_on_processor[t]);
    for (std::uint32_t e = out_begin[t]; e < out_begin[t + 1]; ++e) release(out_to[e]);
  }
}

}  // namespace detail

/// What `compile_releasing` frees of the graph it compiles.
struct compile_release {
  bool durations = false;  ///< the durations and busy gaps (`task_graph::release_durations`)
  bool edges = false;      ///< the edges (`task_graph::release_edges`)
};

/// Working memory of `compile_into`: the predecessor and successor lists, counts and order
/// scratch of one compile. Its arrays only grow, so compiling one graph after another (a sweep
/// of task graphs) allocates nothing once they are as large as the largest graph. Not shared
/// between threads while in use.
struct compile_scratch {
  large_vector<std::uint32_t> in_begin;   ///< per task: first predecessor in `in_edge`
  large_vector<std::uint8_t> finishes;    ///< per task: finish edges into it
  large_vector<task_id> next_on_processor;
  large_vector<std::uint32_t> indegree;
  large_vector<std::uint32_t> out_begin;  ///< per task: first successor in `out_to`
  large_vector<task_id> out_to;
  large_vector<std::uint32_t> in_edge;    ///< edge indices, CSR by target
  std::vector<task_id> ready, last;
  std::vector<std::uint32_t> block_start;
};

namespace detail {

// compile_graph's first step: where each task's predecessors start (a prefix sum of their
// counts) and how many of them are finish edges; and, for Kahn's algorithm, the successors (CSR
// by source; processor order adds one implicit edge). The two read the edges independently: on
// two threads. The arrays are large vectors, as the graph's columns: their pages come back from
// the block cache that the arrays freed before the compile went to (set_block_cache_limit).
inline void lists_of(const task_graph& g, compile_scratch& w, unsigned threads) {
  const std::size_t n = g.task_count();
  w.in_begin.assign(n + 1, 0);
  w.finishes.assign(n, 0);
  parallel_for(2, threads, [&](std::size_t part) {
    if (part == 0) {
      for (const edge& e : g.edges) {
        ++w.in_begin[e.to + 1];
        if (e.finish) {
          if (w.finishes[e.to] == 255) throw error("task_graph: more than 255 finish edges into " + g.describe(e.to));
          ++w.finishes[e.to];
        }
      }
      for (std::size_t i = 0; i < n; ++i) w.in_begin[i + 1] += w.in_begin[i];
      w.next_on_processor.assign(n, no_task);
      w.indegree.assign(n, 0);
      w.last.assign(g.processors.size(), no_task);
      for (task_id t = 0; t < n; ++t) {
        const processor_id p = g.processor[t];
        w.indegree[t] = (w.in_begin[t + 1] - w.in_begin[t]) + (w.last[p] != no_task ? 1U : 0U);
        if (w.last[p] != no_task) w.next_on_processor[w.last[p]] = t;
        w.last[p] = t;
      }
    } else {
      w.out_begin.assign(n + 1, 0);
      for (const edge& e : g.edges) ++w.out_begin[e.from + 1];
      for (std::size_t i = 0; i < n; ++i) w.out_begin[i + 1] += w.out_begin[i];
      w.out_to.resize(g.edges.size());
      for (std::size_t i = 0; i < n; ++i) w.out_begin[i] = w.out_begin[i + 1];
      for (std::size_t k = g.edges.size(); k-- > 0;) w.out_to[--w.out_begin[g.edges[k].from]] = g.edges[k].to;
    }
  });
}

// The compile of compile_into(), compile() and compile_releasing(): `release(what)` is called
// with the durations once the records hold them, and with the edges once the predecessor lists
// do; the predecessor lists come first with `preds_first`. A `transient` scratch (compile()'s
// own) gives back its arrays as soon as they are read no more, which lowers the compile's peak
// memory; a caller's scratch keeps them for the next compile.
template <class Durations, class Release>
void compile_graph(const task_graph& g, const scales& s, const Durations& durations, bool preds_first, Release&& release,
                   compiled_graph& c, compile_scratch& w, bool transient) {
  const std::size_t n = g.task_count();
  if (n >= (std::size_t{1} << 31)) throw error("task_graph: more than 2^31 tasks cannot be compiled");
  if (g.durations_released() || g.edges_released()) {
    throw error("task_graph: its durations or edges were released after an earlier compile (graph::compile_releasing); it cannot be compiled again");
  }
  for (const edge& e : g.edges) {
    if (e.from >= n || e.to >= n) throw error("task_graph: an edge refers to a task that does not exist");
  }

  constexpr std::size_t block = std::size_t{1} << 16;
  const unsigned threads = n >= 4 * block ? hardware_threads() : 1;
  const auto give_back = [transient](auto& v) {
    if (transient) v = std::remove_reference_t<decltype(v)>{};  // frees it (`v = {}` keeps the capacity)
  };

  lists_of(g, w, threads);
  // The predecessor lists themselves (CSR of edge indices: 4 bytes an edge), start edges before
  // finish edges, in insertion order. Made beside the order when the lists are filled first
  // (they read nothing the order does); otherwise only once the records are (or for a cycle
  // report), so that they are not held beside the records and the graph's durations, the
  // compile's peak.
  bool have_in_edge = false;
  auto predecessor_edges = [&] {
    w.in_edge.resize(g.edges.size());
    // Filled from the back (finish edges, then start edges, each in reverse), so each list
    // ends in insertion order, start edges first, and in_begin[t] is back at t's first entry.
    for (std::size_t i = 0; i < n; ++i) w.in_begin[i] = w.in_begin[i + 1];
    for (int pass = 1; pass >= 0; --pass) {
      for (std::size_t k = g.edges.size(); k-- > 0;) {
        const edge& e = g.edges[k];
        if (e.finish == (pass == 1)) w.in_edge[--w.in_begin[e.to]] = static_cast<std::uint32_t>(k);
      }
    }
    have_in_edge = true;
  };

  c.processor_count = static_cast<std::uint32_t>(g.processors.size());
  c.task.clear();
  c.task.reserve(n);
  parallel_for(preds_first ? 2 : 1, threads, [&](std::size_t part) {
    if (part == 0) {
      detail::topological_order(w.indegree, w.next_on_processor, w.out_begin, w.out_to, w.ready, c.task);
    } else {
      predecessor_edges();
    }
  });
  if (c.task.size() != n) {
    if (!have_in_edge) predecessor_edges();
    detail::report_cycle(g, w.indegree, w.in_begin, w.in_edge);
  }
  // Only the predecessor lists are read from here on: a transient scratch frees the successor
  // lists and counts before the records are allocated (a 512-rank job's compile peaked with
  // both).
  give_back(w.indegree), give_back(w.next_on_processor), give_back(w.ready), give_back(w.out_begin), give_back(w.out_to);

  if (g.processors.size() >= (std::size_t{1} << task_record::processor_bits)) {
    throw error("task_graph: more than 16777215 processors cannot be compiled");
  }
  // The records are independent once each position knows where its predecessors start (a
  // prefix sum): filled in parallel blocks, the same for any thread count. So are the
  // predecessor lists. Only the records read the durations, and only the lists the edges: which
  // comes first depends on what is released (see compile_releasing).
  const std::size_t blocks = (n + block - 1) / block;
  auto positions_of = [&](std::size_t b) { return std::pair{b * block, std::min(n, (b + 1) * block)}; };
  w.block_start.assign(blocks + 1, 0);
  for (std::size_t b = 0; b < blocks; ++b) {
    std::uint32_t count = 0;
    const auto [first, last] = positions_of(b);
    for (std::size_t i = first; i < last; ++i) count += w.in_begin[c.task[i] + 1] - w.in_begin[c.task[i]];
    w.block_start[b + 1] = w.block_start[b] + count;
  }
  auto fill_records = [&] {
    c.tasks.resize(n);
    parallel_for(blocks, threads, [&](std::size_t b) {
      std::uint32_t out = w.block_start[b];
      const auto [first, last] = positions_of(b);
      for (std::size_t i = first; i < last; ++i) {
        const task_id t = c.task[i];
        out += w.in_begin[t + 1] - w.in_begin[t];
        c.tasks[i] = {g.idle_gap[t] + scale_time(g.busy_gap[t], s.cpu), durations.duration(g, t, s),
                      g.processor[t] | (static_cast<std::uint32_t>(w.finishes[t]) << task_record::processor_bits), out};
      }
    });
  };
  // `busy(i, t)`: the busy prelude of task t at position i, which start edges carry (see
  // task_record); finish edges do not.
  auto fill_preds = [&](auto busy) {
    if (!have_in_edge) predecessor_edges();
    c.positions.resize(n);
    parallel_for(blocks, threads, [&](std::size_t b) {
      const auto [first, last] = positions_of(b);
      for (std::size_t i = first; i < last; ++i) c.positions[c.task[i]] = position{static_cast<std::uint32_t>(i)};
    });
    c.preds.resize(g.edges.size());
    parallel_for(blocks, threads, [&](std::size_t b) {
      std::uint32_t out = w.block_start[b];
      const auto [first, last] = positions_of(b);
      for (std::size_t i = first; i < last; ++i) {
        const task_id t = c.task[i];
        const time_ns prelude = busy(i, t);
        const std::uint32_t first_finish = w.in_begin[t + 1] - w.finishes[t];
        for (std::uint32_t e = w.in_begin[t]; e < w.in_begin[t + 1]; ++e) {
          const edge& in = g.edges[w.in_edge[e]];
          const time_ns delay = e < first_finish ? in.delay + prelude : in.delay;
          c.preds[out++] = {2 * index(c.positions[in.from]) + (in.from_start ? 0U : 1U), clamp_delay(delay)};
        }
      }
    });
    give_back(w.in_edge);
  };
  if (preds_first) {
    fill_preds([&](std::size_t, task_id t) { return scale_time(g.busy_gap[t], s.cpu); });
    release(compile_release{.edges = true});
    fill_records();
    release(compile_release{.durations = true});
  } else {
    fill_records();
    release(compile_release{.durations = true});
    fill_preds([&](std::size_t i, task_id t) { return c.tasks[i].gap - g.idle_gap[t]; });
    release(compile_release{.edges = true});
  }
}

}  // namespace detail

/// Orders and flattens `g` into `out`, applying `durations` (scales by default), with the
/// caller's working memory: `out`'s arrays and `scratch`'s keep their capacity, so compiling
/// one graph after another allocates nothing once both are as large as the largest graph (on
/// graphs below 2^18 tasks, which compile on the calling thread). Deterministic: among ready
/// tasks the one added first goes first (detail::topological_order). O(tasks + edges). A cycle
/// (e.g. a wait on an event recorded later on the same thread) is a lumos::error naming the
/// tasks on it.
template <DurationModel Durations = scaled_durations>
void compile_into(const task_graph& g, compiled_graph& out, compile_scratch& scratch, const scales& s = {},
                  const Durations& durations = {}) {
  detail::compile_graph(g, s, durations, false, [](compile_release) {}, out, scratch, false);
}

/// `compile_into` a new compiled graph, with working memory freed as early as it can be.
template <DurationModel Durations = scaled_durations>
[[nodiscard]] compiled_graph compile(const task_graph& g, const scales& s = {}, const Durations& durations = {}) {
  compiled_graph c;
  compile_scratch scratch;
  detail::compile_graph(g, s, durations, false, [](compile_release) {}, c, scratch, true);
  return c;
}

/// The same, for a caller that reads some of the graph's columns no more (`lumos replay`):
/// frees the durations and busy gaps as soon as the records hold them, and the edges as soon as
/// the predecessor lists do, so that the graph and its compiled form do not hold the same
/// values at the compile's peak and after. The part whose columns go is made first: with the
/// edges released, the predecessor lists (their 141 MiB of a 512-rank job are gone before the
/// 343 MiB of records are made); otherwise the records. The graph then serves reports, but no
/// second compile.
template <DurationModel Durations = scaled_durations>
[[nodiscard]] compiled_graph compile_releasing(task_graph& g, compile_release what, const scales& s = {}, const Durations& durations = {}) {
  compiled_graph c;
  compile_scratch scratch;
  detail::compile_graph(
      g, s, durations, what.edges,
      [&](compile_release now) {
        if (now.durations && what.durations) g.release_durations();
        if (now.edges && what.edges) g.release_edges();
      },
      c, scratch, true);
  return c;
}

}  // namespace lumos::graph

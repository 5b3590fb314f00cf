#pragma once
// The replay engine: one pass over a compiled graph in topological order.
//
//   start[i]  = max(processor free + gap[i], max over start preds (time[pred] + delay)) + busy[i]
//   end[i]    = max(start[i] + duration[i], max over finish preds (time[pred] + delay))
// where time[pred] is the predecessor's finish, or its start for launch edges (the busy
// prelude is folded into the gap and the start-edge delays when the graph is compiled).
//
// Processor model and observers are template parameters; observers are called inline and
// cost nothing when absent. The loop touches only the compiled graph's flat arrays.

#include <lumos/core/allocator.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace lumos::sim {

using graph::compiled_graph;

/// What the engine reads from a graph: tasks in topological order as contiguous
/// `graph::task_record`s, CSR predecessors as contiguous `graph::pred_ref`s, and the number of
/// processors. `graph::compiled_graph` models it; any flat graph with this layout can be replayed.
template <class G>
concept GraphLike = requires(const G& g) {
  { g.size() } -> std::convertible_to<std::size_t>;
  { g.processor_count } -> std::convertible_to<std::uint32_t>;
  { g.tasks.data() } -> std::convertible_to<const graph::task_record*>;
  { g.preds.data() } -> std::convertible_to<const graph::pred_ref*>;
};
static_assert(GraphLike<compiled_graph>);

/// How a processor bounds the start of its next task. `available(p)` is the earliest time the
/// next task of p may start, before its gap; `occupy(p, end)` records that p is busy until end.
template <class P>
concept ProcessorModel = requires(P& m, const P& cm, std::size_t n, graph::processor_id p, time_ns t) {
  m.reset(n);
  { cm.available(p) } -> std::convertible_to<time_ns>;
  m.occupy(p, t);
};

/// Every processor runs one task at a time, in graph order (CPU threads, CUDA streams).
class in_order_processors {
 public:
  void reset(std::size_t n) { free_.assign(n, 0); }
  [[nodiscard]] time_ns available(graph::processor_id p) const noexcept { return free_[p]; }
  void occupy(graph::processor_id p, time_ns end) noexcept { free_[p] = end; }

 private:
  std::vector<time_ns> free_;  // copies and moves own their data (no pointer into it is kept)
};
static_assert(ProcessorModel<in_order_processors>);

/// Observes the replay: `begin(size)` once, `task(position, start, end)` for every task in
/// graph order, `end()` once. Observers are called inline.
template <class O>
concept ReplayObserver = requires(O& o, std::size_t n, std::uint32_t i, time_ns t) {
  o.begin(n);
  o.task(i, t, t);
  o.end();
};

/// Records every task's start and finish (indexed by graph position).
class record_timeline {
 public:
  /// A timeline of the interleaved start and finish of every position, as the engine keeps them
  /// (`basic_replay::release_times`): taken over instead of copied.
  [[nodiscard]] static record_timeline from_interleaved(output_vector<time_ns>&& times) noexcept {
    record_timeline t;
    t.times_ = std::move(times);
    return t;
  }
  void begin(std::size_t n) { times_.resize(2 * n); }
  void task(std::uint32_t i, time_ns s, time_ns e) noexcept {
    times_[2 * std::size_t{i}] = s;
    times_[2 * std::size_t{i} + 1] = e;
  }
  void end() noexcept {}
  /// Times by a task's place in the compiled order (`compiled_graph::position_of(task_id)`);
  /// the columns are not exposed, so a task id cannot index them by mistake.
  [[nodiscard]] time_ns start_of(graph::position p) const noexcept { return times_[2 * std::size_t{graph::index(p)}]; }
  [[nodiscard]] time_ns finish_of(graph::position p) const noexcept { return times_[2 * std::size_t{graph::index(p)} + 1]; }
  [[nodiscard]] std::size_t size() const noexcept { return times_.size() / 2; }
  /// The latest finish (0 for an empty graph): the replay's makespan.
  [[nodiscard]] time_ns makespan() const noexcept {
    time_ns m = 0;
    for (std::size_t i = 1; i < times_.size(); i += 2) m = std::max(m, times_[i]);
    return m;
  }

 private:
  output_vector<time_ns> times_;  // start, finish of each position; written whole by every run
};
static_assert(ReplayObserver<record_timeline>);

/// Keeps only the latest finish (for sweeps that need the makespan alone).
struct makespan_only {
  time_ns makespan = 0;
  void begin(std::size_t) noexcept { makespan = 0; }
  void task(std::uint32_t, time_ns, time_ns e) noexcept { makespan = std::max(makespan, e); }
  void end() noexcept {}
};
static_assert(ReplayObserver<makespan_only>);

/// The replay engine. `Processors` decides processor occupancy; `Observers...` are called for
/// every task. The engine keeps every task's start and finish in one interleaved array
/// (predecessors read either); it allocates once per graph size and can be reused (sweeps).
template <ProcessorModel Processors = in_order_processors>
class basic_replay {
 public:
  /// Replays `g`, calling every observer; returns the makespan (latest finish). Observers are
  /// taken by forwarding reference: lvalues report back, temporaries are allowed.
  template <GraphLike Graph, class... Observers>
    requires(ReplayObserver<std::remove_cvref_t<Observers>> && ...)
  [[nodiscard("the makespan; use the observers for per-task times")]] time_ns run(const Graph& g, Observers&&... observers) {
    const std::size_t n = g.size();
    processors_.reset(g.processor_count);
    times_.resize(2 * n);
    (observers.begin(n), ...);
    const graph::task_record* const rec = g.tasks.data();
    const graph::pred_ref* const preds = g.preds.data();
    time_ns* const times = times_.data();
    std::uint32_t b = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const graph::task_record r = rec[i];
      const std::uint32_t p = r.processor();
      const std::uint32_t e = r.pred_end;
      time_ns s = processors_.available(p) + r.gap;
      time_ns t;
      // Two copies of the start-edge loop: one loop with an empty finish range measured 0.54-0.66x
      // of the reference loop on the shared traces against 0.76-0.84x for this form
      // (bash scripts/bench.sh replay).
      if (r.finishes() == 0) {  // the common case: start edges only
        for (std::uint32_t j = b; j < e; ++j) s = std::max(s, times[preds[j].time] + preds[j].delay);
        t = s + r.duration;
      } else {
        const std::uint32_t f = e - r.finishes();
        for (std::uint32_t j = b; j < f; ++j) s = std::max(s, times[preds[j].time] + preds[j].delay);
        t = s + r.duration;
        for (std::uint32_t j = f; j < e; ++j) t = std::max(t, times[preds[j].time] + preds[j].delay);
      }
      times[2 * i] = s;
      times[2 * i + 1] = t;
      processors_.occupy(p, t);
      (observers.task(i, s, t), ...);
      b = e;
    }
    (observers.end(), ...);
    // The latest finish is the latest time a processor became free.
    time_ns makespan = 0;
    for (std::uint32_t p = 0; p < g.processor_count; ++p) makespan = std::max(makespan, processors_.available(p));
    return makespan;
  }

  /// The start and finish of every position from the last run, interleaved, handed over (for
  /// `record_timeline::from_interleaved`); the engine keeps nothing until its next run.
  [[nodiscard]] output_vector<time_ns> release_times() noexcept { return std::move(times_); }

  /// Start and finish of the task at graph position i, from the last run.
  [[nodiscard]] time_ns start(std::uint32_t i) const noexcept { return times_[2 * i]; }
  [[nodiscard]] time_ns finish(std::uint32_t i) const noexcept { return times_[2 * i + 1]; }
  [[nodiscard]] time_ns start(graph::position p) const noexcept { return start(graph::index(p)); }
  [[nodiscard]] time_ns finish(graph::position p) const noexcept { return finish(graph::index(p)); }

 private:
  Processors processors_;
  output_vector<time_ns> times_;  // written whole by every run
};

/// The default engine: in-order processors.
using replay_engine = basic_replay<>;

/// Convenience: replays `g` and returns every task's start and finish.
template <GraphLike Graph>
[[nodiscard]] record_timeline replay(const Graph& g) {
  replay_engine engine;
  record_timeline timeline;
  (void)engine.run(g, timeline);  // the timeline has the times; the makespan is its latest finish
  return timeline;
}

}  // namespace lumos::sim

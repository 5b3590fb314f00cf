#pragma once
// direct_sink — where the program builder puts tasks when it emits the compiled form straight
// away (synth::build_compiled_into): each task becomes a graph::task_record and its edges
// predecessor refs the moment all its predecessors are placed, in a topological order that
// keeps every processor's tasks in the order they were added. A task whose predecessors are not
// all placed yet (a join whose participants have not all arrived, a transfer that waits for
// it) waits, and is placed as soon as the last of them is.
//
// The replay of a compiled graph depends only on which tasks precede which, not on where they
// sit in a topological order: the timeline is the one graph::compile of the same task graph
// gives (tests/synth compares them processor by processor).
//
// Each task's start and finish are computed as it is placed, by the replay engine's rule for a
// record without gap or finish edges (the only records placed here): start = the latest of its
// processor's last finish and each predecessor's time plus delay; finish = start + own time.
// Its predecessors are all placed by then, and the records are written in the order the engine
// reads them, so the timeline is the one sim::basic_replay gives for the finished graph (tests
// compare them): a sweep needs no second pass over the records. The two own times set after a
// task is placed (set_duration, add_duration) belong to the last task placed on their
// processor, whose finish nothing has read yet.
//
// A build may keep the timeline alone (`graph` false in reset): no record, predecessor ref or
// kind is stored, the refs of each task only long enough to time it. What a sweep reads of a
// program is its timeline; the 24-byte records it would write and never read are, for a
// program of 10^5 tasks, more than the cache holds.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace lumos::synth {

/// A task of a `compiled_program` that its figures read: its position and its processor (which
/// its record holds too; here without reading the record).
struct watched_task {
  std::uint32_t position;
  graph::processor_id processor;
  graph::task_kind kind;
};

}  // namespace lumos::synth

namespace lumos::synth::detail {

/// An edge into a task given to `direct_sink::task`: a start edge from `from`'s finish, or from
/// its start (`from_start`: a launch), plus `delay` (saturated to 32 bits, as task_graph's).
struct direct_edge {
  graph::task_id from;
  std::int32_t delay;
  bool from_start;
};

/// A launch edge given to `direct_sink::task`: from the start of `launcher`, plus `delay`.
struct launch_ref {
  graph::task_id launcher = graph::no_task;
  std::int32_t delay = 0;
};

/// Places tasks into a compiled graph as they are emitted (see the header comment). A task is
/// named by the handle `task` or `join` returns: its position once placed then, or a waiting
/// task's number with the top bit set (`position` gives its place once every task is placed).
/// Reused: its arrays keep their capacity from one build to the next.
class direct_sink {
 public:
  /// Starts a build into `out` (cleared, its capacity kept), `kinds` (each position's kind),
  /// `processors`, `watched` and `times` (each position's start and finish); `tasks` and
  /// `edges` are the expected sizes. `graph` false: `out` and `kinds` stay empty (see the header
  /// comment).
  void reset(graph::compiled_graph& out, output_vector<graph::task_kind>& kinds, std::vector<graph::processor_info>& processors,
             std::array<output_vector<watched_task>, 2>& watched, output_vector<time_ns>& times, std::size_t tasks,
             std::size_t edges, bool graph = true) {
    out_ = &out;
    graph_ = graph;
    timeline_ = &times;
    kinds_ = &kinds;
    processors_ = &processors;
    watched_ = &watched;
    w_ = {};
    out.processor_count = 0;
    out.task.clear();
    out.positions.clear();
    n_ = e_ = task_room_ = edge_room_ = 0;
    refs_ = 0;
    grow(tasks, edges);
    processors.clear();
    lanes_.clear();
    pending_.clear();
    in_.clear();
    release_.clear();
    waiting_ = 0;
    folded_tasks_ = 0;
    folded_edges_ = 0;
  }

  /// Counts `tasks` tasks of the task graph that the builder folded into others, and the
  /// difference `edges` their folding made to the edge count (task graph less compiled).
  void fold(std::size_t tasks, std::ptrdiff_t edges) noexcept {
    folded_tasks_ += tasks;
    folded_edges_ += edges;
  }
  /// The task graph's counts: the tasks placed and the edges written, with what was folded.
  [[nodiscard]] std::size_t graph_tasks() const noexcept { return n_ + folded_tasks_; }
  [[nodiscard]] std::size_t graph_edges() const noexcept {
    return static_cast<std::size_t>(static_cast<std::ptrdiff_t>(refs_) + folded_edges_);
  }

  /// Ends the build: the compiled graph holds the placed tasks, `times` (reset) their start and
  /// finish. False when some tasks still wait for each other (a cycle).
  [[nodiscard]] bool finish() {
    out_->tasks.resize(graph_ ? n_ : 0);
    out_->preds.resize(graph_ ? e_ : 0);
    kinds_->resize(graph_ ? n_ : 0);
    timeline_->resize(2 * std::size_t{n_});
    (*watched_)[0].resize(w_[0]);
    (*watched_)[1].resize(w_[1]);
    return waiting_ == 0;
  }

  /// A new processor (its tasks run one at a time, in the order they are added); the positions
  /// of its tasks are listed in the watched lists whose bits `watched` sets
  /// (compiled_program::watched).
  graph::processor_id processor(graph::processor_kind kind, int rank, std::int64_t owner, std::int64_t index,
                                std::uint8_t watched = 0) {
    if (processors_->size() + 1 >= (std::size_t{1} << graph::task_record::processor_bits)) {
      throw error("task_graph: more than 16777215 processors cannot be compiled");
    }
    processors_->push_back({kind, rank, owner, index, {}});
    lanes_.push_back({0, graph::no_task, watched});
    out_->processor_count = static_cast<std::uint32_t>(processors_->size());
    return static_cast<graph::processor_id>(processors_->size() - 1);
  }

  /// A task on processor `p` after every task already on it, with start edges from the finish
  /// of each of `deps` and of `extra` (when given), and the launch edge `launch` (when given):
  /// tasks already added. Placed now if they and its processor predecessor are.
  [[gnu::always_inline]] graph::task_id task(graph::processor_id p, graph::task_kind kind, time_ns duration,
                                             std::span<const graph::task_id> deps, graph::task_id extra = graph::no_task,
                                             const launch_ref* launch = nullptr) {
    lane& at = lanes_[p];
    const graph::task_id previous = at.last;
    std::uint32_t e = e_;
    if (n_ >= task_room_ || e + deps.size() + 2 > edge_room_) [[unlikely]] grow(1, deps.size() + 2);
    // The refs are written, and the start found, as the predecessors are checked; a task that
    // must wait leaves them unclaimed past e_ (and the start unread).
    graph::pred_ref* const preds = preds_;
    const time_ns* const times = times_;
    bool ready = placed(previous);
    time_ns start = at.free;
    if (launch != nullptr) {
      const std::uint32_t time = 2 * ref(launch->launcher, ready);
      preds[e++] = {time, launch->delay};
      start = std::max(start, times[time] + launch->delay);
    }
    for (const graph::task_id d : deps) {
      const std::uint32_t time = 2 * ref(d, ready) + 1;
      preds[e++] = {time, 0};
      start = std::max(start, times[time]);
    }
    if (extra != graph::no_task) {
      const std::uint32_t time = 2 * ref(extra, ready) + 1;
      preds[e++] = {time, 0};
      start = std::max(start, times[time]);
    }
    const graph::task_id t =
        ready ? record(p, kind, duration, e, start) : hold(p, kind, duration, previous, edges_of(deps, extra, launch), 0);
    at.last = t;
    return t;
  }

  /// A join on barrier processor `p` that `participants` arrive tasks will precede
  /// (`arrive`); placed once they all have been added and placed.
  graph::task_id join(graph::processor_id p, int participants) {
    const graph::task_id t = hold(p, graph::task_kind::join, 0, lanes_[p].last, {}, static_cast<std::uint32_t>(participants));
    in_.resize(in_.size() + static_cast<std::size_t>(participants));  // the arrive edges to come
    lanes_[p].last = t;
    return t;
  }

  /// One participant's arrive task, which `join` (not yet complete) waits for.
  void arrive(graph::task_id join, graph::task_id arrive) {
    const std::uint32_t k = join & ~waiting;
    pending_task& j = pending_[k];
    in_[j.in_end++] = {arrive, 0, false};
    if (--j.arrivals > 0) return;
    // The last participant: placed now when every arrive and the join before it are.
    bool ready = placed(j.previous);
    for (std::uint32_t e = j.in_begin; e < j.in_end; ++e) ready = ready && placed(in_[e].from);
    if (!ready) {
      settle(k);
      return;
    }
    j.position = place(j.processor, j.kind, j.duration, std::span<const direct_edge>(in_.data() + j.in_begin, j.in_end - j.in_begin));
    --waiting_;
    if (j.waiters != none) release(j.waiters);
  }

  /// Sets the own time of task `t` (placed or not) on processor `p`: a batch's launching CPU
  /// task, whose length is known once its batch is.
  [[gnu::always_inline]] void set_duration(graph::processor_id p, graph::task_id t, time_ns duration) {
    if ((t & waiting) == 0) {
      retime(p, t, duration);
    } else if (const pending_task& w = pending_[t & ~waiting]; w.position != none) {
      retime(p, w.position, duration);
    } else {
      pending_[t & ~waiting].duration = duration;
    }
  }

  /// Adds `duration` to the own time of task `t` (placed or not) on processor `p`: a task that
  /// takes the time of one queued right behind it.
  [[gnu::always_inline]] void add_duration(graph::processor_id p, graph::task_id t, time_ns duration) {
    if ((t & waiting) == 0) {
      retime(p, t, own_time(t) + duration);
    } else if (const pending_task& w = pending_[t & ~waiting]; w.position != none) {
      retime(p, w.position, own_time(w.position) + duration);
    } else {
      pending_[t & ~waiting].duration += duration;
    }
  }

  /// The latest finish of any placed task (the replay's makespan).
  [[nodiscard]] time_ns makespan() const noexcept {
    time_ns m = 0;
    for (const lane& l : lanes_) m = std::max(m, l.free);
    return m;
  }

  /// The last task added to `p`, or no_task.
  [[nodiscard]] graph::task_id last_on(graph::processor_id p) const noexcept { return lanes_[p].last; }

  /// Where task `t` is in the compiled graph (once placed).
  [[nodiscard]] graph::position position(graph::task_id t) const noexcept { return graph::position{resolve(t)}; }

 private:
  static constexpr std::uint32_t waiting = std::uint32_t{1} << 31;  ///< a handle: a pending_ index follows
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  // A task that waits: what its record needs, its edges (in_[in_begin, in_end)), how far the
  // check of its predecessors got (0: its processor predecessor; k + 1: in_[in_begin + k]), and
  // where it went once placed.
  struct pending_task {
    graph::processor_id processor = 0;
    graph::task_kind kind = graph::task_kind::cpu;
    time_ns duration = 0;
    graph::task_id previous = graph::no_task;
    std::uint32_t in_begin = 0, in_end = 0;
    std::uint32_t arrivals = 0;  ///< a join's participants still to arrive
    std::uint32_t checked = 0;
    std::uint32_t waiters = none;      ///< first task waiting for this one
    std::uint32_t next_waiter = none;  ///< next task waiting for the same one
    std::uint32_t position = none;
  };

  graph::compiled_graph* out_ = nullptr;
  bool graph_ = true;  // keep the compiled graph and the kinds, not only the timeline
  output_vector<graph::task_kind>* kinds_ = nullptr;
  output_vector<time_ns>* timeline_ = nullptr;
  time_ns* times_ = nullptr;  // start and finish of each position, interleaved (as the engine keeps them)
  std::vector<graph::processor_info>* processors_ = nullptr;
  // The output arrays, sized to their capacity during a build: n_ tasks and e_ edges written.
  graph::task_record* records_ = nullptr;
  graph::pred_ref* preds_ = nullptr;
  graph::task_kind* kind_ = nullptr;
  std::array<output_vector<watched_task>, 2>* watched_ = nullptr;
  std::array<watched_task*, 2> watched_at_{};
  std::array<std::uint32_t, 2> w_{};
  std::uint32_t n_ = 0, e_ = 0, task_room_ = 0, edge_room_ = 0;
  std::size_t refs_ = 0;  // predecessor refs of the placed tasks (e_ when the graph is kept)
  // What the sink keeps of a processor, in one place (every task reads all of it).
  struct lane {
    time_ns free;          // the finish of its last task placed
    graph::task_id last;   // the last task added
    std::uint8_t watched;  // the watched lists its tasks go to (bits)
  };
  std::vector<lane> lanes_;
  std::vector<pending_task> pending_;
  std::vector<direct_edge> in_;         // the edges of waiting tasks
  std::vector<direct_edge> scratch_;    // a waiting task's edges, before they go to in_
  std::vector<std::uint32_t> release_;  // waiting tasks to check again
  std::size_t waiting_ = 0;
  std::size_t folded_tasks_ = 0;
  std::ptrdiff_t folded_edges_ = 0;

  [[nodiscard]] bool placed(graph::task_id t) const noexcept {
    return (t & waiting) == 0 || t == graph::no_task || pending_[t & ~waiting].position != none;
  }
  [[nodiscard]] std::uint32_t resolve(graph::task_id t) const noexcept {
    return (t & waiting) == 0 ? t : pending_[t & ~waiting].position;
  }
  // The position of task `t` (not no_task); clears `ready` when it is not placed yet, and then
  // gives 0: the first task of a build, placed at once (it has no predecessor), whose times the
  // caller may read without a branch and does not use (the task waits).
  [[gnu::always_inline]] std::uint32_t ref(graph::task_id t, bool& ready) const noexcept {
    if ((t & waiting) == 0) [[likely]] return t;
    const std::uint32_t at = pending_[t & ~waiting].position;
    if (at != none) return at;
    ready = false;
    return 0;
  }

  // Room for `tasks` and `edges` more than written: the arrays at (at least) that size, their
  // unwritten part left uninitialised.
  void grow(std::size_t tasks, std::size_t edges) {
    if (n_ + tasks >= waiting) throw error("task_graph: more than 2^31 tasks cannot be compiled");
    graph::compiled_graph& c = *out_;
    // What earlier builds left: the room of the arrays this build keeps. Without the graph, the
    // refs of one task at a time are written from the start of `preds`: its room is not doubled.
    const std::size_t kept = graph_ ? c.tasks.capacity() : timeline_->capacity() / 2;
    const std::size_t t = std::max<std::size_t>({n_ + tasks, kept, 2 * std::size_t{task_room_}});
    const std::size_t e = std::max<std::size_t>({e_ + edges, c.preds.capacity(), graph_ ? 2 * std::size_t{edge_room_} : 0});
    if (graph_) c.tasks.resize(t), kinds_->resize(t);
    c.preds.resize(e);
    timeline_->resize(2 * t);
    records_ = c.tasks.data();
    preds_ = c.preds.data();
    kind_ = kinds_->data();
    times_ = timeline_->data();
    for (std::size_t l = 0; l < 2; ++l) {
      (*watched_)[l].resize(t);
      watched_at_[l] = (*watched_)[l].data();
    }
    task_room_ = static_cast<std::uint32_t>(std::min<std::size_t>(t, waiting));
    edge_room_ = static_cast<std::uint32_t>(std::min<std::size_t>(e, ~std::uint32_t{0}));
  }

  // The record of the task whose predecessor refs end at `e` (its first is at e_), and its times:
  // `start` is the latest of its processor's last finish and its predecessors' times.
  [[gnu::always_inline]] std::uint32_t record(graph::processor_id p, graph::task_kind kind, time_ns duration, std::uint32_t e,
                                              time_ns start) {
    const std::uint32_t n = n_;
    time_ns* const times = times_;
    lane& at = lanes_[p];
    times[2 * std::size_t{n}] = start;
    times[2 * std::size_t{n} + 1] = at.free = start + duration;
    refs_ += e - e_;
    if (graph_) {
      records_[n] = {0, duration, p, e};
      kind_[n] = kind;
      e_ = e;
    }
    if (const std::uint8_t watch = at.watched; watch != 0) [[unlikely]] add_watched(n, p, kind, watch);
    n_ = n + 1;
    return n;
  }

  // The own time of placed task `n`: its finish less its start (no gap, no finish edge).
  [[nodiscard]] time_ns own_time(std::uint32_t n) const noexcept { return times_[2 * std::size_t{n} + 1] - times_[2 * std::size_t{n}]; }

  // A new own time for placed task `n`, the last placed on its processor `p` (see the header
  // comment).
  void retime(graph::processor_id p, std::uint32_t n, time_ns duration) {
    if (graph_) records_[n].duration = duration;
    times_[2 * std::size_t{n} + 1] = lanes_[p].free = times_[2 * std::size_t{n}] + duration;
  }

  // Task `n` of `kind` on processor `p` into the watched lists whose bits `watch` sets.
  [[gnu::noinline]] void add_watched(std::uint32_t n, graph::processor_id p, graph::task_kind kind, std::uint8_t watch) {
    for (std::size_t l = 0; l < 2; ++l) {
      if ((watch >> l & 1U) != 0) watched_at_[l][w_[l]++] = {n, p, kind};
    }
  }

  // Writes the record and predecessor refs of a waiting task whose predecessors are all placed.
  std::uint32_t place(graph::processor_id p, graph::task_kind kind, time_ns duration, std::span<const direct_edge> in) {
    if (n_ + 1 > task_room_ || e_ + in.size() > edge_room_) grow(1, in.size());
    std::uint32_t e = e_;
    time_ns start = lanes_[p].free;
    for (const direct_edge& x : in) {
      const std::uint32_t time = 2 * resolve(x.from) + (x.from_start ? 0U : 1U);
      preds_[e++] = {time, x.delay};
      start = std::max(start, times_[time] + x.delay);
    }
    return record(p, kind, duration, e, start);
  }

  // The edges of `task`'s arguments as one list, for a task that waits.
  std::span<const direct_edge> edges_of(std::span<const graph::task_id> deps, graph::task_id extra, const launch_ref* launch) {
    scratch_.clear();
    if (launch != nullptr) scratch_.push_back({launch->launcher, launch->delay, true});
    for (const graph::task_id d : deps) scratch_.push_back({d, 0, false});
    if (extra != graph::no_task) scratch_.push_back({extra, 0, false});
    return scratch_;
  }

  graph::task_id hold(graph::processor_id p, graph::task_kind kind, time_ns duration, graph::task_id previous,
                      std::span<const direct_edge> in, std::uint32_t arrivals) {
    if (pending_.size() >= waiting) throw error("task_graph: more than 2^31 tasks cannot be compiled");
    const auto k = static_cast<std::uint32_t>(pending_.size());
    pending_task& w = pending_.emplace_back();
    w.processor = p;
    w.kind = kind;
    w.duration = duration;
    w.previous = previous;
    w.in_begin = static_cast<std::uint32_t>(in_.size());
    in_.insert(in_.end(), in.begin(), in.end());  // `in` may be scratch_, never in_
    w.in_end = static_cast<std::uint32_t>(in_.size());
    w.arrivals = arrivals;
    ++waiting_;
    if (arrivals == 0) settle(k);
    return waiting | k;
  }

  // Checks waiting task `k` from where its last check stopped: waits on the first predecessor
  // not placed, or is placed (and the tasks waiting on it checked in turn).
  void settle(std::uint32_t k) {
    release_.push_back(k);
    while (!release_.empty()) {
      const std::uint32_t x = release_.back();
      release_.pop_back();
      pending_task& w = pending_[x];
      if (w.arrivals > 0 || w.position != none) continue;  // a join still open; or placed already
      graph::task_id blocker = graph::no_task;
      if (w.checked == 0) {
        if (!placed(w.previous)) blocker = w.previous;
        else w.checked = 1;
      }
      while (blocker == graph::no_task && w.in_begin + w.checked - 1 < w.in_end) {
        const graph::task_id from = in_[w.in_begin + w.checked - 1].from;
        if (!placed(from)) blocker = from;
        else ++w.checked;
      }
      if (blocker != graph::no_task) {
        pending_task& b = pending_[blocker & ~waiting];
        w.next_waiter = b.waiters;
        b.waiters = x;
        continue;
      }
      w.position = place(w.processor, w.kind, w.duration, std::span<const direct_edge>(in_.data() + w.in_begin, w.in_end - w.in_begin));
      for (std::uint32_t y = w.waiters; y != none; y = pending_[y].next_waiter) release_.push_back(y);
      --waiting_;
    }
  }

  // Checks again the tasks that waited for one just placed (`first` and those after it).
  void release(std::uint32_t first) {
    for (std::uint32_t y = pending_[first].next_waiter; y != none; y = pending_[y].next_waiter) release_.push_back(y);
    settle(first);
  }
};

}  // namespace lumos::synth::detail

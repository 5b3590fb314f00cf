#pragma once
// Iteration windows and per-rank / per-job results of a replay (docs/replay.md, "Metrics").

#include <lumos/core/error.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/summary.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace lumos::report {

/// Times of every task (by task id) in one timeline: the measured one (observed) or a replay.
struct task_times {
  const large_vector<time_ns>* start = nullptr;   ///< the measurement, by task id
  const large_vector<time_ns>* finish = nullptr;  ///< the measurement, by task id
  const graph::compiled_graph* positions = nullptr;  ///< a replay: where each task id sits in `timeline`
  /// Own duration of a task on this timeline (a communication op's transfer): the compiled
  /// (scaled) one for a replay, the graph's for the measurement; 0 when unknown.
  const large_vector<time_ns>* durations = nullptr;  ///< by task id, for the measurement
  const sim::record_timeline* timeline = nullptr;     ///< a replay, by position

  [[nodiscard]] time_ns begin_of(graph::task_id t) const noexcept {
    return timeline != nullptr ? timeline->start_of(positions->position_of(t)) : (*start)[t];
  }
  [[nodiscard]] time_ns end_of(graph::task_id t) const noexcept {
    return timeline != nullptr ? timeline->finish_of(positions->position_of(t)) : (*finish)[t];
  }
  [[nodiscard]] time_ns duration_of(graph::task_id t) const noexcept {
    if (positions != nullptr) return positions->duration(positions->position_of(t));
    return durations != nullptr ? (*durations)[t] : 0;
  }
};

/// The times of replay `timeline` of `compiled` (both must outlive the result).
[[nodiscard]] inline task_times simulated_times(const sim::record_timeline& timeline, const graph::compiled_graph& compiled) {
  return {.positions = &compiled, .timeline = &timeline};
}

[[nodiscard]] inline task_times observed_times(const graph::task_graph& g) {
  return {.start = &g.observed_start, .finish = &g.observed_end, .durations = &g.duration};
}

/// Where one profiler step ends on a timeline: the later of its annotation's end (the end of its
/// last CPU task plus the observed tail) and the end of the last GPU op launched inside it.
struct step_end {
  std::string name;                 ///< "ProfilerStep#N"
  graph::task_id last_cpu = graph::no_task;
  time_ns tail_idle = 0;            ///< last task end → annotation end, not covered by operators
  time_ns tail_busy = 0;            ///< the part of it covered by operators (scaled by `cpu`)
  std::vector<graph::task_id> gpu;  ///< GPU ops launched inside the annotation
};

/// Which tasks make up one rank's iteration, chosen once from the measured timeline and then
/// evaluated on any timeline (so measured and simulated windows use the same definition).
/// Window of step N (docs/replay.md, "Metrics": made to count each instant once): it ends
/// at `step_end` of N and begins at the later of N's annotation start and the end of step N-1
/// when the trace has it, so GPU work of step N-1 that spills into N's annotation counts
/// once, in N-1.
struct iteration_plan {
  int rank = 0;
  std::string step;                 ///< "ProfilerStep#N", or "trace window"
  bool annotated = false;
  graph::task_id first_cpu = graph::no_task;  ///< first CPU task inside the annotation
  graph::task_id last_cpu = graph::no_task;   ///< last CPU task inside it
  time_ns lead_idle = 0;            ///< annotation start → first task start (observed), idle part
  time_ns lead_busy = 0;            ///< the part covered by operators (scaled by `cpu`)
  time_ns tail_idle = 0;            ///< last task end → annotation end (observed), idle part
  time_ns tail_busy = 0;
  std::optional<step_end> previous; ///< step N-1 on this rank, when the trace has it
  std::vector<graph::task_id> cpu;  ///< every CPU task of the rank inside the window (whole-trace: all)
  std::vector<graph::task_id> gpu;  ///< GPU ops launched inside the annotation (whole trace: all)
  std::vector<std::pair<graph::task_id, graph::task_id>> comm;  ///< (arrive or op, complete or op)
  std::vector<graph::task_id> compute;
};

/// A window on one timeline, and what happened in it.
struct window_result {
  interval window;
  breakdown split;
  utilization sm;
};

[[nodiscard]] inline time_ns scaled_part(time_ns t, double factor) {
  return factor == 1.0 ? t : static_cast<time_ns>(std::llround(static_cast<double>(t) * factor));
}

/// The end of a step on timeline `t` (see `step_end`); `cpu` scales the busy part of the tail.
[[nodiscard]] inline time_ns evaluate_end(const step_end& e, const task_times& t, double cpu = 1.0) {
  time_ns end = std::numeric_limits<time_ns>::min();
  if (e.last_cpu != graph::no_task) end = t.end_of(e.last_cpu) + e.tail_idle + scaled_part(e.tail_busy, cpu);
  for (const auto id : e.gpu) end = std::max(end, t.end_of(id));
  return end;
}

/// The iteration window of plan `p` on timeline `t` alone (`evaluate` without the breakdown);
/// `cpu` as for `evaluate`.
[[nodiscard]] inline interval window_of(const iteration_plan& p, const task_times& t, double cpu = 1.0) {
  time_ns begin = std::numeric_limits<time_ns>::max(), end = std::numeric_limits<time_ns>::min();
  if (p.annotated) {
    begin = t.begin_of(p.first_cpu) - p.lead_idle - scaled_part(p.lead_busy, cpu);
    end = t.end_of(p.last_cpu) + p.tail_idle + scaled_part(p.tail_busy, cpu);
    if (p.previous) begin = std::max(begin, evaluate_end(*p.previous, t, cpu));
  } else {
    for (const auto id : p.cpu) {
      begin = std::min(begin, t.begin_of(id));
      end = std::max(end, t.end_of(id));
    }
    for (const auto id : p.gpu) begin = std::min(begin, t.begin_of(id));
  }
  for (const auto id : p.gpu) end = std::max(end, t.end_of(id));
  if (begin > end) begin = end = 0;
  return {begin, end};
}

/// Evaluates plan `p` on timeline `t`; `cpu` is the scale the timeline was replayed with (the
/// busy parts of the annotation's lead and tail follow it as the CPU tasks do).
[[nodiscard]] inline window_result evaluate(const iteration_plan& p, const task_times& t, double cpu = 1.0) {
  window_result r;
  r.window = window_of(p, t, cpu);
  std::vector<interval> compute, comm, waits;
  compute.reserve(p.compute.size());
  comm.reserve(p.comm.size());
  waits.reserve(p.comm.size());
  for (const auto id : p.compute) compute.push_back({t.begin_of(id), t.end_of(id)});
  for (const auto& [a, c] : p.comm) {
    comm.push_back({t.begin_of(a), t.end_of(c)});
    // The transfer is the op's own duration at the end of its occupancy; before it, it waits.
    const time_ns transfer = t.duration_of(c);
    waits.push_back({t.begin_of(a), std::max(t.begin_of(a), t.end_of(c) - transfer)});
  }
  // As compute_breakdown and sm_utilization, without sorting the ops' intervals a second time.
  detail::window_split s = detail::split_window(std::move(compute), std::move(comm), std::move(waits), r.window);
  r.split = s.split;
  r.sm = detail::utilization_of(s.busy, r.window);
  return r;
}

/// What planning reads of one rank's events, taken from them before they may be freed: the
/// rank's ProfilerStep annotations and the operator time on their threads.
struct rank_steps {
  std::vector<trace::profiler_step> steps;  ///< sorted by start (trace::profiler_steps)
  std::vector<std::uint32_t> lane;          ///< per step: its thread (index into rank_trace::lanes)
  /// Per thread that has a step: the union of its operator (cpu_op) intervals, rank-local,
  /// sorted and disjoint; the busy part of a step's lead and tail is its overlap with them.
  std::vector<std::pair<std::uint32_t, std::vector<std::pair<time_ns, time_ns>>>> busy;
  /// The peak of the profiler's GPU memory events (`profile_memory=True`), when recorded: read
  /// with the steps, before a replay frees the events.
  std::optional<trace::memory_peak> memory;

  /// Operator time on thread `lane` within [from, to) of rank-local time.
  [[nodiscard]] time_ns busy_within(std::uint32_t on, time_ns from, time_ns to) const noexcept {
    time_ns total = 0;
    for (const auto& [l, spans] : busy) {
      if (l != on) continue;
      auto it = std::upper_bound(spans.begin(), spans.end(), from, [](time_ns t, const auto& s) { return t < s.second; });
      for (; it != spans.end() && it->first < to; ++it) total += std::min(to, it->second) - std::max(from, it->first);
    }
    return total;
  }
};

/// The steps of rank `r` (see `rank_steps`).
[[nodiscard]] inline rank_steps find_steps(const trace::rank_trace& r) {
  rank_steps out;
  out.steps = trace::profiler_steps(r);
  for (const auto& a : out.steps) {
    const std::uint32_t lane = r.events[a.event].lane;
    out.lane.push_back(lane);
    if (std::none_of(out.busy.begin(), out.busy.end(), [&](const auto& b) { return b.first == lane; })) out.busy.push_back({lane, {}});
  }
  for (auto& [lane, spans] : out.busy) {
    for (const auto& e : r.events) {
      if (e.ph == trace::phase::complete && e.cat == trace::category::cpu_op && e.lane == lane && e.dur > 0) spans.push_back({e.ts, e.end()});
    }
    std::sort(spans.begin(), spans.end());
    std::size_t kept = 0;
    for (const auto& sp : spans) {
      if (kept > 0 && sp.first <= spans[kept - 1].second) {
        spans[kept - 1].second = std::max(spans[kept - 1].second, sp.second);
      } else {
        spans[kept++] = sp;
      }
    }
    spans.resize(kept);
    spans.shrink_to_fit();
  }
  out.memory = trace::measured_memory_peak(r);
  return out;
}

/// The steps of every rank of `job`, in its order (ranks in parallel).
[[nodiscard]] inline std::vector<rank_steps> find_steps(const trace::job& job) {
  std::vector<rank_steps> out(job.ranks.size());
  parallel_for(job.ranks.size(), hardware_threads(), [&](std::size_t i) { out[i] = find_steps(job.ranks[i]); });
  return out;
}

namespace detail {

// The default step of a job: `step` when given, else the largest number present on every rank
// that has steps (none when no rank has any).
[[nodiscard]] inline std::optional<int> common_step(const std::vector<rank_steps>& found, std::optional<int> step) {
  if (step) return step;
  std::optional<int> common;
  for (const rank_steps& f : found) {
    const auto& steps = f.steps;
    if (steps.empty()) continue;
    int best = std::numeric_limits<int>::min();
    for (const auto& s : steps) best = std::max(best, s.number);
    common = common ? std::min(*common, best) : best;
  }
  return common;
}

// The tasks of every rank of a job (joins excluded), split by side, and per GPU op the call
// that launched it (no_task for none).
struct side_tasks {
  std::vector<std::vector<graph::task_id>> cpu, gpu;  // per rank, in the job's order
  std::vector<graph::task_id> launched_by;            // per task
};

[[nodiscard]] inline side_tasks split_tasks(const trace::job& job, const graph::task_graph& g) {
  side_tasks out;
  out.cpu.resize(job.ranks.size());
  out.gpu.resize(job.ranks.size());
  std::vector<int> rank_index_of;  // rank number → index
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    const int rk = job.ranks[i].rank;
    if (rk >= 0) {
      if (static_cast<std::size_t>(rk) >= rank_index_of.size()) rank_index_of.resize(static_cast<std::size_t>(rk) + 1, -1);
      rank_index_of[static_cast<std::size_t>(rk)] = static_cast<int>(i);
    }
  }
  // Counted first, then filled: grown one task at a time, the lists would take up to twice
  // their size at planning's peak.
  auto split_by_side = [&](auto&& take) {
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      const int rk = g.rank[t];
      if (rk < 0 || static_cast<std::size_t>(rk) >= rank_index_of.size() || rank_index_of[static_cast<std::size_t>(rk)] < 0) continue;
      const auto k = g.kind[t];
      if (k == graph::task_kind::join) continue;
      take(static_cast<std::size_t>(rank_index_of[static_cast<std::size_t>(rk)]), k == graph::task_kind::cpu || k == graph::task_kind::cpu_blocking, t);
    }
  };
  // When each GPU op was launched: the observed start of its launching call, kept as the call
  // (4 bytes a task where its start took 8, at planning's peak). Read from the edges while the
  // tasks are split (two passes over the tasks): on a second thread.
  parallel_for(2, g.task_count() >= (std::size_t{1} << 18) ? 2U : 1U, [&](std::size_t part) {
    if (part == 1) {
      out.launched_by.assign(g.task_count(), graph::no_task);
      for (const auto& e : g.edges) {
        if (e.kind == graph::edge_kind::launch) out.launched_by[e.to] = e.from;
      }
      return;
    }
    std::vector<std::pair<std::size_t, std::size_t>> counts(job.ranks.size());
    split_by_side([&](std::size_t i, bool cpu, graph::task_id) { ++(cpu ? counts[i].first : counts[i].second); });
    for (std::size_t i = 0; i < counts.size(); ++i) out.cpu[i].reserve(counts[i].first), out.gpu[i].reserve(counts[i].second);
    split_by_side([&](std::size_t i, bool cpu, graph::task_id t) { (cpu ? out.cpu[i] : out.gpu[i]).push_back(t); });
  });
  return out;
}

// A GPU op's first task: the arrive of a communication op that has one, else the op itself;
// no_task for arrives (they are taken with their op). A communication op's arrive is the task
// right before it on its stream (builders add the pair together; graph rewrites copy it
// together).
[[nodiscard]] inline graph::task_id first_task_of(const graph::task_graph& g, graph::task_id t) {
  const auto k = g.kind[t];
  if (k == graph::task_kind::comm_arrive) return graph::no_task;
  if ((k == graph::task_kind::comm_complete || k == graph::task_kind::gpu_comm) && t > 0 && g.kind[t - 1] == graph::task_kind::comm_arrive &&
      g.processor[t - 1] == g.processor[t] && g.source[t - 1] == g.source[t]) {
    return t - 1;
  }
  return t;
}

// Plans one rank's iteration from its steps and its tasks (`split_tasks`).
class rank_planner {
 public:
  rank_planner(const graph::task_graph& g, const trace::rank_trace& r, const graph::rank_map& map, const rank_steps& f, const side_tasks& sides,
               std::size_t i)
      : g_(g), r_(r), map_(map), f_(f), cpu_(sides.cpu[i]), gpu_(sides.gpu[i]), launched_by_(sides.launched_by) {}

  // `step`: the step asked for (an error when the rank lacks it); `chosen`: the step planned.
  [[nodiscard]] iteration_plan plan(std::optional<int> step, std::optional<int> chosen) const {
    iteration_plan p;
    p.rank = r_.rank;
    const auto& steps = f_.steps;
    if (step && !steps.empty()) {
      const bool present = std::any_of(steps.begin(), steps.end(), [&](const auto& s) { return s.number == *step; });
      if (!present) throw error(r_.file + ": no ProfilerStep#" + std::to_string(*step) + " (the trace has " + steps.front().name + " to " +
                                steps.back().name + ")");
    }
    std::size_t chosen_index = steps.size();
    for (std::size_t k = 0; k < steps.size(); ++k) {
      if (chosen && steps[k].number == *chosen) chosen_index = k;
    }
    const trace::profiler_step* annotation = chosen_index < steps.size() ? &steps[chosen_index] : nullptr;
    p.step = annotation != nullptr ? annotation->name : "trace window";
    step_tasks st;
    if (annotation != nullptr) st = tasks_of(chosen_index);
    p.annotated = annotation != nullptr && st.first_cpu != graph::no_task;
    if (p.annotated) {
      plan_annotated(p, chosen_index, st);
    } else {
      p.cpu = cpu_;
    }
    add_gpu_ops(p, p.annotated ? st.gpu : gpu_);
    // Grown one task at a time, the lists have up to twice the room they need, held until the
    // end of the replay (17 MiB of a 512-rank job's 104).
    p.cpu.shrink_to_fit(), p.gpu.shrink_to_fit(), p.comm.shrink_to_fit(), p.compute.shrink_to_fit();
    return p;
  }

 private:
  static constexpr graph::processor_id no_processor = ~graph::processor_id{0};

  // The tasks of one annotation: CPU tasks inside it (first and last on its own thread) and the
  // GPU ops launched inside it.
  struct step_tasks {
    graph::task_id first_cpu = graph::no_task, last_cpu = graph::no_task;
    std::vector<graph::task_id> cpu, gpu;
  };

  // Operator time on the annotation's thread between two instants (job time): the busy part of
  // a lead or tail, which `cpu=F` scales like every other busy time.
  [[nodiscard]] time_ns busy_on_lane(std::uint32_t lane, time_ns from, time_ns to) const {
    return to > from ? f_.busy_within(lane, from - map_.offset, to - map_.offset) : time_ns{0};
  }

  // The thread of a lane: the processor of the rank's first CPU task on a thread with the lane's
  // (pid, tid); none when the thread has no task. A task a rewrite added there (no event of its
  // own, e.g. the receive a pipeline what-if posts before a rank's first pass) is on the lane too.
  [[nodiscard]] graph::processor_id processor_of_lane(std::uint32_t lane) const {
    const trace::lane& l = r_.lanes.at(lane);
    for (const auto t : cpu_) {
      const graph::processor_info& info = g_.processors[g_.processor[t]];
      if (info.kind == graph::processor_kind::cpu_thread && info.owner == l.pid && info.index == l.tid) return g_.processor[t];
    }
    return no_processor;
  }

  // Widens [first, last] of `st` to CPU task `t`.
  void take_cpu(step_tasks& st, graph::task_id t) const {
    if (st.first_cpu == graph::no_task || g_.observed_start[t] < g_.observed_start[st.first_cpu]) st.first_cpu = t;
    if (st.last_cpu == graph::no_task || g_.observed_end[t] >= g_.observed_end[st.last_cpu]) st.last_cpu = t;
  }

  [[nodiscard]] step_tasks tasks_of(std::size_t k) const {
    const trace::profiler_step& a = f_.steps[k];
    step_tasks st;
    const time_ns a_begin = a.start + map_.offset, a_end = a.start + a.dur + map_.offset;
    const graph::processor_id lane_processor = processor_of_lane(f_.lane[k]);
    for (const auto t : cpu_) {
      if (g_.observed_start[t] < a_begin || g_.observed_end[t] > a_end) continue;
      st.cpu.push_back(t);
      if (lane_processor == no_processor || g_.processor[t] != lane_processor) continue;
      take_cpu(st, t);
    }
    if (st.first_cpu == graph::no_task) {
      // No runtime call on the annotation's thread: use every CPU task inside it.
      for (const auto t : st.cpu) take_cpu(st, t);
    }
    for (const auto t : gpu_) {
      const graph::task_id first = first_task_of(g_, t);
      if (first == graph::no_task) continue;
      const time_ns enqueue = g_.observed_start[launched_by_[first] != graph::no_task ? launched_by_[first] : first];
      if (enqueue < a_begin || enqueue > a_end) continue;
      st.gpu.push_back(t);
    }
    return st;
  }

  // The window of annotation `k`: its CPU tasks, the idle and busy lead and tail around them,
  // and where the step before ends.
  void plan_annotated(iteration_plan& p, std::size_t k, step_tasks& st) const {
    const trace::profiler_step& annotation = f_.steps[k];
    const time_ns a_begin = annotation.start + map_.offset, a_end = annotation.start + annotation.dur + map_.offset;
    const std::uint32_t lane = f_.lane[k];
    p.first_cpu = st.first_cpu;
    p.last_cpu = st.last_cpu;
    p.cpu = std::move(st.cpu);
    p.lead_busy = busy_on_lane(lane, a_begin, g_.observed_start[p.first_cpu]);
    p.lead_idle = g_.observed_start[p.first_cpu] - a_begin - p.lead_busy;
    p.tail_busy = busy_on_lane(lane, g_.observed_end[p.last_cpu], a_end);
    p.tail_idle = a_end - g_.observed_end[p.last_cpu] - p.tail_busy;
    if (k == 0) return;
    const trace::profiler_step& before = f_.steps[k - 1];
    step_tasks prev = tasks_of(k - 1);
    if (prev.last_cpu == graph::no_task) return;
    step_end e;
    e.name = before.name;
    e.last_cpu = prev.last_cpu;
    const time_ns b_end = before.start + before.dur + map_.offset;
    e.tail_busy = busy_on_lane(f_.lane[k - 1], g_.observed_end[prev.last_cpu], b_end);
    e.tail_idle = b_end - g_.observed_end[prev.last_cpu] - e.tail_busy;
    e.gpu = std::move(prev.gpu);
    p.previous = std::move(e);
  }

  // The window's GPU ops: compute ops, and communication ops with their arrives.
  void add_gpu_ops(iteration_plan& p, const std::vector<graph::task_id>& gpu) const {
    for (const auto t : gpu) {
      const graph::task_id first = first_task_of(g_, t);
      if (first == graph::no_task) continue;
      p.gpu.push_back(t);
      if (g_.kind[t] == graph::task_kind::gpu_compute) {
        p.compute.push_back(t);
      } else {
        p.comm.push_back({first, t});
        if (first != t) p.gpu.push_back(first);
      }
    }
  }

  const graph::task_graph& g_;
  const trace::rank_trace& r_;
  const graph::rank_map& map_;
  const rank_steps& f_;
  const std::vector<graph::task_id>& cpu_;
  const std::vector<graph::task_id>& gpu_;
  const std::vector<graph::task_id>& launched_by_;
};

}  // namespace detail

/// Plans every rank's iteration from `steps` (`find_steps(job)`; the job's events are not read,
/// and may be gone): `step` picks ProfilerStep#N (default: the last one every rank has); a rank
/// without ProfilerStep annotations uses its whole trace window.
[[nodiscard]] inline std::vector<iteration_plan> plan_iterations(const trace::job& job, const std::vector<rank_steps>& found,
                                                                 const graph::built_job& b, std::optional<int> step = std::nullopt) {
  const graph::task_graph& g = b.graph;
  if (found.size() != job.ranks.size()) throw error("plan_iterations: steps of " + std::to_string(found.size()) + " ranks for a job of " + std::to_string(job.ranks.size()));
  const std::optional<int> chosen = detail::common_step(found, step);
  const detail::side_tasks sides = detail::split_tasks(job, g);
  // Each rank's plan reads shared data and writes its own slot: in parallel, the same plans (and
  // the error of the first failing rank, as one thread would meet it).
  std::vector<iteration_plan> plans(job.ranks.size());
  parallel_for(job.ranks.size(), hardware_threads(), [&](std::size_t i) {
    plans[i] = detail::rank_planner(g, job.ranks[i], b.ranks[i], found[i], sides, i).plan(step, chosen);
  });
  return plans;
}

/// The same, reading the steps from the job's events (which must be there).
[[nodiscard]] inline std::vector<iteration_plan> plan_iterations(const trace::job& job, const graph::built_job& b,
                                                                 std::optional<int> step = std::nullopt) {
  return plan_iterations(job, find_steps(job), b, step);
}

}  // namespace lumos::report

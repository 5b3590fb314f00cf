#pragma once
// Replays a job and reports, per rank and per job, measured vs simulated iteration time, the
// 4-way breakdown and SM utilisation (what `lumos replay` prints).

#include <lumos/core/allocator.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/profiler_cost.hpp>
#include <lumos/report/held_out.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lumos::report {

struct replay_options {
  std::optional<int> step;       ///< ProfilerStep number; default: the last one every rank has
  graph::scales scales;          ///< what-if multipliers (the replay contract, item 6: docs/replay.md)
  graph::build_options build;
  /// Leave-one-step-out: replay the step with the measured op durations of this other step
  /// (report/held_out.hpp); the simulated iteration then predicts that step.
  std::optional<int> durations_from_step;
  /// Called with a rank's index (in `job.ranks`) once `replay_job` reads none of its events
  /// again: during the build, right after the rank's tasks are added (the steps the iterations
  /// are planned from are taken from the events first, `find_steps`). A caller that does not
  /// need the events afterwards frees them here (`trace::rank_trace::drop_events`): a rank's
  /// graph then replaces its events in memory, instead of the two being held together at the
  /// replay's peak. The maps from events to tasks go too (`build_options::keep_event_maps`).
  std::function<void(std::size_t)> release_events;
  /// Frees the graph's durations and busy gaps as soon as the compiled records hold them
  /// (`graph::compile_releasing`): the measured windows are evaluated before, and
  /// nothing after reads them but another compile, so `replay_session::built.graph` then serves
  /// reports (the critical path, the frozen overheads) but not a second compile or a what-if.
  /// Off by default; `lumos replay` sets it.
  bool release_durations = false;
  /// Frees the graph's observed times and source events (`task_graph::release_observations`)
  /// once the measured windows are evaluated, before the compile. The replay, its breakdowns,
  /// the critical path and the frozen overheads read neither; written traces, the HTML report
  /// and held-out plans made afterwards do. Off by default; `lumos replay` sets it when it
  /// writes neither.
  bool release_observations = false;
  /// Frees the graph's edges once the compiled predecessor lists hold them
  /// (`graph::compile_releasing`). The replay and its breakdowns read those; the critical path,
  /// written traces and the HTML report read the edges. Off by default; `lumos replay` sets it
  /// when it writes none of them.
  bool release_edges = false;
  /// The profiler's host time per recorded event, for the step without the profiler
  /// (`replay_session::unprofiled_ns`, model/profiler_cost.hpp); unset: not estimated (no second
  /// pass of the replay loop).
  std::optional<model::profiler_cost> profiler = model::fitted_profiler_cost;
};

/// One rank's leave-one-step-out result (`replay_options::durations_from_step`).
struct held_out_rank {
  std::string from_step;          ///< the step whose durations were used, and which is predicted
  time_ns measured_ns = 0;        ///< that step's measured iteration
  time_ns predicted_ns = 0;       ///< the replay of the chosen step with its durations
  time_ns same_step_ns = 0;       ///< baseline 1: the chosen step's measured iteration
  time_ns gpu_busy_ratio_ns = 0;  ///< baseline 2: the same, times the ratio of GPU busy time
  substitution tasks;
};

struct rank_replay {
  int rank = 0;
  std::string file;
  std::string step;
  time_ns measured_ns = 0;
  time_ns simulated_ns = 0;
  double error = 0.0;  ///< |simulated − measured| / measured
  /// Estimate of the simulated iteration with the profiler off (model/profiler_cost.hpp);
  /// `simulated_ns` when not estimated.
  time_ns unprofiled_ns = 0;
  window_result measured;
  window_result simulated;
  /// The peak GPU memory the profiler's memory events recorded on the rank (whole trace), if any.
  std::optional<trace::memory_peak> measured_memory;
};

/// Everything one replay produced: the graph, its compiled form, the simulated timeline, the
/// per-rank plans and results. Kept together so that reports (critical path, trace writer)
/// can look at any part.
struct replay_session {
  graph::built_job built;
  graph::compiled_graph compiled;
  sim::record_timeline timeline;
  std::vector<iteration_plan> plans;
  std::vector<rank_replay> ranks;
  time_ns measured_ns = 0;   ///< job: max over ranks
  time_ns simulated_ns = 0;
  double error = 0.0;
  /// Estimate of the job's iteration with the profiler off: the slowest rank's, replayed with the
  /// profiler's host time taken out (`replay_options::profiler`); `simulated_ns` when not estimated.
  time_ns unprofiled_ns = 0;
  time_ns makespan = 0;
  graph::scales scales;      ///< the scales the replay ran with
  std::vector<held_out_rank> held_out;  ///< per rank, with `durations_from_step`

  [[nodiscard]] task_times simulated_times() const { return report::simulated_times(timeline, compiled); }
};

[[nodiscard]] inline double relative_error(time_ns simulated, time_ns measured) {
  return measured > 0 ? std::fabs(static_cast<double>(simulated - measured)) / static_cast<double>(measured) : 0.0;
}

/// Sets each rank's `unprofiled_ns` in `s` (replayed, with its plans evaluated): the replay
/// loop runs once more over the compiled records with `profiler` (by task id, model::profiler_time)
/// taken out, and the records are put back. Without profiler time, the simulated iteration.
/// Costs a pass of the loop, its times (16 bytes a task) and the record of what was changed
/// (about 32 bytes a CPU task with recorded events; `model::remove_profiler_time`).
inline void replay_unprofiled(replay_session& s, const std::vector<std::uint32_t>& profiler, double cpu, unsigned threads) {
  const bool any = std::any_of(profiler.begin(), profiler.end(), [](std::uint32_t c) { return c != 0; });
  if (!any) {
    for (rank_replay& r : s.ranks) r.unprofiled_ns = r.simulated_ns;
    return;
  }
  const model::profiler_undo undo = model::remove_profiler_time(s.compiled, s.built.graph, profiler, cpu);
  sim::replay_engine engine;
  (void)engine.run(s.compiled);
  model::restore_profiler_time(s.compiled, undo);
  const sim::record_timeline timeline = sim::record_timeline::from_interleaved(engine.release_times());
  const task_times times = simulated_times(timeline, s.compiled);
  parallel_for(s.ranks.size(), threads, [&](std::size_t i) {
    s.ranks[i].unprofiled_ns = std::min(s.ranks[i].simulated_ns, window_of(s.plans[i], times, cpu).length());
  });
}

/// Plans, compiles and replays `built`, a graph of `job` (as built, or rewritten by a what-if
/// that kept `built_job::ranks` in step with its tasks), and evaluates every rank's iteration.
/// `steps`: `find_steps(job)`, taken before the build when it frees the events.
[[nodiscard]] inline replay_session replay_built(const trace::job& job, graph::built_job built, const std::vector<rank_steps>& steps,
                                                 const replay_options& options = {}) {
  replay_session s;
  s.scales = options.scales;
  s.built = std::move(built);
  s.plans = plan_iterations(job, steps, s.built, options.step);
  std::vector<iteration_plan> sources;
  if (options.durations_from_step) {
    sources = plan_iterations(job, steps, s.built, options.durations_from_step);
    const task_times measured = observed_times(s.built.graph);
    for (std::size_t i = 0; i < job.ranks.size(); ++i) {
      held_out_rank h;
      h.from_step = sources[i].step;
      h.measured_ns = evaluate(sources[i], measured).window.length();
      h.same_step_ns = evaluate(s.plans[i], measured).window.length();
      const time_ns busy_into = measured_gpu_busy(s.built.graph, s.plans[i]);
      const time_ns busy_from = measured_gpu_busy(s.built.graph, sources[i]);
      h.gpu_busy_ratio_ns = busy_into > 0 ? static_cast<time_ns>(std::llround(static_cast<double>(h.same_step_ns) *
                                                                              static_cast<double>(busy_from) /
                                                                              static_cast<double>(busy_into)))
                                          : h.same_step_ns;
      s.held_out.push_back(std::move(h));
    }
    // Durations change after the measured values above were taken from the observed times.
    for (std::size_t i = 0; i < job.ranks.size(); ++i) s.held_out[i].tasks = substitute_durations(s.built.graph, s.plans[i], sources[i]);
  }
  // Ranks are evaluated independently (each writes its own slot): in parallel, same result.
  // The measured windows first: they read the graph's durations, which may go after compiling.
  s.ranks.resize(job.ranks.size());
  const unsigned threads = hardware_threads(options.build.threads);
  {
    const task_times measured = observed_times(s.built.graph);
    parallel_for(job.ranks.size(), threads, [&](std::size_t i) { s.ranks[i].measured = evaluate(s.plans[i], measured); });
  }
  // The profiler's time per task is found through the tasks' source events, released next.
  const std::vector<std::uint32_t> profiler =
      options.profiler ? model::profiler_time(s.built, *options.profiler) : std::vector<std::uint32_t>{};
  if (options.release_observations) s.built.graph.release_observations();
  // Planning leaves the pages of its per-rank lists in the heap (144 MiB of a 512-rank job),
  // which the compile, allocating from mmap, would not reuse.
  trim_heap();
  s.compiled = graph::compile_releasing(s.built.graph, {.durations = options.release_durations, .edges = options.release_edges}, options.scales);
  {
    // The timeline takes over the engine's times instead of recording a copy of them.
    sim::replay_engine engine;
    s.makespan = engine.run(s.compiled);
    s.timeline = sim::record_timeline::from_interleaved(engine.release_times());
  }
  const task_times simulated = s.simulated_times();
  parallel_for(job.ranks.size(), threads, [&](std::size_t i) {
    rank_replay& r = s.ranks[i];
    r.rank = job.ranks[i].rank;
    r.file = job.ranks[i].file;
    r.step = s.plans[i].step;
    if (i < steps.size()) r.measured_memory = steps[i].memory;
    r.simulated = evaluate(s.plans[i], simulated, options.scales.cpu);
    r.measured_ns = r.measured.window.length();
    r.simulated_ns = r.simulated.window.length();
    r.error = relative_error(r.simulated_ns, r.measured_ns);
  });
  replay_unprofiled(s, profiler, options.scales.cpu, threads);
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    const rank_replay& r = s.ranks[i];
    if (options.durations_from_step) s.held_out[i].predicted_ns = r.simulated_ns;
    s.measured_ns = std::max(s.measured_ns, r.measured_ns);
    s.simulated_ns = std::max(s.simulated_ns, r.simulated_ns);
    s.unprofiled_ns = std::max(s.unprofiled_ns, r.unprofiled_ns);
  }
  s.error = relative_error(s.simulated_ns, s.measured_ns);
  return s;
}

/// Builds, compiles and replays `job` with `options`, and evaluates every rank's iteration.
[[nodiscard]] inline replay_session replay_job(const trace::job& job, const replay_options& options = {}) {
  const std::vector<rank_steps> steps = find_steps(job);
  graph::build_options build = options.build;
  if (options.release_events) build.events_done = options.release_events, build.keep_event_maps = false;
  return replay_built(job, graph::build_graph(job, build), steps, options);
}

}  // namespace lumos::report

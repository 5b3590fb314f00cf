#pragma once
// The figures of a replayed compiled program that `predict` and a sweep both report — the
// iteration time, the pipeline phase and its bubble, rank 0's 4-way breakdown — computed once,
// here.

#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/synth/compiled_program.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lumos::synth {

/// Compute-stream busy time of a stage's representative rank during the pipeline phase, and
/// the end of its last pipeline op.
struct stage_timing {
  time_ns busy = 0;
  time_ns end = 0;
};

/// What `replay_figures` finds.
struct timeline_figures {
  time_ns iteration_ns = 0;  ///< latest finish of any task
  /// End of the last pipeline op of any stage: the pipeline phase runs from 0 to it.
  time_ns pipeline_ns = 0;
  /// 1 − mean over stages of (busy time) / pipeline_ns (prediction::bubble_fraction).
  double bubble_fraction = 0;
  /// Rank 0's 4-way breakdown over [0, end of its last GPU op], communication as transfers
  /// (prediction::breakdown).
  report::breakdown breakdown;
  time_ns breakdown_window_ns = 0;
};

/// Working memory of `replay_figures`, and what it leaves there: `stages` (per stage), rank 0's
/// intervals — `compute` and `transfer` as their unions inside the window, `kernel` (each
/// communication kernel from its participant's arrive to its end) as gathered. Reused between
/// calls without allocating once large enough.
struct figure_buffers {
  std::vector<stage_timing> stages;
  std::vector<report::interval> compute, transfer, kernel, scratch;
  /// What the pass over the watched tasks knows of a processor: the stage it is the compute stream of
  /// (`stage`; past the last stage for others) and that stage's pipeline phase as positions;
  /// whether it is one of rank 0's GPU streams, and there the start of the task before and
  /// whether it was an arrive.
  struct processor_role {
    std::uint32_t first = ~std::uint32_t{0}, last = 0, stage = 0;
    bool rank0 = false, previous_arrive = false;
    time_ns previous_start = 0;
    std::uint32_t lane = 0;  ///< rank 0's streams: its lists in `transfers` and `kernels`
  };
  std::vector<processor_role> role;
  // Rank 0's transfers and kernels stream by stream: each list in time order, so that their
  // union sorts as a few runs (a merge), not as the alternation of streams the positions give.
  std::vector<std::vector<report::interval>> transfers, kernels;
};

/// The figures of `timeline_figures` for `prog` from a timeline of it: `times.start(i)` and
/// `times.finish(i)` of each position and the latest finish `makespan`, with `buffers` as working
/// memory (a pass over the tasks these figures read, `prog.watched`). No allocation once
/// `buffers` is as large as the largest program it has seen.
template <class Timeline>
[[nodiscard]] timeline_figures figures_of(const compiled_program& prog, const Timeline& times, time_ns makespan,
                                          figure_buffers& buffers) {
  figure_buffers& b = buffers;
  const auto stages = static_cast<std::size_t>(prog.shape.stages);
  b.stages.assign(stages + 1, {});  // and one for the tasks of other processors
  b.role.assign(prog.processors.size(), {});
  std::uint32_t lanes = 0;
  for (std::size_t p = 0; p < prog.processors.size(); ++p) {
    b.role[p].stage = static_cast<std::uint32_t>(stages);
    b.role[p].rank0 = prog.processors[p].rank == 0 && prog.processors[p].kind == graph::processor_kind::gpu_stream;
    if (b.role[p].rank0) b.role[p].lane = lanes++;
  }
  // The lists of earlier calls kept for their capacity.
  if (b.transfers.size() < lanes) b.transfers.resize(lanes), b.kernels.resize(lanes);
  for (std::uint32_t l = 0; l < lanes; ++l) b.transfers[l].clear(), b.kernels[l].clear();
  b.compute.clear();
  b.transfer.clear();
  b.kernel.clear();
  // The stages' representative ranks (folded: every simulated rank).
  for (const compiled_rank& r : prog.ranks) {
    if (r.tp_index != 0 || r.dp_index != 0 || r.pipeline_first == no_position || r.pipeline_last == no_position) continue;
    figure_buffers::processor_role& c = b.role[r.compute];
    c.stage = static_cast<std::uint32_t>(r.stage);
    c.first = graph::index(r.pipeline_first);
    c.last = graph::index(r.pipeline_last);
  }
  timeline_figures f;
  f.iteration_ns = makespan;
  for (const auto [i, p, kind] : prog.watched[0]) {
    const figure_buffers::processor_role& r = b.role[p];
    if (i >= r.first && i <= r.last) {
      stage_timing& s = b.stages[r.stage];
      s.busy += times.finish(i) - times.start(i);
      if (i == r.last) s.end = times.finish(i);
    }
  }
  time_ns window_end = 0;
  for (const auto [i, p, k] : prog.watched[1]) {
    figure_buffers::processor_role& r = b.role[p];
    const time_ns start = times.start(i), finish = times.finish(i);
    if (k == graph::task_kind::gpu_compute) {
      if (finish > start) {
        b.compute.push_back({start, finish});
        window_end = std::max(window_end, finish);
      }
    } else if (k == graph::task_kind::gpu_comm || k == graph::task_kind::comm_complete) {
      if (finish > start) b.transfers[r.lane].push_back({start, finish});
      // The kernel as a trace shows it, from the participant's arrive (the task before it on
      // its stream) to its end, bounds the window too.
      report::interval whole{start, finish};
      if (r.previous_arrive) whole.begin = r.previous_start;
      if (whole.end > whole.begin) {
        b.kernels[r.lane].push_back(whole);
        window_end = std::max(window_end, whole.end);
      }
    }
    r.previous_start = start;
    r.previous_arrive = k == graph::task_kind::comm_arrive;
  }
  for (std::uint32_t l = 0; l < lanes; ++l) {
    b.transfer.insert(b.transfer.end(), b.transfers[l].begin(), b.transfers[l].end());
    b.kernel.insert(b.kernel.end(), b.kernels[l].begin(), b.kernels[l].end());
  }
  b.stages.pop_back();
  double busy_sum = 0;
  for (const stage_timing& s : b.stages) {
    f.pipeline_ns = std::max(f.pipeline_ns, s.end);
    busy_sum += static_cast<double>(s.busy);
  }
  if (f.pipeline_ns > 0) {
    f.bubble_fraction = 1.0 - busy_sum / static_cast<double>(prog.shape.stages) / static_cast<double>(f.pipeline_ns);
  }
  f.breakdown_window_ns = window_end;
  f.breakdown = report::compute_breakdown_into(b.compute, b.transfer, report::interval{0, window_end}, b.scratch);
  return f;
}

/// Replays `prog` with `engine` (sim::basic_replay, which keeps every start and finish) and
/// derives the figures of `timeline_figures` from its timeline (figures_of). No allocation once
/// `engine` and `buffers` are as large as the largest program they have seen.
template <class Engine>
[[nodiscard]] timeline_figures replay_figures(const compiled_program& prog, Engine& engine, figure_buffers& buffers) {
  const time_ns makespan = engine.run(prog.graph);
  return figures_of(prog, engine, makespan, buffers);
}

/// The figures of `replay_figures` from the timeline the builder computed as it placed the
/// tasks (compiled_program::times): the same numbers without a replay.
[[nodiscard]] inline timeline_figures emitted_figures(const compiled_program& prog, figure_buffers& buffers) {
  struct emitted {
    const time_ns* times;
    [[nodiscard]] time_ns start(std::uint32_t i) const noexcept { return times[2 * std::size_t{i}]; }
    [[nodiscard]] time_ns finish(std::uint32_t i) const noexcept { return times[2 * std::size_t{i} + 1]; }
  };
  return figures_of(prog, emitted{prog.times.data()}, prog.makespan, buffers);
}

}  // namespace lumos::synth

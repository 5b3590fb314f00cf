#pragma once
// The PyTorch profiler's own cost on the host, and the step without it.
//
// Every Kineto trace is recorded with the profiler on, and the profiler spends host time on every
// event it records: the enter and exit callbacks of each operator range (with its input shapes
// when `record_shapes` is on), the CUPTI callback of each CUDA runtime or driver call, each Python
// frame with `with_stack`. That time sits inside the CPU busy time the trace shows; the GPU work
// is unchanged. Removing it from each CPU task and replaying gives the step with the profiler off:
// shorter where the host bounds the step, about the same where the GPU does.

#include <lumos/core/time.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

namespace lumos::model {

/// Host time the profiler adds per recorded event. With `per_metadata_op` set, every event costs
/// that multiple of the rank's `graph::rank_map::metadata_op` (the median time of an operator that
/// only makes a view: the dispatcher's and the profiler's per-op work on that host), so the cost
/// follows the host the trace was recorded on; a rank with no such measure, or `per_metadata_op`
/// 0, takes the fixed costs by kind (ns), linear in the event counts of `graph::recorded_events`.
struct profiler_cost {
  time_ns per_op = 0;       ///< per `cpu_op` / `user_annotation` range
  time_ns per_runtime = 0;  ///< per `cuda_runtime` / `cuda_driver` call
  time_ns per_python = 0;   ///< per `python_function` frame
  double per_metadata_op = 0;  ///< per event, in multiples of the rank's metadata operator time

  /// The profiler's time around one task with `e` recorded, on a rank whose metadata operators
  /// take `metadata_op` (0: not measured).
  [[nodiscard]] constexpr time_ns of(const graph::recorded_events& e, time_ns metadata_op = 0) const noexcept {
    if (per_metadata_op > 0 && metadata_op > 0) {
      const auto each = static_cast<time_ns>(per_metadata_op * static_cast<double>(metadata_op) + 0.5);
      return each * (static_cast<time_ns>(e.ops) + e.runtime + e.python);
    }
    return per_op * e.ops + per_runtime * e.runtime + per_python * e.python;
  }
  [[nodiscard]] constexpr bool none() const noexcept {
    return per_op == 0 && per_runtime == 0 && per_python == 0 && per_metadata_op == 0;
  }
  friend constexpr bool operator==(const profiler_cost&, const profiler_cost&) = default;
};

/// The shipped parameters, fitted on the H100 runs of tests/data/gpu (the H200 runs held out) by
///     python3 scripts/fit_profiler_cost.py --fit h100
/// `per_metadata_op` is the multiple with the least mean |error| of the step without the
/// profiler on those runs. One cost is shared by every kind of event: in those runs (PyTorch
/// 2.11, `record_shapes` on for 89 % of the ops, no Python stacks) the runtime calls per operator
/// are nearly constant, so the kinds cannot be told apart, and the operator cost includes
/// recording shapes. No recorded run has Python frames: their cost is an assumption (the same
/// per event), not a measurement. The fixed costs (ranks with fewer than
/// `graph::metadata_ops_needed` metadata operators, e.g. CUDA-graph replays) are that multiple of
/// the median of the fitted runs' metadata operator times. The ctest `profiler_cost_fit` checks
/// that these equal the script's output.
inline constexpr profiler_cost fitted_profiler_cost{.per_op = 3415, .per_runtime = 3415, .per_python = 3415, .per_metadata_op = 1.42};

/// Per task of `b.graph` (by task id), the profiler's host time in it under `cost`: the events
/// recorded around the task (`graph::rank_map::recorded`, found by the task's rank and source
/// event, so copies a what-if made of a task carry its cost), at its rank's `metadata_op`. 0 for
/// tasks without a source or recorded events (a model's tasks). Needs the graph's observations (`source`): call it before
/// `task_graph::release_observations`. Saturates at 2^32 - 1 ns a task. O(CPU tasks · log).
[[nodiscard]] inline std::vector<std::uint32_t> profiler_time(const graph::built_job& b, const profiler_cost& cost) {
  const graph::task_graph& g = b.graph;
  std::vector<std::uint32_t> out;
  if (cost.none() || g.observations_released()) return out;
  std::unordered_map<int, const graph::rank_map*> by_rank;
  bool any = false;
  for (const graph::rank_map& r : b.ranks) by_rank.emplace(r.rank, &r), any = any || !r.recorded.empty();
  if (!any) return out;
  out.assign(g.task_count(), 0);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    const graph::task_kind k = g.kind[t];
    if ((k != graph::task_kind::cpu && k != graph::task_kind::cpu_blocking) || g.source[t] == ~0U) continue;
    const auto it = by_rank.find(g.rank[t]);
    if (it == by_rank.end()) continue;
    const graph::recorded_events key{.source = g.source[t], .blocking = k == graph::task_kind::cpu_blocking};
    const auto& rec = it->second->recorded;
    const auto hit = std::lower_bound(rec.begin(), rec.end(), key);
    if (hit == rec.end() || hit->source != key.source || hit->blocking != key.blocking) continue;
    out[t] = static_cast<std::uint32_t>(std::min<time_ns>(cost.of(*hit, it->second->metadata_op), std::numeric_limits<std::uint32_t>::max()));
  }
  return out;
}

/// What `remove_profiler_time` changed, to put back (`restore_profiler_time`): per changed
/// record, in position order, its position, the time taken from its prelude and from its own
/// time, then the start-edge delays it had. About 32 bytes a CPU task with recorded events.
using profiler_undo = std::vector<std::int64_t>;

/// Takes the profiler's time `cost` (by task id, `profiler_time`; times `cpu`, the scale the graph
/// was compiled with) out of the compiled records of `g` in place: from each CPU task's busy
/// prelude first, then from a non-blocking task's own time, never below zero; idle gaps, the
/// tails of blocking calls, latencies and GPU work stay. The start edges of a task carry its
/// prelude (`compiled_graph::task_record`) and lose the same amount. The compiled graph then
/// replays the step without the profiler; the returned record puts it back exactly.
/// O(tasks + edges).
[[nodiscard]] inline profiler_undo remove_profiler_time(graph::compiled_graph& c, const graph::task_graph& g,
                                                        const std::vector<std::uint32_t>& cost, double cpu = 1.0) {
  profiler_undo undo;
  if (cost.empty()) return undo;
  for (std::uint32_t i = 0; i < c.size(); ++i) {
    const graph::task_id t = c.task[i];
    if (cost[t] == 0) continue;
    graph::task_record& rec = c.tasks[i];
    time_ns left = graph::scale_time(cost[t], cpu);
    const time_ns from_prelude = std::clamp<time_ns>(left, 0, std::max<time_ns>(rec.gap - g.idle_gap[t], 0));
    left -= from_prelude;
    const time_ns from_own = g.kind[t] == graph::task_kind::cpu ? std::clamp<time_ns>(left, 0, std::max<time_ns>(rec.duration, 0)) : 0;
    if (from_prelude == 0 && from_own == 0) continue;
    rec.gap -= from_prelude;
    rec.duration -= from_own;
    undo.insert(undo.end(), {static_cast<std::int64_t>(i), from_prelude, from_own});
    const std::uint32_t first_finish = c.pred_end(i) - c.finish_count(i);
    for (std::uint32_t e = c.pred_begin(i); e < first_finish; ++e) {
      undo.push_back(c.preds[e].delay);
      c.preds[e].delay = graph::clamp_delay(static_cast<time_ns>(c.preds[e].delay) - from_prelude);
    }
  }
  return undo;
}

/// Puts back what `remove_profiler_time` took out of `c` (`undo`, its result). O(changed records
/// and their start edges).
inline void restore_profiler_time(graph::compiled_graph& c, const profiler_undo& undo) {
  for (std::size_t k = 0; k + 2 < undo.size();) {
    const auto i = static_cast<std::uint32_t>(undo[k]);
    c.tasks[i].gap += undo[k + 1];
    c.tasks[i].duration += undo[k + 2];
    k += 3;
    const std::uint32_t first_finish = c.pred_end(i) - c.finish_count(i);
    for (std::uint32_t e = c.pred_begin(i); e < first_finish; ++e) c.preds[e].delay = static_cast<std::int32_t>(undo[k++]);
  }
}

}  // namespace lumos::model

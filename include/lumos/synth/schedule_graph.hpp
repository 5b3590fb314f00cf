#pragma once
// A pipeline schedule with free communication as an execution graph, simulated by the replay
// engine: the model-driven path's smallest job, and the check that the engine and the reference
// evaluator of pipeline/timeline.hpp agree.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/schedules.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lumos::synth {

/// A schedule as a task graph: stage r is processor r (a GPU stream of rank r), running one
/// `gpu_compute` task per op in the schedule's order (named like "F3.1"), whose duration is the
/// op's cost; every `pipeline::dependency_of` becomes a `dependency` edge with no delay (free
/// communication). `tasks[r][i]` is the task of `orders[r][i]`.
struct schedule_graph {
  pipeline::schedule_shape shape{};
  bool splits_backward = false;
  std::vector<std::vector<pipeline::op>> orders;
  std::vector<std::vector<graph::task_id>> tasks;
  graph::task_graph graph;
};

namespace detail {

// Position of (kind, chunk, micro-batch) among one stage's ops, micro-batch fastest.
[[nodiscard]] constexpr std::size_t op_slot(const pipeline::schedule_shape& shape, const pipeline::op& o) noexcept {
  return (static_cast<std::size_t>(o.kind) * static_cast<std::size_t>(shape.chunks) + static_cast<std::size_t>(o.chunk)) *
             static_cast<std::size_t>(shape.micro_batches) +
         static_cast<std::size_t>(o.micro_batch);
}

}  // namespace detail

/// Builds the graph of `orders` (one complete order per stage, as `check_stage_order` accepts)
/// with per-op costs `per_op` (already per op: see `pipeline::per_op_costs`). Throws
/// `lumos::error` for orders that are not complete. O(p·m·v).
[[nodiscard]] inline schedule_graph build_schedule_graph(const pipeline::schedule_shape& shape,
                                                         std::vector<std::vector<pipeline::op>> orders,
                                                         const pipeline::op_costs<time_ns>& per_op,
                                                         bool splits_backward) {
  if (orders.size() != static_cast<std::size_t>(shape.stages)) {
    throw error("schedule graph: got orders for " + std::to_string(orders.size()) + " stages, the shape has " +
                std::to_string(shape.stages));
  }
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    pipeline::check_stage_order(shape, s, orders[static_cast<std::size_t>(s)], splits_backward);
  }
  schedule_graph out;
  out.shape = shape;
  out.splits_backward = splits_backward;
  auto& g = out.graph;
  const std::size_t per_stage = static_cast<std::size_t>(3) * static_cast<std::size_t>(shape.micro_batches) *
                                static_cast<std::size_t>(shape.chunks);
  const bool show_chunk = shape.chunks > 1;
  // slot -> task, per stage; filled while adding tasks, read while adding edges.
  std::vector<graph::task_id> by_slot(per_stage * static_cast<std::size_t>(shape.stages), graph::no_task);
  out.tasks.resize(orders.size());
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const graph::processor_id p =
        g.add_processor({graph::processor_kind::gpu_stream, s, s, 7, "stage " + std::to_string(s)});
    out.tasks[su].reserve(orders[su].size());
    for (const pipeline::op& o : orders[su]) {
      const time_ns cost = o.kind == pipeline::op_kind::forward    ? per_op.forward
                           : o.kind == pipeline::op_kind::backward ? per_op.backward
                                                                   : per_op.weight;
      const graph::task_id t =
          g.add_task({.kind = graph::task_kind::gpu_compute, .processor = p, .duration = cost,
                      .name = pipeline::format_op(o, show_chunk), .rank = s});
      out.tasks[su].push_back(t);
      by_slot[su * per_stage + detail::op_slot(shape, o)] = t;
    }
  }
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    const auto su = static_cast<std::size_t>(s);
    for (std::size_t i = 0; i < orders[su].size(); ++i) {
      if (const auto dep = pipeline::dependency_of(shape, s, orders[su][i])) {
        const graph::task_id from =
            by_slot[static_cast<std::size_t>(dep->on.stage) * per_stage + detail::op_slot(shape, dep->on.what)];
        g.add_edge(from, out.tasks[su][i], 0, graph::edge_kind::dependency);
      }
    }
  }
  out.orders = std::move(orders);
  return out;
}

/// The graph of schedule `S` on `shape` with per-stage costs `stage_costs` (one micro-batch
/// through all of a stage's layers; W folded into B for schedules without a split, 1/v per
/// chunk: `pipeline::per_op_costs`). Throws what `S` and `per_op_costs` throw.
template <pipeline::PipelineSchedule S>
[[nodiscard]] schedule_graph build_schedule_graph(const pipeline::schedule_shape& shape,
                                                  const pipeline::op_costs<time_ns>& stage_costs) {
  const pipeline::op_costs<time_ns> per_op = pipeline::per_op_costs<S>(shape, stage_costs);
  return build_schedule_graph(shape, pipeline::all_stage_ops<S>(shape), per_op, S::splits_backward);
}

/// Result of simulating a schedule through the replay engine.
struct schedule_simulation {
  std::vector<std::vector<pipeline::op>> orders;
  /// start[r][i], end[r][i]: interval of orders[r][i].
  std::vector<std::vector<time_ns>> start;
  std::vector<std::vector<time_ns>> end;
  time_ns makespan = 0;
  /// m·(F + B + W) in per-stage costs: the busy time of every stage.
  time_ns stage_work = 0;
  /// (makespan − stage_work) / makespan; 0 for an empty makespan.
  double bubble_fraction = 0.0;
};

/// Compiles and replays `sg` with `sim::replay_engine`; reads each op's interval back.
[[nodiscard]] inline schedule_simulation simulate(const schedule_graph& sg) {
  const graph::compiled_graph c = graph::compile(sg.graph);
  sim::replay_engine engine;
  sim::record_timeline timeline;
  schedule_simulation out;
  out.makespan = engine.run(c, timeline);
  out.orders = sg.orders;
  out.start.resize(sg.tasks.size());
  out.end.resize(sg.tasks.size());
  for (std::size_t s = 0; s < sg.tasks.size(); ++s) {
    for (const graph::task_id t : sg.tasks[s]) {
      out.start[s].push_back(timeline.start_of(c.position_of(t)));
      out.end[s].push_back(timeline.finish_of(c.position_of(t)));
    }
  }
  if (!sg.tasks.empty()) {
    for (const graph::task_id t : sg.tasks.front()) out.stage_work += sg.graph.duration[t];
  }
  if (out.makespan > 0) {
    out.bubble_fraction = static_cast<double>(out.makespan - out.stage_work) / static_cast<double>(out.makespan);
  }
  return out;
}

/// Runtime form: `schedule` on `shape` with integral per-stage costs, simulated by the replay
/// engine. Throws `lumos::error` for shapes the schedule rejects and costs that do not divide by v
/// or are negative.
[[nodiscard]] inline schedule_simulation simulate_schedule(const schedule_policy& schedule, const pipeline::schedule_shape& shape,
                                                           const pipeline::op_costs<time_ns>& stage_costs) {
  schedule.validate(shape);
  const pipeline::op_costs<time_ns> per_op = pipeline::per_op_costs(schedule.title, schedule.splits_backward, shape, stage_costs);
  return simulate(build_schedule_graph(shape, schedule.orders(shape), per_op, schedule.splits_backward));
}

/// Decimal costs (as `--costs` gives them) through the integral engine: each per-stage cost is
/// rounded to 10⁻⁶ and expressed in units of 10⁻⁶/v, so the 1/v split of chunked schedules stays
/// exact. `makespan` is returned in the caller's unit; the bubble fraction is unit-free.
/// Throws `lumos::error` when the total work would not fit in 62 bits.
struct decimal_schedule_simulation {
  std::vector<std::vector<pipeline::op>> orders;
  double makespan = 0.0;
  double stage_work = 0.0;
  double bubble_fraction = 0.0;
};

[[nodiscard]] inline decimal_schedule_simulation simulate_schedule(const schedule_policy& schedule,
                                                                   const pipeline::schedule_shape& shape,
                                                                   const pipeline::op_costs<double>& stage_costs) {
  schedule.validate(shape);
  const double unit = 1e6 * static_cast<double>(shape.chunks);
  const double total = (stage_costs.forward + stage_costs.backward + stage_costs.weight) * unit *
                       static_cast<double>(shape.micro_batches) * static_cast<double>(shape.stages);
  if (!(stage_costs.forward >= 0 && stage_costs.backward >= 0 && stage_costs.weight >= 0)) {
    throw error("pipeline costs must be non-negative numbers");
  }
  if (!(total < 0x1p62)) throw error("pipeline costs: the total work is too large to simulate (scale the costs down)");
  auto scaled = [&](double x) { return static_cast<time_ns>(std::llround(x * 1e6)) * shape.chunks; };
  const pipeline::op_costs<time_ns> c{scaled(stage_costs.forward), scaled(stage_costs.backward), scaled(stage_costs.weight)};
  schedule_simulation r = simulate_schedule(schedule, shape, c);
  decimal_schedule_simulation out;
  out.orders = std::move(r.orders);
  out.makespan = static_cast<double>(r.makespan) / unit;
  out.stage_work = static_cast<double>(r.stage_work) / unit;
  out.bubble_fraction = r.bubble_fraction;
  return out;
}

}  // namespace lumos::synth

#pragma once
// Reference timeline of a pipeline schedule with free communication: every op's start and end,
// the makespan and the bubble fraction. The oracle for the replay engine on pipeline jobs.

#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lumos::pipeline {

/// An op with its simulated interval.
template <class T>
struct timed_op {
  op what{};
  T start{};
  T end{};
};

/// Result of `evaluate_orders` / `evaluate_timeline`.
template <class T>
struct timeline {
  schedule_shape shape{};
  /// `stages[r]` holds stage r's ops in its schedule order, with their intervals.
  std::vector<std::vector<timed_op<T>>> stages;
  /// End of the last op of any stage; the first op starts at 0.
  T makespan{};
  /// Busy time of one stage (all stages have the same): m·(F + B + W) in per-stage costs.
  T stage_work{};
  /// (makespan − stage_work) / makespan, 0 for an empty makespan.
  double bubble_fraction = 0.0;

  [[nodiscard]] constexpr T first_start(std::int32_t stage) const {
    return stages[static_cast<std::size_t>(stage)].front().start;
  }
  [[nodiscard]] constexpr T last_end(std::int32_t stage) const {
    return stages[static_cast<std::size_t>(stage)].back().end;
  }
  /// Time stage `stage` sits idle between its first op's start and its last op's end.
  [[nodiscard]] constexpr T idle_inside(std::int32_t stage) const {
    return last_end(stage) - first_start(stage) - stage_work;
  }
  /// The interval of op `o` on stage `stage`; linear search. Precondition: the stage runs `o`.
  [[nodiscard]] constexpr const timed_op<T>& find(std::int32_t stage, const op& o) const {
    const auto& ops = stages[static_cast<std::size_t>(stage)];
    std::size_t i = 0;
    while (i + 1 < ops.size() && !(ops[i].what == o)) ++i;
    return ops[i];
  }
};

namespace detail {

[[noreturn]] inline void fail_cost(std::string_view what) {
  std::string msg = "pipeline costs: ";
  msg += what;
  throw error(msg);
}

template <class T>
[[noreturn]] void fail_chunk_division(std::string_view title, std::string_view which, T cost,
                                      std::int32_t chunks) {
  std::string msg(title);
  msg += " splits each stage's work into v = ";
  msg += std::to_string(chunks);
  msg += " chunks: the ";
  msg += which;
  msg += " cost ";
  msg += std::to_string(cost);
  msg += " is not a multiple of ";
  msg += std::to_string(chunks);
  msg += "; scale the costs or use a floating-point cost type";
  throw error(msg);
}

[[noreturn]] inline void fail_order_count(std::size_t got, std::int32_t stages) {
  std::string msg = "pipeline timeline: got orders for ";
  msg += std::to_string(got);
  msg += " stages, the shape has ";
  msg += std::to_string(stages);
  throw error(msg);
}

[[noreturn]] inline void fail_timeline_shape(const schedule_shape& shape) {
  std::string msg = "pipeline timeline: bad shape p = ";
  msg += std::to_string(shape.stages);
  msg += ", m = ";
  msg += std::to_string(shape.micro_batches);
  msg += ", v = ";
  msg += std::to_string(shape.chunks);
  msg += " (each must be at least 1, within the limits of schedule.hpp)";
  throw error(msg);
}

[[noreturn]] inline void fail_evaluator_size(std::int64_t slots) {
  std::string msg = "pipeline timeline: ";
  msg += std::to_string(slots);
  msg += " op slots (3*p*m*v) is more than the reference evaluator's limit of 2^28";
  throw error(msg);
}

struct stuck_stage {
  std::int32_t stage;
  op head;
  stage_op waits_for;
};

[[noreturn]] inline void fail_deadlock(const std::vector<stuck_stage>& stuck, bool show_chunk) {
  std::string msg = "pipeline order deadlocks:";
  std::size_t shown = 0;
  for (const stuck_stage& s : stuck) {
    if (shown == 4) {
      msg += "; and ";
      msg += std::to_string(stuck.size() - shown);
      msg += " more stages";
      break;
    }
    msg += shown == 0 ? " stage " : "; stage ";
    msg += std::to_string(s.stage);
    msg += " waits at ";
    append_op_text(msg, s.head, show_chunk);
    msg += " for ";
    append_op_text(msg, s.waits_for.what, show_chunk);
    msg += " on stage ";
    msg += std::to_string(s.waits_for.stage);
    ++shown;
  }
  throw error(msg);
}

template <class T>
constexpr void check_cost(T value, std::string_view name) {
  if constexpr (std::is_floating_point_v<T>) {
    // `!(value >= 0)` also rejects NaN.
    if (!(value >= T{})) fail_cost(std::string(name) + " must be a non-negative number");
    if (value > std::numeric_limits<T>::max()) fail_cost(std::string(name) + " must be finite");
  } else if constexpr (std::is_signed_v<T>) {
    if (value < T{}) fail_cost(std::string(name) + " must be a non-negative number");
  }
}

template <class T>
[[nodiscard]] constexpr T cost_of(const op_costs<T>& costs, op_kind kind) noexcept {
  switch (kind) {
    case op_kind::forward:
      return costs.forward;
    case op_kind::backward:
      return costs.backward;
    case op_kind::weight:
      return costs.weight;
  }
  return T{};
}

}  // namespace detail

/// Turns per-stage costs (one micro-batch through all of a stage's layers) into the cost of one
/// op of a schedule that splits the backward as `splits_backward` (its `S::splits_backward`).
/// Conventions:
///  - schedules that do not split the backward run W inside B: B costs B + W, W costs nothing;
///  - with v chunks a chunk holds 1/v of the stage's layers, so each op costs F/v, B/v, W/v.
///    This is what makes interleaved 1F1B's closed form m(F + B) + (p − 1)(F + B)/v hold.
/// For an integral `T` every cost must divide by v exactly (else `lumos::error` starting with
/// `title`); scale the costs (e.g. to nanoseconds) or use a floating-point `T`. Costs must be
/// non-negative and finite, and B + W must not overflow `T`. Precondition: the schedule accepted
/// `shape`. Constant time.
template <class T>
[[nodiscard]] constexpr op_costs<T> per_op_costs(std::string_view title, bool splits_backward,
                                                 const schedule_shape& shape,
                                                 const op_costs<T>& stage_costs) {
  static_assert(std::is_arithmetic_v<T>, "op costs must be an arithmetic type");
  detail::check_cost(stage_costs.forward, "F");
  detail::check_cost(stage_costs.backward, "B");
  detail::check_cost(stage_costs.weight, "W");
  op_costs<T> folded = stage_costs;
  if (!splits_backward) {
    if constexpr (std::is_integral_v<T>) {
      if (stage_costs.backward > std::numeric_limits<T>::max() - stage_costs.weight) {
        detail::fail_cost("B + W overflows the cost type");
      }
    }
    folded.backward = stage_costs.backward + stage_costs.weight;
    folded.weight = T{};
  }
  const T v = static_cast<T>(shape.chunks);
  if constexpr (std::is_integral_v<T>) {
    if (folded.forward % v != 0)
      detail::fail_chunk_division(title, "forward", folded.forward, shape.chunks);
    if (folded.backward % v != 0)
      detail::fail_chunk_division(title, "backward", folded.backward, shape.chunks);
    if (folded.weight % v != 0)
      detail::fail_chunk_division(title, "weight", folded.weight, shape.chunks);
  }
  return {folded.forward / v, folded.backward / v, folded.weight / v};
}

/// `per_op_costs` for schedule `S`, after `S::validate(shape)`.
template <PipelineSchedule S, class T>
[[nodiscard]] constexpr op_costs<T> per_op_costs(const schedule_shape& shape,
                                                 const op_costs<T>& stage_costs) {
  S::validate(shape);
  return per_op_costs(S::title, S::splits_backward, shape, stage_costs);
}

/// Evaluates arbitrary per-stage orders under the rules of `dependency_of`: each stage runs its
/// ops one at a time in order, an op starts at max(its stage's previous end, its dependency's
/// end), communication is free, and `op_cost` gives the cost of one op of each kind (already
/// per op: see `per_op_costs`). Throws `lumos::error` when `orders` does not have one complete
/// order per stage (see `check_stage_order`), when a cost is negative (or, for an integral `T`,
/// so large that p times a stage's work would overflow `T`), or when the orders
/// deadlock (the message names up to four stuck stages, the op each is at and what it waits
/// for). Deterministic. Time and memory linear in the op count p·m·v·(2 or 3); usable in
/// constant expressions.
template <class T>
[[nodiscard]] constexpr timeline<T> evaluate_orders(const schedule_shape& shape,
                                                    const std::vector<std::vector<op>>& orders,
                                                    const op_costs<T>& op_cost,
                                                    bool splits_backward) {
  static_assert(std::is_arithmetic_v<T>, "op costs must be an arithmetic type");
  if (orders.size() != static_cast<std::size_t>(shape.stages)) {
    detail::fail_order_count(orders.size(), shape.stages);
  }
  if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks < 1 ||
      shape.stages > max_stages ||
      std::int64_t{shape.micro_batches} * shape.chunks > max_virtual_micro_batches) {
    detail::fail_timeline_shape(shape);
  }
  detail::check_cost(op_cost.forward, "F");
  detail::check_cost(op_cost.backward, "B");
  detail::check_cost(op_cost.weight, "W");
  // Both factors are bounded above, so this product cannot overflow.
  const std::int64_t slot_count =
      std::int64_t{3} * shape.stages * (std::int64_t{shape.micro_batches} * shape.chunks);
  if (slot_count > (std::int64_t{1} << 28)) detail::fail_evaluator_size(slot_count);
  if constexpr (std::is_integral_v<T>) {
    // The makespan never exceeds the work of all stages together; keep that representable.
    T largest = op_cost.forward;
    if (op_cost.backward > largest) largest = op_cost.backward;
    if (op_cost.weight > largest) largest = op_cost.weight;
    const auto all_ops = static_cast<std::uint64_t>(ops_per_stage(shape, splits_backward)) *
                         static_cast<std::uint64_t>(shape.stages);
    if (static_cast<std::uint64_t>(largest) >
        static_cast<std::uint64_t>(std::numeric_limits<T>::max()) / all_ops) {
      detail::fail_cost("the total work of the pipeline would overflow the cost type");
    }
  }
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    check_stage_order(shape, s, orders[static_cast<std::size_t>(s)], splits_backward);
  }

  const auto m = static_cast<std::size_t>(shape.micro_batches);
  const auto v = static_cast<std::size_t>(shape.chunks);
  const auto p = static_cast<std::size_t>(shape.stages);
  // One slot per (stage, kind, chunk, micro-batch), micro-batch fastest.
  auto slot = [m, v](std::int32_t stage, const op& o) {
    const std::size_t row = static_cast<std::size_t>(stage) * 3 + static_cast<std::size_t>(o.kind);
    return (row * v + static_cast<std::size_t>(o.chunk)) * m +
           static_cast<std::size_t>(o.micro_batch);
  };

  timeline<T> out;
  out.shape = shape;
  out.stages.resize(p);
  std::vector<T> end_at(static_cast<std::size_t>(slot_count), T{});
  // Bytes, not std::vector<bool>: clang cannot evaluate libstdc++'s bit vector in constexpr.
  std::vector<unsigned char> done(static_cast<std::size_t>(slot_count), 0);
  // Each blocked stage waits on exactly one slot, so the waiters of a slot form an intrusive
  // list threaded through `next_waiter`: no allocation per wait.
  std::vector<std::int32_t> first_waiter(static_cast<std::size_t>(slot_count), -1);
  std::vector<std::int32_t> next_waiter(p, -1);
  std::vector<std::size_t> cursor(p, 0);
  std::vector<T> stage_free(p, T{});
  std::vector<std::int32_t> ready;
  ready.reserve(p);
  for (std::size_t s = p; s-- > 0;) ready.push_back(static_cast<std::int32_t>(s));

  while (!ready.empty()) {
    const std::int32_t s = ready.back();
    ready.pop_back();
    const auto su = static_cast<std::size_t>(s);
    const std::vector<op>& order = orders[su];
    auto& placed = out.stages[su];
    placed.reserve(order.size());
    while (cursor[su] < order.size()) {
      const op o = order[cursor[su]];
      T start = stage_free[su];
      if (const auto dep = dependency_of(shape, s, o)) {
        const std::size_t d = slot(dep->on.stage, dep->on.what);
        if (done[d] == 0) {
          next_waiter[su] = first_waiter[d];
          first_waiter[d] = s;
          break;
        }
        if (end_at[d] > start) start = end_at[d];
      }
      const T end = start + detail::cost_of(op_cost, o.kind);
      placed.push_back({o, start, end});
      const std::size_t here = slot(s, o);
      end_at[here] = end;
      done[here] = 1;
      stage_free[su] = end;
      ++cursor[su];
      for (std::int32_t w = first_waiter[here]; w != -1;) {
        const std::int32_t next = next_waiter[static_cast<std::size_t>(w)];
        ready.push_back(w);
        w = next;
      }
      first_waiter[here] = -1;
    }
  }

  std::vector<detail::stuck_stage> stuck;
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    const auto su = static_cast<std::size_t>(s);
    if (cursor[su] < orders[su].size()) {
      const op head = orders[su][cursor[su]];
      // A stage only stops early on an op whose dependency is not done, so `dep` is set.
      const auto dep = dependency_of(shape, s, head);
      stuck.push_back({s, head, dep ? dep->on : stage_op{s, head}});
    }
  }
  if (!stuck.empty()) detail::fail_deadlock(stuck, shape.chunks > 1);

  for (std::size_t s = 0; s < p; ++s) {
    if (!out.stages[s].empty() && out.stages[s].back().end > out.makespan) {
      out.makespan = out.stages[s].back().end;
    }
  }
  for (const timed_op<T>& t : out.stages.front()) out.stage_work += t.end - t.start;
  if (out.makespan > T{}) {
    out.bubble_fraction =
        static_cast<double>(out.makespan - out.stage_work) / static_cast<double>(out.makespan);
  }
  return out;
}

/// The timeline of schedule `S` on `shape` with per-stage costs `stage_costs` (one micro-batch
/// through all of a stage's layers; see `per_op_costs` for the W-folding and 1/v-per-chunk
/// conventions). `bubble_fraction` is (makespan − m·(F + B + W)) / makespan. Closed forms it
/// reproduces (free communication): GPipe and 1F1B (m + p − 1)(F + B); interleaved 1F1B
/// m(F + B) + (p − 1)(F + B)/v; ZB-H1 and ZB-H2 as documented on their policies. Throws
/// `lumos::error` for shapes `S` rejects and for invalid costs. Linear in p·m·v.
template <PipelineSchedule S, class T>
[[nodiscard]] constexpr timeline<T> evaluate_timeline(const schedule_shape& shape,
                                                      const op_costs<T>& stage_costs) {
  const op_costs<T> per_op = per_op_costs<S>(shape, stage_costs);
  return evaluate_orders(shape, all_stage_ops<S>(shape), per_op, S::splits_backward);
}

}  // namespace lumos::pipeline

#pragma once
// Pipeline-parallel schedules as policy types: the op model, the PipelineSchedule concept, the
// list of shipped schedules, shape validation, the 1F1B skeleton, and compile-time
// materialisation of an order.
//
// Vocabulary used throughout pipeline/:
//   p  stages (pipeline ranks), stage r in [0, p)
//   m  micro-batches per iteration, micro-batch k in [0, m)
//   v  model chunks per stage (interleaved 1F1B), chunk c in [0, v); 1 for every other schedule.
//      Chunk c of stage r is virtual stage c·p + r: the model's layers run stage 0..p-1 for
//      chunk 0, then stage 0..p-1 for chunk 1, and so on.

#include <lumos/core/error.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lumos::pipeline {

/// What an op computes. `backward` is the whole backward pass for schedules that do not split
/// it; zero-bubble schedules split it into `backward` (input gradient, on the critical path)
/// and `weight` (weight gradient, free to move) as in Qi et al., "Zero Bubble Pipeline
/// Parallelism", ICLR 2024.
enum class op_kind : std::uint8_t { forward, backward, weight };

/// 'F', 'B' or 'W'.
[[nodiscard]] constexpr char op_letter(op_kind kind) noexcept {
  switch (kind) {
    case op_kind::forward:
      return 'F';
    case op_kind::backward:
      return 'B';
    case op_kind::weight:
      return 'W';
  }
  return '?';
}

/// One unit of pipeline work on one stage: a pass of `kind` over micro-batch `micro_batch` for
/// model chunk `chunk` (0 unless the schedule interleaves chunks). Plain value, 12 bytes.
struct op {
  op_kind kind = op_kind::forward;
  std::int32_t micro_batch = 0;
  std::int32_t chunk = 0;

  friend constexpr bool operator==(const op&, const op&) = default;
};

[[nodiscard]] constexpr op forward_op(std::int32_t micro_batch, std::int32_t chunk = 0) noexcept {
  return {op_kind::forward, micro_batch, chunk};
}
[[nodiscard]] constexpr op backward_op(std::int32_t micro_batch, std::int32_t chunk = 0) noexcept {
  return {op_kind::backward, micro_batch, chunk};
}
[[nodiscard]] constexpr op weight_op(std::int32_t micro_batch, std::int32_t chunk = 0) noexcept {
  return {op_kind::weight, micro_batch, chunk};
}

/// The size of a pipeline job: p stages, m micro-batches, v model chunks per stage. A structural
/// type, so it can be a template argument (see `static_stage_ops`).
struct schedule_shape {
  std::int32_t stages = 1;         ///< p
  std::int32_t micro_batches = 1;  ///< m
  std::int32_t chunks = 1;         ///< v

  friend constexpr bool operator==(const schedule_shape&, const schedule_shape&) = default;
};

/// Largest accepted p, and largest accepted m·v. Far beyond any real job; they keep every index
/// and op count inside 32 bits, so absurd input is an error instead of an overflow.
inline constexpr std::int32_t max_stages = std::int32_t{1} << 16;
inline constexpr std::int64_t max_virtual_micro_batches = std::int64_t{1} << 24;

/// Costs of one micro-batch's passes. As input to `timeline.hpp` they are per stage (all of a
/// stage's layers); `per_op_costs` turns them into the cost of one op. `weight` is 0 for a
/// backward that is not split, or folded into `backward` by the evaluator.
template <class T = double>
struct op_costs {
  T forward{};
  T backward{};
  T weight{};

  friend constexpr bool operator==(const op_costs&, const op_costs&) = default;
};

/// The schedules lumos ships, one enumerator per policy type of `synth::schedule_types` (their
/// `kind` member). Nothing in the library requires a policy to have one: a user's schedule is a
/// type that models `PipelineSchedule`, named by its own `name`.
enum class schedule_kind : std::uint8_t {
  gpipe,
  one_f_one_b,
  interleaved_one_f_one_b,
  zero_bubble_h1,
  zero_bubble_h2,
};

inline constexpr std::array<schedule_kind, 5> all_schedule_kinds = {
    schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::interleaved_one_f_one_b,
    schedule_kind::zero_bubble_h1, schedule_kind::zero_bubble_h2};

/// A pipeline schedule policy: a type whose static members say which ops each stage runs, and in
/// what order. Any model works wherever a shipped schedule does (`synth::policy_of<S>()` carries
/// it into predict, the sweep and the what-if). A model `S` provides, all usable in constant
/// expressions:
///  - `S::name`, convertible to `std::string_view`: the machine name of reports and JSON ("1f1b";
///    a shipped schedule's is also its command-line name); lower case, no spaces, unique among
///    the schedules a program uses (the what-if and the sweep tell schedules apart by it);
///  - `S::title`, convertible to `std::string_view`: the human name in messages ("1F1B");
///  - `S::splits_backward` (true: the order has W ops and B is the input gradient only) and
///    `S::supports_chunks` (true: v > 1 is meaningful), both `bool` constants;
///  - `S::validate(shape)`, which throws `lumos::error` with a one-line reason when the schedule
///    cannot run `shape` (`validate_shape` makes the checks every schedule needs);
///  - `S::stage_ops(shape, stage)`: the ordered ops stage `stage` runs, as a `std::vector<op>`.
///    It validates first. Every op of every micro-batch and chunk appears exactly once
///    (m·v·2 ops, or m·v·3 when the backward is split: `check_stage_order`), and the orders of
///    all stages together never deadlock under the rules of `dependencies.hpp` (the timeline
///    evaluator and the graph builders report a deadlock as an error). Linear in the op count.
/// `one_f_one_b_skeleton` builds the orders of the 1F1B family. An order for a fixed shape can be
/// computed at compile time: see `static_stage_ops`.
template <class S>
concept PipelineSchedule = requires(const schedule_shape& shape, std::int32_t stage) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::title } -> std::convertible_to<std::string_view>;
  { S::splits_backward } -> std::convertible_to<bool>;
  { S::supports_chunks } -> std::convertible_to<bool>;
  S::validate(shape);
  { S::stage_ops(shape, stage) } -> std::same_as<std::vector<op>>;
  // Constants: graph builders branch on the flags with `if constexpr`, and a runtime descriptor
  // (`synth::schedule_policy`) keeps views of the names for the program's lifetime.
  typename std::bool_constant<S::splits_backward>;
  typename std::bool_constant<S::supports_chunks>;
  typename std::integral_constant<std::size_t, std::string_view(S::name).size()>;
  typename std::integral_constant<std::size_t, std::string_view(S::title).size()>;
};

/// Number of ops every stage runs: m·v·2, or m·v·3 when the backward is split.
/// Precondition: the shape passed `validate_shape`.
[[nodiscard]] constexpr std::size_t ops_per_stage(const schedule_shape& shape,
                                                  bool splits_backward) noexcept {
  return static_cast<std::size_t>(shape.micro_batches) * static_cast<std::size_t>(shape.chunks) *
         (splits_backward ? 3U : 2U);
}

namespace detail {

[[noreturn]] inline void fail_count(std::string_view title, std::string_view needs, char symbol,
                                    std::int64_t value) {
  std::string msg(title);
  msg += " needs ";
  msg += needs;
  msg += " (";
  msg += symbol;
  msg += " = ";
  msg += std::to_string(value);
  msg += ')';
  throw error(msg);
}

[[noreturn]] inline void fail_no_chunks(std::string_view title, std::int32_t chunks) {
  std::string msg(title);
  msg += " has no model chunks: v must be 1 (got v = ";
  msg += std::to_string(chunks);
  msg += "); interleaved 1F1B runs v > 1";
  throw error(msg);
}

[[noreturn]] inline void fail_too_large(std::string_view title, std::string_view what,
                                        std::int64_t value, std::int64_t limit) {
  std::string msg(title);
  msg += ": ";
  msg += std::to_string(value);
  msg += ' ';
  msg += what;
  msg += " is more than the supported ";
  msg += std::to_string(limit);
  throw error(msg);
}

[[noreturn]] inline void fail_stage(std::string_view title, std::int32_t stage, std::int32_t stages) {
  std::string msg(title);
  msg += ": stage ";
  msg += std::to_string(stage);
  msg += " is out of range for ";
  msg += std::to_string(stages);
  msg += stages == 1 ? " stage" : " stages";
  throw error(msg);
}

}  // namespace detail

/// Checks what every schedule needs: p, m, v ≥ 1, within `max_stages` and
/// `max_virtual_micro_batches`, and v == 1 unless the schedule supports chunks. Throws
/// `lumos::error` starting with `title` (the schedule's `S::title`), naming the parameter and its
/// value. Constant time.
constexpr void validate_shape(std::string_view title, const schedule_shape& shape, bool supports_chunks) {
  if (shape.stages < 1) detail::fail_count(title, "at least one stage", 'p', shape.stages);
  if (shape.micro_batches < 1) {
    detail::fail_count(title, "at least one micro-batch", 'm', shape.micro_batches);
  }
  if (shape.chunks < 1) detail::fail_count(title, "at least one model chunk", 'v', shape.chunks);
  if (shape.stages > max_stages) detail::fail_too_large(title, "stages", shape.stages, max_stages);
  const std::int64_t virtual_micro_batches =
      std::int64_t{shape.micro_batches} * std::int64_t{shape.chunks};
  if (virtual_micro_batches > max_virtual_micro_batches) {
    detail::fail_too_large(title, "virtual micro-batches (m*v)", virtual_micro_batches,
                           max_virtual_micro_batches);
  }
  if (!supports_chunks && shape.chunks != 1) detail::fail_no_chunks(title, shape.chunks);
}

/// Throws `lumos::error` starting with `title` unless 0 ≤ stage < p.
constexpr void validate_stage(std::string_view title, const schedule_shape& shape, std::int32_t stage) {
  if (stage < 0 || stage >= shape.stages) detail::fail_stage(title, stage, shape.stages);
}

namespace detail {

/// Appends "F3" (or "F3.1" with `show_chunk`): the one op spelling used by messages and
/// `format.hpp`.
inline void append_op_text(std::string& out, const op& o, bool show_chunk) {
  out += op_letter(o.kind);
  out += std::to_string(o.micro_batch);
  if (show_chunk) {
    out += '.';
    out += std::to_string(o.chunk);
  }
}

[[noreturn]] inline void fail_order(std::int32_t stage, std::string_view what, const op& o) {
  std::string msg = "pipeline order of stage ";
  msg += std::to_string(stage);
  msg += ": ";
  msg += what;
  msg += ' ';
  append_op_text(msg, o, true);
  throw error(msg);
}

[[noreturn]] inline void fail_order_size(std::int32_t stage, std::size_t got, std::size_t want) {
  std::string msg = "pipeline order of stage ";
  msg += std::to_string(stage);
  msg += " has ";
  msg += std::to_string(got);
  msg += " ops; every stage must run ";
  msg += std::to_string(want);
  throw error(msg);
}

}  // namespace detail

/// Megatron's 1F1B skeleton over `count` virtual micro-batches, the order of the 1F1B family:
/// `warmup` forwards, then `count − warmup` steady pairs "forward, backward", then the remaining
/// `warmup` backwards. `forward_at(k)` and `backward_at(k)` (callables `std::int32_t → op`) give
/// the op of the k-th forward and of the k-th backward; the skeleton calls each once per k, in
/// increasing k. GPipe is the `warmup == count` case, 1F1B `warmup = min(p − r − 1, m)` on stage
/// r, interleaved 1F1B Megatron's warm-up over m·v virtual micro-batches. Precondition:
/// 0 ≤ warmup ≤ count. The result has every forward and backward exactly once; whether the
/// stages' orders together are deadlock-free depends on the warm-ups: with k-th ops that run the
/// k-th micro-batch of one chunk, a warm-up that does not grow from a stage to the next (stage
/// r + 1 warms up no more than stage r) keeps them deadlock-free, as every backward then waits
/// only for forwards its successor already ran. Linear in `count`.
template <class ForwardAt, class BackwardAt>
[[nodiscard]] constexpr std::vector<op> one_f_one_b_skeleton(std::int32_t count, std::int32_t warmup,
                                                             ForwardAt forward_at, BackwardAt backward_at) {
  std::vector<op> ops;
  ops.reserve(2 * static_cast<std::size_t>(count));
  for (std::int32_t k = 0; k < warmup; ++k) ops.push_back(forward_at(k));
  for (std::int32_t i = 0; i < count - warmup; ++i) {
    ops.push_back(forward_at(warmup + i));
    ops.push_back(backward_at(i));
  }
  for (std::int32_t k = count - warmup; k < count; ++k) ops.push_back(backward_at(k));
  return ops;
}

/// Checks that `ops` is a complete order for one stage of `shape`: every (kind, micro-batch,
/// chunk) exactly once, W ops iff `splits_backward`, indices in range. Throws `lumos::error`
/// naming the stage and the first offending op. Does not check cross-stage feasibility (the
/// timeline evaluator reports deadlocks). Linear time, one byte per op of the stage.
/// Precondition: `shape` passed `validate_shape`.
constexpr void check_stage_order(const schedule_shape& shape, std::int32_t stage,
                                 const std::vector<op>& ops, bool splits_backward) {
  const std::size_t want = ops_per_stage(shape, splits_backward);
  if (ops.size() != want) detail::fail_order_size(stage, ops.size(), want);
  const auto m = static_cast<std::size_t>(shape.micro_batches);
  const auto v = static_cast<std::size_t>(shape.chunks);
  // Bytes, not std::vector<bool>: clang cannot evaluate libstdc++'s bit vector in constexpr.
  std::vector<unsigned char> seen(want, 0);
  for (const op& o : ops) {
    const bool kind_ok = o.kind == op_kind::forward || o.kind == op_kind::backward ||
                         (o.kind == op_kind::weight && splits_backward);
    if (!kind_ok) detail::fail_order(stage, "has an op of a kind this schedule does not run:", o);
    if (o.micro_batch < 0 || o.micro_batch >= shape.micro_batches || o.chunk < 0 ||
        o.chunk >= shape.chunks) {
      detail::fail_order(stage, "has an op out of range:", o);
    }
    const std::size_t slot =
        (static_cast<std::size_t>(o.kind) * v + static_cast<std::size_t>(o.chunk)) * m +
        static_cast<std::size_t>(o.micro_batch);
    if (seen[slot] != 0) detail::fail_order(stage, "runs an op twice:", o);
    seen[slot] = 1;
  }
}

/// The orders of all p stages, `result[r]` being stage r's. Validates once per stage.
/// Linear in p·m·v.
template <PipelineSchedule S>
[[nodiscard]] constexpr std::vector<std::vector<op>> all_stage_ops(const schedule_shape& shape) {
  S::validate(shape);
  std::vector<std::vector<op>> orders;
  orders.reserve(static_cast<std::size_t>(shape.stages));
  for (std::int32_t stage = 0; stage < shape.stages; ++stage) {
    orders.push_back(S::stage_ops(shape, stage));
  }
  return orders;
}

/// The order of stage `Stage` for `Shape`, computed during compilation and returned as a
/// `std::array` (which, unlike the transient `std::vector`, may outlive constant evaluation).
/// Ill-formed if `S` rejects the shape. Use: `constexpr auto ops = static_stage_ops<gpipe,
/// schedule_shape{4, 8, 1}, 0>();`.
template <PipelineSchedule S, schedule_shape Shape, std::int32_t Stage>
[[nodiscard]] consteval auto static_stage_ops() {
  std::array<op, ops_per_stage(Shape, S::splits_backward)> out{};
  const std::vector<op> ops = S::stage_ops(Shape, Stage);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = ops[i];
  return out;
}

}  // namespace lumos::pipeline

#pragma once
// Zero-bubble schedules ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism",
// ICLR 2024, §3.1 "handcrafted schedules"): the backward is split into B (input gradient) and
// W (weight gradient); W has no cross-stage consumer, so it is moved into the bubbles.

#include <lumos/pipeline/schedule.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace lumos::pipeline {

namespace detail {

/// The shape both handcrafted zero-bubble schedules share: `warmup` forwards; then one
/// steady step per remaining forward, "F(w+i) B(i) [W]" (`forward_first`) or "B(i) [W] F(w+i)",
/// where the W is the oldest pending one and only runs from step `lag` on; then each remaining
/// backward followed by the oldest pending W; then the W's still pending. Deferring W by `lag`
/// steps is what lets B reach the earlier stages sooner.
[[nodiscard]] constexpr std::vector<op> zero_bubble_order(std::int32_t micro_batches,
                                                          std::int32_t warmup, std::int32_t lag,
                                                          bool forward_first) {
  std::vector<op> ops;
  ops.reserve(3 * static_cast<std::size_t>(micro_batches));
  for (std::int32_t k = 0; k < warmup; ++k) ops.push_back(forward_op(k));
  std::int32_t next_weight = 0;
  for (std::int32_t i = 0; i < micro_batches - warmup; ++i) {
    if (forward_first) ops.push_back(forward_op(warmup + i));
    ops.push_back(backward_op(i));
    if (i >= lag) ops.push_back(weight_op(next_weight++));
    if (!forward_first) ops.push_back(forward_op(warmup + i));
  }
  // next_weight ≤ i here: at most m − w W's ran in the steady phase, so B(next_weight) is done.
  for (std::int32_t i = micro_batches - warmup; i < micro_batches; ++i) {
    ops.push_back(backward_op(i));
    ops.push_back(weight_op(next_weight++));
  }
  while (next_weight < micro_batches) ops.push_back(weight_op(next_weight++));
  return ops;
}

}  // namespace detail

/// ZB-H1: the memory-efficient handcrafted zero-bubble schedule. Stage r runs 1F1B's
/// w = min(p − r − 1, m) warm-up forwards, then steady steps "F(w+i) B(i)" where from step i = r
/// on each step also runs W(i − r); then each remaining B followed by the oldest pending W; then
/// the remaining W's. Deferring W by r steps on stage r ("adjusts the starting points of W
/// depending on the number of warm-up micro-batches", §3.1) keeps at most p micro-batches in
/// flight (forward done, W not yet) on every stage: the peak of 1F1B's stage 0.
/// Stage 0 of p = 4, m = 8: F0 F1 F2 F3 B0 W0 F4 B1 W1 … F7 B4 W4 B5 W5 B6 W6 B7 W7.
/// Guarantees: complete and deadlock-free for every p, m ≥ 1. With free communication the
/// makespan is exactly m(F + B + W) + (p − 1)(F + B − W) when W ≤ min(F, B) and either m ≥ p
/// or W = 0 (then it is 1F1B's (m + p − 1)(F + B)); checked exhaustively for p ≤ 7, m < 20,
/// F, B ∈ 1..5, W ∈ 0..5. Otherwise, for p > 1, the evaluator reports a larger makespan. No
/// order at all reaches the formula when W > B (the last stage starts at (p − 1)F and has
/// m(F + B + W) of work) or when m = 1 < p and W > 0 (the chain F→…→F→B→…→B→W alone takes
/// pF + pB + W). Requires v = 1. Linear in m.
struct zero_bubble_h1 final {
  static constexpr schedule_kind kind = schedule_kind::zero_bubble_h1;
  static constexpr std::string_view name = "zb-h1";
  static constexpr std::string_view title = "ZB-H1";
  static constexpr bool splits_backward = true;
  static constexpr bool supports_chunks = false;

  static constexpr void validate(const schedule_shape& shape) {
    validate_shape(title, shape, supports_chunks);
  }

  [[nodiscard]] static constexpr std::int32_t warmup_forwards(const schedule_shape& shape,
                                                              std::int32_t stage) noexcept {
    return std::min(shape.stages - stage - 1, shape.micro_batches);
  }

  /// Steady steps stage `stage` runs before its first W.
  [[nodiscard]] static constexpr std::int32_t weight_lag(const schedule_shape&,
                                                         std::int32_t stage) noexcept {
    return stage;
  }

  [[nodiscard]] static constexpr std::vector<op> stage_ops(const schedule_shape& shape,
                                                           std::int32_t stage) {
    validate(shape);
    validate_stage(title, shape, stage);
    return detail::zero_bubble_order(shape.micro_batches, warmup_forwards(shape, stage),
                                     weight_lag(shape, stage), true);
  }
};

static_assert(PipelineSchedule<zero_bubble_h1>);

/// ZB-H2: the handcrafted zero-bubble schedule that trades memory for a bubble-free pipeline.
/// Stage r runs w = min(2(p − r) − 1, m) warm-up forwards (enough to fill the time until its
/// first B arrives), then steady steps "B(i) [W(i − 2r) from i = 2r on] F(w+i)", then each
/// remaining B followed by the oldest pending W, then the remaining W's. The 2r-step W deferral
/// lets the last micro-batches' B's travel back to stage 0 unhindered while the deferred W's fill
/// the tail (the paper's trapezoid turned parallelogram). At most 2p − 1 micro-batches are in
/// flight (forward done, W not yet) on any stage, the paper's (2p − 1)·M_B.
/// Stage 0 of p = 4, m = 8: F0 … F6 B0 W0 F7 B1 W1 B2 W2 … B7 W7.
/// Guarantees: complete and deadlock-free for every p, m ≥ 1. With free communication and
/// F = B = W = c, if m ≥ 2p − 1: stage r is busy without a gap from r·c to (r + 3m)·c and the
/// job ends at (3m + p − 1)·c (checked for every p ≤ 8, m < 40; for m < 2p − 1 stage 0
/// cannot fill the 2p − 1 slots before its first B arrives, so gaps are unavoidable).
/// Requires v = 1. Linear in m.
struct zero_bubble_h2 final {
  static constexpr schedule_kind kind = schedule_kind::zero_bubble_h2;
  static constexpr std::string_view name = "zb-h2";
  static constexpr std::string_view title = "ZB-H2";
  static constexpr bool splits_backward = true;
  static constexpr bool supports_chunks = false;

  static constexpr void validate(const schedule_shape& shape) {
    validate_shape(title, shape, supports_chunks);
  }

  [[nodiscard]] static constexpr std::int32_t warmup_forwards(const schedule_shape& shape,
                                                              std::int32_t stage) noexcept {
    return std::min(2 * (shape.stages - stage) - 1, shape.micro_batches);
  }

  /// Steady steps stage `stage` runs before its first W.
  [[nodiscard]] static constexpr std::int32_t weight_lag(const schedule_shape&,
                                                         std::int32_t stage) noexcept {
    return 2 * stage;
  }

  [[nodiscard]] static constexpr std::vector<op> stage_ops(const schedule_shape& shape,
                                                           std::int32_t stage) {
    validate(shape);
    validate_stage(title, shape, stage);
    return detail::zero_bubble_order(shape.micro_batches, warmup_forwards(shape, stage),
                                     weight_lag(shape, stage), false);
  }
};

static_assert(PipelineSchedule<zero_bubble_h2>);

}  // namespace lumos::pipeline

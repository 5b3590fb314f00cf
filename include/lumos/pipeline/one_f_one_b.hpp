#pragma once
// 1F1B: Megatron-LM's non-interleaved one-forward-one-backward schedule.

#include <lumos/pipeline/schedule.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace lumos::pipeline {

/// 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
/// Megatron-LM", SC 2021; Megatron-LM `forward_backward_pipelining_without_interleaving`).
/// Stage r runs w = min(p − r − 1, m) warm-up forwards, then m − w pairs "F(w+i) B(i)", then the
/// remaining w backwards. Stage 0 of p = 4, m = 8:
/// F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7.
/// Guarantees: complete and deadlock-free for every p, m ≥ 1 (m < p included); with free
/// communication the makespan is (m + p − 1)(F + B), the same as GPipe, while stage r holds at
/// most min(p − r, m) micro-batches of activations. Requires v = 1. Linear in m.
struct one_f_one_b final {
  static constexpr schedule_kind kind = schedule_kind::one_f_one_b;
  static constexpr std::string_view name = "1f1b";
  static constexpr std::string_view title = "1F1B";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;

  static constexpr void validate(const schedule_shape& shape) {
    validate_shape(title, shape, supports_chunks);
  }

  /// Number of forwards stage `stage` runs before its first backward, minus one.
  [[nodiscard]] static constexpr std::int32_t warmup_forwards(const schedule_shape& shape,
                                                              std::int32_t stage) noexcept {
    return std::min(shape.stages - stage - 1, shape.micro_batches);
  }

  [[nodiscard]] static constexpr std::vector<op> stage_ops(const schedule_shape& shape,
                                                           std::int32_t stage) {
    validate(shape);
    validate_stage(title, shape, stage);
    return one_f_one_b_skeleton(
        shape.micro_batches, warmup_forwards(shape, stage),
        [](std::int32_t k) { return forward_op(k); },
        [](std::int32_t k) { return backward_op(k); });
  }
};

static_assert(PipelineSchedule<one_f_one_b>);

}  // namespace lumos::pipeline

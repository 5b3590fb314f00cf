#pragma once
// GPipe: every forward, then every backward.

#include <lumos/pipeline/schedule.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace lumos::pipeline {

/// GPipe (Huang et al., 2019), as Megatron's "forward-backward without interleaving" with all
/// forwards first: stage r runs F0 F1 … F(m-1) B0 B1 … B(m-1), the same order on every stage.
/// Guarantees: the order is complete and deadlock-free for every p, m ≥ 1; with free
/// communication the makespan is (m + p − 1)(F + B). Peak activation memory is m micro-batches
/// on every stage. Requires v = 1. Linear in m.
struct gpipe final {
  static constexpr schedule_kind kind = schedule_kind::gpipe;
  static constexpr std::string_view name = "gpipe";
  static constexpr std::string_view title = "GPipe";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;

  static constexpr void validate(const schedule_shape& shape) {
    validate_shape(title, shape, supports_chunks);
  }

  [[nodiscard]] static constexpr std::vector<op> stage_ops(const schedule_shape& shape,
                                                           std::int32_t stage) {
    validate(shape);
    validate_stage(title, shape, stage);
    return one_f_one_b_skeleton(
        shape.micro_batches, shape.micro_batches, [](std::int32_t k) { return forward_op(k); },
        [](std::int32_t k) { return backward_op(k); });
  }
};

static_assert(PipelineSchedule<gpipe>);

}  // namespace lumos::pipeline

#pragma once
// Interleaved 1F1B: Megatron-LM's schedule with v model chunks (virtual stages) per stage.

#include <lumos/pipeline/schedule.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <string>
#include <vector>

namespace lumos::pipeline {

namespace detail {

[[noreturn]] inline void fail_interleaved_divisibility(std::int32_t micro_batches,
                                                       std::int32_t stages) {
  std::string msg = "interleaved 1F1B needs the number of micro-batches (";
  msg += std::to_string(micro_batches);
  msg += ") to be a multiple of the number of stages (";
  msg += std::to_string(stages);
  msg += ')';
  throw error(msg);
}

}  // namespace detail

/// Interleaved 1F1B (Narayanan et al., SC 2021, §2.2.2), reproducing Megatron-LM's
/// `forward_backward_pipelining_with_interleaving` (megatron/core/pipeline_parallel/schedules.py)
/// for training, op for op. Each stage holds v ≥ 2 model chunks; stage r's chunk c is virtual
/// stage c·p + r. A stage walks m·v virtual micro-batches k:
///  - forward k runs chunk (k mod p·v) / p on micro-batch (k / (p·v))·p + k mod p;
///  - backward k runs the same micro-batch on chunk v − 1 − (k mod p·v) / p;
///  - warm-up w = min(2(p − r − 1) + (v − 1)·p, m·v) forwards, except that when m == p Megatron
///    runs every forward first (w = m·v, `all_warmup_microbatches`); then m·v − w pairs
///    "F(w+i) B(i)", then the remaining backwards.
/// Preconditions (checked, `lumos::error`): v ≥ 2 and m a multiple of p (Megatron raises the
/// same). Guarantees: complete and deadlock-free; with free communication and per-chunk costs
/// F/v, B/v the makespan is m(F + B) + (p − 1)(F + B)/v (verified for F ≠ B too). Linear in m·v.
struct interleaved_one_f_one_b final {
  static constexpr schedule_kind kind = schedule_kind::interleaved_one_f_one_b;
  static constexpr std::string_view name = "interleaved-1f1b";
  static constexpr std::string_view title = "interleaved 1F1B";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = true;

  static constexpr void validate(const schedule_shape& shape) {
    validate_shape(title, shape, supports_chunks);
    if (shape.chunks < 2) {
      detail::fail_count(title, "at least 2 model chunks per stage", 'v', shape.chunks);
    }
    if (shape.micro_batches % shape.stages != 0) {
      detail::fail_interleaved_divisibility(shape.micro_batches, shape.stages);
    }
  }

  /// The op of the k-th forward of any stage (0 ≤ k < m·v).
  [[nodiscard]] static constexpr op forward_at(const schedule_shape& shape,
                                               std::int32_t k) noexcept {
    const std::int32_t group = shape.stages * shape.chunks;
    const std::int32_t in_group = k % group;
    return forward_op((k / group) * shape.stages + k % shape.stages, in_group / shape.stages);
  }

  /// The op of the k-th backward of any stage (0 ≤ k < m·v): chunks run in reverse.
  [[nodiscard]] static constexpr op backward_at(const schedule_shape& shape,
                                                std::int32_t k) noexcept {
    const op f = forward_at(shape, k);
    return backward_op(f.micro_batch, shape.chunks - 1 - f.chunk);
  }

  /// Forwards stage `stage` runs before its first backward, minus one (Megatron's
  /// `num_warmup_microbatches`).
  [[nodiscard]] static constexpr std::int32_t warmup_forwards(const schedule_shape& shape,
                                                              std::int32_t stage) noexcept {
    const std::int32_t total = shape.micro_batches * shape.chunks;
    if (shape.micro_batches == shape.stages) return total;
    return std::min(2 * (shape.stages - stage - 1) + (shape.chunks - 1) * shape.stages, total);
  }

  [[nodiscard]] static constexpr std::vector<op> stage_ops(const schedule_shape& shape,
                                                           std::int32_t stage) {
    validate(shape);
    validate_stage(title, shape, stage);
    return one_f_one_b_skeleton(
        shape.micro_batches * shape.chunks, warmup_forwards(shape, stage),
        [&shape](std::int32_t k) { return forward_at(shape, k); },
        [&shape](std::int32_t k) { return backward_at(shape, k); });
  }
};

static_assert(PipelineSchedule<interleaved_one_f_one_b>);

}  // namespace lumos::pipeline

#pragma once
// Cross-op dependency rules of pipeline schedules: which op, on which stage, an op waits for.
// Shared by the reference timeline evaluator and the execution-graph builder.

#include <lumos/pipeline/schedule.hpp>

#include <cstdint>
#include <optional>

namespace lumos::pipeline {

/// An op placed on a stage.
struct stage_op {
  std::int32_t stage = 0;
  op what{};

  friend constexpr bool operator==(const stage_op&, const stage_op&) = default;
};

/// Why an op waits: what the graph builder has to carry from the producer to the consumer.
enum class dependency_kind : std::uint8_t {
  activation,  ///< F waits for the previous virtual stage's F output (a p2p send when stages
               ///< differ)
  gradient,    ///< B waits for the next virtual stage's input gradient (a p2p send when stages
               ///< differ)
  loss,        ///< B of the last virtual stage waits for its own F (the loss); same stage
  weight,      ///< W waits for B of the same micro-batch and chunk; same stage
};

/// The single op another op waits for, besides its predecessor in its own stage's order.
struct dependency {
  stage_op on{};
  dependency_kind kind = dependency_kind::activation;

  /// True when producer and consumer are different stages, i.e. data crosses a stage boundary.
  [[nodiscard]] constexpr bool crosses_stages(std::int32_t consumer_stage) const noexcept {
    return on.stage != consumer_stage;
  }

  friend constexpr bool operator==(const dependency&, const dependency&) = default;
};

/// The dependency of op `o` on stage `stage` under the pipeline rules (micro-batch k, chunk c;
/// virtual stage c·p + s):
///  - F(k, c) on s waits for F(k, c) on s − 1; on s = 0 with c > 0, for F(k, c − 1) on p − 1;
///    F(k, 0) on stage 0 waits for nothing (returns `std::nullopt`);
///  - B(k, c) on s waits for B(k, c) on s + 1; on s = p − 1 with c < v − 1, for B(k, c + 1) on
///    stage 0; on the last virtual stage (s = p − 1, c = v − 1), for F(k, v − 1) on itself;
///  - W(k, c) waits for B(k, c) on the same stage.
/// Every op has at most one such dependency; the other constraint is that a stage runs its ops
/// one at a time in its schedule's order. Communication is not modelled here: a consumer may
/// start when its producer ends ("free communication"); the graph builder inserts transfers on
/// edges that `crosses_stages`. Constant time.
/// Preconditions (unchecked): 0 ≤ stage < p, 0 ≤ o.micro_batch < m, 0 ≤ o.chunk < v.
[[nodiscard]] constexpr std::optional<dependency> dependency_of(const schedule_shape& shape,
                                                                std::int32_t stage,
                                                                const op& o) noexcept {
  const std::int32_t last_stage = shape.stages - 1;
  switch (o.kind) {
    case op_kind::forward:
      if (stage > 0) {
        return dependency{{stage - 1, o}, dependency_kind::activation};
      }
      if (o.chunk > 0) {
        return dependency{{last_stage, forward_op(o.micro_batch, o.chunk - 1)},
                          dependency_kind::activation};
      }
      return std::nullopt;
    case op_kind::backward:
      if (stage < last_stage) {
        return dependency{{stage + 1, o}, dependency_kind::gradient};
      }
      if (o.chunk < shape.chunks - 1) {
        return dependency{{0, backward_op(o.micro_batch, o.chunk + 1)}, dependency_kind::gradient};
      }
      return dependency{{stage, forward_op(o.micro_batch, o.chunk)}, dependency_kind::loss};
    case op_kind::weight:
      return dependency{{stage, backward_op(o.micro_batch, o.chunk)}, dependency_kind::weight};
  }
  return std::nullopt;
}

}  // namespace lumos::pipeline

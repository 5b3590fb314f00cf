#pragma once
// Where a change from TP 1 inserts Megatron's tensor-parallel collectives: found by the shape
// rewrite (shape.hpp), inserted by the tensor-parallel one (tensor_parallel.hpp).

#include <lumos/graph/task_graph.hpp>

#include <cstddef>
#include <cstdint>

namespace lumos::whatif {

/// What a tensor-parallel collective inserted by a change from TP 1 does.
enum class tp_message : std::uint8_t {
  activation, ///< all-reduce of tokens x hidden in the activation dtype
  loss_max,   ///< all-reduce (max) of the tokens in fp32: the vocabulary-parallel cross-entropy's logit maximum
  loss_sum,   ///< all-reduce of the tokens in fp32: its target logit, then its sum of exponentials
  gather,     ///< sequence parallelism: all-gather of tokens x hidden (each rank holds 1/TP of the tokens)
  scatter,    ///< sequence parallelism: reduce-scatter of tokens x hidden
};
inline constexpr std::size_t tp_message_count = 5;

/// A tensor-parallel collective to insert after GPU task `after`. Without sequence parallelism
/// Megatron runs an all-reduce of the activation after the row-parallel attention output and
/// FC2 forward (also when recomputed), the column-parallel QKV and FC1 input gradients, the
/// vocabulary-parallel embedding lookup and the logits' input gradient; and three fp32 ones over
/// the tokens in the vocabulary-parallel cross-entropy, which follows the logits GEMM (max,
/// target logit, sum of exponentials). With it, each all-reduce of the activation becomes a
/// reduce-scatter, and an all-gather precedes each column-parallel GEMM forward (QKV, FC1, the
/// logits), each row-parallel input gradient (FC2, attention output), the weight gradients of
/// the column-parallel GEMMs (their input, gathered again) and the embedding's backward.
struct tp_hook {
  graph::task_id after = graph::no_task;
  tp_message message = tp_message::activation;
};

}  // namespace lumos::whatif

#pragma once
// Peak memory of a PyTorch eager training step on one GPU: the tensors the caching allocator
// holds at the two moments one of which sets `torch.cuda.max_memory_allocated()`, the start of
// the backward pass and the optimizer step.

#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <cstdint>

namespace lumos::model {

/// What a PyTorch eager step keeps, in bytes per element, as its trace shows it (see
/// whatif/structure/memory_recipe.hpp). The defaults are a module in fp32 trained under
/// `torch.autocast(dtype=torch.bfloat16)` with `torch.optim.AdamW` (foreach implementation) and
/// the loss taken on fp32 logits (`logits.float()`), the common recipe of plain PyTorch training.
struct eager_recipe {
  double param = 4;       ///< the module's parameters
  double grad = 4;        ///< `.grad`, in the parameters' dtype
  double optimizer = 8;   ///< Adam's two moments, in the parameters' dtype
  /// Full-size temporaries of the optimizer step: the foreach implementation of Adam/AdamW
  /// materialises sqrt(v) for every parameter at once (`torch._foreach_sqrt`); the fused and the
  /// per-parameter implementations keep none of that size.
  double optimizer_temp = 4;
  double residual = 4;    ///< the residual stream and the norms' inputs (fp32 under autocast)
  double gemm = 2;        ///< GEMM inputs and outputs (the autocast dtype)
  double loss = 4;        ///< the logits the loss reads
  /// Autocast casts each GEMM weight to `gemm` in the forward pass and the GEMM keeps the copy for
  /// its backward: a second copy of the GEMM weights lives from the forward to the backward.
  bool weight_copies = true;
};

/// The two candidate peaks of `eager_memory_per_gpu`, in bytes.
struct eager_memory {
  /// Start of the backward pass: parameters, optimizer moments, autocast's weight copies, every
  /// layer's saved activations, the loss's fp32 logits and their first two gradients, and the
  /// gradients already accumulated when the step runs several micro-batches.
  double backward_peak = 0;
  /// Inside the optimizer step: parameters, gradients, moments and the step's temporaries.
  double optimizer_peak = 0;
  double parameters = 0, gradients = 0, optimizer_states = 0, activations = 0, weight_copies = 0, loss = 0;

  [[nodiscard]] constexpr double total() const noexcept { return std::max(backward_peak, optimizer_peak); }
};

/// Bytes one transformer layer of `m` saves for its backward pass in PyTorch eager, per
/// micro-batch of `micro_batch` sequences (FlashAttention through SDPA: no s x s matrices):
/// the two norms' inputs (residual dtype), their outputs cast for the QKV and first MLP GEMMs,
/// Q, K and V, the attention output and its copy back to (b, s, h) for the output projection,
/// the MLP's saved tensors (GELU: the first GEMM's output and the activation; gated: gate, up and
/// the activation), and dropout masks (one byte per element) where the model has dropout.
[[nodiscard]] constexpr double eager_layer_activation_bytes(const transformer& m, std::int64_t micro_batch,
                                                            const eager_recipe& r) noexcept {
  const double sb = static_cast<double>(m.seq) * static_cast<double>(micro_batch);
  const double h = static_cast<double>(m.hidden), q = static_cast<double>(m.q_width()),
               kv = static_cast<double>(m.kv_width()), f = static_cast<double>(m.ffn);
  const double norms = 2.0 * r.residual * sb * h + 2.0 * r.gemm * sb * h;
  const double attention = r.gemm * sb * (q + 2.0 * kv) + 2.0 * r.gemm * sb * q;
  const double mlp = (m.mlp == mlp_kind::gelu ? 2.0 : 3.0) * r.gemm * sb * f;
  const double masks = m.dropout ? 2.0 * sb * h : 0.0;
  return norms + attention + mlp + masks;
}

/// Peak memory of one training step of `m` in PyTorch eager on one GPU (no model parallelism),
/// `micro_batches` micro-batches of `micro_batch` sequences accumulated per step; `parameters`
/// is the module's parameter count (the trace's model, embeddings included). The larger of the
/// backward and optimizer peaks; the caching allocator's rounding, library workspaces and the
/// CUDA context are not counted (`max_memory_allocated` does not count the last two either).
[[nodiscard]] constexpr eager_memory eager_memory_per_gpu(const transformer& m, double parameters, std::int64_t micro_batch,
                                                          std::int64_t micro_batches, const eager_recipe& r) noexcept {
  eager_memory e;
  const double sb = static_cast<double>(m.seq) * static_cast<double>(micro_batch);
  const double h = static_cast<double>(m.hidden), v = static_cast<double>(m.vocab);
  e.parameters = r.param * parameters;
  e.gradients = r.grad * parameters;
  e.optimizer_states = r.optimizer * parameters;
  e.activations = static_cast<double>(m.layers) * eager_layer_activation_bytes(m, micro_batch, r);
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width()), f = static_cast<double>(m.ffn);
  const double layer_gemm_weights = h * (q + 2.0 * kv) + q * h + (m.mlp == mlp_kind::gelu ? 2.0 : 3.0) * h * f;
  const double gemm_weights = static_cast<double>(m.layers) * layer_gemm_weights + v * h;
  e.weight_copies = r.weight_copies && r.gemm < r.param ? r.gemm * gemm_weights : 0.0;
  // The final norm's input and its cast for the logits GEMM; the log-softmax output the loss
  // keeps, and in the backward its gradient and the gradient of its input.
  e.loss = (r.residual + r.gemm) * sb * h + 3.0 * r.loss * sb * v;
  const double accumulated = micro_batches > 1 ? e.gradients : 0.0;
  e.backward_peak = e.parameters + e.optimizer_states + e.weight_copies + e.activations + e.loss + accumulated;
  e.optimizer_peak = e.parameters + e.gradients + e.optimizer_states + r.optimizer_temp * parameters;
  return e;
}

}  // namespace lumos::model

#pragma once
// Parameter counts, model/hardware FLOPs per iteration, throughput, MFU and HFU.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <cstdint>
#include <string>

namespace lumos::model {

// ---------------------------------------------------------------------------------------------
// Parameter counts
// ---------------------------------------------------------------------------------------------

/// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
/// Megatron-LM", the count behind their Table 1) for GPT models:
///   P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) = 12 l h^2 + 13 l h + (V + s) h.
/// Uses only l, h, V, s (it assumes ffn = 4h, multi-head attention, biases, LayerNorm, learned
/// positions, tied embeddings) and leaves out the final LayerNorm (2h). Exact integer, O(1).
[[nodiscard]] constexpr std::int64_t gpt_parameter_count(const transformer& m) noexcept {
  const std::int64_t l = m.layers, h = m.hidden;
  return 12 * l * h * h + 13 * l * h + (m.vocab + m.seq) * h;
}

/// Parameters of one model, by part. Every field is a count of parameters.
struct parameter_breakdown {
  std::int64_t per_layer = 0;       ///< one transformer layer (weights, biases, both norms)
  std::int64_t layers = 0;          ///< all transformer layers
  std::int64_t word_embedding = 0;  ///< V * h
  std::int64_t position_embedding = 0;  ///< s * h for learned positions, else 0
  std::int64_t final_norm = 0;
  std::int64_t output = 0;  ///< separate logits matrix (V * h) when embeddings are untied

  [[nodiscard]] constexpr std::int64_t total() const noexcept {
    return layers + word_embedding + position_embedding + final_norm + output;
  }
};

/// Parameters of one norm layer: LayerNorm has scale and shift, RMSNorm scale only.
[[nodiscard]] constexpr std::int64_t norm_parameter_count(const transformer& m) noexcept {
  return m.norm == norm_kind::layernorm ? 2 * m.hidden : m.hidden;
}

/// Weights of the GEMMs of one layer (no biases, no norms): the `N` of the "6 N" rule.
[[nodiscard]] constexpr std::int64_t layer_matmul_weights(const transformer& m) noexcept {
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  const std::int64_t attn = h * (q + 2 * kv) + q * h;
  const std::int64_t mlp = (m.mlp == mlp_kind::gelu ? 2 : 3) * h * m.ffn;
  return attn + mlp;
}

/// General count for GELU/SwiGLU, MHA/GQA, LayerNorm/RMSNorm, learned/rotary, tied/untied
/// models. For GPT presets, total() == gpt_parameter_count + 2h (the final LayerNorm).
[[nodiscard]] constexpr parameter_breakdown parameter_counts(const transformer& m) noexcept {
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  std::int64_t layer = layer_matmul_weights(m) + 2 * norm_parameter_count(m);
  if (m.linear_bias) {
    layer += (q + 2 * kv) + h;  // QKV and output-projection biases
    layer += (m.mlp == mlp_kind::gelu ? m.ffn : 2 * m.ffn) + h;  // MLP biases
  }
  parameter_breakdown p;
  p.per_layer = layer;
  p.layers = m.layers * layer;
  p.word_embedding = m.vocab * h;
  p.position_embedding = m.position == position_kind::learned ? m.seq * h : 0;
  p.final_norm = norm_parameter_count(m);
  p.output = m.tied_embeddings ? 0 : m.vocab * h;
  return p;
}

/// Total distinct parameters of the model.
[[nodiscard]] constexpr std::int64_t parameter_count(const transformer& m) noexcept {
  return parameter_counts(m).total();
}

/// Parameters of one layer held by one tensor-parallel rank: GEMM weights and their
/// column-sharded biases are split `tp` ways; norms and the biases of row-parallel GEMMs
/// (output projection, last MLP GEMM) are replicated, as in Megatron. Precondition: the
/// configuration validates (tp divides heads, kv_heads, ffn).
[[nodiscard]] constexpr std::int64_t layer_parameters_per_rank(const transformer& m,
                                                               int tp) noexcept {
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  std::int64_t sharded = layer_matmul_weights(m);
  std::int64_t replicated = 2 * norm_parameter_count(m);
  if (m.linear_bias) {
    sharded += (q + 2 * kv) + (m.mlp == mlp_kind::gelu ? m.ffn : 2 * m.ffn);
    replicated += 2 * h;
  }
  return sharded / tp + replicated;
}

/// Parameters held by one GPU of pipeline stage `stage` (all its virtual chunks), before any
/// ZeRO sharding. Stage 0 adds the vocabulary-sharded word embedding and the (replicated)
/// learned positions; the last stage adds the final norm and the logits matrix — for tied
/// embeddings with pp > 1 Megatron keeps a second copy of the word embedding there and
/// all-reduces its gradient with stage 0. Throws `lumos::error` for a stage out of range.
[[nodiscard]] inline std::int64_t stage_parameters_per_rank(const transformer& m,
                                                            const parallel_config& par,
                                                            int stage) {
  if (stage < 0 || stage >= par.pp) {
    throw error("pipeline stage " + std::to_string(stage) + " out of range [0, " +
                std::to_string(par.pp) + ")");
  }
  std::int64_t n = par.layers_per_stage(m) * layer_parameters_per_rank(m, par.tp);
  if (stage == 0) {
    n += m.vocab * m.hidden / par.tp;
    if (m.position == position_kind::learned) n += m.seq * m.hidden;
  }
  if (stage == par.pp - 1) {
    n += norm_parameter_count(m);
    if (!m.tied_embeddings || par.pp > 1) n += m.vocab * m.hidden / par.tp;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// FLOPs per iteration
// ---------------------------------------------------------------------------------------------
// Convention (Narayanan et al. 2021, as for their Table 1; also PaLM's MFU): only matrix
// multiplications count, 2 FLOPs per multiply-add; backward = 2x forward; attention scores and
// their product with V count in full (no discount for causal masking); norms, softmax,
// elementwise work and the optimizer are not counted. "Model FLOPs" are those of one
// forward+backward pass of the global batch; "hardware FLOPs" add forward work re-executed by
// activation recomputation. Kernel-internal recomputation (FlashAttention's backward
// recomputing scores) is not counted in either, as is customary.

/// Megatron's model FLOPs per iteration, B = global batch in sequences:
///   F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) = 72 B s l h^2 + 12 B s^2 l h + 6 B s V h.
/// Exact for GPT shapes (ffn = 4h, MHA); see `model_flops` for the general count.
[[nodiscard]] constexpr double megatron_model_flops(const transformer& m,
                                                    std::int64_t global_batch) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq),
               l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden),
               V = static_cast<double>(m.vocab);
  return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

/// Megatron's hardware FLOPs with full recomputation (one extra forward of every layer, not of
/// the logits): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
[[nodiscard]] constexpr double megatron_full_recompute_flops(const transformer& m,
                                                             std::int64_t global_batch) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq),
               l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden),
               V = static_cast<double>(m.vocab);
  return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

/// Forward FLOPs of one layer for one sequence of length s (GEMMs + attention):
/// 2 s N_layer + 4 s^2 q_width.
[[nodiscard]] constexpr double layer_forward_flops_per_sequence(const transformer& m) noexcept {
  const double s = static_cast<double>(m.seq);
  return 2.0 * s * static_cast<double>(layer_matmul_weights(m)) +
         4.0 * s * s * static_cast<double>(m.q_width());
}

/// Model FLOPs per iteration for any preset shape (GQA, SwiGLU):
///   F = 3 B [ l (2 s N_layer + 4 s^2 q_width) + 2 s V h ].
/// Equals `megatron_model_flops` for GPT shapes.
[[nodiscard]] constexpr double model_flops(const transformer& m,
                                           std::int64_t global_batch) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq);
  const double logits = 2.0 * s * static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
  return 3.0 * B *
         (static_cast<double>(m.layers) * layer_forward_flops_per_sequence(m) + logits);
}

/// Hardware FLOPs per iteration: model FLOPs plus re-executed forward work. Selective
/// recomputation reruns the attention core (4 B s^2 l q_width); full recomputation reruns
/// every layer's forward (not the logits), which gives Megatron's 96 coefficient for GPT.
[[nodiscard]] constexpr double hardware_flops(const transformer& m, std::int64_t global_batch,
                                              recompute_kind r) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq),
               l = static_cast<double>(m.layers);
  const double base = model_flops(m, global_batch);
  switch (r) {
    case recompute_kind::none: return base;
    case recompute_kind::selective:
      return base + 4.0 * B * s * s * l * static_cast<double>(m.q_width());
    case recompute_kind::full: return base + B * l * layer_forward_flops_per_sequence(m);
  }
  return base;
}

// ---------------------------------------------------------------------------------------------
// Throughput and utilisation
// ---------------------------------------------------------------------------------------------

namespace detail {
inline void require_positive_time(time_ns t) {
  if (t <= 0) throw error("iteration time must be positive, got " + std::to_string(t) + " ns");
}
}  // namespace detail

/// Tokens processed per second: B * s / iteration time.
[[nodiscard]] inline double tokens_per_second(const transformer& m, std::int64_t global_batch,
                                              time_ns iteration) {
  detail::require_positive_time(iteration);
  return static_cast<double>(global_batch) * static_cast<double>(m.seq) /
         (static_cast<double>(iteration) * 1e-9);
}

/// Achieved FLOP/s per GPU, in TFLOP/s: flops / (time * gpus) / 1e12.
[[nodiscard]] inline double tflops_per_gpu(double flops, time_ns iteration, std::int64_t gpus) {
  detail::require_positive_time(iteration);
  if (gpus <= 0) throw error("gpu count must be positive, got " + std::to_string(gpus));
  return flops / (static_cast<double>(iteration) * 1e-9 * static_cast<double>(gpus)) / 1e12;
}

/// Utilisation of `peak_flops_per_gpu` (FLOP/s): flops / (time * gpus * peak). Pass model
/// FLOPs for MFU, hardware FLOPs for HFU.
[[nodiscard]] inline double utilisation(double flops, time_ns iteration, std::int64_t gpus,
                                        double peak_flops_per_gpu) {
  if (peak_flops_per_gpu <= 0) throw error("peak FLOP/s must be positive");
  return tflops_per_gpu(flops, iteration, gpus) * 1e12 / peak_flops_per_gpu;
}

/// Model FLOPs utilisation of one iteration of `par` (global batch, world size, precision)
/// on `hw`.
[[nodiscard]] inline double mfu(const transformer& m, const parallel_config& par,
                                const hardware& hw, time_ns iteration) {
  return utilisation(model_flops(m, par.global_batch), iteration, par.world_size(),
                     hw.peak_flops(par.dtype));
}

/// Hardware FLOPs utilisation: counts the recomputation that `par.recompute` implies.
[[nodiscard]] inline double hfu(const transformer& m, const parallel_config& par,
                                const hardware& hw, time_ns iteration) {
  return utilisation(hardware_flops(m, par.global_batch, par.recompute), iteration,
                     par.world_size(), hw.peak_flops(par.dtype));
}

}  // namespace lumos::model

#pragma once
// Parameter counts, model/hardware FLOPs per iteration, throughput, MFU and HFU.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
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
  std::int64_t per_layer = 0;       ///< one dense transformer layer (weights, biases, both norms)
  std::int64_t per_moe_layer = 0;   ///< one MoE layer: attention, norms, router, all experts (0: dense model)
  std::int64_t routed_experts = 0;  ///< the routed experts of all MoE layers (the part EP shards)
  std::int64_t layers = 0;          ///< all transformer layers
  std::int64_t word_embedding = 0;  ///< V * h
  std::int64_t position_embedding = 0;  ///< s * h for learned positions, else 0
  std::int64_t final_norm = 0;
  std::int64_t output = 0;  ///< separate logits matrix (V * h) when embeddings are untied
  /// The multi-token-prediction modules apart from their blocks (which `layers` counts): each
  /// one's projection 2h -> h and its three norms (`mtp_extra_parameters`)
  std::int64_t mtp = 0;

  [[nodiscard]] constexpr std::int64_t total() const noexcept {
    return layers + word_embedding + position_embedding + final_norm + output + mtp;
  }
};

/// Parameters of one norm layer: LayerNorm has scale and shift, RMSNorm scale only.
[[nodiscard]] constexpr std::int64_t norm_parameter_count(const transformer& m) noexcept {
  return m.norm == norm_kind::layernorm ? 2 * m.hidden : m.hidden;
}

/// Parameters of one multi-token-prediction module apart from its transformer block, split as
/// Megatron splits them: the projection `eh_proj` 2h -> h (column-parallel, sharded) and the norms
/// of the hidden states, of the embeddings and before the shared output head (replicated). The
/// module shares the embedding and the output head with the model (DeepSeek-V3 report, section 2.2).
struct mtp_extra {
  std::int64_t sharded = 0;
  std::int64_t replicated = 0;
};

/// See `mtp_extra`. O(1).
[[nodiscard]] constexpr mtp_extra mtp_extra_parameters(const transformer& m) noexcept {
  return {.sharded = 2 * m.hidden * m.hidden, .replicated = 3 * norm_parameter_count(m)};
}

/// GEMM weights of multi-head latent attention, split as Megatron splits them over tensor
/// parallelism: `duplicated` the down projections (h x q_lora_rank, or the direct query
/// projection when q_lora_rank is 0, which is sharded; h x (kv_lora_rank + rope)), `sharded` the
/// up projections (q_lora_rank x heads (nope + rope), kv_lora_rank x heads (nope + v)) and the
/// output projection (heads v x h). Zeros for ordinary attention.
struct mla_weights {
  std::int64_t duplicated = 0;
  std::int64_t sharded = 0;
};

/// See `mla_weights`. O(1).
[[nodiscard]] constexpr mla_weights mla_matmul_weights(const transformer& m) noexcept {
  if (!m.is_mla()) return {};
  const std::int64_t h = m.hidden, a = m.heads, ql = m.mla.q_lora_rank, kvl = m.mla.kv_lora_rank;
  const std::int64_t qk = m.qk_head_dim(), v = m.v_head_dim();
  mla_weights w;
  w.duplicated = h * (kvl + m.mla.qk_rope_dim) + (ql > 0 ? h * ql : 0);
  w.sharded = (ql > 0 ? ql : h) * a * qk + kvl * a * (m.mla.qk_nope_dim + v) + a * v * h;
  return w;
}

/// GEMM weights of one layer's attention (QKV and output projection; MLA: `mla_matmul_weights`).
[[nodiscard]] constexpr std::int64_t attention_matmul_weights(const transformer& m) noexcept {
  if (m.is_mla()) return mla_matmul_weights(m).duplicated + mla_matmul_weights(m).sharded;
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  return h * (q + 2 * kv) + q * h;
}

/// Weights of the GEMMs of one layer (no biases, no norms): the `N` of the "6 N" rule.
[[nodiscard]] constexpr std::int64_t layer_matmul_weights(const transformer& m) noexcept {
  const std::int64_t attn = attention_matmul_weights(m);
  const std::int64_t mlp = (m.mlp == mlp_kind::gelu ? 2 : 3) * m.hidden * m.ffn;
  return attn + mlp;
}

/// Parameters of one block of a layer, split as tensor parallelism splits them: `sharded` over
/// the TP group (GEMM weights, biases of column-parallel GEMMs), `replicated` on every TP rank
/// (norms, biases of row-parallel GEMMs, the MoE router).
struct parameter_split {
  std::int64_t sharded = 0;
  std::int64_t replicated = 0;

  [[nodiscard]] constexpr std::int64_t total() const noexcept { return sharded + replicated; }
  /// What one rank of a TP group of `tp` holds.
  [[nodiscard]] constexpr std::int64_t per_rank(int tp) const noexcept { return sharded / tp + replicated; }
};

/// Attention block with both norms of a layer: QKV and output projection (and their biases).
/// MLA: its duplicated down projections and the latents' RMSNorms (q_lora_rank + kv_lora_rank)
/// are replicated on the TP ranks, its up and output projections sharded.
[[nodiscard]] constexpr parameter_split attention_parameters(const transformer& m) noexcept {
  if (m.is_mla()) {
    const mla_weights w = mla_matmul_weights(m);
    return {w.sharded, w.duplicated + 2 * norm_parameter_count(m) + m.mla.q_lora_rank + m.mla.kv_lora_rank};
  }
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  parameter_split p{h * (q + 2 * kv) + q * h, 2 * norm_parameter_count(m)};
  if (m.linear_bias) {
    p.sharded += q + 2 * kv;
    p.replicated += h;
  }
  return p;
}

/// One MLP of inner width `width` (a dense MLP, or one expert): GELU two GEMMs, SwiGLU three.
[[nodiscard]] constexpr parameter_split mlp_parameters(const transformer& m, std::int64_t width) noexcept {
  const std::int64_t h = m.hidden;
  parameter_split p{(m.mlp == mlp_kind::gelu ? 2 : 3) * h * width, 0};
  if (m.linear_bias) {
    p.sharded += m.mlp == mlp_kind::gelu ? width : 2 * width;
    p.replicated += h;
  }
  return p;
}

/// GEMM weights of one expert MLP (no biases).
[[nodiscard]] constexpr std::int64_t expert_matmul_weights(const transformer& m) noexcept {
  return (m.mlp == mlp_kind::gelu ? 2 : 3) * m.hidden * m.moe.expert_ffn;
}

/// The router of a MoE layer: the gating GEMM h -> experts (and its bias), replicated on the TP
/// ranks. 0 for a dense model.
[[nodiscard]] constexpr std::int64_t router_parameters(const transformer& m) noexcept {
  if (!m.is_moe()) return 0;
  return m.hidden * m.moe.experts + (m.moe.router_bias ? m.moe.experts : 0);
}

/// Weights of the GEMMs one token runs through in one MoE layer (attention, router, its top-k
/// routed experts and the shared experts): the active `N` of the "6 N" rule. 0 for a dense model.
[[nodiscard]] constexpr std::int64_t moe_layer_active_matmul_weights(const transformer& m) noexcept {
  if (!m.is_moe()) return 0;
  const std::int64_t h = m.hidden;
  return attention_matmul_weights(m) + h * m.moe.experts + (m.moe.top_k + m.moe.shared_experts) * expert_matmul_weights(m);
}

/// General count for GELU/SwiGLU, MHA/GQA, LayerNorm/RMSNorm, learned/rotary, tied/untied,
/// dense/MoE models. For GPT presets, total() == gpt_parameter_count + 2h (the final LayerNorm).
[[nodiscard]] constexpr parameter_breakdown parameter_counts(const transformer& m) noexcept {
  const std::int64_t h = m.hidden;
  const std::int64_t layer = attention_parameters(m).total() + mlp_parameters(m, m.ffn).total();
  parameter_breakdown p;
  p.per_layer = layer;
  p.layers = (m.blocks() - m.moe_layers()) * layer;
  if (m.is_moe()) {
    const std::int64_t experts = m.moe.experts * mlp_parameters(m, m.moe.expert_ffn).total();
    p.per_moe_layer = attention_parameters(m).total() + router_parameters(m) + experts +
                      m.moe.shared_experts * mlp_parameters(m, m.moe.expert_ffn).total();
    p.routed_experts = m.moe_layers() * experts;
    p.layers += m.moe_layers() * p.per_moe_layer;
  }
  p.word_embedding = m.vocab * h;
  p.position_embedding = m.position == position_kind::learned ? m.seq * h : 0;
  p.final_norm = norm_parameter_count(m);
  p.output = m.tied_embeddings ? 0 : m.vocab * h;
  p.mtp = m.mtp_layers * (mtp_extra_parameters(m).sharded + mtp_extra_parameters(m).replicated);
  return p;
}

/// Total distinct parameters of the model.
[[nodiscard]] constexpr std::int64_t parameter_count(const transformer& m) noexcept {
  return parameter_counts(m).total();
}

/// Parameters one token uses: all of a dense model; of a MoE model, every parameter but the
/// routed experts it does not visit (experts - top_k per MoE layer). Counts both embedding
/// matrices (model cards differ on that: OpenAI's GPT-OSS count leaves the input one out).
[[nodiscard]] constexpr std::int64_t active_parameter_count(const transformer& m) noexcept {
  const std::int64_t all = parameter_count(m);
  if (!m.is_moe()) return all;
  return all - m.moe_layers() * (m.moe.experts - m.moe.top_k) * mlp_parameters(m, m.moe.expert_ffn).total();
}

/// Parameters of one layer held by one tensor-parallel rank: GEMM weights and their
/// column-sharded biases are split `tp` ways; norms and the biases of row-parallel GEMMs
/// (output projection, last MLP GEMM) are replicated, as in Megatron. Precondition: the
/// configuration validates (tp divides heads, kv_heads, ffn).
[[nodiscard]] constexpr std::int64_t layer_parameters_per_rank(const transformer& m,
                                                               int tp) noexcept {
  if (m.is_mla()) return attention_parameters(m).per_rank(tp) + mlp_parameters(m, m.ffn).per_rank(tp);
  const std::int64_t h = m.hidden, q = m.q_width(), kv = m.kv_width();
  std::int64_t sharded = layer_matmul_weights(m);
  std::int64_t replicated = 2 * norm_parameter_count(m);
  if (m.linear_bias) {
    sharded += (q + 2 * kv) + (m.mlp == mlp_kind::gelu ? m.ffn : 2 * m.ffn);
    replicated += 2 * h;
  }
  return sharded / tp + replicated;
}

namespace detail {
inline void require_stage(const parallel_config& par, int stage) {
  if (stage < 0 || stage >= par.pp) {
    throw error("pipeline stage " + std::to_string(stage) + " out of range [0, " + std::to_string(par.pp) + ")");
  }
}
}  // namespace detail

/// MoE layers held by pipeline stage `stage` (all its virtual chunks): the layers of its chunks
/// (chunk c of stage s holds the layers of virtual stage c * pp + s, `chunk_layers` of them) past
/// `first_dense_layers`. 0 for a dense model. O(vp).
[[nodiscard]] constexpr std::int64_t stage_moe_layers(const transformer& m, const parallel_config& par,
                                                      int stage) noexcept {
  if (!m.is_moe()) return 0;
  std::int64_t n = 0;
  for (int c = 0; c < par.vp; ++c) {
    const std::int64_t first = par.first_layer(m, c * par.pp + stage);
    const std::int64_t count = par.chunk_layers(m, stage, c);
    n += std::clamp<std::int64_t>(first + count - m.moe.first_dense_layers, 0, count);
  }
  return n;
}

/// Parameters of one MoE layer held by one rank, apart from its routed experts: attention,
/// norms and shared experts sharded by tp, the router replicated. 0 for a dense model.
[[nodiscard]] constexpr std::int64_t moe_layer_dense_parameters_per_rank(const transformer& m, int tp) noexcept {
  if (!m.is_moe()) return 0;
  const parameter_split shared = mlp_parameters(m, m.moe.expert_ffn);
  return attention_parameters(m).per_rank(tp) + router_parameters(m) +
         m.moe.shared_experts * (shared.sharded / tp + shared.replicated);
}

/// Routed-expert parameters of one MoE layer held by one rank: experts / ep experts, each
/// sharded over the `etp` ranks of its expert-tensor-parallel group (`parallel_config::expert_tp`).
/// 0 for a dense model.
[[nodiscard]] constexpr std::int64_t moe_layer_expert_parameters_per_rank(const transformer& m, int etp, int ep) noexcept {
  if (!m.is_moe()) return 0;
  const parameter_split one = mlp_parameters(m, m.moe.expert_ffn);
  return m.moe.experts / ep * (one.sharded / etp + one.replicated);
}

/// Routed-expert parameters one GPU of stage `stage` holds (reduced over the
/// expert-data-parallel group, not the data-parallel one). 0 for a dense model. Throws
/// `lumos::error` for a stage out of range.
[[nodiscard]] inline std::int64_t stage_expert_parameters_per_rank(const transformer& m, const parallel_config& par,
                                                                   int stage) {
  detail::require_stage(par, stage);
  return stage_moe_layers(m, par, stage) * moe_layer_expert_parameters_per_rank(m, par.expert_tp(), par.ep);
}

/// Whether the first and the last pipeline stage each hold a copy of the word embedding, whose
/// gradients are then all-reduced between them once per step over the embedding group (Megatron's
/// `_allreduce_word_embedding_grads`, after the data-parallel reductions): with pp > 1, for tied
/// embeddings (the last stage's output layer) or multi-token prediction (the modules' lookup of
/// their shifted tokens on the last stage). O(1).
[[nodiscard]] constexpr bool embedding_copies_synced(const transformer& m, const parallel_config& par) noexcept {
  return par.pp > 1 && (m.tied_embeddings || m.mtp_layers > 0);
}

/// Parameters the multi-token-prediction modules add to one GPU of the last stage beside their
/// blocks: their projections (sharded by tp) and norms, and, with pp > 1 and untied embeddings,
/// the copy of the word embedding the modules look their tokens up in (Megatron builds the
/// embedding on the last stage too when it runs MTP and keeps the copies' gradients in sync as
/// for tied embeddings). 0 without MTP.
[[nodiscard]] constexpr std::int64_t mtp_head_parameters_per_rank(const transformer& m, const parallel_config& par) noexcept {
  if (m.mtp_layers <= 0) return 0;
  const mtp_extra x = mtp_extra_parameters(m);
  return m.mtp_layers * (x.sharded / par.tp + x.replicated) + (par.pp > 1 && !m.tied_embeddings ? m.vocab * m.hidden / par.tp : 0);
}

/// Parameters held by one GPU of pipeline stage `stage` (all its virtual chunks), before any
/// ZeRO sharding. MoE layers count their local routed experts (`stage_expert_parameters_per_rank`). Stage 0 adds the vocabulary-sharded word embedding and the (replicated)
/// learned positions; the last stage adds the final norm, the multi-token-prediction modules'
/// projections and norms (their blocks are layers of the stage) and the logits matrix — for tied
/// embeddings with pp > 1 Megatron keeps a second copy of the word embedding there and
/// all-reduces its gradient with stage 0. Throws `lumos::error` for a stage out of range.
[[nodiscard]] inline std::int64_t stage_parameters_per_rank(const transformer& m,
                                                            const parallel_config& par,
                                                            int stage) {
  detail::require_stage(par, stage);
  const std::int64_t moe_layers = stage_moe_layers(m, par, stage);
  std::int64_t n = (par.stage_layers(m, stage) - moe_layers) * layer_parameters_per_rank(m, par.tp);
  if (moe_layers > 0) {
    n += moe_layers * (moe_layer_dense_parameters_per_rank(m, par.tp) +
                       moe_layer_expert_parameters_per_rank(m, par.expert_tp(), par.ep));
  }
  if (stage == 0) {
    n += m.vocab * m.hidden / par.tp;
    if (m.position == position_kind::learned) n += m.seq * m.hidden;
  }
  if (stage == par.pp - 1) {
    n += norm_parameter_count(m);
    if (!m.tied_embeddings || par.pp > 1) n += m.vocab * m.hidden / par.tp;
    n += mtp_head_parameters_per_rank(m, par);
  }
  return n;
}

/// Parameters whose optimizer step one GPU of stage `stage` runs: all of its stage's
/// (`stage_parameters_per_rank`) without ZeRO; with ZeRO stage >= 1 (the distributed optimizer)
/// the dense ones divided by the sharding group (`parallel_config::shard_size`: dp * cp, or with
/// HSDP the shard group) and the routed experts' by the expert-data-parallel size
/// (`parallel_config::expert_data_parallel`: tp * cp * dp / (ep * expert tp)).
[[nodiscard]] inline double optimizer_parameters_per_rank(const transformer& m, const parallel_config& par, int stage) {
  const std::int64_t all = stage_parameters_per_rank(m, par, stage);
  if (par.zero_stage < 1) return static_cast<double>(all);
  const std::int64_t experts = stage_expert_parameters_per_rank(m, par, stage);
  const double ranks = par.shard_size();
  if (experts == 0) return static_cast<double>(all) / ranks;
  return static_cast<double>(all - experts) / ranks + static_cast<double>(experts) / par.expert_data_parallel();
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
/// 2 s N_layer + 4 s^2 w, w = `transformer::attention_flops_width` (q_width; under MLA
/// heads (qk_head_dim + v_head_dim) / 2).
[[nodiscard]] constexpr double layer_forward_flops_per_sequence(const transformer& m) noexcept {
  const double s = static_cast<double>(m.seq);
  return 2.0 * s * static_cast<double>(layer_matmul_weights(m)) +
         4.0 * s * s * m.attention_flops_width();
}

/// Forward FLOPs of one MoE layer for one sequence: 2 s N_active + 4 s^2 q_width, N_active =
/// `moe_layer_active_matmul_weights` (the router GEMM and each token's top-k and shared experts;
/// balanced, dropless routing: the capacity factor changes the work executed, not the model
/// FLOPs). 0 for a dense model.
[[nodiscard]] constexpr double moe_layer_forward_flops_per_sequence(const transformer& m) noexcept {
  if (!m.is_moe()) return 0.0;
  const double s = static_cast<double>(m.seq);
  return 2.0 * s * static_cast<double>(moe_layer_active_matmul_weights(m)) +
         4.0 * s * s * m.attention_flops_width();
}

/// Forward FLOPs of all transformer blocks (`transformer::blocks`, the multi-token-prediction
/// ones included) for one sequence: dense layers (all of a dense model) at
/// `layer_forward_flops_per_sequence`, MoE layers at `moe_layer_forward_flops_per_sequence`.
[[nodiscard]] constexpr double layers_forward_flops_per_sequence(const transformer& m) noexcept {
  if (!m.is_moe()) return static_cast<double>(m.blocks()) * layer_forward_flops_per_sequence(m);
  const std::int64_t moe = m.moe_layers();
  return static_cast<double>(m.blocks() - moe) * layer_forward_flops_per_sequence(m) +
         static_cast<double>(moe) * moe_layer_forward_flops_per_sequence(m);
}

/// Model FLOPs per iteration for any preset shape (GQA, SwiGLU, MoE, multi-token prediction):
///   F = 3 B [ sum over blocks (2 s N_layer + 4 s^2 q_width) + (1 + mtp) 2 s V h + mtp 2 s 2h^2 ],
/// N_layer the layer's GEMM weights a token runs through (MoE: `moe_layer_active_matmul_weights`),
/// mtp the multi-token-prediction modules (each a block, a 2h -> h projection and a logits GEMM).
/// Equals `megatron_model_flops` for GPT shapes.
[[nodiscard]] constexpr double model_flops(const transformer& m,
                                           std::int64_t global_batch) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq);
  const double h = static_cast<double>(m.hidden), mtp = static_cast<double>(m.mtp_layers);
  const double logits = 2.0 * s * static_cast<double>(m.vocab) * h;
  return 3.0 * B * (layers_forward_flops_per_sequence(m) + (1.0 + mtp) * logits + mtp * 2.0 * s * 2.0 * h * h);
}

/// Hardware FLOPs per iteration: model FLOPs plus re-executed forward work. Selective
/// recomputation reruns the attention core (4 B s^2 l q_width); full recomputation reruns
/// every layer's forward (not the logits), which gives Megatron's 96 coefficient for GPT.
[[nodiscard]] constexpr double hardware_flops(const transformer& m, std::int64_t global_batch,
                                              recompute_kind r) noexcept {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq),
               l = static_cast<double>(m.blocks());
  const double base = model_flops(m, global_batch);
  switch (r) {
    case recompute_kind::none: return base;
    case recompute_kind::selective:
      return base + 4.0 * B * s * s * l * m.attention_flops_width();
    case recompute_kind::full:
      return base + (m.is_moe() ? B * layers_forward_flops_per_sequence(m) : B * l * layer_forward_flops_per_sequence(m));
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

#pragma once
// Per-GPU memory: model states under ZeRO and activations after Korthikanti et al. 2022.

#include <lumos/core/error.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace lumos::model {

/// Bytes of model state per parameter. Defaults: mixed-precision Adam as in the ZeRO paper
/// (Rajbhandari et al. 2020): bf16/fp16 parameter 2, gradient 2, optimizer 12 (fp32 master
/// copy + two fp32 moments). Megatron with bf16 keeps fp32 main gradients: set grad = 4.
struct state_bytes {
  double param = 2;
  double grad = 2;
  double optimizer = 12;
};

/// Megatron-LM's mixed-precision training: bf16 weights (2), fp32 main gradients (4), Adam's fp32
/// master copy and two moments (12).
inline constexpr state_bytes megatron_state_bytes{2, 4, 12};

/// Inputs of `memory_per_gpu` beyond the configuration.
struct memory_options {
  /// Micro-batches whose activations the stage holds at its peak, in units of the stage's
  /// whole layer set. The schedule decides it: 1F1B holds min(pp - stage, m) on `stage`
  /// (stage 0: pp); interleaved 1F1B on stage 0 holds pp * (1 + (pp - 1) / (pp * vp))
  /// (Korthikanti et al. 2022, pipeline-parallelism analysis); GPipe holds all m.
  double in_flight_microbatches = 1;
  /// FlashAttention keeps no s x s matrices: drops the 5as/h term (its fp32 log-sum-exp,
  /// 4 a s b bytes per layer, is neglected). Korthikanti's equations are the `false` case.
  bool flash_attention = true;
  state_bytes per_param;
  /// fp8 training: the scaling recipe (delayed scaling keeps an amax history per operand) and
  /// the history's length (Transformer Engine's and Megatron's default: 1024).
  fp8_scaling scaling = fp8_scaling::delayed;
  int amax_history = 1024;
};

/// One GPU's memory at its activation peak, in bytes (doubles: interleaving factors and ZeRO
/// divisions need not be integers). Not included: CUDA context and library workspaces,
/// allocator fragmentation, communication buffers other than MoE dispatch and the context-parallel
/// key/value exchange.
struct memory_breakdown {
  std::int64_t parameter_count = 0;  ///< this GPU's parameters before ZeRO sharding
  double parameters = 0;
  double gradients = 0;
  double optimizer_states = 0;
  double activations = 0;  ///< transformer layers: per-layer bytes x layers x in-flight
  /// Embedding dropout mask (stage 0); final-norm input, logits-GEMM input and fp32 logits
  /// of the loss (last stage); times the in-flight count.
  double io_activations = 0;
  /// Transient of recomputation: one layer's full activations while its forward is rerun
  /// (full), or one layer's attention-core activations (selective, 0 with FlashAttention).
  double recompute_working = 0;
  /// MoE token-dispatch buffers of one layer (send and receive of the all-to-all, or the
  /// all-gathered tokens of the allgather dispatcher); one layer's worth, they are reused.
  double moe_dispatch_buffers = 0;
  /// Context parallelism's key/value buffers of one layer (`context_parallel_buffer_bytes`); 0
  /// with cp == 1.
  double cp_buffers = 0;
  /// Of `parameter_count`, the routed experts' parameters (EP-sharded; their gradients and
  /// optimizer states are sharded over the expert-data-parallel group).
  std::int64_t expert_parameter_count = 0;
  /// FSDP's unsharded buffers (`fsdp_buffer_bytes`): gathered parameters and one unit's
  /// unsharded gradients. 0 without FSDP.
  double fsdp_buffers = 0;
  /// fp8 training: the fp8 copies of the fp8 GEMMs' weights (`fp8_weight_parameters`), 2 bytes
  /// per parameter — the weight and its transpose, which Transformer Engine keeps on Hopper (its
  /// fp8 GEMMs take only the TN layout, the input gradient reads the transpose); module buffers
  /// rewritten by each micro-batch's cast, so held once. 0 in 16-bit training.
  double fp8_weights = 0;
  /// fp8 training: the scaling state of every fp8 GEMM — per operand (input, weight, output
  /// gradient) an fp32 scale, its inverse and, under delayed scaling, the amax history. Small.
  double fp8_scaling_state = 0;

  [[nodiscard]] constexpr double model_states() const noexcept {
    return parameters + gradients + optimizer_states;
  }
  [[nodiscard]] constexpr double total() const noexcept {
    return model_states() + activations + io_activations + recompute_working + moe_dispatch_buffers + cp_buffers + fsdp_buffers +
           fp8_weights + fp8_scaling_state;
  }
  /// Whether `total()` fits in the GPU's HBM (no allowance for the exclusions above).
  [[nodiscard]] constexpr bool fits(const hardware& hw) const noexcept {
    return total() <= static_cast<double>(hw.gpu.hbm_capacity);
  }
};

namespace detail {
/// The three groups of Korthikanti et al.'s per-layer activation count, in bytes for one
/// micro-batch of b sequences, before any parallelism, generalised to GQA and SwiGLU (for GPT
/// shapes replicated = 10 sbh, sharded = 24 sbh, core = 5 a s^2 b):
///  - replicated: inputs of the two norms (2 x 2sbh), inputs of the QKV and first MLP GEMMs
///    (2 x 2sbh), two dropout masks (2 x sbh): kept whole on every TP rank unless sp;
///  - sharded: Q (2 sbq), K and V (2 x 2 sb kv), attention output (2 sbq), MLP — GELU: GELU
///    input and second GEMM input (2 x 2 sbf); SwiGLU: gate, up and down inputs (3 x 2 sbf);
///  - core: softmax output (2 a s^2 b), with dropout also its mask (a s^2 b) and output
///    (2 a s^2 b).
/// With `fp8` (Transformer Engine's fp8 linear layers) the inputs the fp8 GEMMs save for their
/// weight gradients are their fp8 casts, 1 byte an element: the QKV and first MLP inputs
/// (replicated: 2 sbh less), the attention output projection's and the last MLP GEMM's inputs
/// (sharded: sbq + sbf less). The other saved tensors stay 16-bit.
/// Multi-head latent attention: sharded Q and K (2 x 2 sb heads qk_head_dim), V and the attention
/// output (2 x 2 sb heads v_head_dim); `duplicated`, on every TP rank whatever sp says (the down
/// projections run whole on each after the sequence-parallel all-gather): the latents before and
/// after their RMSNorms (2 x 2 sb (q_lora_rank + kv_lora_rank)); in fp8 the up projections' inputs
/// are 1 byte (sb (q_lora_rank + kv_lora_rank) less).
struct layer_activation_terms {
  double replicated;
  double sharded;
  double core;
  double duplicated = 0;
};

[[nodiscard]] constexpr layer_activation_terms layer_activations(const transformer& m,
                                                                 std::int64_t micro_batch, bool fp8 = false) {
  const double sb = static_cast<double>(m.seq) * static_cast<double>(micro_batch);
  const double h = static_cast<double>(m.hidden), q = static_cast<double>(m.q_width()),
               kv = static_cast<double>(m.kv_width()), f = static_cast<double>(m.ffn),
               a = static_cast<double>(m.heads), s = static_cast<double>(m.seq);
  layer_activation_terms r{};
  r.replicated = 4.0 * sb * h + 4.0 * sb * h + (m.dropout ? 2.0 * sb * h : 0.0);
  r.sharded = 2.0 * sb * q + 4.0 * sb * kv + 2.0 * sb * q +
              (m.mlp == mlp_kind::gelu ? 4.0 * sb * f : 6.0 * sb * f);
  r.core = (m.dropout ? 5.0 : 2.0) * a * s * sb;
  if (m.is_mla()) {
    const double qk = static_cast<double>(m.qk_head_dim()), v = static_cast<double>(m.v_head_dim());
    const double latents = static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank);
    r.sharded = 4.0 * sb * a * qk + 4.0 * sb * a * v + (m.mlp == mlp_kind::gelu ? 4.0 * sb * f : 6.0 * sb * f);
    r.duplicated = 4.0 * sb * latents - (fp8 ? sb * latents : 0.0);
    if (fp8) {
      r.replicated -= 2.0 * sb * h;
      r.sharded -= sb * a * v + sb * f;
    }
    return r;
  }
  if (fp8) {
    r.replicated -= 2.0 * sb * h;
    r.sharded -= sb * q + sb * f;
  }
  return r;
}
}  // namespace detail

/// Activation bytes one layer keeps for backward, per micro-batch of `par.micro_batch`
/// sequences, on one TP rank (Korthikanti et al. 2022, Table 2, for GPT shapes):
///   none:      sbh (10 + 24/t + 5as/(ht))   — with sp: sbh/t (34 + 5as/h)
///   selective: sbh (10 + 24/t)              — with sp: 34 sbh / t
///   full:      2 sbh (the layer input)      — with sp: 2 sbh / t (Megatron checkpoints the
///                                             sequence-sharded input)
/// FlashAttention removes the 5as/h term (with or without recomputation). fp8 training saves
/// the fp8 GEMMs' inputs in fp8 (`detail::layer_activations`). Context parallelism divides
/// every term by cp: a rank keeps its s / cp tokens, and its attention scores are s / cp queries
/// against s keys.
[[nodiscard]] constexpr double layer_activation_bytes(const transformer& m,
                                                      const parallel_config& par,
                                                      bool flash_attention) {
  const double t = par.tp, c = par.cp;
  const double rep_div = par.sequence_parallel() ? t : 1.0;
  if (par.recompute == recompute_kind::full) {
    return 2.0 * static_cast<double>(m.seq) * static_cast<double>(par.micro_batch) *
           static_cast<double>(m.hidden) / rep_div / c;
  }
  const detail::layer_activation_terms a = detail::layer_activations(m, par.micro_batch, par.dtype == precision::fp8);
  const bool keep_core = !flash_attention && par.recompute == recompute_kind::none;
  const double bytes = (a.replicated / rep_div + a.sharded / t + (keep_core ? a.core / t : 0.0)) / c;
  return m.is_mla() ? bytes + a.duplicated / c : bytes;
}

/// Token copies one rank's routed experts compute per micro-batch, as a multiple of the
/// micro-batch's tokens b*s. Balanced routing: an EP group of ep ranks routes ep * T/t * top_k
/// copies (T = b s tokens, t = tp; each rank's router sees its sequence shard T/t), each of the
/// `experts` experts receives ep T top_k / (t experts), and a rank's experts/ep experts receive
/// T top_k / t; the expert-tensor-parallel all-gather over the t TP ranks (which share the
/// experts, each with a 1/t slice of their width) makes it T top_k. Independent of ep: EP moves
/// tokens, not work. A capacity factor F makes every expert compute F times its share
/// (dropping or padding); dropless (0) is the share itself. 0 for a dense model.
[[nodiscard]] constexpr double expert_token_factor(const transformer& m) noexcept {
  if (!m.is_moe()) return 0.0;
  const double cf = m.moe.capacity_factor > 0 ? m.moe.capacity_factor : 1.0;
  return static_cast<double>(m.moe.top_k) * cf;
}

/// Activation bytes one MoE layer keeps for backward per micro-batch on one rank: the dense
/// layer's (`layer_activation_bytes`) without its MLP part, plus the router's fp32 probabilities
/// (4 bytes x tokens x experts, over the rank's sequence shard), the permuted expert inputs
/// (2h per token copy, `expert_token_factor` x T copies; h in fp8) and the expert intermediates (as the
/// dense MLP's per copy, at width expert_ffn / tp), and the shared experts as a dense MLP of
/// width shared x expert_ffn. Full recomputation keeps the layer input only, as for a dense
/// layer. 0 for a dense model.
[[nodiscard]] constexpr double moe_layer_activation_bytes(const transformer& m, const parallel_config& par,
                                                          bool flash_attention) {
  if (!m.is_moe()) return 0.0;
  if (par.recompute == recompute_kind::full) return layer_activation_bytes(m, par, flash_attention);
  const double sb = static_cast<double>(par.local_seq(m)) * static_cast<double>(par.micro_batch);
  const double t = par.tp, h = static_cast<double>(m.hidden), ef = static_cast<double>(m.moe.expert_ffn);
  // Saved MLP bytes per unit of width per token; under fp8 the last GEMM's input is 1 byte.
  const bool fp8 = par.dtype == precision::fp8;
  const double per_width = (m.mlp == mlp_kind::gelu ? 4.0 : 6.0) - (fp8 ? 1.0 : 0.0);
  const double dense_mlp = per_width * sb * static_cast<double>(m.ffn) / t;
  const double router = 4.0 * sb / (par.sequence_parallel() ? t : 1.0) * static_cast<double>(m.moe.experts);
  // The copies of the rank's expert-tensor-parallel group, each at its 1 / etp slice of width
  // (moe_shape; sb x factor when etp = tp; the busiest EP rank's under unbalanced routing).
  const int etp = par.expert_tp();
  const double copies = expert_token_factor(m) * (etp == par.tp ? sb : sb / t * etp) * m.moe.load_imbalance;
  const double experts = copies * ((fp8 ? 1.0 : 2.0) * h + per_width * ef / etp);
  const double shared = per_width * sb * static_cast<double>(m.moe.shared_experts) * ef / t;
  return layer_activation_bytes(m, par, flash_attention) - dense_mlp + router + experts + shared;
}

/// MoE dispatch buffers of one layer per micro-batch on one rank (see `memory_breakdown`):
/// all-to-all — send and receive buffers of the rank's token copies (2 x 2 h x T/t x top_k);
/// allgather — the tokens gathered over the EP x expert-TP group (2 h x ep x T, T / t x etp for
/// each of the ep ranks when expert tp differs from tp) and their
/// reduce-scatter input. 0 for a dense model or ep = 1 with expert tp = 1 (nothing moves).
[[nodiscard]] constexpr double moe_dispatch_buffer_bytes(const transformer& m, const parallel_config& par) noexcept {
  if (!m.is_moe() || (par.ep <= 1 && par.expert_tp() <= 1)) return 0.0;
  const double T = static_cast<double>(par.local_seq(m)) * static_cast<double>(par.micro_batch);
  const double e = activation_bytes(par.dtype), h = static_cast<double>(m.hidden);
  if (m.moe.dispatcher == moe_dispatcher::allgather) {
    const int etp = par.expert_tp();
    return etp == par.tp ? 2.0 * e * h * T * static_cast<double>(par.ep) : 2.0 * e * h * T / par.tp * etp * static_cast<double>(par.ep);
  }
  return 2.0 * e * h * T / par.tp * expert_token_factor(m);
}

/// Context parallelism's key/value buffers of one layer per micro-batch on one rank (reused
/// from layer to layer), with C = `context_parallel_kv_bytes` (the rank's K and V chunk): p2p —
/// the ring's double-buffered receive of K, V and, in backward, dK, dV (2 x 2 C, Transformer
/// Engine's ring); allgather — the gathered K and V and the dK, dV before their reduce-scatter
/// (2 x cp x C). 0 with cp == 1.
[[nodiscard]] constexpr double context_parallel_buffer_bytes(const transformer& m, const parallel_config& par) noexcept {
  if (par.cp <= 1) return 0.0;
  const double chunk = static_cast<double>(context_parallel_kv_bytes(m, par));
  return par.cp_comm == cp_comm_kind::p2p ? 4.0 * chunk : 2.0 * static_cast<double>(par.cp) * chunk;
}

/// FSDP's sharding units on one GPU of stage `stage`, in parameters (TP-sharded, before FSDP
/// sharding): the largest pair of units that follow each other in a pass (the unit computing
/// and the one prefetched: embedding, layers, head — the order the program builder gathers them
/// in) and the largest unit. O(1).
struct fsdp_units {
  std::int64_t pair = 0;
  std::int64_t largest = 0;
};

[[nodiscard]] inline fsdp_units fsdp_unit_parameters(const transformer& m, const parallel_config& par, int stage) {
  const std::int64_t layer = layer_parameters_per_rank(m, par.tp);
  const std::int64_t layers = par.stage_layers(m, stage);
  const std::int64_t embed = stage == 0 ? m.vocab * m.hidden / par.tp + (m.position == position_kind::learned ? m.seq * m.hidden : 0) : 0;
  const std::int64_t head = stage == par.pp - 1 ? norm_parameter_count(m) + ((!m.tied_embeddings || par.pp > 1) ? m.vocab * m.hidden / par.tp : 0) : 0;
  fsdp_units u;
  u.largest = std::max({embed, head, layers > 0 ? layer : 0});
  const std::int64_t inner = layers > 1 ? 2 * layer : 0;
  const std::int64_t edge = layers > 0 ? layer : head;  // what the embedding meets (the head when no layers)
  u.pair = std::max({inner, embed + edge, layers > 0 ? layer + head : head, u.largest});
  return u;
}

/// FSDP's unsharded buffers on one GPU of stage `stage`, in bytes (Zhao et al. 2023, section
/// 3.2; FSDP2 `fully_shard`): the gathered parameters in flight — the unit computing and the one
/// prefetched (`fsdp_units::pair`) at `per_param.param` bytes, or with reshard_after_forward off
/// the whole stage's parameters, which stay gathered from the forward to the backward — plus the
/// unsharded gradients of one unit at `per_param.grad` bytes before their reduce-scatter.
/// 0 without FSDP or with a shard group of one rank.
[[nodiscard]] inline double fsdp_buffer_bytes(const transformer& m, const parallel_config& par, int stage,
                                              const state_bytes& per_param) {
  if (!par.fsdp || par.shard_size() <= 1) return 0.0;
  const fsdp_units u = fsdp_unit_parameters(m, par, stage);
  const double gathered = par.reshard_after_forward ? static_cast<double>(u.pair)
                                                    : static_cast<double>(stage_parameters_per_rank(m, par, stage));
  return per_param.param * gathered + per_param.grad * static_cast<double>(u.largest);
}

/// GEMM weights and GEMMs one GPU of `stage` runs in fp8 under fp8 training (`fp8_gemm`): of
/// each dense layer QKV, output projection and the MLP's (`layer_matmul_weights` / tp); of each
/// MoE layer the attention's, and the local routed experts' (experts / ep) and shared experts'
/// GEMMs / tp. Throws `lumos::error` for a stage out of range. O(vp).
struct fp8_gemm_count {
  double weights = 0;  ///< parameters
  double gemms = 0;    ///< GEMMs (a grouped GEMM counts each expert's)
};
[[nodiscard]] inline fp8_gemm_count fp8_gemms_per_rank(const transformer& m, const parallel_config& par, int stage) {
  detail::require_stage(par, stage);
  const double t = par.tp, h = static_cast<double>(m.hidden);
  // MLA: its down projections (one GEMM, duplicated on the TP ranks), two up projections and the
  // output projection.
  const mla_weights mla = mla_matmul_weights(m);
  const double attention = m.is_mla() ? static_cast<double>(mla.duplicated) + static_cast<double>(mla.sharded) / t
                                      : (h * static_cast<double>(m.q_width() + 2 * m.kv_width()) + static_cast<double>(m.q_width()) * h) / t;
  const double attention_gemms = m.is_mla() ? 4.0 : 2.0;
  const double mlp_gemms = m.mlp == mlp_kind::gelu ? 2.0 : 3.0;
  const double moe_layers = static_cast<double>(stage_moe_layers(m, par, stage));
  const double dense_layers = static_cast<double>(par.stage_layers(m, stage)) - moe_layers;
  fp8_gemm_count c;
  c.weights = m.is_mla() ? dense_layers * (attention + mlp_gemms * h * static_cast<double>(m.ffn) / t)
                         : dense_layers * static_cast<double>(layer_matmul_weights(m)) / t;
  c.gemms = dense_layers * (attention_gemms + mlp_gemms);
  if (moe_layers > 0) {
    const double experts = static_cast<double>(m.moe.experts / par.ep + m.moe.shared_experts);
    const double routed = static_cast<double>(m.moe.experts / par.ep), shared = static_cast<double>(m.moe.shared_experts);
    const double one = static_cast<double>(expert_matmul_weights(m));
    c.weights += moe_layers * (attention + (par.expert_tp() == par.tp ? experts * one / t : routed * one / par.expert_tp() + shared * one / t));
    c.gemms += moe_layers * (attention_gemms + experts * mlp_gemms);
  }
  return c;
}

/// Memory of one GPU of pipeline stage `stage`. Model states: `stage_parameters_per_rank`
/// parameters, with optimizer states divided by dp * cp (the DP x CP group,
/// `parallel_config::shard_size`) from ZeRO stage 1, gradients from stage 2, parameters at stage
/// 3 — the routed experts' by the expert-data-parallel size dp * cp / ep instead (Megatron's
/// distributed optimizer shards them over that group); FSDP divides them by its shard group and
/// adds `fsdp_buffer_bytes`. Activations: `layer_activation_bytes` (MoE layers:
/// `moe_layer_activation_bytes`) x layers of the stage x `opt.in_flight_microbatches`, all of the
/// rank's s / cp tokens, plus the io, recomputation, dispatch-buffer and context-parallel buffer
/// terms of `memory_breakdown`. fp8 training adds the fp8 weight copies and scaling state of
/// `fp8_gemms_per_rank` and saves the fp8 GEMMs' inputs in fp8 (`layer_activation_bytes`); the
/// optimizer's fp32 master weights and moments stay as they are.
/// Throws `lumos::error` for an invalid configuration, stage or in-flight count. O(1).
[[nodiscard]] inline memory_breakdown memory_per_gpu(const transformer& m,
                                                     const parallel_config& par, int stage,
                                                     const memory_options& opt = {}) {
  par.validate(m);
  if (!(opt.in_flight_microbatches >= 0)) {
    throw error("in_flight_microbatches must be >= 0, got " +
                std::to_string(opt.in_flight_microbatches));
  }
  memory_breakdown r;
  r.parameter_count = stage_parameters_per_rank(m, par, stage);
  r.expert_parameter_count = stage_expert_parameters_per_rank(m, par, stage);
  const double dp = par.shard_size();  // the DP x CP group (HSDP: its shard group)
  if (r.expert_parameter_count == 0) {
    const double n = static_cast<double>(r.parameter_count);
    r.parameters = opt.per_param.param * n / (par.zero_stage >= 3 ? dp : 1.0);
    r.gradients = opt.per_param.grad * n / (par.zero_stage >= 2 ? dp : 1.0);
    r.optimizer_states = opt.per_param.optimizer * n / (par.zero_stage >= 1 ? dp : 1.0);
  } else {
    const double n = static_cast<double>(r.parameter_count - r.expert_parameter_count);
    const double x = static_cast<double>(r.expert_parameter_count), edp = par.expert_data_parallel();
    auto sharded = [&](double per, int from) {
      return per * n / (par.zero_stage >= from ? dp : 1.0) + per * x / (par.zero_stage >= from ? edp : 1.0);
    };
    r.parameters = sharded(opt.per_param.param, 3);
    r.gradients = sharded(opt.per_param.grad, 2);
    r.optimizer_states = sharded(opt.per_param.optimizer, 1);
  }
  r.fsdp_buffers = fsdp_buffer_bytes(m, par, stage, opt.per_param);

  const double inflight = opt.in_flight_microbatches;
  const std::int64_t moe_layers = stage_moe_layers(m, par, stage);
  r.activations = layer_activation_bytes(m, par, opt.flash_attention) *
                  static_cast<double>(par.stage_layers(m, stage) - moe_layers) * inflight;
  if (moe_layers > 0) {
    r.activations += moe_layer_activation_bytes(m, par, opt.flash_attention) * static_cast<double>(moe_layers) * inflight;
    r.moe_dispatch_buffers = moe_dispatch_buffer_bytes(m, par);
  }
  if (par.dtype == precision::fp8) {
    const fp8_gemm_count f = fp8_gemms_per_rank(m, par, stage);
    r.fp8_weights = 2.0 * f.weights;
    // per operand (input, weight, output gradient): fp32 scale, inverse scale, amax (+ history)
    const double history = opt.scaling == fp8_scaling::delayed ? std::max(opt.amax_history, 1) : 0;
    r.fp8_scaling_state = f.gemms * 3.0 * 4.0 * (3.0 + history);
  }

  const double sl = static_cast<double>(par.local_seq(m));  // the rank's tokens of a sequence
  const double sbh = sl * static_cast<double>(par.micro_batch) * static_cast<double>(m.hidden);
  const double rep_div = par.sequence_parallel() ? par.tp : 1.0;
  double io = 0;
  if (stage == 0 && m.dropout) io += sbh / rep_div;  // embedding dropout mask
  if (stage == par.pp - 1) {
    // final-norm input and logits-GEMM input (Megatron saves the sequence shard under sp),
    // and the fp32 logits the vocabulary-parallel cross-entropy keeps: once per output head
    // (the model's and each multi-token-prediction module's); each module also keeps the inputs
    // of its two norms (h each) and of its 2h -> h projection
    const double mtp = static_cast<double>(m.mtp_layers);
    io += (1.0 + mtp) * (2.0 * sbh / rep_div + 2.0 * sbh / rep_div +
                         4.0 * sl * static_cast<double>(par.micro_batch) * static_cast<double>(m.vocab) / par.tp);
    io += mtp * 2.0 * 4.0 * sbh / rep_div;
  }
  r.io_activations = io * inflight;

  if (par.recompute == recompute_kind::full) {
    parallel_config none = par;
    none.recompute = recompute_kind::none;
    r.recompute_working = moe_layers > 0 ? std::max(layer_activation_bytes(m, none, opt.flash_attention),
                                                    moe_layer_activation_bytes(m, none, opt.flash_attention))
                                         : layer_activation_bytes(m, none, opt.flash_attention);
  } else if (par.recompute == recompute_kind::selective && !opt.flash_attention) {
    r.recompute_working = detail::layer_activations(m, par.micro_batch).core / par.tp / par.cp;
  }
  r.cp_buffers = context_parallel_buffer_bytes(m, par);
  return r;
}

}  // namespace lumos::model

#pragma once
// Compute cost models: per-operator FLOPs, HBM bytes and durations of a transformer layer, the
// embedding, the logits/loss head and the optimizer step on one tensor-parallel rank.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::model {

/// Which peak and which efficiency pair (`compute_efficiency`) time an op.
enum class op_class : std::uint8_t { gemm, attention, elementwise, norm, optimizer };

/// Lower-case name of `c`, e.g. "gemm".
[[nodiscard]] constexpr std::string_view to_string(op_class c) noexcept {
  switch (c) {
    case op_class::gemm: return "gemm";
    case op_class::attention: return "attention";
    case op_class::elementwise: return "elementwise";
    case op_class::norm: return "norm";
    case op_class::optimizer: return "optimizer";
  }
  return "?";
}

/// Pass an op belongs to. Backward is split as zero-bubble schedules need it: `backward_input`
/// (B: gradients w.r.t. activations, everything the previous layer waits for, including any
/// recomputed forward work) and `backward_weight` (W: weight gradients, which nothing in the
/// backward pass waits for).
enum class op_phase : std::uint8_t { forward, backward_input, backward_weight, optimizer };

/// snake_case name of `p`, e.g. "backward_input".
[[nodiscard]] constexpr std::string_view to_string(op_phase p) noexcept {
  switch (p) {
    case op_phase::forward: return "forward";
    case op_phase::backward_input: return "backward_input";
    case op_phase::backward_weight: return "backward_weight";
    case op_phase::optimizer: return "optimizer";
  }
  return "?";
}

/// C[m x n] = A[m x k] * B[k x n].
struct gemm_shape {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
};

/// What an op is in the transformer, as far as the program builder and the trace writer need to
/// know: the ops tensor-parallel collectives attach to (Megatron's positions), the ones the
/// optimizer's reductions follow, and the kind of kernel a trace shows for it. Models set it on
/// every op (`role_of_name` gives it for the names the shipped models use); the builder never
/// looks at `name`, which is free text for reports.
enum class op_role : std::uint8_t {
  other,
  input_norm, qkv, qkv_bias, attention, attention_softmax, attention_dropout, attention_pv, attention_copy,
  attn_out, residual, post_attn_norm,
  mlp_in,    ///< fc1 (GeLU MLP) or the gate GEMM of a gated MLP
  mlp_up,    ///< the up GEMM of a gated MLP
  mlp_act, mlp_out, bias_grad, norm_weight_grad,
  word_embedding, position_embedding, embedding_dropout,
  final_norm, logits, cross_entropy, cross_entropy_part,
  loss_scale_unscale, found_inf, grad_norm, grad_clip, optimizer_step,
  moe_router,     ///< the MoE gating GEMM (hidden -> experts)
  moe_route,      ///< softmax and top-k of the router's scores
  moe_permute,    ///< gathers each token's copies into expert order (dispatch side)
  moe_unpermute,  ///< weighted sum of a token's expert outputs back into token order (combine side)
  moe_expert,     ///< a grouped GEMM over the rank's local experts
  moe_expert_act, ///< the experts' activation (GELU, or SiLU(gate) * up)
  fp8_cast,       ///< an fp8 GEMM operand cast to fp8 with its transpose (input, weight or output gradient)
  fp8_amax,       ///< the amax reduction current scaling runs over an operand before its cast
  mla_up_proj,    ///< an up projection of multi-head latent attention (its down projection has the qkv role)
  mtp_embedding,  ///< a multi-token-prediction module's lookup of the shifted tokens in the word embedding
  mtp_eh_proj,    ///< a multi-token-prediction module's column-parallel projection 2h -> h
};

/// The role of the op names the shipped models (`roofline`, `kernel_level`) emit; `other` for
/// any other name.
[[nodiscard]] constexpr op_role role_of_name(std::string_view n) noexcept {
  struct entry {
    std::string_view name;
    op_role role;
  };
  constexpr entry table[] = {
      {"input_norm", op_role::input_norm}, {"qkv_proj", op_role::qkv}, {"qkv_bias", op_role::qkv_bias},
      {"attention", op_role::attention}, {"attention_softmax", op_role::attention_softmax},
      {"attention_dropout", op_role::attention_dropout}, {"attention_pv", op_role::attention_pv},
      {"attention_context_copy", op_role::attention_copy}, {"attn_out_proj", op_role::attn_out},
      {"attn_residual", op_role::residual}, {"mlp_residual", op_role::residual}, {"post_attn_norm", op_role::post_attn_norm},
      {"mlp_fc1", op_role::mlp_in}, {"mlp_gate", op_role::mlp_in}, {"mlp_up", op_role::mlp_up}, {"mlp_act", op_role::mlp_act},
      {"mlp_fc2", op_role::mlp_out}, {"mlp_down", op_role::mlp_out}, {"word_embedding", op_role::word_embedding},
      {"position_embedding", op_role::position_embedding}, {"embedding_dropout", op_role::embedding_dropout},
      {"final_norm", op_role::final_norm}, {"logits", op_role::logits}, {"cross_entropy", op_role::cross_entropy},
      {"loss_scale_unscale", op_role::loss_scale_unscale}, {"loss_scale_found_inf", op_role::found_inf},
      {"grad_norm", op_role::grad_norm}, {"grad_clip", op_role::grad_clip}, {"optimizer_step", op_role::optimizer_step},
      {"moe_router", op_role::moe_router}, {"moe_route", op_role::moe_route}, {"moe_permute", op_role::moe_permute},
      {"moe_unpermute", op_role::moe_unpermute}, {"moe_expert_fc1", op_role::moe_expert},
      {"moe_expert_fc2", op_role::moe_expert}, {"moe_expert_gate", op_role::moe_expert},
      {"moe_expert_up", op_role::moe_expert}, {"moe_expert_down", op_role::moe_expert},
      {"moe_expert_act", op_role::moe_expert_act}, {"mla_down_proj", op_role::qkv},
      {"mla_q_up_proj", op_role::mla_up_proj}, {"mla_kv_up_proj", op_role::mla_up_proj},
      {"mtp_embedding", op_role::mtp_embedding}, {"mtp_eh_proj", op_role::mtp_eh_proj},
  };
  for (const entry& e : table) {
    if (e.name == n) return e.role;
  }
  if (n.starts_with("cross_entropy_")) return op_role::cross_entropy_part;
  if (n.starts_with("fp8_cast_")) return op_role::fp8_cast;
  if (n.starts_with("fp8_amax_")) return op_role::fp8_amax;
  if (n.ends_with("_bias_grad")) return op_role::bias_grad;
  if (n.ends_with("_weight_grad")) return op_role::norm_weight_grad;
  return op_role::other;
}

/// Whether fp8 training runs the GEMMs of role `r` in fp8, as Transformer Engine's recipe does
/// for the linear layers of a transformer layer: QKV, attention output, the MLP's and the
/// experts'. The attention core (FlashAttention), the MoE router, the logits and everything
/// outside the layers keep 16-bit GEMMs.
[[nodiscard]] constexpr bool fp8_gemm(op_role r) noexcept {
  return r == op_role::qkv || r == op_role::attn_out || r == op_role::mlp_in || r == op_role::mlp_up ||
         r == op_role::mlp_out || r == op_role::moe_expert || r == op_role::mla_up_proj;
}

/// One memory-bound kernel that gives an fp8 GEMM an fp8 operand.
struct fp8_cast {
  std::string_view name;  ///< op name (static): fp8_cast_{input,weight,grad} or fp8_amax_{input,weight,grad}
  op_role role = op_role::fp8_cast;
  double elements = 0;  ///< elements of the operand
  double flops = 0;
  double bytes = 0;     ///< HBM bytes read + written
};

/// HBM bytes per element of a cast with transpose (TE's cast_transpose): read the 16-bit operand,
/// write it in fp8 and its fp8 transpose (Hopper's fp8 GEMMs take only the TN layout, so the
/// backward GEMMs need the transposed copy).
inline constexpr double fp8_cast_bytes_per_element = 4;
/// HBM bytes per element of an amax reduction: one read of the 16-bit operand.
inline constexpr double fp8_amax_bytes_per_element = 2;

/// The kernels Transformer Engine runs before fp8 GEMM C[M x N] = A[M x K] B[K x N] (`batch` of
/// them, a grouped GEMM) of role `r` in `phase` (`recompute`: a recomputed forward), into `out`;
/// returns how many. Forward: the input A cast with its transpose (saved for the weight gradient),
/// unless `shared_input`; and the
/// weight B, cast once per micro-batch forward (no cache across micro-batches). `shared_input`:
/// the input was cast for an earlier GEMM (the up GEMM of a gated MLP reads the gate's). Input gradient
/// (backward_input): the output gradient A, cast with its transpose (the weight gradient reads
/// it). Weight gradient: none, it reads the transposes. Current scaling adds an amax reduction
/// before each cast. None for a role `fp8_gemm` excludes. O(1).
inline std::size_t fp8_casts(fp8_scaling s, op_role r, op_phase phase, bool recompute, double M, double N, double K,
                             double batch, bool shared_input, std::array<fp8_cast, 4>& out) {
  std::size_t n = 0;
  if (!fp8_gemm(r) || (phase == op_phase::backward_weight && !recompute) || phase == op_phase::optimizer) return 0;
  auto cast = [&](std::string_view amax, std::string_view name, double elements) {
    if (s == fp8_scaling::current) {
      out[n++] = {amax, op_role::fp8_amax, elements, elements, fp8_amax_bytes_per_element * elements};
    }
    out[n++] = {name, op_role::fp8_cast, elements, 2.0 * elements, fp8_cast_bytes_per_element * elements};
  };
  if (phase == op_phase::forward || recompute) {
    if (!shared_input) cast("fp8_amax_input", "fp8_cast_input", M * K * batch);
    cast("fp8_amax_weight", "fp8_cast_weight", K * N * batch);
  } else {
    cast("fp8_amax_grad", "fp8_cast_grad", M * K * batch);
  }
  return n;
}

/// One operator (one kernel, or one fused group of kernels) on one GPU.
struct op_cost {
  std::string_view name;  ///< static text; the same name appears in each phase of an op
  op_role role = op_role::other;  ///< what the op is (see `op_role`); set by the model
  op_class kind = op_class::elementwise;
  op_phase phase = op_phase::forward;
  bool recompute = false;    ///< forward work re-executed in backward (activation recompute)
  double flops = 0;          ///< FLOPs executed on this GPU
  double model_flops = 0;    ///< FLOPs the MFU convention counts (flops.hpp); 0 for recompute
  double bytes = 0;          ///< HBM bytes read + written
  gemm_shape shape;          ///< GEMMs only
  bool memory_bound = false; ///< the memory term of the roofline was the larger one
  time_ns duration = 0;      ///< roofline time + the hardware's per-kernel overhead
  /// Host time the launching thread spends before this op's kernels are queued (framework
  /// dispatch + launches); -1 = the program builder's default (its launch cost per kernel).
  time_ns cpu = -1;
  std::int32_t kernels = 1;  ///< kernels this op launches
  /// The launching thread waits until this op's kernels (and everything queued before them) have
  /// finished before it launches the next op: a device-to-host read the host needs (the token
  /// counts of a dropless MoE layer, which size its all-to-all and grouped GEMMs).
  bool host_sync = false;
};

/// Ops in execution order, with totals. A builder emits one task per op; for schedules that
/// split backward, take the ops of each phase in the order they appear.
struct op_list {
  std::vector<op_cost> ops;

  [[nodiscard]] time_ns duration() const noexcept {
    time_ns t = 0;
    for (const auto& o : ops) t += o.duration;
    return t;
  }
  [[nodiscard]] time_ns duration(op_phase p) const noexcept {
    time_ns t = 0;
    for (const auto& o : ops) t += o.phase == p ? o.duration : 0;
    return t;
  }
  [[nodiscard]] double flops(op_phase p) const noexcept {
    double f = 0;
    for (const auto& o : ops) f += o.phase == p ? o.flops : 0.0;
    return f;
  }
  [[nodiscard]] double model_flops() const noexcept {
    double f = 0;
    for (const auto& o : ops) f += o.model_flops;
    return f;
  }
  [[nodiscard]] double bytes(op_phase p) const noexcept {
    double b = 0;
    for (const auto& o : ops) b += o.phase == p ? o.bytes : 0.0;
    return b;
  }
  /// The ops of one phase, in order.
  [[nodiscard]] std::vector<op_cost> of(op_phase p) const {
    std::vector<op_cost> out;
    for (const auto& o : ops) {
      if (o.phase == p) out.push_back(o);
    }
    return out;
  }
  /// First op with this name and phase (and recompute flag), or nullptr.
  [[nodiscard]] const op_cost* find(std::string_view name, op_phase p,
                                    bool recompute = false) const noexcept {
    for (const auto& o : ops) {
      if (o.name == name && o.phase == p && o.recompute == recompute) return &o;
    }
    return nullptr;
  }
};

/// A compute cost model gives the ops of one micro-batch on one tensor-parallel rank:
/// `layer` — one transformer layer, forward then backward (B and W ops interleaved as
/// Megatron runs them); `embedding` — first stage's input embedding, forward and backward;
/// `head` — last stage's final norm, logits GEMM and loss, forward and backward;
/// `optimizer(…, stage)` — the per-iteration optimizer step of one GPU of that stage.
/// Results depend only on the arguments; invalid configurations throw `lumos::error`. A model
/// may add overloads that fill a caller's list instead (`layer(m, p, hw, op_list& out)`, and so
/// for the others): the program builder uses them when present, so that a caller that keeps its
/// buffers (a sweep) allocates nothing per configuration; the shipped models have them.
template <class Model>
concept ComputeModel = requires(const Model& c, const transformer& m, const parallel_config& p,
                                const hardware& hw, int stage) {
  { c.layer(m, p, hw) } -> std::same_as<op_list>;
  { c.embedding(m, p, hw) } -> std::same_as<op_list>;
  { c.head(m, p, hw) } -> std::same_as<op_list>;
  { c.optimizer(m, p, hw, stage) } -> std::same_as<op_list>;
};

/// Per-token widths of multi-head latent attention on one of `tp` ranks (`mla_spec`; a = heads / tp):
/// `down` the fused down projections' output (q_lora_rank + kv_lora_rank + rope), `latents` what
/// the RMSNorms normalise (q_lora_rank + kv_lora_rank), the query up projection `q_in` -> `q`
/// (q_lora_rank, or h when queries are projected directly, -> a (nope + rope)), the key/value up
/// projection `kv_in` -> `kv_up` (kv_lora_rank -> a (nope + v)), the attention's keys `k` (a qk)
/// and values `v` (a v), and the output projection's input `o` (a v).
struct mla_dims {
  double down = 0, latents = 0, q_in = 0, q = 0, kv_in = 0, kv_up = 0, k = 0, v = 0, o = 0;

  [[nodiscard]] static constexpr mla_dims of(const transformer& m, double tp) noexcept {
    const double a = static_cast<double>(m.heads) / tp, ql = static_cast<double>(m.mla.q_lora_rank);
    const double kvl = static_cast<double>(m.mla.kv_lora_rank), rope = static_cast<double>(m.mla.qk_rope_dim);
    const double qk = static_cast<double>(m.qk_head_dim()), vd = static_cast<double>(m.v_head_dim());
    mla_dims d;
    d.down = ql + kvl + rope;
    d.latents = ql + kvl;
    d.q_in = ql > 0 ? ql : static_cast<double>(m.hidden);
    d.q = a * qk;
    d.kv_in = kvl;
    d.kv_up = a * (static_cast<double>(m.mla.qk_nope_dim) + vd);
    d.k = a * qk;
    d.v = a * vd;
    d.o = a * vd;
    return d;
  }
  /// Elements per token a FlashAttention forward reads (Q, K, V) and writes (O).
  [[nodiscard]] constexpr double attention_bytes_forward() const noexcept { return q + k + v + o; }
  /// Elements per token its backward reads (Q, K, V, O, dO) and writes (dQ, dK, dV).
  [[nodiscard]] constexpr double attention_bytes_backward() const noexcept { return 2.0 * (q + k + v) + 2.0 * o; }
};

/// Roofline compute model:
///   duration = max(flops / (peak * eff.compute), bytes / (hbm_bw * eff.memory))
///              + hardware.kernel_launch_overhead
/// with peak = the tensor-core peak of the training precision for GEMMs (under fp8 training the
/// layers' linear GEMMs, `fp8_gemm`, at the fp8 peak with 1-byte operands, each after the cast
/// kernels of `fp8_casts` as elementwise ops; the logits and router GEMMs at the bf16 peak), the
/// bf16/fp16 peak for attention (fp8 training keeps attention in bf16), and the
/// FP32 CUDA-core peak for elementwise, norm and optimizer ops; efficiencies per op class come
/// from `hardware::efficiency`.
///
/// Shapes, with T = b*s/cp tokens of the micro-batch on the rank (context parallelism splits
/// each sequence over cp ranks), t = tp, q = heads*head_dim, kv = kv_heads*head_dim, f = ffn,
/// and Tn = T/t under sequence parallelism (else T, i.e. every TP rank redoes the
/// norm/residual/dropout work):
///  - qkv_proj     GEMM T x (q + 2kv)/t x h   (GQA: K and V are kv wide)
///  - attention    FlashAttention core: dense FLOPs 4 T s q / t (QK^T and PV; under CP the
///                 rank's T queries against all s keys, 1/cp of the sequence's attention: the
///                 load-balanced causal chunks give every rank the same share); executed
///                 FLOPs = dense * attention_causal_factor; backward executes
///                 attention_backward_factor x the forward (FA2 recomputes QK^T: 5 matmuls
///                 against 2); bytes read Q, K, V and write O plus fp32 log-sum-exp — never
///                 the s x s score matrix
///  - attn_out_proj GEMM T x h x q/t; mlp GEMMs T x f/t x h and T x h x f/t (GELU: fc1, fc2;
///                 SwiGLU: gate, up, down)
///  - input_norm / post_attn_norm over Tn x h; attn_residual / mlp_residual: bias + dropout +
///                 residual add (one fused kernel; without dropout a plain add) over Tn x h;
///                 mlp_act: GELU or SiLU(gate)*up over T x f/t
///  - backward: each GEMM gives a dgrad (B) of the same FLOPs and a wgrad (W) that
///                 accumulates into an fp32 main gradient (Megatron's gradient-accumulation
///                 fusion: 8 bytes per weight element read + written); norms and activations
///                 read their saved input and the incoming gradient and write one gradient
/// GEMM bytes: A and B operands at `operand_bytes(dtype)`, outputs at 2 bytes.
/// Recompute: selective re-runs the attention forward right before its backward; full re-runs
/// the whole layer forward at the start of the layer's backward (both phase backward_input,
/// `recompute = true`, model_flops 0).
/// Model FLOPs of all ops of one iteration add up to `model_flops()` of flops.hpp exactly.
/// Communication is not in these lists: the TP collectives of a layer come from
/// `tensor_parallel_layer_collectives` (comm.hpp), in the order documented there.
/// SwiGLU is three GEMMs (gate, up, down) as in the reference Llama code; Megatron fuses gate
/// and up into one GEMM of width 2f (same FLOPs and bytes, one kernel overhead less).
/// Not modelled: wave quantisation, GEMM shape efficiency, L2 reuse, overlap with
/// communication kernels (SM contention), CPU launch gaps. Complexity: O(1) per call (a few
/// dozen ops).
struct roofline {
  /// Executed fraction of dense attention FLOPs with a causal mask: FlashAttention skips
  /// fully masked tiles, so about half (slightly more, the diagonal tiles run in full).
  double attention_causal_factor = 0.5;
  /// Executed backward/forward FLOPs ratio of the attention core (FlashAttention-2: 2.5).
  double attention_backward_factor = 2.5;
  /// Bytes per parameter of reading gradients for the global gradient norm (bf16 grads).
  double grad_norm_bytes_per_param = 2;
  /// Bytes per parameter of a mixed-precision Adam step: read fp32 master, m, v and the bf16
  /// gradient (14), write master, m, v and the bf16 parameter copy (14).
  double optimizer_bytes_per_param = 28;
  /// FLOPs per parameter of the Adam update (moments, bias correction, sqrt, divide, weight
  /// decay); irrelevant in practice, the step is memory-bound.
  double optimizer_flops_per_param = 16;
  /// Scaling recipe of fp8 training (`fp8_casts`): which cast kernels precede each fp8 GEMM.
  fp8_scaling scaling = fp8_scaling::delayed;

  /// Roofline time of one op in whole ns, overhead included. Throws `lumos::error` for a
  /// missing peak (fp8 on A100) or a non-positive bandwidth/efficiency.
  [[nodiscard]] time_ns op_time(op_class c, double flops, double bytes, precision dtype,
                                const hardware& hw) const {
    return time_op(c, flops, bytes, dtype, hw).duration;
  }

  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void layer(const transformer& m, const parallel_config& par, const hardware& hw,
             op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.layer_forward(op_phase::forward, false);
    b.layer_backward();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list layer(const transformer& m, const parallel_config& par,
                              const hardware& hw) const {
    op_list out;
    layer(m, par, hw, out);
    return out;
  }

  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void embedding(const transformer& m, const parallel_config& par, const hardware& hw,
                 op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.embedding();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list embedding(const transformer& m, const parallel_config& par,
                                  const hardware& hw) const {
    op_list out;
    embedding(m, par, hw, out);
    return out;
  }

  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void head(const transformer& m, const parallel_config& par, const hardware& hw,
            op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.head();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list head(const transformer& m, const parallel_config& par,
                             const hardware& hw) const {
    op_list out;
    head(m, par, hw, out);
    return out;
  }

  /// Gradient-norm reduction and Adam step over the parameters this GPU updates: its stage's
  /// parameters (`optimizer_parameters_per_rank`: divided by dp, the routed experts' by dp / ep,
  /// under ZeRO stage >= 1).
  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void optimizer(const transformer& m, const parallel_config& par, const hardware& hw,
                 int stage, op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    const double params = optimizer_parameters_per_rank(m, par, stage);
    b.vector_op("grad_norm", op_class::norm, op_phase::optimizer, 2.0 * params,
                grad_norm_bytes_per_param * params);
    b.vector_op("optimizer_step", op_class::optimizer, op_phase::optimizer,
                optimizer_flops_per_param * params, optimizer_bytes_per_param * params);
    out = std::move(b.out);
  }
  [[nodiscard]] op_list optimizer(const transformer& m, const parallel_config& par,
                                  const hardware& hw, int stage) const {
    op_list out;
    optimizer(m, par, hw, stage, out);
    return out;
  }

 private:
  struct timed {
    time_ns duration;
    bool memory_bound;
  };

  [[nodiscard]] timed time_op(op_class c, double flops, double bytes, precision dtype,
                              const hardware& hw) const {
    const compute_efficiency& e = hw.efficiency;
    const efficiency_pair eff = c == op_class::gemm        ? e.gemm
                                : c == op_class::attention ? e.attention
                                : c == op_class::norm      ? e.norm
                                : c == op_class::optimizer ? e.optimizer
                                                           : e.elementwise;
    double peak = 0;
    if (c == op_class::gemm) {
      peak = hw.peak_flops(dtype);
    } else if (c == op_class::attention) {
      peak = hw.peak_flops(dtype == precision::fp8 ? precision::bf16 : dtype);
    } else {
      peak = hw.gpu.fp32_flops;
    }
    const double compute_rate = peak * eff.compute;
    const double memory_rate = hw.gpu.hbm_bandwidth * eff.memory;
    if (!(compute_rate > 0) || !(memory_rate > 0)) {
      throw error("hardware '" + hw.name + "': " + std::string(to_string(c)) +
                  " ops need a positive peak, HBM bandwidth and efficiencies");
    }
    const double compute_ns = flops / compute_rate * 1e9;
    const double memory_ns = bytes / memory_rate * 1e9;
    return {detail::round_ns(std::max(compute_ns, memory_ns)) + hw.kernel_launch_overhead,
            memory_ns > compute_ns};
  }

  // Emits ops with the shapes of one configuration. Doubles throughout: the counts exceed
  // int64 only in products we never form, and the roofline works in doubles anyway.
  struct builder {
    const roofline& rl;
    const transformer& m;
    const parallel_config& par;
    const hardware& hw;
    op_list out;
    double t, b, s, T, Tn, h, q, kv, f, heads, V, e, eo, norm_flops;

    builder(const roofline& r, const transformer& model, const parallel_config& p,
            const hardware& h_w)
        : rl(r), m(model), par(p), hw(h_w) {
      t = p.tp;
      b = static_cast<double>(p.micro_batch);
      s = static_cast<double>(model.seq);
      T = b * static_cast<double>(p.local_seq(model));
      Tn = p.sequence_parallel() ? T / t : T;
      h = static_cast<double>(model.hidden);
      q = static_cast<double>(model.q_width()) / t;
      kv = static_cast<double>(model.kv_width()) / t;
      f = static_cast<double>(model.ffn) / t;
      heads = static_cast<double>(model.heads) / t;
      V = static_cast<double>(model.vocab) / t;
      e = activation_bytes(p.dtype);
      eo = operand_bytes(p.dtype);
      // LayerNorm: mean, variance, normalise, scale and shift (~8 per element); RMSNorm:
      // square-sum, normalise, scale (~4).
      norm_flops = model.norm == norm_kind::layernorm ? 8.0 : 4.0;
    }

    void push(op_cost op, precision dtype) {
      const timed tm = rl.time_op(op.kind, op.flops, op.bytes, dtype, hw);
      op.duration = tm.duration;
      op.memory_bound = tm.memory_bound;
      out.ops.push_back(op);
    }

    void vector_op(std::string_view name, op_class c, op_phase ph, double flops, double bytes,
                   bool recompute = false) {
      op_cost op;
      op.name = name;
      op.role = role_of_name(name);
      op.kind = c;
      op.phase = ph;
      op.recompute = recompute;
      op.flops = flops;
      op.bytes = bytes;
      push(op, par.dtype);
    }

    // C[M x N] = A[M x K] B[K x N]; `c_bytes` per output element (8 for an fp32 accumulate).
    // Under fp8 training the layers' linear GEMMs run in fp8 after their casts (`fp8_casts`);
    // the others in bf16.
    void gemm(std::string_view name, op_phase ph, double M, double N, double K, double c_bytes,
              bool recompute) {
      op_cost op;
      op.name = name;
      op.role = role_of_name(name);
      const bool fp8 = par.dtype == precision::fp8 && fp8_gemm(op.role);
      if (fp8) {
        std::array<fp8_cast, 4> casts;
        const std::size_t n = fp8_casts(rl.scaling, op.role, ph, recompute, M, N, K, 1.0,
                                        op.role == op_role::mlp_up || name == "moe_expert_up", casts);
        for (std::size_t i = 0; i < n; ++i) {
          vector_op(casts[i].name, op_class::elementwise, ph, casts[i].flops, casts[i].bytes, recompute);
        }
      }
      op.kind = op_class::gemm;
      op.phase = ph;
      op.recompute = recompute;
      op.flops = 2.0 * M * N * K;
      op.model_flops = recompute ? 0.0 : op.flops;
      op.bytes = (M * K + K * N) * (fp8 || par.dtype != precision::fp8 ? eo : e) + M * N * c_bytes;
      op.shape = {static_cast<std::int64_t>(M), static_cast<std::int64_t>(N),
                  static_cast<std::int64_t>(K)};
      push(op, par.dtype == precision::fp8 && !fp8 ? precision::bf16 : par.dtype);
    }

    // Linear layer Y[T x out] = X[T x in] W[in x out] over `tokens` rows.
    void linear_forward(std::string_view name, op_phase ph, double tokens, double in, double o,
                        bool recompute) {
      gemm(name, ph, tokens, o, in, e, recompute);
    }
    void linear_backward(std::string_view name, double tokens, double in, double o) {
      gemm(name, op_phase::backward_input, tokens, in, o, e, false);  // dX = dY W^T
      gemm(name, op_phase::backward_weight, in, o, tokens, 8.0, false);  // dW += X^T dY
    }

    [[nodiscard]] double attention_dense_flops() const {
      return m.is_mla() ? 4.0 * T * s * m.attention_flops_width() / t : 4.0 * T * s * q;
    }

    void attention_forward(op_phase ph, bool recompute) {
      op_cost op;
      op.name = "attention";
      op.role = op_role::attention;
      op.kind = op_class::attention;
      op.phase = ph;
      op.recompute = recompute;
      op.flops = attention_dense_flops() * rl.attention_causal_factor;
      op.model_flops = recompute ? 0.0 : attention_dense_flops();
      op.bytes = m.is_mla() ? e * T * mla().attention_bytes_forward() + 4.0 * T * heads
                            : e * T * (q + 2.0 * kv) + e * T * q + 4.0 * T * heads;
      push(op, par.dtype);
    }

    void attention_backward() {
      op_cost op;
      op.name = "attention";
      op.role = op_role::attention;
      op.kind = op_class::attention;
      op.phase = op_phase::backward_input;
      op.flops =
          attention_dense_flops() * rl.attention_causal_factor * rl.attention_backward_factor;
      op.model_flops = 2.0 * attention_dense_flops();
      // Read Q, K, V, O, dO and the fp32 log-sum-exp; write dQ, dK, dV (and the fp32
      // row-sum of dO*O that FlashAttention-2 precomputes).
      op.bytes = m.is_mla() ? e * T * mla().attention_bytes_backward() + 8.0 * T * heads
                            : e * T * (4.0 * q + 4.0 * kv) + 8.0 * T * heads;
      push(op, par.dtype);
    }

    void norm_forward(std::string_view name, op_phase ph, bool recompute) {
      vector_op(name, op_class::norm, ph, norm_flops * Tn * h, 2.0 * e * Tn * h, recompute);
    }
    void norm_backward(std::string_view name) {
      // Read the saved input, the incoming gradient and the residual branch's gradient
      // (the residual fork's accumulation is fused here); write the input gradient.
      vector_op(name, op_class::norm, op_phase::backward_input, 2.0 * norm_flops * Tn * h,
                4.0 * e * Tn * h);
    }

    void residual_forward(std::string_view name, op_phase ph, bool recompute) {
      if (m.dropout) {
        // bias + dropout + residual add: read branch and residual, write sum and 1-byte mask
        vector_op(name, op_class::elementwise, ph, 4.0 * Tn * h, 3.0 * e * Tn * h + Tn * h,
                  recompute);
      } else {
        vector_op(name, op_class::elementwise, ph, Tn * h, 3.0 * e * Tn * h, recompute);
      }
    }
    void residual_backward(std::string_view name) {
      // Without dropout the gradient passes both branches unchanged: no kernel.
      if (m.dropout) {
        vector_op(name, op_class::elementwise, op_phase::backward_input, 2.0 * Tn * h,
                  2.0 * e * Tn * h + Tn * h);
      }
    }

    // Multi-head latent attention (`mla_spec`), on the T tokens the sequence-parallel
    // all-gather before the first projection gives every TP rank: the query and key/value down
    // projections (duplicated on the TP ranks) as one GEMM (same FLOPs and bytes as Megatron's
    // two, one kernel fewer), the latents' RMSNorms, the up projections (sharded by heads), the
    // attention core with query/key heads of qk_head_dim and value heads of v_head_dim, and the
    // output projection.
    [[nodiscard]] mla_dims mla() const { return mla_dims::of(m, t); }
    void mla_forward(op_phase ph, bool recompute) {
      const mla_dims d = mla();
      linear_forward("mla_down_proj", ph, T, h, d.down, recompute);
      vector_op("mla_latent_norm", op_class::norm, ph, norm_flops * T * d.latents, 2.0 * e * T * d.latents, recompute);
      linear_forward("mla_q_up_proj", ph, T, d.q_in, d.q, recompute);
      linear_forward("mla_kv_up_proj", ph, T, d.kv_in, d.kv_up, recompute);
      attention_forward(ph, recompute);
      linear_forward("attn_out_proj", ph, T, d.o, h, recompute);
    }
    void mla_backward() {
      const mla_dims d = mla();
      linear_backward("attn_out_proj", T, d.o, h);
      if (par.recompute == recompute_kind::selective) attention_forward(op_phase::backward_input, true);
      attention_backward();
      linear_backward("mla_kv_up_proj", T, d.kv_in, d.kv_up);
      linear_backward("mla_q_up_proj", T, d.q_in, d.q);
      vector_op("mla_latent_norm", op_class::norm, op_phase::backward_input, 2.0 * norm_flops * T * d.latents,
                4.0 * e * T * d.latents);
      linear_backward("mla_down_proj", T, h, d.down);
    }

    void layer_forward(op_phase ph, bool recompute) {
      norm_forward("input_norm", ph, recompute);
      if (m.is_mla()) {
        mla_forward(ph, recompute);
      } else {
        linear_forward("qkv_proj", ph, T, h, q + 2.0 * kv, recompute);
        attention_forward(ph, recompute);
        linear_forward("attn_out_proj", ph, T, q, h, recompute);
      }
      residual_forward("attn_residual", ph, recompute);
      norm_forward("post_attn_norm", ph, recompute);
      if (m.is_moe()) {
        moe_forward(ph, recompute);
      } else {
        mlp_forward(ph, recompute, f);
      }
      residual_forward("mlp_residual", ph, recompute);
    }

    // A dense MLP of inner width `w` (per rank) over `tokens` rows; `model_fraction` scales
    // its GEMMs' model FLOPs (MoE experts under a capacity factor).
    void mlp_forward(op_phase ph, bool recompute, double w, double tokens = 0, bool experts = false,
                     double model_fraction = 1) {
      if (tokens == 0) tokens = T;
      auto fwd = [&](std::string_view dense, std::string_view expert, double in, double o) {
        linear_forward(experts ? expert : dense, ph, tokens, in, o, recompute);
        out.ops.back().model_flops *= model_fraction;
      };
      if (m.mlp == mlp_kind::gelu) {
        fwd("mlp_fc1", "moe_expert_fc1", h, w);
        vector_op(experts ? "moe_expert_act" : "mlp_act", op_class::elementwise, ph, 8.0 * tokens * w, 2.0 * e * tokens * w, recompute);
        fwd("mlp_fc2", "moe_expert_fc2", w, h);
      } else {
        fwd("mlp_gate", "moe_expert_gate", h, w);
        fwd("mlp_up", "moe_expert_up", h, w);
        vector_op(experts ? "moe_expert_act" : "mlp_act", op_class::elementwise, ph, 6.0 * tokens * w, 3.0 * e * tokens * w, recompute);
        fwd("mlp_down", "moe_expert_down", w, h);
      }
    }
    void mlp_backward(double w, double tokens = 0, bool experts = false, double model_fraction = 1) {
      if (tokens == 0) tokens = T;
      auto bwd = [&](std::string_view dense, std::string_view expert, double in, double o) {
        linear_backward(experts ? expert : dense, tokens, in, o);
        out.ops[out.ops.size() - 2].model_flops *= model_fraction;
        out.ops.back().model_flops *= model_fraction;
      };
      const std::string_view act = experts ? "moe_expert_act" : "mlp_act";
      if (m.mlp == mlp_kind::gelu) {
        bwd("mlp_fc2", "moe_expert_fc2", w, h);
        vector_op(act, op_class::elementwise, op_phase::backward_input, 12.0 * tokens * w, 3.0 * e * tokens * w);
        bwd("mlp_fc1", "moe_expert_fc1", h, w);
      } else {
        bwd("mlp_down", "moe_expert_down", w, h);
        // read gate, up and the gradient; write the gate and up gradients
        vector_op(act, op_class::elementwise, op_phase::backward_input, 10.0 * tokens * w, 5.0 * e * tokens * w);
        bwd("mlp_up", "moe_expert_up", h, w);
        bwd("mlp_gate", "moe_expert_gate", h, w);
      }
    }

    // MoE layer (`moe_layer_shape`): router, softmax/top-k, permutation, the experts' GEMMs over
    // all the copies the rank computes (a grouped GEMM's FLOPs and bytes, as one GEMM), the
    // unpermutation, and the shared experts as a dense MLP.
    void moe_forward(op_phase ph, bool recompute) {
      const moe_layer_shape x = moe_shape(m, par);
      const double E = static_cast<double>(m.moe.experts);
      linear_forward("moe_router", ph, x.tokens, h, E, recompute);
      vector_op("moe_route", op_class::norm, ph, 8.0 * x.tokens * E, x.tokens * E * (e + 8.0), recompute);
      vector_op("moe_permute", op_class::elementwise, ph, 0, e * h * (x.tokens + x.routed), recompute);
      mlp_forward(ph, recompute, x.width, x.copies, true, x.model_fraction);
      vector_op("moe_unpermute", op_class::elementwise, ph, 2.0 * x.routed * h, e * h * (x.routed + x.tokens), recompute);
      if (x.shared_width > 0) mlp_forward(ph, recompute, x.shared_width);
    }
    void moe_backward() {
      const moe_layer_shape x = moe_shape(m, par);
      const double E = static_cast<double>(m.moe.experts);
      const op_phase B = op_phase::backward_input;
      if (x.shared_width > 0) mlp_backward(x.shared_width);
      vector_op("moe_unpermute", op_class::elementwise, B, 2.0 * x.routed * h, e * h * (x.tokens + 2.0 * x.routed));
      mlp_backward(x.width, x.copies, true, x.model_fraction);
      vector_op("moe_permute", op_class::elementwise, B, x.routed * h, e * h * (x.routed + x.tokens));
      vector_op("moe_route", op_class::norm, B, 6.0 * x.tokens * E, x.tokens * E * (2.0 * e + 4.0));
      linear_backward("moe_router", x.tokens, h, E);
    }

    void layer_backward() {
      if (par.recompute == recompute_kind::full) layer_forward(op_phase::backward_input, true);
      residual_backward("mlp_residual");
      if (m.is_moe()) {
        moe_backward();
      } else {
        mlp_backward(f);
      }
      norm_backward("post_attn_norm");
      residual_backward("attn_residual");
      if (m.is_mla()) {
        mla_backward();
        norm_backward("input_norm");
        return;
      }
      linear_backward("attn_out_proj", T, q, h);
      if (par.recompute == recompute_kind::selective) {
        attention_forward(op_phase::backward_input, true);
      }
      attention_backward();
      linear_backward("qkv_proj", T, h, q + 2.0 * kv);
      norm_backward("input_norm");
    }

    void embedding() {
      const double tok_bytes = 8.0;  // int64 token ids
      // Vocabulary-parallel lookup: this rank gathers the rows it owns (about T/t of them)
      // and writes a full T x h output with zeros elsewhere; the TP all-reduce (or
      // reduce-scatter under sp) that combines the shards is communication.
      vector_op("word_embedding", op_class::elementwise, op_phase::forward, 0.0,
                tok_bytes * T + e * T * h / t + e * T * h);
      if (m.position == position_kind::learned) {
        vector_op("position_embedding", op_class::elementwise, op_phase::forward, Tn * h,
                  3.0 * e * Tn * h);
      }
      if (m.dropout) {
        vector_op("embedding_dropout", op_class::elementwise, op_phase::forward, 2.0 * Tn * h,
                  2.0 * e * Tn * h + Tn * h);
        vector_op("embedding_dropout", op_class::elementwise, op_phase::backward_input,
                  2.0 * Tn * h, 2.0 * e * Tn * h + Tn * h);
      }
      if (m.position == position_kind::learned) {
        // sum the gradient over the batch into the fp32 position-embedding gradient
        vector_op("position_embedding", op_class::elementwise, op_phase::backward_weight,
                  Tn * h, e * Tn * h + 8.0 * s * h);
      }
      // scatter-add of the (all-gathered) gradient into the rows this rank owns
      vector_op("word_embedding", op_class::elementwise, op_phase::backward_weight, T * h / t,
                tok_bytes * T + e * T * h + 8.0 * T * h / t);
    }

    void head() {
      output_head();
      for (std::int64_t i = 0; i < m.mtp_layers; ++i) mtp_module();
    }

    // A multi-token-prediction module's own ops (its block is a layer of the last chunk): the
    // shifted tokens' embedding lookup, two norms, the column-parallel projection 2h -> h of the
    // concatenated normalised embeddings and hidden states, and its output head.
    void mtp_module() {
      vector_op("mtp_embedding", op_class::elementwise, op_phase::forward, T * h, 8.0 * T + 2.0 * e * T * h);
      norm_forward("mtp_norm", op_phase::forward, false);
      norm_forward("mtp_norm", op_phase::forward, false);
      linear_forward("mtp_eh_proj", op_phase::forward, T, 2.0 * h, h / t, false);
      linear_backward("mtp_eh_proj", T, 2.0 * h, h / t);
      norm_backward("mtp_norm");
      norm_backward("mtp_norm");
      vector_op("mtp_embedding", op_class::elementwise, op_phase::backward_weight, T * h / t,
                8.0 * T + e * T * h + 8.0 * T * h / t);
      output_head();
    }

    void output_head() {
      norm_forward("final_norm", op_phase::forward, false);
      linear_forward("logits", op_phase::forward, T, h, V, false);
      // Vocabulary-parallel cross-entropy (Megatron): read bf16 logits, write fp32
      // exp-logits kept for backward, reread them for the sum; max and sum all-reduces over
      // TP are communication.
      vector_op("cross_entropy", op_class::norm, op_phase::forward, 5.0 * T * V,
                T * V * (e + 4.0 + 4.0));
      vector_op("cross_entropy", op_class::norm, op_phase::backward_input, 2.0 * T * V,
                T * V * (4.0 + e));
      linear_backward("logits", T, h, V);
      norm_backward("final_norm");
    }
  };
};
static_assert(ComputeModel<roofline>);

}  // namespace lumos::model

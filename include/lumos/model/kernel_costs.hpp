#pragma once
// Kernel-level compute model: the kernels Megatron-LM / PyTorch launch for one transformer
// layer, the embedding, the head and the optimizer, each with its shape, FLOPs, bytes, GPU time
// from a `cost_profile` (shape-dependent GEMM efficiency, achievable bandwidth, a minimum kernel
// time) and the host time the launching thread spends before it (framework dispatch + launch).

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

namespace lumos::model {

/// GEMM efficiency of C[M x N] = A[M x K] B[K x N] under `p`: gemm_max times, per dimension,
/// d / (d + gemm_half_dim) (a tile that is mostly padding, or a K too short to amortise the
/// epilogue, wastes the tensor cores), times the profile's at-scale fraction. In (0, gemm_max].
[[nodiscard]] constexpr double gemm_efficiency(const cost_profile& p, double M, double N, double K) noexcept {
  const double h = p.gemm_half_dim;
  return p.gemm_max * p.at_scale * (M / (M + h)) * (N / (N + h)) * (K / (K + h));
}

/// The kernel-level `ComputeModel`. Ops keep the names the program builder hooks collectives
/// to (qkv_proj, attn_out_proj, mlp_fc1/fc2 or mlp_gate/up/down, word_embedding, logits,
/// cross_entropy) and add the kernels Megatron launches around them:
///  - per layer forward: input LayerNorm; QKV GEMM and its bias add; attention — FlashAttention
///    (one kernel) or unfused (batched GEMM QK^T, fused scale-mask-softmax, attention dropout,
///    batched GEMM PV, the context permute copy); output projection; bias-dropout-add; second
///    LayerNorm; fc1 GEMM, fused bias-GeLU (SwiGLU: gate, up, SiLU*up); fc2 GEMM; bias-dropout-add;
///  - backward: each GEMM as dgrad (B) and wgrad (W, fp32 main-gradient accumulation) plus the
///    bias-gradient reduction; LayerNorm input and weight gradients; softmax, dropout and
///    batched-GEMM gradients; the residual and activation backward kernels;
///  - MoE layers (`transformer::moe`) replace the MLP: router GEMM, softmax/top-k, permutation,
///    the experts as grouped GEMMs over the rank's experts / ep experts (`moe_layer_shape`: rows =
///    the token copies each expert computes under balanced routing), their activation, the
///    unpermutation, and the shared experts as a dense MLP (named like one, so that the TP hooks
///    of the MLP apply to them); backward mirrors them. The dispatch collectives between them are
///    communication (`moe_layer_collectives`). As Megatron-Core's MoE layer runs them, also: a
///    launch per local expert of each grouped GEMM (Transformer Engine's GroupedLinear), the
///    dropless dispatcher's token counts with their device-to-host copies and the host
///    synchronisation before the dispatch (`op_cost::host_sync`), and with EP and several local
///    experts the chunk sort after the dispatch and its inverse before the combine;
///  - embedding gather and its scatter-add gradient; head: final LayerNorm, logits GEMM,
///    vocabulary-parallel cross-entropy (max, sub, exp, sum, div, target gather);
///  - optimizer: fp16 loss-scale unscale and found-inf check, gradient L2 norm, clip scale,
///    multi-tensor Adam, copy of the fp32 master weights into the 16-bit model weights.
///  - fp8 training (`parallel_config::dtype` fp8, Transformer Engine's recipe): the layers' linear
///    GEMMs (`fp8_gemm`) at the fp8 peak on 1-byte operands with bf16 outputs, each preceded by
///    its cast kernels (`fp8_casts`: input and weight in forward, output gradient before the input
///    gradient, amax reductions under current scaling; elementwise, memory-bound); the attention
///    core, router, logits, norms and optimizer as in bf16.
/// GPU time: GEMMs max(flops / (peak * gemm_efficiency), bytes / HBM); FlashAttention at the
/// profile's forward/backward fractions of the 16-bit peak on the causal (half) FLOPs;
/// memory-bound kernels bytes / (HBM * class fraction); every kernel at least min_kernel_ns.
/// Host time (`op_cost::cpu`): forward kernels cpu_forward_op_ns + launch, backward kernels
/// cpu_backward_op_ns + launch, and once per layer forward (and its recomputation) the layer's
/// kernel-less glue ops. Model FLOPs add up to `model_flops()` as in `roofline`. Under context
/// parallelism every op works on the rank's b * s / cp tokens and the attention core on its
/// 1/cp share of the sequence's attention (its queries against all s keys), as in `roofline`.
/// O(1) per call (about 60 ops per layer).
struct kernel_level {
  cost_profile profile = h100_profile();
  double optimizer_bytes_per_param = 28;  ///< as `roofline`
  double attention_causal_factor = 0.5;   ///< FlashAttention skips masked tiles
  /// Scaling recipe of fp8 training: the cast (and amax) kernels before each fp8 GEMM (`fp8_casts`).
  fp8_scaling scaling = fp8_scaling::delayed;

  /// HBM bandwidth a memory-bound kernel of class `c` reaches (softmax kernels their own fraction).
  [[nodiscard]] double bandwidth(const hardware& hw, op_class c, bool softmax = false) const noexcept {
    const double frac = softmax                    ? profile.softmax_bw
                        : c == op_class::norm      ? profile.norm_bw
                        : c == op_class::optimizer ? profile.optimizer_bw
                                                   : profile.elementwise_bw;
    return hw.gpu.hbm_bandwidth * frac;
  }

  /// GPU time (ns, before the minimum kernel time) of a memory-bound kernel of class `c` that
  /// runs `flops` on the CUDA cores and moves `bytes`; `memory_bound` says which term won.
  [[nodiscard]] double vector_ns(const hardware& hw, op_class c, double flops, double bytes, bool softmax = false,
                                 bool* memory_bound = nullptr) const noexcept {
    const double mem = bytes / bandwidth(hw, c, softmax) * 1e9;
    const double cmp = hw.gpu.fp32_flops > 0 ? flops / hw.gpu.fp32_flops * 1e9 : 0.0;
    if (memory_bound != nullptr) *memory_bound = mem >= cmp;
    return std::max(mem, cmp);
  }

  /// GPU time (ns, before the minimum kernel time) of `batch` GEMMs C[M x N] = A[M x K] B[K x N]
  /// at `peak` FLOP/s with `operand_bytes` per A and B element and `c_bytes` per C element:
  /// max(flops / (peak x gemm_efficiency), bytes / elementwise bandwidth). Throws nothing.
  [[nodiscard]] double gemm_ns(const hardware& hw, double peak, double operand_bytes, double M, double N, double K,
                               double c_bytes, double batch = 1, bool* memory_bound = nullptr) const noexcept {
    const double flops = 2.0 * M * N * K * batch;
    const double bytes = ((M * K + K * N) * operand_bytes + M * N * c_bytes) * batch;
    const double cmp = flops / (peak * gemm_efficiency(profile, M, N, K)) * 1e9;
    const double mem = bytes / bandwidth(hw, op_class::elementwise) * 1e9;
    if (memory_bound != nullptr) *memory_bound = mem > cmp;
    return std::max(cmp, mem);
  }

  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void layer(const transformer& m, const parallel_config& par, const hardware& hw, op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.layer_forward(op_phase::forward, false);
    b.layer_backward();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list layer(const transformer& m, const parallel_config& par, const hardware& hw) const {
    op_list out;
    layer(m, par, hw, out);
    return out;
  }
  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void embedding(const transformer& m, const parallel_config& par, const hardware& hw, op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.embedding();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list embedding(const transformer& m, const parallel_config& par, const hardware& hw) const {
    op_list out;
    embedding(m, par, hw, out);
    return out;
  }
  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void head(const transformer& m, const parallel_config& par, const hardware& hw, op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    b.head();
    out = std::move(b.out);
  }
  [[nodiscard]] op_list head(const transformer& m, const parallel_config& par, const hardware& hw) const {
    op_list out;
    head(m, par, hw, out);
    return out;
  }
  /// Into `out` (overwritten; its capacity kept, so a caller that keeps `out` allocates nothing).
  void optimizer(const transformer& m, const parallel_config& par, const hardware& hw, int stage, op_list& out) const {
    par.validate(m, hw);
    builder b(*this, m, par, hw);
    b.out = std::move(out);
    b.out.ops.clear();
    const double params = optimizer_parameters_per_rank(m, par, stage);
    const op_phase o = op_phase::optimizer;
    if (par.dtype == precision::fp16) {
      // Megatron's fp16 optimizer: unscale the fp32 main gradients and look for inf/nan
      // (multi_tensor_scale reads and writes 4 B per parameter), then the found-inf reduction.
      b.vector("loss_scale_unscale", op_class::optimizer, o, params, 8.0 * params, false);
      b.vector("loss_scale_found_inf", op_class::elementwise, o, 0, 4.0, false);
    }
    b.vector("grad_norm", op_class::norm, op_phase::optimizer, 2.0 * params, 4.0 * params, false);
    b.vector("grad_clip", op_class::optimizer, o, params, 8.0 * params, false);
    b.vector("optimizer_step", op_class::optimizer, o, 16.0 * params, optimizer_bytes_per_param * params, false);
    out = std::move(b.out);
  }
  [[nodiscard]] op_list optimizer(const transformer& m, const parallel_config& par, const hardware& hw,
                                  int stage) const {
    op_list out;
    optimizer(m, par, hw, stage, out);
    return out;
  }

 private:
  struct builder {
    const kernel_level& k;
    const cost_profile& pr;
    const transformer& m;
    const parallel_config& par;
    const hardware& hw;
    op_list out;
    double t, b, s, sl, T, Tn, h, q, kv, f, heads, hd, V, e, eo, peak16, peak;
    bool first_of_layer = false;

    builder(const kernel_level& kl, const transformer& model, const parallel_config& p, const hardware& h_w)
        : k(kl), pr(kl.profile), m(model), par(p), hw(h_w) {
      t = p.tp;
      b = static_cast<double>(p.micro_batch);
      s = static_cast<double>(model.seq);
      sl = static_cast<double>(p.local_seq(model));
      T = b * sl;
      Tn = p.sequence_parallel() ? T / t : T;
      h = static_cast<double>(model.hidden);
      q = static_cast<double>(model.q_width()) / t;
      kv = static_cast<double>(model.kv_width()) / t;
      f = static_cast<double>(model.ffn) / t;
      heads = static_cast<double>(model.heads) / t;
      hd = static_cast<double>(model.head_dim());
      V = static_cast<double>(model.vocab) / t;
      e = activation_bytes(p.dtype);
      eo = operand_bytes(p.dtype);
      peak = hw.peak_flops(p.dtype);
      peak16 = hw.peak_flops(p.dtype == precision::fp8 ? precision::bf16 : p.dtype);
      validate(pr);
    }

    void push(op_cost op, double gpu_ns) {
      op.duration = detail::round_ns(std::max(gpu_ns, pr.min_kernel_ns));
      const bool fwd = op.phase == op_phase::forward || op.recompute || op.phase == op_phase::optimizer;
      double cpu = pr.cpu_launch_ns + (fwd ? pr.cpu_forward_op_ns : pr.cpu_backward_op_ns);
      if (first_of_layer) {
        cpu += pr.cpu_layer_glue_ns;
        first_of_layer = false;
      }
      op.cpu = detail::round_ns(cpu);
      op.kernels = 1;
      out.ops.push_back(op);
    }

    void vector(std::string_view name, op_class c, op_phase ph, double flops, double bytes, bool recompute,
                bool softmax = false) {
      op_cost op;
      op.name = name;
      op.role = role_of_name(name);
      op.kind = c;
      op.phase = ph;
      op.recompute = recompute;
      op.flops = flops;
      op.bytes = bytes;
      const double ns = k.vector_ns(hw, c, flops, bytes, softmax, &op.memory_bound);
      push(op, ns);
    }

    // `batch` GEMMs C[M x N] = A[M x K] B[K x N]; `c_bytes` per output element. Under fp8
    // training the layers' linear GEMMs (`fp8_gemm`) run at the fp8 peak on 1-byte operands after
    // their cast kernels (`fp8_casts`); every other GEMM at the 16-bit peak on 16-bit operands.
    void gemm(std::string_view name, op_phase ph, double M, double N, double K, double c_bytes, bool recompute,
              double batch = 1, bool model = true, op_class c = op_class::gemm) {
      op_cost op;
      op.name = name;
      op.role = role_of_name(name);
      const bool fp8 = par.dtype == precision::fp8 && c == op_class::gemm && fp8_gemm(op.role);
      if (fp8) {
        std::array<fp8_cast, 4> casts;
        const std::size_t n = fp8_casts(k.scaling, op.role, ph, recompute, M, N, K, batch,
                                        op.role == op_role::mlp_up || name == "moe_expert_up", casts);
        for (std::size_t i = 0; i < n; ++i) vector(casts[i].name, op_class::elementwise, ph, casts[i].flops, casts[i].bytes, recompute);
      }
      const double ob = fp8 || par.dtype != precision::fp8 ? eo : e;
      op.kind = c;
      op.phase = ph;
      op.recompute = recompute;
      op.flops = 2.0 * M * N * K * batch;
      op.model_flops = recompute || !model ? 0.0 : op.flops;
      op.bytes = ((M * K + K * N) * ob + M * N * c_bytes) * batch;
      op.shape = {static_cast<std::int64_t>(M), static_cast<std::int64_t>(N), static_cast<std::int64_t>(K)};
      const double rate = fp8 || (c == op_class::gemm && par.dtype != precision::fp8) ? peak : peak16;
      push(op, k.gemm_ns(hw, rate, ob, M, N, K, c_bytes, batch, &op.memory_bound));
    }

    void linear_forward(std::string_view name, std::string_view bias, op_phase ph, double in, double o, bool rc,
                        bool with_bias) {
      gemm(name, ph, T, o, in, e, rc);
      if (with_bias && m.linear_bias) vector(bias, op_class::elementwise, ph, T * o, 2.0 * e * T * o, rc);
    }
    void linear_backward(std::string_view name, std::string_view bias, double in, double o) {
      gemm(name, op_phase::backward_input, T, in, o, e, false);       // dX = dY W^T
      gemm(name, op_phase::backward_weight, in, o, T, 8.0, false);    // dW += X^T dY (fp32)
      if (m.linear_bias) vector(bias, op_class::elementwise, op_phase::backward_weight, T * o, e * T * o, false);
    }

    void norm_forward(std::string_view name, op_phase ph, bool rc) {
      vector(name, op_class::norm, ph, 8.0 * Tn * h, 2.0 * e * Tn * h, rc);
    }
    void norm_backward(std::string_view name, std::string_view wname) {
      vector(name, op_class::norm, op_phase::backward_input, 16.0 * Tn * h, 4.0 * e * Tn * h, false);
      // gamma/beta gradients: partial sums over rows, then the final reduction
      vector(wname, op_class::norm, op_phase::backward_weight, 4.0 * Tn * h, 2.0 * e * Tn * h, false);
    }
    void residual_forward(std::string_view name, op_phase ph, bool rc) {
      if (m.dropout) {
        vector(name, op_class::elementwise, ph, 4.0 * Tn * h, 3.0 * e * Tn * h + Tn * h, rc);
      } else {
        vector(name, op_class::elementwise, ph, Tn * h, 3.0 * e * Tn * h, rc);
      }
    }
    void residual_backward(std::string_view name) {
      if (m.dropout) {
        vector(name, op_class::elementwise, op_phase::backward_input, 2.0 * Tn * h, 2.0 * e * Tn * h + Tn * h, false);
      }
    }

    [[nodiscard]] double attention_dense_flops() const {
      return m.is_mla() ? 4.0 * T * s * m.attention_flops_width() / t : 4.0 * T * s * q;
    }
    // Per-head query/key and value dimensions (MLA: nope + rope and v; else head_dim both), and the
    // attention output's width per rank.
    [[nodiscard]] double head_qk() const { return m.is_mla() ? static_cast<double>(m.qk_head_dim()) : hd; }
    [[nodiscard]] double head_v() const { return m.is_mla() ? static_cast<double>(m.v_head_dim()) : hd; }
    [[nodiscard]] double out_width() const { return m.is_mla() ? heads * static_cast<double>(m.v_head_dim()) : q; }

    void attention_forward(op_phase ph, bool rc) {
      if (pr.attention == attention_impl::flash) {
        op_cost op;
        op.name = "attention";
        op.role = op_role::attention;
        op.kind = op_class::attention;
        op.phase = ph;
        op.recompute = rc;
        op.flops = attention_dense_flops() * k.attention_causal_factor;
        op.model_flops = rc ? 0.0 : attention_dense_flops();
        op.bytes = m.is_mla() ? e * T * mla_dims::of(m, t).attention_bytes_forward() + 4.0 * T * heads
                              : e * T * (q + 2.0 * kv) + e * T * q + 4.0 * T * heads;
        push(op, op.flops / (peak16 * pr.flash_forward * pr.at_scale) * 1e9);
        return;
      }
      const double batch = b * heads;
      const double scores = batch * sl * s;
      // QK^T over every head: batched GEMM [sl x hd] x [hd x s] (baddbmm in Megatron; sl = s / cp
      // local queries against every key); the model FLOPs of the attention core (4 T s q) are
      // counted on the two batched GEMMs.
      gemm("attention", ph, sl, s, head_qk(), e, rc, batch, true, op_class::attention);
      vector("attention_softmax", op_class::norm, ph, 5.0 * scores, 2.0 * e * scores, rc, true);
      if (m.dropout) vector("attention_dropout", op_class::elementwise, ph, 2.0 * scores, 2.0 * e * scores + scores, rc);
      gemm("attention_pv", ph, sl, head_v(), s, e, rc, batch, true, op_class::attention);
      vector("attention_context_copy", op_class::elementwise, ph, 0, 2.0 * e * T * out_width(), rc);
    }

    void attention_backward() {
      if (pr.attention == attention_impl::flash) {
        op_cost op;
        op.name = "attention";
        op.role = op_role::attention;
        op.kind = op_class::attention;
        op.phase = op_phase::backward_input;
        op.flops = attention_dense_flops() * k.attention_causal_factor * 2.5;
        op.model_flops = 2.0 * attention_dense_flops();
        op.bytes = m.is_mla() ? e * T * mla_dims::of(m, t).attention_bytes_backward() + 8.0 * T * heads
                              : e * T * (4.0 * q + 4.0 * kv) + 8.0 * T * heads;
        push(op, op.flops / (peak16 * pr.flash_backward * pr.at_scale) * 1e9);
        return;
      }
      const double batch = b * heads;
      const double scores = batch * sl * s;
      const op_phase B = op_phase::backward_input;
      vector("attention_context_copy", op_class::elementwise, B, 0, 2.0 * e * T * out_width(), false);
      // d(PV): dP = dO V^T [sl x s, K = hd] and dV = P^T dO [s x hd, K = sl]
      gemm("attention_pv", B, sl, s, head_v(), e, false, batch, true, op_class::attention);
      gemm("attention_pv", B, s, head_v(), sl, e, false, batch, false, op_class::attention);
      if (m.dropout) vector("attention_dropout", op_class::elementwise, B, 2.0 * scores, 2.0 * e * scores + scores, false);
      vector("attention_softmax", op_class::norm, B, 4.0 * scores, 3.0 * e * scores, false, true);
      // d(QK^T): dQ = dS K [sl x hd, K = s], dK = dS^T Q [s x hd, K = sl]
      gemm("attention", B, sl, head_qk(), s, e, false, batch, true, op_class::attention);
      gemm("attention", B, s, head_qk(), sl, e, false, batch, false, op_class::attention);
    }

    // Multi-head latent attention: as `roofline`'s (fused down projections on the gathered
    // tokens, the latents' RMSNorms, up projections, attention, output projection).
    void mla_forward(op_phase ph, bool rc) {
      const mla_dims d = mla_dims::of(m, t);
      linear_forward("mla_down_proj", "", ph, h, d.down, rc, false);
      vector("mla_latent_norm", op_class::norm, ph, 4.0 * T * d.latents, 2.0 * e * T * d.latents, rc);
      linear_forward("mla_q_up_proj", "", ph, d.q_in, d.q, rc, false);
      linear_forward("mla_kv_up_proj", "", ph, d.kv_in, d.kv_up, rc, false);
      attention_forward(ph, rc);
      linear_forward("attn_out_proj", "", ph, d.o, h, rc, false);
    }
    void mla_backward() {
      const mla_dims d = mla_dims::of(m, t);
      linear_backward("attn_out_proj", "attn_out_proj_bias_grad", d.o, h);
      if (par.recompute == recompute_kind::selective) attention_forward(op_phase::backward_input, true);
      attention_backward();
      linear_backward("mla_kv_up_proj", "", d.kv_in, d.kv_up);
      linear_backward("mla_q_up_proj", "", d.q_in, d.q);
      vector("mla_latent_norm", op_class::norm, op_phase::backward_input, 8.0 * T * d.latents, 4.0 * e * T * d.latents, false);
      linear_backward("mla_down_proj", "", h, d.down);
    }

    void layer_forward(op_phase ph, bool rc) {
      first_of_layer = true;
      norm_forward("input_norm", ph, rc);
      if (m.is_mla()) {
        mla_forward(ph, rc);
      } else {
        linear_forward("qkv_proj", "qkv_bias", ph, h, q + 2.0 * kv, rc, true);
        attention_forward(ph, rc);
        linear_forward("attn_out_proj", "", ph, q, h, rc, false);  // bias fused into the residual
      }
      residual_forward("attn_residual", ph, rc);
      norm_forward("post_attn_norm", ph, rc);
      if (m.is_moe()) {
        moe_forward(ph, rc);
      } else {
        mlp_forward(ph, rc, f);
      }
      residual_forward("mlp_residual", ph, rc);
    }

    // A dense MLP of inner width `w` (per rank) over the T tokens.
    void mlp_forward(op_phase ph, bool rc, double w) {
      if (m.mlp == mlp_kind::gelu) {
        linear_forward("mlp_fc1", "", ph, h, w, rc, false);  // bias fused into bias-GeLU
        vector("mlp_act", op_class::elementwise, ph, 8.0 * T * w, 2.0 * e * T * w, rc);
        linear_forward("mlp_fc2", "", ph, w, h, rc, false);
      } else {
        linear_forward("mlp_gate", "", ph, h, w, rc, false);
        linear_forward("mlp_up", "", ph, h, w, rc, false);
        vector("mlp_act", op_class::elementwise, ph, 6.0 * T * w, 3.0 * e * T * w, rc);
        linear_forward("mlp_down", "", ph, w, h, rc, false);
      }
    }
    void mlp_backward(double w) {
      if (m.mlp == mlp_kind::gelu) {
        linear_backward("mlp_fc2", "mlp_fc2_bias_grad", w, h);
        vector("mlp_act", op_class::elementwise, op_phase::backward_input, 12.0 * T * w, 3.0 * e * T * w, false);
        linear_backward("mlp_fc1", "mlp_fc1_bias_grad", h, w);
      } else {
        linear_backward("mlp_down", "mlp_down_bias_grad", w, h);
        vector("mlp_act", op_class::elementwise, op_phase::backward_input, 10.0 * T * w, 5.0 * e * T * w, false);
        linear_backward("mlp_up", "mlp_up_bias_grad", h, w);
        linear_backward("mlp_gate", "mlp_gate_bias_grad", h, w);
      }
    }

    // One grouped GEMM over the local experts; its model FLOPs discount the capacity padding.
    // Transformer Engine's GroupedLinear launches one cuBLAS GEMM per local expert from its C++
    // loop (general_grouped_gemm): one framework op, a launch per expert.
    void expert_gemm(std::string_view name, op_phase ph, double M, double N, double K, double c_bytes, bool rc,
                     const moe_layer_shape& x) {
      gemm(name, ph, M, N, K, c_bytes, rc, x.local_experts, !rc);
      op_cost& op = out.ops.back();
      op.model_flops *= x.model_fraction;
      const auto launches = static_cast<std::int32_t>(x.local_experts);
      op.cpu = detail::round_ns(static_cast<double>(op.cpu) + (launches - 1) * pr.cpu_launch_ns);
      op.kernels = launches;
    }

    // Tiny latency-bound kernels of one framework op: each at least min_kernel_ns on the GPU and
    // one launch on the host.
    void small_kernels(std::string_view name, op_phase ph, std::int32_t kernels, double bytes, bool rc) {
      vector(name, op_class::elementwise, ph, 0, bytes, rc);
      op_cost& op = out.ops.back();
      op.duration = std::max(op.duration, detail::round_ns(kernels * pr.min_kernel_ns));
      op.cpu = detail::round_ns(static_cast<double>(op.cpu) + (kernels - 1) * pr.cpu_launch_ns);
      op.kernels = kernels;
    }

    // Megatron's MoEAlltoAllTokenDispatcher (dropless): `preprocess` counts the tokens per expert
    // (routing_map.sum), and with EP or expert TP all-gathers the counts over the EP x expert-TP
    // group (moe_layer_collectives) and reduces them to the all-to-all's input and output splits
    // and the local experts' row counts; the splits and counts are copied to the host
    // (all_to_all_single and TE's GroupedLinear take them as host lists), so the host waits for
    // the device before it launches the dispatch (its cuda_sync_point): the permutation carries
    // the synchronisation (`op_cost::host_sync`). Launches: the count, its int64 cast, and with
    // EP or expert TP the local experts' slice, two sums and the split reshapes (7 kernels);
    // 3 device-to-host copies (2 without a dispatch). A capacity factor pads every expert to a
    // static size: no counts, no synchronisation.
    [[nodiscard]] bool dropless_sync() const noexcept { return m.moe.capacity_factor <= 0; }
    void token_counts(op_phase ph, bool rc, const moe_layer_shape& x) {
      if (!dropless_sync()) return;
      const bool dispatch = par.ep > 1 || par.expert_tp() > 1;
      const double E = static_cast<double>(m.moe.experts);
      small_kernels("moe_token_counts", ph, dispatch ? 10 : 4, x.tokens * E + 16.0 * E, rc);
    }

    // Megatron's sort_chunks_by_idxs with several local experts and EP: the received tokens come
    // grouped by source rank, the grouped GEMM wants them by expert; one copy of the rank's
    // copies after the dispatch, its inverse before the combine (and their gradients).
    [[nodiscard]] bool sorts_chunks(const moe_layer_shape& x) const noexcept {
      return m.moe.dispatcher == moe_dispatcher::alltoall && par.ep > 1 && x.local_experts > 1;
    }
    void sort_chunks(op_phase ph, bool rc, const moe_layer_shape& x) {
      if (sorts_chunks(x)) vector("moe_sort_chunks", op_class::elementwise, ph, 0, 2.0 * e * h * x.copies + 8.0 * x.copies, rc);
    }

    // Router, permutation, the rank's experts (grouped GEMMs), unpermutation, shared experts.
    void moe_forward(op_phase ph, bool rc) {
      const moe_layer_shape x = moe_shape(m, par);
      const double E = static_cast<double>(m.moe.experts), top = static_cast<double>(m.moe.top_k);
      gemm("moe_router", ph, x.tokens, E, h, e, rc);
      // softmax over the scores in fp32, top-k selection, the routing map and probabilities
      vector("moe_route", op_class::norm, ph, 8.0 * x.tokens * E, x.tokens * E * (e + 8.0) + 12.0 * x.tokens * top, rc, true);
      token_counts(ph, rc, x);
      vector("moe_permute", op_class::elementwise, ph, 0, e * h * (x.tokens + x.routed) + 8.0 * x.routed, rc);
      out.ops.back().host_sync = dropless_sync();
      sort_chunks(ph, rc, x);
      const bool gelu = m.mlp == mlp_kind::gelu;
      expert_gemm(gelu ? "moe_expert_fc1" : "moe_expert_gate", ph, x.rows, x.width, h, e, rc, x);
      if (!gelu) expert_gemm("moe_expert_up", ph, x.rows, x.width, h, e, rc, x);
      vector("moe_expert_act", op_class::elementwise, ph, (gelu ? 8.0 : 6.0) * x.copies * x.width,
             (gelu ? 2.0 : 3.0) * e * x.copies * x.width, rc);
      expert_gemm(gelu ? "moe_expert_fc2" : "moe_expert_down", ph, x.rows, h, x.width, e, rc, x);
      sort_chunks(ph, rc, x);
      vector("moe_unpermute", op_class::elementwise, ph, 2.0 * x.routed * h, e * h * (x.routed + x.tokens) + 4.0 * x.routed, rc);
      if (x.shared_width > 0) mlp_forward(ph, rc, x.shared_width);
    }

    void moe_backward() {
      const moe_layer_shape x = moe_shape(m, par);
      const double E = static_cast<double>(m.moe.experts), top = static_cast<double>(m.moe.top_k);
      const op_phase B = op_phase::backward_input, W = op_phase::backward_weight;
      if (x.shared_width > 0) mlp_backward(x.shared_width);
      // the gradient of each copy (scaled by its probability) and of the probabilities
      vector("moe_unpermute", op_class::elementwise, B, 2.0 * x.routed * h, e * h * (x.tokens + 2.0 * x.routed), false);
      sort_chunks(B, false, x);
      const bool gelu = m.mlp == mlp_kind::gelu;
      const std::string_view out_name = gelu ? "moe_expert_fc2" : "moe_expert_down";
      expert_gemm(out_name, B, x.rows, x.width, h, e, false, x);
      expert_gemm(out_name, W, x.width, h, x.rows, 8.0, false, x);
      vector("moe_expert_act", op_class::elementwise, B, (gelu ? 12.0 : 10.0) * x.copies * x.width,
             (gelu ? 3.0 : 5.0) * e * x.copies * x.width, false);
      if (!gelu) {
        expert_gemm("moe_expert_up", B, x.rows, h, x.width, e, false, x);
        expert_gemm("moe_expert_up", W, h, x.width, x.rows, 8.0, false, x);
      }
      const std::string_view in_name = gelu ? "moe_expert_fc1" : "moe_expert_gate";
      expert_gemm(in_name, B, x.rows, h, x.width, e, false, x);
      expert_gemm(in_name, W, h, x.width, x.rows, 8.0, false, x);
      sort_chunks(B, false, x);
      vector("moe_permute", op_class::elementwise, B, x.routed * h, e * h * (x.routed + x.tokens), false);
      vector("moe_route", op_class::norm, B, 6.0 * x.tokens * E, x.tokens * E * (2.0 * e + 4.0) + 8.0 * x.tokens * top, false, true);
      gemm("moe_router", B, x.tokens, h, E, e, false);
      gemm("moe_router", W, h, E, x.tokens, 8.0, false);
    }

    void layer_backward() {
      if (par.recompute == recompute_kind::full) layer_forward(op_phase::backward_input, true);
      residual_backward("mlp_residual");
      if (m.is_moe()) {
        moe_backward();
      } else {
        mlp_backward(f);
      }
      norm_backward("post_attn_norm", "post_attn_norm_weight_grad");
      residual_backward("attn_residual");
      if (m.is_mla()) {
        mla_backward();
        norm_backward("input_norm", "input_norm_weight_grad");
        return;
      }
      linear_backward("attn_out_proj", "attn_out_proj_bias_grad", q, h);
      if (par.recompute == recompute_kind::selective) attention_forward(op_phase::backward_input, true);
      attention_backward();
      linear_backward("qkv_proj", "qkv_bias_grad", h, q + 2.0 * kv);
      norm_backward("input_norm", "input_norm_weight_grad");
    }

    void embedding() {
      const double tok = 8.0;
      vector("word_embedding", op_class::elementwise, op_phase::forward, 0.0, tok * T + e * T * h / t + e * T * h, false);
      if (m.position == position_kind::learned) {
        vector("position_embedding", op_class::elementwise, op_phase::forward, Tn * h, 3.0 * e * Tn * h, false);
      }
      if (m.dropout) {
        vector("embedding_dropout", op_class::elementwise, op_phase::forward, 2.0 * Tn * h, 2.0 * e * Tn * h + Tn * h, false);
        vector("embedding_dropout", op_class::elementwise, op_phase::backward_input, 2.0 * Tn * h,
               2.0 * e * Tn * h + Tn * h, false);
      }
      if (m.position == position_kind::learned) {
        vector("position_embedding", op_class::elementwise, op_phase::backward_weight, Tn * h, e * Tn * h + 8.0 * s * h,
               false);
      }
      vector("word_embedding", op_class::elementwise, op_phase::backward_weight, T * h / t,
             tok * T + e * T * h + 8.0 * T * h / t, false);
    }

    void head() {
      output_head();
      for (std::int64_t i = 0; i < m.mtp_layers; ++i) mtp_module();
    }

    // A multi-token-prediction module's own ops (its block is a layer of the last chunk): the
    // lookup of the shifted tokens in the shared embedding, the norms of those embeddings and of
    // the hidden states, the column-parallel projection 2h -> h of their concatenation, and its
    // output head (final norm, the shared logits GEMM, the cross-entropy).
    void mtp_module() {
      vector("mtp_embedding", op_class::elementwise, op_phase::forward, T * h, 8.0 * T + 2.0 * e * T * h, false);
      norm_forward("mtp_norm", op_phase::forward, false);
      norm_forward("mtp_norm", op_phase::forward, false);
      gemm("mtp_eh_proj", op_phase::forward, T, h / t, 2.0 * h, e, false);
      gemm("mtp_eh_proj", op_phase::backward_input, T, 2.0 * h, h / t, e, false);
      gemm("mtp_eh_proj", op_phase::backward_weight, 2.0 * h, h / t, T, 8.0, false);
      norm_backward("mtp_norm", "mtp_norm_weight_grad");
      norm_backward("mtp_norm", "mtp_norm_weight_grad");
      vector("mtp_embedding", op_class::elementwise, op_phase::backward_weight, T * h / t, 8.0 * T + e * T * h + 8.0 * T * h / t, false);
      output_head();
    }

    void output_head() {
      norm_forward("final_norm", op_phase::forward, false);
      gemm("logits", op_phase::forward, T, V, h, e, false);
      // Megatron's vocabulary-parallel cross-entropy, as the trace shows it: max over the
      // shard, subtract, exp, sum, divide, gather of the target logit (fp32 working copies).
      const double TV = T * V;
      vector("cross_entropy", op_class::norm, op_phase::forward, TV, (e + 4.0) * TV, false);
      vector("cross_entropy_sub", op_class::elementwise, op_phase::forward, TV, 8.0 * TV, false);
      vector("cross_entropy_exp", op_class::elementwise, op_phase::forward, 4.0 * TV, 8.0 * TV, false);
      vector("cross_entropy_sum", op_class::norm, op_phase::forward, TV, 4.0 * TV, false);
      vector("cross_entropy_div", op_class::elementwise, op_phase::forward, TV, 8.0 * TV, false);
      vector("cross_entropy_bwd", op_class::elementwise, op_phase::backward_input, 2.0 * TV, (4.0 + e) * TV, false);
      gemm("logits", op_phase::backward_input, T, h, V, e, false);
      gemm("logits", op_phase::backward_weight, h, V, T, 8.0, false);
      norm_backward("final_norm", "final_norm_weight_grad");
    }
  };
};
static_assert(ComputeModel<kernel_level>);

}  // namespace lumos::model

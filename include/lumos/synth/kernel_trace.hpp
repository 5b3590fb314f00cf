#pragma once
// Kernel-level detail for synthesised traces (`lumos synth --detail kernel`): what makes the
// trace of a modelled job look like a Megatron-LM / PyTorch eager trace to lumos's own structure
// discovery and graph builder — each kernel with a realistic name and the CPU operator that
// dispatched it (with `Input Dims` giving the per-rank GEMM and attention shapes), module scopes
// around each transformer layer, forward/backward/optimizer markers, and collectives with the
// process-group args Kineto records.
//
// The map from the model's ops (`model::op_role`, phase, class) to kernel names, CPU operators
// and their input shapes is `kernel_names` below: the one place that names them.

#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/synth/program.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace lumos::synth {

/// Kernel names, CPU operators and their `Input Dims` for the ops of one job.
class kernel_names {
 public:
  kernel_names(const model::transformer& m, const model::parallel_config& par, const model::hardware& hw)
      : m_(m), par_(par) {
    std::string gpu;
    for (const char c : hw.name) gpu += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    sm90_ = gpu.find("h100") != std::string::npos || gpu.find("h200") != std::string::npos;
    switch (par.dtype) {
      case model::precision::fp16: dt_ = "f16", torch_ = "c10::Half", nccl_ = "f16", kineto_ = "Half"; break;
      // fp8 training: the fp8 GEMMs' kernels say e4m3; every other kernel works on bf16.
      case model::precision::fp8: dt_ = "bf16", torch_ = "c10::BFloat16", nccl_ = "bf16", kineto_ = "BFloat16", fp8_ = true; break;
      default: dt_ = "bf16", torch_ = "c10::BFloat16", nccl_ = "bf16", kineto_ = "BFloat16"; break;
    }
  }

  /// The cuBLAS GEMM kernel of the GPU for a layout ("tn" forward, "nn" input gradient, "nt"
  /// weight gradient); `fp8`: on e4m3 operands with a bf16 output.
  [[nodiscard]] std::string gemm_kernel(std::string_view layout, bool fp8 = false) const {
    const std::string l(layout);
    if (sm90_) {
      const std::string in = fp8 ? "e4m3e4m3_bf16f32" : dt_ + dt_ + "_" + dt_ + "f32";
      return "sm90_xmma_gemm_" + in + "_f32_" + l + "_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas";
    }
    if (dt_ == "f16") return "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x3_" + l;
    return "sm80_xmma_gemm_bf16bf16_bf16f32_f32_" + l + "_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel";
  }

  /// How compute op `o` appears in a trace: kernel name, dispatching operator, its input shapes.
  [[nodiscard]] report::task_decoration compute(const model::op_cost& o) const {
    using R = model::op_role;
    const bool fwd = o.phase == model::op_phase::forward || o.recompute || o.phase == model::op_phase::optimizer;
    if (o.role == R::moe_expert && o.kind == model::op_class::gemm) return grouped_gemm(o, fwd);
    if (o.kind == model::op_class::gemm || (o.kind == model::op_class::attention && o.shape.m > 0)) return gemm(o, fwd);
    switch (o.role) {
      case R::attention:
        return flash_attention(fwd);
      case R::input_norm:
      case R::post_attn_norm:
      case R::final_norm:
        return layer_norm(fwd);
      case R::cross_entropy:
      case R::cross_entropy_part:
        return cross_entropy(o);
      case R::fp8_cast:
      case R::fp8_amax:
        return fp8_cast(o);
      default:
        break;
    }
    report::task_decoration d = elementwise_op(o, fwd);
    if (d.input_dims.empty()) {
      d.input_dims = "[[" + std::to_string(tokens_norm()) + ", " + std::to_string(m_.hidden) + "]]";
      d.input_type = "[\"" + torch_ + "\"]";
    }
    return d;
  }

  /// A GEMM: cuBLAS's kernel of the layout, under aten::mm, or the unfused attention core's
  /// batched GEMMs (micro-batch × heads per rank) under aten::baddbmm / aten::bmm.
  [[nodiscard]] report::task_decoration gemm(const model::op_cost& o, bool fwd) const {
    using R = model::op_role;
    report::task_decoration d;
    const std::string t2 = "[\"" + torch_ + "\", \"" + torch_ + "\"]";
    const auto M = o.shape.m, N = o.shape.n, K = o.shape.k;
    if (o.kind == model::op_class::attention) {
      const std::int64_t bh = par_.micro_batch * (m_.heads / par_.tp);
      const std::string b = std::to_string(bh);
      d.kernel = gemm_kernel(o.phase == model::op_phase::forward || o.recompute ? "tn" : "nn");
      if (o.role == R::attention && fwd) {  // scores: baddbmm(input, Q, Kᵀ)
        d.cpu_op = "aten::baddbmm";
        d.input_dims = "[[" + b + ", " + std::to_string(M) + ", " + std::to_string(N) + "], [" + b + ", " + std::to_string(M) + ", " +
                       std::to_string(K) + "], [" + b + ", " + std::to_string(K) + ", " + std::to_string(N) + "], [], []]";
        d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\", \"" + torch_ + "\", \"Scalar\", \"Scalar\"]";
      } else {
        d.cpu_op = "aten::bmm";
        d.input_dims = "[[" + b + ", " + std::to_string(M) + ", " + std::to_string(K) + "], [" + b + ", " + std::to_string(K) + ", " +
                       std::to_string(N) + "]]";
        d.input_type = t2;
      }
      return d;
    }
    const bool wgrad = o.phase == model::op_phase::backward_weight;
    const bool fp8 = fp8_ && model::fp8_gemm(o.role);
    d.kernel = gemm_kernel(fwd ? "tn" : wgrad ? "nt" : "nn", fp8);
    d.cpu_op = "aten::mm";
    d.input_dims = "[[" + std::to_string(M) + ", " + std::to_string(K) + "], [" + std::to_string(K) + ", " + std::to_string(N) + "]]";
    d.input_type = fp8 ? "[\"c10::Float8_e4m3fn\", \"c10::Float8_e4m3fn\"]" : t2;
    return d;
  }

  /// Transformer Engine's kernel of an fp8 cast (with transpose) or amax reduction.
  [[nodiscard]] static std::string fp8_kernel(model::op_role r) {
    return r == model::op_role::fp8_amax
               ? "void transformer_engine::detail::amax_kernel<8, __nv_bfloat16>(__nv_bfloat16 const*, float*, float*, unsigned long, float const*, float const*)"
               : "void transformer_engine::detail::cast_transpose_kernel<8, 4, __nv_bfloat16, __nv_fp8_e4m3>(__nv_bfloat16 const*, __nv_fp8_e4m3*, __nv_fp8_e4m3*, float const*, float*, float*, unsigned long, unsigned long)";
  }
  /// Transformer Engine's operator that launches `fp8_kernel(r)`.
  [[nodiscard]] static std::string fp8_cpu_op(model::op_role r) {
    return r == model::op_role::fp8_amax ? "transformer_engine::compute_amax" : "transformer_engine::fp8_cast_transpose";
  }

  /// An fp8 cast or amax kernel over `elements` of an operand (its rows and columns are not
  /// kept: one dim of that many).
  [[nodiscard]] report::task_decoration fp8_cast(const model::op_cost& o) const {
    report::task_decoration d;
    d.kernel = fp8_kernel(o.role);
    d.cpu_op = fp8_cpu_op(o.role);
    const double per = o.role == model::op_role::fp8_amax ? model::fp8_amax_bytes_per_element : model::fp8_cast_bytes_per_element;
    d.input_dims = "[[" + std::to_string(static_cast<std::int64_t>(o.bytes / per)) + "]]";
    d.input_type = "[\"" + torch_ + "\"]";
    return d;
  }

  /// The experts of a MoE layer on this rank as one grouped GEMM (PyTorch's `aten::_grouped_mm`
  /// over CUTLASS's grouped kernel): tokens [experts × rows, K], weights [experts, K, N] and the
  /// per-expert offsets [experts], the shapes Megatron-LM's grouped MLP records.
  [[nodiscard]] report::task_decoration grouped_gemm(const model::op_cost& o, bool fwd) const {
    report::task_decoration d;
    const bool wgrad = o.phase == model::op_phase::backward_weight;
    const std::string layout = fwd ? "tn" : wgrad ? "nt" : "nn";
    d.kernel = "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass_tensorop_" + dt_ + "_gemm_grouped_128x128_" + layout + "> >";
    d.cpu_op = "aten::_grouped_mm";
    const std::int64_t E = std::max<std::int64_t>(1, m_.moe.experts / std::max(1, par_.ep));
    const std::string e = std::to_string(E), K = std::to_string(o.shape.k);
    d.input_dims = "[[" + std::to_string(E * o.shape.m) + ", " + K + "], [" + e + ", " + K + ", " + std::to_string(o.shape.n) + "], [" + e + "]]";
    d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\", \"int\"]";
    return d;
  }

  /// FlashAttention: q, k, v as [b, heads per rank, s / cp, head dim] (the rank's chunk).
  [[nodiscard]] report::task_decoration flash_attention(bool fwd) const {
    report::task_decoration d;
    const std::string q = "[" + std::to_string(par_.micro_batch) + ", " + std::to_string(m_.heads / par_.tp) + ", " +
                          std::to_string(par_.local_seq(m_)) + ", " + std::to_string(m_.head_dim()) + "]";
    const std::string kv = "[" + std::to_string(par_.micro_batch) + ", " + std::to_string(m_.kv_heads / par_.tp) + ", " +
                           std::to_string(par_.local_seq(m_)) + ", " + std::to_string(m_.head_dim()) + "]";
    const std::string traits = "Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::" +
                               std::string(dt_ == "f16" ? "half_t" : "bfloat16_t") + ">";
    if (fwd) {
      d.kernel = "void flash_fwd_kernel<" + traits + ", true, false, false, false, true, true, false>";
      d.cpu_op = "aten::_scaled_dot_product_flash_attention";
      d.input_dims = "[" + q + ", " + kv + ", " + kv + ", [], [], []]";
      d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\", \"" + torch_ + "\", \"Scalar\", \"Scalar\", \"\"]";
    } else {
      d.kernel = "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, "
                 "false, cutlass::" + std::string(dt_ == "f16" ? "half_t" : "bfloat16_t") + ">, true, false, false, false, true>";
      d.cpu_op = "aten::_scaled_dot_product_flash_attention_backward";
      d.input_dims = "[" + q + ", " + q + ", " + kv + ", " + kv + ", " + q + "]";
      d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\", \"" + torch_ + "\", \"" + torch_ + "\", \"" + torch_ + "\"]";
    }
    return d;
  }

  /// A LayerNorm forward or input gradient over tokens × hidden.
  [[nodiscard]] report::task_decoration layer_norm(bool fwd) const {
    report::task_decoration d;
    const std::string T = std::to_string(tokens_norm()), h = std::to_string(m_.hidden);
    if (fwd) {
      d.kernel = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<" + torch_ + ", float>";
      d.cpu_op = "aten::native_layer_norm";
      d.input_dims = "[[" + T + ", " + h + "], [" + h + "], [" + h + "], [" + h + "], []]";
      d.input_type = "[\"" + torch_ + "\", \"\", \"" + torch_ + "\", \"" + torch_ + "\", \"Scalar\"]";
    } else {
      d.kernel = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<" + torch_ + ", float>";
      d.cpu_op = "aten::native_layer_norm_backward";
      d.input_dims = "[[" + T + ", " + h + "], [" + T + ", " + h + "]]";
      d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\"]";
    }
    return d;
  }

  /// The vocabulary-parallel cross-entropy's kernels. They sweep the logits' vocabulary shard,
  /// all tokens by vocab / TP (fp32 working copies), not the hidden activations (read as those,
  /// `lumos calibrate` would take them for 25x too slow for their bytes).
  [[nodiscard]] report::task_decoration cross_entropy(const model::op_cost& o) const {
    struct part {
      std::string_view suffix, op, functor;
    };
    constexpr part parts[] = {{"_sub", "aten::sub", "at::native::CUDAFunctor_sub<float>"},
                              {"_exp", "aten::exp", "at::native::exp_kernel_cuda"},
                              {"_div", "aten::div", "at::native::BinaryFunctor<float, float, float, at::native::DivFunctor<float> >"},
                              {"_bwd", "aten::mul", "at::native::BinaryFunctor<float, float, float, at::native::MulFunctor<float> >"}};
    report::task_decoration d;
    d.kernel = reduce_kernel();
    d.cpu_op = o.role == model::op_role::cross_entropy ? "aten::max" : "aten::sum";
    for (const part& p : parts) {
      if (o.name.ends_with(p.suffix)) d.kernel = elementwise_kernel(p.functor, 3), d.cpu_op = std::string(p.op);
    }
    d.input_dims = "[[" + std::to_string(par_.micro_batch * par_.local_seq(m_)) + ", " + std::to_string(m_.vocab / par_.tp) + "]]";
    d.input_type = "[\"float\"]";
    return d;
  }

  /// Elementwise, reduction, softmax, dropout, embedding and optimizer kernels: kernel and
  /// operator (the caller adds tokens × hidden as their input when none is set).
  [[nodiscard]] report::task_decoration elementwise_op(const model::op_cost& o, bool fwd) const {
    using R = model::op_role;
    report::task_decoration d;
    switch (o.role) {
      case R::norm_weight_grad:
        d.kernel = "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<" + torch_ + ", float>";
        d.cpu_op = "aten::native_layer_norm_backward";
        d.input_dims = "[[" + std::to_string(tokens_norm()) + ", " + std::to_string(m_.hidden) + "], [" + std::to_string(tokens_norm()) +
                       ", " + std::to_string(m_.hidden) + "]]";
        d.input_type = "[\"" + torch_ + "\", \"" + torch_ + "\"]";
        break;
      case R::attention_softmax:
        d.kernel = fwd ? "void (anonymous namespace)::softmax_warp_forward<" + torch_ + ", " + torch_ + ", float, 11, false, true>"
                       : "void (anonymous namespace)::softmax_warp_backward<" + torch_ + ", " + torch_ + ", float, 11, false, true>";
        d.cpu_op = fwd ? "aten::_softmax" : "aten::_softmax_backward_data";
        break;
      case R::attention_dropout:
      case R::embedding_dropout:
        d.kernel = "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<" + torch_ + ", float, unsigned int, 1, 4, bool>";
        d.cpu_op = fwd ? "aten::native_dropout" : "aten::native_dropout_backward";
        break;
      case R::attention_copy:
        d.kernel = elementwise_kernel("at::native::direct_copy_kernel_cuda", 2);
        d.cpu_op = "aten::copy_";
        break;
      case R::qkv_bias:
      case R::residual:
      case R::position_embedding:
        d.kernel = elementwise_kernel("at::native::CUDAFunctor_add<" + torch_ + ">", 3);
        d.cpu_op = "aten::add";
        break;
      case R::bias_grad:
        d.kernel = reduce_kernel();
        d.cpu_op = "aten::sum";
        break;
      case R::moe_route:  // the top-k of the router's scores (backward: scattered back)
        d.kernel = fwd ? "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>"
                       : "void at::native::_scatter_gather_elementwise_kernel<128, 4>";
        d.cpu_op = fwd ? "aten::topk" : "aten::scatter";
        d.input_dims = "[[" + std::to_string(static_cast<std::int64_t>(model::moe_shape(m_, par_).tokens)) + ", " +
                       std::to_string(m_.moe.experts) + "], [], [], [], []]";
        d.input_type = "[\"float\", \"Scalar\", \"Scalar\", \"Scalar\", \"Scalar\"]";
        break;
      case R::moe_permute:
      case R::moe_unpermute: {  // gathers token copies into expert order; adds them back
        const bool gather = (o.role == R::moe_permute) == fwd;
        d.kernel = gather ? "void at::native::(anonymous namespace)::indexSelectLargeIndex<" + torch_ + ", long, unsigned int, 2, 2, -2, true>"
                          : "void at::native::(anonymous namespace)::indexFuncLargeIndex<" + torch_ + ", long, unsigned int, 2, 2, -2, true>";
        d.cpu_op = gather ? "aten::index_select" : "aten::index_add_";
        break;
      }
      case R::moe_expert_act:
      case R::mlp_act: {
        const bool gelu = m_.mlp == model::mlp_kind::gelu;
        d.kernel = elementwise_kernel(std::string("at::native::") + (gelu ? "Gelu" : "Silu") + (fwd ? "" : "Backward") + "CUDAKernelImpl", fwd ? 2 : 3);
        d.cpu_op = std::string("aten::") + (gelu ? "gelu" : "silu") + (fwd ? "" : "_backward");
        break;
      }
      case R::word_embedding:
        d.kernel = fwd ? "void at::native::(anonymous namespace)::indexSelectLargeIndex<" + torch_ + ", long, unsigned int, 2, 2, -2, true>"
                       : "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<" + torch_ + ", float, long>";
        d.cpu_op = fwd ? "aten::embedding" : "aten::embedding_dense_backward";
        break;
      case R::loss_scale_unscale:
      case R::grad_clip:
        d.kernel = "void multi_tensor_apply_kernel<TensorListMetadata<2>, ScaleFunctor<float, float>, float>";
        d.cpu_op = "multi_tensor_scale";
        break;
      case R::found_inf:
        d.kernel = reduce_kernel();
        d.cpu_op = "aten::_amp_foreach_non_finite_check_and_unscale_";
        break;
      case R::grad_norm:
        d.kernel = "void multi_tensor_apply_kernel<TensorListMetadata<1>, L2NormFunctor<float, 512, 1>, float*, float*, bool, int>";
        d.cpu_op = "multi_tensor_l2norm";
        break;
      case R::optimizer_step:
        d.kernel = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, float>, int, float, float, "
                   "float, float, float, float, adamMode_t, float>";
        d.cpu_op = "multi_tensor_adam";
        break;
      default:
        d.kernel = elementwise_kernel("at::native::FillFunctor<" + torch_ + ">", 1);
        d.cpu_op = "aten::fill_";
        break;
    }
    return d;
  }

  /// ATen's vectorized elementwise kernel of `functor` with `arity` operands.
  [[nodiscard]] static std::string elementwise_kernel(std::string_view functor, int arity) {
    return "void at::native::vectorized_elementwise_kernel<4, " + std::string(functor) + ", at::detail::Array<char*, " +
           std::to_string(arity) + "> >";
  }

  /// ATen's sum reduction in the activation dtype, accumulated in fp32.
  [[nodiscard]] std::string reduce_kernel() const {
    return "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<" + torch_ + ", at::native::func_wrapper_t<float, at::native::sum_functor<" +
           torch_ + ", float, float> >, unsigned int, " + torch_ + ", 4> >";
  }

  /// How a collective appears: NCCL kernel, the c10d operator, the process group's description.
  [[nodiscard]] report::task_decoration collective(std::string_view kind, const program_notes::comm& c, bool send) const {
    report::task_decoration d;
    const std::string dt = c.element_bytes == 4 ? "f32" : nccl_;
    d.dtype = c.element_bytes == 4 ? "Float" : kineto_;
    d.element_bytes = c.element_bytes;
    if (kind == "allreduce") {
      d.kernel = "ncclDevKernel_AllReduce_Sum_" + dt + "_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = "nccl:all_reduce";
    } else if (kind == "allgather") {
      d.kernel = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = "nccl:_all_gather_base";
    } else if (kind == "reduce_scatter") {
      d.kernel = "ncclDevKernel_ReduceScatter_Sum_" + dt + "_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = "nccl:_reduce_scatter_base";
    } else if (kind == "send_recv") {
      d.kernel = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = send ? "nccl:send" : "nccl:recv";
    } else if (kind == "alltoall") {
      d.kernel = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = "nccl:all_to_all";
    } else {
      d.kernel = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)";
      d.cpu_op = "nccl:coalesced";
    }
    // Megatron-LM's process group names (torch.distributed's group_desc).
    switch (c.group) {
      case comm_group::tp: d.group_description = "TENSOR_MODEL_PARALLEL_GROUP"; break;
      case comm_group::dp: d.group_description = "DATA_PARALLEL_GROUP"; break;
      case comm_group::pp: d.group_description = "PIPELINE_MODEL_PARALLEL_GROUP"; break;
      case comm_group::model_parallel: d.group_description = "MODEL_PARALLEL_GROUP"; break;
      case comm_group::world: d.group_description = "default_pg"; break;
      case comm_group::embedding: d.group_description = "EMBEDDING_GROUP"; break;
      case comm_group::expert_dp: d.group_description = "EXPERT_DATA_PARALLEL_GROUP"; break;
      case comm_group::context_parallel: d.group_description = "CONTEXT_PARALLEL_GROUP"; break;
      case comm_group::ep: d.group_description = "EXPERT_MODEL_PARALLEL_GROUP"; break;
      case comm_group::expert_tp: d.group_description = "EXPERT_TENSOR_PARALLEL_GROUP"; break;
    }
    return d;
  }

  /// The annotation a span of CPU tasks is written as.
  [[nodiscard]] static std::string span_name(span_kind k) {
    switch (k) {
      case span_kind::forward: return "## forward ##";
      case span_kind::backward: return "## backward ##";
      case span_kind::layer: return "ParallelTransformerLayer";
      case span_kind::layer_recompute: return "ParallelTransformerLayer (recompute)";
      case span_kind::optimizer: return "Optimizer.step#DistributedOptimizer.step";
    }
    return "?";
  }

 private:
  // Rows of the activations that norms and elementwise ops see (sequence parallelism splits them).
  [[nodiscard]] std::int64_t tokens_norm() const {
    const std::int64_t T = par_.micro_batch * par_.local_seq(m_);
    return par_.sequence_parallel() ? T / par_.tp : T;
  }

  model::transformer m_;
  model::parallel_config par_;
  bool sm90_ = false;
  bool fp8_ = false;
  std::string dt_, torch_, nccl_, kineto_;
};

/// The decorations of a program built with `program_options::notes` (kernel granularity) for
/// `report::write_kineto`. `launch_ns`: host time of the runtime call that ends each launch task
/// (the rest of the task is the operator's dispatch); negative: the whole task is the call.
[[nodiscard]] inline report::trace_decorations kernel_trace_decorations(const program& p, const job& j, time_ns launch_ns) {
  const graph::task_graph& g = p.graph;
  const program_notes& notes = p.notes;
  report::trace_decorations out;
  out.of_task.assign(g.task_count(), report::trace_decorations::none);
  if (notes.op_of_task.empty()) return out;
  const kernel_names names(j.model, j.parallel, j.hardware);
  std::map<std::uint32_t, std::uint32_t> of_op;    // op note → decoration
  std::map<std::string, std::uint32_t> of_comm;    // kind, group, element bytes, direction → decoration
  std::map<graph::task_id, const graph::collective_instance*> instance_of;
  for (const auto& ci : g.collectives) {
    for (const auto t : ci.arrive) instance_of[t] = &ci;
    for (const auto t : ci.complete) instance_of[t] = &ci;
  }
  auto add = [&](report::task_decoration d) {
    d.launch_ns = launch_ns;
    out.list.push_back(std::move(d));
    return static_cast<std::uint32_t>(out.list.size() - 1);
  };
  for (const auto& e : g.edges) {
    if (e.kind != graph::edge_kind::launch) continue;
    const graph::task_id gpu = e.to;
    std::uint32_t deco = report::trace_decorations::none;
    if (gpu < notes.op_of_task.size() && notes.op_of_task[gpu] != program_notes::none) {
      const std::uint32_t op = notes.op_of_task[gpu];
      const auto it = of_op.find(op);
      deco = it != of_op.end() ? it->second : (of_op[op] = add(names.compute(notes.ops[op])));
    } else if (gpu < notes.comm_of_task.size() && notes.comm_of_task[gpu] != program_notes::none) {
      const program_notes::comm& c = notes.comms[notes.comm_of_task[gpu]];
      const auto ci = instance_of.find(gpu);
      const std::string kind = ci != instance_of.end() ? ci->second->kind : std::string("?");
      // Streams 21 and 22 send to the next and previous stage (program.hpp).
      const std::int64_t stream = g.processors[g.processor[gpu]].index;
      const bool send = stream == 21 || stream == 22;
      const std::string key = kind + "/" + std::to_string(static_cast<int>(c.group)) + "/" + std::to_string(c.element_bytes) +
                              (send ? "/s" : "/r");
      const auto it = of_comm.find(key);
      deco = it != of_comm.end() ? it->second : (of_comm[key] = add(names.collective(kind, c, send)));
      // The complete (written as the kernel) carries the collective's args.
      if (ci != instance_of.end()) {
        for (std::size_t k = 0; k < ci->second->arrive.size(); ++k) {
          if (ci->second->arrive[k] == gpu) out.of_task[ci->second->complete[k]] = deco;
        }
      }
    }
    if (deco == report::trace_decorations::none) continue;
    out.of_task[gpu] = deco;
    out.of_task[e.from] = deco;
  }
  // Host waits are left undecorated: the writer writes each as the call its sync edges make it
  // (report/trace_writer.hpp), a cudaStreamSynchronize of the one stream it waits for (a receive's,
  // the compute stream) or a cudaDeviceSynchronize of several (the step's end), with its cuda_sync
  // row. Megatron calls torch.cuda.synchronize() after a receive, which drains every stream (the
  // sends, the data-parallel reductions too); the model waits for the receive and the compute
  // stream only, and a trace that named its wait a device synchronize would give the graph builder
  // edges from streams the model never waited for (docs/model.md).
  for (const auto& s : notes.spans) out.spans.push_back({s.rank, kernel_names::span_name(s.kind), "user_annotation", s.first, s.last});
  return out;
}

}  // namespace lumos::synth

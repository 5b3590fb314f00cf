#pragma once
// Structure discovery, memory recipe: whether the step is PyTorch eager training with a
// `torch.optim` optimizer, and the data types that decide what it keeps in memory (its
// optimizer's states, the residual stream, the loss's logits), read from the first rank's CPU
// operators and kernel names. Selects the memory model of model/eager_memory.hpp.

#include <lumos/core/strings.hpp>
#include <lumos/model/eager_memory.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <string>
#include <string_view>

namespace lumos::whatif {

namespace detail {

[[nodiscard]] inline double dtype_bytes(std::string_view dtype) {
  return dtype == "fp32" || dtype == "tf32" ? 4.0 : dtype == "fp8" ? 1.0 : 2.0;
}

/// What one pass over the first rank's events reads for the recipe.
struct recipe_scan {
  std::string optimizer;              ///< X of the `Optimizer.step#X.step` annotation
  std::string implementation;         ///< "foreach", "fused" or "for-loop"
  std::string state_dtype, state_src;  ///< the optimizer kernels' data type
  std::string residual_dtype, residual_src;
  std::string loss_dtype, loss_src;
  std::string cast_dtype, cast_src;   ///< autocast's casts from fp32 (`bfloat16_copy_kernel_cuda`)
  bool tied = false;                  ///< an add of two vocab x hidden gradients: tied embeddings
};

/// Whether CPU op `i` adds two vocab x hidden matrices out of place: the autograd engine summing
/// the two gradients of a tied embedding (a gradient accumulated over micro-batches is added in
/// place, `aten::add_`, and does not count). A vocabulary is taken as more than 4 x hidden rows.
[[nodiscard]] inline bool adds_tied_gradients(const trace::rank_trace& t, std::size_t i, std::int64_t hidden) {
  if (hidden <= 0 || t.name(t.events[i]) != "aten::add") return false;
  const auto dims = parse_dims(t.arg_text(i, trace::arg_key::input_dims));
  return dims.size() >= 2 && dims[0].size() == 2 && dims[0] == dims[1] && dims[0][1] == hidden && dims[0][0] > 4 * hidden;
}

[[nodiscard]] inline recipe_scan scan_recipe(const trace::rank_trace& t, std::int64_t hidden) {
  recipe_scan r;
  bool foreach = false, fused = false;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace::event& e = t.events[i];
    const std::string_view n = t.name(e);
    if (e.cat == trace::category::kernel) {
      const std::string l = lower(n);
      if (r.state_dtype.empty() && (l.find("multi_tensor_apply") != std::string::npos || l.find("fusedadam") != std::string::npos)) {
        r.state_dtype = dtype_of_kernel(n);
        r.state_src = "optimizer kernel '" + std::string(n.substr(0, 60)) + "'";
      }
      const bool norm = l.find("layer_norm") != std::string::npos || l.find("rms_norm") != std::string::npos || l.find("rmsnorm") != std::string::npos;
      if (r.residual_dtype.empty() && norm && l.find("grad") == std::string::npos && l.find("backward") == std::string::npos) {
        r.residual_dtype = dtype_of_kernel(n);
        r.residual_src = "norm kernel '" + std::string(n.substr(0, 60)) + "'";
      }
      if (r.cast_dtype.empty() && (l.find("bfloat16_copy_kernel") != std::string::npos || l.find("float16_copy_kernel") != std::string::npos)) {
        r.cast_dtype = l.find("bfloat16_copy_kernel") != std::string::npos ? "bf16" : "fp16";
        r.cast_src = "cast kernel '" + std::string(n.substr(0, 60)) + "'";
      }
      if (r.loss_dtype.empty() && l.find("logsoftmaxforward") != std::string::npos) {
        r.loss_dtype = dtype_of_kernel(n);
        r.loss_src = "log-softmax kernel '" + std::string(n.substr(0, 60)) + "'";
      }
      continue;
    }
    if (e.cat != trace::category::cpu_op && e.cat != trace::category::user_annotation) continue;
    if (r.optimizer.empty() && n.starts_with("Optimizer.step#")) {
      const std::string_view rest = n.substr(15);
      r.optimizer = std::string(rest.substr(0, rest.find('.')));
    }
    foreach = foreach || n == "aten::_foreach_sqrt";
    fused = fused || n.starts_with("aten::_fused_adam");
    r.tied = r.tied || adds_tied_gradients(t, i, hidden);
  }
  r.implementation = fused ? "fused" : foreach ? "foreach" : "for-loop";
  return r;
}

}  // namespace detail

/// Fills `out.memory`: the recipe of model/eager_memory.hpp when the first rank's step runs a
/// `torch.optim` optimizer (an `Optimizer.step#X.step` annotation) of the Adam family with known
/// optimizer and residual data types; otherwise unknown, and the memory summaries use the
/// Megatron model (model/memory.hpp). Runs after `discover_model_shape` (GEMM data type, and
/// hidden for the tied-embedding test). Linear in the first rank's events.
inline void discover_memory_recipe(const discovery_inputs& in, job_structure& out) {
  auto& mr = out.memory;
  if (in.job.ranks.empty()) return;
  const auto& t = in.job.ranks.front();
  const detail::recipe_scan s = detail::scan_recipe(t, out.model.hidden.value.value_or(0));
  if (s.optimizer.empty()) {
    mr.optimizer.source = "no torch.optim step (Optimizer.step#...) on rank " + std::to_string(t.rank) + ": Megatron's memory model applies";
    return;
  }
  mr.optimizer.value = s.optimizer + " (torch.optim, " + s.implementation + ")";
  mr.optimizer.source = "annotation 'Optimizer.step#" + s.optimizer + ".step'";
  const bool adam = detail::lower(s.optimizer).starts_with("adam");
  // GEMM kernels whose names say no data type (cuBLAS's nvjet) compute in autocast's.
  const std::string gemm = out.model.dtype.value.value_or(s.cast_dtype);
  if (!adam || s.state_dtype.empty() || s.residual_dtype.empty() || gemm.empty()) {
    mr.optimizer.source += "; not modelled (" +
                           std::string(!adam ? "not an Adam optimizer" : s.state_dtype.empty() ? "no optimizer kernel" :
                                       s.residual_dtype.empty() ? "no norm kernel" : "GEMM data type unknown") + "): Megatron's memory model applies";
    return;
  }
  model::eager_recipe r;
  r.param = r.grad = detail::dtype_bytes(s.state_dtype);
  r.optimizer = 2.0 * r.param;
  r.optimizer_temp = s.implementation == "foreach" ? r.param : 0.0;
  r.residual = detail::dtype_bytes(s.residual_dtype);
  r.gemm = detail::dtype_bytes(gemm);
  r.loss = s.loss_dtype.empty() ? r.residual : detail::dtype_bytes(s.loss_dtype);
  r.weight_copies = r.gemm < r.param;
  mr.recipe = r;
  mr.tied_embeddings = s.tied;
  mr.states.value = s.state_dtype + " parameters, gradients and Adam moments" + (r.optimizer_temp > 0 ? ", one full-size temporary in the step" : "");
  mr.states.source = s.state_src;
  mr.residual.value = s.residual_dtype + " residual stream" + (r.weight_copies ? " (autocast: " + gemm + " copies of the GEMM weights kept for backward)" : "");
  mr.residual.source = s.residual_src + (out.model.dtype.known() || !r.weight_copies ? "" : "; GEMMs in " + gemm + " from the " + s.cast_src);
  mr.loss.value = (s.loss_dtype.empty() ? s.residual_dtype : s.loss_dtype) + " logits for the loss";
  mr.loss.source = s.loss_dtype.empty() ? "no log-softmax kernel: the residual's data type assumed" : s.loss_src;
  mr.embeddings.value = s.tied ? "tied" : "untied";
  mr.embeddings.source = s.tied ? "an add of two vocab x hidden gradients in the backward" : "no add of two vocab x hidden gradients";
}

}  // namespace lumos::whatif

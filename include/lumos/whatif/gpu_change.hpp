#pragma once
// The GPU what-if (`lumos whatif --gpu PRESET`): every measured GPU op is rescaled by what bounds
// it on the source GPU, at the speed the cost profiles (model/profile.hpp) give each kind of
// kernel on each GPU — GEMMs and other tensor-core kernels by dense peak × GEMM efficiency,
// FlashAttention by peak × its forward or backward efficiency, memory-bound kernels by HBM
// bandwidth × the fraction their class reaches (elementwise, norms and reductions, softmax,
// optimizer), communication transfers by the NCCL bus bandwidth (all-reduce's own, which NVLS
// raises) — while CPU time, launches and the kept overheads stay (the host does not change).
// These are the rates `lumos synth` and `predict` time the same kernels with, so a job the model
// wrote for one GPU and rescaled to another matches the one it writes for that GPU, the
// algorithm unchanged (a trace's attention stays FlashAttention or unfused, as traced). Each
// kernel keeps a fixed part, the source GPU's per-kernel overhead, that no faster GPU removes.

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/structure/classify.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// What bounds a GPU op, as far as its name tells.
enum class op_bound : std::uint8_t { compute, memory, host_copy, communication };

[[nodiscard]] constexpr std::string_view to_string(op_bound b) noexcept {
  switch (b) {
    case op_bound::compute: return "compute";
    case op_bound::memory: return "memory";
    case op_bound::host_copy: return "host_copy";
    case op_bound::communication: return "communication";
  }
  return "?";
}

namespace detail {
using lumos::lower_ascii;
}  // namespace detail

/// Classifies a GPU op by its kind and name: library GEMM/convolution/attention kernels are
/// compute-bound (cuBLAS/CUTLASS names carry the architecture and tile: `sm90_xmma_gemm_…`,
/// `ampere_bf16_s16816gemm_…`, `volta_sgemm_…`, `flash_fwd_kernel`, `fmha_…`); copies between
/// host and device are bound by the host link, which a GPU change does not change; everything
/// else (elementwise, reductions, norms, optimizers, device copies and sets) by HBM bandwidth.
[[nodiscard]] inline op_bound classify(graph::task_kind kind, std::string_view name) {
  if (kind == graph::task_kind::gpu_comm || kind == graph::task_kind::comm_complete) return op_bound::communication;
  const std::string n = detail::lower_ascii(name);
  if (n.starts_with("memcpy")) {
    const bool host = n.find("htod") != std::string::npos || n.find("dtoh") != std::string::npos ||
                      n.find("pageable") != std::string::npos || n.find("pinned") != std::string::npos;
    return host ? op_bound::host_copy : op_bound::memory;
  }
  // nvjet: cuBLAS's GEMM kernels since CUDA 12.8 (nvjet_sm90_tst_...); sdpa: cuDNN's attention.
  static constexpr std::array<std::string_view, 16> compute_marks = {
      "gemm", "xmma", "cutlass", "cublas", "s16816", "s1688", "hmma", "conv", "wgrad", "dgrad", "flash", "fmha", "attention", "mma_",
      "nvjet", "sdpa"};
  for (const std::string_view m : compute_marks) {
    if (n.find(m) != std::string::npos) return op_bound::compute;
  }
  return op_bound::memory;
}

/// The duration multipliers of a GPU change (time on the target / time on the source), per kind
/// of GPU op.
struct gpu_ratios {
  double compute = 1.0;             ///< GEMMs, convolutions and other tensor-core kernels
  double attention_forward = 1.0;   ///< FlashAttention / fused attention forward
  double attention_backward = 1.0;  ///< and backward
  double memory = 1.0;              ///< elementwise kernels, device copies and sets
  double norm = 1.0;                ///< norms and reductions
  double softmax = 1.0;
  double optimizer = 1.0;           ///< multi-tensor optimizer steps
  double communication = 1.0;       ///< transfers of collectives other than all-reduce, and p2p
  double allreduce = 1.0;           ///< all-reduce transfers
  time_ns fixed = 0;                ///< per-kernel overhead of the source GPU, kept
};

/// The ratios of a change from `from` (its costs `pf`: its preset's profile, or the user's
/// calibrated one) to `to` (`pt`). Each is the source's rate over the target's, the rate being
/// the peak times the efficiency the profile gives that kind of kernel (model/kernel_costs.hpp).
[[nodiscard]] inline gpu_ratios ratios(const model::hardware& from, const model::cost_profile& pf, const model::hardware& to,
                                       const model::cost_profile& pt) {
  auto over = [](double source_rate, double target_rate) { return source_rate > 0 && target_rate > 0 ? source_rate / target_rate : 1.0; };
  const double tf = from.gpu.bf16_flops * pf.at_scale, tt = to.gpu.bf16_flops * pt.at_scale;
  const double hf = from.gpu.hbm_bandwidth, ht = to.gpu.hbm_bandwidth;
  auto allreduce_bw = [](const model::nccl_link& l) { return l.allreduce_busbw > 0 ? l.allreduce_busbw : l.busbw; };
  gpu_ratios r;
  r.compute = over(tf * pf.gemm_max, tt * pt.gemm_max);
  r.attention_forward = over(tf * pf.flash_forward, tt * pt.flash_forward);
  r.attention_backward = over(tf * pf.flash_backward, tt * pt.flash_backward);
  r.memory = over(hf * pf.elementwise_bw, ht * pt.elementwise_bw);
  r.norm = over(hf * pf.norm_bw, ht * pt.norm_bw);
  r.softmax = over(hf * pf.softmax_bw, ht * pt.softmax_bw);
  r.optimizer = over(hf * pf.optimizer_bw, ht * pt.optimizer_bw);
  r.communication = over(pf.intra.busbw, pt.intra.busbw);
  r.allreduce = over(allreduce_bw(pf.intra), allreduce_bw(pt.intra));
  r.fixed = from.kernel_launch_overhead;
  return r;
}

/// The ratios between two hardware presets, with their preset profiles.
[[nodiscard]] inline gpu_ratios ratios(const model::hardware& from, const model::hardware& to) {
  return ratios(from, model::profile_preset(from.name), to, model::profile_preset(to.name));
}

/// The multiplier of one GPU op of `bound` called `name` (lower case).
[[nodiscard]] inline double ratio_of(const gpu_ratios& r, op_bound bound, std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  switch (bound) {
    case op_bound::host_copy: return 1.0;
    case op_bound::communication: return has("allreduce") || has("all_reduce") ? r.allreduce : r.communication;
    case op_bound::compute:
      if (has("flash") || has("fmha") || has("attention") || has("sdpa")) {
        return has("bwd") || has("backward") ? r.attention_backward : r.attention_forward;
      }
      return r.compute;
    case op_bound::memory:
      if (has("softmax")) return r.softmax;
      if (has("norm") || has("gammabeta") || has("reduce_kernel")) return r.norm;
      if (has("multi_tensor") || has("adam")) return r.optimizer;
      return r.memory;
  }
  return 1.0;
}

/// Whether the traces run FlashAttention (or another fused attention kernel): a name of theirs
/// says so (their string tables, a few thousand names, not their events).
[[nodiscard]] inline bool traced_flash_attention(const trace::job& job) {
  for (const auto& r : job.ranks) {
    for (string_id i = 0; i < r.strings.size(); ++i) {
      const std::string n = detail::lower_ascii(r.strings[i]);
      if (n.find("flash") != std::string::npos || n.find("fmha") != std::string::npos) return true;
    }
  }
  return false;
}

/// The name of an fp8 GEMM kernel of `g`, or empty: a target GPU without fp8 tensor cores has no
/// rate for it (the traces' training precision would not run there).
[[nodiscard]] inline std::string fp8_gemm(const graph::task_graph& g) {
  std::vector<bool> seen(g.strings.size(), false);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] != graph::task_kind::gpu_compute || g.name[t] >= seen.size() || seen[g.name[t]]) continue;
    seen[g.name[t]] = true;
    const std::string_view name = g.task_name(t);
    if (detail::is_gemm_kernel(name) && detail::dtype_of_kernel(name) == "fp8") return std::string(name);
  }
  return {};
}

/// What a GPU change did.
struct gpu_change_stats {
  std::size_t compute = 0, memory = 0, host_copy = 0, communication = 0;
  time_ns before = 0, after = 0;  ///< summed GPU op time
};

/// Rescales every GPU op of `g` (see the header comment). Deterministic; O(tasks).
inline gpu_change_stats change_gpu(graph::task_graph& g, const gpu_ratios& r) {
  gpu_change_stats st;
  std::vector<std::optional<std::pair<op_bound, double>>> cached;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    const auto k = g.kind[t];
    if (k != graph::task_kind::gpu_compute && k != graph::task_kind::gpu_comm && k != graph::task_kind::comm_complete) continue;
    const time_ns d = g.duration[t];
    st.before += d;
    // Classified once per (name, communication or not): a job repeats a few hundred names.
    const std::size_t key = 2 * std::size_t{g.name[t]} + (k == graph::task_kind::gpu_compute ? 0 : 1);
    if (key >= cached.size()) cached.resize(std::max(key + 1, 2 * g.strings.size()));
    if (!cached[key]) {
      const op_bound b = classify(k, g.task_name(t));
      cached[key] = std::pair{b, ratio_of(r, b, detail::lower_ascii(g.task_name(t)))};
    }
    const auto [bound, f] = *cached[key];
    switch (bound) {
      case op_bound::compute: ++st.compute; break;
      case op_bound::memory: ++st.memory; break;
      case op_bound::host_copy: ++st.host_copy; break;
      case op_bound::communication: ++st.communication; break;
    }
    const time_ns fixed = k == graph::task_kind::gpu_compute ? std::min(d, r.fixed) : 0;
    g.duration[t] = fixed + static_cast<time_ns>(std::llround(static_cast<double>(d - fixed) * f));
    st.after += g.duration[t];
  }
  return st;
}

/// Pass: another GPU (`--gpu`). Each GPU op runs at the rate the two GPUs' cost profiles give its
/// kind (`ratios`: the traced cluster's profile, the user's calibrated one when given, against
/// the target's preset); the kernels the traces ran (FlashAttention or not), the CPU time and the
/// launch overheads stay. It runs last, on the rewritten graph's every GPU op.
struct gpu_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept { return ctx.target_gpu.has_value(); }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const model::hardware& from = *ctx.traced_gpu;
    const model::hardware& to = *ctx.target_gpu;
    if (to.gpu.fp8_flops <= 0) {
      if (const std::string gemm = fp8_gemm(b.graph); !gemm.empty()) {
        throw error("whatif --gpu " + to.name + ": the traces train in fp8 (GEMM kernel '" + gemm + "'), and the " + to.name +
                    " has no fp8 tensor cores");
      }
    }
    const gpu_ratios r = ratios(from, ctx.traced_profile(), to, model::profile_preset(to.name));
    change_list out;
    char line[512];
    std::snprintf(line, sizeof line,
                  "GPU %s -> %s (peaks x the profiles' efficiencies): GEMMs x%.3f, attention x%.3f forward x%.3f backward, "
                  "memory-bound x%.3f (norms x%.3f, softmax x%.3f, optimizer x%.3f), all-reduce x%.3f, other transfers x%.3f, "
                  "%.1f us per kernel kept",
                  from.name.c_str(), to.name.c_str(), r.compute, r.attention_forward, r.attention_backward, r.memory, r.norm, r.softmax,
                  r.optimizer, r.allreduce, r.communication, static_cast<double>(r.fixed) / 1e3);
    out.push_back(changed("gpu", "GPU", from.name, to.name, line,
                          {{"GEMM time", 1.0, r.compute, "x"}, {"memory-bound time", 1.0, r.memory, "x"},
                           {"all-reduce time", 1.0, r.allreduce, "x"}}));
    // The algorithm is the trace's: FlashAttention stays FlashAttention on a GPU whose preset
    // profile (and so `lumos synth` and `predict` by default) runs Megatron's unfused attention.
    if (model::profile_preset(to.name).attention == model::attention_impl::unfused && traced_flash_attention(ctx.job)) {
      out.push_back(note("gpu", "attention kernels",
                         "the traces' FlashAttention kernels are kept (rescaled); lumos predict and synth model the " + to.name +
                             " with unfused attention unless given --attention flash"));
    }
    const gpu_change_stats st = change_gpu(b.graph, r);
    std::snprintf(line, sizeof line,
                  "%zu compute-bound, %zu memory-bound, %zu host-copy and %zu communication ops rescaled: %.3f -> %.3f ms of GPU time",
                  st.compute, st.memory, st.host_copy, st.communication, static_cast<double>(st.before) / 1e6,
                  static_cast<double>(st.after) / 1e6);
    out.push_back(note("gpu", "GPU op time", line).with({time_figure("GPU op time", st.before, st.after)}));
    return out;
  }
};
static_assert(Rewrite<gpu_pass>);

}  // namespace lumos::whatif

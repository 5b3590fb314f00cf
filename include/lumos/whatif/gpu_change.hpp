#pragma once
// The GPU what-if (`lumos whatif --gpu PRESET`): every measured GPU op is rescaled by what bounds
// it on the source GPU — compute-bound kernels (GEMMs, convolutions, attention) by the ratio of
// dense tensor-core peaks, memory-bound kernels and device copies by the ratio of HBM bandwidths,
// communication transfers by the ratio of NCCL link bandwidths — while CPU time, launches and the
// kept overheads stay (the host does not change). Each kernel keeps a fixed part, the source
// GPU's per-kernel overhead, that no faster GPU removes.

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <string>
#include <string_view>

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

using model::preset_of_device;

/// The GPU the first trace of `job` names in its deviceProperties ("" when none does).
[[nodiscard]] inline std::string traced_device(const trace::job& job) {
  for (const auto& r : job.ranks) {
    for (const auto& d : r.devices) {
      if (!d.name.empty()) return d.name;
    }
  }
  return {};
}

/// The source GPU of a job: `from` when given, else the GPU its first trace names.
[[nodiscard]] inline model::hardware source_gpu(const trace::job& job, std::string_view from = {}) {
  if (!from.empty()) return model::hardware_preset(from);
  const std::string device = traced_device(job);
  const std::string preset = preset_of_device(device);
  if (preset.empty()) {
    throw error("whatif --gpu: the traces' GPU " + (device.empty() ? std::string("is not named") : "'" + device + "'") +
                " has no hardware preset; say which preset it is with --from-gpu (a100-sxm-80gb, h100-sxm, h200-sxm)");
  }
  return model::hardware_preset(preset);
}

/// The duration multipliers of a GPU change, per bound.
struct gpu_ratios {
  double compute = 1.0, memory = 1.0, communication = 1.0;
  time_ns fixed = 0;  ///< per-kernel overhead of the source GPU, kept
};

[[nodiscard]] inline gpu_ratios ratios(const model::hardware& from, const model::hardware& to) {
  gpu_ratios r;
  r.compute = from.gpu.bf16_flops / to.gpu.bf16_flops;
  r.memory = from.gpu.hbm_bandwidth / to.gpu.hbm_bandwidth;
  r.communication = from.intra_node.effective_bandwidth() / to.intra_node.effective_bandwidth();
  r.fixed = from.kernel_launch_overhead;
  return r;
}

/// What a GPU change did.
struct gpu_change_stats {
  std::size_t compute = 0, memory = 0, host_copy = 0, communication = 0;
  time_ns before = 0, after = 0;  ///< summed GPU op time
};

/// Rescales every GPU op of `g` (see the header comment). Deterministic; O(tasks).
inline gpu_change_stats change_gpu(graph::task_graph& g, const gpu_ratios& r) {
  gpu_change_stats st;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    const auto k = g.kind[t];
    if (k != graph::task_kind::gpu_compute && k != graph::task_kind::gpu_comm && k != graph::task_kind::comm_complete) continue;
    const time_ns d = g.duration[t];
    st.before += d;
    double f = 1.0;
    switch (classify(k, g.task_name(t))) {
      case op_bound::compute: f = r.compute, ++st.compute; break;
      case op_bound::memory: f = r.memory, ++st.memory; break;
      case op_bound::host_copy: ++st.host_copy; break;
      case op_bound::communication: f = r.communication, ++st.communication; break;
    }
    const time_ns fixed = k == graph::task_kind::gpu_compute ? std::min(d, r.fixed) : 0;
    g.duration[t] = fixed + static_cast<time_ns>(std::llround(static_cast<double>(d - fixed) * f));
    st.after += g.duration[t];
  }
  return st;
}

}  // namespace lumos::whatif

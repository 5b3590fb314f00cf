#pragma once
// GPU, node and network description for the cost models, with vendor presets.

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lumos::model {

/// Numeric format of the training step's matrix math (and of stored activations, see
/// `activation_bytes`).
enum class precision : std::uint8_t { bf16, fp16, fp8 };

/// Lower-case name of `p` ("bf16", "fp16", "fp8").
[[nodiscard]] constexpr std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::bf16: return "bf16";
    case precision::fp16: return "fp16";
    case precision::fp8: return "fp8";
  }
  return "?";
}

/// How an fp8 GEMM operand gets its scale (Transformer Engine's recipes). `delayed`: from the
/// amax history of earlier steps, the new amax taken inside the cast kernel (DelayedScaling, TE's
/// default); `current`: from this tensor's own amax, a reduction over it before the cast
/// (Float8CurrentScaling): one more read of the operand.
enum class fp8_scaling : std::uint8_t { delayed, current };

/// Lower-case name of `s` ("delayed", "current").
[[nodiscard]] constexpr std::string_view to_string(fp8_scaling s) noexcept {
  return s == fp8_scaling::current ? "current" : "delayed";
}

/// Bytes of one GEMM operand element in `p` (fp8 GEMMs read 1-byte operands).
[[nodiscard]] constexpr double operand_bytes(precision p) noexcept {
  return p == precision::fp8 ? 1.0 : 2.0;
}

/// Bytes of one activation element passed between ops. Always 2: with fp8 training (Transformer
/// Engine) the GEMM inputs are cast to fp8 by their own kernels (`fp8_casts`, compute.hpp) but
/// activations between ops stay in bf16; the fp8 copies saved for backward are counted in
/// memory.hpp.
[[nodiscard]] constexpr double activation_bytes(precision) noexcept { return 2.0; }

/// Achievable fraction of a peak for one operation class: `compute` scales the FLOP/s peak,
/// `memory` the HBM bandwidth. Both in (0, 1].
struct efficiency_pair {
  double compute = 1.0;
  double memory = 1.0;
};

/// Per-op-class achievable efficiencies used by the roofline compute model. GEMM and attention
/// are timed against the tensor-core peak of the training precision; elementwise, norm and
/// optimizer ops against the non-tensor FP32 peak (in practice they are memory-bound, so only
/// their `memory` fraction matters).
struct compute_efficiency {
  efficiency_pair gemm;
  efficiency_pair attention;
  efficiency_pair elementwise;
  efficiency_pair norm;
  efficiency_pair optimizer;
};

/// One link class as seen by one GPU: bandwidth per direction, per GPU, in bytes/s; the fixed
/// latency of one algorithm step (the alpha of alpha-beta models); and the fraction of the
/// bandwidth that NCCL achieves for large messages (nccl-tests bus bandwidth / link peak).
struct link_spec {
  double bandwidth = 0;    ///< bytes/s, one direction, per GPU
  time_ns latency = 0;     ///< ns per step
  double efficiency = 1.0; ///< achievable fraction of `bandwidth`, (0, 1]

  [[nodiscard]] constexpr double effective_bandwidth() const noexcept {
    return bandwidth * efficiency;
  }
};

/// One GPU's peaks. All FLOP/s figures are dense (no 2:4 sparsity).
struct gpu_spec {
  double bf16_flops = 0;  ///< tensor-core dense peak, FLOP/s
  double fp16_flops = 0;  ///< tensor-core dense peak, FLOP/s
  double fp8_flops = 0;   ///< tensor-core dense peak, FLOP/s; 0 = not supported
  double fp32_flops = 0;  ///< non-tensor (CUDA core) FP32 peak, FLOP/s: elementwise work
  double hbm_bandwidth = 0;        ///< bytes/s
  std::uint64_t hbm_capacity = 0;  ///< bytes the driver reports in total (not all usable)
  int sm_count = 0;
};

/// A training machine: GPU, node size, the GPUs that share one NVLink fabric, intra-domain
/// (NVLink/NVSwitch, xGMI) and inter-domain (one NIC per GPU) links, per-kernel fixed overhead
/// and the achievable efficiencies of the roofline. Every field is public and may be overridden
/// after taking a preset.
struct hardware {
  std::string name;
  gpu_spec gpu;
  int gpus_per_node = 8;  ///< GPUs of one host (device ids 0 .. gpus_per_node - 1)
  /// GPUs that reach each other over `intra_node` (one NVLink domain: an NVSwitch node, or a
  /// GB200 NVL72 rack of 72); 0 means `gpus_per_node`. The communication models place ranks
  /// k / `nvlink_domain_size()` on the same fabric; read it through that accessor.
  int nvlink_domain = 0;
  link_spec intra_node;  ///< NVLink through NVSwitch: any GPU pair in a domain at full rate
  link_spec inter_node;  ///< the GPU's own NIC (rail-optimised fabric assumed, no oversubscription)
  /// Fixed GPU time added to every kernel on top of its roofline time: launch latency, ramp-up
  /// and tail. Wave quantisation is not modelled.
  time_ns kernel_launch_overhead = 0;
  compute_efficiency efficiency;

  /// GPUs per NVLink domain: `nvlink_domain`, or `gpus_per_node` when it is 0. Consecutive
  /// ranks fill a domain (rank k is in domain k / size), as they fill a node.
  [[nodiscard]] constexpr int nvlink_domain_size() const noexcept {
    return nvlink_domain > 0 ? nvlink_domain : gpus_per_node;
  }

  /// Whether the GPU has tensor cores for `p` (a dense peak above 0; not fp8 on A100).
  [[nodiscard]] constexpr bool supports(precision p) const noexcept { return tensor_peak(p) > 0; }

  /// Dense tensor-core peak for `p`, FLOP/s. Throws `lumos::error` when the GPU has no such
  /// format (fp8 on A100).
  [[nodiscard]] constexpr double peak_flops(precision p) const {
    const double v = tensor_peak(p);
    if (v <= 0) {
      throw error("hardware '" + name + "' has no " + std::string(to_string(p)) +
                  " tensor-core peak (not supported by this GPU); use bf16 or fp16");
    }
    return v;
  }

 private:
  [[nodiscard]] constexpr double tensor_peak(precision p) const noexcept {
    return p == precision::bf16 ? gpu.bf16_flops : p == precision::fp16 ? gpu.fp16_flops : gpu.fp8_flops;
  }
};

// Presets. Peaks are the vendors' datasheet figures; efficiencies are our defaults for what
// well-tuned Megatron-style training reaches, stated per field so they can be replaced by
// measurements (nccl-tests, a cuBLAS sweep) when available.

namespace detail {
inline constexpr double tera = 1e12;
inline constexpr double giga = 1e9;
inline constexpr std::uint64_t mib = std::uint64_t{1} << 20;

/// Nanoseconds (double) to whole nanoseconds, rounded to nearest; negatives and NaN give 0,
/// values beyond `max_input_ns` saturate there (so sums of a few stay in range).
[[nodiscard]] constexpr time_ns round_ns(double ns) noexcept {
  if (!(ns > 0)) return 0;
  if (ns >= static_cast<double>(max_input_ns)) return max_input_ns;
  return static_cast<time_ns>(ns + 0.5);
}

/// Defaults shared by the presets, tuned separately only where the generation differs.
[[nodiscard]] constexpr compute_efficiency default_efficiency(double gemm, double attention) {
  compute_efficiency e;
  // Large bf16 GEMMs in cuBLAS reach 75-85 % of dense peak on A100 and ~80 % on H100/H200
  // (8192^3 bf16 ran at 798 TFLOP/s = 0.81 on this project's lent H100); Megatron's per-layer
  // shapes are smaller and sit below that.
  e.gemm = {gemm, 0.85};
  // FlashAttention-2: ~50-70 % of peak on A100 forward, ~35-50 % on H100 (FA3 more); we use one
  // figure for forward and backward.
  e.attention = {attention, 0.85};
  // Streaming kernels reach ~85-90 % of HBM bandwidth (a device-to-device copy moved 3.0 TB/s
  // of 3.35 on the lent H100, 4.3 of 4.8 on the H200); reductions (norms,
  // softmax) and multi-tensor optimizer kernels somewhat less.
  e.elementwise = {0.5, 0.85};
  e.norm = {0.5, 0.70};
  e.optimizer = {0.5, 0.75};
  return e;
}
}  // namespace detail

/// NVIDIA A100 SXM4 80GB (DGX A100 / HGX A100). Datasheet ("NVIDIA A100 Tensor Core GPU",
/// 2021): BF16/FP16 tensor 312 TFLOPS dense, FP32 19.5 TFLOPS, HBM2e 2,039 GB/s, 80 GB,
/// 108 SMs, NVLink 3 600 GB/s total (300 GB/s per direction); no FP8. DGX A100: eight
/// 200 Gb/s HDR InfiniBand NICs for compute, one per GPU (25 GB/s).
[[nodiscard]] inline hardware a100_sxm_80gb() {
  hardware h;
  h.name = "a100-sxm-80gb";
  h.gpu.bf16_flops = 312 * detail::tera;
  h.gpu.fp16_flops = 312 * detail::tera;
  h.gpu.fp8_flops = 0;  // Ampere has no FP8 tensor cores
  h.gpu.fp32_flops = 19.5 * detail::tera;
  h.gpu.hbm_bandwidth = 2039 * detail::giga;
  h.gpu.hbm_capacity = 81920 * detail::mib;  // "80 GB"; the total nvidia-smi reports
  h.gpu.sm_count = 108;
  h.gpus_per_node = 8;
  // nccl-tests all-reduce bus bandwidth on 8x A100 NVSwitch: ~230-240 GB/s of 300 GB/s.
  // Latency per step: the order of NCCL's own tuning constants for NVLink (0.6-3.4 us by
  // protocol, src/graph/tuning.cc); 1 us reproduces ~15 us for a small 8-GPU all-reduce.
  h.intra_node = {300 * detail::giga, 1000, 0.80};
  // 200 Gb/s = 25 GB/s per direction; NCCL reaches ~90 % of it on large messages. 5 us per
  // step covers IB latency and NCCL proxy overhead.
  h.inter_node = {25 * detail::giga, 5000, 0.90};
  h.kernel_launch_overhead = 3000;
  h.efficiency = detail::default_efficiency(0.80, 0.55);
  return h;
}

/// NVIDIA H100 SXM5 80GB (DGX H100 / HGX H100). Datasheet ("NVIDIA H100 Tensor Core GPU",
/// 2023, SXM column, dense = half the sparsity figures): BF16/FP16 989.4 TFLOPS, FP8
/// 1,978.9 TFLOPS, FP32 67 TFLOPS, HBM3 3.35 TB/s, 80 GB, 132 SMs, NVLink 4 900 GB/s total
/// (450 GB/s per direction). DGX H100: eight 400 Gb/s ConnectX-7 NICs, one per GPU (50 GB/s).
[[nodiscard]] inline hardware h100_sxm() {
  hardware h;
  h.name = "h100-sxm";
  h.gpu.bf16_flops = 989.4 * detail::tera;
  h.gpu.fp16_flops = 989.4 * detail::tera;
  h.gpu.fp8_flops = 1978.9 * detail::tera;
  h.gpu.fp32_flops = 66.9 * detail::tera;
  h.gpu.hbm_bandwidth = 3350 * detail::giga;
  h.gpu.hbm_capacity = 81559 * detail::mib;  // "80 GB"; nvidia-smi total on the lent H100
  h.gpu.sm_count = 132;
  h.gpus_per_node = 8;
  // nccl-tests all-reduce bus bandwidth on 8x H100 without NVLS: ~360-380 GB/s of 450 GB/s.
  h.intra_node = {450 * detail::giga, 1000, 0.80};
  h.inter_node = {50 * detail::giga, 5000, 0.90};
  h.kernel_launch_overhead = 3000;
  h.efficiency = detail::default_efficiency(0.72, 0.45);
  return h;
}

/// NVIDIA H200 SXM 141GB (HGX H200). Datasheet ("NVIDIA H200 Tensor Core GPU", 2024): same
/// compute as H100 SXM (BF16/FP16 989 TFLOPS, FP8 1,979 TFLOPS dense, FP32 67 TFLOPS), HBM3e
/// 4.8 TB/s, 141 GB, 132 SMs, NVLink 900 GB/s total; one 400 Gb/s NIC per GPU as on DGX H100.
[[nodiscard]] inline hardware h200_sxm() {
  hardware h = h100_sxm();
  h.name = "h200-sxm";
  h.gpu.hbm_bandwidth = 4800 * detail::giga;
  h.gpu.hbm_capacity = 143771 * detail::mib;  // "141 GB"; nvidia-smi total on the lent H200
  // Same chip and power envelope as H100: the large-GEMM rate measured on this project's lent
  // machines is the same on both (8192^3 bf16: 798 TFLOP/s on H100, 769-798 on H200), so the
  // H100 efficiencies are kept.
  return h;
}

/// NVIDIA B200 (DGX B200 / HGX B200). Datasheet ("NVIDIA DGX B200", 2024; the 8-GPU system's
/// figures divided by 8, dense = half the sparsity figures): FP8 4.5 PFLOPS (72 PFLOPS sparse
/// per system), BF16/FP16 2.25 PFLOPS (36 sparse), FP32 75 TFLOPS (600 per system), HBM3e
/// 8 TB/s (64 per system), 180 GB (1,440 per system), NVLink 5 1.8 TB/s total (900 GB/s per
/// direction); 148 SMs (`numSms` of the shared B200 trace). DGX B200: eight 400 Gb/s
/// ConnectX-7 NICs for compute, one per GPU (50 GB/s). `fp8_flops` is the datasheet rate;
/// the cost models do not price fp8 GEMMs from it yet.
[[nodiscard]] inline hardware b200() {
  hardware h;
  h.name = "b200";
  h.gpu.bf16_flops = 2250 * detail::tera;
  h.gpu.fp16_flops = 2250 * detail::tera;
  h.gpu.fp8_flops = 4500 * detail::tera;
  h.gpu.fp32_flops = 75 * detail::tera;
  h.gpu.hbm_bandwidth = 8000 * detail::giga;
  // "180 GB"; totalGlobalMem of the shared trace tracelens_H100_B200/b200_vllm_tp8_eager_trace.
  h.gpu.hbm_capacity = 191503138816;
  h.gpu.sm_count = 148;
  h.gpus_per_node = 8;
  // No nccl-tests figure for B200 here: the H100's achieved fraction of the NVLink line rate
  // (370 of 450 GB/s, PUBLISHED.md 6.2) is assumed for NVLink 5.
  h.intra_node = {900 * detail::giga, 1000, 0.80};
  h.inter_node = {50 * detail::giga, 5000, 0.90};
  h.kernel_launch_overhead = 3000;
  // Assumed as H100's until a B200 run is measured (lumos calibrate fits them from traces).
  h.efficiency = detail::default_efficiency(0.72, 0.45);
  return h;
}

/// NVIDIA GB200 in a GB200 NVL72 rack. Datasheet ("NVIDIA GB200 NVL72", 2024; the rack's
/// figures divided by its 72 GPUs, dense = half the sparsity figures): FP8 5 PFLOPS (720
/// PFLOPS sparse per rack), BF16/FP16 2.5 PFLOPS (360 sparse), HBM3e 8 TB/s (576 per rack),
/// 186 GB (13.4 TB per rack), NVLink 5 1.8 TB/s total per GPU (130 TB/s per rack) through the
/// NVLink switch trays: one NVLink domain of 72 GPUs, so TP, EP, CP and DP groups inside a rack
/// use NVLink. A compute tray (one host) holds 4 GPUs (2 GB200 superchips); one 400 Gb/s
/// ConnectX-7 NIC per GPU leaves the rack. The datasheet gives no FP32 rate: twice its FP64
/// figure (3,240 TFLOPS per rack, 45 per GPU), the FP32:FP64 ratio of B200's datasheet.
/// SM count taken as B200's (same GPU). `fp8_flops` is not used by the cost models yet.
[[nodiscard]] inline hardware gb200() {
  hardware h = b200();
  h.name = "gb200";
  h.gpu.bf16_flops = 2500 * detail::tera;
  h.gpu.fp16_flops = 2500 * detail::tera;
  h.gpu.fp8_flops = 5000 * detail::tera;
  h.gpu.fp32_flops = 90 * detail::tera;
  h.gpu.hbm_capacity = 186 * std::uint64_t{1000000000};  // "186 GB", decimal as the datasheet
  h.gpus_per_node = 4;
  h.nvlink_domain = 72;
  return h;
}

/// AMD Instinct MI300X (OAM, 8-GPU platform). Datasheet ("AMD Instinct MI300X Accelerator",
/// 2023, dense = without sparsity): BF16/FP16 matrix 1,307.4 TFLOPS, FP8 2,614.9 TFLOPS, FP32
/// vector 163.4 TFLOPS, HBM3 5.3 TB/s, 192 GB, 304 compute units; seven 4th-gen Infinity
/// Fabric (xGMI) links of 128 GB/s (64 GB/s per direction), one to each peer of the 8-GPU
/// platform: 448 GB/s per direction in all. The fully connected mesh is modelled as a switch at
/// that aggregate rate, which is optimistic for groups smaller than 8 (a pair shares one
/// 64 GB/s link). Network: one 400 Gb/s NIC per GPU (e.g. Azure ND MI300X v5: 8 x 400 Gb/s
/// InfiniBand). `fp8_flops` is the datasheet rate; the cost models do not price fp8 GEMMs yet.
[[nodiscard]] inline hardware mi300x() {
  hardware h;
  h.name = "mi300x";
  h.gpu.bf16_flops = 1307.4 * detail::tera;
  h.gpu.fp16_flops = 1307.4 * detail::tera;
  h.gpu.fp8_flops = 2614.9 * detail::tera;
  h.gpu.fp32_flops = 163.4 * detail::tera;
  h.gpu.hbm_bandwidth = 5300 * detail::giga;
  // "192 GB"; totalGlobalMem of the shared trace amd_mi300/mi300x_resnet_act_checkpoint.
  h.gpu.hbm_capacity = 206141652992;
  h.gpu.sm_count = 304;  // compute units
  h.gpus_per_node = 8;
  // Assumed: RCCL reaches 70 % of the aggregate xGMI rate on large messages (below NVSwitch's
  // 80 %: a ring over the mesh uses one link per neighbour pair); no measurement here.
  h.intra_node = {448 * detail::giga, 1000, 0.70};
  h.inter_node = {50 * detail::giga, 5000, 0.90};
  h.kernel_launch_overhead = 3000;
  // Assumed: large bf16 GEMMs reach a smaller fraction of MI300X's peak than of H100's; replace
  // with `lumos calibrate` on the user's traces.
  h.efficiency = detail::default_efficiency(0.60, 0.35);
  return h;
}

/// Names accepted by `hardware_preset`.
inline constexpr std::array<std::string_view, 6> hardware_preset_names = {
    "a100-sxm-80gb", "h100-sxm", "h200-sxm", "b200", "gb200", "mi300x"};

/// The preset called `name` (see `hardware_preset_names`). Throws `lumos::error` listing the
/// valid names when there is none.
[[nodiscard]] inline hardware hardware_preset(std::string_view name) {
  if (name == "a100-sxm-80gb") return a100_sxm_80gb();
  if (name == "h100-sxm") return h100_sxm();
  if (name == "h200-sxm") return h200_sxm();
  if (name == "b200") return b200();
  if (name == "gb200") return gb200();
  if (name == "mi300x") return mi300x();
  std::string msg = "unknown hardware preset '" + std::string(name) + "'; valid names:";
  for (auto n : hardware_preset_names) {
    msg += ' ';
    msg += n;
  }
  throw error(msg);
}

/// The hardware preset of a trace's GPU, from its `deviceProperties` name ("NVIDIA H100 80GB
/// HBM3", "NVIDIA B200", "NVIDIA GB200", "AMD Instinct MI300X", or a preset name such as
/// "h100-sxm", which `lumos synth` writes); empty when unknown.
[[nodiscard]] inline std::string preset_of_device(std::string_view device) {
  const std::string n = lower_ascii(device);
  if (n.find("a100") != std::string::npos) return "a100-sxm-80gb";
  if (n.find("h100") != std::string::npos) return "h100-sxm";
  if (n.find("h200") != std::string::npos) return "h200-sxm";
  // GB200 before B200: "gb200" contains "b200".
  if (n.find("gb200") != std::string::npos) return "gb200";
  if (n.find("b200") != std::string::npos) return "b200";
  if (n.find("mi300x") != std::string::npos) return "mi300x";
  return {};
}

}  // namespace lumos::model

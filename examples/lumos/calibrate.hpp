#pragma once
// lumos calibrate TRACE_DIR|FILE... -o profile.json [--rank N]

#include "cli.hpp"

#include <lumos/cli/calibrate.hpp>
#include <lumos/model/calibrate.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/report/trace_files.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view calibrate_usage =
    "usage: lumos calibrate TRACE_DIR|FILE... -o profile.json [--rank N]\n"
    "  Fits the kernel-level cost profile from Kineto traces of one run (one file per rank):\n"
    "  GEMM efficiency from kernels with their Input Dims (record_shapes), memory-bound bandwidth\n"
    "  per kernel class, the minimum kernel time, launch and per-op CPU times, and NCCL latency and\n"
    "  bandwidth from the shortest participant of each collective; then the CPU dispatch per op and\n"
    "  the optimizer bandwidth so that the model of the traced configuration (structure discovery)\n"
    "  spends the traces' host and optimizer time per iteration. Parameters the traces do not\n"
    "  show keep the preset of the traced GPU. Prints the fit; 'lumos predict --profile FILE' uses it.\n"
    "  --rank N   use only rank N's file (e.g. to predict the other ranks from one)\n";

inline int run_calibrate(args& a) {
  const auto out_path = a.option("-o");
  const auto only = a.option("--rank");
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("calibrate needs at least one trace directory or file");
  if (!out_path) throw usage_error("calibrate needs -o profile.json");
  const model::calibration c = calibrate_inputs(inputs, only);
  report::detail::write_plain(*out_path, model::to_json(c.profile));

  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "lumos calibrate: %zu rank%s (%s), %zu kernels -> %s\n", c.ranks, c.ranks == 1 ? "" : "s",
                c.gpu_name.c_str(), c.kernels, out_path->c_str());
  out += line;
  const double peak = model::hardware_preset(c.profile.hardware).gpu.fp16_flops;
  std::snprintf(line, sizeof line, "  GEMM efficiency = %.3f x prod d/(d + %.1f), RMS log error %.3f over %zu shapes:\n",
                c.profile.gemm_max, c.profile.gemm_half_dim, c.gemm_rms_log_error, c.gemms.size());
  out += line;
  for (const auto& g : c.gemms) {
    std::snprintf(line, sizeof line, "    %4.0f x %6.0f x %6.0f x %6.0f  %9.1f us  measured %.3f  fitted %.3f\n", g.batch, g.m,
                  g.n, g.k, g.ns / 1e3, g.efficiency(peak), model::gemm_efficiency(c.profile, g.m, g.n, g.k));
    out += line;
  }
  for (const auto& [cls, f2] : c.memory_fractions) {
    std::snprintf(line, sizeof line, "  %-12s %.3f of HBM peak\n", cls.c_str(), f2);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  min kernel %.1f us; launch %.1f us; forward op dispatch %.1f us (profiler overhead included; %.3f ms in "
                "synchronize calls not counted)\n",
                c.profile.min_kernel_ns / 1e3, c.launch_ns / 1e3, c.forward_op_ns / 1e3, c.host_sync_ns / 1e6);
  out += line;
  std::snprintf(line, sizeof line, "  NCCL: %zu collectives; intra busbw %.1f GB/s, LL fraction %.3f, LL base %.1f us\n",
                c.collectives.size(), c.profile.intra.busbw / 1e9, c.profile.intra.ll_fraction, c.profile.intra.ll_base_ns / 1e3);
  out += line;
  for (const auto& n : c.notes) out += "  " + n + "\n";
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

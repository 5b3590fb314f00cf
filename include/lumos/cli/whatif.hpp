#pragma once
// `lumos whatif`'s flags (lumos/cli/args.hpp): the change — GPU, layers, data, tensor and
// pipeline parallelism, schedule, global batch, model shape, cost profile, step and scales —
// read into `whatif::whatif_options`, and the checks the command makes before and after running
// it. `lumos whatif` and the Python package's `lumos.whatif` read them here.

#include <lumos/cli/args.hpp>
#include <lumos/cli/predict.hpp>
#include <lumos/cli/scale.hpp>
#include <lumos/core/error.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/result.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace lumos::cli {

/// `--fsdp on|off`, `--reshard-after-forward on|off` and `--hsdp N` into `o`, with their usage errors.
inline void parse_fsdp_options(args& a, whatif::whatif_options& o) {
  auto on_off = [&](const char* flag) -> std::optional<bool> {
    const auto v = a.option(flag);
    if (!v) return std::nullopt;
    if (*v != "on" && *v != "off") throw usage_error(std::string(flag) + " must be on or off (got '" + *v + "')");
    return *v == "on";
  };
  o.fsdp = on_off("--fsdp");
  o.reshard_after_forward = on_off("--reshard-after-forward");
  if (o.reshard_after_forward && o.fsdp == false) {
    throw usage_error("--reshard-after-forward is an FSDP setting: it cannot go with --fsdp off");
  }
  if (const auto h = a.option("--hsdp")) {
    const int n = parse_number<int>(*h, "--hsdp");
    if (n <= 0) throw usage_error("--hsdp must be a positive shard group size (got " + *h + ")");
    if (o.fsdp == false) throw usage_error("--hsdp is a shard group size of FSDP: it cannot go with --fsdp off");
    if (o.dp && *o.dp % n != 0) {
      throw usage_error("--hsdp (" + *h + ") must divide --dp (" + std::to_string(*o.dp) + "): dp / hsdp shard groups replicate each other");
    }
    o.hsdp = n;
  }
}

/// The what-if's target from `lumos whatif`'s flags, everything but the inputs, outputs, folding
/// and the step (`parse_whatif_change`): `scaled` is what `--scale` gave (`parse_scales`). Usage
/// errors for bad values.
inline whatif::whatif_options whatif_options_of(args& a, const what_if& scaled) {
  whatif::whatif_options o;
  o.replay.scales = scaled.scales;
  o.replay.profiler = profiler_cost_option(a);
  o.replay.build.op_scales = scaled.ops;
  if (const auto gpu = a.option("--gpu")) o.gpu = *gpu;
  if (const auto layers = a.option("--layers")) {
    o.layers = parse_number<int>(*layers, "--layers");
    if (*o.layers <= 0) throw usage_error("--layers must be a positive number of layers (got " + *layers + ")");
    if (*o.layers > model::transformer::max_layers) {
      throw usage_error("--layers " + *layers + " is more than the supported " + std::to_string(model::transformer::max_layers));
    }
  }
  // Counts of ranks, stages and sequences: at most the ranks lumos reads (2^24), as predict.
  auto positive = [&](const char* flag) -> std::optional<int> {
    const auto v = a.option(flag);
    if (!v) return std::nullopt;
    const int n = parse_number<int>(*v, flag);
    if (n <= 0) throw usage_error(std::string(flag) + " must be a positive number (got " + *v + ")");
    if (n > trace::max_world_size) throw usage_error(std::string(flag) + " is too large: " + *v);
    return n;
  };
  o.shape.cp = positive("--cp");
  if (const auto comm = a.option("--cp-comm")) {
    if (*comm != "p2p" && *comm != "allgather") throw usage_error("--cp-comm must be p2p or allgather (got '" + *comm + "')");
    o.shape.cp_comm = *comm == "p2p" ? model::cp_comm_kind::p2p : model::cp_comm_kind::allgather;
  }
  o.dp = positive("--dp");
  o.moe.ep = positive("--ep");
  o.moe.experts = positive("--experts");
  o.moe.top_k = positive("--top-k");
  if (const auto ffn = a.option("--expert-ffn")) {
    o.moe.expert_ffn = parse_number<std::int64_t>(*ffn, "--expert-ffn");
    if (*o.moe.expert_ffn <= 0) throw usage_error("--expert-ffn must be positive (got " + *ffn + ")");
    if (*o.moe.expert_ffn > model::transformer::max_size) {
      throw usage_error("--expert-ffn " + *ffn + " is more than the supported " + std::to_string(model::transformer::max_size));
    }
  }
  if (const auto routing = a.option("--routing")) {
    if (*routing != "balanced" && *routing != "measured") throw usage_error("--routing must be balanced or measured (got '" + *routing + "')");
    o.moe.routing = *routing == "balanced" ? whatif::moe_routing::balanced : whatif::moe_routing::measured;
  }
  o.pp = positive("--pp");
  o.vp = positive("--vp");
  if (const auto gb = positive("--global-batch")) o.global_batch = *gb;
  if (const auto sched = a.option("--schedule")) {
    try {
      o.schedule = synth::parse_schedule(*sched);
    } catch (const error& e) {
      throw usage_error(e.what());
    }
  }
  if (const auto from = a.option("--from-gpu")) o.from_gpu = *from;
  if (const auto prec = a.option("--precision")) o.precision = parse_precision(*prec);
  parse_fsdp_options(a, o);
  if (const auto speed = a.option("--host-speed")) {
    // A factor, or a profile whose host entry is the target host (`lumos calibrate`).
    double f = 0;
    const auto [end, ec] = std::from_chars(speed->data(), speed->data() + speed->size(), f);
    if (ec == std::errc{} && end == speed->data() + speed->size()) {
      // The CPU times are divided by it: bounded as --scale's factors are, so that they stay times.
      if (!(f >= 1e-6 && f <= 1e6)) throw usage_error("--host-speed must be a factor from 1e-6 to 1e6 (got " + *speed + ")");
      o.host_speed = f;
    } else if (std::filesystem::is_regular_file(*speed)) {
      o.host_profile = read_profile_file(*speed);
    } else {
      throw usage_error("--host-speed must be a positive factor or a profile file with a host entry (got " + *speed + ")");
    }
  }
  if (const auto file = a.option("--profile")) o.profile = read_profile_file(*file);
  for (const auto& [flag, field] : {std::pair{"--hidden", &o.shape.hidden}, std::pair{"--ffn", &o.shape.ffn}, std::pair{"--heads", &o.shape.heads},
                                    std::pair{"--seq", &o.shape.seq}, std::pair{"--micro-batch", &o.shape.micro_batch}}) {
    if (const auto v = a.option(flag)) {
      *field = parse_number<std::int64_t>(*v, flag);
      if (**field <= 0) throw usage_error(std::string(flag) + " must be positive (got " + *v + ")");
      if (**field > model::transformer::max_size) {
        throw usage_error(std::string(flag) + " " + *v + " is more than the supported " + std::to_string(model::transformer::max_size));
      }
    }
  }
  if (const auto tp = a.option("--tp")) {
    o.shape.tp = parse_number<int>(*tp, "--tp");
    if (*o.shape.tp <= 0) throw usage_error("--tp must be positive (got " + *tp + ")");
    if (*o.shape.tp > trace::max_world_size) throw usage_error("--tp is too large: " + *tp);
  }
  if (const auto sp = a.option("--sp")) {
    if (*sp != "on" && *sp != "off") throw usage_error("--sp must be on or off (got '" + *sp + "')");
    o.shape.sp = *sp == "on";
  }
  for (const auto* preset : {&o.gpu, &o.from_gpu}) {
    if (!preset->empty()) {
      try {
        (void)model::hardware_preset(*preset);
      } catch (const error& e) {
        throw usage_error(e.what());
      }
    }
  }
  return o;
}

/// What `lumos whatif`'s change flags asked for: the scales and the what-if's options.
struct whatif_request {
  what_if scaled;
  whatif::whatif_options options;
  std::vector<int> steps;  ///< `--step N,M,...` with more than one step: the what-if of each in turn
};

/// Reads `--scale` and the change flags (`whatif_options_of`), in the order the command asks
/// for them, leaving the output flags and the inputs to the caller.
inline whatif_request parse_whatif_change(args& a) {
  whatif_request req;
  req.scaled = parse_scales(a.options("--scale"));
  if (const auto step = a.option("--step")) {
    for (const std::string& n : split_list(*step, "--step")) req.steps.push_back(parse_number<int>(n, "--step"));
  }
  req.options = whatif_options_of(a, req.scaled);
  if (!req.steps.empty()) req.options.replay.step = req.steps.front();
  if (req.steps.size() == 1) req.steps.clear();
  return req;
}

/// A usage error unless the request changes something.
inline void require_change(const whatif_request& req) {
  const whatif::whatif_options& o = req.options;
  if (o.gpu.empty() && o.host_speed == 1.0 && !o.host_profile && !o.layers && !o.dp && !o.global_batch && !o.pp && !o.vp && !o.schedule && !o.shape.any() && !o.precision &&
      !o.moe.any() && !o.fsdp && !o.hsdp && !o.reshard_after_forward && req.scaled.none()) {
    throw usage_error("whatif needs a change: --gpu PRESET, --layers N, --dp N, --pp N, --vp N, --schedule NAME, "
                      "--hidden/--ffn/--heads/--seq/--micro-batch/--tp N, --precision fp8, --ep/--experts/--top-k/--expert-ffn N, "
                      "--routing balanced|measured, --fsdp on|off, --hsdp N, --reshard-after-forward on|off, --host-speed F, or --scale");
  }
}

/// A usage error when the prediction has no per-rank graph to write as traces (`--trace-out`):
/// its pipeline change was predicted by the pass-level model.
inline void require_writable(const whatif::whatif_result& r) {
  if (r.pipeline) {
    throw usage_error("--trace-out: the pipeline change was predicted by the pass-level model (" +
                      std::string(r.pipeline_reason.empty() ? "the pipeline of the traces is kept" : r.pipeline_reason) +
                      "), which has no per-rank graph to write");
  }
}

}  // namespace lumos::cli

#pragma once
// lumos predict [--model PRESET] [shape and parallelism flags] [--json] [--unfold]

#include "cli.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/schedules.hpp>

#include "calibrate.hpp"  // so that main.cpp registers `calibrate` with one line of its table

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace lumos::cli {

inline constexpr std::string_view predict_usage =
    "usage: lumos predict [--model PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
    "                     [--kv-heads N] [--seq N] [--vocab N] [--tp N] [--pp N] [--dp N] [--vp N]\n"
    "                     [--sp {on,off}] [--tp-comm-overlap {on,off}] [--overlap-param-gather {on,off}]\n"
    "                     [--micro-batch N] [--global-batch N] [--schedule NAME]\n"
    "                     [--recompute {none,selective,full}] [--gpu PRESET]\n"
    "                     [--precision {bf16,fp16,fp8}] [--profile FILE] [--attention {flash,unfused}]\n"
    "                     [--cost-model {kernel,roofline}] [--forward-only] [--json] [--unfold]\n"
    "                     [--report FILE]\n"
    "  Builds one training iteration from the model description and simulates it with the replay\n"
    "  engine; prints iteration time, throughput, TFLOP/s and MFU/HFU, pipeline bubble, the 4-way\n"
    "  breakdown of rank 0 and per-GPU memory.\n"
    "  --model     gpt3-15b, gpt3-44b, gpt3-117b, gpt3-175b (default), llama3-8b, llama3-70b,\n"
    "              llama3-405b; the shape flags override it (--heads also sets --kv-heads for\n"
    "              multi-head models, --hidden also sets --ffn to 4x for models whose ffn is 4h,\n"
    "              unless given)\n"
    "  --tp/--pp/--dp/--vp  parallel sizes (default 1); --sp sequence parallelism (default off)\n"
    "  --tp-comm-overlap  Megatron's --tp-comm-overlap (Transformer Engine): each sequence-parallel\n"
    "              collective of a layer overlaps its GEMM (default off; needs --sp on when tp > 1)\n"
    "  --overlap-param-gather  Megatron's --overlap-param-gather: the distributed optimizer's\n"
    "              parameter all-gathers overlap the next iteration's first forward pass instead\n"
    "              of ending the step (steady state; default off)\n"
    "  --micro-batch  sequences per micro-batch (default 1)\n"
    "  --global-batch sequences per iteration (default micro-batch x dp x 4pp with pp > 1,\n"
    "              micro-batch x dp otherwise)\n"
    "  --schedule  gpipe, 1f1b, interleaved, zb-h1, zb-h2 (default interleaved when vp > 1, else 1f1b)\n"
    "  --recompute activation recomputation (default none)\n"
    "  --gpu       a100-sxm-80gb, h100-sxm (default), h200-sxm; --precision default bf16\n"
    "  --profile   cost profile JSON (lumos calibrate -o FILE); default: the preset of --gpu (its\n"
    "              'hardware' field picks the GPU when --gpu is not given)\n"
    "  --attention override the profile's attention path (flash, or Megatron's unfused softmax)\n"
    "  --cost-model kernel (default: per-kernel GPU times, CPU dispatch, NCCL protocols from the\n"
    "              profile) or roofline (pass-level roofline with one efficiency per op class)\n"
    "  --forward-only  forward passes only (no backward, gradient reduction or optimizer), e.g. to\n"
    "              compare with a forward-only profiling step\n"
    "  --unfold    simulate every rank (default: one rank per pipeline stage, identical ranks folded)\n"
    "  --report    also write the HTML report of the modelled iteration (its traces, as `lumos synth`\n"
    "              writes them, replayed)\n"
    "  Fixed: Megatron's distributed optimizer (ZeRO-1) with fp32 main gradients, gradient\n"
    "  reduction in buckets overlapped with the backward, FlashAttention.\n";

// Bad values are `lumos::error`s (one line on stderr, exit code 2); unknown flags and stray
// arguments are usage errors (the message and the usage).
namespace detail {

inline std::int64_t positive_value(const std::string& text, std::string_view name) {
  std::int64_t x = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc{} || end != text.data() + text.size() || x <= 0) {
    throw lumos::error(std::string(name) + " must be a positive integer, got '" + text + "'");
  }
  return x;
}

inline std::int64_t positive_int(args& a, std::string_view name, std::int64_t fallback) {
  const auto v = a.option(name);
  return v ? positive_value(*v, name) : fallback;
}

inline int positive_small(args& a, std::string_view name, int fallback) {
  const std::int64_t x = positive_int(a, name, fallback);
  if (x > (1 << 24)) throw lumos::error(std::string(name) + " is too large: " + std::to_string(x));
  return static_cast<int>(x);
}

inline std::string bytes_text(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

inline std::string ms_text(time_ns t) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(t) / 1e6);
  return buf;
}

inline std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * f);
  return buf;
}

}  // namespace detail

/// What `lumos predict` parsed, for the report.
struct predict_request {
  synth::job job;
  bool unfold = false;
  bool roofline = false;
  bool forward_only = false;
  model::cost_profile profile;
};

/// Reads a profile file (`lumos calibrate -o`), on top of the preset it names or `fallback`.
inline model::cost_profile read_profile_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw lumos::error("cannot read profile '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // The preset of the profile's hardware gives every value the file leaves out.
  model::cost_profile base = model::a100_profile();
  if (const auto at = text.find("\"hardware\""); at != std::string::npos) {
    for (auto n : model::profile_preset_names) {
      const auto v = text.find('"' + std::string(n) + '"', at);
      if (v != std::string::npos && v < text.find(',', at)) base = model::profile_preset(n);
    }
  }
  return model::profile_from_json(text, base, path);
}

inline predict_request parse_predict(args& a) {
  predict_request req;
  synth::job& j = req.job;
  j.model = model::model_preset(a.option("--model").value_or("gpt3-175b"));
  const model::transformer preset = j.model;
  model::transformer& m = j.model;
  const bool mha = m.kv_heads == m.heads;
  const bool ffn_4h = m.ffn == 4 * m.hidden;
  m.layers = detail::positive_int(a, "--layers", m.layers);
  // At most 2^24 (positive_small), as --micro-batch below, so that the products made of them here
  // (4h, the default global batch) cannot overflow: the CLI fuzzer found --hidden 3.3e18.
  m.hidden = detail::positive_small(a, "--hidden", static_cast<int>(m.hidden));
  if (const auto ffn = a.option("--ffn")) {
    m.ffn = detail::positive_value(*ffn, "--ffn");
  } else if (ffn_4h) {
    m.ffn = 4 * m.hidden;
  }
  m.heads = detail::positive_int(a, "--heads", m.heads);
  if (const auto kv = a.option("--kv-heads")) {
    m.kv_heads = detail::positive_value(*kv, "--kv-heads");
  } else if (mha) {
    m.kv_heads = m.heads;
  }
  m.seq = detail::positive_int(a, "--seq", m.seq);
  m.vocab = detail::positive_int(a, "--vocab", m.vocab);
  // A shape that is not the preset's is not the preset: say so instead of its name.
  if (m.layers != preset.layers || m.hidden != preset.hidden || m.ffn != preset.ffn || m.heads != preset.heads ||
      m.kv_heads != preset.kv_heads || m.seq != preset.seq || m.vocab != preset.vocab) {
    m.name = "custom";
  }

  model::parallel_config& p = j.parallel;
  p.tp = detail::positive_small(a, "--tp", 1);
  p.pp = detail::positive_small(a, "--pp", 1);
  p.dp = detail::positive_small(a, "--dp", 1);
  p.vp = detail::positive_small(a, "--vp", 1);
  if (const auto sp = a.option("--sp")) {
    if (*sp != "on" && *sp != "off") throw lumos::error("--sp must be on or off, got '" + *sp + "'");
    p.sp = *sp == "on";
  }
  if (const auto o = a.option("--tp-comm-overlap")) {
    if (*o != "on" && *o != "off") throw lumos::error("--tp-comm-overlap must be on or off, got '" + *o + "'");
    p.tp_comm_overlap = *o == "on";
  }
  if (const auto o = a.option("--overlap-param-gather")) {
    if (*o != "on" && *o != "off") throw lumos::error("--overlap-param-gather must be on or off, got '" + *o + "'");
    p.overlap_param_gather = *o == "on";
  }
  p.micro_batch = detail::positive_small(a, "--micro-batch", 1);
  if (const auto gb = a.option("--global-batch")) {
    p.global_batch = detail::positive_value(*gb, "--global-batch");
  } else if (__builtin_mul_overflow(p.micro_batch * p.dp, p.pp > 1 ? 4 * std::int64_t{p.pp} : 1, &p.global_batch)) {
    // Default: 4·pp micro-batches per replica (2^24 · 2^24 · 2^26 at most: more than 64 bits).
    throw lumos::error("--micro-batch x --dp x 4 --pp is too large for the default global batch; give --global-batch");
  }
  if (const auto r = a.option("--recompute")) {
    if (*r == "none") {
      p.recompute = model::recompute_kind::none;
    } else if (*r == "selective") {
      p.recompute = model::recompute_kind::selective;
    } else if (*r == "full") {
      p.recompute = model::recompute_kind::full;
    } else {
      throw lumos::error("--recompute must be none, selective or full, got '" + *r + "'");
    }
  }
  if (const auto prec = a.option("--precision")) {
    if (*prec == "bf16") {
      p.dtype = model::precision::bf16;
    } else if (*prec == "fp16") {
      p.dtype = model::precision::fp16;
    } else if (*prec == "fp8") {
      p.dtype = model::precision::fp8;
    } else {
      throw lumos::error("--precision must be bf16, fp16 or fp8, got '" + *prec + "'");
    }
  }
  p.zero_stage = 1;
  if (const auto s = a.option("--schedule")) j.schedule = synth::parse_schedule_name(*s);
  const auto gpu = a.option("--gpu");
  if (const auto file = a.option("--profile")) {
    req.profile = read_profile_file(*file);
    j.hardware = model::hardware_preset(gpu.value_or(req.profile.hardware));
  } else {
    j.hardware = model::hardware_preset(gpu.value_or("h100-sxm"));
    req.profile = model::profile_preset(j.hardware.name);
  }
  if (const auto att = a.option("--attention")) {
    if (*att != "flash" && *att != "unfused") throw lumos::error("--attention must be flash or unfused, got '" + *att + "'");
    req.profile.attention = *att == "flash" ? model::attention_impl::flash : model::attention_impl::unfused;
  }
  if (const auto cm = a.option("--cost-model")) {
    if (*cm != "kernel" && *cm != "roofline") throw lumos::error("--cost-model must be kernel or roofline, got '" + *cm + "'");
    req.roofline = *cm == "roofline";
  }
  req.unfold = a.flag("--unfold");
  req.forward_only = a.flag("--forward-only");
  return req;
}

/// The host-side options of the program builder that a profile fixes (collective enqueue time,
/// the p2p and fp16 loss-scale host syncs).
inline void apply_profile(const predict_request& req, synth::program_options& o) {
  o.forward_only = req.forward_only;
  if (req.roofline) return;
  o.collective_cpu = static_cast<time_ns>(req.profile.cpu_collective_ns);
  o.launch_cost = static_cast<time_ns>(req.profile.cpu_launch_ns);
  o.p2p_host_sync = req.profile.cpu_p2p_sync > 0;
  o.loss_scale_host_sync = req.profile.cpu_loss_scale_sync > 0 && req.job.parallel.dtype == model::precision::fp16;
}

/// `predict` with the cost model the request asks for.
inline synth::prediction run_model(const predict_request& req, synth::predict_options opt) {
  apply_profile(req, opt.program);
  if (req.roofline) return synth::predict(req.job, opt);
  return synth::predict(req.job, opt, model::kernel_level{req.profile}, model::nccl_model{req.profile});
}

inline void predict_json(const synth::job& j, const synth::prediction& r, double wall_ms, std::string& out,
                         const std::string& profile_name = "") {
  const auto& m = j.model;
  const auto& p = j.parallel;
  json_writer w(out);
  w.begin_object();
  w.key("job").begin_object();
  w.field("model", m.name).field("layers", m.layers).field("hidden", m.hidden).field("ffn", m.ffn);
  w.field("heads", m.heads).field("kv_heads", m.kv_heads).field("seq", m.seq).field("vocab", m.vocab);
  w.field("gpu", j.hardware.name).field("precision", model::to_string(p.dtype)).field("gpus", r.gpus);
  w.field("profile", profile_name);
  w.field("tp", p.tp).field("pp", p.pp).field("dp", p.dp).field("vp", p.vp).field("sp", p.sp);
  w.field("tp_comm_overlap", p.tp_comm_overlap).field("overlap_param_gather", p.overlap_param_gather);
  w.field("micro_batch", p.micro_batch).field("global_batch", p.global_batch);
  w.field("micro_batches_per_pipeline", static_cast<std::int64_t>(r.shape.micro_batches));
  w.field("schedule", pipeline::schedule_name(r.schedule)).field("recompute", model::to_string(p.recompute));
  w.field("zero_stage", p.zero_stage);
  w.end_object();
  w.field("iteration_ns", r.iteration_ns);
  w.field("tokens_per_s", r.tokens_per_s);
  w.field("tflops_per_gpu", r.model_tflops_per_gpu);
  w.field("hardware_tflops_per_gpu", r.hardware_tflops_per_gpu);
  w.field("mfu", r.mfu).field("hfu", r.hfu);
  w.field("peak_tflops_per_gpu", r.peak_flops_per_gpu / 1e12);
  w.field("model_flops_per_iteration", r.model_flops);
  w.field("hardware_flops_per_iteration", r.hardware_flops);
  w.field("flops_convention",
          r.forward_only ? "Megatron's forward third: 24*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) model FLOPs per forward-only "
                             "iteration (generalised to GQA/SwiGLU); nothing recomputed; dense tensor-core peak"
                           : "Megatron: 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) model FLOPs per iteration (generalised to "
                             "GQA/SwiGLU); hardware FLOPs add recomputed forward work; dense tensor-core peak");
  w.field("bubble_fraction", r.bubble_fraction);
  w.field("pipeline_ns", r.pipeline_ns);
  w.field("bubble_definition",
          "1 - mean over stages of compute-stream busy time during the pipeline phase / pipeline_ns "
          "(pipeline phase: from 0 to the end of the last forward/backward op of any stage)");
  w.key("breakdown").begin_object();
  w.field("rank", r.breakdown_rank).field("window_ns", r.breakdown_window_ns);
  w.field("exposed_compute_ns", r.breakdown.exposed_compute).field("overlapped_ns", r.breakdown.overlapped);
  w.field("exposed_comm_ns", r.breakdown.exposed_comm).field("other_ns", r.breakdown.other);
  w.end_object();
  w.field("sm_utilization", r.sm_utilization);
  const auto& mem = r.memory;
  w.key("memory_bytes_per_gpu").begin_object();
  w.field("stage", r.memory_stage).field("in_flight_microbatches", r.in_flight_microbatches);
  w.field("parameters", mem.parameters).field("gradients", mem.gradients).field("optimizer", mem.optimizer_states);
  w.field("activations", mem.activations + mem.io_activations + mem.recompute_working);
  w.field("total", mem.total());
  w.field("capacity", static_cast<std::int64_t>(j.hardware.gpu.hbm_capacity)).field("fits", mem.fits(j.hardware));
  w.end_object();
  w.key("stages").begin_array();
  for (const auto& s : r.stages) {
    w.begin_object().field("stage", s.stage).field("rank", s.rank).field("pipeline_busy_ns", s.pipeline_busy_ns);
    w.field("pipeline_end_ns", s.pipeline_end_ns).field("in_flight_microbatches", s.in_flight_microbatches);
    w.field("memory_total_bytes", s.memory.total()).end_object();
  }
  w.end_array();
  w.key("graph").begin_object();
  w.field("unfolded", r.unfolded).field("granularity", synth::to_string(r.detail));
  w.field("simulated_ranks", static_cast<std::int64_t>(r.simulated_ranks)).field("tasks", static_cast<std::int64_t>(r.tasks));
  w.field("edges", static_cast<std::int64_t>(r.edges)).field("processors", static_cast<std::int64_t>(r.processors));
  w.field("wall_ms", wall_ms);
  w.end_object();
  w.end_object();
  out += '\n';
}

/// `profile`: the kernel-level model's profile, or null for the roofline model.
inline void predict_text(const synth::job& j, const synth::prediction& r, double wall_ms, std::string& out,
                         const model::cost_profile* profile) {
  const auto& m = j.model;
  const auto& p = j.parallel;
  char line[768];
  auto put = [&](const char* fmt, auto... xs) {
    std::snprintf(line, sizeof line, fmt, xs...);
    out += line;
  };
  put("lumos predict: %s on %lld x %s, %s\n", m.name.c_str(), static_cast<long long>(r.gpus), j.hardware.name.c_str(),
      std::string(model::to_string(p.dtype)).c_str());
  put("  model         %lld layers, hidden %lld, ffn %lld, %lld heads (%lld kv), seq %lld, vocab %lld\n",
      static_cast<long long>(m.layers), static_cast<long long>(m.hidden), static_cast<long long>(m.ffn),
      static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads), static_cast<long long>(m.seq),
      static_cast<long long>(m.vocab));
  std::string sched(pipeline::schedule_name(r.schedule));
  if (r.shape.chunks > 1) sched += " (v = " + std::to_string(r.shape.chunks) + ")";
  put("  parallelism   TP %d x PP %d x DP %d, %s, sp %s%s, recompute %s, ZeRO-1 (distributed optimizer%s)\n", p.tp,
      p.pp, p.dp, sched.c_str(), p.sp ? "on" : "off", p.tp_comm_overlap ? " (TP comm overlapped)" : "",
      std::string(model::to_string(p.recompute)).c_str(),
      p.overlap_param_gather && p.dp > 1 ? ", parameter all-gather overlapped with the first forward" : "");
  put("  batch         %lld sequences of %lld tokens, micro-batch %lld, %d micro-batches per pipeline\n",
      static_cast<long long>(p.global_batch), static_cast<long long>(m.seq), static_cast<long long>(p.micro_batch),
      r.shape.micro_batches);
  if (profile == nullptr) {
    out += "  costs         roofline model\n";
  } else if (profile->at_scale != 1.0) {
    // Said where it applies: a user comparing with one GPU's run should know why it is slower.
    put("  costs         kernel-level model, profile %s; GEMMs and attention at %.2f of its efficiencies\n"
        "                (its at-scale fraction for jobs of many GPUs: docs/model.md)\n",
        profile->name.c_str(), profile->at_scale);
  } else {
    put("  costs         kernel-level model, profile %s\n", profile->name.c_str());
  }
  put("  iteration     %.3f s (%lld ns)\n", static_cast<double>(r.iteration_ns) / 1e9,
      static_cast<long long>(r.iteration_ns));
  put("  throughput    %.0f tokens/s\n", r.tokens_per_s);
  put("  model FLOPs   %.1f TFLOP/s per GPU, MFU %s   (Megatron: %s*B*s*l*h^2*(1 + s/6h + V/12lh) per %siteration;\n",
      r.model_tflops_per_gpu, detail::pct(r.mfu).c_str(), r.forward_only ? "24" : "72", r.forward_only ? "forward-only " : "");
  put("                peak %.1f TFLOP/s dense %s)\n", r.peak_flops_per_gpu / 1e12,
      std::string(model::to_string(p.dtype)).c_str());
  put("  hardware FLOPs %.1f TFLOP/s per GPU, HFU %s   (adds the forward work recomputation reruns)\n",
      r.hardware_tflops_per_gpu, detail::pct(r.hfu).c_str());
  put("  pipeline bubble %s   (1 - mean stage busy time / pipeline phase of %s; the phase ends with the last\n",
      detail::pct(r.bubble_fraction).c_str(), detail::ms_text(r.pipeline_ns).c_str());
  out += "                forward/backward op; busy = passes and TP collectives on the compute stream)\n";
  const auto window = static_cast<double>(r.breakdown_window_ns > 0 ? r.breakdown_window_ns : 1);
  put("  breakdown     rank %d (stage 0, tp 0, dp 0), window %s: exposed compute %s (%s), overlapped %s (%s),\n",
      r.breakdown_rank, detail::ms_text(r.breakdown_window_ns).c_str(), detail::ms_text(r.breakdown.exposed_compute).c_str(),
      detail::pct(static_cast<double>(r.breakdown.exposed_compute) / window).c_str(),
      detail::ms_text(r.breakdown.overlapped).c_str(),
      detail::pct(static_cast<double>(r.breakdown.overlapped) / window).c_str());
  put("                exposed communication %s (%s), other %s (%s); SM utilisation %s\n",
      detail::ms_text(r.breakdown.exposed_comm).c_str(),
      detail::pct(static_cast<double>(r.breakdown.exposed_comm) / window).c_str(),
      detail::ms_text(r.breakdown.other).c_str(), detail::pct(static_cast<double>(r.breakdown.other) / window).c_str(),
      detail::pct(r.sm_utilization).c_str());
  const auto& mem = r.memory;
  put("  memory/GPU    %s on stage %d (the largest; %s of HBM %s): parameters %s, gradients %s,\n",
      detail::bytes_text(mem.total()).c_str(), r.memory_stage,
      detail::bytes_text(static_cast<double>(j.hardware.gpu.hbm_capacity)).c_str(),
      mem.fits(j.hardware) ? "fits" : "DOES NOT FIT", detail::bytes_text(mem.parameters).c_str(),
      detail::bytes_text(mem.gradients).c_str());
  put("                optimizer %s, activations %s (%.2f micro-batches in flight)\n",
      detail::bytes_text(mem.optimizer_states).c_str(),
      detail::bytes_text(mem.activations + mem.io_activations + mem.recompute_working).c_str(),
      r.in_flight_microbatches);
  out += "                (bf16 weights 2 B, fp32 main gradients 4 B, Adam 12 B per parameter sharded over DP;\n"
         "                activations per Korthikanti et al. with FlashAttention)\n";
  put("  simulated     %zu ranks%s, %zu tasks, %zu edges, in %.1f ms\n", r.simulated_ranks,
      r.unfolded ? " (every rank)" : " (one per stage; identical ranks folded)", r.tasks, r.edges, wall_ms);
}

/// What `write_synth` wrote.
struct synth_output {
  std::vector<std::filesystem::path> files;
  std::vector<int> ranks;
  std::size_t tasks = 0;
  time_ns makespan = 0;
};

/// Builds the iteration of `req` one task per kernel, simulates it and writes it as Kineto traces
/// into `dir` (what `lumos synth` does; `predict --report` reports on such traces). `kernel_detail`:
/// the traces of `lumos synth --detail kernel` (synth/kernel_trace.hpp).
inline synth_output write_synth(const predict_request& req, const std::filesystem::path& dir, bool gzip,
                                bool kernel_detail = false) {
  synth::program_options opt;
  opt.unfold = req.unfold;
  opt.detail = synth::granularity::kernel;
  opt.record_collectives = true;
  opt.notes = kernel_detail;
  apply_profile(req, opt);
  const synth::program prog = req.roofline ? synth::build_program(req.job, opt)
                                           : synth::build_program(req.job, opt, model::kernel_level{req.profile},
                                                                  model::nccl_model{req.profile});
  const graph::compiled_graph compiled = graph::compile(prog.graph);
  sim::replay_engine engine;
  sim::record_timeline timeline;
  const time_ns makespan = engine.run(compiled, timeline);

  report::simulated_job sj;
  sj.graph = &prog.graph;
  sj.simulated = report::simulated_times(timeline, compiled);
  sj.world_size = static_cast<int>(prog.world_size);
  sj.device_name = req.job.hardware.name;
  report::trace_decorations decorations;
  if (kernel_detail) {
    decorations = synth::kernel_trace_decorations(prog, req.job, req.roofline ? time_ns{-1} : static_cast<time_ns>(req.profile.cpu_launch_ns));
    sj.decorations = &decorations;
  }
  std::vector<int> ranks;
  for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  synth_output o;
  o.files = report::write_kineto(sj, ranks, dir, gzip);
  o.ranks = std::move(ranks);
  o.tasks = prog.graph.task_count();
  o.makespan = makespan;
  return o;
}

/// `predict --report FILE`: the modelled iteration written as traces (as `lumos synth`) into a
/// temporary directory, replayed, and reported as HTML; the directory is removed.
inline void predict_report(const predict_request& req, const std::string& file) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lumos-predict-report-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  struct cleanup {
    fs::path d;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } guard{dir};
  (void)write_synth(req, dir, false);
  const trace::job job = trace::load_job({dir});
  const report::replay_session s = report::replay_job(job);
  report::html_options ho;
  ho.title = "lumos predict: " + req.job.model.name;
  ho.inputs = {"lumos predict (modelled, one trace per pipeline stage)"};
  report::detail::write_file(file, report::html_report(job, s, ho));
}

inline int run_predict(args& a) {
  const bool json = a.flag("--json");
  const auto html = a.option("--report");
  predict_request req = parse_predict(a);
  if (const auto rest = a.positionals(); !rest.empty()) throw usage_error("unexpected argument '" + rest.front() + "'");
  synth::predict_options opt;
  opt.program.unfold = req.unfold;
  const auto t0 = std::chrono::steady_clock::now();
  const synth::prediction r = run_model(req, opt);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string out;
  if (json) {
    predict_json(req.job, r, wall_ms, out, req.roofline ? std::string("roofline") : req.profile.name);
  } else {
    predict_text(req.job, r, wall_ms, out, req.roofline ? nullptr : &req.profile);
  }
  if (html) {
    predict_report(req, *html);
    if (!json) out += "wrote " + *html + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

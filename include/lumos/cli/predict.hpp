#pragma once
// `lumos predict`'s flags (lumos/cli/args.hpp): the model, its parallelism and batch, the GPU,
// precision, cost profile and cost model, read into a `predict_request`, and the prediction it
// asks for. `lumos predict`, `synth`, `sweep` (its model and machine flags) and the Python
// package's `lumos.predict` read them here. Bad values are `lumos::error`s; unknown flags and
// stray words are usage errors.

#include <lumos/cli/args.hpp>
#include <lumos/core/error.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/synth/schedules.hpp>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

namespace lumos::cli {

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

// `--NAME on|off`, when given (returned).
inline bool on_off(args& a, std::string_view name, bool& target) {
  const auto v = a.option(name);
  if (v) {
    if (*v != "on" && *v != "off") throw lumos::error(std::string(name) + " must be on or off, got '" + *v + "'");
    target = *v == "on";
  }
  return v.has_value();
}

}  // namespace detail

/// What `lumos predict` parsed: the job to model and the cost model to model it with.
struct predict_request {
  synth::job job;
  bool unfold = false;
  bool roofline = false;
  bool forward_only = false;
  /// `--reshard-after-forward` was given: an FSDP setting, refused without FSDP (`require_fsdp_for_settings`).
  bool reshard_after_forward_given = false;
  model::cost_profile profile;

  /// The cost model's name as the reports print it: "roofline", or the profile's name.
  [[nodiscard]] std::string profile_name() const { return roofline ? std::string("roofline") : profile.name; }
};

/// `text` ("bf16", "fp16" or "fp8") as a precision, or a one-line `lumos::error` naming `flag`:
/// the `--precision` of predict, synth, sweep (each item of its list) and whatif.
inline model::precision parse_precision(std::string_view text, std::string_view flag = "--precision") {
  for (const model::precision p : {model::precision::bf16, model::precision::fp16, model::precision::fp8}) {
    if (text == model::to_string(p)) return p;
  }
  throw lumos::error(std::string(flag) + " must be bf16, fp16 or fp8, got '" + std::string(text) + "'");
}

/// Reads a profile file (`lumos calibrate -o`), on top of the preset of the hardware it names
/// (A100's when it names none of the presets).
inline model::cost_profile read_profile_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw lumos::error("profile '" + path + "' is a directory: give the JSON file `lumos calibrate -o` wrote");
  }
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

namespace detail {

// The mixture-of-experts flags, over the preset's: --experts makes a dense model a MoE one
// (its experts as wide as its MLP unless --expert-ffn says otherwise).
inline void parse_moe(args& a, model::transformer& m) {
  model::moe_spec& x = m.moe;
  if (const auto v = a.option("--experts")) {
    if (!m.is_moe()) x.expert_ffn = m.ffn;
    x.experts = positive_value(*v, "--experts");
  }
  if (const auto v = a.option("--top-k")) x.top_k = positive_value(*v, "--top-k");
  if (const auto v = a.option("--expert-ffn")) x.expert_ffn = positive_value(*v, "--expert-ffn");
  if (const auto v = a.option("--shared-experts")) {
    std::int64_t n = -1;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc{} || end != v->data() + v->size() || n < 0) {
      throw lumos::error("--shared-experts must be a non-negative integer, got '" + *v + "'");
    }
    x.shared_experts = n;
  }
  if (const auto v = a.option("--moe-dispatcher")) {
    if (*v != "alltoall" && *v != "allgather") throw lumos::error("--moe-dispatcher must be alltoall or allgather, got '" + *v + "'");
    x.dispatcher = *v == "alltoall" ? model::moe_dispatcher::alltoall : model::moe_dispatcher::allgather;
  }
  if (const auto v = a.option("--capacity-factor")) {
    if (*v == "dropless") {
      x.capacity_factor = 0;
    } else {
      double f = 0;
      const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), f);
      if (ec != std::errc{} || end != v->data() + v->size() || !(f > 0) || f > 1e6) {
        throw lumos::error("--capacity-factor must be a positive number or dropless, got '" + *v + "'");
      }
      x.capacity_factor = f;
    }
  }
  if (!m.is_moe() && (x.top_k > 0 || x.shared_experts > 0 || x.expert_ffn > 0)) {
    throw lumos::error("--top-k, --expert-ffn and --shared-experts need a mixture-of-experts model: give --experts N");
  }
  if (const auto v = a.option("--mtp-layers")) {
    std::int64_t n = -1;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc{} || end != v->data() + v->size() || n < 0 || n > model::transformer::max_layers) {
      throw lumos::error("--mtp-layers must be an integer in [0, " + std::to_string(model::transformer::max_layers) + "], got '" + *v + "'");
    }
    m.mtp_layers = n;
  }
}

// --model and the shape flags that override it.
inline model::transformer parse_model(args& a) {
  model::transformer m = model::model_preset(a.option("--model").value_or("gpt3-175b"));
  const model::transformer preset = m;
  const bool mha = m.kv_heads == m.heads;
  const bool ffn_4h = m.ffn == 4 * m.hidden;
  m.layers = positive_int(a, "--layers", m.layers);
  // At most 2^24 (positive_small), as --micro-batch below, so that the products made of them here
  // (4h, the default global batch) cannot overflow: the CLI fuzzer found --hidden 3.3e18.
  m.hidden = positive_small(a, "--hidden", static_cast<int>(m.hidden));
  if (const auto ffn = a.option("--ffn")) {
    m.ffn = positive_value(*ffn, "--ffn");
  } else if (ffn_4h) {
    m.ffn = 4 * m.hidden;
  }
  m.heads = positive_int(a, "--heads", m.heads);
  if (const auto kv = a.option("--kv-heads")) {
    m.kv_heads = positive_value(*kv, "--kv-heads");
  } else if (mha) {
    m.kv_heads = m.heads;
  }
  m.seq = positive_int(a, "--seq", m.seq);
  m.vocab = positive_int(a, "--vocab", m.vocab);
  parse_moe(a, m);
  // A shape that is not the preset's is not the preset: say so instead of its name.
  const model::moe_spec& x = m.moe;
  const model::moe_spec& y = preset.moe;
  if (m.layers != preset.layers || m.hidden != preset.hidden || m.ffn != preset.ffn || m.heads != preset.heads ||
      m.kv_heads != preset.kv_heads || m.seq != preset.seq || m.vocab != preset.vocab || x.experts != y.experts ||
      x.top_k != y.top_k || x.expert_ffn != y.expert_ffn || x.shared_experts != y.shared_experts ||
      x.capacity_factor != y.capacity_factor || x.dispatcher != y.dispatcher) {
    m.name = "custom";
  }
  return m;
}

// The parallel sizes, batch, recomputation and precision; `reshard_given`: whether
// --reshard-after-forward was given.
inline model::parallel_config parse_parallel(args& a, bool& reshard_given) {
  model::parallel_config p;
  p.tp = positive_small(a, "--tp", 1);
  p.pp = positive_small(a, "--pp", 1);
  p.dp = positive_small(a, "--dp", 1);
  p.cp = positive_small(a, "--cp", 1);
  if (const auto c = a.option("--cp-comm")) {
    if (*c != "p2p" && *c != "allgather") throw lumos::error("--cp-comm must be p2p or allgather, got '" + *c + "'");
    p.cp_comm = *c == "p2p" ? model::cp_comm_kind::p2p : model::cp_comm_kind::allgather;
  }
  p.vp = positive_small(a, "--vp", 1);
  p.ep = positive_small(a, "--ep", 1);
  p.etp = positive_small(a, "--expert-tp", 0);  // 0: Megatron's default, the tp size
  on_off(a, "--sp", p.sp);
  on_off(a, "--tp-comm-overlap", p.tp_comm_overlap);
  on_off(a, "--overlap-param-gather", p.overlap_param_gather);
  p.micro_batch = positive_small(a, "--micro-batch", 1);
  if (const auto gb = a.option("--global-batch")) {
    p.global_batch = positive_value(*gb, "--global-batch");
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
  if (const auto prec = a.option("--precision")) p.dtype = parse_precision(*prec);
  // FSDP is ZeRO-3 (--dp is then the sharding degree, --hsdp the shard group under hybrid
  // sharding); otherwise Megatron's distributed optimizer (ZeRO-1), or with it off DDP (ZeRO-0:
  // gradients all-reduced, optimizer states replicated on every DP rank).
  on_off(a, "--fsdp", p.fsdp);
  p.hsdp = positive_small(a, "--hsdp", 0);
  reshard_given = on_off(a, "--reshard-after-forward", p.reshard_after_forward);
  bool distributed_optimizer = true;
  on_off(a, "--distributed-optimizer", distributed_optimizer);
  if (!distributed_optimizer && p.fsdp) {
    throw lumos::error("--distributed-optimizer off: --fsdp on is ZeRO-3, which shards the optimizer states itself; give one of them");
  }
  if (!distributed_optimizer && p.overlap_param_gather) {
    throw lumos::error("--overlap-param-gather on overlaps the distributed optimizer's parameter all-gathers: it needs "
                       "--distributed-optimizer on (DDP gathers no parameters)");
  }
  p.zero_stage = p.fsdp ? 3 : distributed_optimizer ? 1 : 0;
  return p;
}

// The GPU, the cost profile and the cost model.
inline void parse_costs(args& a, predict_request& req) {
  const auto gpu = a.option("--gpu");
  if (const auto file = a.option("--profile")) {
    req.profile = read_profile_file(*file);
    req.job.hardware = model::hardware_preset(gpu.value_or(req.profile.hardware));
  } else {
    req.job.hardware = model::hardware_preset(gpu.value_or("h100-sxm"));
    req.profile = model::profile_preset(req.job.hardware.name);
  }
  if (const auto att = a.option("--attention")) {
    if (*att != "flash" && *att != "unfused") throw lumos::error("--attention must be flash or unfused, got '" + *att + "'");
    req.profile.attention = *att == "flash" ? model::attention_impl::flash : model::attention_impl::unfused;
  }
  if (const auto cm = a.option("--cost-model")) {
    if (*cm != "kernel" && *cm != "roofline") throw lumos::error("--cost-model must be kernel or roofline, got '" + *cm + "'");
    req.roofline = *cm == "roofline";
  }
}

// --pipeline-layout STR, or --decoder-first/last-pipeline-num-layers N (Megatron's flags; not
// both kinds): the layers of each virtual stage, checked against the model by validate.
inline void parse_layout(args& a, const model::transformer& m, model::parallel_config& p) {
  const auto text = a.option("--pipeline-layout");
  auto layers = [&](std::string_view name) -> std::int64_t {
    const auto v = a.option(name);
    if (!v) return -1;
    if (*v == "0") return 0;
    return positive_value(*v, name);
  };
  const std::int64_t first = layers("--decoder-first-pipeline-num-layers");
  const std::int64_t last = layers("--decoder-last-pipeline-num-layers");
  if (text && (first >= 0 || last >= 0)) {
    throw lumos::error("--pipeline-layout places every layer: leave out --decoder-first/last-pipeline-num-layers");
  }
  if (text) p.layout = model::parse_pipeline_layout(*text);
  if (first >= 0 || last >= 0) {
    p.layout = model::uneven_first_last_layout(m.layers, m.mtp_layers, p.pp, p.vp, first, last);
  }
}

}  // namespace detail

/// A one-line error when `--hsdp` or `--reshard-after-forward` was given to a job without FSDP
/// (`fsdp`: predict's --fsdp, or whether sweep's --fsdp list has on): they would change nothing.
inline void require_fsdp_for_settings(const predict_request& req, bool fsdp) {
  if (fsdp) return;
  const char* flag = req.job.parallel.hsdp > 0 ? "--hsdp" : req.reshard_after_forward_given ? "--reshard-after-forward" : nullptr;
  if (flag != nullptr) throw lumos::error(std::string(flag) + " is a setting of FSDP: it needs --fsdp on");
}

/// Reads `lumos predict`'s flags from `a` (leaving other words for the caller to check).
/// `listed`: the caller read the sizes and --fsdp itself as lists (sweep) and checks the settings
/// that depend on them.
inline predict_request parse_predict(args& a, bool listed = false) {
  predict_request req;
  req.job.model = detail::parse_model(a);
  req.job.parallel = detail::parse_parallel(a, req.reshard_after_forward_given);
  if (!listed) {
    require_fsdp_for_settings(req, req.job.parallel.fsdp);
    // As whatif: the exchange of keys and values of a job without context parallelism is none.
    if (req.job.parallel.cp == 1 && req.job.parallel.cp_comm != model::cp_comm_kind::p2p) {
      throw lumos::error("--cp-comm allgather: the job has no context parallelism (cp 1); --cp N sets it");
    }
  }
  detail::parse_layout(a, req.job.model, req.job.parallel);
  if (const auto s = a.option("--schedule")) req.job.schedule = synth::parse_schedule(*s);
  detail::parse_costs(a, req);
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

}  // namespace lumos::cli

#pragma once
// `lumos sweep`'s flags (lumos/cli/args.hpp): predict's model and machine flags, the GPU count
// and the lists of the searched sizes, read into a `sweep_request`; the search problem and the
// configurations it asks for, and the evaluator of its cost model. `lumos sweep` and the Python
// package's `lumos.sweep` read them here.

#include <lumos/cli/args.hpp>
#include <lumos/cli/predict.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::cli {

/// Everything `lumos sweep` parsed.
struct sweep_request {
  predict_request base;  ///< model, hardware, profile, cost model (the precisions: `space`)
  std::int64_t gpus = 0;
  sweep::space space;
  std::int64_t global_batch = 1536;
  double memory_margin = 0.10;
  std::size_t top = 10;
  unsigned threads = 0;
  std::string csv;
  std::string report;  ///< `--report FILE`: the HTML page (empty: none)
  bool json = false;
};

namespace detail {

// The list flags as given (read before predict's parser, which would take them as numbers).
struct sweep_lists {
  std::optional<std::string> tp, pp, dp, cp, vp, ep, micro_batch, schedule, recompute, sp, global_batch, memory_margin, top, threads;
  std::optional<std::string> fsdp, precision;
};

// A list of sizes, each in [1, 2^24]; `fallback` when the flag is absent.
inline std::vector<int> sizes(const std::optional<std::string>& v, std::string_view flag, std::vector<int> fallback) {
  if (!v) return fallback;
  std::vector<int> out;
  for (const std::string& item : split_list(*v, flag)) {
    const int x = parse_number<int>(item, flag);
    if (x < 1 || x > (1 << 24)) throw usage_error(std::string(flag) + " values must be in [1, 2^24], got " + item);
    out.push_back(x);
  }
  return out;
}

// The schedules, recomputations and sequence-parallel settings searched.
inline void parse_variants(const sweep_lists& l, sweep::space& s) {
  s.schedules.clear();
  if (l.schedule) {
    for (const std::string& name : split_list(*l.schedule, "--schedule")) s.schedules.push_back(synth::parse_schedule(name));
  } else {
    s.schedules.push_back(synth::policy_of<pipeline::one_f_one_b>());
    if (std::any_of(s.vp.begin(), s.vp.end(), [](int v) { return v > 1; })) {
      s.schedules.push_back(synth::policy_of<pipeline::interleaved_one_f_one_b>());
    }
  }
  s.recompute.clear();
  for (const std::string& r : split_list(l.recompute.value_or("none,selective,full"), "--recompute")) {
    if (r == "none") {
      s.recompute.push_back(model::recompute_kind::none);
    } else if (r == "selective") {
      s.recompute.push_back(model::recompute_kind::selective);
    } else if (r == "full") {
      s.recompute.push_back(model::recompute_kind::full);
    } else {
      throw usage_error("--recompute values must be none, selective or full, got '" + r + "'");
    }
  }
  s.sp.clear();
  for (const std::string& v : split_list(l.sp.value_or("off,on"), "--sp")) {
    if (v != "on" && v != "off") throw usage_error("--sp values must be on or off, got '" + v + "'");
    s.sp.push_back(v == "on");
  }
  s.fsdp.clear();
  for (const std::string& v : split_list(l.fsdp.value_or("off"), "--fsdp")) {
    if (v != "on" && v != "off") throw usage_error("--fsdp values must be on or off, got '" + v + "'");
    s.fsdp.push_back(v == "on");
  }
  s.precisions.clear();
  for (const std::string& v : split_list(l.precision.value_or("bf16"), "--precision")) s.precisions.push_back(parse_precision(v));
}

// A listed precision the GPU lacks is rejected configuration by configuration (counted under
// `precision`) when another listed one runs; when none does, the sweep is an error, the one a
// single precision gives (exit 2).
inline void check_precisions(const sweep_request& req) {
  const model::hardware& hw = req.base.job.hardware;
  const auto& ps = req.space.precisions;
  if (std::none_of(ps.begin(), ps.end(), [&](model::precision p) { return hw.supports(p); })) (void)hw.peak_flops(ps.front());
}

// --ep or --expert-tp on a dense model, only FSDP for a MoE one, or only FSDP with the
// distributed optimizer off: an error as predict's, not a space of rejections.
inline void check_experts(const sweep_request& req) {
  const auto& ep = req.space.ep;
  const int most = ep.empty() ? 1 : *std::max_element(ep.begin(), ep.end());
  model::parallel_config p;
  p.ep = most;
  p.etp = req.base.job.parallel.etp;
  if (!req.base.job.model.is_moe()) p.validate_experts(req.base.job.model);
  const auto& fsdp = req.space.fsdp;
  if (req.base.job.parallel.zero_stage == 0 && std::find(fsdp.begin(), fsdp.end(), false) == fsdp.end()) {
    throw usage_error("--distributed-optimizer off: every configuration of --fsdp on is ZeRO-3, which shards the optimizer "
                      "states itself; list off too, or leave --distributed-optimizer out");
  }
  if (req.base.job.model.is_moe() && std::find(fsdp.begin(), fsdp.end(), false) == fsdp.end()) {
    throw usage_error("--fsdp on: FSDP (ZeRO-3) of a mixture-of-experts model is not modelled; list off too, or leave --fsdp out");
  }
}

// The global batch, memory margin, ranking length and thread count.
inline void parse_limits(const sweep_lists& l, sweep_request& req) {
  if (l.global_batch) {
    req.global_batch = parse_number<std::int64_t>(*l.global_batch, "--global-batch");
    if (req.global_batch < 1) throw usage_error("--global-batch must be positive, got " + *l.global_batch);
  }
  if (l.memory_margin) {
    req.memory_margin = parse_number<double>(*l.memory_margin, "--memory-margin");
    if (!(req.memory_margin >= 0 && req.memory_margin < 1)) throw usage_error("--memory-margin must be in [0, 1), got " + *l.memory_margin);
  }
  if (l.top) {
    const auto k = parse_number<std::int64_t>(*l.top, "--top");
    if (k < 0) throw usage_error("--top must be non-negative, got " + *l.top);
    req.top = static_cast<std::size_t>(k);
  }
  if (l.threads) {
    const auto t = parse_number<std::int64_t>(*l.threads, "--threads");
    if (t < 1 || t > 4096) throw usage_error("--threads must be in [1, 4096], got " + *l.threads);
    req.threads = static_cast<unsigned>(t);
  }
}

}  // namespace detail

/// Reads `lumos sweep`'s flags from `a` (leaving other words for the caller to check).
inline sweep_request parse_sweep(args& a) {
  sweep_request req;
  const auto gpus = a.option("--gpus");
  if (!gpus) throw usage_error("--gpus N is required");
  req.gpus = parse_number<std::int64_t>(*gpus, "--gpus");
  if (req.gpus < 1 || req.gpus > (std::int64_t{1} << 24)) throw usage_error("--gpus must be in [1, 2^24], got " + *gpus);
  if (a.flag("--unfold") || a.flag("--forward-only")) throw usage_error("--unfold and --forward-only are predict's only");
  detail::sweep_lists l;
  l.tp = a.option("--tp");
  l.pp = a.option("--pp");
  l.dp = a.option("--dp");
  l.cp = a.option("--cp");
  l.vp = a.option("--vp");
  l.ep = a.option("--ep");
  l.micro_batch = a.option("--micro-batch");
  l.schedule = a.option("--schedule");
  l.recompute = a.option("--recompute");
  l.sp = a.option("--sp");
  l.fsdp = a.option("--fsdp");
  l.precision = a.option("--precision");
  l.global_batch = a.option("--global-batch");
  l.memory_margin = a.option("--memory-margin");
  l.top = a.option("--top");
  l.threads = a.option("--threads");
  if (const auto f = a.option("--csv")) req.csv = *f;
  if (const auto f = a.option("--report")) req.report = *f;
  req.json = a.flag("--json");
  if (a.option("--decoder-first-pipeline-num-layers") || a.option("--decoder-last-pipeline-num-layers")) {
    throw usage_error("sweep takes a fixed --pipeline-layout, not --decoder-first/last-pipeline-num-layers");
  }
  req.base = parse_predict(a, true);  // model, GPU, profile, cost model flags, --pipeline-layout
  if (const model::pipeline_layout& layout = req.base.job.parallel.layout; !layout.empty()) {
    // Its counts against the model once here; its virtual stages against each configuration's pp * vp.
    model::parallel_config whole;
    whole.pp = layout.virtual_stages();
    whole.layout = layout;
    whole.validate_layout(req.base.job.model);
  }

  sweep::space& s = req.space;
  const model::transformer& m = req.base.job.model;
  // TP groups stay inside one NVLink domain by default (up to 64 on GB200 NVL72).
  s.tp = detail::sizes(l.tp, "--tp", sweep::powers_of_two(std::min<std::int64_t>(req.gpus, req.base.job.hardware.nvlink_domain_size())));
  s.pp = detail::sizes(l.pp, "--pp", sweep::powers_of_two(std::min<std::int64_t>(req.gpus, m.layers)));
  s.dp = detail::sizes(l.dp, "--dp", {});
  s.cp = detail::sizes(l.cp, "--cp", {1});
  s.vp = detail::sizes(l.vp, "--vp", {1});
  s.ep = detail::sizes(l.ep, "--ep", {1});
  s.expert_tp = req.base.job.parallel.etp;
  s.micro_batch.clear();
  for (const int x : detail::sizes(l.micro_batch, "--micro-batch", {1, 2, 4})) s.micro_batch.push_back(x);
  detail::parse_variants(l, s);
  require_fsdp_for_settings(req.base, std::find(s.fsdp.begin(), s.fsdp.end(), true) != s.fsdp.end());
  if (req.base.job.parallel.cp_comm != model::cp_comm_kind::p2p && std::none_of(s.cp.begin(), s.cp.end(), [](int c) { return c > 1; })) {
    throw usage_error("--cp-comm allgather: no --cp of the space is above 1");
  }
  detail::check_experts(req);
  detail::parse_limits(l, req);
  detail::check_precisions(req);
  return req;
}

/// The search problem of a request (model, machine, batch, memory margin).
inline sweep::problem sweep_problem(const sweep_request& req) {
  sweep::problem p;
  p.model = req.base.job.model;
  p.hardware = req.base.job.hardware;
  p.tp_comm_overlap = req.base.job.parallel.tp_comm_overlap;
  p.overlap_param_gather = req.base.job.parallel.overlap_param_gather;
  p.zero_stage = req.base.job.parallel.zero_stage;  // 1, or 0 (DDP); FSDP configurations take 3
  p.cp_comm = req.base.job.parallel.cp_comm;
  p.expert_tp = req.base.job.parallel.etp;
  p.hsdp = req.base.job.parallel.hsdp;
  p.reshard_after_forward = req.base.job.parallel.reshard_after_forward;
  p.layout = req.base.job.parallel.layout;
  p.gpus = req.gpus;
  p.global_batch = req.global_batch;
  p.memory_margin = req.memory_margin;
  if (!req.base.roofline) {
    apply_profile(req.base, p.options.program);
    const auto& ps = req.space.precisions;
    p.options.program.loss_scale_host_sync =
        req.base.profile.cpu_loss_scale_sync > 0 && std::find(ps.begin(), ps.end(), model::precision::fp16) != ps.end();
  }
  return p;
}

/// The configurations of the request's lists that multiply to its GPU count.
inline std::vector<sweep::configuration> sweep_configurations(const sweep_request& req) {
  std::vector<sweep::configuration> configs = sweep::enumerate(req.space, req.gpus);
  if (configs.empty()) {
    sweep::space any_ep = req.space;
    any_ep.ep = {1};
    any_ep.expert_tp = 0;
    if (!sweep::enumerate(any_ep, req.gpus).empty()) {
      throw usage_error("no --ep of the list, with expert TP " + (req.space.expert_tp > 0 ? std::to_string(req.space.expert_tp) : std::string("= tp")) +
                        ", divides TP x CP x DP of a configuration of " + std::to_string(req.gpus) + " GPUs (EP x expert TP must)");
    }
    throw usage_error("no configuration of the lists multiplies to " + std::to_string(req.gpus) + " GPUs");
  }
  return configs;
}

/// Calls `run(evaluator)` with the evaluator of the request's cost model (`--cost-model`), so
/// that the CLI, MPI and the Python binding evaluate with the same models.
template <class Run>
auto with_sweep_evaluator(const sweep_request& req, const sweep::problem& p, Run&& run) {
  if (req.base.roofline) return run(sweep::evaluator<model::roofline, model::ring_alpha_beta>(p));
  return run(sweep::evaluator<>(p, model::kernel_level{req.base.profile}, model::nccl_model{req.base.profile}));
}

}  // namespace lumos::cli

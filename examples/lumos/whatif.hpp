#pragma once
// lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]
//              [--seq N] [--micro-batch N] [--tp N] [--step N] [--scale ...]... [--json]
//              [--trace-out DIR]

#include "cli.hpp"
#include "replay.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view whatif_usage =
    "usage: lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
    "                    [--seq N] [--micro-batch N] [--tp N] [--step N] [--scale KIND=F]...\n"
    "                    [--scale op:TEXT=F]... [--json] [--trace-out DIR] [--report FILE]\n"
    "  Rewrites the execution graph built from a job's traces for another configuration and replays\n"
    "  it: what the trace measured and the change does not touch stays; waits are recomputed.\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n"
    "  --gpu PRESET        another GPU (a100-sxm-80gb, h100-sxm, h200-sxm): compute-bound kernels by\n"
    "                      the tensor-core peak ratio, memory-bound ones by HBM bandwidth, transfers by\n"
    "                      NVLink bandwidth; CPU time and launch overheads stay\n"
    "  --from-gpu PRESET   the traces' GPU, when their deviceProperties name none of the presets\n"
    "  --layers N          N transformer layers: each layer's launches and kernels (found by `lumos inspect\n"
    "                      --structure`) repeated or removed in place, with its collectives\n"
    "  --hidden N, --ffn N, --heads N, --seq N, --micro-batch N\n"
    "                      another model shape: each GPU op rescaled by its modelled time in the new\n"
    "                      shape over the traced one (GEMMs from their Input Dims, attention by\n"
    "                      b·heads·s²·d, other kernels by activation bytes, collectives through the\n"
    "                      NCCL model); needs the shape in the traces (`lumos inspect --structure`)\n"
    "  --tp N              another tensor-parallel size: per-rank GEMMs and heads divided by N, TP\n"
    "                      collectives over N ranks; the traced ranks stand for the new TP group\n"
    "  --step N, --scale   as for `lumos replay`, applied to the baseline and the prediction\n"
    "  --json              {\"baseline\":{...},\"predicted\":{...},\"changes\":[...],\"shape\":{...}}\n"
    "  --trace-out DIR     write the predicted job as Kineto traces (one file per rank), which\n"
    "                      `lumos replay` reads back and replays to the same prediction\n"
    "  --report FILE       the HTML report of the prediction, with the baseline beside it\n";

inline void session_json(json_writer& w, const report::replay_session& s) {
  w.begin_object().field("iteration_ns", s.simulated_ns).field("measured_ns", s.measured_ns);
  w.key("ranks").begin_array();
  for (const auto& r : s.ranks) {
    w.begin_object().field("rank", r.rank).field("step", r.step).field("iteration_ns", r.simulated_ns);
    w.key("breakdown");
    breakdown_json(w, r.simulated.split);
    w.field("sm_utilization", r.simulated.sm.mean).end_object();
  }
  w.end_array().end_object();
}

inline void shape_json(json_writer& w, const whatif::shape_summary& s) {
  auto config = [&](const char* key, const whatif::shape_config& c, const whatif::shape_figures& f, double mfu) {
    w.key(key).begin_object();
    w.field("hidden", c.hidden).field("ffn", c.ffn).field("heads", c.heads).field("head_dim", c.head_dim).field("seq", c.seq);
    w.field("micro_batch_size", c.micro_batch).field("tp", c.tp).field("world", f.world);
    w.field("memory_bytes_per_gpu", f.memory_bytes_per_gpu).field("model_flops_per_rank", f.model_flops_per_rank).field("mfu", mfu);
    w.field("vocab_known", f.vocab_known).end_object();
  };
  w.key("shape").begin_object();
  config("baseline", s.from, s.baseline, s.mfu_baseline);
  config("predicted", s.to, s.predicted, s.mfu_predicted);
  w.end_object();
}

inline std::string shape_text(const whatif::shape_summary& s) {
  std::string out;
  char line[512];
  auto row = [&](const char* what, const whatif::shape_config& c, const whatif::shape_figures& f, double mfu) {
    std::snprintf(line, sizeof line, "  %-9s hidden %lld, FFN %lld, %lld heads of %lld, seq %lld, micro-batch %lld, TP %d, %lld ranks: %.2f GiB per GPU, MFU %.1f %%\n",
                  what, static_cast<long long>(c.hidden), static_cast<long long>(c.ffn), static_cast<long long>(c.heads),
                  static_cast<long long>(c.head_dim), static_cast<long long>(c.seq), static_cast<long long>(c.micro_batch), c.tp,
                  static_cast<long long>(f.world), f.memory_bytes_per_gpu / 1073741824.0, 100.0 * mfu);
    out += line;
  };
  out += "\nmodel shape (memory per GPU: model/memory.hpp; MFU: model FLOPs per rank of the layers" +
         std::string(s.baseline.vocab_known ? " and the logits" : " (the vocabulary is not in the traces)") + ")\n";
  row("baseline", s.from, s.baseline, s.mfu_baseline);
  row("predicted", s.to, s.predicted, s.mfu_predicted);
  return out;
}

inline int run_whatif(args& a) {
  whatif::whatif_options o;
  if (const auto step = a.option("--step")) o.replay.step = parse_number<int>(*step, "--step");
  const what_if scaled = parse_scales(a.options("--scale"));
  o.replay.scales = scaled.scales;
  o.replay.build.op_scales = scaled.ops;
  if (const auto gpu = a.option("--gpu")) o.gpu = *gpu;
  if (const auto layers = a.option("--layers")) {
    o.layers = parse_number<int>(*layers, "--layers");
    if (*o.layers <= 0) throw usage_error("--layers must be a positive number of layers (got " + *layers + ")");
  }
  if (const auto from = a.option("--from-gpu")) o.from_gpu = *from;
  for (const auto& [flag, field] : {std::pair{"--hidden", &o.shape.hidden}, std::pair{"--ffn", &o.shape.ffn}, std::pair{"--heads", &o.shape.heads},
                                    std::pair{"--seq", &o.shape.seq}, std::pair{"--micro-batch", &o.shape.micro_batch}}) {
    if (const auto v = a.option(flag)) {
      *field = parse_number<std::int64_t>(*v, flag);
      if (**field <= 0) throw usage_error(std::string(flag) + " must be positive (got " + *v + ")");
    }
  }
  if (const auto tp = a.option("--tp")) {
    o.shape.tp = parse_number<int>(*tp, "--tp");
    if (*o.shape.tp <= 0) throw usage_error("--tp must be positive (got " + *tp + ")");
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
  const bool json = a.flag("--json");
  const auto trace_out = a.option("--trace-out");
  const auto html = a.option("--report");
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("whatif needs at least one PATH");
  if (o.gpu.empty() && !o.layers && !o.shape.any() && o.groups.empty() && scaled.ops.empty() && scaled.scales.compute == 1.0 && scaled.scales.comm == 1.0 &&
      scaled.scales.cpu == 1.0) {
    throw usage_error("whatif needs a change: --gpu PRESET, --layers N, --hidden/--ffn/--heads/--seq/--micro-batch/--tp N, or --scale");
  }
  const trace::job job = trace::load_job(paths(inputs));
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  std::vector<std::filesystem::path> written;
  if (trace_out) written = report::write_kineto(report::simulated_from(r.predicted, job), report::rank_numbers(job), *trace_out);
  if (html) {
    report::html_options ho;
    ho.title = "lumos whatif";
    ho.inputs = inputs;
    report::detail::write_file(*html, report::html_report(job, r.predicted, ho, &r.baseline));
    written.emplace_back(*html);
  }

  std::string out;
  if (json) {
    json_writer w(out);
    w.begin_object();
    w.key("baseline");
    session_json(w, r.baseline);
    w.key("predicted");
    session_json(w, r.predicted);
    w.field("speedup", r.predicted.simulated_ns > 0 ? static_cast<double>(r.baseline.simulated_ns) / static_cast<double>(r.predicted.simulated_ns) : 0.0);
    w.key("changes").begin_array();
    for (const auto& c : r.changes) w.value(c);
    w.end_array();
    if (r.shape) shape_json(w, *r.shape);
    if (trace_out) {
      w.key("trace_out").begin_array();
      for (const auto& f : written) w.value(f.string());
      w.end_array();
    }
    w.end_object();
    out += '\n';
  } else {
    char line[512];
    std::snprintf(line, sizeof line, "lumos whatif: %zu rank%s\n", job.ranks.size(), job.ranks.size() == 1 ? "" : "s");
    out += line;
    for (const auto& c : r.changes) out += "change: " + c + "\n";
    out += "\n rank  step              baseline    predicted   speedup  | predicted: exposed-compute  overlapped  exposed-comm   other\n";
    for (std::size_t i = 0; i < r.predicted.ranks.size(); ++i) {
      const auto& b = r.baseline.ranks[i];
      const auto& p = r.predicted.ranks[i];
      const auto& s = p.simulated.split;
      std::snprintf(line, sizeof line, " %4d  %-16s %12s %12s %7.3fx  |  %10s %10s %10s %10s\n", p.rank, p.step.c_str(),
                    ms(b.simulated_ns).c_str(), ms(p.simulated_ns).c_str(),
                    p.simulated_ns > 0 ? static_cast<double>(b.simulated_ns) / static_cast<double>(p.simulated_ns) : 0.0,
                    ms(s.exposed_compute).c_str(), ms(s.overlapped).c_str(), ms(s.exposed_comm).c_str(), ms(s.other).c_str());
      out += line;
    }
    std::snprintf(line, sizeof line, "  job  %-16s %12s %12s %7.3fx\n", "", ms(r.baseline.simulated_ns).c_str(),
                  ms(r.predicted.simulated_ns).c_str(),
                  r.predicted.simulated_ns > 0 ? static_cast<double>(r.baseline.simulated_ns) / static_cast<double>(r.predicted.simulated_ns) : 0.0);
    out += line;
    if (r.shape) out += shape_text(*r.shape);
    for (const auto& f : written) out += "wrote " + f.string() + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

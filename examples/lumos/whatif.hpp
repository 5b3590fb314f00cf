#pragma once
// lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--step N] [--scale ...]... [--json]
//              [--trace-out DIR]

#include "cli.hpp"
#include "replay.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view whatif_usage =
    "usage: lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--layers N] [--step N] [--scale KIND=F]...\n"
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
    "  --step N, --scale   as for `lumos replay`, applied to the baseline and the prediction\n"
    "  --json              {\"baseline\":{...},\"predicted\":{...},\"changes\":[...]}\n"
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
  if (o.gpu.empty() && !o.layers && o.groups.empty() && scaled.ops.empty() && scaled.scales.compute == 1.0 && scaled.scales.comm == 1.0 &&
      scaled.scales.cpu == 1.0) {
    throw usage_error("whatif needs a change: --gpu PRESET, --layers N, or --scale");
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
    for (const auto& f : written) out += "wrote " + f.string() + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

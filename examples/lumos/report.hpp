#pragma once
// lumos report PATH... -o FILE [--step N] [--scale KIND=F]... [--title TEXT]

#include "cli.hpp"
#include "replay.hpp"

#include <lumos/report/html.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/trace/job.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view report_usage =
    "usage: lumos report PATH... -o FILE [--step N] [--scale KIND=F]... [--title TEXT]\n"
    "  Replays the job and writes one self-contained HTML page (no script, no network): the job\n"
    "  summary, measured vs simulated iteration and the 4-way breakdown per rank, a timeline of one\n"
    "  iteration per shown rank with its critical path, and the pipeline diagram of pipeline jobs.\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n"
    "  -o, --output FILE  the HTML file to write\n"
    "  --step N        report ProfilerStep#N (default: the last one every rank has)\n"
    "  --scale KIND=F  a what-if, as for 'lumos replay' (compute, comm, cpu, op:TEXT); the report then\n"
    "                  shows the unscaled replay (baseline) beside it\n"
    "  --title TEXT    the page's title (default: 'lumos report: ' and the first PATH's name)\n";

inline int run_report(args& a) {
  report::replay_options opt;
  if (const auto step = a.option("--step")) opt.step = parse_number<int>(*step, "--step");
  const what_if scaled = parse_scales(a.options("--scale"));
  opt.scales = scaled.scales;
  opt.build.op_scales = scaled.ops;
  auto output = a.option("-o");
  if (const auto o = a.option("--output")) output = o;
  report::html_options html;
  const auto title = a.option("--title");
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("report needs at least one PATH");
  // Default title: the job's directory (or first file) name, which is how users tell reports apart.
  std::filesystem::path first(inputs.front());
  if (!first.has_filename()) first = first.parent_path();
  html.title = title ? *title : "lumos report: " + first.filename().string();
  if (!output) throw usage_error("report needs -o FILE");
  html.inputs = inputs;

  const trace::job job = load_inputs(inputs);
  const report::replay_session s = report::replay_job(job, opt);
  const bool what_if_run = !scaled.ops.empty() || opt.scales.compute != 1.0 || opt.scales.comm != 1.0 || opt.scales.cpu != 1.0;
  std::string page;
  if (what_if_run) {
    report::replay_options base = opt;
    base.scales = {};
    base.build.op_scales.clear();
    const report::replay_session b = report::replay_job(job, base);
    page = report::html_report(job, s, html, &b);
  } else {
    page = report::html_report(job, s, html);
  }
  report::detail::write_file(*output, page);
  char line[512];
  std::snprintf(line, sizeof line, "lumos report: %zu rank%s, simulated %.3f ms (measured %.3f ms); wrote %s (%zu bytes)\n",
                s.ranks.size(), s.ranks.size() == 1 ? "" : "s", static_cast<double>(s.simulated_ns) / 1e6,
                static_cast<double>(s.measured_ns) / 1e6, output->c_str(), page.size());
  write_stdout(line);
  return 0;
}

}  // namespace lumos::cli

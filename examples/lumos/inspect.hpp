#pragma once
// lumos inspect PATH... [--json]

#include "cli.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/summary.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view inspect_usage =
    "usage: lumos inspect PATH... [--json]\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n";

inline void inspect_json(const trace::job& job, std::string& out) {
  json_writer w(out);
  w.begin_object().key("ranks").begin_array();
  for (const auto& r : job.ranks) {
    const auto s = trace::summarize(r);
    w.begin_object();
    w.field("rank", r.rank).field("file", r.file).field("events", r.entries);
    w.key("by_category").begin_object();
    for (const auto& [cat, n] : s.by_category) w.field(cat, n);
    w.end_object();
    w.field("gpu_ops", s.gpu_ops).field("comm_ops", s.comm_ops).field("streams", s.streams);
    w.field("threads", s.threads).field("device", s.device);
    w.key("world_size");
    if (r.world_size) {
      w.value(*r.world_size);
    } else {
      w.null();
    }
    w.field("rank_from", trace::to_string(r.origin));
    w.field("base_time_ns", r.base_ns);
    w.key("steps").begin_array();
    for (const auto& st : s.steps) {
      w.begin_object().field("name", st.name).field("start_ns", r.base_ns + st.start).field("dur_ns", st.dur).end_object();
    }
    w.end_array();
    w.field("unknown_phase_entries", r.skipped_entries);
    w.end_object();
  }
  w.end_array().end_object();
  out += '\n';
}

inline void inspect_text(const trace::job& job, std::string& out) {
  char line[512];
  for (const auto& r : job.ranks) {
    const auto s = trace::summarize(r);
    std::snprintf(line, sizeof line, "rank %d  %s  (rank from %s)\n", r.rank, r.file.c_str(),
                  std::string(trace::to_string(r.origin)).c_str());
    out += line;
    std::snprintf(line, sizeof line, "  device: %s   world size: %s\n", s.device.empty() ? "-" : s.device.c_str(),
                  r.world_size ? std::to_string(*r.world_size).c_str() : "-");
    out += line;
    std::snprintf(line, sizeof line, "  %llu traceEvents entries; GPU ops %llu (communication %llu) on %llu streams; %llu CPU threads\n",
                  static_cast<unsigned long long>(r.entries), static_cast<unsigned long long>(s.gpu_ops),
                  static_cast<unsigned long long>(s.comm_ops), static_cast<unsigned long long>(s.streams),
                  static_cast<unsigned long long>(s.threads));
    out += line;
    out += "  by category:";
    for (const auto& [cat, n] : s.by_category) {
      out += ' ';
      out += cat;
      out += '=';
      out += std::to_string(n);
    }
    out += '\n';
    if (s.steps.empty()) out += "  no ProfilerStep annotations (the iteration is the whole trace window)\n";
    for (const auto& st : s.steps) {
      std::snprintf(line, sizeof line, "  %-18s start %lld ns  duration %lld ns (%.3f ms)\n", st.name.c_str(),
                    static_cast<long long>(r.base_ns + st.start), static_cast<long long>(st.dur),
                    static_cast<double>(st.dur) / 1e6);
      out += line;
    }
  }
}

inline int run_inspect(args& a) {
  const bool json = a.flag("--json");
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("inspect needs at least one PATH");
  trace::load_options opt;
  if (stderr_is_terminal()) {
    opt.on_loaded = [](const trace::rank_trace& r, std::size_t done, std::size_t total) {
      if (total > 1) std::fprintf(stderr, "\rlumos: read %zu/%zu files (%s)\x1b[K", done, total, r.file.c_str());
      if (total > 1 && done == total) std::fprintf(stderr, "\n");
    };
  }
  const trace::job job = trace::load_job(paths(inputs), opt);
  std::string out;
  if (json) {
    inspect_json(job, out);
  } else {
    inspect_text(job, out);
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

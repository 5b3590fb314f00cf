#pragma once
// lumos replay PATH... [--step N[,N...]] [--scale compute=F] [--scale comm=F] [--scale cpu=F]
//              [--scale op:TEXT=F]... [--json] [--explain] [--trace-out FILE] [--critical-path]

#include "cli.hpp"

#include <lumos/cli/scale.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/frozen.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/json/replay.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/trace/job.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lumos::cli {

inline constexpr std::string_view replay_usage =
    "usage: lumos replay PATH... [--step N[,N...]] [--scale compute=F] [--scale comm=F] [--scale cpu=F]\n"
    "                    [--scale op:TEXT=F]... [--json] [--explain] [--strict] [--align-clocks]\n"
    "                    [--durations-from-step M] [--profiler-cost C]\n"
    "                    [--trace-out FILE] [--critical-path] [--report FILE]\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n"
    "  --step N            replay ProfilerStep#N (default: the last one every rank has); N,M,...: each\n"
    "                      of the steps in turn from one reading of the traces (--json: an array of the\n"
    "                      steps' documents, in the order given; not with --trace-out or --report)\n"
    "  --scale KIND=F      multiply GPU compute, communication transfer or CPU busy time by F > 0\n"
    "  --scale op:TEXT=F   multiply by F >= 0 the time of every CPU op whose name contains TEXT (with\n"
    "                      everything nested in it and the GPU ops it launched) and of every GPU op\n"
    "                      whose name contains TEXT; 0 removes it. Repeatable; composes with the kinds\n"
    "  --explain           show what the replay keeps fixed (overheads by kind, the largest ones)\n"
    "  --strict            timestamps no execution can produce (an op before its launch, a long stream\n"
    "                      overlap, a collective ending before a partner starts) are errors\n"
    "  --align-clocks      shift each rank's clock by the offset its collectives imply (skew between hosts)\n"
    "  --durations-from-step M  leave-one-step-out: replay the step with the measured op durations\n"
    "                      of ProfilerStep#M, predicting step M (compared with its measurement)\n"
    "  --profiler-cost C   the profiler's host time per recorded event for the step without the profiler:\n"
    "                      Fx (F times the rank's median metadata operator, e.g. aten::view), or fixed\n"
    "                      costs in us (US for every kind, or op=US,runtime=US,python=US); default: the\n"
    "                      fitted multiple of model/profiler_cost.hpp; 0: no estimate\n"
    "  --trace-out FILE    write the simulated job as Kineto JSON (a directory, or one file for one rank)\n"
    "  --critical-path     print the critical path of the slowest rank's iteration\n"
    "  --report FILE       also write the self-contained HTML report of the replay (`lumos report`)\n";

inline std::string percent(time_ns part, time_ns whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.1f%%", whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

inline std::string ms(time_ns t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(t) / 1e6);
  return buf;
}

/// `--explain`: the overheads each stream learnt, and per rank what the replay keeps fixed.
inline std::string explain_text(const report::replay_session& s, const std::vector<report::frozen_report>& frozen) {
  std::string out;
  char line[512];
  out += "\nwhat a what-if keeps fixed (overheads; waits are recomputed):\n";
  out += "  per stream: idle-GPU launch latency (median / p95, samples), inter-kernel gap of queued ops (median / p95, samples)\n";
  for (const auto& oh : s.built.stats.overheads) {
    std::snprintf(line, sizeof line, "    rank %d stream %d: launch %.1f / %.1f us (%zu), gap %.1f / %.1f us (%zu)\n", oh.rank, oh.stream,
                  static_cast<double>(oh.launch_latency) / 1e3, static_cast<double>(oh.launch_high) / 1e3, oh.launch_samples,
                  static_cast<double>(oh.gap) / 1e3, static_cast<double>(oh.gap_high) / 1e3, oh.gap_samples);
    out += line;
  }
  const graph::task_graph& g = s.built.graph;
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const auto& f = frozen[i];
    const time_ns window = s.ranks[i].measured_ns;
    std::snprintf(line, sizeof line, "  rank %d (%s, measured %s): kept overheads in the window, summed by kind (they overlap):\n",
                  s.ranks[i].rank, s.ranks[i].step.c_str(), ms(window).c_str());
    out += line;
    for (std::size_t k = 0; k < graph::overhead_kind_count; ++k) {
      if (f.by_kind[k] == 0) continue;
      std::snprintf(line, sizeof line, "    %-15s %12s %s of the window\n",
                    std::string(graph::to_string(static_cast<graph::overhead_kind>(k))).c_str(), ms(f.by_kind[k]).c_str(),
                    percent(f.by_kind[k], window).c_str());
      out += line;
    }
    if (!f.largest.empty()) out += "    largest:\n";
    for (const auto& d : f.largest) {
      std::snprintf(line, sizeof line, "      %10s  %-15s %s: %.70s\n", ms(d.amount).c_str(), std::string(graph::to_string(d.kind)).c_str(),
                    g.processors[g.processor[d.task]].name.c_str(), std::string(g.task_name(d.task)).c_str());
      out += line;
    }
  }
  return out;
}

// The build's findings: graph size, dependencies by rule, collectives, what bounds the GPU ops,
// clock skew, causality and the selective scales' reach.
inline std::string build_text(const report::replay_session& s, const trace::job& job, const report::replay_options& opt) {
  const auto& st = s.built.stats;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "lumos replay: %zu rank%s, scales compute=%g comm=%g cpu=%g\n", job.ranks.size(),
                job.ranks.size() == 1 ? "" : "s", opt.scales.compute, opt.scales.comm, opt.scales.cpu);
  out += line;
  std::snprintf(line, sizeof line, "graph: %zu tasks, %zu edges, %zu processors (%zu threads, %zu streams)\n",
                s.built.graph.task_count(), s.built.graph.edge_count(), s.built.graph.processors.size(), st.threads, st.streams);
  out += line;
  std::snprintf(line, sizeof line,
                "dependencies: %zu launches (%zu ops launched before the window), %zu cross-stream (%zu exact, %zu inferred, %zu "
                "unresolved), %zu blocking calls, %zu thread hand-offs\n",
                st.launch_edges, st.ops_without_launch, st.cross_stream_exact + st.cross_stream_inferred, st.cross_stream_exact,
                st.cross_stream_inferred, st.cross_stream_unresolved, st.blocking_calls, st.handoffs);
  out += line;
  if (st.collectives_matched > 0) {
    std::snprintf(line, sizeof line, "collectives: %zu joined across ranks (%zu participants), matched by %s\n", st.collectives_matched,
                  st.collective_participants, st.collective_matching.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "GPU ops bound by: stream %zu (queued), launch %zu, cross-stream %zu (%zu waits found from timing alone), "
                "unexplained delay kept %zu; %zu poll loops folded into their wait\n",
                st.ops_queued, st.ops_launch_bound, st.ops_dependency_bound, st.cross_stream_implicit, st.ops_unexplained,
                st.poll_waits);
  out += line;
  if (st.queue_blocked_launches > 0) {
    std::snprintf(line, sizeof line,
                  "launch queue: %zu launch calls blocked on a full queue, %.3f ms of waiting in the trace (a wait on the GPU, "
                  "recomputed; their time after it kept)\n",
                  st.queue_blocked_launches, static_cast<double>(st.queue_blocked_wait) / 1e6);
    out += line;
  }
  return out;
}

// The diagnostics of a replay (stderr in text mode): partners absent, clock skew between hosts,
// causality violations.
inline std::string warnings_text(const report::replay_session& s, const trace::job& job) {
  const auto& st = s.built.stats;
  std::string out;
  if (st.collectives_unmatched > 0) {
    char line[640];
    std::snprintf(line, sizeof line,
                  "note: %zu communication ops have no partner rank in this job (partners absent): transfer (scaled by comm) from "
                  "the same op in another step for %zu, from ops of the same size and group for %zu, the whole duration for %zu; "
                  "the rest is peer wait, kept\n",
                  st.collectives_unmatched, st.unmatched_transfer_same_op, st.unmatched_transfer_same_size, st.unmatched_kept_whole);
    out += line;
  }
  if (!st.clock_offsets_consistent) {
    out += "clocks: the matched collectives admit no clock offsets (collectives matched wrongly?); none applied\n";
  } else {
    std::string skewed;
    for (std::size_t i = 0; i < st.clock_offsets.size(); ++i) {
      if (st.clock_offsets[i] == 0) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%srank %d %+.1f us", skewed.empty() ? "" : ", ", job.ranks[i].rank,
                    static_cast<double>(st.clock_offsets[i]) / 1e3);
      skewed += buf;
    }
    if (!skewed.empty()) {
      out += std::string("clocks: the collectives imply skew between hosts: ") + skewed +
             (st.clocks_aligned ? " (applied: --align-clocks)\n" : " (--align-clocks applies it)\n");
    }
  }
  if (st.causality_violations > 0) {
    out += "warning: " + std::to_string(st.causality_violations) + " causality violation" + (st.causality_violations == 1 ? "" : "s") +
           " in the traces (timestamps no execution can produce; --strict makes them errors); the worst: " + st.worst_violation_text + "\n";
  }
  return out;
}

// What the selective scales reached.
inline std::string op_scales_text(const report::replay_session& s, const report::replay_options& opt) {
  const auto& st = s.built.stats;
  std::string out;
  if (!opt.build.op_scales.empty()) {
    std::string ops;
    for (const auto& o : opt.build.op_scales) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "=%g", o.factor);
      ops += (ops.empty() ? "'" : ", '") + o.text + "'" + buf;
    }
    char line[512];
    std::snprintf(line, sizeof line, "selective what-if %s: %zu GPU ops and %zu threads touched\n", ops.c_str(), st.op_scaled_gpu,
                  st.op_scaled_cpu);
    out += line;
  }
  return out;
}

/// The line that gives the step with the profiler off (model/profiler_cost.hpp).
inline std::string unprofiled_text(time_ns unprofiled) {
  return "step without profiler: " + ms(unprofiled) + " (estimate: the profiler's host time per recorded event removed)\n";
}

// One row per rank (iterations, error, simulated breakdown, SM utilisation) and the job's row.
inline std::string ranks_text(const report::replay_session& s) {
  std::string out;
  char line[512];
  out += "\n rank  step              measured     simulated    error  | simulated: exposed-compute  overlapped  exposed-comm   other   SM util\n";
  for (const auto& r : s.ranks) {
    const auto& b = r.simulated.split;
    const time_ns w = r.simulated.window.length();
    std::snprintf(line, sizeof line, " %4d  %-16s %12s %12s %6.2f%%  |  %10s %s %10s %s %10s %s %10s %s  %5.1f%%\n", r.rank,
                  r.step.c_str(), ms(r.measured_ns).c_str(), ms(r.simulated_ns).c_str(), 100.0 * r.error,
                  ms(b.exposed_compute).c_str(), percent(b.exposed_compute, w).c_str(), ms(b.overlapped).c_str(),
                  percent(b.overlapped, w).c_str(), ms(b.exposed_comm).c_str(), percent(b.exposed_comm, w).c_str(),
                  ms(b.other).c_str(), percent(b.other, w).c_str(), 100.0 * r.simulated.sm.mean);
    out += line;
  }
  std::snprintf(line, sizeof line, "  job  %-16s %12s %12s %6.2f%%   (iteration time of a job: its slowest rank)\n", "",
                ms(s.measured_ns).c_str(), ms(s.simulated_ns).c_str(), 100.0 * s.error);
  out += line;
  out += unprofiled_text(s.unprofiled_ns);
  for (const auto& r : s.ranks) {
    if (!r.measured_memory) continue;  // the profiler's memory events (profile_memory=True)
    std::snprintf(line, sizeof line, "  rank %d measured memory: peak allocated %.3f GiB, peak reserved %.3f GiB (%llu memory events)\n",
                  r.rank, static_cast<double>(r.measured_memory->allocated) / 1073741824.0,
                  static_cast<double>(r.measured_memory->reserved) / 1073741824.0,
                  static_cast<unsigned long long>(r.measured_memory->events));
    out += line;
  }
  return out;
}

// The critical path of rank `slowest` (an index): time per category and the longest segments.
inline std::string critical_path_text(const report::replay_session& s, const report::critical_path& path, std::size_t slowest) {
  std::string out;
  char line[512];
  const time_ns total = path.end - path.begin;
  std::snprintf(line, sizeof line, "\ncritical path of rank %d (%s, %s):\n", s.ranks[slowest].rank, s.ranks[slowest].step.c_str(),
                ms(total).c_str());
  out += line;
  for (std::size_t c = 0; c < report::path_category_count; ++c) {
    std::snprintf(line, sizeof line, "  %-12s %12s %s\n", std::string(report::to_string(static_cast<report::path_category>(c))).c_str(),
                  ms(path.total[c]).c_str(), percent(path.total[c], total).c_str());
    out += line;
  }
  // The longest segments, longest first.
  std::vector<std::size_t> idx(path.segments.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) {
    return path.segments[x].end - path.segments[x].begin > path.segments[y].end - path.segments[y].begin;
  });
  idx.resize(std::min<std::size_t>(idx.size(), 10));
  out += "  longest segments:\n";
  for (const auto i : idx) {
    const auto& seg = path.segments[i];
    std::snprintf(line, sizeof line, "    %10s  %-11s %s: %.80s\n", ms(seg.end - seg.begin).c_str(),
                  std::string(report::to_string(seg.category)).c_str(),
                  s.built.graph.processors[s.built.graph.processor[seg.task]].name.c_str(),
                  std::string(s.built.graph.task_name(seg.task)).c_str());
    out += line;
  }
  return out;
}

// Leave-one-step-out: each rank's prediction of the other step, with the two baselines.
inline std::string held_out_text(const report::replay_session& s) {
  std::string out;
  char line[512];
  for (std::size_t i = 0; i < s.held_out.size(); ++i) {
    const auto& h = s.held_out[i];
    std::snprintf(line, sizeof line,
                  "held out: rank %d, %s with the durations of %s predicts %s; measured %s (error %.2f%%; baselines: same "
                  "step %.2f%%, scaled by GPU busy time %.2f%%); %zu tasks matched, %zu kept%s\n",
                  s.ranks[i].rank, s.ranks[i].step.c_str(), h.from_step.c_str(), ms(h.predicted_ns).c_str(), ms(h.measured_ns).c_str(),
                  100.0 * report::relative_error(h.predicted_ns, h.measured_ns), 100.0 * report::relative_error(h.same_step_ns, h.measured_ns),
                  100.0 * report::relative_error(h.gpu_busy_ratio_ns, h.measured_ns), h.tasks.matched, h.tasks.unmatched,
                  h.tasks.comparable() ? "" : " (the two steps ran different ops: not comparable)");
    out += line;
  }
  return out;
}

/// What `lumos replay` was asked.
struct replay_request {
  report::replay_options opt;
  std::vector<int> steps;  ///< `--step N,M,...` with more than one step; else `opt.step`
  bool json = false;
  bool explain = false;
  bool critical = false;
  std::optional<std::string> trace_out;
  std::optional<std::string> html;
  std::vector<std::string> inputs;
};

inline replay_request parse_replay(args& a) {
  replay_request req;
  report::replay_options& opt = req.opt;
  if (const auto step = a.option("--step")) {
    for (const std::string& n : split_list(*step, "--step")) req.steps.push_back(parse_number<int>(n, "--step"));
    opt.step = req.steps.front();
    if (req.steps.size() == 1) req.steps.clear();
  }
  const what_if scaled = parse_scales(a.options("--scale"));
  opt.scales = scaled.scales;
  opt.build.op_scales = scaled.ops;
  if (const auto from = a.option("--durations-from-step")) opt.durations_from_step = parse_number<int>(*from, "--durations-from-step");
  opt.build.strict = a.flag("--strict");
  opt.build.align_clocks = a.flag("--align-clocks");
  opt.profiler = profiler_cost_option(a);
  req.json = a.flag("--json");
  req.explain = a.flag("--explain");
  req.critical = a.flag("--critical-path");
  req.trace_out = a.option("--trace-out");
  req.html = a.option("--report");
  req.inputs = a.positionals();
  if (req.inputs.empty()) throw usage_error("replay needs at least one PATH");
  if (!req.steps.empty() && (req.trace_out || req.html)) {
    throw usage_error("--trace-out and --report write one step: give --step one step");
  }
  return req;
}

/// Loads the traces of `inputs`, counting the files read on stderr when it is a terminal.
inline trace::job load_inputs(const std::vector<std::string>& inputs) {
  trace::load_options load;
  if (stderr_is_terminal()) {
    load.on_loaded = [](const trace::rank_trace&, std::size_t done, std::size_t total) {
      if (total > 1) std::fprintf(stderr, "\rlumos: read %zu/%zu files\x1b[K%s", done, total, done == total ? "\n" : "");
    };
  }
  return trace::load_job(paths(inputs), load);
}

/// What `lumos replay` prints for the step of `opt` (text, or the JSON document).
inline std::string replay_step(trace::job& job, const replay_request& req, report::replay_options opt) {
  // Written traces, the HTML report and the next of several steps read the events again;
  // otherwise each rank's go as soon as its tasks are added (the events of a 512-rank job are
  // 822 MiB, its graph about 1 GiB).
  if (!req.trace_out && !req.html && req.steps.empty()) {
    opt.release_events = [&job](std::size_t i) { job.ranks[i].drop_events(); };
    opt.release_observations = true;    // they read the observed times and source events too
    opt.release_edges = !req.critical;  // and, as the critical path, the edges
  }
  // Nothing below compiles the graph again (the compiled records hold its durations).
  opt.release_durations = true;
  const report::replay_session s = report::replay_job(job, opt);

  // The slowest rank's critical path, when asked.
  std::size_t slowest = 0;
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    if (s.ranks[i].simulated_ns > s.ranks[slowest].simulated_ns) slowest = i;
  }
  report::critical_path path;
  if (req.critical && !s.ranks.empty()) {
    path = report::iteration_critical_path(s.built.graph, s.compiled, s.timeline, s.plans[slowest], s.ranks[slowest].simulated);
  }
  // The kept overheads are printed by --explain and --json only: a pass over every plan's tasks.
  std::vector<report::frozen_report> frozen;
  if (req.json || req.explain) {
    std::vector<report::interval> windows;
    for (const auto& r : s.ranks) windows.push_back(r.measured.window);
    frozen = report::frozen_overheads(s.built, s.plans, windows);
  }
  std::vector<std::filesystem::path> written;
  if (req.trace_out) written = report::write_kineto(report::simulated_from(s, job), report::rank_numbers(job), *req.trace_out);
  if (req.html) {
    report::html_options ho;
    ho.inputs = req.inputs;
    report::detail::write_file(*req.html, report::html_report(job, s, ho));
    written.emplace_back(*req.html);
  }

  std::string out;
  if (req.json) {
    report::replay_json_parts parts;
    parts.ops = opt.build.op_scales;
    parts.sm_series = true;
    parts.frozen = frozen;
    if (req.critical) {
      parts.path = &path;
      parts.path_rank = s.ranks.empty() ? 0 : s.ranks[slowest].rank;
    }
    if (req.trace_out) parts.trace_out = &written;
    out = report::replay_json(s, parts);
  } else {
    write_diagnostics(warnings_text(s, job));
    out = build_text(s, job, opt) + op_scales_text(s, opt) + ranks_text(s);
    if (req.critical && !s.ranks.empty()) out += critical_path_text(s, path, slowest);
    out += held_out_text(s);
    if (req.explain) out += explain_text(s, frozen);
    for (const auto& f : written) out += "wrote " + f.string() + "\n";
  }
  return out;
}

inline int run_replay(args& a) {
  const replay_request req = parse_replay(a);
  trace::job job = load_inputs(req.inputs);
  if (req.steps.empty()) {
    write_stdout(replay_step(job, req, req.opt));
    return 0;
  }
  write_stdout(join_step_documents(req.steps.size(), req.json, [&](std::size_t i) {
    report::replay_options opt = req.opt;
    opt.step = req.steps[i];
    return replay_step(job, req, opt);
  }));
  return 0;
}

}  // namespace lumos::cli

// lumos._lumos — the C++ side of the Python package: thin bindings over the library, no second
// engine. The Python layer (python/lumos/__init__.py) turns what these return into plain objects.
//
// Results cross the boundary as JSON text written by the library's writers (lumos/report/json/),
// the ones `lumos ... --json` prints with, so that `to_dict()` holds the numbers the CLI prints,
// bit for bit: integers as integers, doubles in shortest round-trip form. The per-task and
// per-rank tables cross as NumPy arrays. `predict`, `sweep`, `calibrate` and `whatif` read their
// flags with the CLI's own parsers (lumos/cli/) for the same reason: one definition of every flag,
// default, message and field.

#include <lumos/cli/args.hpp>
#include <lumos/cli/calibrate.hpp>
#include <lumos/cli/predict.hpp>
#include <lumos/cli/routing.hpp>
#include <lumos/cli/sweep.hpp>
#include <lumos/cli/whatif.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/frozen.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/json/inspect.hpp>
#include <lumos/report/json/predict.hpp>
#include <lumos/report/json/replay.hpp>
#include <lumos/report/json/sweep.hpp>
#include <lumos/report/json/whatif.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/whatif_files.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/whatif.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <chrono>
#include <optional>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using lumos::time_ns;

/// A loaded job, shared by the replays made from it (the trace writer and the report read it).
struct py_job {
  std::shared_ptr<const lumos::trace::job> job;
};

/// One replay and the job it came from.
struct py_replay {
  std::shared_ptr<const lumos::trace::job> job;
  std::shared_ptr<const lumos::report::replay_session> session;
  std::vector<lumos::graph::op_scale> ops;
  std::shared_ptr<const lumos::report::replay_session> baseline;  ///< the unscaled replay of a what-if, when made
};

/// One what-if (`lumos whatif`): the job it ran on (folded onto one rank per class of identical
/// ranks unless asked not to), how it was folded, its options and its result. The baseline and
/// the prediction are replays that share the result.
struct py_whatif {
  std::shared_ptr<const lumos::trace::job> job;
  lumos::trace::rank_folding folding;
  lumos::whatif::whatif_options options;
  std::shared_ptr<const lumos::whatif::whatif_result> result;
  std::vector<std::string> inputs;  ///< the paths the job was loaded from (named by the report)
};

/// The replay as `lumos replay --json` prints it, less the parts with calls of their own (the
/// kept overheads, the critical path, the SM utilisation series).
std::string replay_json(const py_replay& r) {
  lumos::report::replay_json_parts parts;
  parts.ops = r.ops;
  return lumos::report::replay_json(*r.session, parts);
}

std::size_t rank_index(const lumos::report::replay_session& s, int rank) {
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    if (s.ranks[i].rank == rank) return i;
  }
  throw lumos::error("no rank " + std::to_string(rank) + " in this job");
}

template <class T>
py::array_t<T> to_array(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

/// Every task of one rank (joins excluded) on the simulated and the measured timeline, as
/// columns. Times are job time in ns; `origin_ns` + a time is the absolute trace time that
/// `write_trace` writes.
py::dict timeline(const py_replay& r, int rank) {
  const auto& s = *r.session;
  const auto& g = s.built.graph;
  (void)rank_index(s, rank);
  const auto sim = s.simulated_times();
  std::vector<std::uint32_t> task, processor;
  std::vector<std::uint8_t> kind;
  std::vector<time_ns> start, end, measured_start, measured_end, duration;
  py::list names;
  for (lumos::graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.rank[t] != rank || g.kind[t] == lumos::graph::task_kind::join) continue;
    task.push_back(t);
    processor.push_back(g.processor[t]);
    kind.push_back(static_cast<std::uint8_t>(g.kind[t]));
    start.push_back(sim.begin_of(t));
    end.push_back(sim.end_of(t));
    duration.push_back(s.compiled.duration(s.compiled.position_of(t)));
    measured_start.push_back(g.observed_start[t]);
    measured_end.push_back(g.observed_end[t]);
    names.append(py::str(std::string(g.task_name(t))));
  }
  py::list kinds;
  for (int k = 0; k <= static_cast<int>(lumos::graph::task_kind::join); ++k) {
    kinds.append(std::string(lumos::graph::to_string(static_cast<lumos::graph::task_kind>(k))));
  }
  py::list processors;
  for (const auto& p : g.processors) {
    const char* pk = p.kind == lumos::graph::processor_kind::cpu_thread ? "cpu_thread"
                     : p.kind == lumos::graph::processor_kind::gpu_stream ? "gpu_stream"
                                                                           : "barrier";
    processors.append(py::dict("name"_a = p.name, "kind"_a = pk, "rank"_a = p.rank, "owner"_a = p.owner, "index"_a = p.index));
  }
  const auto& rr = s.ranks[rank_index(s, rank)];
  return py::dict("rank"_a = rank, "task"_a = to_array(task), "processor"_a = to_array(processor), "kind"_a = to_array(kind),
                  "start_ns"_a = to_array(start), "end_ns"_a = to_array(end), "duration_ns"_a = to_array(duration),
                  "measured_start_ns"_a = to_array(measured_start), "measured_end_ns"_a = to_array(measured_end), "name"_a = names,
                  "kind_names"_a = kinds, "processors"_a = processors, "origin_ns"_a = s.built.origin,
                  "window_ns"_a = py::make_tuple(rr.simulated.window.begin, rr.simulated.window.end),
                  "measured_window_ns"_a = py::make_tuple(rr.measured.window.begin, rr.measured.window.end));
}

/// Per-rank breakdowns as an (n_ranks, 5) int64 array: exposed compute, overlapped, exposed
/// communication, other, exposed communication wait (ns), rows in rank order.
py::array_t<std::int64_t> breakdowns(const py_replay& r, bool simulated) {
  const auto& s = *r.session;
  py::array_t<std::int64_t> a({static_cast<py::ssize_t>(s.ranks.size()), py::ssize_t{5}});
  auto m = a.mutable_unchecked<2>();
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const auto& b = simulated ? s.ranks[i].simulated.split : s.ranks[i].measured.split;
    const auto row = static_cast<py::ssize_t>(i);
    m(row, 0) = b.exposed_compute;
    m(row, 1) = b.overlapped;
    m(row, 2) = b.exposed_comm;
    m(row, 3) = b.other;
    m(row, 4) = b.exposed_comm_wait;
  }
  return a;
}

/// The critical path of rank `rank` (default: the slowest), as `--critical-path --json` prints it.
std::string critical_path_json(const py_replay& r, std::optional<int> rank) {
  const auto& s = *r.session;
  if (s.ranks.empty()) return "null";
  std::size_t i = 0;
  if (rank) {
    i = rank_index(s, *rank);
  } else {
    for (std::size_t k = 0; k < s.ranks.size(); ++k) {
      if (s.ranks[k].simulated_ns > s.ranks[i].simulated_ns) i = k;
    }
  }
  lumos::report::critical_path p;
  {
    py::gil_scoped_release release;
    p = lumos::report::iteration_critical_path(s.built.graph, s.compiled, s.timeline, s.plans[i], s.ranks[i].simulated);
  }
  std::string out;
  lumos::json_writer w(out);
  lumos::report::critical_path_json(w, s.built.graph, p, s.ranks[i].rank, lumos::report::path_task_fields::id_and_name);
  return out;
}

/// The frozen overheads of every rank, as `lumos replay --explain` computes them.
std::string frozen_json(const py_replay& r) {
  const auto& s = *r.session;
  std::vector<lumos::report::interval> windows;
  for (const auto& rk : s.ranks) windows.push_back(rk.measured.window);
  const auto frozen = lumos::report::frozen_overheads(s.built, s.plans, windows);
  return lumos::report::frozen_list_json(s, frozen);
}

/// `lumos predict FLAGS... --json`, read by the CLI's parser: same defaults, checks and messages.
std::string predict_json(const std::vector<std::string>& flags) {
  lumos::cli::args a(flags);
  lumos::cli::predict_request req = lumos::cli::parse_predict(a);
  const bool measured = !lumos::cli::parse_routing(a, req).path.empty();
  a.no_positionals();
  lumos::synth::predict_options opt;
  opt.program.unfold = req.unfold;
  std::string out;
  py::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  // The cost model the request asks for, as `lumos predict` runs it.
  const lumos::synth::prediction p = lumos::cli::run_model(req, opt);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  lumos::report::predict_json(req.job, p, wall_ms, out, req.profile_name(), measured);
  return out;
}

/// `lumos sweep FLAGS... --json` in this process, on every core unless `--threads` is given.
std::string sweep_json(const std::vector<std::string>& flags) {
  lumos::cli::args a(flags);
  const lumos::cli::sweep_request req = lumos::cli::parse_sweep(a);
  a.no_positionals();
  const lumos::sweep::problem p = lumos::cli::sweep_problem(req);
  const std::vector<lumos::sweep::configuration> configs = lumos::cli::sweep_configurations(req);
  std::string out;
  py::gil_scoped_release release;
  lumos::sweep::run_options o;
  o.threads = req.threads;
  const std::vector<lumos::sweep::result> results =
      lumos::cli::with_sweep_evaluator(req, p, [&](const auto& ev) { return lumos::sweep::run(ev, configs, o); });
  lumos::report::sweep_json(p, req.base.profile_name(), results, req.top, out);
  return out;
}

/// `lumos whatif FLAGS...` on a loaded job, read by the CLI's parser (same checks and messages);
/// `--no-fold` replays every traced rank, as the command does.
py_whatif run_whatif(const py_job& j, const std::vector<std::string>& flags, const std::vector<std::string>& inputs) {
  lumos::cli::args a(flags);
  const lumos::cli::whatif_request req = lumos::cli::parse_whatif_change(a);
  if (!req.steps.empty()) throw lumos::cli::usage_error("whatif runs one step here: give --step one step");
  const bool fold = !a.flag("--no-fold");
  a.no_positionals();
  lumos::cli::require_change(req);
  py_whatif w{j.job, {}, req.options, nullptr, inputs};
  py::gil_scoped_release release;
  if (fold) {
    // Folding drops ranks from the job it folds: a copy, so that the loaded job stays whole.
    auto folded = std::make_shared<lumos::trace::job>(*j.job);
    w.folding = lumos::trace::fold_identical_ranks(*folded);
    if (w.folding.folded()) w.job = std::move(folded);
  }
  w.result = std::make_shared<const lumos::whatif::whatif_result>(lumos::whatif::run_whatif(*w.job, w.options));
  return w;
}

/// The baseline or the prediction of a what-if as a replay, sharing the what-if's result.
py_replay whatif_replay(const py_whatif& w, bool predicted) {
  std::shared_ptr<const lumos::report::replay_session> baseline(w.result, &w.result->baseline);
  if (!predicted) return py_replay{w.job, baseline, w.options.replay.build.op_scales, nullptr};
  std::shared_ptr<const lumos::report::replay_session> prediction(w.result, &w.result->predicted);
  return py_replay{w.job, prediction, w.options.replay.build.op_scales, baseline};
}

/// Loads a job (the GIL released: reading and parsing never touch Python objects).
py_job load_job(const std::vector<std::filesystem::path>& paths, unsigned threads) {
  lumos::trace::load_options opt;
  opt.threads = threads;
  py::gil_scoped_release release;
  return py_job{std::make_shared<const lumos::trace::job>(lumos::trace::load_job(paths, opt))};
}

/// Replays a job with the kind and op scales given; with `with_baseline`, the unscaled replay too.
py_replay replay(const py_job& j, double compute, double comm, double cpu, const std::vector<std::pair<std::string, double>>& ops,
                 std::optional<int> step, bool with_baseline) {
  lumos::report::replay_options opt;
  opt.step = step;
  opt.scales = {compute, comm, cpu};
  for (const auto& [text, factor] : ops) opt.build.op_scales.push_back({text, factor});
  py_replay r{j.job, nullptr, opt.build.op_scales, nullptr};
  py::gil_scoped_release release;  // graph build, compile and replay are pure C++
  r.session = std::make_shared<const lumos::report::replay_session>(lumos::report::replay_job(*j.job, opt));
  if (with_baseline) {
    lumos::report::replay_options base = opt;
    base.scales = {};
    base.build.op_scales.clear();
    r.baseline = std::make_shared<const lumos::report::replay_session>(lumos::report::replay_job(*j.job, base));
  }
  return r;
}

void bind_job(py::module_& m) {
  py::class_<py_job>(m, "Job")
      .def_property_readonly("ranks", [](const py_job& j) {
        std::vector<int> r;
        for (const auto& t : j.job->ranks) r.push_back(t.rank);
        return r;
      })
      .def_property_readonly("files", [](const py_job& j) {
        std::vector<std::string> f;
        for (const auto& t : j.job->ranks) f.push_back(t.file);
        return f;
      })
      .def("inspect_json", [](const py_job& j) {
        std::string out;
        lumos::report::inspect_json(*j.job, out);
        return out;
      })
      .def("structure_json", [](const py_job& j, bool groups) {
        std::string out;
        py::gil_scoped_release release;
        // What `lumos inspect --structure` discovers, from the graph the replay builds.
        const lumos::graph::built_job built = lumos::graph::build_graph(*j.job);
        const lumos::whatif::job_structure st = lumos::whatif::discover_structure(*j.job, built, {});
        lumos::report::structure_json(st, groups ? lumos::report::layer_groups::listed : lumos::report::layer_groups::count_only, out);
        return out;
      }, "groups"_a = false)
      .def("__len__", [](const py_job& j) { return j.job->ranks.size(); });
  m.def("load_job", &load_job, "paths"_a, "threads"_a = 0U);
}

void bind_replay(py::module_& m) {
  py::class_<py_replay>(m, "Replay")
      .def("summary_json", &replay_json)
      .def("timeline", &timeline, "rank"_a)
      .def("breakdowns", &breakdowns, "simulated"_a = true)
      .def("critical_path_json", &critical_path_json, "rank"_a = py::none())
      .def("sm_utilization_series", [](const py_replay& r, int rank, bool simulated) {
        const auto& rr = r.session->ranks[rank_index(*r.session, rank)];
        return to_array(simulated ? rr.simulated.sm.series : rr.measured.sm.series);
      }, "rank"_a, "simulated"_a = true)
      .def("frozen_json", &frozen_json)
      .def("html", [](const py_replay& r, const std::string& title, const std::vector<std::string>& inputs) {
        lumos::report::html_options opt;
        opt.title = title;
        opt.inputs = inputs;
        py::gil_scoped_release release;
        return lumos::report::html_report(*r.job, *r.session, opt, r.baseline.get());
      }, "title"_a, "inputs"_a = std::vector<std::string>{})
      .def("write_trace", [](const py_replay& r, const std::filesystem::path& path, bool gzip) {
        py::gil_scoped_release release;
        return lumos::report::write_kineto(lumos::report::simulated_from(*r.session, *r.job), lumos::report::rank_numbers(*r.job), path, gzip);
      }, "path"_a, "gzip"_a = false);
  m.def("replay", &replay, "job"_a, "compute"_a = 1.0, "comm"_a = 1.0, "cpu"_a = 1.0,
        "ops"_a = std::vector<std::pair<std::string, double>>{}, "step"_a = py::none(), "with_baseline"_a = false);
}

void bind_whatif(py::module_& m) {
  py::class_<py_whatif>(m, "WhatIf")
      .def("json", [](const py_whatif& w) {
        py::gil_scoped_release release;
        return lumos::report::whatif_json(*w.result, *w.job, w.folding);
      })
      .def("baseline", [](const py_whatif& w) { return whatif_replay(w, false); })
      .def("predicted", [](const py_whatif& w) { return whatif_replay(w, true); })
      .def("html", [](const py_whatif& w, const std::string& title) {
        py::gil_scoped_release release;
        return lumos::report::whatif_html(*w.job, *w.result, w.inputs, title);
      }, "title"_a)
      .def("write_trace", [](const py_whatif& w, const std::filesystem::path& path, bool gzip) {
        if (w.folding.folded()) {
          throw lumos::error("write_trace writes every traced rank, and this what-if folded " + std::to_string(w.folding.traced) +
                             " ranks onto " + std::to_string(w.folding.stands_for.size()) + ": run it with fold=False");
        }
        lumos::cli::require_writable(*w.result);
        lumos::report::written_traces written;
        {
          py::gil_scoped_release release;
          written = lumos::report::write_whatif_traces(w.options, *w.result, *w.job, path, gzip);
        }
        return py::make_tuple(written.files, written.folded_note);
      }, "path"_a, "gzip"_a = false);
  m.def("whatif", &run_whatif, "job"_a, "flags"_a, "inputs"_a = std::vector<std::string>{});
}

void bind_models(py::module_& m) {
  m.def("predict_json", &predict_json, "flags"_a);
  m.def("sweep_json", &sweep_json, "flags"_a);
  m.def(
      "calibrate_json",
      [](const std::vector<std::string>& inputs, std::optional<int> rank) {
        std::optional<std::string> only;
        if (rank) only = std::to_string(*rank);
        py::gil_scoped_release release;
        const lumos::model::calibration c = lumos::cli::calibrate_inputs(inputs, only);
        return lumos::model::to_json(c.profile);
      },
      "inputs"_a, "rank"_a = py::none());
}

}  // namespace

PYBIND11_MODULE(_lumos, m) {
  m.doc() = "lumos: replay and predict distributed LLM training from Kineto traces (C++ core)";
  // Every input error of the library is a lumos::error whose message names the file, the
  // position and the reason; Python sees the same text.
  static py::exception<lumos::error> lumos_error(m, "LumosError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lumos::error& e) {
      PyErr_SetString(lumos_error.ptr(), e.what());
    }
  });
  bind_job(m);
  bind_replay(m);
  bind_whatif(m);
  bind_models(m);
}

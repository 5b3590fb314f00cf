#pragma once
// Replays a job and reports, per rank and per job, measured vs simulated iteration time, the
// 4-way breakdown and SM utilisation (what `lumos replay` prints).

#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/job.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace lumos::report {

struct replay_options {
  std::optional<int> step;       ///< ProfilerStep number; default: the last one every rank has
  graph::scales scales;          ///< what-if multipliers (FIDELITY.md item 6)
  graph::build_options build;
};

struct rank_replay {
  int rank = 0;
  std::string file;
  std::string step;
  time_ns measured_ns = 0;
  time_ns simulated_ns = 0;
  double error = 0.0;  ///< |simulated − measured| / measured
  window_result measured;
  window_result simulated;
};

/// Everything one replay produced: the graph, its compiled form, the simulated timeline, the
/// per-rank plans and results. Kept together so that reports (critical path, trace writer)
/// can look at any part.
struct replay_session {
  graph::built_job built;
  graph::compiled_graph compiled;
  sim::record_timeline timeline;
  std::vector<iteration_plan> plans;
  std::vector<rank_replay> ranks;
  time_ns measured_ns = 0;   ///< job: max over ranks
  time_ns simulated_ns = 0;
  double error = 0.0;
  time_ns makespan = 0;
  graph::scales scales;      ///< the scales the replay ran with

  [[nodiscard]] task_times simulated_times() const { return {&timeline.start, &timeline.finish, &compiled}; }
};

[[nodiscard]] inline double relative_error(time_ns simulated, time_ns measured) {
  return measured > 0 ? std::fabs(static_cast<double>(simulated - measured)) / static_cast<double>(measured) : 0.0;
}

/// Builds, compiles and replays `job` with `options`, and evaluates every rank's iteration.
[[nodiscard]] inline replay_session replay_job(const trace::job& job, const replay_options& options = {}) {
  replay_session s;
  s.scales = options.scales;
  s.built = graph::build_graph(job, options.build);
  s.compiled = graph::compile(s.built.graph, options.scales);
  sim::replay_engine engine;
  s.makespan = engine.run(s.compiled, s.timeline);
  s.plans = plan_iterations(job, s.built, options.step);
  const task_times measured = observed_times(s.built.graph);
  const task_times simulated = s.simulated_times();
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    rank_replay r;
    r.rank = job.ranks[i].rank;
    r.file = job.ranks[i].file;
    r.step = s.plans[i].step;
    r.measured = evaluate(s.plans[i], measured);
    r.simulated = evaluate(s.plans[i], simulated, options.scales.cpu);
    r.measured_ns = r.measured.window.length();
    r.simulated_ns = r.simulated.window.length();
    r.error = relative_error(r.simulated_ns, r.measured_ns);
    s.measured_ns = std::max(s.measured_ns, r.measured_ns);
    s.simulated_ns = std::max(s.simulated_ns, r.simulated_ns);
    s.ranks.push_back(std::move(r));
  }
  s.error = relative_error(s.simulated_ns, s.measured_ns);
  return s;
}

}  // namespace lumos::report

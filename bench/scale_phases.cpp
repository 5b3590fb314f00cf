// The phases of `lumos replay` on one job, each timed, with the peak resident memory after it:
//   scale_phases DIR [threads]
// Run by `bash scripts/bench.sh scale` on the 512-rank job (docs/replay.md). Not a Google
// Benchmark: each phase runs once, as in the CLI, so first-touch page faults count.
#include <lumos/core/parallel.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/job.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <algorithm>

namespace {

rusage usage() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u;
}

// VmRSS of /proc/self/status, MiB (0 where there is no such file).
double resident_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib / 1024.0;
}

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; }

class phase_timer {
 public:
  void done(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    const rusage u = usage();
    // Page faults count the memory a phase touches for the first time (each one zeroes a page
    // or a huge page): the part of the time that a smaller or reused store saves.
    // The resident memory now, beside the peak so far: what a phase leaves for the next (the
    // peak of a later phase is that plus what it allocates).
    // CPU seconds (user + system, all threads) beside the wall time: how parallel a phase is, and
    // what it would take on this many cores if it were perfectly so.
    const double cpu = seconds(u.ru_utime) + seconds(u.ru_stime);
    std::printf("  %-9s %7.2f s  %6.2f s CPU  %7.0f MiB peak RSS so far  %7.0f MiB now  %8ld page faults\n", name,
                std::chrono::duration<double>(now - last_).count(), cpu - cpu_, static_cast<double>(u.ru_maxrss) / 1024.0,
                resident_mib(), u.ru_minflt - faults_);
    last_ = now;
    faults_ = u.ru_minflt;
    cpu_ = cpu;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  long faults_ = usage().ru_minflt;
  double cpu_ = seconds(usage().ru_utime) + seconds(usage().ru_stime);
};

}  // namespace

int main(int argc, char** argv) {
  using namespace lumos;
  if (argc < 2) {
    std::fprintf(stderr, "usage: scale_phases DIR [threads]\n");
    return 2;
  }
  graph::build_options options;
  if (argc > 2) options.threads = static_cast<unsigned>(std::atoi(argv[2]));
  std::printf("phases of lumos replay (graph build threads: %s)\n", argc > 2 ? argv[2] : "default");
  set_huge_pages_default(false);  // as the CLI (examples/lumos/main.cpp)
  set_block_cache_limit(std::size_t{1} << 30);
  phase_timer timer;
  trace::job job = trace::load_job({argv[1]});
  timer.done("load");
  // As `lumos replay` does when it writes no traces or report (report::replay_options::
  // release_events): the steps are taken from the events, then each rank's events go once its
  // tasks are added.
  const std::vector<report::rank_steps> steps = report::find_steps(job);
  options.events_done = [&job](std::size_t i) { job.ranks[i].drop_events(); };
  options.keep_event_maps = false;
  graph::built_job built = graph::build_graph(job, options);
  timer.done("build");
  std::printf("            (graph: %zu tasks, %zu edges, %.0f MiB by task_graph::memory_bytes)\n", built.graph.task_count(),
              built.graph.edge_count(), static_cast<double>(built.graph.memory_bytes()) / 1048576.0);
  const auto plans = report::plan_iterations(job, steps, built, std::nullopt);
  timer.done("plan");
  {
    // What stays held from here to the end, besides the graph (MiB, by capacity).
    auto mib = [](std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; };
    std::size_t maps = 0, plan_bytes = 0;
    for (const graph::rank_map& m : built.ranks) {
      maps += (m.task_of_event.capacity() + m.arrive_of_event.capacity()) * sizeof(graph::task_id);
    }
    for (const report::iteration_plan& p : plans) {
      plan_bytes += (p.cpu.capacity() + p.gpu.capacity() + p.compute.capacity()) * sizeof(graph::task_id) +
                    p.comm.capacity() * sizeof(p.comm[0]) + (p.previous ? p.previous->gpu.capacity() * sizeof(graph::task_id) : 0);
    }
    std::printf("            (held: event-task maps %.0f MiB, kept delays %.0f MiB, plans %.0f MiB, events left %.0f MiB)\n",
                mib(maps), mib(built.kept.capacity() * sizeof(graph::kept_delay)), mib(plan_bytes), mib(job.memory_bytes()));
  }
  // As report::replay_job: the measured windows are evaluated before the compile; then the
  // graph's observed times go, its durations once the records hold them and its edges once the
  // predecessor lists do (replay_options::release_observations, release_durations and
  // release_edges, set by the CLI).
  std::vector<time_ns> longest(plans.size(), 0);
  {
    const report::task_times measured = report::observed_times(built.graph);
    parallel_for(plans.size(), hardware_threads(options.threads),
                 [&](std::size_t i) { longest[i] = report::evaluate(plans[i], measured).window.length(); });
  }
  timer.done("measure");
  built.graph.release_observations();
  trim_heap();
  const graph::compiled_graph compiled = graph::compile_releasing(built.graph, {.durations = true, .edges = true});
  timer.done("compile");
  sim::record_timeline timeline;
  time_ns makespan = 0;
  {
    sim::replay_engine engine;  // the timeline takes over its times, as in report::replay_job
    makespan = engine.run(compiled);
    timeline = sim::record_timeline::from_interleaved(engine.release_times());
  }
  timer.done("replay");
  const report::task_times simulated = report::simulated_times(timeline, compiled);
  // As report::replay_job: ranks evaluated in parallel.
  parallel_for(plans.size(), hardware_threads(options.threads),
               [&](std::size_t i) { longest[i] = std::max(longest[i], report::evaluate(plans[i], simulated).window.length()); });
  const time_ns slowest = longest.empty() ? 0 : *std::max_element(longest.begin(), longest.end());
  timer.done("evaluate");
  std::printf("  %zu tasks, %zu edges; makespan %.3f ms, slowest window %.3f ms\n", built.graph.task_count(),
              built.graph.edge_count(), static_cast<double>(makespan) / 1e6, static_cast<double>(slowest) / 1e6);
  return 0;
}

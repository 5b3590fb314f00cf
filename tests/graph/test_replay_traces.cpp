// Replay on the shared real traces: accuracy targets, identity, and the trace-writer round trip.
#include "../unit/test_support.hpp"

#include <lumos/report/critical_path.hpp>
#include <lumos/report/frozen.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

#include <cmath>

namespace fs = std::filesystem;
using namespace lumos;

namespace {

// The jobs of the shared traces: each multi-rank set as one job, every other file on its own.
std::vector<std::vector<fs::path>> shared_jobs(const fs::path& root) {
  std::vector<std::vector<fs::path>> jobs;
  jobs.push_back({root / "astra-sim_megatron-gpt-tp8_8xA100"});
  jobs.push_back({root / "param_dlrm_8xV100"});
  std::vector<fs::path> singles;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const auto s = e.path().string();
    if (!e.is_regular_file() || !trace::is_trace_file_name(e.path()) || s.find("execution_traces") != std::string::npos ||
        s.find("astra-sim_megatron") != std::string::npos || s.find("param_dlrm") != std::string::npos) {
      continue;
    }
    singles.push_back(e.path());
  }
  std::sort(singles.begin(), singles.end());
  for (const auto& f : singles) jobs.push_back({f});
  return jobs;
}

}  // namespace

TEST_CASE("replay error over every shared trace: mean <= 2 %, worst <= 5 %", "[traces][replay]") {
  LUMOS_REQUIRE_TRACES(traces);
  double total = 0.0, worst = 0.0;
  std::size_t count = 0;
  for (const auto& inputs : shared_jobs(traces)) {
    INFO(inputs.front().string());
    const auto job = trace::load_job(inputs);
    const auto s = report::replay_job(job);
    REQUIRE(s.measured_ns > 0);
    total += s.error;
    worst = std::max(worst, s.error);
    ++count;
    for (const auto& r : s.ranks) {
      CHECK(r.simulated.split.total() == r.simulated_ns);  // the breakdown adds up to the window
      CHECK(r.measured.split.total() == r.measured_ns);
    }
  }
  REQUIRE(count >= 17);  // the 2 multi-rank sets and the 15 single-rank files
  CHECK(total / static_cast<double>(count) <= 0.02);
  CHECK(worst <= 0.05);
}

TEST_CASE("identity: replaying a single-rank trace unchanged reproduces its GPU op starts", "[traces][replay]") {
  LUMOS_REQUIRE_TRACES(traces);
  for (const auto& inputs : shared_jobs(traces)) {
    const auto job = trace::load_job(inputs);
    if (job.ranks.size() != 1) continue;
    INFO(inputs.front().string());
    const auto s = report::replay_job(job);
    const auto& g = s.built.graph;
    std::size_t ops = 0, within = 0;
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      const auto k = g.kind[t];
      if (k != graph::task_kind::gpu_compute && k != graph::task_kind::gpu_comm) continue;
      ++ops;
      within += std::llabs(s.timeline.start_of(s.compiled.position_of(t)) - g.observed_start[t]) <= 1000;
    }
    REQUIRE(ops > 0);
    CHECK(static_cast<double>(within) >= 0.99 * static_cast<double>(ops));
  }
}

TEST_CASE("a written simulated trace replays to the replay that wrote it", "[replay][roundtrip]") {
  lumos_test::temp_dir dir;
  std::vector<std::vector<fs::path>> jobs = {{fs::path(LUMOS_SOURCE_DIR) / "examples/data/tiny_job"},
                                            {lumos_test::data_dir() / "sensitivity" / "handoff.json"},
                                            {lumos_test::data_dir() / "sensitivity" / "allreduce_2ranks"}};
  if (const auto traces = lumos_test::trace_dir(); !traces.empty()) {
    jobs.push_back({traces / "param_dlrm_8xV100"});
    jobs.push_back({traces / "hta_testdata/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"});
  }
  int n = 0;
  for (const auto& inputs : jobs) {
    for (const graph::scales scale : {graph::scales{}, graph::scales{.compute = 2.0, .comm = 0.5, .cpu = 1.5}}) {
      INFO(inputs.front().string() << " compute=" << scale.compute);
      const auto job = trace::load_job(inputs);
      report::replay_options o;
      o.scales = scale;
      const auto first = report::replay_job(job, o);
      const auto out = dir.path() / ("job" + std::to_string(n++));
      const auto files = report::write_kineto(report::simulated_from(first, job), report::rank_numbers(job), out, n % 2 == 0);
      REQUIRE(files.size() == job.ranks.size());
      const auto again = report::replay_job(trace::load_job({out}));
      REQUIRE(again.ranks.size() == first.ranks.size());
      for (std::size_t i = 0; i < first.ranks.size(); ++i) {
        CHECK(again.ranks[i].measured_ns == first.ranks[i].simulated_ns);
        CHECK(again.ranks[i].simulated_ns == first.ranks[i].simulated_ns);
      }
    }
  }
}

TEST_CASE("monotonicity: scaling compute, comm or cpu down never lengthens a rank's iteration, up never shortens it",
          "[traces][replay][property]") {
  LUMOS_REQUIRE_TRACES(traces);
  for (const auto& inputs : shared_jobs(traces)) {
    const auto job = trace::load_job(inputs);
    const auto base = report::replay_job(job);
    for (const char* kind : {"compute", "comm", "cpu"}) {
      for (const double f : {0.5, 2.0}) {
        INFO(inputs.front().string() << " " << kind << "=" << f);
        report::replay_options o;
        if (std::string_view(kind) == "compute") o.scales.compute = f;
        if (std::string_view(kind) == "comm") o.scales.comm = f;
        if (std::string_view(kind) == "cpu") o.scales.cpu = f;
        const auto s = report::replay_job(job, o);
        for (std::size_t i = 0; i < s.ranks.size(); ++i) {
          if (f < 1) CHECK(s.ranks[i].simulated_ns <= base.ranks[i].simulated_ns);
          if (f > 1) CHECK(s.ranks[i].simulated_ns >= base.ranks[i].simulated_ns);
        }
      }
    }
  }
}

TEST_CASE("selective what-if: op:TEXT=1 is the identity, =0 removes the time and keeps what it hid", "[traces][replay][op-scale]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto job = trace::load_job({traces / "hta_testdata/trace_diff/control/control.json.gz"});
  const auto base = report::replay_job(job);
  report::replay_options same;
  same.build.op_scales = {{"DataLoader", 1.0}, {"ncclKernel", 1.0}};
  CHECK(report::replay_job(job, same).simulated_ns == base.simulated_ns);
  // Removing every GPU kernel's time must shorten the step, but not to nothing: the CPU,
  // launches and kept overheads remain and now set the pace.
  report::replay_options no_kernels;
  no_kernels.build.op_scales = {{"kernel", 0.0}};
  const auto fast = report::replay_job(job, no_kernels);
  CHECK(fast.built.stats.op_scaled_gpu > 0);
  CHECK(fast.simulated_ns < base.simulated_ns);
  CHECK(fast.simulated_ns > 0);
  // op scales compose with the kind scales: halving every kernel named like a GEMM twice over
  // (op=0.5 and compute=0.5) gives at most what halving it once gives.
  report::replay_options once, twice;
  once.build.op_scales = {{"gemm", 0.5}};
  twice.build.op_scales = {{"gemm", 0.5}};
  twice.scales.compute = 0.5;
  CHECK(report::replay_job(job, twice).simulated_ns <= report::replay_job(job, once).simulated_ns);
}

TEST_CASE("leave-one-step-out: a step's graph with another step's durations predicts that step better than both baselines",
          "[traces][replay][held-out]") {
  LUMOS_REQUIRE_TRACES(traces);
  for (const char* rel : {"hta_testdata/df_index_resolver/df_index_resolver.json.gz", "hta_testdata/trace_diff/control/control.json.gz"}) {
    const auto job = trace::load_job({traces / rel});
    const auto steps = trace::profiler_steps(job.ranks.front());
    REQUIRE(steps.size() >= 3);
    double lumos_error = 0, same_error = 0, busy_error = 0;
    int pairs = 0;
    for (std::size_t n = 1; n < steps.size(); ++n) {  // the first step may be cut by the window
      for (std::size_t m = 1; m < steps.size(); ++m) {
        if (m == n) continue;
        INFO(rel << " step " << steps[n].number << " with durations of " << steps[m].number);
        report::replay_options o;
        o.step = steps[n].number;
        o.durations_from_step = steps[m].number;
        const auto s = report::replay_job(job, o);
        REQUIRE(s.held_out.size() == 1);
        const auto& h = s.held_out.front();
        CHECK(h.tasks.matched > 10 * h.tasks.unmatched);
        if (!h.tasks.comparable()) continue;  // the steps ran different ops (e.g. the first profiled step)
        lumos_error += report::relative_error(h.predicted_ns, h.measured_ns);
        same_error += report::relative_error(h.same_step_ns, h.measured_ns);
        busy_error += report::relative_error(h.gpu_busy_ratio_ns, h.measured_ns);
        ++pairs;
      }
    }
    REQUIRE(pairs >= 6);
    INFO(rel << ": mean error " << lumos_error / pairs << ", baselines " << same_error / pairs << " and " << busy_error / pairs);
    CHECK(lumos_error < same_error);
    CHECK(lumos_error < busy_error);
  }
}

TEST_CASE("release_events is called once per rank, and dropping the events there frees them and changes nothing", "[traces][replay]") {
  LUMOS_REQUIRE_TRACES(traces);
  for (const auto& inputs : {std::vector<fs::path>{traces / "astra-sim_megatron-gpt-tp8_8xA100"},
                             std::vector<fs::path>{fs::path(LUMOS_SOURCE_DIR) / "examples" / "data" / "tiny_job"}}) {
    INFO(inputs.front().string());
    const trace::job kept = trace::load_job(inputs);
    trace::job dropped = trace::load_job(inputs);
    const auto full = dropped.memory_bytes();
    std::size_t event_bytes = 0;
    for (const auto& r : dropped.ranks) {
      event_bytes += r.events.capacity() * sizeof(trace::event) + r.arg_keys.capacity() * sizeof(trace::arg_key) +
                     r.arg_values.capacity() * sizeof(std::int64_t);
    }
    std::size_t calls = 0;
    report::replay_options o;
    o.release_events = [&](std::size_t i) {
      ++calls;
      dropped.ranks[i].drop_events();
    };
    o.release_durations = true;  // as `lumos replay`
    const auto a = report::replay_job(kept);
    const auto b = report::replay_job(dropped, o);
    CHECK(calls == dropped.ranks.size());
    CHECK(dropped.memory_bytes() == full - event_bytes);  // freed, not just cleared
    for (const auto& r : dropped.ranks) CHECK(!r.file.empty());
    // The maps from events to tasks went with the events; the durations once compiled.
    for (const auto& m : a.built.ranks) CHECK(!m.task_of_event.empty());
    for (const auto& m : b.built.ranks) CHECK((m.task_of_event.empty() && m.arrive_of_event.empty()));
    CHECK(!a.built.graph.durations_released());
    CHECK(b.built.graph.durations_released());
    CHECK((b.built.graph.duration.capacity() == 0 && b.built.graph.busy_gap.capacity() == 0));
    CHECK(b.built.graph.task_count() == a.built.graph.task_count());
    CHECK_THROWS_WITH(graph::compile(b.built.graph), Catch::Contains("cannot be compiled again"));
    REQUIRE(a.ranks.size() == b.ranks.size());
    for (std::size_t i = 0; i < a.ranks.size(); ++i) {
      CHECK(a.ranks[i].rank == b.ranks[i].rank);
      CHECK(a.ranks[i].file == b.ranks[i].file);
      CHECK(a.ranks[i].step == b.ranks[i].step);
      CHECK(a.ranks[i].measured_ns == b.ranks[i].measured_ns);
      CHECK(a.ranks[i].simulated_ns == b.ranks[i].simulated_ns);
      CHECK(a.ranks[i].measured.split.exposed_comm == b.ranks[i].measured.split.exposed_comm);
      CHECK(a.ranks[i].simulated.sm.mean == b.ranks[i].simulated.sm.mean);
    }
    CHECK(a.makespan == b.makespan);
    // The reports that follow a replay read the compiled records, not the released columns.
    const auto pa = report::iteration_critical_path(a.built.graph, a.compiled, a.timeline, a.plans[0], a.ranks[0].simulated);
    const auto pb = report::iteration_critical_path(b.built.graph, b.compiled, b.timeline, b.plans[0], b.ranks[0].simulated);
    REQUIRE(pa.segments.size() == pb.segments.size());
    for (std::size_t k = 0; k < pa.segments.size(); ++k) CHECK((pa.segments[k].task == pb.segments[k].task && pa.segments[k].end == pb.segments[k].end));

    // As `lumos replay` without a critical path, written traces or a report: the observed times
    // and source events go before the compile, the edges once compiled. Same results, and the
    // frozen overheads (which place each kept delay by its task's measured start) too.
    trace::job third = trace::load_job(inputs);
    o.release_events = [&](std::size_t i) { third.ranks[i].drop_events(); };
    o.release_observations = true;
    o.release_edges = true;
    const auto c = report::replay_job(third, o);
    CHECK(c.built.graph.observations_released());
    CHECK(c.built.graph.edges_released());
    CHECK(c.built.graph.edge_count() == a.built.graph.edge_count());
    CHECK(c.built.graph.memory_bytes() < b.built.graph.memory_bytes());
    REQUIRE(c.ranks.size() == a.ranks.size());
    std::vector<report::interval> windows;
    for (std::size_t i = 0; i < a.ranks.size(); ++i) {
      CHECK(c.ranks[i].measured_ns == a.ranks[i].measured_ns);
      CHECK(c.ranks[i].simulated_ns == a.ranks[i].simulated_ns);
      CHECK(c.ranks[i].simulated.split.exposed_comm == a.ranks[i].simulated.split.exposed_comm);
      windows.push_back(a.ranks[i].measured.window);
    }
    CHECK(c.makespan == a.makespan);
    const auto fa = report::frozen_overheads(a.built, a.plans, windows);
    const auto fc = report::frozen_overheads(c.built, c.plans, windows);
    REQUIRE(fa.size() == fc.size());
    for (std::size_t i = 0; i < fa.size(); ++i) {
      CHECK(fa[i].by_kind == fc[i].by_kind);
      REQUIRE(fa[i].largest.size() == fc[i].largest.size());
      for (std::size_t k = 0; k < fa[i].largest.size(); ++k) {
        CHECK(fc[i].largest[k].task == fa[i].largest[k].task);
        CHECK(fc[i].largest[k].at == a.built.graph.observed_start[fa[i].largest[k].task]);
      }
    }
    CHECK_THROWS_WITH(report::iteration_critical_path(c.built.graph, c.compiled, c.timeline, c.plans[0], c.ranks[0].simulated),
                      Catch::Contains("edges were released"));
  }
}

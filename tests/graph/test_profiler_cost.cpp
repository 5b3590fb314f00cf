// The step without the profiler (model/profiler_cost.hpp) on small hand-made traces: one thread
// launching one kernel per operator, bound by the host or by the GPU.
#include <lumos/model/profiler_cost.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/job.hpp>

#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

using namespace lumos;

namespace {

// `ops` operators of 50 us, each launching (a 4 us cudaLaunchKernel 40 us in) one kernel of
// `kernel_us` on stream 7, 5 us apart, inside ProfilerStep#1. With `view_us`, each operator first
// makes two views of `view_us` each (aten::view, aten::t; at most 3 us).
trace::job one_thread_job(int ops, double kernel_us, double view_us = 0) {
  std::string ev;
  auto add = [&](const std::string& e) { ev += (ev.empty() ? "" : ",\n") + e; };
  double gpu_free = 0, cpu_end = 0;
  for (int i = 0; i < ops; ++i) {
    const double op = 10.0 + 55.0 * i, launch = op + 40.0;
    const double start = std::max(launch + 5.0, gpu_free + 1.0);
    gpu_free = start + kernel_us;
    cpu_end = op + 50.0;
    const std::string corr = std::to_string(i + 1);
    add(R"({"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":)" + std::to_string(op) + R"(,"dur":50})");
    if (view_us > 0) {
      for (const auto& [name, at] : {std::pair{"aten::view", 2.0}, std::pair{"aten::t", 6.0}}) {
        add(R"({"ph":"X","cat":"cpu_op","name":")" + std::string(name) + R"(","pid":1,"tid":1,"ts":)" + std::to_string(op + at) +
            R"(,"dur":)" + std::to_string(view_us) + "}");
      }
    }
    add(R"({"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":)" + std::to_string(launch) +
        R"(,"dur":4,"args":{"correlation":)" + corr + "}}");
    add(R"({"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":)" + std::to_string(start) + R"(,"dur":)" +
        std::to_string(kernel_us) + R"(,"args":{"device":0,"stream":7,"correlation":)" + corr + "}}");
  }
  add(R"({"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":)" + std::to_string(cpu_end + 5.0) + "}");
  const lumos_test::temp_dir dir;
  return trace::load_job({dir.write("rank0.json", R"({"traceEvents":[)" + ev + "]}")});
}

report::replay_session replay_with(const trace::job& job, model::profiler_cost cost) {
  report::replay_options o;
  o.profiler = cost;
  return report::replay_job(job, o);
}

constexpr model::profiler_cost ten_us{.per_op = 10'000, .per_runtime = 10'000, .per_python = 10'000};

}  // namespace

TEST_CASE("the graph builder records the profiler's events around each CPU task", "[profiler]") {
  const trace::job job = one_thread_job(4, 5.0);
  const graph::built_job b = graph::build_graph(job);
  REQUIRE(b.ranks.size() == 1);
  const auto& rec = b.ranks[0].recorded;
  REQUIRE(rec.size() == 4);  // one per launch; "thread end" has no source event
  // The first launch covers ProfilerStep#1, its operator and itself; the others an operator and itself.
  CHECK((rec[0].ops == 2 && rec[0].runtime == 1 && rec[0].python == 0));
  for (std::size_t i = 1; i < rec.size(); ++i) CHECK((rec[i].ops == 1 && rec[i].runtime == 1));
  const std::vector<std::uint32_t> cost = model::profiler_time(b, ten_us);
  std::uint32_t total = 0;
  for (const std::uint32_t c : cost) total += c;
  CHECK(total == 10'000u * (4 * 2 + 1));
}

TEST_CASE("the profiler's cost per event follows the host speed its metadata operators show", "[profiler]") {
  // 8 operators: 16 views, the least that measure the host; 7 operators are too few.
  const graph::built_job fast = graph::build_graph(one_thread_job(8, 5.0, 1.0));
  const graph::built_job slow = graph::build_graph(one_thread_job(8, 5.0, 2.0));
  const graph::built_job few = graph::build_graph(one_thread_job(7, 5.0, 2.0));
  CHECK(fast.ranks[0].metadata_op == 1000);
  CHECK(slow.ranks[0].metadata_op == 2000);
  CHECK(few.ranks[0].metadata_op == 0);
  auto total = [](const graph::built_job& b, const model::profiler_cost& c) {
    std::uint64_t sum = 0;
    for (const std::uint32_t x : model::profiler_time(b, c)) sum += x;
    return sum;
  };
  // Each launch records its operator, two views and itself (the first also ProfilerStep#1).
  const std::uint64_t events = 8 * 4 + 1;
  const model::profiler_cost multiple{.per_op = 10'000, .per_runtime = 10'000, .per_python = 10'000, .per_metadata_op = 1.5};
  CHECK(total(fast, multiple) == events * 1500);
  CHECK(total(slow, multiple) == events * 3000);
  CHECK(total(few, multiple) == (7 * 4 + 1) * 10'000u);  // no measure: the fixed costs
  CHECK(total(slow, ten_us) == events * 10'000);         // no multiple: the fixed costs
}

TEST_CASE("removing the profiler's time shortens a host-bound step and barely moves a GPU-bound one", "[profiler]") {
  const report::replay_session host = replay_with(one_thread_job(40, 5.0), ten_us);
  // Host-bound: 55 us per operator, 20 us of it the profiler's; the kernels keep up.
  CHECK(host.simulated_ns == host.measured_ns);
  CHECK(host.unprofiled_ns < host.simulated_ns);
  CHECK(static_cast<double>(host.unprofiled_ns) < 0.75 * static_cast<double>(host.simulated_ns));
  CHECK(static_cast<double>(host.unprofiled_ns) > 0.55 * static_cast<double>(host.simulated_ns));

  const report::replay_session gpu = replay_with(one_thread_job(40, 500.0), ten_us);
  // GPU-bound: the kernels queue up; a faster host only launches them earlier.
  CHECK(gpu.unprofiled_ns <= gpu.simulated_ns);
  CHECK(static_cast<double>(gpu.unprofiled_ns) > 0.99 * static_cast<double>(gpu.simulated_ns));
}

TEST_CASE("the step without the profiler is never longer than the profiled one, and equal without profiler cost", "[profiler]") {
  for (const double kernel_us : {1.0, 20.0, 60.0, 200.0}) {
    const trace::job job = one_thread_job(30, kernel_us);
    const report::replay_session fitted = replay_with(job, model::fitted_profiler_cost);
    CHECK(fitted.unprofiled_ns <= fitted.simulated_ns);
    CHECK(fitted.unprofiled_ns > 0);
    const report::replay_session none = replay_with(job, {});
    CHECK(none.unprofiled_ns == none.simulated_ns);
    // More cost per event, a step no longer.
    CHECK(replay_with(job, ten_us).unprofiled_ns <= replay_with(job, {.per_op = 5'000, .per_runtime = 5'000}).unprofiled_ns);
  }
  report::replay_options off;
  off.profiler.reset();
  const report::replay_session s = report::replay_job(one_thread_job(10, 5.0), off);
  CHECK(s.unprofiled_ns == s.simulated_ns);
}

TEST_CASE("the estimate leaves the compiled graph and the replay as they were", "[profiler]") {
  const trace::job job = one_thread_job(25, 20.0);
  const graph::built_job b = graph::build_graph(job);
  graph::compiled_graph c = graph::compile(b.graph);
  const graph::compiled_graph before = c;
  const std::vector<std::uint32_t> cost = model::profiler_time(b, ten_us);
  const model::profiler_undo undo = model::remove_profiler_time(c, b.graph, cost);
  CHECK(!undo.empty());
  bool changed = false;
  for (std::size_t i = 0; i < c.size(); ++i) changed = changed || c.tasks[i].gap != before.tasks[i].gap;
  CHECK(changed);
  model::restore_profiler_time(c, undo);
  for (std::size_t i = 0; i < c.size(); ++i) {
    CHECK((c.tasks[i].gap == before.tasks[i].gap && c.tasks[i].duration == before.tasks[i].duration));
  }
  for (std::size_t e = 0; e < c.preds.size(); ++e) CHECK(c.preds[e].delay == before.preds[e].delay);

  // The replay with the estimate is the replay without it, bit for bit.
  report::replay_options off;
  off.profiler.reset();
  const report::replay_session with = replay_with(job, ten_us), without = report::replay_job(job, off);
  CHECK(with.simulated_ns == without.simulated_ns);
  for (std::size_t i = 0; i < with.compiled.size(); ++i) {
    const auto p = graph::position{static_cast<std::uint32_t>(i)};
    CHECK((with.timeline.start_of(p) == without.timeline.start_of(p) && with.timeline.finish_of(p) == without.timeline.finish_of(p)));
  }
}

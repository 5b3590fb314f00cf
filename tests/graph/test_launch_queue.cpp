// Launch calls that block on a full launch queue: found from the trace, made waits on the GPU
// op whose end freed their slot, so that a faster GPU stops blocking them. The truth is a small
// executor with CUDA's rule (a launch onto a stream holding `capacity` unfinished ops returns
// only once the oldest has finished), run at the traced and at the what-if kernel length.
#include "../unit/test_support.hpp"

#include <lumos/report/replay_report.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace lumos;

namespace {

struct queue_run {
  std::string json;         // the Kineto trace of the run
  double step_us = 0;       // first launch → the end of the final synchronize
  std::size_t blocked = 0;  // launch calls that waited for a slot
};

// `launches` kernels of `kernel_us` each on one stream, launched by one thread: each launch
// costs `launch_us` of host time after its slot is free, with `gap_us` of host work between
// launches; then a device synchronize.
queue_run run_queue(int launches, double kernel_us, std::size_t capacity, double launch_us = 5, double gap_us = 3) {
  queue_run r;
  std::vector<double> end;
  std::string events = R"({"ph":"M","name":"thread_name","pid":100,"tid":100,"args":{"name":"python3"}})";
  auto x = [&](const char* cat, const char* name, int pid, int tid, double ts, double dur, int corr) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  R"(,{"ph":"X","cat":"%s","name":"%s","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"correlation":%d,"stream":7,"device":0}})",
                  cat, name, pid, tid, ts, dur, corr);
    events += buf;
  };
  double cpu = 0;
  for (int i = 0; i < launches; ++i) {
    const double start = cpu;
    double free_at = start;
    if (static_cast<std::size_t>(i) >= capacity) {
      const double oldest = end[static_cast<std::size_t>(i) - capacity];  // the op whose end frees a slot
      if (oldest > start) free_at = oldest, ++r.blocked;
    }
    const double call_end = free_at + launch_us;
    const double kernel_start = std::max(start + launch_us, end.empty() ? 0.0 : end.back() + 1.0);
    end.push_back(kernel_start + kernel_us);
    x("cuda_runtime", "cudaLaunchKernel", 100, 100, start, call_end - start, i + 1);
    x("kernel", "gemm", 0, 7, kernel_start, kernel_us, i + 1);
    cpu = call_end + gap_us;
  }
  const double sync_end = std::max(cpu, end.back()) + 2;
  x("cuda_runtime", "cudaDeviceSynchronize", 100, 100, cpu, sync_end - cpu, launches + 1);
  r.json = "{\"traceEvents\":[" + events + "]}";
  r.step_us = sync_end;
  return r;
}

report::replay_session replay(const std::string& json, double compute) {
  lumos_test::temp_dir dir;
  lumos_test::write_file(dir.path() / "rank0.json", json);
  report::replay_options o;
  o.scales.compute = compute;
  return report::replay_job(trace::load_job({dir.path() / "rank0.json"}), o);
}

}  // namespace

TEST_CASE("launches blocked on a full launch queue are waits: a faster GPU stops blocking them", "[graph][replay][launch-queue]") {
  constexpr std::size_t capacity = 64;
  const queue_run traced = run_queue(400, 100, capacity);  // GPU-bound: the queue fills
  REQUIRE(traced.blocked > 300);
  const auto same = replay(traced.json, 1.0);
  CHECK(same.built.stats.queue_blocked_launches == traced.blocked);
  CHECK(same.built.stats.queue_blocked_launches <= same.built.stats.blocking_calls);
  CHECK(same.error < 1e-6);  // the unchanged replay reproduces the trace

  for (const double factor : {0.5, 0.1, 0.02}) {
    INFO("compute x" << factor);
    const queue_run truth = run_queue(400, 100 * factor, capacity);
    const auto predicted = replay(traced.json, factor);
    const double error = std::fabs(static_cast<double>(predicted.simulated_ns) / 1e3 - truth.step_us) / truth.step_us;
    CHECK(error < 0.02);
  }
}

TEST_CASE("a queue that never fills holds no blocked launch, and slow launches below capacity stay host time", "[graph][replay][launch-queue]") {
  const queue_run host_bound = run_queue(400, 4, 64);  // the GPU keeps up: no launch waits
  REQUIRE(host_bound.blocked == 0);
  CHECK(replay(host_bound.json, 1.0).built.stats.queue_blocked_launches == 0);
}

// The sweep API (sweep/evaluate.hpp) on the GPT-3 175B / 1024-H100 space, folded `pass`
// programs with the kernel-level cost model (what `lumos sweep` runs):
//   BM_sweep/<space>            every configuration of the space (rejected ones cost a
//                               validation), one thread, one reused workspace:
//                               configurations per second per core
//   BM_sweep_predicted/<space>  only the accepted configurations (each a full prediction): the
//                               simulated configurations per second per core
//   BM_graph_each/<space>       the same accepted configurations through the task graph, fresh
//                               each time: build_program, graph::compile, replay, the same
//                               figures (the path a sweep took before it emitted compiled
//                               programs: the baseline)
//   BM_predict_each/<space>     the same accepted configurations through synth::predict (a fresh
//                               compiled program, buffers and engine per call)
//   BM_replay_each/<space>      the replay loop alone over the same configurations' compiled
//                               graphs (the floor of any sweep that replays each one)
//   BM_phase/<space>/N         validate (0), emit the compiled program's timeline as a sweep
//                              does (1), replay the whole compiled program (2), replay it with
//                              the figures (3) of the headline configuration TP8 PP8 DP16 v4
//                              with a warm workspace; the task-graph path's build (4) and
//                              compile (5); the figures from the emitted timeline (6, what a
//                              sweep does after 1); emit the whole compiled program (7)
//   BM_sweep_threads/<space>/T  a 10,000-configuration space (Llama-3 8B on 64 GPUs) with
//                               sweep::run on T threads: the scaling of the thread pool
// Counters: configs_per_s, allocs_per_eval (heap allocations per evaluation with a warm
// workspace, counted by the operator new below), tasks (mean tasks per predicted configuration).
// The ratios at the end compare benchmarks of the same run; the machine's noise affects both.
#include "bench_support.hpp"

#include <lumos/model/profile.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/zero_bubble.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>
#include <lumos/synth/figures.hpp>
#include <lumos/synth/program.hpp>

#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {
std::atomic<std::uint64_t> allocations{0};
// Out of line: GCC's -Wmismatched-new-delete cannot see that this new pairs with this free.
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }
}  // namespace

// Counts heap allocations (all threads); the benchmark reads the difference around a loop.
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }

namespace {

namespace sw = lumos::sweep;
namespace lm = lumos::model;
namespace ls = lumos::synth;
namespace lp = lumos::pipeline;

double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

sw::problem gpt3_problem() {
  sw::problem p;  // GPT-3 175B, H100, bf16, global batch 1536, ZeRO-1, 10 % memory margin
  p.gpus = 1024;
  return p;
}

// The space a GPT-3 175B / 1024-GPU study sweeps: Megatron's sizes, both 1F1B schedules,
// micro-batches 1-4, the three recomputation modes, sp off and on.
sw::space gpt3_space() {
  sw::space s;
  s.tp = {1, 2, 4, 8};
  s.pp = {1, 2, 4, 8, 16, 32};
  s.vp = {1, 2, 4};
  s.micro_batch = {1, 2, 4};
  s.schedules = {ls::policy_of<lp::one_f_one_b>(), ls::policy_of<lp::interleaved_one_f_one_b>()};
  s.recompute = {lm::recompute_kind::none, lm::recompute_kind::selective, lm::recompute_kind::full};
  s.sp = {false, true};
  return s;
}

const auto& gpt3_evaluator() {
  static const auto ev = sw::make_evaluator(gpt3_problem(), lm::profile_preset("h100-sxm"));
  return ev;
}
const std::vector<sw::configuration>& gpt3_configs() {
  static const auto c = sw::enumerate(gpt3_space(), 1024);
  return c;
}
const std::vector<sw::configuration>& gpt3_accepted() {
  static const auto c = [] {
    std::vector<sw::configuration> out;
    for (const auto& r : sw::run(gpt3_evaluator(), gpt3_configs(), {.threads = 1, .simulate = false})) {
      if (r.ok()) out.push_back(r.config);
    }
    return out;
  }();
  return c;
}

void BM_sweep(benchmark::State& state, bool accepted_only) {
  const auto& ev = gpt3_evaluator();
  const auto& configs = accepted_only ? gpt3_accepted() : gpt3_configs();
  sw::workspace w;
  for (const auto& c : configs) (void)ev.evaluate(c, w);  // warm the workspace
  std::uint64_t allocs = 0, evals = 0;
  double tasks = 0, predicted = 0;
  for (auto _ : state) {
    const std::uint64_t before = allocations.load();
    for (const auto& c : configs) {
      const sw::result r = ev.evaluate(c, w);
      benchmark::DoNotOptimize(r.m.iteration_ns);
      if (r.predicted) {
        tasks += static_cast<double>(r.m.tasks);
        ++predicted;
      }
    }
    allocs += allocations.load() - before;
    evals += configs.size();
  }
  state.counters["configs"] = static_cast<double>(configs.size());
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(configs.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["allocs_per_eval"] = static_cast<double>(allocs) / static_cast<double>(evals);
  state.counters["tasks"] = predicted > 0 ? tasks / predicted : 0;
}

void BM_predict_each(benchmark::State& state) {
  const auto& ev = gpt3_evaluator();
  const auto& configs = gpt3_accepted();
  std::uint64_t allocs = 0, evals = 0;
  for (auto _ : state) {
    const std::uint64_t before = allocations.load();
    for (const auto& c : configs) {
      const ls::prediction p = ls::predict(ev.job_of(c), ev.fixed().options, ev.compute_model(), ev.comm_model());
      benchmark::DoNotOptimize(p.iteration_ns);
    }
    allocs += allocations.load() - before;
    evals += configs.size();
  }
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(configs.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["allocs_per_eval"] = static_cast<double>(allocs) / static_cast<double>(evals);
}

void BM_graph_each(benchmark::State& state) {
  const auto& ev = gpt3_evaluator();
  const auto& configs = gpt3_accepted();
  std::uint64_t allocs = 0, evals = 0;
  for (auto _ : state) {
    const std::uint64_t before = allocations.load();
    for (const auto& c : configs) {
      const ls::program prog = ls::build_program(ev.job_of(c), ev.fixed().options.program, ev.compute_model(), ev.comm_model());
      const ls::compiled_program compiled = ls::compile_program(prog);
      lumos::sim::replay_engine engine;
      ls::figure_buffers figures;
      benchmark::DoNotOptimize(ls::replay_figures(compiled, engine, figures).bubble_fraction);
    }
    allocs += allocations.load() - before;
    evals += configs.size();
  }
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(configs.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["allocs_per_eval"] = static_cast<double>(allocs) / static_cast<double>(evals);
}

void BM_replay_each(benchmark::State& state) {
  const auto& ev = gpt3_evaluator();
  std::vector<lumos::graph::compiled_graph> graphs;
  for (const auto& c : gpt3_accepted()) {
    graphs.push_back(ls::build_compiled(ev.job_of(c), ev.fixed().options.program, ev.compute_model(), ev.comm_model()).graph);
  }
  lumos::sim::replay_engine engine;
  lumos::sim::makespan_only m;
  for (auto _ : state) {
    for (const auto& g : graphs) benchmark::DoNotOptimize(engine.run(g, m));
  }
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(graphs.size()), benchmark::Counter::kIsIterationInvariantRate);
}

// One phase of an evaluation of the headline configuration (TP8 PP8 DP16, interleaved v = 4,
// selective recomputation, micro-batch 1) with a warm workspace: 0 validate, 1 emit the
// compiled program's timeline (what `evaluate` emits), 6 take the figures from it; the
// whole compiled program: 7 emit it, 2 replay it alone, 3 replay it and take its figures; the
// task-graph path: 4 build the task graph, 5 compile it.
void BM_phase(benchmark::State& state) {
  const auto& ev = gpt3_evaluator();
  const sw::configuration c{.tp = 8, .pp = 8, .dp = 16, .vp = 4, .micro_batch = 1,
                            .schedule = ls::policy_of<lp::interleaved_one_f_one_b>(),
                            .recompute = lm::recompute_kind::selective};
  sw::workspace w;
  (void)ev.evaluate(c, w);
  const ls::job j = ev.job_of(c);
  const auto& o = ev.fixed().options.program;
  const auto& orders = w.orders.get(c.schedule, w.program.shape);
  ls::compiled_program whole;
  ls::program_buffers buffers;
  ls::build_compiled_into(whole, buffers, j, o, ev.compute_model(), ev.comm_model(), &orders.orders);
  ls::program prog;
  ls::build_program_into(prog, j, o, ev.compute_model(), ev.comm_model());
  lumos::graph::compiled_graph compiled;
  lumos::graph::compile_scratch scratch;
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0: benchmark::DoNotOptimize(ev.validate(c, w).memory_bytes); break;
      case 1:
        ls::build_compiled_into(w.program, w.buffers, j, o, ev.compute_model(), ev.comm_model(), &orders.orders,
                                ls::compiled_parts::timeline);
        break;
      case 2: benchmark::DoNotOptimize(w.engine.run(whole.graph)); break;
      case 3: benchmark::DoNotOptimize(ls::replay_figures(whole, w.engine, w.figures).bubble_fraction); break;
      case 4: ls::build_program_into(prog, j, o, ev.compute_model(), ev.comm_model()); break;
      case 5: lumos::graph::compile_into(prog.graph, compiled, scratch); break;
      case 6: benchmark::DoNotOptimize(ls::emitted_figures(w.program, w.figures).bubble_fraction); break;
      default: ls::build_compiled_into(whole, buffers, j, o, ev.compute_model(), ev.comm_model(), &orders.orders); break;
    }
  }
  state.counters["tasks"] = static_cast<double>(w.program.task_count());
}

// About 10,000 configurations of Llama-3 8B on 64 GPUs.
void BM_sweep_threads(benchmark::State& state) {
  static const auto ev = [] {
    sw::problem p;
    p.model = lm::llama3_8b();
    p.gpus = 64;
    p.global_batch = 512;
    return sw::make_evaluator(p, lm::profile_preset("h100-sxm"));
  }();
  static const auto configs = [] {
    sw::space s;
    s.tp = {1, 2, 4, 8};
    s.pp = {1, 2, 4, 8, 16, 32};
    s.vp = {1, 2, 4, 8};
    s.micro_batch = {1, 2, 3, 4, 6, 8};
    s.schedules = {ls::policy_of<lp::one_f_one_b>(), ls::policy_of<lp::interleaved_one_f_one_b>(),
                   ls::policy_of<lp::gpipe>(), ls::policy_of<lp::zero_bubble_h1>()};
    s.recompute = {lm::recompute_kind::none, lm::recompute_kind::selective, lm::recompute_kind::full};
    s.sp = {false, true};
    return sw::enumerate(s, 64);
  }();
  const auto threads = static_cast<unsigned>(state.range(0));
  std::size_t predicted = 0;
  const double cpu0 = process_cpu_s();
  for (auto _ : state) {
    const auto r = sw::run(ev, configs, {.threads = threads});
    predicted = sw::count_reasons(r)[0];
    benchmark::DoNotOptimize(r.data());
  }
  state.counters["configs"] = static_cast<double>(configs.size());
  state.counters["predicted"] = static_cast<double>(predicted);
  // CPU seconds of all threads per configuration: equal for 1 and 2 threads when the threads
  // share nothing (no lock, no extra work), whatever else runs on the machine.
  state.counters["cpu_us_per_config"] = (process_cpu_s() - cpu0) * 1e6 /
                                        static_cast<double>(configs.size() * static_cast<std::size_t>(state.iterations()));
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(configs.size()), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed memory in the process, as bench_predict does (a sweep tool should).
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  benchmark::Initialize(&argc, argv);
  lumos_bench::ratio_reporter reporter;
  const std::string name = "gpt3-175b-1024gpu";
  std::printf("space %s: %zu configurations, %zu accepted\n", name.c_str(), gpt3_configs().size(), gpt3_accepted().size());
  const std::string timed = "/min_time:2.000";
  benchmark::RegisterBenchmark(("BM_sweep/" + name).c_str(), BM_sweep, false)->Unit(benchmark::kMillisecond)->MinTime(2);
  benchmark::RegisterBenchmark(("BM_sweep_predicted/" + name).c_str(), BM_sweep, true)->Unit(benchmark::kMillisecond)->MinTime(2);
  benchmark::RegisterBenchmark(("BM_graph_each/" + name).c_str(), BM_graph_each)->Unit(benchmark::kMillisecond)->MinTime(2);
  benchmark::RegisterBenchmark(("BM_predict_each/" + name).c_str(), BM_predict_each)->Unit(benchmark::kMillisecond)->MinTime(2);
  benchmark::RegisterBenchmark(("BM_replay_each/" + name).c_str(), BM_replay_each)->Unit(benchmark::kMillisecond)->MinTime(2);
  benchmark::RegisterBenchmark(("BM_phase/" + name).c_str(), BM_phase)
      ->ArgName("validate_emit_replay_figures_build_compile_emitted_whole")
      ->DenseRange(0, 7)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_sweep_threads/llama3-8b-64gpu", BM_sweep_threads)
      ->Arg(1)
      ->Arg(2)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->Iterations(1);
  const std::string predicted = "BM_sweep_predicted/" + name + timed;
  reporter.compare(predicted, "BM_graph_each/" + name + timed, "configs_per_s");
  reporter.compare(predicted, "BM_predict_each/" + name + timed, "configs_per_s");
  reporter.compare(predicted, "BM_replay_each/" + name + timed, "configs_per_s");
  reporter.compare("BM_sweep/" + name + timed, predicted, "configs_per_s");
  reporter.compare("BM_sweep_threads/llama3-8b-64gpu/1/iterations:1/real_time",
                   "BM_sweep_threads/llama3-8b-64gpu/2/iterations:1/real_time", "cpu_us_per_config");
  reporter.compare("BM_sweep_threads/llama3-8b-64gpu/2/iterations:1/real_time",
                   "BM_sweep_threads/llama3-8b-64gpu/1/iterations:1/real_time", "configs_per_s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}

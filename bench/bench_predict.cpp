// Model-driven prediction of one training iteration (synth/predict.hpp), GPT-3 175B on 1024
// H100s: TP8 PP8 DP16, interleaved 1F1B with v = 4, selective recomputation, micro-batch 1,
// global batch 1536 (96 micro-batches per pipeline), ZeRO-1.
//   BM_predict/<job>           build (folded: one rank per stage, `pass` granularity), compile,
//                              replay, metrics — one configuration, what a sweep pays per point;
//                              the roofline cost model
//   BM_predict_kernel_model/<job>  the same with the kernel-level cost model and the hardware's
//                              profile preset (`lumos predict`'s default)
//   BM_predict_cold/<job>      the same with every call's memory fresh from the kernel (glibc
//                              trimmed before each call): the page-fault cost a short-lived
//                              process pays
//   BM_predict_kernel/<job>    folded, `kernel` granularity (one task per op: the trace-like
//                              program `lumos synth` writes)
//   BM_predict_unfold/<job>    every rank (1024), `pass` granularity: build + replay, peak RSS
//   BM_replay/<job>            the replay loop alone over the folded program's compiled graph
//   BM_timeline/<job>          baseline: the reference evaluator of pipeline/timeline.hpp on the
//                              same schedule shape (p = 8, m = 96, v = 4), free communication
//
// The process keeps freed memory (mallopt below), as a sweep tool should: glibc's default
// returns every large block to the kernel on free, and on this project's VMs each 4 KiB page
// fault costs ~5-10 us, which would dominate a 3 ms prediction (BM_predict_cold shows it).
#include "bench_support.hpp"

#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/synth/predict.hpp>

#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

namespace {

lumos::synth::job gpt3_175b_1024() {
  lumos::synth::job j;
  j.model = lumos::model::gpt3_175b();
  j.hardware = lumos::model::h100_sxm();
  j.parallel.tp = 8;
  j.parallel.pp = 8;
  j.parallel.dp = 16;
  j.parallel.vp = 4;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = 1536;
  j.parallel.recompute = lumos::model::recompute_kind::selective;
  j.parallel.zero_stage = 1;
  return j;
}

double peak_rss_gb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / 1e9;
}

void report(benchmark::State& state, const lumos::synth::prediction& p) {
  state.counters["tasks"] = static_cast<double>(p.tasks);
  state.counters["edges"] = static_cast<double>(p.edges);
  state.counters["iteration_s"] = static_cast<double>(p.iteration_ns) / 1e9;
  state.counters["mfu"] = p.mfu;
  state.counters["configs_per_s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_predict(benchmark::State& state, lumos::synth::job j, lumos::synth::granularity g, bool cold) {
  lumos::synth::predict_options o;
  o.program.detail = g;
  lumos::synth::prediction p;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      ::malloc_trim(0);
      state.ResumeTiming();
    }
    p = lumos::synth::predict(j, o);
    benchmark::DoNotOptimize(p.iteration_ns);
  }
  report(state, p);
}

// The kernel-level cost model with the hardware's profile preset (what `lumos predict` uses by
// default since the model issue); BM_predict above is the roofline model, its baseline.
void BM_predict_kernel_model(benchmark::State& state, lumos::synth::job j) {
  lumos::synth::predict_options o;
  o.program.detail = lumos::synth::granularity::pass;
  const lumos::model::cost_profile profile = lumos::model::profile_preset(j.hardware.name);
  // The host-side options the profile fixes, as `lumos predict` sets them.
  o.program.collective_cpu = static_cast<lumos::time_ns>(profile.cpu_collective_ns);
  o.program.launch_cost = static_cast<lumos::time_ns>(profile.cpu_launch_ns);
  o.program.p2p_host_sync = profile.cpu_p2p_sync > 0;
  o.program.loss_scale_host_sync = profile.cpu_loss_scale_sync > 0 && j.parallel.dtype == lumos::model::precision::fp16;
  lumos::synth::prediction p;
  for (auto _ : state) {
    p = lumos::synth::predict(j, o, lumos::model::kernel_level{profile}, lumos::model::nccl_model{profile});
    benchmark::DoNotOptimize(p.iteration_ns);
  }
  report(state, p);
}

void BM_predict_unfold(benchmark::State& state, lumos::synth::job j) {
  lumos::synth::predict_options o;
  o.program.unfold = true;
  lumos::synth::prediction p;
  for (auto _ : state) {
    p = lumos::synth::predict(j, o);
    benchmark::DoNotOptimize(p.iteration_ns);
  }
  report(state, p);
  state.counters["ranks"] = static_cast<double>(p.simulated_ranks);
  state.counters["peak_rss_GB"] = peak_rss_gb();
}

void BM_replay(benchmark::State& state, lumos::synth::job j) {
  lumos::synth::program_options o;
  o.detail = lumos::synth::granularity::pass;
  o.record_collectives = false;
  const auto prog = lumos::synth::build_program(j, o);
  const auto c = lumos::graph::compile(prog.graph);
  lumos::sim::replay_engine engine;
  lumos::sim::makespan_only m;
  for (auto _ : state) benchmark::DoNotOptimize(engine.run(c, m));
  state.counters["tasks"] = static_cast<double>(c.size());
  state.counters["configs_per_s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_timeline(benchmark::State& state, lumos::synth::job j) {
  const lumos::pipeline::schedule_shape shape{j.parallel.pp, static_cast<std::int32_t>(j.parallel.micro_batches()),
                                              j.parallel.vp};
  const lumos::pipeline::op_costs<std::int64_t> c{4000, 8000, 0};
  for (auto _ : state) {
    const auto t = lumos::pipeline::evaluate_timeline<lumos::pipeline::interleaved_one_f_one_b>(shape, c);
    benchmark::DoNotOptimize(t.makespan);
  }
  state.counters["configs_per_s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed memory in the process (see the header comment).
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  benchmark::Initialize(&argc, argv);
  lumos_bench::ratio_reporter reporter;
  const std::string name = "gpt3-175b-1024gpu";
  const auto job = gpt3_175b_1024();
  using lumos::synth::granularity;
  benchmark::RegisterBenchmark(("BM_timeline/" + name).c_str(), BM_timeline, job)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_replay/" + name).c_str(), BM_replay, job)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_predict/" + name).c_str(), BM_predict, job, granularity::pass, false)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_predict_kernel_model/" + name).c_str(), BM_predict_kernel_model, job)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_predict_cold/" + name).c_str(), BM_predict, job, granularity::pass, true)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_predict_kernel/" + name).c_str(), BM_predict, job, granularity::kernel, false)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_predict_unfold/" + name).c_str(), BM_predict_unfold, job)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(2);
  reporter.compare("BM_predict/" + name, "BM_timeline/" + name, "configs_per_s");
  reporter.compare("BM_predict/" + name, "BM_replay/" + name, "configs_per_s");
  reporter.compare("BM_predict_kernel_model/" + name, "BM_predict/" + name, "configs_per_s");
  reporter.compare("BM_predict_cold/" + name, "BM_predict/" + name, "configs_per_s");
  reporter.compare("BM_predict_kernel/" + name, "BM_predict/" + name, "configs_per_s");
  reporter.compare("BM_predict_unfold/" + name + "/iterations:2", "BM_predict/" + name, "configs_per_s");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}

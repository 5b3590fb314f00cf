// The precision what-if (include/lumos/whatif/precision.hpp) on a recorded bf16 H100 trace: the
// layers' linear GEMMs rescaled by the kernel model's fp8/bf16 ratio, a cast kernel inserted
// right before each on its stream and launched from the GEMM's thread, the rest untouched; the
// traces' own precision changes nothing. The memory summary counts fp8 as predict does, on jobs
// synthesised at the kernel level.
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/model/profile.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

using namespace lumos;

namespace {

const trace::job& bf16_job() {
  static const trace::job job = trace::load_job({lumos_test::data_dir() / "gpu" / "h100-base"});
  return job;
}

// A Llama-style job of 2 layers on 2 data-parallel ranks with the distributed optimizer (as
// `lumos predict`), in `dtype`.
synth::job memory_job(model::precision dtype) {
  synth::job j;
  j.model = model::detail::llama3("fp8-memory", 2, 1024, 3584, 16);
  j.model.seq = 1024, j.model.vocab = 32000;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.dp = 2, j.parallel.micro_batch = 1, j.parallel.global_batch = 4, j.parallel.zero_stage = 1;
  j.parallel.dtype = dtype;
  return j;
}

// The job's memory per GPU as `lumos predict` gives it.
double predicted_memory(model::precision dtype) { return synth::predict(memory_job(dtype)).memory.total(); }

// The job's kernel-level traces in `dir`, as loaded by whatif.
trace::job memory_job_traces(model::precision dtype, const std::filesystem::path& dir) {
  synth::program_options opt;
  opt.unfold = true;
  (void)lumos_test::write_kernel_job(memory_job(dtype), opt, model::profile_preset("h100-sxm"), dir);
  return trace::load_job({dir});
}

bool is_cast(std::string_view name) { return name.find("transformer_engine::detail::cast_transpose") != std::string_view::npos; }

}  // namespace

TEST_CASE("whatif --precision fp8: GEMMs rescaled, casts inserted before them on their stream", "[whatif][precision]") {
  whatif::whatif_options o;
  o.precision = model::precision::fp8;
  const whatif::whatif_result r = whatif::run_whatif(bf16_job(), o);
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.subject == "precision"; });
  REQUIRE(c != r.changes.end());
  CHECK(c->from == "bf16");
  CHECK(c->to == "fp8");
  REQUIRE(c->figures.size() == 4);
  const double gemms = c->figures[0].after, casts = c->figures[1].after;
  // 8 layers of QKV, attention output, FC1 and FC2, forward and both gradients each.
  CHECK(gemms >= 8 * 4 * 3);
  CHECK(casts >= 8 * 4 * 3);
  // The GEMMs at about the fp8 / bf16 peak ratio (a half on the H100), not less.
  const double ratio = c->figures[2].after / c->figures[2].before;
  CHECK(ratio > 0.45);
  CHECK(ratio < 0.75);

  const graph::task_graph& g = r.predicted.built.graph;
  std::vector<graph::task_id> next(g.task_count(), graph::no_task), last(g.processors.size(), graph::no_task);
  for (graph::task_id t = g.task_count(); t-- > 0;) {
    next[t] = last[g.processor[t]];
    last[g.processor[t]] = t;
  }
  std::vector<graph::task_id> launcher(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launcher[e.to] = e.from;
  }
  std::size_t found = 0;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (!is_cast(g.task_name(t))) continue;
    ++found;
    CHECK(g.kind[t] == graph::task_kind::gpu_compute);
    CHECK(g.duration[t] > 0);
    // Followed on its stream by another cast or the GEMM it feeds.
    graph::task_id n = next[t];
    while (n != graph::no_task && is_cast(g.task_name(n))) n = next[n];
    REQUIRE(n != graph::no_task);
    CHECK(whatif::classify(g.kind[n], g.task_name(n)) == whatif::op_bound::compute);
    // Launched by a call on the thread that launches that GEMM.
    REQUIRE(launcher[t] != graph::no_task);
    REQUIRE(launcher[n] != graph::no_task);
    CHECK(g.processor[launcher[t]] == g.processor[launcher[n]]);
    CHECK(launcher[t] < launcher[n]);
  }
  CHECK(static_cast<double>(found) == casts);
  CHECK(g.task_count() == r.baseline.built.graph.task_count() + 2 * found);
  // The attention kernels are untouched.
  time_ns flash_before = 0, flash_after = 0;
  const graph::task_graph& a = r.baseline.built.graph;
  for (graph::task_id t = 0; t < a.task_count(); ++t) flash_before += a.task_name(t).find("flash") != std::string_view::npos ? a.duration[t] : 0;
  for (graph::task_id t = 0; t < g.task_count(); ++t) flash_after += g.task_name(t).find("flash") != std::string_view::npos ? g.duration[t] : 0;
  CHECK(flash_before > 0);
  CHECK(flash_after == flash_before);
}

TEST_CASE("whatif --precision: the traces' own precision changes nothing", "[whatif][precision]") {
  whatif::whatif_options o;
  o.precision = model::precision::bf16;
  const whatif::whatif_result r = whatif::run_whatif(bf16_job(), o);
  CHECK(r.predicted.simulated_ns == r.baseline.simulated_ns);
  CHECK(r.predicted.built.graph.task_count() == r.baseline.built.graph.task_count());
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.pass == "precision"; });
  REQUIRE(c != r.changes.end());
  CHECK(c->text.find("nothing to change") != std::string::npos);
  o.precision = model::precision::fp16;
  CHECK_THROWS_WITH(whatif::run_whatif(bf16_job(), o), Catch::Contains("only --precision fp8"));
}

TEST_CASE("whatif --precision fp8: memory per GPU with fp8's terms, as predict counts them", "[whatif][precision][memory]") {
  lumos_test::temp_dir dir;
  const double bf16 = predicted_memory(model::precision::bf16), fp8 = predicted_memory(model::precision::fp8);
  REQUIRE(fp8 != bf16);

  SECTION("bf16 traces to fp8") {
    whatif::whatif_options o;
    o.precision = model::precision::fp8;
    const whatif::whatif_result r = whatif::run_whatif(memory_job_traces(model::precision::bf16, dir.path()), o);
    REQUIRE(r.shape);
    const double base = r.shape->baseline.memory_bytes_per_gpu, to = r.shape->predicted.memory_bytes_per_gpu;
    REQUIRE(base > 0);
    // The target within what the baseline's own row allows (the traces' shape against the job's),
    // and fp8's terms (weight copies, scaling state, fp8-saved inputs) as predict's difference.
    const double allowed = std::abs(base - bf16) / bf16 + 1e-3;
    CHECK(std::abs(to - fp8) / fp8 <= allowed);
    CHECK(to - base == Approx(fp8 - bf16).epsilon(0.01));
    // MFU on each side's own peak, as predict counts it: the fp8 prediction against the fp8 peak.
    const model::hardware h100 = model::hardware_preset("h100-sxm");
    const double flops = r.shape->predicted.model_flops_per_rank, t = static_cast<double>(r.predicted.simulated_ns) * 1e-9;
    REQUIRE(flops > 0);
    CHECK(r.shape->mfu_predicted == Approx(flops / (t * h100.peak_flops(model::precision::fp8))).epsilon(1e-9));
    CHECK(r.shape->mfu_baseline ==
          Approx(r.shape->baseline.model_flops_per_rank / (static_cast<double>(r.baseline.simulated_ns) * 1e-9 * h100.peak_flops(model::precision::bf16)))
              .epsilon(1e-9));
  }
  SECTION("fp8 traces: the baseline counts fp8 (whatif has no fp8 to 16-bit rewrite)") {
    const trace::job job = memory_job_traces(model::precision::fp8, dir.path());
    whatif::whatif_options o;
    o.layers = 2;  // the traces' own count: a what-if that changes nothing
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    REQUIRE(r.structure);
    CHECK(r.structure->model.dtype.value.value_or("") == "fp8");
    REQUIRE(r.shape);
    CHECK(std::abs(r.shape->baseline.memory_bytes_per_gpu - fp8) / fp8 < std::abs(r.shape->baseline.memory_bytes_per_gpu - bf16) / bf16);
    // fp8 training cannot move to a GPU without fp8 tensor cores (predict refuses it too); it can
    // to one with them.
    whatif::whatif_options gpu;
    gpu.gpu = "a100-sxm-80gb";
    CHECK_THROWS_WITH(whatif::run_whatif(job, gpu), Catch::Contains("the traces train in fp8") && Catch::Contains("no fp8 tensor cores"));
    CHECK_THROWS(synth::predict([] {
      synth::job j = memory_job(model::precision::fp8);
      j.hardware = model::hardware_preset("a100-sxm-80gb");
      return j;
    }()));
    gpu.gpu = "h200-sxm";
    CHECK(whatif::run_whatif(job, gpu).predicted.simulated_ns < r.baseline.simulated_ns);
  }
}

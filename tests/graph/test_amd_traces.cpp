// The shared AMD MI300X training trace (ROCm: HIP runtime calls, RCCL kernels): read, replayed,
// rewritten for another GPU and calibrated. Expected counts come from an independent parse of the
// file (zlib + the simdjson DOM), not from lumos.
#include "../unit/test_support.hpp"

#include <lumos/model/calibrate.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/runtime_calls.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <cstdlib>
#include <map>
#include <set>

namespace fs = std::filesystem;
using namespace lumos;

namespace {

fs::path mi300x_trace(const fs::path& traces) { return traces / "amd_mi300" / "mi300x_resnet_act_checkpoint.json.gz"; }

// What the file holds, counted without lumos.
struct amd_counts {
  std::size_t kernels = 0, memcpy = 0, memset = 0, rccl_kernels = 0;
  std::map<std::string, std::size_t> runtime;  // HIP call name -> count
  [[nodiscard]] std::size_t calls(const std::string& name) const {
    const auto it = runtime.find(name);
    return it == runtime.end() ? 0 : it->second;
  }
  std::size_t launched_ops = 0;                // GPU ops whose correlation names a HIP runtime call
  std::map<std::string, std::int64_t> step_dur_ns;
  std::string device;
};

amd_counts count_independently(const fs::path& file) {
  const std::string json = lumos_test::gunzip(lumos_test::read_file(file));
  simdjson::dom::parser dom;
  simdjson::dom::element root = dom.parse(json);
  amd_counts c;
  std::string_view device;
  if (root["deviceProperties"].at(0)["name"].get(device) == simdjson::SUCCESS) c.device = std::string(device);
  std::set<std::int64_t> runtime_corr;
  std::vector<std::int64_t> op_corr;
  for (simdjson::dom::element ev : root["traceEvents"].get_array()) {
    std::string_view cat, name;
    if (ev["cat"].get(cat) != simdjson::SUCCESS || ev["name"].get(name) != simdjson::SUCCESS) continue;
    std::int64_t corr = -1;
    if (ev["args"]["correlation"].get(corr) != simdjson::SUCCESS) corr = -1;
    if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      c.kernels += cat == "kernel";
      c.memcpy += cat == "gpu_memcpy";
      c.memset += cat == "gpu_memset";
      c.rccl_kernels += cat == "kernel" && name.starts_with("nccl");
      op_corr.push_back(corr);
    } else if (cat == "cuda_runtime") {
      ++c.runtime[std::string(name)];
      runtime_corr.insert(corr);
    } else if (cat == "user_annotation" && name.starts_with("ProfilerStep#")) {
      double dur = 0;
      REQUIRE(ev["dur"].get(dur) == simdjson::SUCCESS);
      c.step_dur_ns[std::string(name)] = std::llround(dur * 1000.0);
    }
  }
  for (const auto corr : op_corr) c.launched_ops += runtime_corr.count(corr);
  return c;
}

}  // namespace

TEST_CASE("MI300X trace: HIP runtime names are launches, copies, syncs and event waits", "[traces][amd]") {
  using namespace lumos::trace;
  CHECK(is_kernel_launch_call("hipExtModuleLaunchKernel"));
  CHECK(is_kernel_launch_call("hipLaunchKernel"));
  CHECK(is_kernel_launch_call("cudaLaunchKernel"));
  CHECK_FALSE(is_kernel_launch_call("hipStreamIsCapturing"));
  CHECK(is_async_copy_call("hipMemcpyAsync"));
  CHECK(is_async_copy_call("hipMemsetAsync"));
  CHECK(is_copy_call("hipMemcpyAsync"));
  CHECK_FALSE(is_copy_call("hipMemsetAsync"));
  CHECK(is_device_sync_call("hipDeviceSynchronize"));
  CHECK(is_device_sync_call("cudaDeviceSynchronize"));
  CHECK_FALSE(is_device_sync_call("cuDeviceSynchronize"));  // no such driver call
  CHECK(is_stream_sync_call("hipStreamSynchronize"));
  CHECK(is_stream_sync_call("cuStreamSynchronize"));
  CHECK(is_event_sync_call("hipEventSynchronize"));
  CHECK(is_query_call("hipEventQuery"));
  CHECK(is_query_call("cuStreamQuery"));
  CHECK_FALSE(is_query_call("hipStreamQueryX"));
  CHECK(is_event_record_call("hipEventRecord"));
  CHECK(is_event_record_call("cudaEventRecordWithFlags"));
  CHECK(is_stream_wait_event_call("hipStreamWaitEvent"));
  CHECK_FALSE(is_stream_wait_event_call("hipStreamWaitEventX"));
}

TEST_CASE("MI300X trace: read, its GPU ops and RCCL kernels counted, every HIP launch linked to its op", "[traces][amd]") {
  LUMOS_REQUIRE_TRACES(traces);
  const fs::path file = mi300x_trace(traces);
  if (!fs::exists(file)) {
    if (lumos_test::running_in_ci()) FAIL("missing shared trace " << file);
    WARN("missing shared trace " << file << "; skipping");
    return;
  }
  const amd_counts expect = count_independently(file);
  REQUIRE(expect.rccl_kernels > 0);
  REQUIRE(expect.calls("hipExtModuleLaunchKernel") > 0);
  const auto job = trace::load_job({file});
  REQUIRE(job.ranks.size() == 1);
  const auto summary = trace::summarize(job.ranks.front());
  CHECK(summary.device == expect.device);
  CHECK(summary.gpu_ops == expect.kernels + expect.memcpy + expect.memset);
  CHECK(summary.comm_ops == expect.rccl_kernels);
  // The traced GPU is the MI300X preset.
  CHECK(model::preset_of_device(summary.device) == "mi300x");
  CHECK(whatif::source_gpu(job).name == "mi300x");

  const auto built = graph::build_graph(job);
  // Launch edges: one per GPU op whose HIP call (kernel launch, hipMemcpyAsync, hipMemsetAsync) is
  // in the trace.
  CHECK(built.stats.launch_edges == expect.launched_ops);
  // hipStreamWaitEvent orders the RCCL stream after the compute stream; hipDeviceSynchronize waits.
  REQUIRE(expect.calls("hipStreamWaitEvent") > 0);
  CHECK(built.stats.cross_stream_exact + built.stats.cross_stream_inferred > 0);
  CHECK(built.stats.blocking_calls >= expect.calls("hipDeviceSynchronize"));
  CHECK(built.stats.blocking_calls > 0);
}

TEST_CASE("MI300X trace: the replay reproduces the measured ProfilerStep within the replay contract", "[traces][amd][replay]") {
  LUMOS_REQUIRE_TRACES(traces);
  const fs::path file = mi300x_trace(traces);
  if (!fs::exists(file)) {
    if (lumos_test::running_in_ci()) FAIL("missing shared trace " << file);
    return;
  }
  const amd_counts expect = count_independently(file);
  const auto s = report::replay_job(trace::load_job({file}));
  REQUIRE(s.ranks.size() == 1);
  const auto& r = s.ranks.front();
  INFO(r.step);
  REQUIRE(expect.step_dur_ns.count(r.step) == 1);
  // The measured window is the step's annotation and the GPU work it launched (the last gradient
  // all-reduce runs past the annotation's end).
  CHECK(r.measured_ns >= expect.step_dur_ns.at(r.step));
  CHECK(r.error <= 0.01);
  // Identity: GPU op starts within 1 us (FIDELITY.md, replay contract item 1).
  const auto& g = s.built.graph;
  std::size_t ops = 0, within = 0;
  for (graph::task_id k = 0; k < g.task_count(); ++k) {
    if (g.kind[k] != graph::task_kind::gpu_compute && g.kind[k] != graph::task_kind::gpu_comm) continue;
    ++ops;
    within += std::llabs(s.timeline.start_of(s.compiled.position_of(k)) - g.observed_start[k]) <= 1000;
  }
  REQUIRE(ops > 0);
  CHECK(static_cast<double>(within) >= 0.99 * static_cast<double>(ops));
}

TEST_CASE("MI300X trace: whatif --gpu h100-sxm moves GPU time as the presets' figures say and --gpu mi300x is the identity",
          "[traces][amd][whatif]") {
  LUMOS_REQUIRE_TRACES(traces);
  const fs::path file = mi300x_trace(traces);
  if (!fs::exists(file)) {
    if (lumos_test::running_in_ci()) FAIL("missing shared trace " << file);
    return;
  }
  const auto job = trace::load_job({file});
  auto gpu_compute_ns = [](const graph::task_graph& g) {
    time_ns sum = 0;
    for (graph::task_id k = 0; k < g.task_count(); ++k) sum += g.kind[k] == graph::task_kind::gpu_compute ? g.duration[k] : 0;
    return sum;
  };
  whatif::whatif_options same;
  same.gpu = "mi300x";
  const auto id = whatif::run_whatif(job, same);
  CHECK(id.predicted.simulated_ns == id.baseline.simulated_ns);
  CHECK(gpu_compute_ns(id.predicted.built.graph) == gpu_compute_ns(id.baseline.built.graph));

  // H100 SXM has 3.35 of MI300X's 5.3 TB/s: the memory-bound kernels (most of this ResNet's)
  // run longer, so the GPU's compute time grows, by no more than the largest per-class ratio.
  const auto up = whatif::ratios(model::mi300x(), model::h100_sxm());
  REQUIRE(up.memory > 1.0);
  whatif::whatif_options h100;
  h100.gpu = "h100-sxm";
  const auto r = whatif::run_whatif(job, h100);
  const auto before = gpu_compute_ns(r.baseline.built.graph), after = gpu_compute_ns(r.predicted.built.graph);
  CHECK(after > before);
  const double top = std::max({up.memory, up.compute, up.norm, up.attention_forward, up.attention_backward, up.optimizer, up.softmax});
  CHECK(static_cast<double>(after) <= static_cast<double>(before) * top);
  // The step is communication-bound (an 8.6 ms all-reduce overlaps the compute): the step follows
  // the all-reduce, which the H100 preset's NVLink figures make faster.
  REQUIRE(up.allreduce < 1.0);
  CHECK(r.predicted.simulated_ns < r.baseline.simulated_ns);
}

TEST_CASE("MI300X trace: calibrate fits a profile on the mi300x preset, with the HIP launch time", "[traces][amd][calibrate]") {
  LUMOS_REQUIRE_TRACES(traces);
  const fs::path file = mi300x_trace(traces);
  if (!fs::exists(file)) {
    if (lumos_test::running_in_ci()) FAIL("missing shared trace " << file);
    return;
  }
  const amd_counts expect = count_independently(file);
  const auto job = trace::load_job({file});
  const model::calibration c = model::calibrate(job.ranks, file.filename().string());
  CHECK(c.gpu_name == expect.device);
  CHECK(c.profile.hardware == "mi300x");
  CHECK(c.kernels == expect.kernels);
  CHECK(c.launch_ns > 0);  // the median of the hip*LaunchKernel calls
  CHECK(c.profile.cpu_launch_ns == Approx(c.launch_ns));
  CHECK_FALSE(c.collectives.empty());  // RCCL all-reduces with their message sizes
  // The profile is complete: it writes and reads back as itself.
  const auto again = model::profile_from_json(model::to_json(c.profile), model::profile_preset("mi300x"));
  CHECK(model::to_json(again) == model::to_json(c.profile));
#ifdef LUMOS_CLI_PATH
  lumos_test::temp_dir dir;
  const auto out = dir.path() / "mi300x.json";
  const auto cli = lumos_test::run_cli("calibrate " + file.string() + " -o " + out.string());
  CHECK(cli.code == 0);
  CHECK(cli.out.find("AMD Instinct MI300X") != std::string::npos);
  REQUIRE(fs::exists(out));
  CHECK(model::profile_from_json(lumos_test::read_file(out), model::profile_preset("mi300x")).hardware == "mi300x");
#endif
}

#pragma once
// For tests that need the traces of a modelled job: what `lumos synth --detail kernel` writes.

#include <lumos/graph/compile.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/program.hpp>

#include <filesystem>
#include <vector>

namespace lumos_test {

/// The program of `j` with the kernel-level cost model of `profile` (one task per kernel, with
/// notes, the profile's launch and collective host times), simulated and written into `dir` as
/// Kineto traces with the kernel-level decorations. Returns the simulated iteration.
inline lumos::time_ns write_kernel_job(const lumos::synth::job& j, lumos::synth::program_options opt,
                                       const lumos::model::cost_profile& profile, const std::filesystem::path& dir) {
  using namespace lumos;
  opt.notes = true;
  opt.launch_cost = static_cast<time_ns>(profile.cpu_launch_ns);
  opt.collective_cpu = static_cast<time_ns>(profile.cpu_collective_ns);
  const synth::program prog = synth::build_program(j, opt, model::kernel_level{profile}, model::nccl_model{profile});
  const graph::compiled_graph compiled = graph::compile(prog.graph);
  const sim::record_timeline timeline = sim::replay(compiled);
  const report::trace_decorations deco = synth::kernel_trace_decorations(prog, j, static_cast<time_ns>(profile.cpu_launch_ns));
  report::simulated_job sj;
  sj.graph = &prog.graph;
  sj.simulated = report::simulated_times(timeline, compiled);
  sj.world_size = static_cast<int>(prog.world_size);
  sj.device_name = j.hardware.name;
  sj.decorations = &deco;
  std::vector<int> ranks;
  for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  (void)report::write_kineto(sj, ranks, dir);
  return timeline.makespan();
}

}  // namespace lumos_test

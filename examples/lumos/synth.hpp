#pragma once
// lumos synth [predict flags] --out DIR [--gzip] [--unfold]

#include "cli.hpp"
#include "predict.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view synth_usage =
    "usage: lumos synth [the model flags of 'lumos predict'] --out DIR [--gzip] [--unfold] [--json]\n"
    "  Builds one training iteration from the model description (as 'lumos predict' does, one task\n"
    "  per kernel), simulates it, and writes it as Kineto traces: DIR/rank{R}.json (.json.gz with\n"
    "  --gzip), one per distinct rank (one per pipeline stage; every rank with --unfold), with the\n"
    "  rank in distributedInfo. 'lumos inspect' and 'lumos replay' read them; Perfetto opens them.\n"
    "  Replaying them reproduces the prediction.\n";

inline int run_synth(args& a) {
  const auto out_dir = a.option("--out");
  const bool gzip = a.flag("--gzip");
  const bool json = a.flag("--json");
  predict_request req = parse_predict(a);
  if (const auto rest = a.positionals(); !rest.empty()) throw usage_error("unexpected argument '" + rest.front() + "'");
  if (!out_dir) throw usage_error("synth needs --out DIR");

  synth::program_options opt;
  opt.unfold = req.unfold;
  opt.detail = synth::granularity::kernel;
  opt.record_collectives = true;
  apply_profile(req, opt);
  const synth::program prog = req.roofline ? synth::build_program(req.job, opt)
                                           : synth::build_program(req.job, opt, model::kernel_level{req.profile},
                                                                  model::nccl_model{req.profile});
  const graph::compiled_graph compiled = graph::compile(prog.graph);
  sim::replay_engine engine;
  sim::record_timeline timeline;
  const time_ns makespan = engine.run(compiled, timeline);

  report::simulated_job sj;
  sj.graph = &prog.graph;
  sj.simulated = {&timeline.start, &timeline.finish, &compiled};
  sj.world_size = static_cast<int>(prog.world_size);
  sj.device_name = req.job.hardware.name;
  std::vector<int> ranks;
  for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  const auto files = report::write_kineto(sj, ranks, *out_dir, gzip);

  std::string out;
  if (json) {
    json_writer w(out);
    w.begin_object().field("iteration_ns", makespan).field("ranks", ranks.size()).field("tasks", prog.graph.task_count());
    w.key("files").begin_array();
    for (const auto& f : files) w.value(f.string());
    w.end_array().end_object();
    out += '\n';
  } else {
    char line[256];
    std::snprintf(line, sizeof line, "lumos synth: %zu rank%s (%s), %zu tasks, simulated iteration %.3f ms\n", ranks.size(),
                  ranks.size() == 1 ? "" : "s", req.unfold ? "every rank" : "one per pipeline stage, identical ranks folded",
                  prog.graph.task_count(), static_cast<double>(makespan) / 1e6);
    out += line;
    for (const auto& f : files) out += "wrote " + f.string() + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

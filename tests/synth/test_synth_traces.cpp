// lumos synth: a modelled job written as Kineto traces reads back (inspect) and replays to the
// prediction (within 1 %, the bound; in practice exactly).
#include "../unit/test_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/summary.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

using namespace lumos;

namespace {

synth::job small_job(int tp, int pp, int dp, int vp, const char* schedule) {
  synth::job j;
  j.model = model::model_preset("gpt3-15b");
  j.model.layers = 8;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.tp = tp;
  j.parallel.pp = pp;
  j.parallel.dp = dp;
  j.parallel.vp = vp;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = 4 * pp * dp;
  j.parallel.schedule = schedule;
  return j;
}

// A job built, compiled and simulated, ready to write (`sj` points into the other members).
struct simulated_program {
  synth::program prog;
  graph::compiled_graph compiled;
  sim::record_timeline timeline;
  report::simulated_job sj;
  std::vector<int> ranks;

  simulated_program(const synth::job& j, const synth::program_options& opt)
      : prog(synth::build_program(j, opt)), compiled(graph::compile(prog.graph)), timeline(sim::replay(compiled)) {
    sj.graph = &prog.graph;
    sj.simulated = report::simulated_times(timeline, compiled);
    sj.world_size = static_cast<int>(prog.world_size);
    sj.device_name = j.hardware.name;
    for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  }
  simulated_program(const simulated_program&) = delete;
  simulated_program& operator=(const simulated_program&) = delete;
};

}  // namespace

TEST_CASE("synthesised traces replay to the prediction", "[synth][roundtrip]") {
  struct config {
    int tp, pp, dp, vp;
    const char* schedule;
    bool unfold;
  };
  for (const config c : {config{2, 2, 2, 1, "1f1b", false}, config{2, 2, 2, 1, "1f1b", true}, config{1, 4, 1, 2, "interleaved", false},
                         config{2, 2, 1, 1, "zb-h1", false}, config{1, 2, 2, 1, "gpipe", true}}) {
    INFO(c.schedule << " tp" << c.tp << " pp" << c.pp << " dp" << c.dp << " vp" << c.vp << (c.unfold ? " unfolded" : ""));
    const synth::job j = small_job(c.tp, c.pp, c.dp, c.vp, c.schedule);
    synth::predict_options po;
    po.program.unfold = c.unfold;
    const time_ns predicted = synth::predict(j, po).iteration_ns;

    synth::program_options opt;
    opt.unfold = c.unfold;
    const simulated_program sp(j, opt);
    const synth::program& prog = sp.prog;
    lumos_test::temp_dir dir;
    const auto files = report::write_kineto(sp.sj, sp.ranks, dir.path(), c.unfold);
    REQUIRE(files.size() == prog.ranks.size());

    const trace::job read = trace::load_job({dir.path()});
    REQUIRE(read.ranks.size() == prog.ranks.size());
    for (const auto& r : read.ranks) {
      CHECK(r.world_size == static_cast<int>(prog.world_size));
      CHECK(trace::profiler_steps(r).size() == 1);
      CHECK(trace::summarize(r).gpu_ops > 0);
    }
    const auto replay = report::replay_job(read);
    CHECK(replay.built.stats.cross_stream_unresolved == 0);
    CHECK(replay.built.stats.ops_without_launch == 0);
    const double error = report::relative_error(replay.simulated_ns, predicted);
    CHECK(error <= 0.01);
    CHECK(replay.simulated_ns == predicted);
  }
}

TEST_CASE("written traces do not depend on the writer's thread count", "[synth][roundtrip]") {
  synth::program_options opt;
  opt.unfold = true;
  const simulated_program sp(small_job(2, 2, 2, 1, "1f1b"), opt);
  const report::simulated_job& sj = sp.sj;
  const std::vector<int>& ranks = sp.ranks;
  REQUIRE(ranks.size() == 8);
  auto read_all = [](const std::vector<std::filesystem::path>& files) {
    std::vector<std::string> texts;
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      texts.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return texts;
  };
  for (const bool gzip : {false, true}) {
    INFO((gzip ? "gzip" : "plain"));
    lumos_test::temp_dir one, three;
    const auto a = read_all(report::write_kineto(sj, ranks, one.path(), gzip, 1));
    const auto b = read_all(report::write_kineto(sj, ranks, three.path(), gzip, 3));
    CHECK(a == b);
    if (!gzip) {
      // Indexing all ranks at once writes what indexing each rank alone writes.
      for (std::size_t i = 0; i < ranks.size(); ++i) CHECK(a[i] == report::kineto_json(sj, ranks[i]));
    }
    // Compressed files read back to the same job as plain ones.
    const trace::job read = trace::load_job({one.path()});
    CHECK(read.ranks.size() == ranks.size());
  }
}

TEST_CASE("a written host wait is a synchronize call, and moves with the GPU work when read back", "[synth][roundtrip]") {
  // Megatron's p2p sync and fp16's found-inf read: the launching thread waits for the GPU. Written
  // as an idle gap before a zero-length call, a replay of the traces would keep each wait as
  // measured, and a faster GPU would leave the host waiting as long as before.
  synth::job j = small_job(1, 2, 1, 1, "1f1b");
  j.parallel.dtype = model::precision::fp16;
  synth::program_options opt;
  opt.p2p_host_sync = true;
  opt.loss_scale_host_sync = true;
  const simulated_program sp(j, opt);
  lumos_test::temp_dir dir;
  (void)report::write_kineto(sp.sj, sp.ranks, dir.path(), false);
  const trace::job read = trace::load_job({dir.path()});

  // Every host wait is a synchronize call lasting from the thread's previous task to the wait's
  // end, with the cuda_sync row that names what it waited for.
  std::size_t calls = 0, waited = 0, rows = 0;
  for (const auto& r : read.ranks) {
    for (const auto& e : r.events) {
      const std::string_view name = r.name(e);
      if (e.cat == trace::category::cuda_runtime && name.find("Synchronize") != std::string_view::npos) {
        ++calls;
        waited += e.dur > 0 ? 1 : 0;
      }
      rows += e.cat == trace::category::cuda_sync && name.find("Synchronize") != std::string_view::npos ? 1 : 0;
      CHECK(name != "host_sync");
    }
  }
  CHECK(calls > 0);
  CHECK(waited > 0);
  CHECK(rows == calls);

  // Read back, the waits follow the GPU: the replay under compute=F is the model's own graph
  // under compute=F (which the traces did not see), at F = 1 and at F = 0.5.
  for (const double f : {1.0, 0.5}) {
    INFO("compute=" << f);
    const graph::scales s{.compute = f};
    const time_ns truth = sim::replay(graph::compile(sp.prog.graph, s)).makespan();
    report::replay_options ro;
    ro.scales = s;
    const auto replay = report::replay_job(read, ro);
    CHECK(replay.built.stats.blocking_calls > 0);
    UNSCOPED_INFO("replay " << replay.simulated_ns << " truth " << truth);
    CHECK(report::relative_error(replay.simulated_ns, truth) <= 0.005);
  }
}

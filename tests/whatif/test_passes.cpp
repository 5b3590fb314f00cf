// The what-if as rewrite passes over one context (include/lumos/whatif/whatif.hpp, context.hpp):
// a rewrite type written outside the library runs through the C++ API like a shipped one, sees
// what the passes before it decided, and reports a structured change.
#include "../unit/test_support.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

using namespace lumos;

namespace {

const trace::job& base_job() {
  static const trace::job job = trace::load_job({std::filesystem::path(LUMOS_TEST_DATA_DIR) / "gpu" / "h100-base"});
  return job;
}

// A user's rewrite: every GEMM kernel `factor` times as fast, reported with its GPU time.
struct faster_gemms {
  double factor = 2.0;
  bool saw_target_layers = false;

  [[nodiscard]] bool wanted(const whatif::context&) const noexcept { return factor != 1.0; }
  [[nodiscard]] whatif::change_list apply(whatif::context& ctx, graph::built_job& b) {
    // What the shipped passes before it decided is in the context.
    saw_target_layers = ctx.options.layers.has_value() && ctx.layer_copies.has_value();
    graph::task_graph& g = b.graph;
    time_ns before = 0, after = 0;
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      if (g.kind[t] != graph::task_kind::gpu_compute || whatif::classify(g.kind[t], g.task_name(t)) != whatif::op_bound::compute) continue;
      before += g.duration[t];
      g.duration[t] = static_cast<time_ns>(static_cast<double>(g.duration[t]) / factor);
      after += g.duration[t];
    }
    return {whatif::changed("faster gemms", "GEMM speed", "x1", "x2", "GEMMs twice as fast",
                            {whatif::time_figure("GEMM time", before, after)})};
  }
};
static_assert(whatif::Rewrite<faster_gemms>);

// Not a rewrite: no apply.
struct not_a_rewrite {
  [[nodiscard]] bool wanted(const whatif::context&) const { return true; }
};
static_assert(!whatif::Rewrite<not_a_rewrite>);

}  // namespace

TEST_CASE("a user's rewrite type runs after the shipped passes and reports its change", "[whatif][passes]") {
  const trace::job& job = base_job();
  whatif::whatif_options o;
  const whatif::whatif_result plain = whatif::run_whatif(job, o);
  // Nothing asked: the prediction is the baseline's replay, and no pass changed anything.
  CHECK(plain.predicted.simulated_ns == plain.baseline.simulated_ns);
  CHECK(plain.changes.empty());

  const whatif::whatif_result r = whatif::run_whatif(job, o, faster_gemms{});
  CHECK(r.predicted.simulated_ns < r.baseline.simulated_ns);
  REQUIRE(r.changes.size() == 1);
  const whatif::change& c = r.changes.front();
  CHECK(c.pass == "faster gemms");
  CHECK(c.headline() == "GEMM speed x1 -> x2");
  REQUIRE(c.figures.size() == 1);
  CHECK(c.figures[0].after < c.figures[0].before);
  CHECK(c.figures[0].after == Approx(c.figures[0].before / 2).epsilon(1e-3));

  // Not wanted: the prediction is untouched and nothing is reported.
  const whatif::whatif_result same = whatif::run_whatif(job, o, faster_gemms{1.0});
  CHECK(same.predicted.simulated_ns == same.baseline.simulated_ns);
  CHECK(same.changes.empty());
}

TEST_CASE("passes run in their documented order over one context", "[whatif][passes]") {
  const trace::job& job = base_job();
  whatif::whatif_options o;
  o.layers = 16;
  // The layer pass ran before the user's: its copies are in the context, and its change comes first.
  faster_gemms user;
  const whatif::whatif_result r =
      whatif::run_passes(job, o, std::tuple_cat(whatif::shipped_passes{}, std::tuple<faster_gemms&>{user}));
  CHECK(user.saw_target_layers);
  REQUIRE(r.changes.size() >= 2);
  const auto layers = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& c) { return c.subject == "layers"; });
  REQUIRE(layers != r.changes.end());
  CHECK(layers->from == "8");
  CHECK(layers->to == "16");
  CHECK(r.changes.back().pass == "faster gemms");
  // Only the user's pass, without the shipped ones: the layers stay as traced.
  const whatif::whatif_result alone = whatif::run_passes(job, o, std::tuple<faster_gemms>{});
  CHECK(alone.changes.size() == 1);
  CHECK(alone.predicted.simulated_ns < alone.baseline.simulated_ns);
  const whatif::whatif_result both = whatif::run_whatif(job, o, faster_gemms{});
  CHECK(both.predicted.simulated_ns > alone.predicted.simulated_ns);
}

TEST_CASE("the context resolves the traced hardware once and refuses --gpu without a preset", "[whatif][passes]") {
  const trace::job& job = base_job();
  whatif::whatif_options o;
  o.gpu = "h200-sxm";
  const whatif::context ctx(job, o);
  REQUIRE(ctx.traced_gpu);
  CHECK(ctx.traced_gpu->name == "h100-sxm");
  REQUIRE(ctx.target_gpu);
  CHECK(ctx.target_gpu->name == "h200-sxm");
  CHECK(ctx.nccl);
  CHECK(ctx.comm_hw.name == "h100-sxm");

  trace::job unnamed = job;
  for (auto& r : unnamed.ranks) r.devices.clear();
  CHECK_THROWS_WITH(whatif::context(unnamed, o), Catch::Contains("has no hardware preset"));
  o.from_gpu = "h100-sxm";
  const whatif::context named(unnamed, o);
  CHECK(named.traced_gpu->name == "h100-sxm");
}

#ifdef LUMOS_CLI_PATH
TEST_CASE("whatif --layers and --pp from traces of one layer per stage: in the graph and as synth of the target has it", "[whatif][passes]") {
  // Each stage's backward layer lies between its head's and its embedding's backward, so the
  // stages split and the layers repeat in the graph, not by the pass-level model.
  lumos_test::temp_dir dir;
  const auto synth = [&](const std::string& flags) {
    const auto p = dir.path() / std::to_string(std::hash<std::string>{}(flags));
    const auto made = lumos_test::run_cli("synth --model llama3-8b --seq 1024 --global-batch 8 --gpu h100-sxm --detail kernel " + flags +
                                          " --out " + p.string());
    REQUIRE(made.code == 0);
    return p;
  };
  const trace::job job = trace::load_job({synth("--layers 2 --pp 2")});
  for (const auto& [change, target] : {std::pair{std::string("--layers 4"), std::string("--layers 4 --pp 2")},
                                       std::pair{std::string("--layers 4 --pp 4"), std::string("--layers 4 --pp 4")}}) {
    INFO(change);
    whatif::whatif_options o;
    o.layers = 4;
    if (change.find("--pp 4") != std::string::npos) o.pp = 4;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    for (const whatif::change& c : r.changes) CHECK(c.text.find("pass-level") == std::string::npos);
    const whatif::whatif_result direct = whatif::run_whatif(trace::load_job({synth(target)}), whatif::whatif_options{});
    CHECK(std::abs(double(r.predicted.simulated_ns) / double(direct.baseline.simulated_ns) - 1.0) < 0.01);
  }
}
#endif

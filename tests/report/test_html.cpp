// The HTML report: what it shows for a real job, how it escapes, and that it stays small for
// jobs with many ranks (identical ranks grouped, lanes binned per pixel).

#include <catch2/catch.hpp>

#include <lumos/graph/compile.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/program.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <unistd.h>

namespace {

std::size_t count(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The text between the opening tag that contains `start` and the next `</svg>`.
std::string svg_after(const std::string& page, const std::string& start) {
  const auto b = page.find(start);
  if (b == std::string::npos) return {};
  return page.substr(b, page.find("</svg>", b) - b);
}

std::filesystem::path example_job() { return std::filesystem::path(LUMOS_SOURCE_DIR) / "examples" / "data" / "tiny_job"; }

}  // namespace

TEST_CASE("report of the example job: summary, one bar row per rank, one lane per busy stream", "[report]") {
  const auto job = lumos::trace::load_job({example_job()});
  const auto s = lumos::report::replay_job(job);
  lumos::report::html_options opt;
  opt.title = "tiny <job> & co";
  const std::string page = lumos::report::html_report(job, s, opt);

  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("tiny &lt;job&gt; &amp; co") != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);  // self-contained, nothing runs
  CHECK(page.find("http://") == std::string::npos);
  CHECK(page.find("https://") == std::string::npos);
  CHECK(page.find(lumos::report::detail::html::ms(s.simulated_ns)) != std::string::npos);
  CHECK(count(svg_after(page, "id=\"iteration-bars\""), "class=\"rank-row\"") == job.ranks.size());
  CHECK(count(svg_after(page, "id=\"breakdown-bars\""), "class=\"rank-row\"") == job.ranks.size());

  const auto& g = s.built.graph;
  const auto sim = s.simulated_times();
  for (const auto& r : s.ranks) {
    // Streams of the rank with work inside its simulated window.
    std::set<lumos::graph::processor_id> busy;
    for (lumos::graph::task_id t = 0; t < g.task_count(); ++t) {
      const auto& p = g.processors[g.processor[t]];
      if (g.rank[t] != r.rank || p.kind != lumos::graph::processor_kind::gpu_stream) continue;
      if (std::min(sim.end_of(t), r.simulated.window.end) > std::max(sim.begin_of(t), r.simulated.window.begin)) busy.insert(g.processor[t]);
    }
    const std::string timeline = svg_after(page, "class=\"timeline\" data-rank=\"" + std::to_string(r.rank) + "\"");
    REQUIRE_FALSE(timeline.empty());
    CHECK(count(timeline, "gpu-lane") == busy.size());
    CHECK(count(timeline, "class=\"compute") > 0);
  }
  // The slowest rank's critical path is drawn and tabled.
  CHECK(count(page, "class=\"crit\"") > 0);
  CHECK(page.find("id=\"critical-path\"") != std::string::npos);
  CHECK(page.find("id=\"pipeline\"") == std::string::npos);  // data parallel only
}

TEST_CASE("report helpers: rank ranges and grouping of alike ranks", "[report]") {
  using lumos::report::detail::html::rank_ranges;
  CHECK(rank_ranges({0, 1, 2, 3, 8, 10, 11}) == "0-3, 8, 10, 11");
  CHECK(rank_ranges({5}) == "5");
  lumos::report::replay_session s;
  for (int r = 0; r < 4; ++r) {
    lumos::report::rank_replay rr;
    rr.rank = r;
    rr.measured_ns = rr.simulated_ns = r == 2 ? 2'000'000 : 1'000'000;
    s.ranks.push_back(rr);
  }
  const auto groups = lumos::report::group_ranks(s, 1000);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].ranks == std::vector<int>{0, 1, 3});
  CHECK(groups[1].ranks == std::vector<int>{2});
}

TEST_CASE("report of a 32-rank pipeline job stays small and draws the stage diagram", "[report]") {
  // A job made by the model (as `lumos synth --unfold` makes it), written as traces and read back.
  lumos::synth::job j;
  j.model = lumos::model::model_preset("gpt3-15b");
  j.model.layers = 4;
  j.parallel.tp = 2;
  j.parallel.pp = 4;
  j.parallel.dp = 4;
  j.parallel.global_batch = 32;
  j.hardware = lumos::model::hardware_preset("h100-sxm");
  lumos::synth::program_options po;
  po.unfold = true;
  po.detail = lumos::synth::granularity::kernel;
  po.record_collectives = true;
  const auto prog = lumos::synth::build_program(j, po);
  const auto compiled = lumos::graph::compile(prog.graph);
  lumos::sim::replay_engine engine;
  lumos::sim::record_timeline timeline;
  (void)engine.run(compiled, timeline);
  lumos::report::simulated_job sj;
  sj.graph = &prog.graph;
  sj.simulated = lumos::report::simulated_times(timeline, compiled);
  sj.world_size = static_cast<int>(prog.world_size);
  sj.device_name = j.hardware.name;
  std::vector<int> ranks;
  for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  REQUIRE(ranks.size() == 32);
  const auto dir = std::filesystem::temp_directory_path() / ("lumos-report-test-" + std::to_string(::getpid()));
  (void)lumos::report::write_kineto(sj, ranks, dir);

  const auto job = lumos::trace::load_job({dir});
  const auto s = lumos::report::replay_job(job);
  const std::string page = lumos::report::html_report(job, s);
  std::filesystem::remove_all(dir);

  INFO("bytes: " << page.size());
  CHECK(page.size() < 600'000);
  const auto groups = lumos::report::group_ranks(s, std::max<lumos::time_ns>(1000, s.simulated_ns / 1000));
  CHECK(groups.size() < s.ranks.size());  // alike data-parallel and tensor-parallel peers share a row
  CHECK(count(svg_after(page, "id=\"iteration-bars\""), "class=\"rank-row\"") == groups.size());
  CHECK(count(page, "class=\"timeline\"") <= lumos::report::html_options{}.max_timeline_ranks);
  REQUIRE(page.find("id=\"pipeline\"") != std::string::npos);
  CHECK(count(page, "class=\"stage\"") == 4);
  // Every stage runs one forward and one backward per micro-batch (8 per pipeline here).
  const std::string diagram = svg_after(page, "class=\"pipeline\"");
  CHECK(count(diagram, "class=\"pf\"") >= 4 * 8);
  CHECK(count(diagram, "class=\"pb\"") >= 4 * 8);
}

// `--pipeline-layout` (Megatron's --pipeline-model-parallel-layout) through predict, synth, sweep
// and whatif: the even split's layout predicts what the even split does, an uneven one puts its
// layers on the ranks it names, and predict and synth agree on it.
#ifdef LUMOS_CLI_PATH

#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace layout_cli {

using result = lumos_test::cli_result;

result run(const std::string& args) { return lumos_test::run_cli(args); }

std::int64_t iteration_ns(const std::string& args) {
  const result r = run("predict " + args + " --json");
  INFO(args << "\n" << r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser p;
  return int64_t(p.parse(r.out)["iteration_ns"]);
}

// Occurrences of `needle` in `hay`.
std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

}  // namespace layout_cli

TEST_CASE("predict --pipeline-layout of the even split predicts the even split", "[cli][synth][layout]") {
  using layout_cli::iteration_ns;
  const std::string job = "--model llama3-8b --layers 8 --seq 1024 --pp 2 --vp 2 --global-batch 8";
  CHECK(iteration_ns(job + " --pipeline-layout 'Et*2|t*2|t*2|t*2L'") == iteration_ns(job));
  // Megatron's split with the embedding and the loss counted as layers: 6 + 2 over 4 virtual stages.
  const std::string six = "--model llama3-8b --layers 6 --seq 1024 --pp 2 --vp 2 --global-batch 8";
  CHECK(iteration_ns(six + " --pipeline-layout 'Et|t*2|t*2|tL'") == iteration_ns(six));
  // Megatron's first/last-stage flags give the same split: 6 + 2 over 4 stages.
  const std::string four = "--model llama3-8b --layers 6 --seq 1024 --pp 4 --global-batch 8";
  CHECK(iteration_ns(four + " --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1") == iteration_ns(four));
  const layout_cli::result r = layout_cli::run("predict " + six + " --pipeline-layout '(Et|t*2|)t*2|tL' --json");
  REQUIRE(r.code == 0);
  simdjson::dom::parser p;
  std::vector<std::int64_t> blocks;
  for (const auto n : p.parse(r.out)["job"]["pipeline_layout"].get_array()) blocks.push_back(int64_t(n));
  CHECK(blocks == std::vector<std::int64_t>{1, 2, 2, 1});
}

TEST_CASE("predict --pipeline-layout: each stage's busy time follows its layers", "[cli][synth][layout]") {
  const std::string job = "predict --model llama3-8b --layers 8 --seq 1024 --pp 4 --global-batch 16 --json";
  // [stage] -> pipeline busy time, and the iteration.
  auto busy = [&](const std::string& layout, std::int64_t& iteration) {
    const layout_cli::result r = layout_cli::run(job + (layout.empty() ? "" : " --pipeline-layout '" + layout + "'"));
    INFO(layout << "\n" << r.err);
    REQUIRE(r.code == 0);
    simdjson::dom::parser p;
    const simdjson::dom::element doc = p.parse(r.out);
    iteration = int64_t(doc["iteration_ns"]);
    std::vector<double> out;
    for (const auto st : doc["stages"].get_array()) out.push_back(static_cast<double>(int64_t(st["pipeline_busy_ns"])));
    return out;
  };
  std::int64_t even_ns = 0, light_ns = 0, heavy_last_ns = 0, heavy_first_ns = 0;
  const std::vector<double> even = busy("", even_ns);
  const std::vector<double> heavy_first = busy("Et*5|t|t|tL", heavy_first_ns);
  REQUIRE(even.size() == 4);
  REQUIRE(heavy_first.size() == 4);
  // A middle stage (no embedding, no loss) with 1 layer instead of 2 is busy half as long.
  CHECK(heavy_first[1] == Approx(even[1] / 2).epsilon(0.01));
  CHECK(heavy_first[2] == Approx(even[2] / 2).epsilon(0.01));
  CHECK(heavy_first[0] > 2 * even[0]);  // 5 layers and the embedding against 2 and the embedding
  // Llama 3's 128k-token logits make the loss's stage the slowest of the even split: one layer
  // more there slows the iteration, one layer moved off it (Megatron's lighter last stage) speeds it up.
  REQUIRE(even[3] > even[0]);
  (void)busy("Et|t*2|t*2|t*3L", heavy_last_ns);
  (void)busy("Et*3|t*2|t*2|tL", light_ns);
  CHECK(heavy_last_ns > even_ns);
  CHECK(light_ns < even_ns);
}

TEST_CASE("synth --pipeline-layout puts the layout's layers on each rank and agrees with predict", "[cli][synth][layout]") {
  // 7 layers over 4 stages: no even split, Megatron's layout places them 3, 2, 1, 1.
  const std::string job = "--model llama3-8b --layers 7 --seq 1024 --pp 4 --global-batch 8 --pipeline-layout 'Et*3|t*2|t|tL'";
  lumos_test::temp_dir dir;
  const layout_cli::result s = layout_cli::run("synth " + job + " --detail kernel --out " + dir.path().string() + " --json");
  INFO(s.err);
  REQUIRE(s.code == 0);
  const std::vector<std::size_t> layers{3, 2, 1, 1};
  const std::size_t micro_batches = 8;
  for (std::size_t rank = 0; rank < layers.size(); ++rank) {
    INFO("rank " << rank);
    const std::string trace = lumos_test::read_file(dir.path() / ("rank" + std::to_string(rank) + ".json"));
    // One ParallelTransformerLayer forward scope per layer and micro-batch.
    CHECK(layout_cli::count(trace, "\"name\":\"ParallelTransformerLayer\"") == layers[rank] * micro_batches);
  }
  const layout_cli::result replay = layout_cli::run("replay " + dir.path().string() + " --json");
  REQUIRE(replay.code == 0);
  simdjson::dom::parser a, b;
  const int64_t synthesised = int64_t(a.parse(s.out)["iteration_ns"]);
  CHECK(int64_t(b.parse(replay.out)["job"]["simulated_ns"]) == synthesised);
  CHECK(layout_cli::iteration_ns(job) == synthesised);
}

TEST_CASE("predict and whatif: bad pipeline layouts are one-line errors with exit code 2", "[cli][synth][layout]") {
  const std::string job = "predict --model llama3-8b --layers 8 --seq 1024 --pp 2 --vp 2 --global-batch 8";
  for (const std::string bad : {" --pipeline-layout 'Et*3|tL'",          // 2 virtual stages, pp x vp is 4
                                " --pipeline-layout 'Et*2|t*2|t*2|t*3L'",  // 9 layers
                                " --pipeline-layout 'Et*2|t*2|t*2|t*2'",   // no loss
                                " --pipeline-layout 'Et*2|(t*2|t*2|t*2L'",  // unclosed group
                                " --pipeline-layout 'Et*2|t*2|t*2|t*2L' --decoder-first-pipeline-num-layers 2",
                                " --decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 2"}) {
    INFO(bad);
    const layout_cli::result r = layout_cli::run(job + bad);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  const layout_cli::result whatif = layout_cli::run("whatif nowhere --pipeline-layout 'EtL'");
  CHECK(whatif.code == 2);
  CHECK(whatif.err.find("unknown option --pipeline-layout") != std::string::npos);  // not from traces
  const layout_cli::result sweep = layout_cli::run("sweep --gpus 4 --model llama3-8b --decoder-first-pipeline-num-layers 2");
  CHECK(sweep.code == 2);
  CHECK(sweep.err.find("not --decoder-first/last-pipeline-num-layers") != std::string::npos);
}

TEST_CASE("sweep --pipeline-layout applies to the configurations of its virtual stages", "[cli][sweep][layout]") {
  // 7 layers: only pp x vp = 2 through the layout; pp 1 splits evenly, pp 4 is rejected.
  const layout_cli::result r = layout_cli::run(
      "sweep --gpus 4 --model llama3-8b --layers 7 --seq 1024 --tp 1 --pp 1,2,4 --micro-batch 1 --recompute none --sp off "
      "--global-batch 16 --pipeline-layout 'Et*4|t*3L' --json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser p;
  const simdjson::dom::element doc = p.parse(r.out);
  std::vector<std::int64_t> pps;
  for (const auto c : doc["results"].get_array()) {
    if (std::string_view(c["status"]) == "ok") pps.push_back(int64_t(c["pp"]));
  }
  std::sort(pps.begin(), pps.end());
  CHECK(pps == std::vector<std::int64_t>{1, 2});
  // The pp 2 configuration predicts what predict does with the layout.
  const layout_cli::result one = layout_cli::run(
      "sweep --gpus 2 --model llama3-8b --layers 7 --seq 1024 --tp 1 --pp 2 --micro-batch 1 --recompute none --sp off "
      "--global-batch 16 --pipeline-layout 'Et*4|t*3L' --json");
  REQUIRE(one.code == 0);
  simdjson::dom::parser q;
  const auto best = q.parse(one.out)["results"].at(0);
  CHECK(int64_t(best["iteration_ns"]) ==
        layout_cli::iteration_ns("--model llama3-8b --layers 7 --seq 1024 --pp 2 --global-batch 16 --pipeline-layout 'Et*4|t*3L'"));
}

#endif  // LUMOS_CLI_PATH

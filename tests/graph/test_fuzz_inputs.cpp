// The graph-builder fuzzer's seeds and the inputs it once failed on (tests/data/fuzz-regressions/
// graph/), replayed in the ordinary suite: each job either builds and replays consistently or is
// rejected with lumos::error, never a crash.
#include "../fuzz/job_generator.hpp"
#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace {

std::vector<std::filesystem::path> inputs_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("graph fuzzer inputs build and replay or are rejected", "[graph][fuzz]") {
  std::vector<std::filesystem::path> files = inputs_in(std::filesystem::path(LUMOS_SOURCE_DIR) / "tests/fuzz/seeds-graph");
  const auto regressions = inputs_in(lumos_test::data_dir() / "fuzz-regressions" / "graph");
  files.insert(files.end(), regressions.begin(), regressions.end());
  REQUIRE(files.size() >= 3);
  std::size_t built = 0;
  for (const auto& f : files) {
    INFO(f.filename().string());
    try {
      const auto s = lumos_fuzz::build_and_replay(lumos_test::read_file(f));
      ++built;
      REQUIRE(s.compiled.size() == s.built.graph.task_count());
      for (std::uint32_t i = 0; i < s.timeline.size(); ++i) {
        CHECK(s.timeline.finish_of(lumos::graph::position{i}) >= s.timeline.start_of(lumos::graph::position{i}));
      }
      CHECK(s.ranks.size() == s.built.ranks.size());
    } catch (const lumos::error& e) {
      CHECK(std::string(e.what()).size() > 10);  // an error that says something
    }
  }
  CHECK(built >= 2);  // the seeds that are meant to build do
}

TEST_CASE("a kernel that starts before its launch and is waited on makes a cycle the builder reports", "[graph][fuzz]") {
  const auto bytes = lumos_test::read_file(std::filesystem::path(LUMOS_SOURCE_DIR) / "tests/fuzz/seeds-graph/cycle-kernel-before-launch");
  CHECK_THROWS_WITH(lumos_fuzz::build_and_replay(bytes), Catch::Contains("the execution graph has a cycle") && Catch::Contains("gemm"));
}

TEST_CASE("ranks that agree on their collectives are joined, four allreduces on two ranks", "[graph][fuzz]") {
  const auto bytes = lumos_test::read_file(std::filesystem::path(LUMOS_SOURCE_DIR) / "tests/fuzz/seeds-graph/two-ranks-matched-allreduce");
  const auto s = lumos_fuzz::build_and_replay(bytes);
  CHECK(s.built.stats.collectives_matched == 4);
  CHECK(s.built.stats.collectives_unmatched == 0);
  REQUIRE(s.built.graph.collectives.size() == 4);
  for (const auto& c : s.built.graph.collectives) CHECK(c.arrive.size() == 2);
}

#include <lumos/core/parallel.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

TEST_CASE("parallel_for visits every index once, each thread reusing its own scratch", "[parallel][threads]") {
  for (const unsigned threads : {1U, 2U, 3U, 8U}) {
    std::vector<int> visits(1000, 0);
    std::atomic<int> states{0};
    struct scratch {
      std::vector<std::size_t> seen;
    };
    lumos::parallel_for(
        visits.size(), threads,
        [&] {
          ++states;
          return scratch{};
        },
        [&](scratch& s, std::size_t i) {
          s.seen.push_back(i);
          // Indices come in increasing order on each thread: its scratch is not shared.
          if (s.seen.size() > 1) CHECK(s.seen[s.seen.size() - 2] < i);
          ++visits[i];
        });
    for (const int v : visits) REQUIRE(v == 1);
    CHECK(states.load() >= 1);
    CHECK(states.load() <= static_cast<int>(threads));
  }
}

TEST_CASE("parallel_for rethrows the lowest failing index, as one thread would, for any thread count", "[parallel][threads]") {
  for (const unsigned threads : {1U, 2U, 3U, 8U}) {
    for (int repeat = 0; repeat < 20; ++repeat) {
      std::vector<std::atomic<int>> done(200);
      try {
        lumos::parallel_for(done.size(), threads, [&](std::size_t i) {
          if (i == 37 || i == 38 || i == 150) throw std::runtime_error("index " + std::to_string(i));
          ++done[i];
        });
        FAIL("no exception");
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == "index 37");
      }
      // Every index below the first failure ran (the failure a sequential loop reports comes
      // after them); the rest may or may not have.
      for (std::size_t i = 0; i < 37; ++i) REQUIRE(done[i].load() == 1);
    }
  }
}

TEST_CASE("parallel_for over nothing calls nothing", "[parallel]") {
  int calls = 0;
  lumos::parallel_for(0, 4, [&](std::size_t) { ++calls; });
  CHECK(calls == 0);
}

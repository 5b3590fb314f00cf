// sort_runs (core/sort.hpp): the same order as std::stable_sort on every shape of input it
// meets (sorted, a few runs, a late element, many short runs, reversed, empty, one element).
#include <lumos/core/sort.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

TEST_CASE("sort_runs sorts stably, whatever the runs", "[core][sort]") {
  using item = std::pair<int, int>;  // key, original position: stability is visible
  const auto by_key = [](const item& a, const item& b) { return a.first < b.first; };
  std::mt19937 rng(7);
  auto check = [&](std::vector<int> keys) {
    std::vector<item> v;
    for (std::size_t i = 0; i < keys.size(); ++i) v.emplace_back(keys[i], static_cast<int>(i));
    std::vector<item> want = v;
    std::stable_sort(want.begin(), want.end(), by_key);
    lumos::sort_runs(v.begin(), v.end(), by_key);
    CHECK(v == want);
  };
  check({});
  check({5});
  std::vector<int> sorted(1000);
  for (int i = 0; i < 1000; ++i) sorted[static_cast<std::size_t>(i)] = i / 3;  // ties
  check(sorted);
  auto late = sorted;
  late.push_back(-1);  // a step annotation written after its events
  check(late);
  for (int runs : {2, 3, 5, 8, 17}) {
    std::vector<int> v;
    for (int r = 0; r < runs; ++r) {
      std::vector<int> run(1 + rng() % 300);
      for (auto& x : run) x = static_cast<int>(rng() % 500);
      std::sort(run.begin(), run.end());
      v.insert(v.end(), run.begin(), run.end());
    }
    check(v);
  }
  std::vector<int> random(5000);
  for (auto& x : random) x = static_cast<int>(rng() % 100);
  check(random);
  std::vector<int> reversed(2000);
  for (int i = 0; i < 2000; ++i) reversed[static_cast<std::size_t>(i)] = 2000 - i;
  check(reversed);
}

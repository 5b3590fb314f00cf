// The autotuner example (examples/autotune) finds the exhaustive sweep's optimum on a small
// space within a memory budget, evaluating fewer configurations.
#include "autotune/autotune.hpp"

#include <lumos/model/profile.hpp>

#include <catch2/catch.hpp>

namespace lm = lumos::model;
namespace sw = lumos::sweep;

TEST_CASE("the hill-climbing autotuner finds the exhaustive optimum within a memory budget", "[sweep][autotune]") {
  sw::problem p;
  p.model = lm::llama3_8b();
  p.gpus = 32;
  p.global_batch = 128;
  sw::space s;
  s.tp = {1, 2, 4, 8};
  s.pp = {1, 2, 4, 8};
  s.micro_batch = {1, 2, 4};
  s.recompute = {lm::recompute_kind::none, lm::recompute_kind::selective, lm::recompute_kind::full};
  s.sp = {false, true};
  // A budget that rejects part of the space: the median memory of the valid configurations.
  const auto all_fit = sw::run(sw::make_evaluator(p, lm::profile_preset("h100-sxm")), sw::enumerate(s, p.gpus), {.simulate = false});
  std::vector<double> mem;
  for (const auto& r : all_fit) {
    if (r.ok()) mem.push_back(r.memory_bytes);
  }
  REQUIRE(mem.size() > 10);
  std::nth_element(mem.begin(), mem.begin() + static_cast<std::ptrdiff_t>(mem.size() / 2), mem.end());
  p.memory_margin = 1.0 - mem[mem.size() / 2] / static_cast<double>(p.hardware.gpu.hbm_capacity);
  const auto ev = sw::make_evaluator(p, lm::profile_preset("h100-sxm"));

  const auto configs = sw::enumerate(s, p.gpus);
  const auto exhaustive = sw::run(ev, configs, {.threads = 2});
  const auto best = sw::top(exhaustive, 1);
  REQUIRE(best.size() == 1);
  CHECK(sw::count_reasons(exhaustive)[static_cast<std::size_t>(sw::rejection::memory)] > 0);

  const auto found = lumos_autotune::hill_climb(ev, s, {.restarts = 6, .seed = 7});
  REQUIRE(found.best);
  CHECK(found.best->config == exhaustive[best.front()].config);
  CHECK(found.best->m.iteration_ns == exhaustive[best.front()].m.iteration_ns);
  CHECK(found.evaluations < configs.size());
}

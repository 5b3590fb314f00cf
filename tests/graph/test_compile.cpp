// graph::compile_into (graph/compile.hpp): one compile after another into the same compiled
// graph and scratch, larger and smaller graphs in turn, gives each graph exactly what a fresh
// compile gives it: no state of an earlier graph survives in the reused arrays.

#include <lumos/core/error.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/sim/replay.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

namespace lg = lumos::graph;

// A random DAG on `processors` processors: tasks added in a random processor order, edges from
// earlier tasks (start or finish, launch-like or not, with delays) and a few busy gaps.
lg::task_graph random_graph(std::mt19937& rng, std::uint32_t tasks, std::uint32_t processors) {
  lg::task_graph g;
  for (std::uint32_t p = 0; p < processors; ++p) g.add_processor({lg::processor_kind::gpu_stream, 0, 0, p, {}});
  std::uniform_int_distribution<std::uint32_t> proc(0, processors - 1);
  std::uniform_int_distribution<int> dur(0, 1000), coin(0, 3);
  for (std::uint32_t t = 0; t < tasks; ++t) {
    const auto k = coin(rng) == 0 ? lg::task_kind::cpu : lg::task_kind::gpu_compute;
    (void)g.add_task({.kind = k, .processor = proc(rng), .duration = dur(rng), .idle_gap = dur(rng) / 10, .busy_gap = coin(rng) == 0 ? 50 : 0});
    for (int e = coin(rng); t > 0 && e > 0; --e) {
      const std::uint32_t from = std::uniform_int_distribution<std::uint32_t>(0, t - 1)(rng);
      const auto flags = coin(rng) == 0 ? lg::edge_flags::finish : coin(rng) == 0 ? lg::edge_flags::from_start : lg::edge_flags::none;
      g.add_edge(from, t, dur(rng) - 200, lg::edge_kind::dependency, flags);
    }
  }
  // A few edges from later tasks, which make the insertion order no longer topological: from
  // t + 1 on another processor and without an edge from t (the only path back to t).
  for (std::uint32_t t = 1; t + 1 < tasks; t += 17) {
    const bool forward = std::any_of(g.edges.begin(), g.edges.end(), [&](const lg::edge& e) { return e.from == t && e.to == t + 1; });
    if (g.processor[t + 1] != g.processor[t] && !forward) g.add_edge(t + 1, t, 3, lg::edge_kind::dependency);
  }
  return g;
}

void require_equal(const lg::compiled_graph& a, const lg::compiled_graph& b) {
  REQUIRE(a.processor_count == b.processor_count);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.edge_count() == b.edge_count());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a.task[i] == b.task[i]);
    REQUIRE(a.tasks[i].gap == b.tasks[i].gap);
    REQUIRE(a.tasks[i].duration == b.tasks[i].duration);
    REQUIRE(a.tasks[i].processor_and_finishes == b.tasks[i].processor_and_finishes);
    REQUIRE(a.tasks[i].pred_end == b.tasks[i].pred_end);
    REQUIRE(a.positions[i] == b.positions[i]);
  }
  for (std::size_t e = 0; e < a.edge_count(); ++e) {
    REQUIRE(a.preds[e].time == b.preds[e].time);
    REQUIRE(a.preds[e].delay == b.preds[e].delay);
  }
}

}  // namespace

TEST_CASE("compile_into reuses its arrays from graph to graph with the result of a fresh compile", "[graph][compile]") {
  std::mt19937 rng(11);
  lg::compiled_graph c;
  lg::compile_scratch scratch;
  const lg::scales s{.compute = 1.5, .comm = 1.0, .cpu = 0.5};
  for (const std::uint32_t tasks : {4000U, 300U, 5000U, 1U, 2500U}) {
    const lg::task_graph g = random_graph(rng, tasks, 1 + tasks % 13);
    lg::compile_into(g, c, scratch, s);
    require_equal(c, lg::compile(g, s));
    // The reused graph replays as the fresh one.
    CHECK(lumos::sim::replay(c).makespan() == lumos::sim::replay(lg::compile(g, s)).makespan());
  }
}

TEST_CASE("compile_into names the cycle as compile does", "[graph][compile]") {
  lg::task_graph g;
  const auto p = g.add_processor({lg::processor_kind::cpu_thread, 0, 1, 1, {}});
  const auto q = g.add_processor({lg::processor_kind::gpu_stream, 0, 0, 7, {}});
  const auto a = g.add_task({.kind = lg::task_kind::cpu, .processor = p, .duration = 1});
  const auto b = g.add_task({.kind = lg::task_kind::gpu_compute, .processor = q, .duration = 1});
  g.add_edge(b, a, 0, lg::edge_kind::sync);
  g.add_edge(a, b, 0, lg::edge_kind::launch);
  lg::compiled_graph c;
  lg::compile_scratch scratch;
  std::string fresh, reused;
  try {
    (void)lg::compile(g);
  } catch (const lumos::error& e) {
    fresh = e.what();
  }
  try {
    lg::compile_into(g, c, scratch);
  } catch (const lumos::error& e) {
    reused = e.what();
  }
  CHECK_THAT(fresh, Catch::Contains("cycle"));
  CHECK(reused == fresh);
}

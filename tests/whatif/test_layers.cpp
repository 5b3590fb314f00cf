// The layer-count what-if's parts (include/lumos/whatif/layers.hpp): how often each layer of a
// chunk runs for a new layer count, and which tasks travel with a layer when it is repeated.
#include <lumos/whatif/layers.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

using namespace lumos;

TEST_CASE("layer_copy_count: a chunk's layers run N·Lc/L times in all, spread evenly, or the first kept", "[whatif][layers]") {
  for (const int total : {4, 8, 12}) {
    for (const int stages : {1, 2, 4}) {
      if (total % stages != 0) continue;
      const int lc = total / stages;
      for (int layers = 1; layers <= 3 * total; ++layers) {
        if ((layers * lc) % total != 0) {
          CHECK_THROWS_AS(whatif::detail::layer_copy_count(layers, total, lc, 0, 0, 0), error);
          continue;
        }
        const int nc = layers * lc / total;
        int sum = 0, most = 0, least = layers;
        for (int l = 0; l < lc; ++l) {
          const int n = whatif::detail::layer_copy_count(layers, total, lc, l, 0, 0);
          sum += n, most = std::max(most, n), least = std::min(least, n);
          // Earlier layers run at least as often as later ones.
          if (l > 0) CHECK(n <= whatif::detail::layer_copy_count(layers, total, lc, l - 1, 0, 0));
        }
        CHECK(sum == nc);
        CHECK(most - least <= 1);
      }
    }
  }
  // 3 layers over 2 stages of 4: no whole share per stage.
  CHECK_THROWS_WITH(whatif::detail::layer_copy_count(3, 8, 4, 0, 1, 0), Catch::Contains("stage 1 chunk 0"));
}

TEST_CASE("layer_closure: a layer takes the tasks between its own on a processor and a hand-off it feeds and waits for",
          "[whatif][layers]") {
  using namespace lumos::graph;
  task_graph g;
  const processor_id cpu = g.add_processor({processor_kind::cpu_thread, 0, 1, 1, "main"});
  const processor_id helper = g.add_processor({processor_kind::cpu_thread, 0, 1, 2, "helper"});
  auto task = [&](processor_id p, time_ns start, time_ns end) {
    return g.add_task({.kind = task_kind::cpu, .processor = p, .duration = end - start, .observed_start = start, .observed_end = end});
  };
  const task_id first = task(cpu, 0, 10), between = task(cpu, 10, 20), last = task(cpu, 20, 30), after = task(cpu, 30, 40);
  const task_id handoff = task(helper, 12, 15);  // fed by the layer, which waits for it
  const task_id side = task(helper, 16, 18);     // fed by the layer only
  g.add_edge(first, handoff, 0, edge_kind::thread_handoff);
  g.add_edge(handoff, last, 0, edge_kind::thread_handoff);
  g.add_edge(first, side, 0, edge_kind::thread_handoff);
  whatif::detail::layer_closure closure(g);
  const std::set<task_id> all = closure.of({first, last});
  CHECK(all == std::set<task_id>{first, between, last, handoff});
  CHECK_FALSE(all.count(after));
  CHECK_FALSE(all.count(side));
  // The indexes serve every layer: a second query gives its own answer.
  CHECK(closure.of({after}) == std::set<task_id>{after});
}

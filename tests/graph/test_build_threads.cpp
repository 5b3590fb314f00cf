// The graph builder's threads (build_options::threads): the graph of a multi-rank job is the
// same for any number of them. Also run under ThreadSanitizer in CI.
#include "../unit/test_support.hpp"

#include <lumos/graph/trace_builder.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using namespace lumos;

TEST_CASE("a multi-rank graph does not depend on the number of build threads", "[replay][threads]") {
  std::vector<std::vector<fs::path>> jobs = {{fs::path(LUMOS_SOURCE_DIR) / "examples/data/tiny_job"}};
  if (const auto traces = lumos_test::trace_dir(); !traces.empty()) {
    jobs.push_back({traces / "astra-sim_megatron-gpt-tp8_8xA100"});
    jobs.push_back({traces / "param_dlrm_8xV100"});
  }
  for (const auto& inputs : jobs) {
    INFO(inputs.front().string());
    const auto job = trace::load_job(inputs);
    REQUIRE(job.ranks.size() > 1);
    graph::build_options one;
    one.threads = 1;
    const graph::built_job a = graph::build_graph(job, one);
    for (const unsigned threads : {2U, 3U, 8U}) {
      INFO(threads << " threads");
      graph::build_options many;
      many.threads = threads;
      const graph::built_job b = graph::build_graph(job, many);
      const graph::task_graph& x = a.graph;
      const graph::task_graph& y = b.graph;
      REQUIRE(x.task_count() == y.task_count());
      CHECK(x.processor == y.processor);
      CHECK(x.kind == y.kind);
      CHECK(x.duration == y.duration);
      CHECK(x.idle_gap == y.idle_gap);
      CHECK(x.busy_gap == y.busy_gap);
      CHECK(x.observed_start == y.observed_start);
      CHECK(x.source == y.source);
      bool names = true;
      for (graph::task_id t = 0; t < x.task_count(); ++t) names = names && x.task_name(t) == y.task_name(t);
      CHECK(names);
      REQUIRE(x.edge_count() == y.edge_count());
      bool edges = true;
      for (std::size_t e = 0; e < x.edge_count(); ++e) {
        const auto &p = x.edges[e], &q = y.edges[e];
        edges = edges && p.from == q.from && p.to == q.to && p.delay == q.delay && p.kind == q.kind && p.flags() == q.flags();
      }
      CHECK(edges);
      REQUIRE(a.kept.size() == b.kept.size());
      bool kept = true;
      for (std::size_t k = 0; k < a.kept.size(); ++k) kept = kept && a.kept[k].task == b.kept[k].task && a.kept[k].amount == b.kept[k].amount;
      CHECK(kept);
      CHECK(a.stats.cross_stream_exact == b.stats.cross_stream_exact);
      CHECK(a.stats.cross_stream_inferred == b.stats.cross_stream_inferred);
      CHECK(a.stats.cross_stream_unresolved == b.stats.cross_stream_unresolved);
      CHECK(a.stats.unmatched_transfer_same_op == b.stats.unmatched_transfer_same_op);
      CHECK(a.stats.unmatched_kept_whole == b.stats.unmatched_kept_whole);
      CHECK(a.stats.blocking_calls == b.stats.blocking_calls);
      CHECK(a.stats.launch_edges == b.stats.launch_edges);
    }
  }
}

// The graph builder's threads (build_options::threads): the graph of a multi-rank job is the
// same for any number of them; so are the per-rank plans and reports of replay_job and the
// blocks of compile. Also run under ThreadSanitizer in CI. Also the per-rank lists that the
// analysis threads hand to the thread that makes the tasks (detail::event_lists).
#include "../unit/test_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

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
      CHECK(x.observed_end == y.observed_end);
      CHECK(x.source == y.source);
      CHECK(x.rank == y.rank);
      CHECK(x.name == y.name);  // the same string ids, not only the same names
      REQUIRE(x.processors.size() == y.processors.size());
      bool processors = true;
      for (std::size_t p = 0; p < x.processors.size(); ++p) processors = processors && x.processors[p].name == y.processors[p].name;
      CHECK(processors);
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
      CHECK(a.stats.cpu_tasks == b.stats.cpu_tasks);
      CHECK(a.stats.gpu_tasks == b.stats.gpu_tasks);
      CHECK(a.stats.handoffs == b.stats.handoffs);
      CHECK(a.stats.sync_edges == b.stats.sync_edges);
      CHECK(a.stats.ops_queued == b.stats.ops_queued);
      CHECK(a.stats.causality_violations == b.stats.causality_violations);
      CHECK(a.stats.worst_violation_text == b.stats.worst_violation_text);
      CHECK(a.stats.overheads.size() == b.stats.overheads.size());
      for (std::size_t r = 0; r < a.ranks.size(); ++r) {
        CHECK(a.ranks[r].task_of_event == b.ranks[r].task_of_event);
        CHECK(a.ranks[r].arrive_of_event == b.ranks[r].arrive_of_event);
      }
    }
  }
}

TEST_CASE("replay_job's per-rank reports do not depend on the number of threads", "[replay][threads]") {
  std::vector<std::vector<fs::path>> jobs = {{fs::path(LUMOS_SOURCE_DIR) / "examples/data/tiny_job"}};
  if (const auto traces = lumos_test::trace_dir(); !traces.empty()) jobs.push_back({traces / "astra-sim_megatron-gpt-tp8_8xA100"});
  for (const auto& inputs : jobs) {
    INFO(inputs.front().string());
    const auto job = trace::load_job(inputs);
    report::replay_options one, many;
    one.build.threads = 1;
    many.build.threads = 8;
    const auto a = report::replay_job(job, one);
    const auto b = report::replay_job(job, many);
    REQUIRE(a.ranks.size() == b.ranks.size());
    CHECK(a.simulated_ns == b.simulated_ns);
    CHECK(a.measured_ns == b.measured_ns);
    for (std::size_t i = 0; i < a.ranks.size(); ++i) {
      CHECK(a.ranks[i].step == b.ranks[i].step);
      CHECK(a.ranks[i].simulated_ns == b.ranks[i].simulated_ns);
      CHECK(a.ranks[i].simulated.split.exposed_compute == b.ranks[i].simulated.split.exposed_compute);
      CHECK(a.ranks[i].measured.split.exposed_comm == b.ranks[i].measured.split.exposed_comm);
      CHECK(a.plans[i].compute == b.plans[i].compute);
    }
  }
}

TEST_CASE("replay_job with release_events frees each rank's events as its tasks are added, with the same results",
          "[replay][threads]") {
  std::vector<std::vector<fs::path>> jobs = {{fs::path(LUMOS_SOURCE_DIR) / "examples/data/tiny_job"}};
  if (const auto traces = lumos_test::trace_dir(); !traces.empty()) {
    jobs.push_back({traces / "astra-sim_megatron-gpt-tp8_8xA100"});  // matched collectives
    jobs.push_back({traces / "param_dlrm_8xV100"});
  }
  for (const auto& inputs : jobs) {
    INFO(inputs.front().string());
    const trace::job kept = trace::load_job(inputs);
    const auto want = report::replay_job(kept, {});
    for (const unsigned threads : {1U, 3U}) {
      INFO(threads << " threads");
      trace::job job = trace::load_job(inputs);
      std::vector<std::size_t> released;
      bool in_order = true;  // when rank i goes, every rank after it still has its events
      report::replay_options opt;
      opt.build.threads = threads;
      opt.release_events = [&](std::size_t i) {
        for (std::size_t k = i; k < job.ranks.size(); ++k) in_order = in_order && !job.ranks[k].events.empty();
        released.push_back(i);
        job.ranks[i].drop_events();
      };
      const auto got = report::replay_job(job, opt);
      std::vector<std::size_t> every(job.ranks.size());
      std::iota(every.begin(), every.end(), std::size_t{0});
      CHECK(released == every);
      CHECK(in_order);
      CHECK(std::all_of(job.ranks.begin(), job.ranks.end(), [](const trace::rank_trace& r) { return r.events.empty(); }));
      // Columns this small are lent no pages: the freed events' blocks (and the reader's outgrown
      // ones) are not kept for them, where they would only raise the peak.
      CHECK(lumos::block_cache_bytes() == 0);
      // The graph (collective transfers, violation text included) and every rank's plan and
      // result are those of the replay that kept the events.
      CHECK(got.built.graph.duration == want.built.graph.duration);
      CHECK(got.built.graph.observed_end == want.built.graph.observed_end);
      CHECK(got.built.stats.causality_violations == want.built.stats.causality_violations);
      CHECK(got.built.stats.worst_violation_text == want.built.stats.worst_violation_text);
      CHECK(got.simulated_ns == want.simulated_ns);
      CHECK(got.measured_ns == want.measured_ns);
      REQUIRE(got.ranks.size() == want.ranks.size());
      for (std::size_t i = 0; i < got.ranks.size(); ++i) {
        const auto &p = got.plans[i], &q = want.plans[i];
        CHECK(p.step == q.step);
        CHECK(p.annotated == q.annotated);
        CHECK(p.first_cpu == q.first_cpu);
        CHECK(p.last_cpu == q.last_cpu);
        CHECK(p.lead_busy == q.lead_busy);
        CHECK(p.lead_idle == q.lead_idle);
        CHECK(p.tail_busy == q.tail_busy);
        CHECK(p.tail_idle == q.tail_idle);
        CHECK(p.previous.has_value() == q.previous.has_value());
        if (p.previous && q.previous) CHECK(p.previous->tail_busy == q.previous->tail_busy);
        CHECK(p.cpu == q.cpu);
        CHECK(p.gpu == q.gpu);
        CHECK(got.ranks[i].simulated_ns == want.ranks[i].simulated_ns);
        CHECK(got.ranks[i].measured.split.exposed_comm == want.ranks[i].measured.split.exposed_comm);
      }
    }
  }
}

TEST_CASE("compile fills a large graph's records in parallel blocks: the same order and times as the graph says",
          "[replay][threads]") {
  // 4 threads of 70000 unit tasks each (280000: above the size compile splits into blocks),
  // task i of each waiting for task i of the one before: processor p finishes at 70000 + p.
  graph::task_graph g;
  constexpr int lanes = 4, per_lane = 70000;
  std::vector<graph::processor_id> p;
  for (int l = 0; l < lanes; ++l) p.push_back(g.add_processor({.kind = graph::processor_kind::cpu_thread, .index = l, .name = "thread " + std::to_string(l)}));
  for (int l = 0; l < lanes; ++l) {
    for (int i = 0; i < per_lane; ++i) g.add_task({.kind = graph::task_kind::cpu, .processor = p[static_cast<std::size_t>(l)], .duration = 1});
  }
  for (int l = 1; l < lanes; ++l) {
    for (int i = 0; i < per_lane; ++i) {
      g.add_edge(static_cast<graph::task_id>((l - 1) * per_lane + i), static_cast<graph::task_id>(l * per_lane + i), 0,
                 graph::edge_kind::dependency);
    }
  }
  const graph::compiled_graph c = graph::compile(g);
  REQUIRE(c.size() == g.task_count());
  bool inverse = true;
  for (std::uint32_t i = 0; i < c.size(); ++i) inverse = inverse && c.position_of(c.task_at(graph::position{i})) == graph::position{i};
  CHECK(inverse);
  CHECK(c.edge_count() == g.edge_count());
  sim::replay_engine engine;
  CHECK(engine.run(c) == per_lane + lanes - 1);
  const sim::record_timeline t = sim::record_timeline::from_interleaved(engine.release_times());
  for (int l = 0; l < lanes; ++l) {
    const auto last = static_cast<graph::task_id>((l + 1) * per_lane - 1);
    CHECK(t.finish_of(c.position_of(last)) == per_lane + l);
  }
}

TEST_CASE("event_lists: each key's values in the order added, keys ascending", "[graph][threads]") {
  graph::detail::event_lists lists;
  // Keys out of order and interleaved, as a thread's blocking calls and the streams' consumers
  // are met; 9 is the last key the bound allows.
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> added = {{7, 70}, {2, 20}, {7, 71}, {9, 90}, {2, 21}, {7, 72}, {0, 1}};
  for (const auto& [k, v] : added) lists.add(k, v);
  lists.seal(10);
  CHECK(lists.keys() == std::vector<std::uint32_t>{0, 2, 7, 9});
  for (std::uint32_t k = 0; k < 12; ++k) {
    INFO("key " << k);
    std::vector<std::uint32_t> expected;
    for (const auto& [key, v] : added) {
      if (key == k) expected.push_back(v);
    }
    const auto found = lists.find(k);
    CHECK(std::vector<std::uint32_t>(found.begin(), found.end()) == expected);  // keys 10 and 11: past the bound, empty
  }
  graph::detail::event_lists none;
  none.seal(0);
  CHECK(none.keys().empty());
  CHECK(none.find(0).empty());
  graph::detail::event_lists unsealed;  // nothing sealed: every lookup is empty
  CHECK(unsealed.find(3).empty());
}

// detail::add_counts lists build_stats' per-rank counters by hand (30 of them, the causality
// violations included): a counter added to build_stats but not there would read 0 for every
// job, whatever the thread count, so no comparison across thread counts would notice.
static_assert(sizeof(void*) != 8 ||
                  sizeof(graph::build_stats) == 31 * sizeof(std::size_t) + 2 * sizeof(time_ns) + 2 * sizeof(std::string) +
                                                    2 * sizeof(std::vector<time_ns>) + 8 /* two bools, padded */,
              "build_stats changed: add its new per-rank counters to detail::add_counts, then update this check");

TEST_CASE("add_counts sums the ranks' counters and keeps the first worst causality violation", "[graph][threads]") {
  graph::build_stats job;
  graph::build_stats a;
  a.cpu_tasks = 3, a.op_scaled_cpu = 1, a.causality_violations = 2, a.worst_violation = 50, a.worst_violation_text = "a";
  a.overheads.resize(2);
  graph::build_stats b;
  b.cpu_tasks = 4, b.op_scaled_cpu = 2, b.causality_violations = 1, b.worst_violation = 50, b.worst_violation_text = "b";
  b.overheads.resize(1);
  graph::build_stats c;
  c.causality_violations = 1, c.worst_violation = 70, c.worst_violation_text = "c";
  graph::detail::add_counts(job, std::move(a));
  graph::detail::add_counts(job, std::move(b));
  CHECK(job.cpu_tasks == 7);
  CHECK(job.op_scaled_cpu == 3);
  CHECK(job.causality_violations == 3);
  CHECK(job.worst_violation_text == "a");  // b's is as bad, not worse
  CHECK(job.overheads.size() == 3);
  graph::detail::add_counts(job, std::move(c));
  CHECK(job.worst_violation == 70);
  CHECK(job.worst_violation_text == "c");
  CHECK(job.causality_violations == 4);
}

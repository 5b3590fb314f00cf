// compile() and the replay loop on small hand-made graphs, with times derived by hand.
#include <lumos/graph/compile.hpp>
#include <lumos/sim/replay.hpp>

#include <catch2/catch.hpp>

#include <type_traits>

using namespace lumos;
using namespace lumos::graph;

namespace {

struct two_processors {
  task_graph g;
  processor_id cpu = g.add_processor({processor_kind::cpu_thread, 0, 1, 1, "cpu"});
  processor_id gpu = g.add_processor({processor_kind::gpu_stream, 0, 0, 7, "stream 7"});
};

time_ns finish_of(const compiled_graph& c, const sim::record_timeline& t, task_id id) { return t.finish_of(c.position_of(id)); }
time_ns start_of(const compiled_graph& c, const sim::record_timeline& t, task_id id) { return t.start_of(c.position_of(id)); }

}  // namespace

TEST_CASE("task_spec fields land in their columns, edge_flags in the edge", "[graph]") {
  two_processors x;
  auto& g = x.g;
  const task_id t = g.add_task({.kind = task_kind::cpu_blocking, .processor = x.cpu, .duration = 4, .idle_gap = 3, .busy_gap = 2,
                                .name = "cudaStreamSynchronize", .rank = 5, .source = 17, .observed_start = 100, .observed_end = 109});
  const task_id u = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu});
  CHECK(g.kind[t] == task_kind::cpu_blocking);
  CHECK(g.processor[t] == x.cpu);
  CHECK((g.duration[t] == 4 && g.idle_gap[t] == 3 && g.busy_gap[t] == 2));
  CHECK(g.task_name(t) == "cudaStreamSynchronize");
  CHECK((g.rank[t] == 5 && g.source[t] == 17 && g.observed_start[t] == 100 && g.observed_end[t] == 109));
  CHECK((g.duration[u] == 0 && g.idle_gap[u] == 0 && g.rank[u] == 0 && g.source[u] == ~0U && g.task_name(u).empty()));
  CHECK_THROWS_AS(g.add_task({.kind = task_kind::cpu, .processor = 9}), lumos::error);

  g.add_edge(u, t, 1, edge_kind::sync, edge_flags::finish);
  g.add_edge(t, u, 2, edge_kind::launch, edge_flags::from_start);
  g.add_edge(t, u, 3, edge_kind::dependency, edge_flags::finish | edge_flags::from_start);
  g.add_edge(t, u, 4, edge_kind::dependency);
  REQUIRE(g.edges.size() == 4);
  CHECK((g.edges[0].finish && !g.edges[0].from_start));
  CHECK((!g.edges[1].finish && g.edges[1].from_start));
  CHECK((g.edges[2].finish && g.edges[2].from_start));
  CHECK((!g.edges[3].finish && !g.edges[3].from_start));
}

TEST_CASE("task_graph::memory_bytes counts each column once", "[graph][memory]") {
  two_processors x;
  auto& g = x.g;
  for (int i = 0; i < 1000; ++i) g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = i, .name = "t"});
  g.add_edge(0, 1, 0, edge_kind::dependency);
  // The columns' own capacities, summed column by column (the scale figures of docs/replay.md
  // quote memory_bytes; it once counted a time column twice).
  auto bytes = [](const auto& column) { return column.capacity() * sizeof(typename std::decay_t<decltype(column)>::value_type); };
  const std::size_t columns = bytes(g.processor) + bytes(g.kind) + bytes(g.duration) + bytes(g.idle_gap) + bytes(g.busy_gap) +
                              bytes(g.name) + bytes(g.rank) + bytes(g.source) + bytes(g.observed_start) + bytes(g.observed_end);
  CHECK(g.memory_bytes() == columns + bytes(g.edges) + g.strings.memory_bytes());
}

TEST_CASE("a copied task_graph is independent of its source", "[graph]") {
  task_graph copy;
  {
    two_processors x;
    auto& g = x.g;
    const task_id a = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 5, .name = "launch A"});
    const task_id b = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 100, .name = "A"});
    g.add_edge(a, b, 7, edge_kind::launch);
    copy = g;
    // Editing the source after the copy leaves the copy as it was.
    g.duration[b] = 1;
    g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 9, .name = "only in the source"});
    g.edges[0].delay = 0;
    g.processors[0].name = "renamed";
  }  // and the source is gone: the copy owns its names
  REQUIRE(copy.task_count() == 2);
  CHECK(copy.duration[1] == 100);
  CHECK(copy.edges[0].delay == 7);
  CHECK(copy.processors[0].name == "cpu");
  CHECK(copy.task_name(0) == "launch A");
  CHECK(copy.task_name(1) == "A");
  CHECK(copy.strings.find("only in the source") == lumos::no_string);
  // The copy replays like the original did: A starts 7 after its launch ends (5), ends at 112.
  const compiled_graph c = compile(copy);
  const auto t = sim::replay(c);
  CHECK(finish_of(c, t, 1) == 112);
}

TEST_CASE("task_graph::append adds a part after the graph, as if built in one piece", "[graph]") {
  // One graph built in one piece, and the same tasks built as two parts appended in order.
  auto first = [](task_graph& g) {
    const processor_id cpu = g.add_processor({processor_kind::cpu_thread, 0, 1, 1, "cpu 0"});
    const task_id a = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 5, .name = "launch"});
    const task_id b = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 3, .idle_gap = 2, .name = "A"});
    g.add_edge(a, b, 1, edge_kind::dependency);
  };
  auto second = [](task_graph& g) {
    const processor_id cpu = g.add_processor({processor_kind::cpu_thread, 1, 2, 2, "cpu 1"});
    const processor_id gpu = g.add_processor({processor_kind::gpu_stream, 1, 0, 7, "gpu 1"});
    const task_id a = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 4, .name = "B", .rank = 1});
    const task_id b = g.add_task({.kind = task_kind::gpu_compute, .processor = gpu, .duration = 50, .name = "launch",
                                  .rank = 1, .source = 9, .observed_start = 10, .observed_end = 60});
    g.add_edge(a, b, 6, edge_kind::launch, edge_flags::from_start);
    collective_instance c;
    c.kind = "allreduce", c.arrive = {a}, c.complete = {b};
    g.collectives.push_back(c);
  };
  task_graph whole;
  first(whole);
  second(whole);
  task_graph parts, part;
  first(parts);
  part.reserve(100, 100);
  second(part);
  const task_graph::appended at = parts.append(part);
  CHECK(at.first_processor == 1);
  CHECK(at.first_task == 2);
  REQUIRE(parts.task_count() == whole.task_count());
  REQUIRE(parts.processors.size() == 3);
  CHECK(parts.processors[2].name == "gpu 1");
  CHECK(parts.processor == whole.processor);
  CHECK(parts.kind == whole.kind);
  CHECK(parts.duration == whole.duration);
  CHECK(parts.idle_gap == whole.idle_gap);
  CHECK(parts.rank == whole.rank);
  CHECK(parts.source == whole.source);
  CHECK(parts.observed_start == whole.observed_start);
  CHECK(parts.observed_end == whole.observed_end);
  CHECK(parts.name == whole.name);  // the same ids: "launch" is interned once, by the first part
  CHECK(parts.strings.size() == whole.strings.size());
  REQUIRE(parts.edges.size() == 2);
  CHECK((parts.edges[1].from == 2 && parts.edges[1].to == 3 && parts.edges[1].delay == 6 && parts.edges[1].from_start));
  REQUIRE(parts.collectives.size() == 1);
  CHECK((parts.collectives[0].arrive == std::vector<task_id>{2} && parts.collectives[0].complete == std::vector<task_id>{3}));
  const compiled_graph c = compile(parts), d = compile(whole);
  const auto t = sim::replay(c), u = sim::replay(d);
  CHECK(finish_of(c, t, 3) == finish_of(d, u, 3));

  // Emptied, the part keeps its columns' memory and takes the next part's tasks from id 0.
  const std::size_t capacity = part.duration.capacity();
  part.clear();
  CHECK(part.task_count() == 0);
  CHECK(part.edges.empty());
  CHECK(part.processors.empty());
  CHECK(part.strings.size() == 0);
  CHECK(part.duration.capacity() == capacity);
  second(part);
  CHECK(part.task_name(0) == "B");

  // A graph whose columns were released takes no parts.
  whole.release_durations();
  CHECK_THROWS_WITH(whole.append(part), Catch::Contains("released"));
}

TEST_CASE("processor order with gaps, launch edges and a blocking sync", "[graph][replay]") {
  two_processors x;
  auto& g = x.g;
  // CPU: launch A at 10 (5 long), launch B after a 3 ns idle gap and 2 ns of busy work, then a
  // sync that waits for B with 4 ns after B ends.
  const task_id la = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 5, .idle_gap = 10, .name = "launch A"});
  const task_id lb = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 5, .idle_gap = 3, .busy_gap = 2, .name = "launch B"});
  const task_id sync = g.add_task({.kind = task_kind::cpu_blocking, .processor = x.cpu, .duration = 4, .name = "cudaStreamSynchronize"});
  const task_id a = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 100, .name = "A"});
  const task_id b = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 50, .idle_gap = 1, .name = "B"});
  g.add_edge(la, a, 7, edge_kind::launch);
  g.add_edge(lb, b, 7, edge_kind::launch);
  g.add_edge(b, sync, 4, edge_kind::sync, edge_flags::finish);
  const compiled_graph c = compile(g);
  const auto t = sim::replay(c);
  // la: [10,15]; lb: 15+3+2=20 -> [20,25]; A: max(0, 15+7)=22 -> [22,122]; B: max(122+1, 25+7) = 123
  // -> [123,173]; sync: starts 25, ends max(25+4, 173+4) = 177.
  CHECK(start_of(c, t, la) == 10);
  CHECK(start_of(c, t, lb) == 20);
  CHECK(start_of(c, t, a) == 22);
  CHECK(start_of(c, t, b) == 123);
  CHECK(start_of(c, t, sync) == 25);
  CHECK(finish_of(c, t, sync) == 177);

  SECTION("scales apply per kind; gaps and delays do not scale") {
    const compiled_graph c2 = compile(g, {.compute = 2.0, .comm = 1.0, .cpu = 3.0});
    const auto t2 = sim::replay(c2);
    // la [10,25]; lb: 25+3+2*3=34 -> [34,49]; A: 25+7=32 -> [32,232]; B: max(233, 56) -> [233,333];
    // sync: starts 49, ends max(49+12, 333+4) = 337.
    CHECK(start_of(c2, t2, lb) == 34);
    CHECK(start_of(c2, t2, a) == 32);
    CHECK(finish_of(c2, t2, b) == 333);
    CHECK(finish_of(c2, t2, sync) == 337);
  }
}

TEST_CASE("a collective join: every participant ends at the last arrival plus the transfer", "[graph][replay]") {
  task_graph g;
  std::vector<task_id> arrive, complete;
  const processor_id barrier = g.add_processor({processor_kind::barrier, 0, 0, 0, "group 0"});
  for (int r = 0; r < 3; ++r) {
    const processor_id s = g.add_processor({processor_kind::gpu_stream, r, r, 20, "comm"});
    g.add_task({.kind = task_kind::gpu_compute, .processor = s, .duration = 100 * (r + 1), .name = "work"});
    arrive.push_back(g.add_task({.kind = task_kind::comm_arrive, .processor = s}));
    complete.push_back(g.add_task({.kind = task_kind::comm_complete, .processor = s, .duration = 30}));
  }
  const task_id join = g.add_task({.kind = task_kind::join, .processor = barrier});
  for (int r = 0; r < 3; ++r) {
    g.add_edge(arrive[r], join, 0, edge_kind::collective);
    g.add_edge(join, complete[r], 0, edge_kind::collective);
  }
  const compiled_graph c = compile(g, {.compute = 1.0, .comm = 2.0, .cpu = 1.0});
  const auto t = sim::replay(c);
  for (int r = 0; r < 3; ++r) {
    CHECK(start_of(c, t, arrive[r]) == 100 * (r + 1));
    CHECK(finish_of(c, t, complete[r]) == 300 + 60);
  }
}

TEST_CASE("a cycle is an error naming the tasks on it", "[graph]") {
  two_processors x;
  auto& g = x.g;
  const task_id rec = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 1, .name = "cudaEventRecord"});
  const task_id wait = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 1, .name = "consumer kernel"});
  g.add_edge(wait, rec, 0, edge_kind::cross_stream);
  g.add_edge(rec, wait, 0, edge_kind::launch);
  try {
    (void)compile(g);
    FAIL("expected a cycle error");
  } catch (const lumos::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("cycle") != std::string::npos);
    CHECK(msg.find("cudaEventRecord") != std::string::npos);
    CHECK(msg.find("consumer kernel") != std::string::npos);
  }
}

TEST_CASE("the compiled order is topological and deterministic, and memory per task is bounded", "[graph]") {
  task_graph g;
  std::vector<processor_id> procs;
  for (int p = 0; p < 4; ++p) procs.push_back(g.add_processor({processor_kind::gpu_stream, 0, 0, p, "s"}));
  std::vector<task_id> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(g.add_task({.kind = task_kind::gpu_compute, .processor = procs[static_cast<std::size_t>(i % 4)], .duration = i % 7 + 1, .idle_gap = i % 3}));
  for (int i = 10; i < 1000; i += 3) g.add_edge(ids[static_cast<std::size_t>(i - 9)], ids[static_cast<std::size_t>(i)], i % 5, edge_kind::dependency);
  const compiled_graph a = compile(g);
  const compiled_graph b = compile(g);
  CHECK(std::equal(a.task.begin(), a.task.end(), b.task.begin(), b.task.end()));
  for (std::uint32_t i = 0; i < a.size(); ++i) {
    for (std::uint32_t j = a.pred_begin(i); j < a.pred_end(i); ++j) REQUIRE(a.preds[j].time / 2 < i);
  }
  CHECK(a.memory_bytes() <= 64 * a.size() + 8 * a.edge_count() + 4096);
  const auto ta = sim::replay(a);
  const auto tb = sim::replay(b);
  REQUIRE(ta.size() == tb.size());
  for (std::uint32_t i = 0; i < ta.size(); ++i) CHECK(ta.finish_of(position{i}) == tb.finish_of(position{i}));
}

TEST_CASE("compile_releasing compiles what compile does, then frees the columns it was asked to", "[graph]") {
  // Out of insertion order (a join fed by later tasks), with busy gaps under a CPU scale, finish
  // edges and launch edges counted from the caller's start: every part of a record and of a
  // predecessor list that either order of the release could get wrong.
  two_processors x;
  auto& g = x.g;
  const processor_id other = g.add_processor({processor_kind::cpu_thread, 0, 1, 2, "other thread"});
  const task_id join = g.add_task({.kind = task_kind::cpu, .processor = other, .duration = 3, .idle_gap = 2, .busy_gap = 5, .name = "wait"});
  const task_id launch = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 4, .busy_gap = 7, .name = "launch"});
  const task_id k1 = g.add_task({.kind = task_kind::gpu_compute, .processor = x.gpu, .duration = 40, .idle_gap = 1, .name = "k1"});
  const task_id k2 = g.add_task({.kind = task_kind::gpu_comm, .processor = x.gpu, .duration = 20, .busy_gap = 3, .name = "k2"});
  g.add_edge(launch, k1, 6, edge_kind::launch, edge_flags::from_start);
  g.add_edge(k1, k2, 2, edge_kind::dependency);
  g.add_edge(k2, join, 1, edge_kind::sync, edge_flags::finish);
  g.add_edge(launch, join, -50, edge_kind::thread_handoff);
  const scales s{.compute = 1.5, .comm = 2.0, .cpu = 3.0};
  const compiled_graph want = compile(g, s);
  const std::size_t edges = g.edge_count();
  for (const compile_release what : {compile_release{.durations = true}, compile_release{.edges = true},
                                     compile_release{.durations = true, .edges = true}, compile_release{}}) {
    INFO("durations " << what.durations << ", edges " << what.edges);
    task_graph h = g;
    const compiled_graph got = compile_releasing(h, what, s);
    REQUIRE(got.size() == want.size());
    REQUIRE(got.edge_count() == want.edge_count());
    for (std::uint32_t i = 0; i < want.size(); ++i) {
      CHECK(got.task[i] == want.task[i]);
      CHECK(got.tasks[i].gap == want.tasks[i].gap);
      CHECK(got.tasks[i].duration == want.tasks[i].duration);
      CHECK(got.tasks[i].processor_and_finishes == want.tasks[i].processor_and_finishes);
      CHECK(got.tasks[i].pred_end == want.tasks[i].pred_end);
    }
    for (std::size_t j = 0; j < want.edge_count(); ++j) CHECK((got.preds[j].time == want.preds[j].time && got.preds[j].delay == want.preds[j].delay));
    CHECK(h.durations_released() == what.durations);
    CHECK(h.edges_released() == what.edges);
    CHECK(h.edge_count() == edges);  // still counted
    CHECK(h.task_count() == g.task_count());
    if (what.durations || what.edges) {
      CHECK_THROWS_WITH(compile(h), Catch::Contains("cannot be compiled again"));
    }
    if (what.edges) CHECK_THROWS_WITH(h.add_edge(k1, k2, 0, edge_kind::dependency), Catch::Contains("released"));
  }
}

TEST_CASE("a graph whose observed times are released keeps the rest and takes no more tasks", "[graph]") {
  two_processors x;
  auto& g = x.g;
  const task_id a = g.add_task({.kind = task_kind::cpu, .processor = x.cpu, .duration = 3, .name = "a", .source = 4, .observed_start = 10, .observed_end = 13});
  const std::size_t before = g.memory_bytes();
  CHECK(!g.observations_released());
  g.release_observations();
  CHECK(g.observations_released());
  CHECK((g.observed_start.capacity() == 0 && g.observed_end.capacity() == 0 && g.source.capacity() == 0));
  CHECK(g.memory_bytes() < before);
  CHECK(g.task_name(a) == "a");
  CHECK(g.duration[a] == 3);
  CHECK_THROWS_WITH(g.add_task({.kind = task_kind::cpu, .processor = x.cpu}), Catch::Contains("released"));
  const compiled_graph c = compile(g);  // the replay reads none of them
  CHECK(sim::replay(c).finish_of(c.position_of(a)) == 3);
}

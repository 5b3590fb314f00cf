// Replay throughput in tasks per second.
//   BM_replay/<graph>            the replay engine (start and finish of every task recorded)
//   BM_replay_reference/<graph>  a bare loop over the same arrays (the compiled graph's task
//                                records and predecessor entries, the same time array): start =
//                                max(processor free, predecessors' finish) + duration, finish
//                                recorded, nothing else (no gaps, delays, launch-start edges,
//                                finish edges or start times)
//   BM_breakdown/<graph>, BM_critical_path/<graph>   the report post-passes, separately
//   BM_build/<trace>             trace -> task_graph (events per second), BM_compile/<graph>
// Graphs: the largest real ones (the 8-rank Megatron job, the largest shared H100 trace) and
// generated ones of 10^6 and 10^7 tasks shaped like a training job (per rank a launching CPU
// thread and three streams; launch edges, stream order, cross-stream waits, collectives).
#include "bench_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/job.hpp>

#include <algorithm>
#include <functional>
#include <random>

namespace {

using namespace lumos;

struct bench_graph {
  std::string name;
  graph::task_graph tasks;
  graph::compiled_graph compiled;
};

// A generated job: `ranks` ranks, each a CPU thread launching kernels round-robin on 3 streams;
// every 8th op on stream 2 waits for stream 0 (a cross-stream edge); every 64th op is a
// collective joined across all ranks.
graph::task_graph generate(std::size_t tasks, int ranks) {
  graph::task_graph g;
  std::mt19937_64 rng(42);
  struct rank_procs {
    graph::processor_id cpu, stream[3];
    graph::task_id last[3] = {graph::no_task, graph::no_task, graph::no_task};
  };
  std::vector<rank_procs> rp(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& x = rp[static_cast<std::size_t>(r)];
    x.cpu = g.add_processor({graph::processor_kind::cpu_thread, r, r, 0, "cpu"});
    for (int s = 0; s < 3; ++s) x.stream[s] = g.add_processor({graph::processor_kind::gpu_stream, r, r, s, "stream"});
  }
  const std::size_t per_rank_ops = tasks / (2 * static_cast<std::size_t>(ranks));
  for (std::size_t k = 0; k < per_rank_ops; ++k) {
    const bool collective = k % 64 == 63;
    std::vector<graph::task_id> arrivals;
    for (int r = 0; r < ranks; ++r) {
      auto& x = rp[static_cast<std::size_t>(r)];
      const int s = static_cast<int>(k % 3);
      const graph::task_id launch = g.add_task({.kind = graph::task_kind::cpu, .processor = x.cpu, .duration = 4000 + static_cast<time_ns>(rng() % 2000),
                   .idle_gap = 500, .busy_gap = 1000});
      const graph::task_id op = g.add_task({.kind = graph::task_kind::gpu_compute, .processor = x.stream[s],
                   .duration = 5000 + static_cast<time_ns>(rng() % 50000)});
      g.add_edge(launch, op, 5000, graph::edge_kind::launch, graph::edge_flags::from_start);
      if (s == 2 && k % 8 == 2 && x.last[0] != graph::no_task) g.add_edge(x.last[0], op, 0, graph::edge_kind::cross_stream);
      x.last[s] = op;
      if (collective) arrivals.push_back(op);
    }
    if (collective && ranks > 1) {
      const auto barrier = g.add_processor({graph::processor_kind::barrier, -1, 0, 0, "join"});
      const graph::task_id join = g.add_task({.kind = graph::task_kind::join, .processor = barrier});
      for (const auto a : arrivals) g.add_edge(a, join, 0, graph::edge_kind::collective);
    }
  }
  return g;
}

void finish(bench_graph& b) { b.compiled = graph::compile(b.tasks); }

void BM_replay(benchmark::State& state, const bench_graph* b) {
  sim::replay_engine engine;
  for (auto _ : state) benchmark::DoNotOptimize(engine.run(b->compiled));
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * b->compiled.size()), benchmark::Counter::kIsRate);
}

void BM_replay_reference(benchmark::State& state, const bench_graph* b) {
  const auto& c = b->compiled;
  const std::size_t n = c.size();
  std::vector<time_ns> free(c.processor_count);
  large_vector<time_ns> times(2 * n);
  for (auto _ : state) {
    std::fill(free.begin(), free.end(), 0);
    const graph::task_record* rec = c.tasks.data();
    const graph::pred_ref* preds = c.preds.data();
    time_ns* t = times.data();
    std::uint32_t begin = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const graph::task_record r = rec[i];
      const std::uint32_t p = r.processor();
      time_ns s = free[p];
      for (std::uint32_t j = begin; j < r.pred_end; ++j) s = std::max(s, t[preds[j].time | 1U]);
      const time_ns f = s + r.duration;
      t[2 * i + 1] = f;
      free[p] = f;
      begin = r.pred_end;
    }
    benchmark::DoNotOptimize(t[2 * n - 1]);
  }
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * n), benchmark::Counter::kIsRate);
}

void BM_compile(benchmark::State& state, const bench_graph* b) {
  for (auto _ : state) benchmark::DoNotOptimize(graph::compile(b->tasks).size());
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * b->tasks.task_count()), benchmark::Counter::kIsRate);
}

// What compile() hands graph::detail::topological_order: successor lists, each task's next on its
// processor, and its count of predecessors (consumed by the order, so copied per run).
struct order_inputs {
  std::vector<std::uint32_t> indegree;
  std::vector<graph::task_id> next_on_processor;
  std::vector<std::uint32_t> out_begin;
  std::vector<graph::task_id> out_to;
};

order_inputs order_inputs_of(const graph::task_graph& g) {
  const std::size_t n = g.task_count();
  order_inputs in;
  in.indegree.assign(n, 0);
  in.next_on_processor.assign(n, graph::no_task);
  in.out_begin.assign(n + 1, 0);
  std::vector<graph::task_id> last(g.processors.size(), graph::no_task);
  for (graph::task_id t = 0; t < n; ++t) {
    if (last[g.processor[t]] != graph::no_task) in.next_on_processor[last[g.processor[t]]] = t, ++in.indegree[t];
    last[g.processor[t]] = t;
  }
  for (const graph::edge& e : g.edges) ++in.indegree[e.to], ++in.out_begin[e.from + 1];
  for (std::size_t i = 0; i < n; ++i) in.out_begin[i + 1] += in.out_begin[i];
  in.out_to.resize(g.edges.size());
  std::vector<std::uint32_t> at(in.out_begin.begin(), in.out_begin.end() - 1);
  for (const graph::edge& e : g.edges) in.out_to[at[e.from]++] = e.to;
  return in;
}

// The order before 2026-11-29: Kahn's algorithm with every ready task in a min-heap of ids. The
// same order as topological_order, whose heap holds only the tasks released behind its scan.
void heap_order(std::vector<std::uint32_t>& indegree, const order_inputs& in, std::vector<graph::task_id>& ready,
                std::vector<graph::task_id>& order) {
  const auto first_added = std::greater<>{};
  ready.clear();
  for (graph::task_id t = 0; t < indegree.size(); ++t) {
    if (indegree[t] == 0) ready.push_back(t);
  }
  auto release = [&](graph::task_id u) {
    if (--indegree[u] == 0) ready.push_back(u), std::push_heap(ready.begin(), ready.end(), first_added);
  };
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), first_added);
    const graph::task_id t = ready.back();
    ready.pop_back();
    order.push_back(t);
    if (in.next_on_processor[t] != graph::no_task) release(in.next_on_processor[t]);
    for (std::uint32_t e = in.out_begin[t]; e < in.out_begin[t + 1]; ++e) release(in.out_to[e]);
  }
}

void BM_order(benchmark::State& state, const order_inputs* in, bool heap) {
  std::vector<std::uint32_t> indegree;
  std::vector<graph::task_id> ready, order;
  for (auto _ : state) {
    indegree = in->indegree;
    order.clear();
    if (heap) {
      heap_order(indegree, *in, ready, order);
    } else {
      graph::detail::topological_order(indegree, in->next_on_processor, in->out_begin, in->out_to, ready, order);
    }
    benchmark::DoNotOptimize(order.data());
  }
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * in->indegree.size()), benchmark::Counter::kIsRate);
}

void BM_breakdown(benchmark::State& state, const report::replay_session* s) {
  const auto times = s->simulated_times();
  for (auto _ : state) {
    for (const auto& p : s->plans) benchmark::DoNotOptimize(report::evaluate(p, times).split.total());
  }
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * s->compiled.size()), benchmark::Counter::kIsRate);
}

void BM_critical_path(benchmark::State& state, const report::replay_session* s) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        report::iteration_critical_path(s->built.graph, s->compiled, s->timeline, s->plans[0], s->ranks[0].simulated).segments.size());
  }
  state.counters["tasks_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * s->compiled.size()), benchmark::Counter::kIsRate);
}

void BM_build(benchmark::State& state, const trace::job* job) {
  std::size_t events = 0;
  for (const auto& r : job->ranks) events += r.events.size();
  for (auto _ : state) benchmark::DoNotOptimize(graph::build_graph(*job).graph.task_count());
  state.counters["events_per_second"] = benchmark::Counter(static_cast<double>(state.iterations() * events), benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lumos_bench::ratio_reporter reporter;
  static std::vector<std::unique_ptr<bench_graph>> graphs;
  static std::vector<std::unique_ptr<trace::job>> jobs;
  static std::vector<std::unique_ptr<report::replay_session>> sessions;
  const auto dir = lumos_bench::trace_dir();
  const std::vector<std::pair<std::string, std::filesystem::path>> real = {
      {"megatron_8rank_a100", dir / "astra-sim_megatron-gpt-tp8_8xA100"},
      {"owlv2_h100", dir / "tracelens_H100_B200/h100_google_owlv2-large-patch14-ensemble__1016001.json.gz"},
      {"df_index_resolver_v100", dir / "hta_testdata/df_index_resolver/df_index_resolver.json.gz"},
  };
  for (const auto& [name, path] : real) {
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "bench_replay: %s not found (set LUMOS_TRACE_DIR); skipped\n", path.string().c_str());
      continue;
    }
    auto* job = jobs.emplace_back(std::make_unique<trace::job>(trace::load_job({path}))).get();
    auto* b = graphs.emplace_back(std::make_unique<bench_graph>()).get();
    b->name = name;
    b->tasks = graph::build_graph(*job).graph;
    finish(*b);
    sessions.push_back(std::make_unique<report::replay_session>(report::replay_job(*job)));
    benchmark::RegisterBenchmark(("BM_build/" + name).c_str(), BM_build, job)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_breakdown/" + name).c_str(), BM_breakdown, sessions.back().get())->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_critical_path/" + name).c_str(), BM_critical_path, sessions.back().get())->Unit(benchmark::kMicrosecond);
    // Trace graphs are not in insertion order (a host wait comes before the GPU ops it waits
    // for), so their compile runs Kahn's algorithm: the scan against the heap of every ready task.
    static std::vector<std::unique_ptr<order_inputs>> orders;
    const order_inputs* in = orders.emplace_back(std::make_unique<order_inputs>(order_inputs_of(b->tasks))).get();
    {
      std::vector<std::uint32_t> a = in->indegree, h = in->indegree;
      std::vector<graph::task_id> ready, scanned, heaped;
      graph::detail::topological_order(a, in->next_on_processor, in->out_begin, in->out_to, ready, scanned);
      heap_order(h, *in, ready, heaped);
      if (scanned != heaped) {
        std::fprintf(stderr, "bench_replay: %s: topological_order differs from the heap's order\n", name.c_str());
        return 1;
      }
    }
    benchmark::RegisterBenchmark(("BM_order/" + name).c_str(), BM_order, in, false)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_order_heap/" + name).c_str(), BM_order, in, true)->Unit(benchmark::kMicrosecond);
    reporter.compare("BM_order/" + name, "BM_order_heap/" + name, "tasks_per_second");
  }
  for (const auto& [name, size] : {std::pair<std::string, std::size_t>{"generated_1e6", 1'000'000}, {"generated_1e7", 10'000'000}}) {
    auto* b = graphs.emplace_back(std::make_unique<bench_graph>()).get();
    b->name = name;
    b->tasks = generate(size, 8);
    finish(*b);
  }
  for (const auto& b : graphs) {
    benchmark::RegisterBenchmark(("BM_replay_reference/" + b->name).c_str(), BM_replay_reference, b.get())->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_replay/" + b->name).c_str(), BM_replay, b.get())->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_compile/" + b->name).c_str(), BM_compile, b.get())->Unit(benchmark::kMillisecond);
    reporter.compare("BM_replay/" + b->name, "BM_replay_reference/" + b->name, "tasks_per_second");
    std::fprintf(stderr, "graph %s: %zu tasks, %zu edges, compiled %.1f bytes/task + 8/edge\n", b->name.c_str(), b->compiled.size(),
                 b->compiled.edge_count(),
                 static_cast<double>(b->compiled.memory_bytes() - 8 * b->compiled.edge_count()) / static_cast<double>(b->compiled.size()));
  }
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}

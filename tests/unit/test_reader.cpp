// Reader behaviour on hand-made traces: one per trap of real Kineto traces (docs/reader.md).
#include "test_support.hpp"

#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/reader.hpp>
#include <lumos/trace/summary.hpp>

#include <catch2/catch.hpp>

#include <map>

using namespace lumos::trace;
using lumos_test::data_dir;

namespace {

rank_trace read_trap(const std::string& name, std::size_t window = 0) {
  read_options o;
  if (window != 0) o.window_bytes = window;
  return read_trace(data_dir() / "traps" / name, o);
}

const event& find(const rank_trace& t, std::string_view name) {
  for (const auto& e : t.events) {
    if (t.name(e) == name) return e;
  }
  FAIL("no event named " << name);
  return t.events.front();
}

std::size_t index_of(const rank_trace& t, std::string_view name) {
  return static_cast<std::size_t>(&find(t, name) - t.events.data());
}

// The reader's output is only half of each trap: the graph rule the trap is named after is
// checked on the graph (and, where the rule is about waiting, on a replay in which the awaited
// op is made longer, so that only a real dependency can move the waiter).
job one_rank(rank_trace&& t) {
  job j;
  j.ranks.push_back(std::move(t));
  return j;
}

lumos::graph::task_id task_of(const lumos::graph::built_job& b, const rank_trace& t, std::string_view name) {
  return b.ranks[0].task_of_event[index_of(t, name)];
}

std::size_t edges_between(const lumos::graph::built_job& b, lumos::graph::task_id from, lumos::graph::task_id to,
                          lumos::graph::edge_kind kind) {
  std::size_t n = 0;
  for (const auto& e : b.graph.edges) n += e.from == from && e.to == to && e.kind == kind;
  return n;
}

// Simulated [start, end) of the event named `name` after scaling the ops named `scaled` by `factor`.
std::pair<lumos::time_ns, lumos::time_ns> replayed(const job& j, std::string_view name, std::string scaled, double factor) {
  lumos::report::replay_options o;
  o.build.op_scales.push_back({std::move(scaled), factor});
  const auto s = lumos::report::replay_job(j, o);
  const auto task = s.built.ranks[0].task_of_event[index_of(j.ranks[0], name)];
  const auto times = s.simulated_times();
  return {times.begin_of(task) + s.built.origin, times.end_of(task) + s.built.origin};
}

}  // namespace

TEST_CASE("relative timestamps keep their base, even when it follows traceEvents", "[reader]") {
  const auto t = read_trap("relative_time_base_after.json");
  CHECK(t.base_ns == 1751410836000000000LL);
  const auto& step = find(t, "ProfilerStep#7");
  CHECK(step.ts == 1000500);
  CHECK(step.dur == 250250);
  CHECK(step.cat == category::user_annotation);
  const auto& mm = find(t, "aten::mm");
  CHECK(mm.ts == 1001001);
  CHECK(mm.dur == 20999);
  const auto i = index_of(t, "aten::mm");
  CHECK(t.arg_text(i, arg_key::input_dims) == "[[128, 64], [64, 32]]");
  CHECK(t.arg(i, arg_key::sequence_number) == 5);
  CHECK(t.arg(i, arg_key::fwd_thread_id) == 0);
  const auto& k = find(t, "gemm_kernel");
  CHECK(k.correlation == 77);
  CHECK(k.external_id == 2);
  CHECK(k.stream == 7);
  CHECK(k.device == 0);
  CHECK(t.arg_text(index_of(t, "gemm_kernel"), arg_key::grid) == "[4, 1, 1]");
  const auto steps = profiler_steps(t);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].number == 7);
}

TEST_CASE("absolute 16-digit timestamps with decimals are exact", "[reader]") {
  const auto t = read_trap("absolute_time.json");
  CHECK(t.base_ns == 0);
  CHECK(find(t, "ProfilerStep#2").ts == 1706850122846038123LL);
  CHECK(find(t, "ProfilerStep#2").dur == 603240001LL);
  CHECK(find(t, "aten::add").ts == 1706850122846039999LL);
}

TEST_CASE("kernels launched before the window are kept without a launch", "[reader]") {
  const auto t = read_trap("launched_before_window.json");
  auto launches_of = [&](std::int64_t correlation) {
    int n = 0;
    for (const auto& e : t.events) n += e.cat == category::cuda_runtime && e.correlation == correlation;
    return n;
  };
  const auto& early = find(t, "early_kernel");
  CHECK(early.cat == category::kernel);
  CHECK(early.correlation == 5);
  CHECK(launches_of(early.correlation) == 0);  // kept, though nothing in the trace launched it
  const auto& late = find(t, "late_kernel");
  CHECK(launches_of(late.correlation) == 1);  // while the kernel after it has its launch
  CHECK(summarize(t).gpu_ops == 2);
  // Graph rule: the early kernel is an op without a launch edge (it starts where it was seen);
  // the late one hangs off its launch call.
  const job j = one_rank(read_trap("launched_before_window.json"));
  const auto b = lumos::graph::build_graph(j);
  CHECK(b.stats.ops_without_launch == 1);
  std::size_t into_early = 0;
  for (const auto& e : b.graph.edges) into_early += e.to == task_of(b, t, "early_kernel") && e.kind == lumos::graph::edge_kind::launch;
  CHECK(into_early == 0);
  CHECK(edges_between(b, task_of(b, t, "cudaLaunchKernel"), task_of(b, t, "late_kernel"), lumos::graph::edge_kind::launch) == 1);
}

TEST_CASE("one CUDA graph launch correlates with many kernels", "[reader]") {
  const auto t = read_trap("cuda_graph.json");
  int kernels = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (t.events[i].cat != category::kernel) continue;
    ++kernels;
    CHECK(t.events[i].correlation == 42);
    CHECK(t.arg(i, arg_key::graph_id) == 1);
    CHECK(t.arg(i, arg_key::graph_node_id) >= 100);
  }
  CHECK(kernels == 3);
  // One launch call for all of them: the correlation is shared, not a one-to-one pairing.
  int launches = 0;
  for (const auto& e : t.events) {
    if (e.cat == category::cuda_runtime && e.correlation == 42) {
      ++launches;
      CHECK(t.name(e) == "cudaGraphLaunch");
    }
  }
  CHECK(launches == 1);
  // Graph rule: the one launch call launches all three kernels (not only the first).
  const job j = one_rank(read_trap("cuda_graph.json"));
  const auto b = lumos::graph::build_graph(j);
  CHECK(b.stats.graph_launch_ops == 3);
  CHECK(b.stats.ops_without_launch == 0);
  for (const char* k : {"k0", "k1", "k2"}) {
    CHECK(edges_between(b, task_of(b, t, "cudaGraphLaunch"), task_of(b, t, k), lumos::graph::edge_kind::launch) == 1);
  }
}

TEST_CASE("a stream wait without a recorded cudaEventRecord still reads", "[reader]") {
  const auto t = read_trap("wait_without_record.json");
  for (const auto& e : t.events) CHECK(t.name(e) != "cudaEventRecord");  // the trap's premise
  const auto& wait = find(t, "cudaStreamWaitEvent");
  CHECK(wait.cat == category::cuda_runtime);
  CHECK(wait.correlation == 2);
  // The producer and the consumer are on two streams, the consumer launched after the wait.
  CHECK(find(t, "producer").stream == 7);
  CHECK(find(t, "consumer").stream == 13);
  CHECK(find(t, "consumer").correlation == 3);
  CHECK(summarize(t).streams == 2);
  // Graph rule: the consumer still waits for the producer. Made 3x longer (30 -> 90 us, ending
  // at 110 us instead of 50 us), the producer pushes the consumer back by the same 60 us.
  const job j = one_rank(read_trap("wait_without_record.json"));
  const auto b = lumos::graph::build_graph(j);
  CHECK(b.stats.cross_stream_inferred + b.stats.cross_stream_implicit + b.stats.cross_stream_exact == 1);
  const auto [p0, p1] = replayed(j, "producer", "producer", 3.0);
  const auto [c0, c1] = replayed(j, "consumer", "producer", 3.0);
  CHECK(p1 - p0 == 90000);
  CHECK(c0 >= p1);
  CHECK(replayed(j, "consumer", "producer", 1.0).first == find(t, "consumer").ts + t.base_ns);
}

TEST_CASE("polling loops are ordinary runtime calls", "[reader]") {
  // (Which poll waited for the kernel is a graph rule, tested with the graph builder.)
  const auto t = read_trap("polling_loop.json");
  const auto& kernel = find(t, "long_kernel");
  int polls = 0;
  int after_kernel = 0;
  for (const auto& e : t.events) {
    if (t.name(e) != "cudaEventQuery") continue;
    ++polls;
    CHECK(e.cat == category::cuda_runtime);  // no special category or phase: plain calls
    CHECK(e.correlation != kernel.correlation);
    after_kernel += e.end() > kernel.end();
  }
  CHECK(polls == 4);
  CHECK(after_kernel == 1);  // only the last poll ends after the kernel: it is the one that succeeds
  // Graph rule: the run of polls is one wait for the kernel. The kernel made twice as long
  // (ending at 200 us instead of 100 us) moves the end of the wait past 200 us; the unchanged
  // replay ends it where it was measured (102 us).
  const job j = one_rank(read_trap("polling_loop.json"));
  const auto b = lumos::graph::build_graph(j);
  CHECK(b.stats.poll_waits == 1);
  const std::size_t last_poll = [&] {
    std::size_t last = 0;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      if (t.name(t.events[i]) == "cudaEventQuery") last = i;
    }
    return last;
  }();
  auto poll_end = [&](double factor) {
    lumos::report::replay_options o;
    o.build.op_scales.push_back({"long_kernel", factor});
    const auto s = lumos::report::replay_job(j, o);
    return s.simulated_times().end_of(s.built.ranks[0].task_of_event[last_poll]) + s.built.origin;
  };
  CHECK(poll_end(1.0) == t.events[last_poll].end() + t.base_ns);
  CHECK(poll_end(2.0) >= kernel.ts + t.base_ns + 200000);
}

TEST_CASE("traces without ProfilerStep have no steps", "[reader]") {
  CHECK(profiler_steps(read_trap("no_profiler_step.json")).empty());
}

TEST_CASE("sync rows take their stream from args, not tid", "[reader]") {
  const auto t = read_trap("sync_rows_offset_tid.json");
  const auto i = index_of(t, "Stream Wait Event");
  CHECK(t.events[i].cat == category::cuda_sync);
  CHECK(t.events[i].stream == 24);
  CHECK(t.lanes[t.events[i].lane].tid != 24);  // the trap: the row's tid is not its stream
  CHECK(t.arg(i, arg_key::wait_on_stream) == 20);
  CHECK(t.arg(i, arg_key::wait_on_event_record_correlation) == 31);
  CHECK(t.arg(i, arg_key::wait_on_event_id) == 9);
  const auto& rec = t.events[index_of(t, "cudaEventRecord") + 0];
  CHECK(rec.cat == category::cuda_runtime);
  bool saw_cuda_event = false;
  for (std::size_t j = 0; j < t.events.size(); ++j) {
    if (t.events[j].cat == category::cuda_event) {
      saw_cuda_event = true;
      CHECK(t.arg(j, arg_key::event_id) == 9);
      CHECK(t.events[j].stream == 20);
    }
  }
  CHECK(saw_cuda_event);
}

TEST_CASE("string pids, unknown categories and phases are counted, not errors", "[reader]") {
  const auto t = read_trap("string_ids_and_unknowns.json");
  CHECK(t.entries == 12);
  CHECK(t.metadata_entries == 2);
  CHECK(t.skipped_entries == 1);  // the "B" event
  const auto s = summarize(t);
  auto count = [&](std::string_view cat) {
    for (const auto& [c, n] : s.by_category) {
      if (c == cat) return n;
    }
    return std::uint64_t{0};
  };
  CHECK(count("some_future_category") == 1);
  CHECK(count("ac2g") == 2);
  CHECK(count("Trace") == 1);
  CHECK(count("cpu_op") == 3);  // includes the skipped "B" event: counts are per entry
  CHECK(find(t, "mystery").cat == category::other);
  const auto& span = find(t, "PyTorch Profiler (0)");
  CHECK(t.str(t.lanes[span.lane].pid_text) == "Spans");
  const auto& flow = find(t, "ac2g");
  CHECK(flow.ph == phase::flow_start);
  CHECK(flow.correlation == 77);
  CHECK(find(t, "child ends 1 ns after its parent").end() == find(t, "parent").end() + 1);
  const auto i = index_of(t, "float_arg");
  CHECK_FALSE(t.arg(i, arg_key::bytes).has_value());           // 1.5 is not an integer: dropped,
  CHECK_FALSE(t.arg(i, arg_key::sequence_number).has_value());  // and so is "12",
  CHECK(t.ignored_args == 2);                                   // but counted
  const auto& mystery = find(t, "mystery");
  CHECK(t.str(t.lanes[mystery.lane].thread_name) == "main thread");
  CHECK(t.str(t.lanes[mystery.lane].process_name) == "python");
}

TEST_CASE("names and categories met again are matched on their raw text only when nothing was escaped", "[reader]") {
  // The reader matches a repeated name or category on its raw JSON token; the text ab\ (read
  // from "ab\\") must not match the token "ab\"", which is the string ab" (it once did, for
  // categories: all three events were counted under ab\).
  const std::string text = R"({"traceEvents":[)"
                           R"({"ph":"X","cat":"ab\\","name":"k\\","pid":1,"tid":1,"ts":1,"dur":1},)"
                           R"({"ph":"X","cat":"ab\"","name":"k\"","pid":1,"tid":1,"ts":3,"dur":1},)"
                           R"({"ph":"X","cat":"ab\"","name":"k\"","pid":1,"tid":1,"ts":5,"dur":1},)"
                           R"({"ph":"X","cat":"kernel","name":"gemm","pid":1,"tid":1,"ts":7,"dur":1},)"
                           R"({"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":9,"dur":1},)"
                           R"({"ph":"X","cat":"kernel","name":"gemm","pid":1,"tid":1,"ts":11,"dur":1}]})";
  const auto t = read_trace_bytes(text, "escapes");
  REQUIRE(t.events.size() == 6);
  CHECK(t.str(t.events[0].cat_name) == "ab\\");
  CHECK(t.str(t.events[0].name) == "k\\");
  for (const std::size_t i : {1, 2}) {
    CHECK(t.str(t.events[i].cat_name) == "ab\"");
    CHECK(t.str(t.events[i].name) == "k\"");
  }
  CHECK(t.events[5].name == t.events[3].name);  // the same id, through the raw match
  CHECK(t.events[5].cat_name == t.events[3].cat_name);
  CHECK(t.str(t.events[4].name) == "cudaLaunchKernel");
  const auto s = summarize(t);
  std::map<std::string, std::uint64_t> by_category(s.by_category.begin(), s.by_category.end());
  CHECK(by_category["ab\\"] == 1);
  CHECK(by_category["ab\""] == 2);
  CHECK(by_category["kernel"] == 2);
}

TEST_CASE("collective args, process groups and device properties are read", "[reader]") {
  const auto t = read_trap("collectives.json");
  REQUIRE(t.process_groups.size() == 2);
  CHECK(t.process_groups[0].ranks == std::vector<int>{0, 1});
  CHECK(t.process_groups[1].description == "tp");
  CHECK(t.world_size == 2);
  CHECK(t.rank == 0);
  REQUIRE(t.devices.size() == 1);
  CHECK(t.devices[0].num_sms == 132);
  const auto i = index_of(t, "record_param_comms");
  CHECK(t.arg_text(i, arg_key::collective_name) == "allreduce");
  CHECK(t.arg(i, arg_key::in_msg_nelems) == 1048576);
  CHECK(t.arg_text(i, arg_key::process_group_ranks) == "[0, 1]");
  CHECK(t.arg(i, arg_key::collective_seq) == 17);
  CHECK(t.arg(i, arg_key::collective_rank) == 0);
  const auto s = summarize(t);
  CHECK(s.gpu_ops == 3);
  CHECK(s.comm_ops == 2);  // NCCL and symmetric-memory all-reduce; not the memcpy
  CHECK(s.device == "NVIDIA H100 80GB HBM3");
  CHECK(t.arg(index_of(t, "Memcpy DtoD (Device -> Device)"), arg_key::bytes) == 4096);
}

TEST_CASE("the result does not depend on the window size, the format or the thread count", "[reader]") {
  // A trace with many events, some larger than the smallest window.
  std::string text = R"({"schemaVersion": 1, "traceEvents": [)";
  for (int i = 0; i < 3000; ++i) {
    if (i > 0) text += ",\n";
    text += R"({"ph": "X", "cat": "cpu_op", "name": "op_)" + std::to_string(i % 17) + R"(", "pid": 1, "tid": )" +
            std::to_string(i % 3) + R"(, "ts": )" + std::to_string(1000 + i) + "." + std::to_string(i % 1000) +
            R"(, "dur": 1.5, "args": {"External id": )" + std::to_string(i) + R"(, "Input Dims": [[)" +
            std::string(i % 97 == 0 ? 6000 : 3, '1') + "]]}}";
  }
  text += R"(], "distributedInfo": {"rank": 1, "world_size": 2}, "baseTimeNanoseconds": 5})";
  auto fingerprint = [](const rank_trace& t) {
    std::vector<std::tuple<long, long, std::string, long, std::string>> v;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      const auto& e = t.events[i];
      v.emplace_back(e.ts, e.dur, std::string(t.name(e)), e.external_id, std::string(t.arg_text(i, arg_key::input_dims)));
    }
    return v;
  };
  const auto reference = read_trace_bytes(text, "ref", {std::size_t{64} << 20});
  REQUIRE(reference.events.size() == 3000);
  CHECK(reference.base_ns == 5);
  CHECK(reference.rank == 1);
  for (std::size_t window : {std::size_t{4096}, std::size_t{5000}, std::size_t{65536}}) {
    INFO("window " << window);
    CHECK(fingerprint(read_trace_bytes(text, "w", {window})) == fingerprint(reference));
    CHECK(fingerprint(read_trace_bytes(lumos_test::gzip(text), "gz", {window})) == fingerprint(reference));
  }
  // Nor on how events are batched: one event per batch, a few, most of a window.
  for (std::size_t batch : {std::size_t{1}, std::size_t{300}, std::size_t{3000}, std::size_t{60000}}) {
    INFO("batch " << batch);
    lumos::trace::read_options o;
    o.window_bytes = 65536;
    o.batch_bytes = batch;
    CHECK(fingerprint(read_trace_bytes(text, "b", o)) == fingerprint(reference));
  }
  // Two concatenated gzip members read as one stream, like gzip -d.
  const std::string half = text.substr(0, text.size() / 2);
  CHECK(fingerprint(read_trace_bytes(lumos_test::gzip(half) + lumos_test::gzip(text.substr(half.size())), "multi")) ==
        fingerprint(reference));
  // No newlines at all (minified JSON) reads the same.
  std::string minified = text;
  std::replace(minified.begin(), minified.end(), '\n', ' ');
  CHECK(fingerprint(read_trace_bytes(minified, "min", {4096})) == fingerprint(reference));
}

TEST_CASE("a job is a directory or a list of files, and ranks come from distributedInfo, name or order", "[reader][job]") {
  lumos_test::temp_dir dir;
  const std::string no_info = R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]})";
  const std::string with_info = R"({"distributedInfo": {"rank": 5}, "traceEvents": []})";
  dir.write("trace_rank-2.json", no_info);
  dir.write("worker7_step_12.1694128201556.pt.trace.json.gz", lumos_test::gzip(no_info));
  dir.write("zzz.json", with_info);
  dir.write("notes.txt", "not a trace");
  for (unsigned threads : {1U, 3U}) {
    load_options opt;
    opt.threads = threads;
    const job j = load_job({dir.path()}, opt);
    REQUIRE(j.ranks.size() == 3);
    CHECK(j.ranks[0].rank == 2);
    CHECK(j.ranks[0].origin == rank_origin::file_name);
    CHECK(j.ranks[1].rank == 5);
    CHECK(j.ranks[1].origin == rank_origin::distributed_info);
    CHECK(j.ranks[2].rank == 7);
  }
  CHECK(rank_from_file_name("megatron_kineto_3.json.gz") == 3);
  CHECK(rank_from_file_name("rank12.json") == 12);
  CHECK(rank_from_file_name("Rank_4_trace.json") == 4);
  CHECK(rank_from_file_name("worker1_step_12.1694128201556.pt.trace.json.gz") == 1);
  CHECK_FALSE(rank_from_file_name("trace.json").has_value());
  CHECK_FALSE(rank_from_file_name("h100_model__1016001.json.gz").has_value());
  // Files without any rank information take their position in the list.
  const auto a = dir.write("a.json", no_info);
  const auto b = dir.write("b.json", no_info);
  const job j = load_job({a, b});
  CHECK(j.ranks[0].rank == 0);
  CHECK(j.ranks[1].rank == 1);
  CHECK(j.ranks[1].origin == rank_origin::order);
}

TEST_CASE("events are stored compactly: at most 96 bytes per entry, little spare capacity", "[reader]") {
  // sizeof(event) is a static_assert in event.hpp; what matters is the whole store per event:
  // events, args, lanes and strings, as reserved from the size hint and trimmed at the end.
  std::string text = R"({"traceEvents": [)";
  constexpr int n = 20000;
  for (int i = 0; i < n; ++i) {
    if (i > 0) text += ",\n";
    text += R"({"ph": "X", "cat": "kernel", "name": "gemm_)" + std::to_string(i % 50) + R"(", "pid": 0, "tid": 7, "ts": )" +
            std::to_string(1000 + 2 * i) + R"(, "dur": 1, "args": {"device": 0, "stream": 7, "correlation": )" +
            std::to_string(i) + "}}";
  }
  text += "]}";
  for (const std::string& bytes : {text, lumos_test::gzip(text)}) {
    const auto t = read_trace_bytes(bytes, "compact");
    REQUIRE(t.events.size() == static_cast<std::size_t>(n));
    INFO("capacity " << t.events.capacity() << ", memory " << t.memory_bytes() << " B");
    // Spare capacity (a reservation that overshot, or vector growth) is at most 10 %.
    CHECK(t.events.capacity() >= t.events.size());
    CHECK(t.events.capacity() <= t.events.size() + t.events.size() / 10 + 64);
    // The docs promise at most 96 bytes per traceEvents entry, names and args included.
    CHECK(t.memory_bytes() <= 96 * t.entries);
    CHECK(t.memory_bytes() >= t.events.size() * sizeof(event));
  }
}

// profile_memory=True writes a `[memory]` instant event per allocation and free, with the
// allocator's totals after it; host allocations (Device Id -1) do not count toward the GPU's.
TEST_CASE("the profiler's memory events give the measured peak", "[reader][memory]") {
  const auto t = read_trap("memory_events.json");
  const auto p = lumos::trace::measured_memory_peak(t);
  REQUIRE(p.has_value());
  CHECK(p->events == 3);
  CHECK(p->allocated == 3145728);
  CHECK(p->reserved == 8388608);
  CHECK(p->at == find(t, "gemm_kernel").ts + 20'000);
  CHECK(p->device == 0);
  CHECK(summarize(t).memory.has_value());
  CHECK_FALSE(lumos::trace::measured_memory_peak(read_trap("launched_before_window.json")).has_value());
  // The graph keeps its tasks: memory events are not operations.
  const job j = one_rank(read_trap("memory_events.json"));
  CHECK(lumos::graph::build_graph(j).stats.ops_without_launch == 0);
}

// The replay reads the memory peak with the steps, before it frees the events.
TEST_CASE("replay reports the measured memory peak of the profiler's memory events", "[reader][memory]") {
  const job j = one_rank(read_trap("memory_events.json"));
  const auto steps = lumos::report::find_steps(j);
  REQUIRE(steps.size() == 1);
  REQUIRE(steps[0].memory.has_value());
  CHECK(steps[0].memory->allocated == 3145728);
  const auto s = lumos::report::replay_job(j);
  REQUIRE(s.ranks.size() == 1);
  REQUIRE(s.ranks[0].measured_memory.has_value());
  CHECK(s.ranks[0].measured_memory->reserved == 8388608);
}

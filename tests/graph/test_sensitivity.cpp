// Small traces written by the project where each dependency kind matters; the predicted
// iteration under compute=2, comm=2 and cpu=2 is derived by hand in the comments (all times in
// µs). The replay contract is docs/replay.md's: starts are max(processor free + idle gap,
// predecessors) + busy CPU time; a GPU op waits for its launch call's start plus the launch
// latency and for its stream predecessor plus the stream's inter-kernel gap; the constraint
// that bound it in the measurement keeps its measured delay, the others their typical value
// (the median over the trace's idle-stream launches and queued kernels; 2 µs when a trace has
// no queued kernel); blocking calls end at max(start, awaited end) + r, r unscaled (an
// overhead); the busy part of a step annotation's lead and tail scales with the CPU;
// collectives end at the last arrival plus the shortest transfer.
#include "../unit/test_support.hpp"

#include <lumos/report/replay_report.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

using namespace lumos;

namespace {

trace::job load(const std::string& name) { return trace::load_job({lumos_test::data_dir() / "sensitivity" / name}); }

// Simulated iteration time of the slowest rank, in µs.
double predict(const trace::job& job, graph::scales s, graph::build_options b = {}) {
  report::replay_options o;
  o.scales = s;
  o.build = b;
  return static_cast<double>(report::replay_job(job, o).simulated_ns) / 1000.0;
}

constexpr graph::scales unchanged{};
constexpr graph::scales compute2{.compute = 2.0, .comm = 1.0, .cpu = 1.0};
constexpr graph::scales comm2{.compute = 1.0, .comm = 2.0, .cpu = 1.0};
constexpr graph::scales cpu2{.compute = 1.0, .comm = 1.0, .cpu = 2.0};

}  // namespace

TEST_CASE("launch latency, stream order, CPU busy time and a blocking sync", "[sensitivity]") {
  // CPU: op1 [0,20] ⊃ L1 [5,10]; op2 [30,50] ⊃ L2 [35,40]; op3 [60,80] ⊃ L3 [65,70];
  // cudaStreamSynchronize [90,316]. GPU stream 7: K1 [12,112] (launch-bound, latency 7),
  // K2 [113,213] and K3 [214,314] (stream-bound, gap 1). The sync waits for K3, r = 2.
  // Window: ProfilerStep [0,320]; lead 5 before L1, tail 4 after the sync. Measured 320.
  const auto job = load("launch_stream_sync.json");
  CHECK(predict(job, unchanged) == 320.0);
  // compute=2: K1 [12,212], K2 [213,413], K3 [414,614]; sync ends 616; window end 620.
  CHECK(predict(job, compute2) == 620.0);
  // cpu=2: busy doubles (5, 15, 15, 10) and calls take 10: L1 [10,20], L2 [60,70], L3 [110,120],
  // sync starts 150 (own time 4). K1 [17,117] (L1 start + 7), K2 [118,218], K3 [219,319]; the
  // sync ends at 319 + 2 = 321. The lead [0,5] lies inside op1, busy: it doubles too. Window
  // [10 − 10, 321 + 4] = 325: the GPU still sets the pace; only the CPU lead grew.
  CHECK(predict(job, cpu2) == 325.0);
  CHECK(predict(job, comm2) == 320.0);
  // compute=0.5: K1 [12,62]; K2 max(62 + 1, L2 35 + 7) = 63 → [63,113]; K3 [114,164]; sync
  // ends 166; window end 170.
  CHECK(predict(job, {.compute = 0.5, .comm = 1.0, .cpu = 1.0}) == 170.0);
}

TEST_CASE("synchronize calls that did not block still wait when the GPU gets slower", "[sensitivity]") {
  // CPU: op1 [0,20] ⊃ L1 [5,10] → K1 s7 [12,62]; op2 [30,50] ⊃ L2 [35,40] → K2 s20 [42,72];
  // cudaStreamSynchronize [80,84] on s7 (its cuda_sync row), cudaDeviceSynchronize [100,103]
  // (no row). Both began after the device was done, so neither blocked: each call's whole time
  // is its own time after the wait. Window: ProfilerStep [0,120], tail 17 after the last call.
  const auto job = load("nonblocking_sync.json");
  CHECK(report::replay_job(job).built.stats.blocking_calls == 2);
  CHECK(predict(job, unchanged) == 120.0);
  // compute=3: K1 [12,162], K2 [42,132]. The stream sync waits for K1: [80, 162 + 4 = 166]; the
  // device sync keeps its idle gap of 16 and waits for both streams: [182, 185]; window 202.
  // (Before, a call that had not blocked had no edge from the GPU: it returned at 84 and 103,
  // and the window ended with K1 at 162.)
  CHECK(predict(job, {.compute = 3.0, .comm = 1.0, .cpu = 1.0}) == 202.0);
}

TEST_CASE("short launch-bound kernels: the CPU sets the pace", "[sensitivity]") {
  // CPU: op_i [20i, 20i+15] ⊃ L_i [20i+5, 20i+10]; sync [80,84] waits for K3 (r = 2).
  // K_i [20i+12, 20i+22], each launch-bound (latency 7). Window [0,100]: lead 5 (busy, inside
  // op0), tail 16 (idle). No kernel was queued: the stream gap is the default 2.
  const auto job = load("cpu_bound.json");
  CHECK(predict(job, unchanged) == 100.0);
  // cpu=2: L0 [10,20], L1 max(20+5)+20 = 45 → [45,55], L2 [80,90], L3 [115,125], sync starts
  // 125 + 5 + 10 = 140, ends 140 + r = 142 (K3 [122,132] + 2 = 134 is earlier). Window
  // [10 − 2·5, 142 + 16] = 158.
  CHECK(predict(job, cpu2) == 158.0);
  // compute=2: the kernels now queue, 2 apart: K0 [12,32], K1 max(25 + 7, 32 + 2) → [34,54],
  // K2 [56,76], K3 [78,98]; sync ends 100; window end 116.
  CHECK(predict(job, compute2) == 116.0);
}

TEST_CASE("a cross-stream record/wait makes the compute stream wait for communication", "[sensitivity]") {
  // Calls: L0 [5,10] → K0 s7 [12,112]; record [15,17]; wait [20,22]; L1 [25,30] → NCCL s20
  // [113,263] (waits for K0); record [35,37]; L2 [40,45] → K2 s7 [113,213]; wait [50,52];
  // L3 [55,60] → K3 s7 [264,314] (waits for the NCCL kernel); sync [70,316] waits for K3.
  // No cuda_sync rows: the pairing is inferred from launch order. The NCCL kernel has no
  // partner rank here, so it keeps its duration (scaled by comm). Window [0,320].
  const auto job = load("cross_stream.json");
  CHECK(predict(job, unchanged) == 320.0);
  // comm=2: NCCL [113,413]; K3 waits for it: [414,464]; sync ends 466; window end 470.
  CHECK(predict(job, comm2) == 470.0);
  // compute=2: K0 [12,212]; NCCL [213,363]; K2 [213,413]; K3 max(413 + 1, 363 + 1) →
  // [414,514] (the stream's gap is 1, from K2, the one kernel that queued); sync ends 516;
  // window end 520.
  CHECK(predict(job, compute2) == 520.0);
  // cpu=2 (no operators, so no busy time; calls take twice as long): the GPU sets the pace.
  CHECK(predict(job, cpu2) == 320.0);
  // Without the cross-stream rule K3 would not wait for the slower transfer: it keeps its
  // measured gap after K2 ([264,314]); only the NCCL kernel itself ([113,413]) stretches the
  // window, to 413 instead of 470.
  graph::build_options no_cross_stream;
  no_cross_stream.cross_stream = false;
  CHECK(predict(job, unchanged, no_cross_stream) == 320.0);
  CHECK(predict(job, comm2, no_cross_stream) == 413.0);
}

TEST_CASE("a backward thread that starts after the forward thread hands off", "[sensitivity]") {
  // Thread 1: forward0 [0,20] ⊃ L0 [5,10]; forward1 [20,40] ⊃ L1 [25,30]; device sync [300,314].
  // Thread 2: backward0 [200,220] ⊃ L2 [205,210]; backward1 [220,240] ⊃ L3 [225,230].
  // Stream 7: F0 [12,62], F1 [62,112], B0 [212,262], B1 [262,312]; the sync waits for B1.
  // Hand-offs: L2 follows L1 (thread 2 starts after 200 µs idle) with delay 200 − 30 = 170; the
  // sync follows thread 2's end (240) with delay 290 − 240 = 50. Window [0,320]: lead 5 (busy,
  // inside forward0), tail 6 (idle). The sync's tail r = 2.
  const auto job = load("handoff.json");
  CHECK(predict(job, unchanged) == 320.0);
  // cpu=2: L0 [10,20], L1 [50,60]; L2 max(60 + 170) + 10 = 240, L3 [280,290], thread 2 ends
  // 310; the sync starts max(60, 310 + 50) + 20 = 380 and ends 382. GPU: F0 [17,67],
  // F1 [67,117], B0 [247,297], B1 [297,347]. Window [10 − 10, 382 + 6] = 388.
  CHECK(predict(job, cpu2) == 388.0);
  // compute=2: F0 [12,112], F1 [112,212], B0 [212,312], B1 [312,412]; the sync ends 414;
  // window end 420.
  CHECK(predict(job, compute2) == 420.0);
  // Without hand-offs thread 2 would keep its own 200 µs gap: L2 = 200 + 10 = 210, and so on.
  graph::build_options no_handoff;
  no_handoff.handoff_threshold = std::numeric_limits<time_ns>::max();
  CHECK(predict(job, unchanged, no_handoff) == 320.0);
  CHECK(predict(job, cpu2, no_handoff) != 388.0);
}

TEST_CASE("an all-reduce joins two ranks: it ends at the last arrival plus the transfer", "[sensitivity]") {
  // Rank r: L0 [5,10] → gemm s7 [12, 12 + C_r] (C_0 = 100, C_1 = 150); record/wait; L1 [25,30]
  // → NCCL s20: rank 0 [113,213] (waits 50 for rank 1), rank 1 [163,213]; sync [40,215].
  // Matched by process group "0" + sequence; transfer = min(100, 50) = 50. Window [0,220].
  const auto job = trace::load_job({lumos_test::data_dir() / "sensitivity" / "allreduce_2ranks"});
  const auto replay = report::replay_job(job);
  REQUIRE(replay.built.stats.collectives_matched == 1);
  for (const auto& r : replay.ranks) CHECK(r.simulated_ns == 220'000);
  // compute=2: gemms end 212 and 312; the join is at 313; both end 363; syncs end 365; 370.
  CHECK(predict(job, compute2) == 370.0);
  // comm=2: transfer 100; both end 263; syncs end 265; 270.
  CHECK(predict(job, comm2) == 270.0);
  // cpu=2: calls take longer but the arrivals stay at 113 and 163: 220.
  CHECK(predict(job, cpu2) == 220.0);
  // Without the join, rank 0's kernel would keep its own 100 µs (which included waiting):
  // under compute=2 it starts at 213 and ends at 313, not 363.
  graph::build_options no_join;
  no_join.match_collectives = false;
  const auto unjoined = [&] {
    report::replay_options o;
    o.scales = compute2;
    o.build = no_join;
    return report::replay_job(job, o);
  }();
  CHECK(unjoined.ranks[0].simulated_ns == 320'000);
  CHECK(unjoined.ranks[1].simulated_ns == 370'000);
}

TEST_CASE("an event-query poll is one wait: it ends when the kernel does, however many queries ran", "[sensitivity]") {
  // CPU: op0 [0,10] ⊃ L0 [2,7] → K0 s7 [10,110] (latency 8); six cudaEventQuery calls at 20,
  // 40, ..., 115 — the last, at 115, succeeds: the run [20,116] waits for K0, r = 116 − 110 = 6.
  // op1 [120,130] ⊃ L1 [122,127] → K1 [130,230] (latency 8); cudaStreamSynchronize [140,232]
  // waits for K1 (r = 2). Window [0,235]: lead 2 (busy), tail 3 (idle). Both kernels were
  // launched onto an idle stream: latency 8, no queued kernel (gap 2).
  const auto job = load("polling.json");
  CHECK(predict(job, unchanged) == 235.0);
  // compute=0.5: K0 [10,60]; the poll ends max(20 + 6, 60 + 6) = 66 (five fewer queries would
  // have run); L1 = 66 + 4 idle + 2 busy = 72, K1 [80,130]; the sync starts 77 + 10 + 3 = 90,
  // ends 132; window end 135.
  CHECK(predict(job, {.compute = 0.5, .comm = 1.0, .cpu = 1.0}) == 135.0);
  // compute=2: K0 [10,210]; poll ends 216; L1 [222,227]; K1 [230,430]; sync ends 432; 435.
  CHECK(predict(job, compute2) == 435.0);
  // cpu=2: L0 [4,14] (lead 2 → 4); K0 [12,112]; the poll starts 14 + 10 + 6 = 30, ends 118;
  // L1 [126,136]; K1 [134,234]; the sync starts 152, ends 236; window [0, 239].
  CHECK(predict(job, cpu2) == 239.0);
}

TEST_CASE("a synchronous copy queued behind a kernel waits for it: the wait moves with the GPU", "[sensitivity]") {
  // CPU: op0 [0,10] ⊃ L0 [2,7] → K0 s7 [10,110] (latency 8); aten::item [12,125] ⊃ cudaMemcpy
  // [14,115] whose own copy runs [111,112] on s7 (queued behind K0: gap 1; the stream's gap is 1,
  // its idle-launch latency 8). The call issues the copy in [14,22] (a launch latency) and waits
  // until 112, returning 3 later. op2 [120,130] ⊃ L2 [122,127] → K2 [130,180];
  // cudaStreamSynchronize [140,182] (r = 2). Window [0,185]: lead 2 (busy), tail 3.
  const auto job = load("sync_copy.json");
  CHECK(predict(job, unchanged) == 185.0);
  // compute=0.5: K0 [10,60]; copy [61,61.5]; the call returns 64.5; L2 [71.5,76.5] (7 busy);
  // K2 [79.5,104.5]; the sync starts 89.5, ends 106.5; window end 109.5.
  CHECK(predict(job, {.compute = 0.5, .comm = 1.0, .cpu = 1.0}) == 109.5);
  // cpu=2: L0 [4,14]; K0 [12,112]; issue [26,42] (2 idle + 10 busy, 16 own); copy [113,114];
  // returns 117; L2 [131,141]; K2 [139,189]; the sync starts 157, ends 191; window [0,194].
  CHECK(predict(job, cpu2) == 194.0);
}

TEST_CASE("a CUDA graph launch: its kernels follow each other, not the launch", "[sensitivity]") {
  // CPU: op0 [0,10] ⊃ cudaGraphLaunch [2,8] → G1 [12,52], G2 [53,93], G3 [94,134] on s7 (one
  // correlation; latency 10, gap 1); cudaStreamSynchronize [20,136] waits for G3 (r = 2).
  // Window [0,140]: lead 2 (busy), tail 4.
  const auto job = load("cuda_graph.json");
  CHECK(predict(job, unchanged) == 140.0);
  // compute=0.5: G1 [12,32], G2 [33,53], G3 [54,74]; sync ends 76; window end 80.
  CHECK(predict(job, {.compute = 0.5, .comm = 1.0, .cpu = 1.0}) == 80.0);
  // compute=2: G1 [12,92], G2 [93,173], G3 [174,254]; sync ends 256; window end 260.
  CHECK(predict(job, compute2) == 260.0);
}

TEST_CASE("cross-stream pairing: exact from cuda_sync rows, found from timing without them", "[sensitivity]") {
  // CPU: L0 [2,7] → A s7 [10,110]; L1 [9,12] → B s20 [20,40]; L5 [14,17] → D s30 [22,82];
  // cudaEventRecord [20,22] records on s7 (after A); cudaStreamWaitEvent [25,27] makes s20 wait;
  // L6 [30,35] → C s20 [111,131]; cudaDeviceSynchronize [40,133] (r = 2). Window [0,135].
  // With the cuda_sync row the pair A → C is exact. Without it the record's stream is inferred
  // from the last launch (D, on s30), which cannot explain C's start; the delay beyond the
  // stream's typical gap finds A, which ended 1 before C started.
  const auto exact = load("pairing_exact.json");
  const auto inferred = load("pairing_inferred.json");
  const auto e = report::replay_job(exact);
  const auto i = report::replay_job(inferred);
  CHECK(e.built.stats.cross_stream_exact == 1);
  CHECK(e.built.stats.cross_stream_implicit == 0);
  CHECK(i.built.stats.cross_stream_inferred == 1);
  CHECK(i.built.stats.cross_stream_implicit == 1);
  CHECK(predict(exact, unchanged) == 135.0);
  CHECK(predict(inferred, unchanged) == 135.0);
  // compute=2: A [10,210]; C waits for it: [211,251]; the sync ends 253; window end 255.
  CHECK(predict(exact, compute2) == 255.0);
  CHECK(predict(inferred, compute2) == 255.0);
  // Without pairing and without the timing rule, C keeps its measured 71 µs gap after B:
  // [131,171]; the sync ends 212; 214.
  graph::build_options blind;
  blind.cross_stream = false;
  blind.implicit_waits = false;
  CHECK(predict(inferred, compute2, blind) == 214.0);
}

TEST_CASE("clock skew: the joins of collectives imply each rank's offset, which --align-clocks applies", "[sensitivity][clocks]") {
  // The all-reduce job above with rank 1's clock 100 µs ahead: its kernel "starts" at 263, after
  // rank 0's ended (213). The smallest shift that makes the join causal is −50 µs on rank 1.
  auto job = trace::load_job({lumos_test::data_dir() / "sensitivity" / "allreduce_2ranks"});
  const auto aligned_before = graph::build_graph(job);
  CHECK(aligned_before.stats.causality_violations == 0);
  CHECK(aligned_before.stats.clock_offsets == std::vector<time_ns>{0, 0});
  for (auto& r : job.ranks) {
    if (r.rank == 1) r.base_ns += 100'000;
  }
  const auto skewed = graph::build_graph(job);
  REQUIRE(skewed.stats.clock_offsets_consistent);
  CHECK(skewed.stats.causality_violations == 1);
  CHECK(skewed.stats.worst_violation == 50'000);
  const std::size_t one = job.ranks[0].rank == 1 ? 0 : 1;
  CHECK(skewed.stats.clock_offsets[one] == -50'000);
  CHECK(skewed.stats.clock_offsets[1 - one] == 0);
  graph::build_options align;
  align.align_clocks = true;
  const auto fixed = graph::build_graph(job, align);
  CHECK(fixed.stats.clocks_aligned);
  CHECK(fixed.stats.causality_violations == 0);
  // The estimate is the smallest shift that makes the joins causal, a bound on the skew (the
  // true one here is −100 µs): aligned, rank 1 arrives exactly when rank 0's kernel ends.
  CHECK(fixed.graph.observed_start[fixed.graph.collectives.front().join] ==
        fixed.graph.observed_end[fixed.graph.collectives.front().complete[job.ranks[0].rank == 1 ? 1 : 0]]);
}

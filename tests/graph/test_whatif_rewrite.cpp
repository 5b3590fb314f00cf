// Graph rewrites of the trace-driven what-if (include/lumos/whatif/): repeating and removing task
// groups, the GPU change, and the whatif driver's identity on the trace's own configuration.
#include "../unit/test_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

using namespace lumos;
using namespace lumos::graph;

namespace {

// A CPU thread launching A, B, C onto one stream: L_x [10k, 10k + 5], each op 100 long.
struct three_launches {
  task_graph g;
  processor_id cpu = g.add_processor({processor_kind::cpu_thread, 0, 1, 1, "cpu"});
  processor_id gpu = g.add_processor({processor_kind::gpu_stream, 0, 0, 7, "stream 7"});
  task_id la = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 5, .name = "launch A"});
  task_id lb = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 5, .idle_gap = 5, .name = "launch B"});
  task_id lc = g.add_task({.kind = task_kind::cpu, .processor = cpu, .duration = 5, .idle_gap = 5, .name = "launch C"});
  task_id a = g.add_task({.kind = task_kind::gpu_compute, .processor = gpu, .duration = 100, .name = "ampere_bf16_s16816gemm_bf16_128x128"});
  task_id b = g.add_task({.kind = task_kind::gpu_compute, .processor = gpu, .duration = 100, .name = "vectorized_elementwise_kernel"});
  task_id c = g.add_task({.kind = task_kind::gpu_compute, .processor = gpu, .duration = 100, .name = "C"});
  three_launches() {
    g.add_edge(la, a, 5, edge_kind::launch, edge_flags::from_start);
    g.add_edge(lb, b, 5, edge_kind::launch, edge_flags::from_start);
    g.add_edge(lc, c, 5, edge_kind::launch, edge_flags::from_start);
  }
};

time_ns makespan(const task_graph& g) {
  const compiled_graph c = compile(g);
  sim::replay_engine e;
  sim::makespan_only m;
  return e.run(c, m);
}

}  // namespace

TEST_CASE("repeat_groups: a group repeated in place keeps its edges in every copy", "[whatif][rewrite]") {
  three_launches x;
  // Unchanged: A [5,105], B [105,205] (launched at 10 + 5 = 15: queued), C [205,305].
  CHECK(makespan(x.g) == 305);
  // B with its launch, three times: the copies follow each other on both processors; each copy
  // of B waits for its own launch copy. A [5,105], B1..B3 [105,405], C [405,505].
  const whatif::edited_graph e = whatif::repeat_groups(x.g, {{{x.lb, x.b}, 3}});
  CHECK(e.graph.task_count() == 10);
  CHECK(e.added == 4);
  CHECK(e.copies[x.b].size() == 3);
  CHECK(e.copies[x.lb].size() == 3);
  std::size_t launch_edges = 0;
  for (const auto& ed : e.graph.edges) launch_edges += ed.kind == edge_kind::launch;
  CHECK(launch_edges == 5);
  CHECK(makespan(e.graph) == 505);
  // Removed: C follows A (its launch at 10 + 5 + 5 = 20 → 25; stream free at 105).
  const whatif::edited_graph r = whatif::repeat_groups(x.g, {{{x.lb, x.b}, 0}});
  CHECK(r.graph.task_count() == 4);
  CHECK(r.removed == 2);
  CHECK(r.edges_dropped == 1);
  CHECK(makespan(r.graph) == 205);
  // Identity: every group once.
  CHECK(makespan(whatif::repeat_groups(x.g, {{{x.la, x.a}, 1}, {{x.lb, x.b}, 1}}).graph) == 305);
}

TEST_CASE("repeat_groups: what waited for a removed kernel waits for the kernel its stream ran before it", "[whatif][rewrite]") {
  // A send (on another stream) waits for the last kernel of a pass, C; removing C's layer (L_C, C)
  // once dropped that edge, and the send ran while the pass's other kernels still did (a
  // Llama-3-8B PP 2 job made 16 of its 32 layers: -2.09 % against the job written with 16).
  three_launches x;
  const processor_id p2p = x.g.add_processor({processor_kind::gpu_stream, 0, 0, 21, "stream 21"});
  const task_id send = x.g.add_task({.kind = task_kind::gpu_comm, .processor = p2p, .duration = 10, .name = "send"});
  x.g.add_edge(x.c, send, 0, edge_kind::cross_stream);
  // Unchanged: C [205,305], the send [305,315].
  CHECK(makespan(x.g) == 315);
  const whatif::edited_graph r = whatif::repeat_groups(x.g, {{{x.lc, x.c}, 0}});
  CHECK(r.removed == 2);
  CHECK(r.edges_bridged == 1);  // C -> send now leaves B
  CHECK(r.edges_dropped == 1);  // L_C -> C, both removed
  // B [105,205], then the send [205,215]; without the bridge it ran at 0.
  CHECK(makespan(r.graph) == 215);
  const task_id kept_send = r.first(send);
  bool from_b = false;
  for (const auto& e : r.graph.edges) from_b = from_b || (e.to == kept_send && e.from == r.first(x.b) && e.kind == edge_kind::cross_stream);
  CHECK(from_b);
}

TEST_CASE("repeat_groups: a task before the group's run on its thread waits for the first copy, not the last",
          "[whatif][rewrite]") {
  // As on the DLRM traces (whatif --global-batch): a forward thread launches K; the backward
  // thread, whose first task Q (an event query) comes before the period's tasks there, waits
  // for K, then launches K2 in the period. Q waiting for K's last copy (the plain "an edge
  // leaving a group leaves its last copy") made a cycle: Q -> L2 (copy 1) -> K2 (copy 1) ->
  // K (copy 2) -> Q.
  task_graph g;
  const processor_id forward = g.add_processor({processor_kind::cpu_thread, 0, 1, 1, "forward thread"});
  const processor_id backward = g.add_processor({processor_kind::cpu_thread, 0, 1, 2, "backward thread"});
  const processor_id stream = g.add_processor({processor_kind::gpu_stream, 0, 0, 7, "stream 7"});
  const task_id l = g.add_task({.kind = task_kind::cpu, .processor = forward, .duration = 5, .name = "launch K"});
  const task_id q = g.add_task({.kind = task_kind::cpu, .processor = backward, .duration = 1, .name = "cudaEventQuery"});
  const task_id l2 = g.add_task({.kind = task_kind::cpu, .processor = backward, .duration = 5, .name = "launch K2"});
  const task_id k = g.add_task({.kind = task_kind::gpu_compute, .processor = stream, .duration = 100, .name = "K"});
  const task_id k2 = g.add_task({.kind = task_kind::gpu_compute, .processor = stream, .duration = 100, .name = "K2"});
  g.add_edge(l, k, 5, edge_kind::launch, edge_flags::from_start);
  g.add_edge(k, q, 0, edge_kind::dependency);
  g.add_edge(l2, k2, 5, edge_kind::launch, edge_flags::from_start);
  // K [5,105]; Q [105,106]; L2 [106,111]; K2 [111,211].
  CHECK(makespan(g) == 211);
  const whatif::edited_graph e = whatif::repeat_groups(g, {{{l, k, l2, k2}, 2}});
  REQUIRE(e.copies[k].size() == 2);
  bool first_copy = false;
  for (const auto& ed : e.graph.edges) first_copy = first_copy || (ed.from == e.copies[k].front() && ed.to == e.copies[q].front());
  CHECK(first_copy);
  // Copy 1 as above; copy 2: K [211,311] (launched at 10, queued behind K2), L2 [111,116]
  // after copy 1's L2 on the backward thread, K2 [311,411].
  CHECK(makespan(e.graph) == 411);
}

TEST_CASE("repeat_groups rejects overlapping and scattered groups", "[whatif][rewrite]") {
  three_launches x;
  CHECK_THROWS_WITH(whatif::repeat_groups(x.g, {{{x.a}, 2}, {{x.a}, 2}}), Catch::Contains("belongs to two groups"));
  CHECK_THROWS_WITH(whatif::repeat_groups(x.g, {{{x.a, x.c}, 2}}), Catch::Contains("not contiguous"));
  CHECK_THROWS_WITH(whatif::repeat_groups(x.g, {{{99}, 2}}), Catch::Contains("does not exist"));
  // Copies past what a graph numbers: an error before any is made (not a process that grows
  // until the system kills it).
  CHECK_THROWS_WITH(whatif::repeat_groups(x.g, {{{x.la, x.a}, std::size_t{1} << 40}}), Catch::Contains("more than a graph numbers"));
}

TEST_CASE("GPU change: compute-bound by the peak ratio, memory-bound by bandwidth, a fixed part kept", "[whatif][gpu]") {
  using whatif::op_bound;
  CHECK(whatif::classify(task_kind::gpu_compute, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == op_bound::compute);
  CHECK(whatif::classify(task_kind::gpu_compute, "volta_sgemm_128x64_nn") == op_bound::compute);
  CHECK(whatif::classify(task_kind::gpu_compute, "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>") == op_bound::compute);
  CHECK(whatif::classify(task_kind::gpu_compute, "void at::native::vectorized_elementwise_kernel<4>") == op_bound::memory);
  CHECK(whatif::classify(task_kind::gpu_compute, "Memcpy HtoD (Pageable -> Device)") == op_bound::host_copy);
  CHECK(whatif::classify(task_kind::gpu_compute, "Memcpy DtoD (Device -> Device)") == op_bound::memory);
  CHECK(whatif::classify(task_kind::comm_complete, "ncclDevKernel_AllReduce_Sum_f16_RING_LL") == op_bound::communication);
  CHECK(whatif::preset_of_device("NVIDIA A100-SXM4-80GB") == "a100-sxm-80gb");
  CHECK(whatif::preset_of_device("NVIDIA H100 80GB HBM3") == "h100-sxm");
  CHECK(whatif::preset_of_device("Tesla V100-SXM2-32GB").empty());

  three_launches x;
  whatif::gpu_ratios r;
  r.compute = 0.25;
  r.memory = 0.5;
  r.fixed = 4;
  const auto st = whatif::change_gpu(x.g, r);
  CHECK(st.compute == 1);
  CHECK(st.memory == 2);
  CHECK(x.g.duration[x.a] == 4 + 24);  // (100 − 4) · 0.25
  CHECK(x.g.duration[x.b] == 4 + 48);
  const auto a100 = model::hardware_preset("a100-sxm-80gb");
  const auto h100 = model::hardware_preset("h100-sxm");
  const auto up = whatif::ratios(a100, h100);
  // Each kind of kernel by its own ratio: the names the profiles' classes are known by.
  using whatif::ratio_of;
  CHECK(ratio_of(up, op_bound::compute, "sm80_xmma_gemm_bf16bf16") == up.compute);
  CHECK(ratio_of(up, op_bound::compute, "flash_fwd_kernel<...>") == up.attention_forward);
  CHECK(ratio_of(up, op_bound::compute, "flash_bwd_dq_dk_dv_loop_kernel<...>") == up.attention_backward);
  CHECK(ratio_of(up, op_bound::memory, "vectorized_layer_norm_kernel") == up.norm);
  CHECK(ratio_of(up, op_bound::memory, "softmax_warp_forward") == up.softmax);
  CHECK(ratio_of(up, op_bound::memory, "multi_tensor_apply_kernel") == up.optimizer);
  CHECK(ratio_of(up, op_bound::memory, "vectorized_elementwise_kernel") == up.memory);
  CHECK(ratio_of(up, op_bound::communication, "nccldevkernel_allreduce_sum_bf16_ring_ll") == up.allreduce);
  CHECK(ratio_of(up, op_bound::communication, "nccldevkernel_sendrecv") == up.communication);
  CHECK(ratio_of(up, op_bound::host_copy, "memcpy htod") == 1.0);
  // A faster GPU shortens every kind; H100 and H200 share their compute efficiencies and peak.
  for (const double f : {up.compute, up.attention_forward, up.attention_backward, up.memory, up.norm, up.softmax, up.optimizer,
                         up.communication, up.allreduce}) {
    CHECK(f < 1.0);
  }
  const auto h200 = whatif::ratios(h100, model::hardware_preset("h200-sxm"));
  CHECK(h200.compute == Approx(1.0));
  CHECK(h200.memory < 1.0);  // HBM3e
}

TEST_CASE("whatif to the traces' own GPU reproduces their replay, and a faster GPU never slows the job", "[whatif][gpu]") {
  const auto job = trace::load_job({std::filesystem::path(LUMOS_SOURCE_DIR) / "examples/data/tiny_job"});
  whatif::whatif_options same;
  same.gpu = "h100-sxm";  // the example job's deviceProperties name an H100
  const auto r = whatif::run_whatif(job, same);
  CHECK(r.predicted.simulated_ns == r.baseline.simulated_ns);
  for (std::size_t i = 0; i < r.baseline.ranks.size(); ++i) CHECK(r.predicted.ranks[i].simulated_ns == r.baseline.ranks[i].simulated_ns);
  whatif::whatif_options faster = same;
  faster.gpu = "h200-sxm";
  CHECK(whatif::run_whatif(job, faster).predicted.simulated_ns <= r.baseline.simulated_ns);
  whatif::whatif_options slower = same;
  slower.gpu = "a100-sxm-80gb";
  CHECK(whatif::run_whatif(job, slower).predicted.simulated_ns > r.baseline.simulated_ns);
}

TEST_CASE("whatif --layers on hand-made pipeline jobs: the traces' own count is the identity, twice the layers about twice the work",
          "[whatif][layers]") {
  const auto dir = lumos_test::data_dir() / "whatif";
  for (const char* name : {"pp2_1f1b", "pp4_gpipe", "pp2_interleaved"}) {
    INFO(name);
    const auto job = trace::load_job({dir / name});
    const auto built = graph::build_graph(job);
    const auto st = whatif::discover_structure(job, built);
    REQUIRE(st.model.layers.known());
    const int layers = *st.model.layers.value;
    whatif::whatif_options same;
    same.layers = layers;
    const auto r = whatif::run_whatif(job, same);
    CHECK(r.predicted.simulated_ns == r.baseline.simulated_ns);
    whatif::whatif_options twice;
    twice.layers = 2 * layers;
    const auto d = whatif::run_whatif(job, twice);
    // More layers cannot make the step shorter; the step holds work besides the layers
    // (optimizer, p2p, launches), so it grows by less than 2x, and by more than 1x.
    CHECK(d.predicted.simulated_ns > r.baseline.simulated_ns);
    CHECK(d.predicted.simulated_ns < 2 * r.baseline.simulated_ns + r.baseline.simulated_ns / 10);
    // Removing layers: half of them.
    whatif::whatif_options half;
    half.layers = layers / 2;
    CHECK(whatif::run_whatif(job, half).predicted.simulated_ns < r.baseline.simulated_ns);
  }
}

TEST_CASE("whatif --layers on the Megatron TP8 trace: identity at 40, the TP all-reduces of every copy joined", "[whatif][layers][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto job = trace::load_job({traces / "astra-sim_megatron-gpt-tp8_8xA100"});
  whatif::whatif_options same;
  same.layers = 40;
  const auto r = whatif::run_whatif(job, same);
  for (std::size_t i = 0; i < r.baseline.ranks.size(); ++i) CHECK(r.predicted.ranks[i].simulated_ns == r.baseline.ranks[i].simulated_ns);
  whatif::whatif_options twice;
  twice.layers = 80;
  const auto d = whatif::run_whatif(job, twice);
  // Every layer holds two TP all-reduces per rank: 80 more joined collectives.
  CHECK(d.predicted.built.graph.collectives.size() == r.baseline.built.graph.collectives.size() + 80);
  CHECK(d.predicted.simulated_ns > r.baseline.simulated_ns * 3 / 2);
  CHECK(d.predicted.simulated_ns < r.baseline.simulated_ns * 2);
  // A count that does not divide over the layers of each chunk the same way is an error.
  whatif::whatif_options odd;
  odd.layers = 0;
  CHECK_THROWS_WITH(whatif::run_whatif(job, odd), Catch::Contains("positive"));
}

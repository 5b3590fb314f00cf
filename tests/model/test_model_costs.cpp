// Communication (alpha-beta ring/tree, hierarchical, p2p) and roofline compute models against
// their closed forms.

#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/nccl.hpp>

#include "config_support.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace lumos::model;
using lumos::model::test::config;
using lumos::time_ns;
using Catch::Matchers::Contains;

namespace {

// Round numbers so the closed forms are easy to read: NVLink 100 GB/s at 80 %, 2 us per step;
// NIC 10 GB/s at 50 %, 10 us per step.
hardware test_machine() {
  hardware hw = h100_sxm();
  hw.intra_node = {100e9, 2000, 0.8};
  hw.inter_node = {10e9, 10000, 0.5};
  return hw;
}

time_ns nearest(double ns) { return static_cast<time_ns>(std::llround(ns)); }

collective_op op(collective c, std::int64_t bytes, std::int64_t n, std::int64_t per_node) {
  return {c, bytes, {n, per_node}};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Communication
// ---------------------------------------------------------------------------------------------

TEST_CASE("bus-bandwidth factors are nccl-tests'", "[model][comm]") {
  CHECK(bus_factor(collective::all_reduce, 8) == 2.0 * 7 / 8);
  CHECK(bus_factor(collective::all_gather, 8) == 7.0 / 8);
  CHECK(bus_factor(collective::reduce_scatter, 8) == 7.0 / 8);
  CHECK(bus_factor(collective::all_to_all, 8) == 7.0 / 8);
  CHECK(bus_factor(collective::broadcast, 8) == 1.0);
  CHECK(bus_factor(collective::all_reduce, 1) == 0.0);
  static_assert(bus_factor(collective::all_reduce, 2) == 1.0);
}

TEST_CASE("ring and tree step counts", "[model][comm]") {
  CHECK(ring_steps(collective::all_reduce, 8) == 14);
  CHECK(ring_steps(collective::all_gather, 8) == 7);
  CHECK(ring_steps(collective::reduce_scatter, 16) == 15);
  CHECK(ring_steps(collective::broadcast, 4) == 3);
  CHECK(tree_steps(collective::all_reduce, 8) == 6);
  CHECK(tree_steps(collective::all_reduce, 16) == 8);
  CHECK(tree_steps(collective::all_reduce, 5) == 6);  // ceil(log2 5) = 3
  CHECK(tree_steps(collective::all_reduce, 2) == 2);
  CHECK(tree_steps(collective::broadcast, 8) == 3);
  CHECK(tree_steps(collective::all_gather, 8) == 7);  // no tree all-gather: ring
  CHECK(ring_steps(collective::all_reduce, 1) == 0);
  static_assert(tree_steps(collective::all_reduce, 1024) == 20);
}

TEST_CASE("ring collectives inside a node match the alpha-beta closed forms", "[model][comm]") {
  const hardware hw = test_machine();
  const ring_alpha_beta ring;
  const double alpha = 2000, bw = 100e9 * 0.8;
  for (std::int64_t n : {2, 4, 8}) {
    for (std::int64_t bytes : {std::int64_t{1} << 10, std::int64_t{1} << 20,
                               std::int64_t{1} << 30, std::int64_t{3'000'000'001}}) {
      INFO("n=" << n << " bytes=" << bytes);
      const double B = static_cast<double>(bytes), N = static_cast<double>(n);
      CHECK(ring.collective_time(op(collective::all_reduce, bytes, n, n), hw) ==
            nearest(2 * (N - 1) * alpha + 2 * (N - 1) / N * B / bw * 1e9));
      CHECK(ring.collective_time(op(collective::all_gather, bytes, n, n), hw) ==
            nearest((N - 1) * alpha + (N - 1) / N * B / bw * 1e9));
      CHECK(ring.collective_time(op(collective::reduce_scatter, bytes, n, n), hw) ==
            nearest((N - 1) * alpha + (N - 1) / N * B / bw * 1e9));
      CHECK(ring.collective_time(op(collective::all_to_all, bytes, n, n), hw) ==
            nearest((N - 1) * alpha + (N - 1) / N * B / bw * 1e9));
      CHECK(ring.collective_time(op(collective::broadcast, bytes, n, n), hw) ==
            nearest((N - 1) * alpha + B / bw * 1e9));
    }
  }
  // Degenerate groups and sizes cost nothing.
  CHECK(ring.collective_time(op(collective::all_reduce, 1 << 20, 1, 1), hw) == 0);
  CHECK(ring.collective_time(op(collective::all_reduce, 0, 8, 8), hw) == 0);
}

TEST_CASE("tree all-reduce changes only the latency term", "[model][comm]") {
  const hardware hw = test_machine();
  const tree_alpha_beta tree;
  const ring_alpha_beta ring;
  const double B = 1 << 20, bw = 100e9 * 0.8;
  CHECK(tree.collective_time(op(collective::all_reduce, 1 << 20, 8, 8), hw) ==
        nearest(6 * 2000.0 + 2 * 7.0 / 8 * B / bw * 1e9));
  CHECK(tree.collective_time(op(collective::all_gather, 1 << 20, 8, 8), hw) ==
        ring.collective_time(op(collective::all_gather, 1 << 20, 8, 8), hw));
  // Across 64 nodes (one rank each) the tree's log latency wins for small messages.
  CHECK(tree.collective_time(op(collective::all_reduce, 1024, 64, 1), hw) <
        ring.collective_time(op(collective::all_reduce, 1024, 64, 1), hw));
  CHECK(tree.collective_time(op(collective::all_reduce, 1024, 64, 1), hw) ==
        nearest(12 * 10000.0 + 2 * 63.0 / 64 * 1024 / 5e9 * 1e9));
}

TEST_CASE("hierarchical collectives reduce to flat ones at the edges", "[model][comm]") {
  const hardware hw = test_machine();
  const ring_alpha_beta ring;
  // The flat ring forms written out from nccl-tests' definitions (doc/PERFORMANCE.md), not from
  // the library: n - 1 latency steps (2(n - 1) for all-reduce) and a bus factor of (n - 1)/n
  // (2(n - 1)/n for all-reduce, 1 for broadcast) of the bytes over the link's effective
  // bandwidth. test_machine: NVLink 80 GB/s effective and 2 us a step; NIC 5 GB/s and 10 us.
  const double B = 256.0 * (1 << 20);
  struct expected {
    collective c;
    double steps8, factor8, steps16, factor16;
  };
  for (const expected e : {expected{collective::all_reduce, 14, 14.0 / 8, 30, 30.0 / 16},
                           expected{collective::all_gather, 7, 7.0 / 8, 15, 15.0 / 16},
                           expected{collective::reduce_scatter, 7, 7.0 / 8, 15, 15.0 / 16},
                           expected{collective::all_to_all, 7, 7.0 / 8, 15, 15.0 / 16},
                           expected{collective::broadcast, 7, 1.0, 15, 1.0}}) {
    INFO(to_string(e.c));
    const auto bytes = static_cast<std::int64_t>(B);
    // Fits in a node: the flat NVLink formula.
    CHECK(ring.collective_time(op(e.c, bytes, 8, 8), hw) == nearest(e.steps8 * 2000 + e.factor8 * B / 80e9 * 1e9));
    // One rank per node: the flat NIC formula.
    CHECK(ring.collective_time(op(e.c, bytes, 16, 1), hw) == nearest(e.steps16 * 10000 + e.factor16 * B / 5e9 * 1e9));
  }
}

TEST_CASE("hierarchical all-reduce: reduce-scatter in node, all-reduce across, all-gather in",
          "[model][comm]") {
  const hardware hw = test_machine();
  const ring_alpha_beta ring;
  const double B = 1 << 30, r = 8, N = 4;
  const double in_bw = 80e9, out_bw = 5e9;
  const double rs = (r - 1) * 2000 + (r - 1) / r * B / in_bw * 1e9;
  const double ar = 2 * (N - 1) * 10000 + 2 * (N - 1) / N * (B / r) / out_bw * 1e9;
  const double ag = rs;
  CHECK(ring.collective_time(op(collective::all_reduce, 1 << 30, 32, 8), hw) ==
        nearest(rs + ar + ag));
  // reduce-scatter: in node then across; all-gather: across then in node.
  const double rs_out = (N - 1) * 10000 + (N - 1) / N * (B / r) / out_bw * 1e9;
  CHECK(ring.collective_time(op(collective::reduce_scatter, 1 << 30, 32, 8), hw) ==
        nearest(rs + rs_out));
  CHECK(ring.collective_time(op(collective::all_gather, 1 << 30, 32, 8), hw) ==
        nearest(rs_out + rs));
  // Spreading the same group over more nodes never makes it faster.
  CHECK(ring.collective_time(op(collective::all_reduce, 1 << 30, 32, 4), hw) >
        ring.collective_time(op(collective::all_reduce, 1 << 30, 32, 8), hw));
  // all-to-all: intra and inter shares in parallel, the slower decides.
  const double chunk = B / 32;
  const double a2a_in = 7 * 2000 + 7 * chunk / in_bw * 1e9;
  const double a2a_out = 24 * 10000 + 24 * chunk / out_bw * 1e9;
  CHECK(ring.collective_time(op(collective::all_to_all, 1 << 30, 32, 8), hw) ==
        nearest(std::max(a2a_in, a2a_out)));
}

TEST_CASE("point-to-point uses NVLink inside a node and the NIC across", "[model][comm]") {
  const hardware hw = test_machine();
  const ring_alpha_beta ring;
  CHECK(ring.p2p_time({1 << 20, true}, hw) == nearest(2000 + (1 << 20) / 80e9 * 1e9));
  CHECK(ring.p2p_time({1 << 20, false}, hw) == nearest(10000 + (1 << 20) / 5e9 * 1e9));
  CHECK(ring.p2p_time({0, false}, hw) == 0);
  CHECK_THROWS_AS(ring.p2p_time({-1, false}, hw), lumos::error);
}

TEST_CASE("placements: explicit lists and Megatron's groups", "[model][comm]") {
  const hardware hw = h100_sxm();
  const std::vector<std::int64_t> even{0, 0, 1, 1, 2, 2};
  const group_placement g = group_placement::from_nodes(even);
  CHECK(g.size == 6);
  CHECK(g.ranks_per_node == 2);
  CHECK(g.nodes() == 3);
  const std::vector<std::int64_t> uneven{0, 0, 0, 1};
  CHECK_THROWS_WITH(group_placement::from_nodes(uneven), Contains("uneven"));
  CHECK_THROWS_AS((group_placement{6, 4}.validate(hw)), lumos::error);
  CHECK_THROWS_AS((group_placement{32, 16}.validate(hw)), lumos::error);

  // TP 8 fills a node; its DP peers are one per node.
  parallel_config p = config(8, 8, 16, 1, 1536);
  CHECK(tensor_parallel_group(p, hw).ranks_per_node == 8);
  CHECK(tensor_parallel_group(p, hw).nodes() == 1);
  CHECK(data_parallel_group(p, hw).ranks_per_node == 1);
  CHECK(data_parallel_group(p, hw).size == 16);
  CHECK_FALSE(pipeline_p2p_same_node(p, hw, 0));
  // TP 2 x DP 8: four DP peers share a node.
  p = config(2, 1, 8, 1, 8);
  CHECK(data_parallel_group(p, hw).ranks_per_node == 4);
  CHECK(data_parallel_group(p, hw).nodes() == 2);
  // TP 2, DP 1, PP 4: the whole pipeline sits in one node.
  p = config(2, 4, 1, 1, 8);
  CHECK(pipeline_p2p_same_node(p, hw, 0));
  CHECK(pipeline_p2p_same_node(p, hw, 2));
}

TEST_CASE("GB200 NVL72: groups inside the 72-GPU NVLink domain stay on NVLink", "[model][comm]") {
  const hardware b200_hw = b200(), gb200_hw = gb200();
  // TP 8 x DP 8 (64 GPUs): on B200 the DP peers sit one per 8-GPU node, on GB200 in one domain.
  const parallel_config p = config(8, 1, 8, 1, 8);
  CHECK(data_parallel_group(p, b200_hw).nodes() == 8);
  CHECK(data_parallel_group(p, gb200_hw).nodes() == 1);
  CHECK(data_parallel_group(p, gb200_hw).ranks_per_node == 8);
  CHECK(tensor_parallel_group(config(64, 1, 1, 1, 1), gb200_hw).nodes() == 1);
  CHECK_NOTHROW((group_placement{64, 64}.validate(gb200_hw)));
  CHECK_THROWS_AS((group_placement{64, 64}.validate(b200_hw)), lumos::error);
  // Same link figures, so the NVLink-only group is faster by the NIC/NVLink ratio's effect.
  const ring_alpha_beta ring;
  const std::int64_t bytes = std::int64_t{1} << 30;
  const time_ns on_nic = ring.collective_time({collective::all_reduce, bytes, data_parallel_group(p, b200_hw)}, b200_hw);
  const time_ns on_nvlink = ring.collective_time({collective::all_reduce, bytes, data_parallel_group(p, gb200_hw)}, gb200_hw);
  CHECK(on_nvlink * 5 < on_nic);
  const nccl_model nccl{gb200_profile()};
  CHECK(nccl.collective_time({collective::all_reduce, bytes, data_parallel_group(p, gb200_hw)}, gb200_hw) <
        nccl_model{b200_profile()}.collective_time({collective::all_reduce, bytes, data_parallel_group(p, b200_hw)}, b200_hw));
  // Pipeline neighbours 32 ranks apart: one domain on GB200, two nodes on B200.
  CHECK(pipeline_p2p_same_node(config(8, 2, 4, 1, 4), gb200_hw, 0));
  CHECK_FALSE(pipeline_p2p_same_node(config(8, 2, 4, 1, 4), b200_hw, 0));
  // 64 apart: rank 7 -> 71 stays in the first domain, rank 8 -> 72 leaves it.
  CHECK(pipeline_p2p_same_node(config(8, 2, 8, 1, 8), gb200_hw, 0, 7));
  CHECK_FALSE(pipeline_p2p_same_node(config(8, 2, 8, 1, 8), gb200_hw, 0, 8));
}

TEST_CASE("layer TP collectives and pipeline message sizes", "[model][comm]") {
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 8, 16, 2, 1536);
  const std::int64_t act = 2LL * 2048 * 12288 * 2;
  CHECK(pipeline_p2p_bytes(m, p) == act);
  auto c = tensor_parallel_layer_collectives(m, p);
  REQUIRE(c.size() == 4);
  for (const auto& x : c) {
    CHECK(x.kind == collective::all_reduce);
    CHECK(x.bytes == act);
  }
  p.sp = true;
  CHECK(pipeline_p2p_bytes(m, p) == act / 8);
  c = tensor_parallel_layer_collectives(m, p);
  int forward_ag = 0, forward_rs = 0;
  for (const auto& x : c) {
    if (!x.backward) {
      forward_ag += x.kind == collective::all_gather;
      forward_rs += x.kind == collective::reduce_scatter;
    }
  }
  CHECK(forward_ag == 2);
  CHECK(forward_rs == 2);
  p.tp = 1;
  CHECK(tensor_parallel_layer_collectives(m, p).empty());
}

// ---------------------------------------------------------------------------------------------
// Compute
// ---------------------------------------------------------------------------------------------

TEST_CASE("roofline: op time is max(compute, memory) + overhead", "[model][compute]") {
  const hardware hw = h100_sxm();
  const roofline rl;
  const double peak = 989.4e12 * hw.efficiency.gemm.compute;
  const double bw = 3.35e12 * hw.efficiency.gemm.memory;
  // Compute-bound GEMM-sized numbers.
  CHECK(rl.op_time(op_class::gemm, 1e12, 1e8, precision::bf16, hw) ==
        nearest(1e12 / peak * 1e9) + hw.kernel_launch_overhead);
  // Memory-bound numbers.
  CHECK(rl.op_time(op_class::gemm, 1e6, 1e9, precision::bf16, hw) ==
        nearest(1e9 / bw * 1e9) + hw.kernel_launch_overhead);
  // Elementwise ops use the FP32 CUDA-core peak and their own memory efficiency.
  CHECK(rl.op_time(op_class::elementwise, 0, 1e9, precision::bf16, hw) ==
        nearest(1e9 / (3.35e12 * hw.efficiency.elementwise.memory) * 1e9) +
            hw.kernel_launch_overhead);
  // fp8 GEMMs run at the fp8 peak; A100 has none.
  CHECK(rl.op_time(op_class::gemm, 1e12, 0, precision::fp8, hw) <
        rl.op_time(op_class::gemm, 1e12, 0, precision::bf16, hw));
  CHECK_THROWS_AS(rl.op_time(op_class::gemm, 1e12, 0, precision::fp8, a100_sxm_80gb()),
                  lumos::error);
  hardware broken = hw;
  broken.efficiency.norm.memory = 0;
  CHECK_THROWS_AS(rl.op_time(op_class::norm, 1, 1, precision::bf16, broken), lumos::error);
}

TEST_CASE("GEMMs are compute-bound, elementwise ops memory-bound at realistic sizes",
          "[model][compute]") {
  const roofline rl;
  for (auto name : {"gpt3-175b", "llama3-70b"}) {
    const transformer m = model_preset(name);
    const op_list L = rl.layer(m, config(8, 8, 16, 1, 1536), h100_sxm());
    INFO(name);
    for (const auto& o : L.ops) {
      INFO(o.name << " " << to_string(o.phase));
      if (o.kind == op_class::gemm || o.kind == op_class::attention) {
        CHECK_FALSE(o.memory_bound);
      } else {
        CHECK(o.memory_bound);
      }
      CHECK(o.duration >= h100_sxm().kernel_launch_overhead);
    }
  }
}

TEST_CASE("GEMM FLOPs: 4x for doubled hidden, 1/tp per rank, GQA-aware QKV",
          "[model][compute]") {
  const roofline rl;
  const hardware hw = h100_sxm();
  const transformer m = gpt3_175b();
  transformer wide = m;
  wide.hidden *= 2;
  wide.ffn *= 2;
  const parallel_config p1 = config(1, 8, 1, 1, 8);
  const op_list a = rl.layer(m, p1, hw);
  const op_list b = rl.layer(wide, p1, hw);
  for (auto name : {"qkv_proj", "attn_out_proj", "mlp_fc1", "mlp_fc2"}) {
    INFO(name);
    CHECK(b.find(name, op_phase::forward)->flops == 4 * a.find(name, op_phase::forward)->flops);
  }
  // qkv: 2 T h (3h) at tp 1.
  const double T = 2048, h = 12288;
  CHECK(a.find("qkv_proj", op_phase::forward)->flops == 2 * T * h * 3 * h);
  // attention core: 4 b s^2 h dense, executed at the causal factor.
  CHECK(a.find("attention", op_phase::forward)->model_flops == 4 * T * T * h);
  CHECK(a.find("attention", op_phase::forward)->flops == 4 * T * T * h * 0.5);

  const op_list t8 = rl.layer(m, config(8, 8, 1, 1, 8), hw);
  int gemms = 0;
  for (const auto& o : a.ops) {
    if (o.kind != op_class::gemm && o.kind != op_class::attention) continue;
    const op_cost* x = t8.find(o.name, o.phase, o.recompute);
    REQUIRE(x != nullptr);
    CHECK(x->flops == Approx(o.flops / 8).epsilon(1e-15));
    ++gemms;
  }
  CHECK(gemms == 4 * 3 + 2);  // four GEMMs x (fwd, dgrad, wgrad) + attention fwd and bwd

  // GQA: Llama 3 70B's QKV output is (64 + 2*8) * 128 wide, split over tp.
  const op_list l = rl.layer(llama3_70b(), config(8, 8, 1, 1, 8), hw);
  const op_cost* qkv = l.find("qkv_proj", op_phase::forward);
  CHECK(qkv->shape.m == 8192);
  CHECK(qkv->shape.n == (64 + 16) * 128 / 8);
  CHECK(qkv->shape.k == 8192);
  CHECK(l.find("mlp_gate", op_phase::forward) != nullptr);
  CHECK(l.find("mlp_up", op_phase::backward_weight) != nullptr);
  CHECK(l.find("mlp_fc1", op_phase::forward) == nullptr);
  // No dropout in Llama: the residual backward is a pass-through (no kernel).
  CHECK(l.find("mlp_residual", op_phase::backward_input) == nullptr);
}

TEST_CASE("backward splits into input and weight gradients", "[model][compute]") {
  const roofline rl;
  const op_list L = rl.layer(gpt3_175b(), config(8, 8, 1, 1, 8), h100_sxm());
  for (auto name : {"qkv_proj", "attn_out_proj", "mlp_fc1", "mlp_fc2"}) {
    INFO(name);
    const op_cost* f = L.find(name, op_phase::forward);
    const op_cost* bi = L.find(name, op_phase::backward_input);
    const op_cost* bw = L.find(name, op_phase::backward_weight);
    REQUIRE((f && bi && bw));
    CHECK(bi->flops == f->flops);
    CHECK(bw->flops == f->flops);
  }
  CHECK(L.flops(op_phase::backward_weight) > 0);
  CHECK(L.duration() == L.duration(op_phase::forward) + L.duration(op_phase::backward_input) +
                            L.duration(op_phase::backward_weight));
  CHECK(L.of(op_phase::forward).front().name == "input_norm");
  CHECK(L.of(op_phase::backward_input).back().name == "input_norm");
}

TEST_CASE("recomputation re-runs forward work without adding model FLOPs", "[model][compute]") {
  const roofline rl;
  const hardware hw = h100_sxm();
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 8, 1, 1, 8);
  const op_list none = rl.layer(m, p, hw);
  p.recompute = recompute_kind::selective;
  const op_list sel = rl.layer(m, p, hw);
  p.recompute = recompute_kind::full;
  const op_list full = rl.layer(m, p, hw);

  CHECK(sel.model_flops() == none.model_flops());
  CHECK(full.model_flops() == none.model_flops());
  const op_cost* again = sel.find("attention", op_phase::backward_input, true);
  REQUIRE(again != nullptr);
  CHECK(again->flops == none.find("attention", op_phase::forward)->flops);
  CHECK(sel.duration(op_phase::backward_input) ==
        none.duration(op_phase::backward_input) + again->duration);
  CHECK(full.flops(op_phase::backward_input) ==
        Approx(none.flops(op_phase::backward_input) + none.flops(op_phase::forward)));
  CHECK(full.duration(op_phase::backward_input) ==
        none.duration(op_phase::backward_input) + none.duration(op_phase::forward));
}

TEST_CASE("sequence parallelism divides norm and residual work by tp", "[model][compute]") {
  const roofline rl;
  const hardware hw = h100_sxm();
  parallel_config p = config(8, 8, 1, 1, 8);
  const op_list plain = rl.layer(gpt3_175b(), p, hw);
  p.sp = true;
  const op_list sp = rl.layer(gpt3_175b(), p, hw);
  for (auto name : {"input_norm", "post_attn_norm", "attn_residual", "mlp_residual"}) {
    INFO(name);
    CHECK(sp.find(name, op_phase::forward)->bytes ==
          Approx(plain.find(name, op_phase::forward)->bytes / 8));
  }
  CHECK(sp.find("qkv_proj", op_phase::forward)->flops ==
        plain.find("qkv_proj", op_phase::forward)->flops);
}

TEST_CASE("model FLOPs of all ops add up to the iteration's model FLOPs", "[model][compute]") {
  const roofline rl;
  const hardware hw = h100_sxm();
  for (auto name : {"gpt3-44b", "llama3-8b"}) {
    const transformer m = model_preset(name);
    parallel_config p = config(4, 2, 8, 2, 128);
    p.recompute = recompute_kind::full;
    const double micro = static_cast<double>(p.micro_batches());
    const double per_replica =
        (static_cast<double>(m.layers) * rl.layer(m, p, hw).model_flops() +
         rl.head(m, p, hw).model_flops() + rl.embedding(m, p, hw).model_flops()) *
        p.tp * micro;
    INFO(name);
    CHECK(per_replica * p.dp == Approx(model_flops(m, p.global_batch)).epsilon(1e-12));
  }
}

TEST_CASE("embedding, head and optimizer ops", "[model][compute]") {
  const roofline rl;
  const hardware hw = h100_sxm();
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 8, 16, 1, 1536);
  const op_list e = rl.embedding(m, p, hw);
  CHECK(e.find("word_embedding", op_phase::forward) != nullptr);
  CHECK(e.find("position_embedding", op_phase::forward) != nullptr);
  CHECK(e.find("word_embedding", op_phase::backward_weight) != nullptr);
  CHECK(rl.embedding(llama3_8b(), config(8, 4, 1, 1, 8), hw).find("position_embedding",
                                                                    op_phase::forward) == nullptr);

  const op_list h = rl.head(m, p, hw);
  const op_cost* logits = h.find("logits", op_phase::forward);
  REQUIRE(logits != nullptr);
  CHECK(logits->flops == 2.0 * 2048 * 12288 * 51200 / 8);
  CHECK(h.find("cross_entropy", op_phase::backward_input) != nullptr);

  const std::int64_t n = stage_parameters_per_rank(m, p, 3);
  op_list o = rl.optimizer(m, p, hw, 3);
  CHECK(o.find("optimizer_step", op_phase::optimizer)->bytes == 28.0 * static_cast<double>(n));
  p.zero_stage = 1;
  o = rl.optimizer(m, p, hw, 3);
  CHECK(o.find("optimizer_step", op_phase::optimizer)->bytes ==
        Approx(28.0 * static_cast<double>(n) / 16));
  CHECK(o.find("grad_norm", op_phase::optimizer)->memory_bound);
  CHECK_THROWS_AS(rl.optimizer(m, p, hw, 8), lumos::error);
  p.tp = 7;
  CHECK_THROWS_AS(rl.layer(m, p, hw), lumos::error);
}

// fp8 training in the cost models and memory (model/compute.hpp `fp8_casts`, kernel_costs.hpp,
// memory.hpp): which GEMMs run in fp8, the cast kernels before them and their sizes, fp8 against
// bf16 on large and tiny GEMMs, and the memory terms.

#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/memory.hpp>

#include "config_support.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <string_view>

using namespace lumos::model;
using lumos::model::test::config;
using lumos::model::test::small_gpt;

namespace {

parallel_config with_dtype(parallel_config p, precision d) {
  p.dtype = d;
  return p;
}

std::size_t count_role(const op_list& l, op_role r) {
  std::size_t n = 0;
  for (const op_cost& o : l.ops) n += o.role == r ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("fp8 runs the layers' linear GEMMs only", "[model][fp8]") {
  for (const op_role r : {op_role::qkv, op_role::attn_out, op_role::mlp_in, op_role::mlp_up, op_role::mlp_out, op_role::moe_expert}) {
    CHECK(fp8_gemm(r));
  }
  for (const op_role r : {op_role::attention, op_role::attention_pv, op_role::logits, op_role::moe_router, op_role::word_embedding}) {
    CHECK_FALSE(fp8_gemm(r));
  }
  CHECK(role_of_name("fp8_cast_input") == op_role::fp8_cast);
  CHECK(role_of_name("fp8_amax_grad") == op_role::fp8_amax);
}

TEST_CASE("fp8_casts: input and weight before a forward GEMM, the gradient before its input gradient", "[model][fp8]") {
  std::array<fp8_cast, 4> c;
  const double M = 4096, N = 3072, K = 1024;
  REQUIRE(fp8_casts(fp8_scaling::delayed, op_role::qkv, op_phase::forward, false, M, N, K, 1, false, c) == 2);
  CHECK(c[0].name == "fp8_cast_input");
  CHECK(c[0].elements == M * K);
  CHECK(c[0].bytes == fp8_cast_bytes_per_element * M * K);
  CHECK(c[1].name == "fp8_cast_weight");
  CHECK(c[1].elements == K * N);
  // The up GEMM of a gated MLP reads the gate's cast input: its weight only.
  REQUIRE(fp8_casts(fp8_scaling::delayed, op_role::mlp_up, op_phase::forward, false, M, N, K, 1, true, c) == 1);
  CHECK(c[0].name == "fp8_cast_weight");
  REQUIRE(fp8_casts(fp8_scaling::delayed, op_role::qkv, op_phase::backward_input, false, M, K, N, 1, false, c) == 1);
  CHECK(c[0].name == "fp8_cast_grad");
  CHECK(c[0].elements == M * N);
  CHECK(fp8_casts(fp8_scaling::delayed, op_role::qkv, op_phase::backward_weight, false, K, N, M, 1, false, c) == 0);
  // A recomputed forward casts again; current scaling adds an amax pass before each cast.
  CHECK(fp8_casts(fp8_scaling::delayed, op_role::qkv, op_phase::backward_input, true, M, N, K, 1, false, c) == 2);
  REQUIRE(fp8_casts(fp8_scaling::current, op_role::qkv, op_phase::forward, false, M, N, K, 1, false, c) == 4);
  CHECK(c[0].role == op_role::fp8_amax);
  CHECK(c[0].bytes == fp8_amax_bytes_per_element * M * K);
  CHECK(c[1].role == op_role::fp8_cast);
  CHECK(fp8_casts(fp8_scaling::delayed, op_role::logits, op_phase::forward, false, M, N, K, 1, false, c) == 0);
}

TEST_CASE("kernel-level fp8 layer: casts before each fp8 GEMM, sized by its operands", "[model][fp8]") {
  const transformer m = small_gpt();
  const parallel_config p = with_dtype(config(1, 1, 1, 2, 2), precision::fp8);
  const op_list l = kernel_level{}.layer(m, p, h100_sxm());
  // GELU layer: four fp8 GEMMs, each with input and weight casts forward and a gradient cast.
  CHECK(count_role(l, op_role::fp8_cast) == 4 * 3);
  CHECK(count_role(l, op_role::fp8_amax) == 0);
  const double T = 2.0 * static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  for (std::size_t i = 0; i + 1 < l.ops.size(); ++i) {
    if (l.ops[i].name != "fp8_cast_input" || l.ops[i + 2].role != op_role::qkv) continue;
    CHECK(l.ops[i].bytes == fp8_cast_bytes_per_element * T * h);
    CHECK(l.ops[i].kind == op_class::elementwise);
    CHECK(l.ops[i].memory_bound);
    CHECK(l.ops[i].model_flops == 0);
    CHECK(l.ops[i + 1].name == "fp8_cast_weight");
    CHECK(l.ops[i + 1].bytes == fp8_cast_bytes_per_element * h * 3.0 * h);
    // the GEMM reads 1-byte operands and writes bf16
    CHECK(l.ops[i + 2].bytes == (T * h + h * 3.0 * h) * 1.0 + T * 3.0 * h * 2.0);
  }
  kernel_level current;
  current.scaling = fp8_scaling::current;
  CHECK(count_role(current.layer(m, p, h100_sxm()), op_role::fp8_amax) == 4 * 3);
  // Model FLOPs are the bf16 layer's: the casts add none.
  CHECK(l.model_flops() == kernel_level{}.layer(m, with_dtype(p, precision::bf16), h100_sxm()).model_flops());
  // bf16 training has no casts.
  CHECK(count_role(kernel_level{}.layer(m, with_dtype(p, precision::bf16), h100_sxm()), op_role::fp8_cast) == 0);
}

TEST_CASE("fp8 GEMMs: faster than bf16 on large shapes, not on tiny ones", "[model][fp8]") {
  const kernel_level k;
  const hardware hw = h100_sxm();
  const double p8 = hw.peak_flops(precision::fp8), p16 = hw.peak_flops(precision::bf16);
  const double big8 = k.gemm_ns(hw, p8, 1, 8192, 8192, 8192, 2), big16 = k.gemm_ns(hw, p16, 2, 8192, 8192, 8192, 2);
  CHECK(big8 < 0.6 * big16);
  CHECK(big8 > 0.4 * big16);
  // A tiny GEMM takes the minimum kernel time either way.
  const double floor = k.profile.min_kernel_ns;
  CHECK(std::max(k.gemm_ns(hw, p8, 1, 64, 64, 64, 2), floor) == std::max(k.gemm_ns(hw, p16, 2, 64, 64, 64, 2), floor));

  // A whole layer: fp8 is faster on a large model, and slower on a tiny one (the casts cost more
  // than the GEMMs save).
  transformer big = small_gpt();
  big.hidden = 8192, big.ffn = 32768, big.heads = big.kv_heads = 64, big.seq = 4096;
  const parallel_config p = config(1, 1, 1, 1, 1);
  CHECK(kernel_level{}.layer(big, with_dtype(p, precision::fp8), hw).duration() <
        kernel_level{}.layer(big, p, hw).duration());
  transformer tiny = small_gpt();
  tiny.hidden = 256, tiny.ffn = 1024, tiny.heads = tiny.kv_heads = 4, tiny.seq = 128;
  CHECK(kernel_level{}.layer(tiny, with_dtype(p, precision::fp8), hw).duration() >=
        kernel_level{}.layer(tiny, p, hw).duration());
  // The roofline model too, and its logits GEMM stays at the bf16 rate.
  CHECK(roofline{}.layer(big, with_dtype(p, precision::fp8), hw).duration() < roofline{}.layer(big, p, hw).duration());
  const op_list h8 = roofline{}.head(big, with_dtype(p, precision::fp8), hw), h16 = roofline{}.head(big, p, hw);
  CHECK(h8.find("logits", op_phase::forward)->duration == h16.find("logits", op_phase::forward)->duration);
  CHECK(count_role(roofline{}.layer(big, with_dtype(p, precision::fp8), hw), op_role::fp8_cast) == 12);
}

TEST_CASE("fp8 memory: weight copies, scaling state, inputs saved in fp8, optimizer unchanged", "[model][fp8][memory]") {
  const transformer m = small_gpt();
  const parallel_config p16 = config(2, 2, 2, 1, 8);
  const parallel_config p8 = with_dtype(p16, precision::fp8);
  memory_options o;
  o.per_param = megatron_state_bytes;
  const memory_breakdown a = memory_per_gpu(m, p16, 0, o), b = memory_per_gpu(m, p8, 0, o);
  CHECK(a.fp8_weights == 0);
  CHECK(a.fp8_scaling_state == 0);
  CHECK(b.parameters == a.parameters);
  CHECK(b.gradients == a.gradients);
  CHECK(b.optimizer_states == a.optimizer_states);
  // Weight and transpose of every fp8 GEMM of the stage's layers: 2 bytes a weight.
  const double layers = static_cast<double>(p8.layers_per_stage(m));
  CHECK(b.fp8_weights == Approx(2.0 * layers * static_cast<double>(layer_matmul_weights(m)) / p8.tp));
  // Delayed scaling: 4 GEMMs a layer, 3 operands, fp32 scale, inverse, amax and 1024 of history.
  CHECK(b.fp8_scaling_state == Approx(layers * 4 * 3 * 4.0 * (3 + 1024)));
  memory_options cur = o;
  cur.scaling = fp8_scaling::current;
  CHECK(memory_per_gpu(m, p8, 0, cur).fp8_scaling_state == Approx(layers * 4 * 3 * 4.0 * 3));
  // Saved inputs of the fp8 GEMMs at 1 byte: 2 sbh replicated, (sbq + sbf) / t sharded less.
  const double sb = static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width()), f = static_cast<double>(m.ffn);
  const double saved = 2.0 * sb * h + (sb * q + sb * f) / p8.tp;
  CHECK(layer_activation_bytes(m, p16, true) - layer_activation_bytes(m, p8, true) == Approx(saved));
  CHECK(a.activations - b.activations == Approx(saved * layers * o.in_flight_microbatches));
  CHECK(b.total() == Approx(b.model_states() + b.activations + b.io_activations + b.recompute_working + b.fp8_weights +
                            b.fp8_scaling_state));
  // Full recomputation keeps the layer input only, in bf16, either way.
  parallel_config full = p8;
  full.recompute = recompute_kind::full;
  parallel_config full16 = p16;
  full16.recompute = recompute_kind::full;
  CHECK(layer_activation_bytes(m, full, true) == layer_activation_bytes(m, full16, true));
}

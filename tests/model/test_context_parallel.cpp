// Context parallelism in the analytical model: the configuration rules, the per-rank work of
// both cost models, the key/value exchange and the memory per GPU.

#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/memory.hpp>

#include "config_support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

namespace cp_test {

using namespace lumos::model;

// Llama 3 8B's layer (GQA, SwiGLU) over 4 layers at sequence `seq`.
transformer llama(std::int64_t seq) {
  transformer m = llama3_8b();
  m.layers = 4;
  m.seq = seq;
  return m;
}

parallel_config with_cp(int tp, int cp, int dp, std::int64_t global_batch) {
  parallel_config p = test::config(tp, 1, dp, 1, global_batch);
  p.cp = cp;
  p.sp = tp > 1;
  return p;
}

// Sums of one layer's ops by kind: executed and model FLOPs of the attention core, and of
// everything else.
struct layer_sums {
  double attention_flops = 0, attention_model = 0, other_flops = 0, other_model = 0;
};

layer_sums sums(const op_list& l) {
  layer_sums s;
  for (const op_cost& o : l.ops) {
    const bool attention = o.kind == op_class::attention;
    (attention ? s.attention_flops : s.other_flops) += o.flops;
    (attention ? s.attention_model : s.other_model) += o.model_flops;
  }
  return s;
}

template <class Compute>
void check_per_rank_work(const Compute& c) {
  const hardware hw = h100_sxm();
  const std::int64_t S = 8192;
  const int cp = 2;
  // cp = 2 at S against cp = 1 at S / 2: the same tokens per rank.
  const layer_sums split = sums(c.layer(llama(S), with_cp(2, cp, 1, 4), hw));
  const layer_sums half = sums(c.layer(llama(S / cp), with_cp(2, 1, 1, 4), hw));
  const layer_sums full = sums(c.layer(llama(S), with_cp(2, 1, 1, 4), hw));
  // Linear layers, norms and elementwise work: the rank's S / cp tokens.
  CHECK(split.other_flops == Approx(half.other_flops).epsilon(1e-12));
  CHECK(split.other_model == Approx(half.other_model).epsilon(1e-12));
  // The attention core: 1/cp of the whole sequence's (its queries against all S keys), which
  // is cp times the attention of a sequence of S / cp tokens.
  CHECK(split.attention_flops == Approx(full.attention_flops / cp).epsilon(1e-12));
  CHECK(split.attention_model == Approx(full.attention_model / cp).epsilon(1e-12));
  CHECK(split.attention_flops == Approx(cp * half.attention_flops).epsilon(1e-12));
  // The cp ranks together do the model FLOPs of the sequence.
  CHECK(cp * (split.attention_model + split.other_model) == Approx(full.attention_model + full.other_model).epsilon(1e-12));
}

}  // namespace cp_test

TEST_CASE("context parallelism: world size, micro-batches and the validation rules", "[model][cp]") {
  using namespace lumos::model;
  const transformer m = cp_test::llama(8192);
  parallel_config p = cp_test::with_cp(2, 4, 2, 16);
  p.pp = 2;
  CHECK(p.world_size() == 2 * 2 * 4 * 2);
  CHECK(p.gradient_ranks() == 8);
  CHECK(p.micro_batches() == 16 / 2);  // CP ranks share a micro-batch: dp alone divides the batch
  CHECK(p.local_seq(m) == 8192 / 4);
  CHECK_NOTHROW(p.validate(m));

  parallel_config zero = p;
  zero.cp = 0;
  CHECK_THROWS_WITH(zero.validate(m), Catch::Contains("cp must be at least 1"));
  transformer odd = m;
  odd.seq = 8192 + 4;  // divisible by cp = 4, not by 2 * cp
  CHECK_THROWS_WITH(p.validate(odd), Catch::Contains("divisible by 2 * cp") && Catch::Contains("8196"));

  // EP divides DP x CP (expert TP = TP): 4 experts-parallel ranks from dp 2 x cp 2, not 8.
  transformer moe = mixtral_8x7b();
  moe.layers = 4;
  parallel_config e = cp_test::with_cp(1, 2, 2, 8);
  e.ep = 4;
  CHECK_NOTHROW(e.validate(moe));
  CHECK(e.expert_data_parallel() == 1);
  e.ep = 8;
  CHECK_THROWS_WITH(e.validate(moe), Catch::Contains("must divide tp * cp * dp (1 * 2 * 2 = 4)"));
}

TEST_CASE("Megatron's split with the embedding and the loss counted as layers", "[model][cp][pipeline]") {
  using namespace lumos::model;
  const transformer m = llama3_1_405b();
  parallel_config p = cp_test::with_cp(8, 2, 8, 512);
  p.pp = 8;
  p.vp = 8;
  REQUIRE(p.embedding_loss_in_split(m));  // 126 + 2 = 128 over 64 virtual stages
  CHECK_NOTHROW(p.validate(m));
  std::int64_t layers = 0;
  for (int s = 0; s < p.pp; ++s) {
    std::int64_t on_stage = 0;
    for (int c = 0; c < p.vp; ++c) on_stage += p.chunk_layers(m, s, c);
    CHECK(on_stage == p.stage_layers(m, s));
    layers += on_stage;
  }
  CHECK(layers == m.layers);
  CHECK(p.chunk_layers(m, 0, 0) == p.layers_per_chunk(m) - 1);
  CHECK(p.chunk_layers(m, p.pp - 1, p.vp - 1) == p.layers_per_chunk(m) - 1);
  // Stage 0 holds one layer fewer and the embedding.
  CHECK(stage_parameters_per_rank(m, p, 0) - stage_parameters_per_rank(m, p, 1) ==
        m.vocab * m.hidden / p.tp - layer_parameters_per_rank(m, p.tp));
  // Without the two extra layers dividing, the rule stays.
  p.vp = 5;
  CHECK_FALSE(p.embedding_loss_in_split(m));
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("must be divisible by pp * vp"));
}

TEST_CASE("context parallelism: each rank works on seq / cp tokens and 1/cp of the attention", "[model][cp]") {
  cp_test::check_per_rank_work(lumos::model::roofline{});
  cp_test::check_per_rank_work(lumos::model::kernel_level{});
}

TEST_CASE("context parallelism: the ring and the all-gather exchange of keys and values", "[model][cp][comm]") {
  using namespace lumos::model;
  const hardware hw = h100_sxm();  // 8 GPUs per NVLink domain
  const ring_alpha_beta comm;
  const transformer m = cp_test::llama(8192);
  parallel_config p = cp_test::with_cp(2, 4, 1, 2);
  p.micro_batch = 2;
  // 2 (K, V) x b x s/cp x kv_heads/tp x head_dim x 2 bytes
  const std::int64_t chunk = 2 * 2 * (8192 / 4) * (m.kv_heads / 2) * m.head_dim() * 2;
  CHECK(context_parallel_kv_bytes(m, p) == chunk);
  CHECK(context_parallel_group(p, hw).nodes() == 1);  // tp * cp = 8 ranks in a node

  const cp_exchange fwd = context_parallel_exchange(m, p, hw, comm, false);
  const cp_exchange bwd = context_parallel_exchange(m, p, hw, comm, true);
  CHECK(fwd.overlapped);
  CHECK(fwd.duration == 3 * comm.p2p_time({chunk, true}, hw));  // cp - 1 steps over NVLink
  CHECK(bwd.duration == 3 * comm.p2p_time({2 * chunk, true}, hw));  // K, V and dK, dV
  // Across nodes when the CP group leaves the NVLink domain (tp * cp = 16 > 8).
  parallel_config wide = p;
  wide.tp = 4;
  CHECK(context_parallel_group(wide, hw).nodes() == 2);
  const std::int64_t wide_chunk = context_parallel_kv_bytes(m, wide);
  CHECK(context_parallel_exchange(m, wide, hw, comm, false).duration == 3 * comm.p2p_time({wide_chunk, false}, hw));

  p.cp_comm = cp_comm_kind::allgather;
  const cp_exchange ag = context_parallel_exchange(m, p, hw, comm, false);
  const cp_exchange rs = context_parallel_exchange(m, p, hw, comm, true);
  CHECK_FALSE(ag.overlapped);
  CHECK(ag.kind == collective::all_gather);
  CHECK(rs.kind == collective::reduce_scatter);
  CHECK(ag.bytes == 4 * chunk);
  CHECK(ag.duration == comm.collective_time({collective::all_gather, 4 * chunk, context_parallel_group(p, hw)}, hw));

  parallel_config none = p;
  none.cp = 1;
  CHECK(context_parallel_exchange(m, none, hw, comm, false).duration == 0);
}

TEST_CASE("context parallelism: activations per rank scale by 1/cp, the optimizer shards over dp x cp", "[model][cp][memory]") {
  using namespace lumos::model;
  const transformer m = cp_test::llama(8192);
  memory_options o;
  o.in_flight_microbatches = 1;
  parallel_config one = cp_test::with_cp(2, 1, 4, 8);
  parallel_config two = cp_test::with_cp(2, 2, 2, 8);
  for (const recompute_kind r : {recompute_kind::none, recompute_kind::selective, recompute_kind::full}) {
    one.recompute = two.recompute = r;
    CHECK(layer_activation_bytes(m, two, true) == Approx(layer_activation_bytes(m, one, true) / 2).epsilon(1e-12));
    CHECK(layer_activation_bytes(m, two, false) == Approx(layer_activation_bytes(m, one, false) / 2).epsilon(1e-12));
  }
  one.recompute = two.recompute = recompute_kind::none;
  const memory_breakdown a = memory_per_gpu(m, one, 0, o), b = memory_per_gpu(m, two, 0, o);
  CHECK(b.activations == Approx(a.activations / 2).epsilon(1e-12));
  CHECK(b.io_activations == Approx(a.io_activations / 2).epsilon(1e-12));
  // dp 4 x cp 1 and dp 2 x cp 2 shard the optimizer over the same 4 ranks.
  CHECK(b.optimizer_states == Approx(a.optimizer_states).epsilon(1e-12));
  CHECK(a.cp_buffers == 0);
  CHECK(b.cp_buffers == Approx(4.0 * static_cast<double>(context_parallel_kv_bytes(m, two))));
  CHECK(b.total() == Approx(b.model_states() + b.activations + b.io_activations + b.recompute_working + b.cp_buffers));
  two.cp_comm = cp_comm_kind::allgather;
  CHECK(memory_per_gpu(m, two, 0, o).cp_buffers == Approx(2.0 * 2 * static_cast<double>(context_parallel_kv_bytes(m, two))));
}

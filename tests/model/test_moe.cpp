// Mixture-of-experts models: presets against their published parameter counts, the
// expert-parallel rules, the MoE cost model, memory, the program builder's dispatch
// collectives and the CLI.

#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/synth/predict.hpp>

#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace lumos::model;
using Catch::Matchers::Contains;

// Within `tol` (relative) of `want`.
bool moe_near(double got, double want, double tol) { return std::abs(got - want) <= tol * std::abs(want); }

parallel_config moe_config(int pp, int dp, int ep, std::int64_t micro_batch, std::int64_t global_batch) {
  parallel_config p;
  p.pp = pp;
  p.dp = dp;
  p.ep = ep;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  p.zero_stage = 1;
  return p;
}

// Sum of the op durations of one MoE layer (kernel-level model) under `p`.
double moe_layer_ms(const transformer& m, const parallel_config& p) {
  return static_cast<double>(kernel_level{}.layer(m, p, h100_sxm()).duration()) / 1e6;
}

lumos::synth::prediction moe_predict_job(const transformer& m, const parallel_config& p) {
  lumos::synth::job j;
  j.model = m;
  j.parallel = p;
  j.hardware = h100_sxm();
  // Roofline: the experts' time does not depend on how their GEMMs are grouped. Forward only: no
  // gradient reduction, which EP shrinks (experts reduce over dp / ep ranks).
  lumos::synth::predict_options opt;
  opt.program.forward_only = true;
  return lumos::synth::predict(j, opt);
}

}  // namespace

TEST_CASE("MoE presets have their published parameter counts", "[model][moe]") {
  // Total and active parameters as the model publishers state them:
  //  - Qwen3-30B-A3B: 30.5e9 total, 3.3e9 activated (Qwen/Qwen3-30B-A3B model card);
  //  - Qwen3-235B-A22B: 235e9 total, 22e9 activated (Qwen/Qwen3-235B-A22B model card);
  //  - GPT-OSS-120B: 116.83e9 total, 5.13e9 active (OpenAI, "gpt-oss-120b & gpt-oss-20b Model
  //    Card", 2025, Table 1; its active count leaves out the input embedding);
  //  - Mixtral 8x7B: 46.7e9 total, 12.9e9 active (Mistral AI, "Mixtral of experts", 2023).
  struct row {
    const char* name;
    double total, active;
    bool active_without_input_embedding;
  };
  for (const row& r : {row{"qwen3-30b-a3b", 30.5e9, 3.3e9, false}, row{"qwen3-235b-a22b", 235e9, 22e9, false},
                       row{"gpt-oss-120b", 116.83e9, 5.13e9, true}, row{"mixtral-8x7b", 46.7e9, 12.9e9, false}}) {
    INFO(r.name);
    const transformer m = model_preset(r.name);
    REQUIRE(m.is_moe());
    const auto total = static_cast<double>(parameter_count(m));
    double active = static_cast<double>(active_parameter_count(m));
    if (r.active_without_input_embedding) active -= static_cast<double>(m.vocab * m.hidden);
    CHECK(moe_near(total, r.total, 0.02));
    CHECK(moe_near(active, r.active, 0.02));
    // Model FLOPs per token follow the active GEMM weights: 6 N_active per token plus attention
    // and the logits, far below 6 x the total parameters.
    const double per_token = model_flops(m, 1) / static_cast<double>(m.seq);
    CHECK(per_token > 6.0 * static_cast<double>(m.moe_layers() * moe_layer_active_matmul_weights(m)));
    CHECK(per_token < 2.0 * 6.0 * active);
  }
}

TEST_CASE("dense models count as before", "[model][moe]") {
  const transformer g = gpt3_175b();
  CHECK_FALSE(g.is_moe());
  CHECK(active_parameter_count(g) == parameter_count(g));
  CHECK(parameter_count(g) == gpt_parameter_count(g) + 2 * g.hidden);
  CHECK(moe_near(model_flops(g, 1536), megatron_model_flops(g, 1536), 1e-12));
}

TEST_CASE("invalid expert-parallel combinations name the rule they break", "[model][moe]") {
  const transformer q = qwen3_30b_a3b();
  CHECK_NOTHROW(moe_config(2, 8, 8, 1, 64).validate(q));
  CHECK_THROWS_WITH(moe_config(1, 6, 4, 1, 24).validate(q), Contains("must divide tp * cp * dp"));
  CHECK_THROWS_WITH(moe_config(1, 8, 8, 1, 8).validate(llama3_8b()), Contains("mixture-of-experts"));
  transformer odd = q;
  odd.moe.experts = 12;
  CHECK_THROWS_WITH(moe_config(1, 8, 8, 1, 8).validate(odd), Contains("divisible by ep"));
  parallel_config tp = moe_config(1, 8, 1, 1, 8);
  tp.tp = 2;
  CHECK_THROWS_WITH(tp.validate(q), Contains("sequence parallelism"));
  tp.sp = true;
  CHECK_NOTHROW(tp.validate(q));
  transformer bad = q;
  bad.moe.top_k = 0;
  CHECK_THROWS_WITH(bad.validate(), Contains("top_k"));
  bad = q;
  bad.moe.first_dense_layers = q.layers;
  CHECK_THROWS_WITH(bad.validate(), Contains("first_dense_layers"));
  bad = q;
  bad.moe.capacity_factor = -1;
  CHECK_THROWS_WITH(bad.validate(), Contains("capacity_factor"));
}

TEST_CASE("MoE ops add up to the model FLOPs, and EP changes the experts per rank, not the work", "[model][moe]") {
  const transformer q = qwen3_30b_a3b();
  for (const int ep : {1, 8}) {
    INFO("ep " << ep);
    const parallel_config p = moe_config(1, 8, ep, 2, 16);
    const double want = 3.0 * 2.0 * moe_layer_forward_flops_per_sequence(q);
    CHECK(moe_near(kernel_level{}.layer(q, p, h100_sxm()).model_flops(), want, 1e-12));
    CHECK(moe_near(roofline{}.layer(q, p, h100_sxm()).model_flops(), want, 1e-12));
    const moe_layer_shape x = moe_shape(q, p);
    CHECK(x.local_experts == static_cast<double>(q.moe.experts / ep));
    CHECK(x.rows * x.local_experts == x.copies);
    CHECK(x.copies == 2.0 * static_cast<double>(q.seq * q.moe.top_k));
  }
}

TEST_CASE("the all-to-alls appear with EP, and memory divides by it", "[model][moe]") {
  const transformer q = qwen3_30b_a3b();
  std::vector<moe_collective> cs;
  moe_layer_collectives(q, moe_config(2, 8, 1, 2, 64), cs);
  CHECK(cs.empty());
  moe_layer_collectives(q, moe_config(2, 8, 8, 2, 64), cs);
  REQUIRE(cs.size() == 5);  // the token counts' all-gather; dispatch and combine, forward and backward
  CHECK(cs[0].kind == collective::all_gather);
  CHECK(cs[0].bytes == q.moe.experts * 8 * 8);  // int64 counts of every expert from each of the 8 ranks
  for (std::size_t i = 1; i < cs.size(); ++i) {
    CHECK(cs[i].kind == collective::all_to_all);
    CHECK(cs[i].bytes == 2 * q.seq * q.moe.top_k * q.hidden * 2);  // each rank's copies, bf16
  }
  transformer ag = q;
  ag.moe.dispatcher = moe_dispatcher::allgather;
  moe_layer_collectives(ag, moe_config(2, 8, 8, 2, 64), cs);
  REQUIRE(cs.size() == 4);
  CHECK(cs[0].kind == collective::all_gather);
  CHECK(cs[0].group == moe_group::ep_tp);

  const memory_options opt{.in_flight_microbatches = 2, .flash_attention = true, .per_param = megatron_state_bytes};
  const memory_breakdown one = memory_per_gpu(q, moe_config(2, 8, 1, 2, 64), 0, opt);
  const memory_breakdown eight = memory_per_gpu(q, moe_config(2, 8, 8, 2, 64), 0, opt);
  CHECK(one.expert_parameter_count == 8 * eight.expert_parameter_count);
  CHECK(one.parameter_count - one.expert_parameter_count == eight.parameter_count - eight.expert_parameter_count);
  CHECK(eight.parameters < one.parameters / 4);
  CHECK(one.moe_dispatch_buffers == 0);
  CHECK(eight.moe_dispatch_buffers > 0);
  // The program has the all-to-alls: the same forward passes with EP 8 take longer (the
  // experts' work per rank is the same, the tokens now travel).
  const auto p1 = moe_predict_job(q, moe_config(1, 8, 1, 1, 8));
  const auto p8 = moe_predict_job(q, moe_config(1, 8, 8, 1, 8));
  CHECK(p8.iteration_ns > p1.iteration_ns);
  CHECK(p8.memory.total() < p1.memory.total());
}

TEST_CASE("more experts per token cost more, and the capacity factor scales the experts' work", "[model][moe]") {
  transformer q = qwen3_30b_a3b();
  const parallel_config p = moe_config(1, 8, 8, 1, 8);
  double last = 0;
  for (const std::int64_t k : {1, 2, 4, 8}) {
    q.moe.top_k = k;
    const double t = moe_layer_ms(q, p);
    CHECK(t > last);
    last = t;
  }
  q = qwen3_30b_a3b();
  const double dropless = moe_layer_ms(q, p);
  q.moe.capacity_factor = 1.25;
  const double padded = moe_layer_ms(q, p);
  q.moe.capacity_factor = 0.5;
  const double dropped = moe_layer_ms(q, p);
  CHECK(padded > dropless);
  CHECK(dropped < dropless);
  // Model FLOPs do not count padding or dropped tokens.
  const double want = 3.0 * moe_layer_forward_flops_per_sequence(q);
  CHECK(moe_near(kernel_level{}.layer(q, p, h100_sxm()).model_flops(), want, 1e-12));
}

TEST_CASE("predict runs a MoE preset with EP from the command line", "[cli][moe]") {
  const auto r = lumos_test::run_cli(
      "predict --model qwen3-30b-a3b --tp 1 --pp 2 --dp 8 --ep 8 --micro-batch 1 --global-batch 16 --json");
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  const auto doc = parser.parse(r.out);
  CHECK(std::int64_t(doc["job"]["ep"]) == 8);
  CHECK(std::int64_t(doc["job"]["experts"]) == 128);
  CHECK(std::int64_t(doc["iteration_ns"]) > 0);
  CHECK(double(doc["memory_bytes_per_gpu"]["total"]) > 0);
  for (const char* bad : {"--model qwen3-30b-a3b --dp 6 --ep 4", "--model llama3-8b --dp 8 --ep 2",
                          "--model qwen3-30b-a3b --dp 8 --tp 2 --ep 8", "--model qwen3-30b-a3b --capacity-factor 0",
                          "--model qwen3-30b-a3b --moe-dispatcher ring", "--model llama3-8b --top-k 2"}) {
    INFO(bad);
    const auto e = lumos_test::run_cli(std::string("predict ") + bad);
    CHECK(e.code == 2);
    CHECK(!e.err.empty());
  }
}

TEST_CASE("deepseek-v3 has its public shape and parameter counts", "[model][moe][mla]") {
  const transformer d = model_preset("deepseek-v3");
  CHECK(d.layers == 61);
  CHECK(d.hidden == 7168);
  CHECK(d.heads == 128);
  CHECK(d.vocab == 129280);
  CHECK(d.ffn == 18432);
  CHECK(d.is_mla());
  CHECK(d.mla.q_lora_rank == 1536);
  CHECK(d.mla.kv_lora_rank == 512);
  CHECK(d.qk_head_dim() == 192);
  CHECK(d.v_head_dim() == 128);
  CHECK(d.moe.experts == 256);
  CHECK(d.moe.shared_experts == 1);
  CHECK(d.moe.top_k == 8);
  CHECK(d.moe.expert_ffn == 2048);
  CHECK(d.moe.first_dense_layers == 3);
  CHECK(d.moe_layers() == 58);
  // DeepSeek-V3 technical report: 671e9 total parameters, 37e9 activated per token, for the main
  // model (the MTP module's 14e9 are not modelled).
  CHECK(moe_near(static_cast<double>(parameter_count(d)), 671e9, 0.01));
  CHECK(moe_near(static_cast<double>(active_parameter_count(d)), 37e9, 0.03));
}

TEST_CASE("MLA FLOPs follow the hand derivation, and its down projections are not split by TP", "[model][moe][mla]") {
  const transformer d = deepseek_v3();
  // Per token, the attention GEMMs of one layer: down projections h x (q_lora + kv_lora + rope) =
  // 7168 x 2112 = 15,138,816; query up 1536 x 128 x 192 = 37,748,736; key/value up
  // 512 x 128 x (128 + 128) = 16,777,216; output 128 x 128 x 7168 = 117,440,512; together
  // 187,105,280 weights. The attention core per token of a sequence of s: QK^T 2 s 128 x 192 and
  // PV 2 s 128 x 128 = s x 81,920.
  CHECK(attention_matmul_weights(d) == 187105280);
  const double s = static_cast<double>(d.seq);
  const double dense_mlp = 3.0 * 7168.0 * 18432.0;
  CHECK(layer_forward_flops_per_sequence(d) == 2.0 * s * (187105280.0 + dense_mlp) + s * s * 81920.0);
  // A MoE layer: the router (7168 x 256) and 8 routed + 1 shared experts of 3 x 7168 x 2048.
  const double moe = 187105280.0 + 7168.0 * 256.0 + 9.0 * 3.0 * 7168.0 * 2048.0;
  CHECK(moe_layer_forward_flops_per_sequence(d) == 2.0 * s * moe + s * s * 81920.0);
  // The cost models' model FLOPs of one MoE layer add up to it (forward + backward = 3x).
  parallel_config p = moe_config(1, 8, 8, 1, 8);
  CHECK(moe_near(kernel_level{}.layer(d, p, h100_sxm()).model_flops(), 3.0 * moe_layer_forward_flops_per_sequence(d), 1e-12));
  CHECK(moe_near(roofline{}.layer(d, p, h100_sxm()).model_flops(), 3.0 * moe_layer_forward_flops_per_sequence(d), 1e-12));
  // TP 2: the down projections run whole on each rank, the up projections are split by heads.
  parallel_config t2 = p;
  t2.tp = 2;
  t2.sp = true;
  t2.dp = 4;
  t2.ep = 4;
  const op_list one = kernel_level{}.layer(d, p, h100_sxm()), two = kernel_level{}.layer(d, t2, h100_sxm());
  const op_cost* down1 = one.find("mla_down_proj", op_phase::forward);
  const op_cost* down2 = two.find("mla_down_proj", op_phase::forward);
  const op_cost* up1 = one.find("mla_q_up_proj", op_phase::forward);
  const op_cost* up2 = two.find("mla_q_up_proj", op_phase::forward);
  REQUIRE(down1 != nullptr);
  REQUIRE(down2 != nullptr);
  REQUIRE(up1 != nullptr);
  REQUIRE(up2 != nullptr);
  CHECK(down1->flops == 2.0 * s * 7168.0 * 2112.0);
  CHECK(down2->flops == down1->flops);
  CHECK(up2->flops == up1->flops / 2);
  CHECK(down1->role == op_role::qkv);  // the sequence-parallel all-gather goes before it
  // Parameters per TP rank: the duplicated down projections and latent norms stay whole.
  const parameter_split a = attention_parameters(d);
  CHECK(a.replicated == 15138816 + 2 * 7168 + 1536 + 512);
  CHECK(layer_parameters_per_rank(d, 2) == a.sharded / 2 + a.replicated + mlp_parameters(d, d.ffn).per_rank(2));
}

TEST_CASE("MoE parallel folding: EP x expert TP divides TP x CP x DP", "[model][moe][folding]") {
  const transformer q = qwen3_235b_a22b();
  // Megatron-Bridge's H100 recipe: TP 2, DP 16 (a stage's 32 ranks), EP 32 with expert TP 1.
  parallel_config p = moe_config(1, 16, 32, 1, 16);
  p.tp = 2;
  p.sp = true;
  CHECK_THROWS_WITH(p.validate(q), Contains("ep * expert tp (32 * 2 = 64) must divide tp * cp * dp (2 * 1 * 16 = 32)"));
  p.etp = 1;
  CHECK_NOTHROW(p.validate(q));
  CHECK(p.expert_tp() == 1);
  CHECK(p.expert_data_parallel() == 1);
  p.ep = 8;  // 32 ranks / (8 x 1): 4 replicas of each expert shard
  CHECK(p.expert_data_parallel() == 4);
  p.etp = 2;  // 32 / (8 x 2)
  CHECK(p.expert_data_parallel() == 2);
  p.etp = 0;  // the default: expert TP = TP, expert DP = dp * cp / ep
  CHECK(p.expert_data_parallel() == 16 / 8);
  p.etp = 3;
  CHECK_THROWS_WITH(p.validate(q), Contains("must divide tp * cp * dp"));
  // Expert TP 1 with TP 2: each rank's router sees its sequence shard, its experts get the
  // copies of that shard at full width; with expert TP 2 the copies of both TP ranks at half width.
  p.ep = 8;
  p.etp = 1;
  const moe_layer_shape x1 = moe_shape(q, p);
  p.etp = 2;
  const moe_layer_shape x2 = moe_shape(q, p);
  CHECK(x1.width == static_cast<double>(q.moe.expert_ffn));
  CHECK(x2.width == static_cast<double>(q.moe.expert_ffn) / 2);
  CHECK(x2.copies == 2 * x1.copies);
  CHECK(moe_layer_expert_parameters_per_rank(q, 1, 8) == 2 * moe_layer_expert_parameters_per_rank(q, 2, 8));
  // The EP group lies over the folded grid: 32 ranks at stride 1 span 4 nodes of 8 GPUs.
  p.ep = 32;
  p.etp = 1;
  CHECK(expert_parallel_group(p, h100_sxm()).size == 32);
  CHECK(expert_parallel_group(p, h100_sxm()).nodes() == 4);
  // Expert TP 1 has no expert-TP all-gather around the experts, only the all-to-alls (and counts).
  std::vector<moe_collective> cs;
  moe_layer_collectives(q, p, cs);
  for (const auto& c : cs) CHECK(c.group != moe_group::tp);
}

TEST_CASE("dropless MoE layers synchronise the host once per forward, and launch a GEMM per local expert", "[model][moe]") {
  transformer q = qwen3_30b_a3b();
  const parallel_config p = moe_config(1, 8, 8, 1, 8);
  const op_list ops = kernel_level{}.layer(q, p, h100_sxm());
  int syncs = 0, sorts = 0;
  for (const op_cost& o : ops.ops) {
    syncs += o.host_sync ? 1 : 0;
    sorts += o.name == "moe_sort_chunks" ? 1 : 0;
    if (o.role == op_role::moe_expert) CHECK(o.kernels == q.moe.experts / 8);
    if (o.host_sync) CHECK(o.phase == op_phase::forward);
  }
  CHECK(syncs == 1);
  CHECK(sorts == 4);  // after the dispatch and before the combine, forward and backward
  REQUIRE(ops.find("moe_token_counts", op_phase::forward) != nullptr);
  q.moe.capacity_factor = 1.0;  // static expert sizes: no counts, no synchronisation
  const op_list padded = kernel_level{}.layer(q, p, h100_sxm());
  for (const op_cost& o : padded.ops) CHECK_FALSE(o.host_sync);
  CHECK(padded.find("moe_token_counts", op_phase::forward) == nullptr);
}

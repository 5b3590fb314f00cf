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
  CHECK(d.mtp_layers == 1);
  CHECK(d.moe_layers() == 59);  // 58 of the decoder and the multi-token-prediction block
  // DeepSeek-V3 technical report: 671e9 total parameters, 37e9 activated per token, for the main
  // model, which is the preset without its multi-token-prediction module.
  transformer main = d;
  main.mtp_layers = 0;
  CHECK(main.moe_layers() == 58);
  CHECK(moe_near(static_cast<double>(parameter_count(main)), 671e9, 0.01));
  CHECK(moe_near(static_cast<double>(active_parameter_count(main)), 37e9, 0.03));
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

TEST_CASE("DeepSeek-V3's multi-token-prediction module: parameters, FLOPs and Megatron-Bridge's pipeline split",
          "[model][moe][mtp]") {
  const transformer d = deepseek_v3();
  transformer main = d;
  main.mtp_layers = 0;
  // The module beside the main model: one MoE block, the projection 2h -> h and three RMSNorms of h
  // (hidden states, embeddings, before the shared head); the embedding and the head are shared.
  const std::int64_t h = 7168;
  const parameter_breakdown pd = parameter_counts(d), pm = parameter_counts(main);
  CHECK(pd.layers - pm.layers == pd.per_moe_layer);
  CHECK(pd.mtp == 2 * h * h + 3 * h);
  CHECK(parameter_count(d) - parameter_count(main) == pd.per_moe_layer + 2 * h * h + 3 * h);
  // About 11.6e9: DeepSeek's 14e9 for the module counts its copies of the embedding and the head too.
  CHECK(moe_near(static_cast<double>(parameter_count(d) - parameter_count(main)), 11.6e9, 0.02));
  // FLOPs: the block, a second logits GEMM and the projection (forward 2 s x weights), x3 for backward.
  const double s = static_cast<double>(d.seq), V = static_cast<double>(d.vocab), hd = static_cast<double>(h);
  const double extra = 3.0 * (moe_layer_forward_flops_per_sequence(d) + 2.0 * s * V * hd + 2.0 * s * 2.0 * hd * hd);
  CHECK(moe_near(model_flops(d, 1) - model_flops(main, 1), extra, 1e-12));
  // Megatron-Bridge's split (PUBLISHED.md section 8): 61 layers + 1 MTP + embedding + loss = 64 over
  // pp 16: the first stage holds 3 layers and the embedding, the last 2 layers, the MTP block and the
  // loss, the others 4 layers.
  parallel_config p = moe_config(16, 16, 8, 1, 2048);
  p.etp = 1;
  CHECK_NOTHROW(p.validate(d));
  CHECK(p.embedding_loss_in_split(d));
  CHECK(p.stage_layers(d, 0) == 3);
  CHECK(p.stage_layers(d, 7) == 4);
  CHECK(p.stage_layers(d, 15) == 3);
  std::int64_t blocks = 0;
  for (int st = 0; st < 16; ++st) blocks += p.stage_layers(d, st);
  CHECK(blocks == 62);
  CHECK(stage_moe_layers(d, p, 15) == 3);
  CHECK(stage_moe_layers(d, p, 0) == 0);
  // Without the module 61 + 2 = 63 does not split over 16.
  CHECK_THROWS_WITH(p.validate(main), Contains("must be divisible by pp * vp"));
  // The last stage holds the module's projection and norms and, untied, its copy of the embedding.
  CHECK(stage_parameters_per_rank(d, p, 15) - 3 * (moe_layer_dense_parameters_per_rank(d, 1) + moe_layer_expert_parameters_per_rank(d, 1, 8)) ==
        h + 129280 * h + 2 * h * h + 3 * h + 129280 * h);
  // The cost models' head runs one output head per loss: the module's logits GEMM doubles the head's.
  // (pp 1: the main model does not split over pp 16.)
  const parallel_config one = moe_config(1, 8, 8, 1, 8);
  const op_list head = kernel_level{}.head(d, one, h100_sxm()), head_main = kernel_level{}.head(main, one, h100_sxm());
  CHECK(moe_near(head.model_flops(), 2.0 * head_main.model_flops() + 3.0 * 2.0 * s * 2.0 * hd * hd, 1e-9));
  CHECK(moe_near(roofline{}.head(d, one, h100_sxm()).model_flops(),
                 2.0 * roofline{}.head(main, one, h100_sxm()).model_flops() + 3.0 * 2.0 * s * 2.0 * hd * hd, 1e-9));
}

TEST_CASE("predict and sweep take --mtp-layers and DeepSeek-V3 on Megatron-Bridge's PP 16 layout predicts", "[model][moe][mtp][cli]") {
  const std::string row = "predict --model deepseek-v3 --gpu b200 --precision fp8 --seq 4096 --tp 1 --pp 16 --dp 16 --ep 8 --expert-tp 1 "
                          "--micro-batch 1 --global-batch 2048 --overlap-param-gather on --json";
  const auto with = lumos_test::run_cli(row);
  REQUIRE(with.code == 0);
  CHECK(with.out.find("\"mtp_layers\":1") != std::string::npos);
  const auto without = lumos_test::run_cli(row + " --mtp-layers 0");
  CHECK(without.code == 2);
  CHECK(without.err.find("layers (61) must be divisible by pp * vp") != std::string::npos);
  // sweep: the module makes pp 16 a split of 64; without it every pp 16 configuration is rejected.
  const std::string sweep = "sweep --gpus 256 --model deepseek-v3 --ep 8 --pp 16 --tp 1 --json";
  const auto swept = lumos_test::run_cli(sweep), swept_without = lumos_test::run_cli(sweep + " --mtp-layers 0");
  REQUIRE(swept.code == 0);
  REQUIRE(swept_without.code == 0);
  CHECK(swept.out.find("\"layer-divisibility\":0") != std::string::npos);
  CHECK(swept_without.out.find("\"layer-divisibility\":9") != std::string::npos);
  const auto bad = lumos_test::run_cli("predict --model deepseek-v3 --mtp-layers -1");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--mtp-layers must be an integer") != std::string::npos);
}

TEST_CASE("measured routing: the busiest EP rank's share of the experts' loads over the mean", "[model][moe][routing]") {
  // tests/data/moe/loop_unbalanced's experts: 200, 130, 90, 92 token copies (mean 128).
  const std::vector<std::int64_t> loads{200, 130, 90, 92};
  CHECK(expert_load_imbalance(loads, 4, 4) == Approx(200.0 / 128.0));
  CHECK(expert_load_imbalance(loads, 4, 2) == Approx(330.0 / 256.0));
  CHECK(expert_load_imbalance(loads, 4, 1) == 1.0);
  // 8 target experts: each traced expert's load split over two, dealt two per rank: as 4 over 4.
  CHECK(expert_load_imbalance(loads, 8, 4) == Approx(200.0 / 128.0));
  CHECK(expert_load_imbalance(loads, 8, 8) == Approx(100.0 / 64.0));
  // 2 target experts: pairs of traced experts summed.
  CHECK(expert_load_imbalance(loads, 2, 2) == Approx(330.0 / 256.0));
  CHECK_THROWS_WITH(expert_load_imbalance(loads, 6, 2), Contains("do not map onto 6 experts"));
  CHECK_THROWS_WITH(expert_load_imbalance(loads, 4, 3), Contains("must divide the experts"));
  CHECK_THROWS_WITH(expert_load_imbalance({0, 0}, 2, 2), Contains("0 tokens"));
  // The busiest rank's experts compute f x the balanced rows; its all-to-alls move f x the bytes.
  transformer m = qwen3_30b_a3b();
  parallel_config p = moe_config(1, 8, 8, 2, 16);
  transformer u = m;
  u.moe.load_imbalance = 1.5;
  CHECK(moe_shape(u, p).rows == 1.5 * moe_shape(m, p).rows);
  CHECK(moe_shape(u, p).routed == moe_shape(m, p).routed);
  std::vector<moe_collective> cb, cu;
  moe_layer_collectives(m, p, cb);
  moe_layer_collectives(u, p, cu);
  REQUIRE(cb.size() == cu.size());
  for (std::size_t i = 0; i < cb.size(); ++i) {
    if (cb[i].kind == collective::all_to_all) CHECK(cu[i].bytes == static_cast<std::int64_t>(1.5 * static_cast<double>(cb[i].bytes)));
  }
  u.moe.load_imbalance = 0.5;
  CHECK_THROWS_WITH(u.validate(), Contains("load_imbalance must be in [1, experts"));
}

TEST_CASE("predict --routing measured: an unbalanced trace predicts slower by what its busiest rank's load says",
          "[model][moe][routing][cli]") {
  const std::string trace = std::string(LUMOS_SOURCE_DIR) + "/tests/data/moe/loop_unbalanced";
  // 4 experts over EP 4: the busiest rank's expert has 200 of a mean 128 copies.
  const std::string job = "predict --model qwen3-30b-a3b --layers 4 --experts 4 --top-k 2 --expert-ffn 4096 --dp 4 --ep 4 "
                          "--micro-batch 4 --global-batch 16 --seq 4096 --json";
  const auto balanced = lumos_test::run_cli(job);
  const auto measured = lumos_test::run_cli(job + " --routing measured --routing-from " + trace);
  REQUIRE(balanced.code == 0);
  REQUIRE(measured.code == 0);
  CHECK(measured.out.find("\"load_imbalance\":1.5625") != std::string::npos);
  auto iteration = [](const std::string& json) {
    simdjson::dom::parser parser;
    return static_cast<double>(parser.parse(json)["iteration_ns"].get_int64().value());
  };
  const double tb = iteration(balanced.out), tm = iteration(measured.out);
  // The busiest rank's expert work (GEMMs, activation, all-to-alls) grows by f = 1.5625, the rest not:
  // the step grows by f - 1 times that work's share of it, so between none and f - 1 of it.
  transformer m = qwen3_30b_a3b();
  m.layers = 4;
  m.moe = {.experts = 4, .shared_experts = 0, .top_k = 2, .expert_ffn = 4096};
  m.seq = 4096;
  parallel_config p = moe_config(1, 4, 4, 4, 16);
  transformer u = m;
  u.moe.load_imbalance = 1.5625;
  const op_list lb = kernel_level{}.layer(m, p, h100_sxm()), lu = kernel_level{}.layer(u, p, h100_sxm());
  double experts_b = 0, experts_u = 0;
  for (const op_cost& o : lb.ops) experts_b += o.role == op_role::moe_expert ? static_cast<double>(o.duration) : 0.0;
  for (const op_cost& o : lu.ops) experts_u += o.role == op_role::moe_expert ? static_cast<double>(o.duration) : 0.0;
  // Large expert GEMMs are compute-bound: their time follows the rows.
  CHECK(experts_u / experts_b == Approx(1.5625).epsilon(0.05));
  // 4 layers x 1 micro-batch of the busiest rank's extra GEMM time at least, and the step grows
  // by less than f.
  CHECK(tm - tb >= 0.95 * 4.0 * (experts_u - experts_b));
  CHECK(tm < 1.5625 * tb);
  // Text: the routing and where it came from.
  const auto text = lumos_test::run_cli(job.substr(0, job.size() - 7) + " --routing measured --routing-from " + trace);
  CHECK(text.out.find("measured routing (busiest EP rank 1.562x the mean load)") != std::string::npos);
  CHECK(text.out.find("M of each expert's down-projection GEMM") != std::string::npos);
  // Bad uses exit 2 with the rule.
  for (const std::string& bad : std::vector<std::string>{" --routing measured", " --routing-from " + trace, " --routing skewed"}) {
    INFO(bad);
    const auto e = lumos_test::run_cli(job + bad);
    CHECK(e.code == 2);
    CHECK(!e.err.empty());
  }
  const auto dense = lumos_test::run_cli("predict --model llama3-8b --routing measured --routing-from " + trace);
  CHECK(dense.code == 2);
  CHECK(dense.err.find("needs a mixture-of-experts model") != std::string::npos);
}

TEST_CASE("predict --routing measured from a trace whose loads are even says measured routing with the loads it read",
          "[model][moe][routing][cli]") {
  // Synth routes evenly: the loads read from its job give imbalance 1, which is still the
  // measured routing of that trace, not the default.
  lumos_test::temp_dir dir;
  const std::string trace = (dir.path() / "even").string();
  REQUIRE(lumos_test::run_cli("synth --model qwen3-30b-a3b --layers 1 --seq 1024 --dp 4 --ep 2 --global-batch 4 --detail kernel --out " + trace).code == 0);
  const std::string job = "predict --model qwen3-30b-a3b --layers 4 --dp 4 --ep 4 --global-batch 4 --seq 1024";
  const auto text = lumos_test::run_cli(job + " --routing measured --routing-from " + trace);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("measured routing (busiest EP rank 1.000x the mean load)") != std::string::npos);
  CHECK(text.out.find("balanced routing") == std::string::npos);
  CHECK(text.out.find("routing from  " + trace) != std::string::npos);
  const auto json = lumos_test::run_cli(job + " --routing measured --routing-from " + trace + " --json");
  REQUIRE(json.code == 0);
  simdjson::dom::parser parser;
  CHECK(parser.parse(json.out)["job"]["load_imbalance"].get_double().value() == 1.0);
  // Balanced routing (the default) keeps its text and leaves the imbalance out.
  const auto balanced = lumos_test::run_cli(job + " --json");
  REQUIRE(balanced.code == 0);
  CHECK(balanced.out.find("load_imbalance") == std::string::npos);
  CHECK(lumos_test::run_cli(job).out.find("balanced routing") != std::string::npos);
}

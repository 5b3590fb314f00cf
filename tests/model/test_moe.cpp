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
  CHECK_THROWS_WITH(moe_config(1, 6, 4, 1, 24).validate(q), Contains("must divide dp"));
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
  REQUIRE(cs.size() == 4);  // dispatch and combine, forward and backward
  for (const auto& c : cs) {
    CHECK(c.kind == collective::all_to_all);
    CHECK(c.bytes == 2 * q.seq * q.moe.top_k * q.hidden * 2);  // each rank's copies, bf16
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

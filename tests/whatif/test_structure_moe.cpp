// Structure discovery of mixture-of-experts layers and all-to-alls: the hand-made MoE traces of
// tests/data/moe (make_moe_trace.py says how they were built) and the real all-to-alls of the shared
// DLRM trace, which are no MoE layers.
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <numeric>
#include <set>
#include <vector>

using namespace lumos;

namespace {

whatif::job_structure discover_moe_job(const std::filesystem::path& path) {
  const trace::job job = trace::load_job({path});
  const graph::built_job built = graph::build_graph(job);
  return whatif::discover_structure(job, built);
}

}  // namespace

TEST_CASE("a loop of per-expert GEMMs after a router gives the measured tokens of each expert", "[whatif][structure][moe]") {
  const auto st = discover_moe_job(lumos_test::data_dir() / "moe" / "loop_unbalanced");
  const auto& moe = st.moe;
  REQUIRE(moe.found());
  CHECK(*moe.layers.value == 2);
  CHECK(*moe.experts.value == 4);
  CHECK(moe.experts.source.find("aten::mm") != std::string::npos);
  CHECK(*moe.experts_per_rank.value == 4);
  CHECK(*moe.ep.value == 1);
  CHECK(*st.parallel.ep.value == 1);
  // 512 token copies over 256 tokens.
  CHECK(*moe.top_k.value == 2);
  REQUIRE(moe.expert_tokens.known());
  CHECK(*moe.expert_tokens.value == std::vector<std::int64_t>{200, 130, 90, 92});
  CHECK(moe.expert_tokens_per == "expert");
  CHECK(moe.expert_tokens.source.find("down-projection") != std::string::npos);
  CHECK(st.all_to_alls.empty());
  // The dense part still reads as a transformer: the router and the experts are not its MLP.
  CHECK(*st.model.layers.value == 2);
  CHECK(*st.model.hidden.value == 256);
}

TEST_CASE("grouped expert GEMMs and all-to-alls with split sizes: tokens per EP peer and sizes joined across ranks",
          "[whatif][structure][moe]") {
  const auto st = discover_moe_job(lumos_test::data_dir() / "moe" / "ep2_grouped_splits");
  const auto& moe = st.moe;
  REQUIRE(moe.found());
  CHECK(*moe.layers.value == 2);
  CHECK(*moe.experts.value == 4);
  CHECK(*moe.experts_per_rank.value == 2);
  CHECK(moe.experts_per_rank.source.find("aten::_grouped_mm") != std::string::npos);
  CHECK(*moe.ep.value == 2);
  CHECK(*st.parallel.ep.value == 2);  // the group's description says EP, and its size agrees
  // Rank 0's experts computed 480 rows and rank 1's 544, from 256 tokens each.
  CHECK(*moe.top_k.value == 2);
  // Rank 0 received 300 copies from itself and 180 from rank 1.
  CHECK(*moe.expert_tokens.value == std::vector<std::int64_t>{300, 180});
  CHECK(moe.expert_tokens_per == "ep_peer");
  // Dispatch and combine of 2 layers, each joined over both ranks with each rank's sizes.
  REQUIRE(st.all_to_alls.size() == 4);
  const auto& dispatch = st.all_to_alls[0];
  CHECK(dispatch.ranks == std::vector<int>{0, 1});
  CHECK(dispatch.in_splits == std::vector<std::int64_t>{300, 212});
  CHECK(dispatch.out_splits == std::vector<std::int64_t>{300, 180});
  CHECK(dispatch.out_elements == std::vector<std::int64_t>{480 * 256, 544 * 256});
  const auto& combine = st.all_to_alls[1];
  CHECK(combine.in_elements == dispatch.out_elements);
  CHECK(combine.out_elements == dispatch.in_elements);
  for (const auto& a : st.all_to_alls) CHECK(a.group == "3");
}

TEST_CASE("grouped GEMM rows that do not divide over the experts still sum to the rows as expert tokens", "[whatif][structure][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "ep2_grouped_splits"});
  const graph::built_job built = graph::build_graph(job);
  const whatif::discovery_inputs in = whatif::make_discovery_inputs(job, built);
  // A grouped GEMM over 3 experts with no split sizes recorded: the per-expert sizes are taken as
  // even, and no row is lost to the division.
  whatif::detail::moe_layer_rec m;
  m.grouped = "aten::_grouped_mm";
  m.local = 3;
  m.rows = 1000;
  whatif::moe_structure moe;
  whatif::detail::moe_expert_tokens(in, 0, m, moe);
  REQUIRE(moe.expert_tokens.known());
  const std::vector<std::int64_t>& tokens = *moe.expert_tokens.value;
  REQUIRE(tokens.size() == 3);
  CHECK(std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0}) == m.rows);
  const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
  CHECK(*hi - *lo <= 1);
}

TEST_CASE("FSDP's all-gather of the experts' weights under TP is no gather of tokens: top-k stays the routers'", "[whatif][structure][moe]") {
  // TP 2 x DP 2 without sequence parallelism (make_moe_trace.py): every router sees the 256 tokens
  // and its experts compute 512 copies; the all-gather between them is FSDP's, of weights.
  const auto st = discover_moe_job(lumos_test::data_dir() / "moe" / "fsdp_tp2");
  REQUIRE(*st.parallel.tp.value == 2);
  REQUIRE(st.moe.found());
  REQUIRE(st.moe.top_k.known());
  CHECK(*st.moe.top_k.value == 2);
  CHECK(st.moe.top_k.source.find("all-gathered") == std::string::npos);
}

TEST_CASE("a router GEMM with as many token rows as experts is read with its dims the right way round", "[whatif][structure][moe]") {
  const auto st = discover_moe_job(lumos_test::data_dir() / "moe" / "router_rows_are_experts");
  const auto& moe = st.moe;
  REQUIRE(moe.found());
  CHECK(*moe.layers.value == 2);
  CHECK(*moe.experts.value == 8);
  CHECK(*moe.experts_per_rank.value == 8);
  CHECK(*moe.top_k.value == 2);  // 16 copies of 8 tokens
  CHECK(*moe.expert_tokens.value == std::vector<std::int64_t>{3, 1, 2, 2, 3, 1, 2, 2});
}

TEST_CASE("a dense job has no MoE layers and says why", "[whatif][structure][moe]") {
  const auto st = discover_moe_job(lumos_test::data_dir() / "whatif" / "pp2_1f1b");
  CHECK_FALSE(st.moe.found());
  CHECK(st.moe.layers.source.find("no router") != std::string::npos);
  CHECK_FALSE(st.moe.experts.known());
  CHECK(st.all_to_alls.empty());
}

TEST_CASE("the DLRM trace's all-to-alls join across its 8 ranks with their sizes and claim no MoE layer",
          "[whatif][structure][moe][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto st = discover_moe_job(traces / "param_dlrm_8xV100");
  CHECK_FALSE(st.moe.found());
  REQUIRE_FALSE(st.all_to_alls.empty());
  const std::vector<int> world = {0, 1, 2, 3, 4, 5, 6, 7};
  std::size_t forward = 0, backward = 0, uneven = 0;
  for (const auto& a : st.all_to_alls) {
    INFO(a.group << " " << whatif::to_string(a.phase) << " " << a.source);
    // One entry per collective joined across every rank, each rank's sizes read from the c10d
    // operator's tensors.
    CHECK(a.ranks == world);
    REQUIRE(a.in_elements.size() == world.size());
    REQUIRE(a.out_elements.size() == world.size());
    for (std::size_t i = 0; i < world.size(); ++i) {
      CHECK(a.in_elements[i] > 0);
      CHECK(a.out_elements[i] > 0);
    }
    CHECK(a.source.find("alltoall") != std::string::npos);
    // What the ranks sent is what they received, however unevenly it was spread.
    CHECK(std::accumulate(a.in_elements.begin(), a.in_elements.end(), std::int64_t{0}) ==
          std::accumulate(a.out_elements.begin(), a.out_elements.end(), std::int64_t{0}));
    uneven += std::set<std::int64_t>(a.out_elements.begin(), a.out_elements.end()).size() > 1;
    forward += a.phase == whatif::phase_kind::forward;
    backward += a.phase == whatif::phase_kind::backward;
  }
  // The groups facet counts the same all-to-alls on the world group.
  std::size_t counted = 0;
  for (const auto& g : st.groups) {
    for (const auto& [kp, n] : g.collectives) {
      if (kp.starts_with("alltoall")) counted += n;
    }
  }
  CHECK(st.all_to_alls.size() == counted);
  CHECK(forward >= 1);
  CHECK(backward >= 1);
  CHECK(uneven >= 1);  // the sparse features' values: each rank receives its embedding shards' share
}

TEST_CASE("the operator names of MoE layers and all-to-alls that PyTorch and Megatron and grouped_gemm record", "[whatif][structure][moe]") {
  using namespace whatif::detail;
  for (const char* n : {"aten::topk", "torch.ops.aten.topk", "fused_topk_with_score_function"}) CHECK(is_topk_op(n));
  CHECK_FALSE(is_topk_op("aten::softmax"));
  for (const char* n : {"aten::_grouped_mm", "grouped_gemm::gmm", "gg::gmm", "TEGroupedLinear", "GroupedGemm"}) CHECK(is_grouped_gemm_op(n));
  CHECK_FALSE(is_grouped_gemm_op("aten::mm"));
  for (const char* n : {"c10d::alltoall_base_", "c10d::alltoall_", "all_to_all_single", "nccl:all_to_all"}) CHECK(is_all_to_all_op(n));
  CHECK_FALSE(is_all_to_all_op("c10d::allreduce_"));
  // Weights as [experts, K, N] or transposed [experts, N, K]; a 2-D weight is no grouped GEMM.
  const auto g = grouped_dims_of({{6144, 2048}, {16, 2048, 768}, {16}});
  REQUIRE(g);
  CHECK((g->rows == 6144 && g->experts == 16 && g->k == 2048 && g->n == 768));
  const auto t = grouped_dims_of({{6144, 2048}, {16, 768, 2048}});
  REQUIRE(t);
  CHECK((t->experts == 16 && t->n == 768));
  CHECK_FALSE(grouped_dims_of({{6144, 2048}, {2048, 768}}));
  CHECK(parse_int_list("[2048, 1024, 0, 4096]") == std::vector<std::int64_t>{2048, 1024, 0, 4096});
  CHECK(parse_int_list("[]").empty());
}

TEST_CASE("expert TP 1 under TP 2: read from the traces, and the MoE what-ifs regroup the folded expert grid", "[whatif][structure][moe]") {
  // Qwen3-30B-A3B's layers, 2 of them, TP 2 with sequence parallelism and expert TP 1, DP 2 (4
  // ranks): the expert grid is EP 2 consecutive ranks, its expert-data-parallel groups {0, 2}, {1, 3}.
  lumos_test::temp_dir dir;
  const auto job_at = [&](int ep, int dp, int expert_ffn = 768) {
    synth::job j;
    j.model = model::model_preset("qwen3-30b-a3b");
    j.model.layers = 2, j.model.seq = 1024, j.model.moe.expert_ffn = expert_ffn;
    j.hardware = model::hardware_preset("h100-sxm");
    j.parallel.tp = 2, j.parallel.sp = true, j.parallel.etp = 1, j.parallel.dp = dp, j.parallel.ep = ep;
    j.parallel.micro_batch = 1, j.parallel.global_batch = 4;
    synth::program_options opt;
    opt.unfold = true;
    const auto out = dir.path() / ("ep" + std::to_string(ep) + "dp" + std::to_string(dp) + "ffn" + std::to_string(expert_ffn));
    (void)lumos_test::write_kernel_job(j, opt, model::profile_preset("h100-sxm"), out);
    return trace::load_job({out});
  };
  const trace::job traced = job_at(2, 2);
  const whatif::job_structure st = whatif::discover_structure(traced, graph::build_graph(traced));
  REQUIRE(st.moe.found());
  CHECK(*st.parallel.tp.value == 2);
  CHECK(*st.moe.ep.value == 2);
  REQUIRE(st.moe.expert_tp.known());
  CHECK(*st.moe.expert_tp.value == 1);
  CHECK_FALSE(st.fsdp.found());
  // Each within 3 % of the direct job (before, read as expert TP 2: --dp 4 +48 %, --expert-ffn
  // 1536 -24 %, --ep 4 refused).
  const auto off = [](time_ns x, time_ns truth) { return std::abs(static_cast<double>(x) / static_cast<double>(truth) - 1.0); };
  const auto direct = [](const trace::job& j) { return report::replay_job(j).simulated_ns; };
  whatif::whatif_options dp4;
  dp4.dp = 4;
  CHECK(off(whatif::run_whatif(traced, dp4).predicted.simulated_ns, direct(job_at(2, 4))) < 0.03);
  whatif::whatif_options ep4;
  ep4.moe.ep = 4;  // EP 4 x expert TP 1 divides the 4 ranks, though not DP 2
  CHECK(off(whatif::run_whatif(traced, ep4).predicted.simulated_ns, direct(job_at(4, 2))) < 0.03);
  whatif::whatif_options ffn;
  ffn.moe.expert_ffn = 1536;
  CHECK(off(whatif::run_whatif(traced, ffn).predicted.simulated_ns, direct(job_at(2, 2, 1536))) < 0.03);
  // Refused: an expert grid that does not fold over the stage's ranks, and a TP change on MoE layers.
  whatif::whatif_options ep8;
  ep8.moe.ep = 8;
  CHECK_THROWS_WITH(whatif::run_whatif(traced, ep8),
                    Catch::Contains("--ep 8: EP x expert TP must divide TP x DP x CP of the target (EP 8 x expert TP 1, TP x DP x CP 4)"));
  whatif::whatif_options tp4;
  tp4.shape.tp = 4;
  CHECK_THROWS_WITH(whatif::run_whatif(traced, tp4), Catch::Contains("whatif --tp: the traces' layers are MoE layers"));
  // Also beside dense layers (DeepSeek-V3's first 3), whose FFN the shape rewrite knows: the
  // experts would be rescaled as the dense MLP (--tp 1 was +40.7 % off the direct job).
  synth::job j;
  j.model = model::model_preset("deepseek-v3");
  j.model.layers = 4, j.model.seq = 1024, j.model.mtp_layers = 0;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.tp = 2, j.parallel.sp = true, j.parallel.etp = 1, j.parallel.dp = 2, j.parallel.ep = 2;
  j.parallel.micro_batch = 1, j.parallel.global_batch = 2;
  (void)lumos_test::write_kernel_job(j, synth::program_options{.unfold = true}, model::profile_preset("h100-sxm"), dir.path() / "mixed");
  whatif::whatif_options tp1;
  tp1.shape.tp = 1;
  CHECK_THROWS_WITH(whatif::run_whatif(trace::load_job({dir.path() / "mixed"}), tp1),
                    Catch::Contains("whatif --tp 1: the traces' layers include MoE layers (1 per pass, expert TP 1)"));
}

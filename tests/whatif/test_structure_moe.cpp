// Structure discovery of mixture-of-experts layers and all-to-alls: the hand-made MoE trace of
// tests/data/moe (make_moe_trace.py says how it was built) and the real all-to-alls of the shared
// DLRM trace, which are no MoE layers.
#include "../unit/test_support.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/whatif/structure.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
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

TEST_CASE("a dense job has no MoE layers and says why", "[whatif][structure][moe]") {
  const auto st = discover_moe_job(lumos_test::data_dir() / "whatif" / "pp2_1f1b");
  CHECK_FALSE(st.moe.found());
  CHECK(st.moe.layers.source.find("no router") != std::string::npos);
  CHECK_FALSE(st.moe.experts.known());
  CHECK(st.all_to_alls.empty());
}

TEST_CASE("the DLRM trace's all-to-alls join across its 8 ranks, with their sizes, and claim no MoE layer",
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

// Context parallelism in traces (whatif/structure/context_parallel.hpp) and the CP what-if
// (whatif/context_parallel.hpp): the hand-made Transformer Engine ring-attention traces of
// tests/data/cp (make_cp_trace.py says how they were built) and the exchange model.
#include "../unit/test_support.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <string_view>

using namespace lumos;

namespace {

const trace::job& te_cp2_job() {
  static const trace::job job = trace::load_job({lumos_test::data_dir() / "cp" / "te_cp2"});
  return job;
}

whatif::job_structure discover_cp_job(const trace::job& job) {
  const graph::built_job built = graph::build_graph(job);
  return whatif::discover_structure(job, built);
}

}  // namespace

TEST_CASE("a group described as cp whose send/recv run inside TE's attention is context parallelism", "[whatif][structure][cp]") {
  const auto st = discover_cp_job(te_cp2_job());
  REQUIRE(st.cp.found());
  CHECK(*st.cp.size.value == 2);
  CHECK(*st.cp.comm.value == "p2p");
  // One ring step (CP - 1) per attention, one attention per layer.
  REQUIRE(st.cp.exchanges_per_layer.known());
  CHECK(*st.cp.exchanges_per_layer.value == 1);
  REQUIRE(st.cp.groups.size() == 1);
  CHECK(st.cp.groups.front() == "5");
  // Its send/recv are no pipeline: one stage, no all-to-all.
  CHECK(st.parallel.pp.value == 1);
  CHECK(st.all_to_alls.empty());
  const auto g = std::find_if(st.groups.begin(), st.groups.end(), [](const whatif::process_group& p) { return p.name == "5"; });
  REQUIRE(g != st.groups.end());
  const bool cp_role = std::any_of(g->roles.begin(), g->roles.end(), [](const auto& r) { return r.value == whatif::group_role::cp; });
  CHECK(cp_role);
  // The traced sequence is the whole one: each rank's GEMMs hold 4096 of its 8192 tokens.
  const whatif::shape_config c = whatif::traced_shape(st);
  CHECK(c.cp == 2);
  CHECK(c.seq == 8192);
  CHECK(c.local_seq() == 4096);
  CHECK(c.tokens() == 4096);
}

TEST_CASE("without a description, send/recv inside the layers' attention make the group CP", "[whatif][structure][cp]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "cp" / "te_cp2_undescribed"});
  const auto st = discover_cp_job(job);
  REQUIRE(st.cp.found());
  CHECK(*st.cp.size.value == 2);
  CHECK(st.cp.size.source.find("inside the layers' attention") != std::string::npos);
}

TEST_CASE("a job without context parallelism has no CP structure", "[whatif][structure][cp]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "gpu" / "h100-base"});
  const auto st = discover_cp_job(job);
  CHECK_FALSE(st.cp.found());
  for (const auto& g : st.groups) {
    for (const auto& r : g.roles) CHECK(r.value != whatif::group_role::cp);
  }
}

TEST_CASE("the ring exchange: cp - 1 steps of the chunk, twice the bytes in backward, none at CP 1", "[whatif][cp]") {
  const model::nccl_link link = model::h100_profile().intra;
  whatif::shape_config c;
  c.hidden = 4096, c.heads = 32, c.head_dim = 128, c.seq = 8192, c.micro_batch = 1, c.tp = 2, c.cp = 2;
  // 2 (K, V) x b x s/cp x kv heads/TP x head dim x 2 bytes.
  CHECK(whatif::cp_chunk_bytes(c, 8) == 2 * 1 * 4096 * 4 * 128 * 2);
  const double two = whatif::cp_exchange_ns(2, whatif::cp_chunk_bytes(c, 8), false, link);
  const double four = whatif::cp_exchange_ns(4, whatif::cp_chunk_bytes(c, 8), false, link);
  CHECK(four == Approx(3 * two));
  CHECK(whatif::cp_exchange_ns(2, whatif::cp_chunk_bytes(c, 8), true, link) > two);
  CHECK(whatif::cp_exchange_ns(1, whatif::cp_chunk_bytes(c, 8), false, link) == 0.0);
}

TEST_CASE("whatif --cp on TE's ring: attention and tokens per rank follow, the exchanges are re-timed or emptied", "[whatif][cp]") {
  const trace::job& job = te_cp2_job();
  whatif::whatif_options four;
  four.shape.cp = 4;
  four.shape.seq = 16384;  // the same 4096 tokens per rank
  const whatif::whatif_result r = whatif::run_whatif(job, four);
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.subject == "CP"; });
  REQUIRE(c != r.changes.end());
  CHECK(c->from == "2");
  CHECK(c->to == "4");
  CHECK(c->figures[0].after == 8.0);  // 2 ranks x 2 layers x forward and backward
  // Three ring steps of the same chunk instead of one.
  CHECK(c->figures[3].after > 2.5 * c->figures[3].before);
  // Twice the keys per query: the attention kernels take longer, the GEMMs do not.
  auto flash = [](const graph::task_graph& g) {
    time_ns t = 0;
    for (graph::task_id i = 0; i < g.task_count(); ++i) t += g.task_name(i).find("flash") != std::string_view::npos ? g.duration[i] : 0;
    return t;
  };
  CHECK(flash(r.predicted.built.graph) > flash(r.baseline.built.graph));

  whatif::whatif_options one;
  one.shape.cp = 1;
  const whatif::whatif_result none = whatif::run_whatif(job, one);
  const auto d = std::find_if(none.changes.begin(), none.changes.end(), [](const whatif::change& x) { return x.subject == "CP"; });
  REQUIRE(d != none.changes.end());
  CHECK(d->figures[1].after == 8.0);
  CHECK(d->figures[3].after == 0.0);
  CHECK(none.predicted.simulated_ns > r.baseline.simulated_ns);  // the whole sequence on each rank

  whatif::whatif_options odd;
  odd.shape.cp = 3;
  CHECK_THROWS_WITH(whatif::run_whatif(job, odd), Catch::Contains("divisible by 2 * cp"));
}

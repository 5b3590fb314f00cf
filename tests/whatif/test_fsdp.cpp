// Fully sharded data parallelism in traces (include/lumos/whatif/structure/fsdp.hpp) and its
// what-if (include/lumos/whatif/fsdp.hpp): discovery on the hand-made FSDP2 traces of
// tests/data/fsdp (make_fsdp_trace.py says how they were built) and on FSDP jobs synthesised at the
// kernel level, whose what-ifs are compared with the target synthesised directly.
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/report/whatif_files.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace lumos;

namespace {

whatif::job_structure discover_fsdp_job(const std::filesystem::path& path) {
  const trace::job job = trace::load_job({path});
  const graph::built_job built = graph::build_graph(job);
  return whatif::discover_structure(job, built);
}

// A Llama-style job of 2 layers (hidden 1024, SwiGLU, 8 KV heads) on `dp` ranks, one sequence of 1024
// per micro-batch, 2 micro-batches per replica.
synth::job fsdp_synth_job(int dp, bool fsdp, bool reshard = true) {
  synth::job j;
  j.model = model::detail::llama3("fsdp-test", 2, 1024, 3584, 16);
  j.model.seq = 1024, j.model.vocab = 32000;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.dp = dp;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = 2 * dp;
  j.parallel.fsdp = fsdp;
  j.parallel.zero_stage = fsdp ? 3 : 1;
  j.parallel.reshard_after_forward = reshard;
  return j;
}

// Writes `j` as kernel-level traces of every rank into `dir`; returns its simulated iteration.
time_ns write_fsdp_job(const synth::job& j, const std::filesystem::path& dir) {
  synth::program_options opt;
  opt.unfold = true;
  return lumos_test::write_kernel_job(j, opt, model::profile_preset("h100-sxm"), dir);
}

double fsdp_error(time_ns predicted, time_ns direct) {
  return std::abs(static_cast<double>(predicted - direct)) / static_cast<double>(direct);
}

const whatif::change* fsdp_change(const whatif::whatif_result& r, std::string_view subject) {
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [&](const whatif::change& x) { return x.subject == subject; });
  return c == r.changes.end() ? nullptr : &*c;
}

}  // namespace

TEST_CASE("FSDP2 traces: the shard group, its units, gathers and reduce-scatters, and the backward re-gathers",
          "[whatif][structure][fsdp]") {
  const auto st = discover_fsdp_job(lumos_test::data_dir() / "fsdp" / "fsdp2_shard2");
  const auto& f = st.fsdp;
  REQUIRE(f.found());
  // Two blocks and the root: 3 reduce-scatters in the one backward pass.
  CHECK(*f.units.value == 3);
  CHECK(*f.reduce_scatters.value == 3);
  // 3 forward gathers and the 2 blocks' again in backward (the root is not resharded).
  CHECK(*f.all_gathers.value == 5);
  CHECK(*f.reshard_after_forward.value == "on");
  CHECK(*f.shard.value == 2);
  CHECK(*f.replicas.value == 1);
  CHECK(f.group == "1");
  CHECK(f.source.find("FSDP::all_gather") != std::string::npos);
  CHECK(f.source.find("FSDP::post_backward_reduce") != std::string::npos);
  CHECK(*st.model.layers.value == 2);
}

TEST_CASE("HSDP traces: the replica group's all-reduces, and no backward gathers without resharding", "[whatif][structure][fsdp]") {
  const auto st = discover_fsdp_job(lumos_test::data_dir() / "fsdp" / "hsdp_2x2");
  const auto& f = st.fsdp;
  REQUIRE(f.found());
  CHECK(*f.units.value == 3);
  CHECK(*f.all_gathers.value == 3);
  CHECK(*f.reshard_after_forward.value == "off");
  CHECK(*f.shard.value == 2);
  CHECK(*f.replicas.value == 2);
  CHECK(f.replica_group == "3");
}

TEST_CASE("FSDP2 over the default process group: the shard group is DP, not TP, and the units' compute is in its passes",
          "[whatif][structure][fsdp]") {
  const auto st = discover_fsdp_job(lumos_test::data_dir() / "fsdp" / "fsdp2_default_pg");
  const auto& f = st.fsdp;
  REQUIRE(f.found());
  CHECK(f.group == "0");
  CHECK(*f.units.value == 3);
  CHECK(*f.all_gathers.value == 5);  // c10d's _allgather_base
  CHECK(*f.reduce_scatters.value == 3);  // c10d's _reduce_scatter_base
  CHECK(*f.shard.value == 2);
  // Its forward all-gathers are the units' parameters: no TP, the group's 2 ranks are DP.
  CHECK(*st.parallel.tp.value == 1);
  CHECK(*st.parallel.dp.value == 2);
  const auto g = std::find_if(st.groups.begin(), st.groups.end(), [](const whatif::process_group& x) { return x.name == "0"; });
  REQUIRE(g != st.groups.end());
  CHECK(g->description == "default_pg");
  CHECK(std::none_of(g->roles.begin(), g->roles.end(), [](const auto& r) { return r.value == whatif::group_role::tp; }));
  const auto dp = std::find_if(g->roles.begin(), g->roles.end(), [](const auto& r) { return r.value == whatif::group_role::dp; });
  REQUIRE(dp != g->roles.end());
  CHECK(dp->source.find("FSDP shard group") != std::string::npos);
  // FSDP::pre_forward marks no phase: the blocks' GEMMs are in the forward pass, whose shapes give the model.
  CHECK(*st.model.hidden.value == 256);
}

TEST_CASE("whatif on FSDP2 traces with c10d's collective names: --fsdp off and --dp", "[whatif][fsdp]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "fsdp" / "fsdp2_default_pg"});
  SECTION("--fsdp off: the _allgather_base and _reduce_scatter_base collectives replaced by buckets") {
    whatif::whatif_options o;
    o.fsdp = false;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    const whatif::change* c = fsdp_change(r, "FSDP");
    REQUIRE(c != nullptr);
    CHECK(c->to == "off");
    REQUIRE(c->figures.size() == 2);
    // 5 gathers and 3 reduce-scatters per rank, matched across the 2 ranks.
    CHECK(c->figures[0].after == 8);
    std::size_t gathers = 0, shard_group_scatters = 0;
    for (const auto& ci : r.predicted.built.graph.collectives) {
      gathers += ci.kind == "allgather";
      shard_group_scatters += ci.kind == "reducescatter" && ci.group == "0";
    }
    CHECK(static_cast<double>(gathers) == c->figures[1].after);
    CHECK(shard_group_scatters == 0);  // the shard group's are gone; the buckets' are the inserted group's
  }
  SECTION("--dp 4: the shard group resized") {
    whatif::whatif_options o;
    o.dp = 4;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    const whatif::change* c = fsdp_change(r, "shard group");
    REQUIRE(c != nullptr);
    CHECK(c->from == "2");
    CHECK(c->to == "4");
    CHECK(r.predicted.simulated_ns > 0);
  }
}

TEST_CASE("no FSDP in traces whose data parallelism gathers only after the step, or that have none", "[whatif][structure][fsdp]") {
  CHECK_FALSE(discover_fsdp_job(lumos_test::data_dir() / "moe" / "loop_unbalanced").fsdp.found());
  lumos_test::temp_dir dir;
  (void)write_fsdp_job(fsdp_synth_job(2, false), dir.path());
  CHECK_FALSE(discover_fsdp_job(dir.path()).fsdp.found());
}

TEST_CASE("no FSDP in a TP group with sequence parallelism: its gathers in forward are activations", "[whatif][structure][fsdp]") {
  lumos_test::temp_dir dir;
  synth::job j = fsdp_synth_job(2, false);
  j.parallel.tp = 2;
  j.parallel.sp = true;
  (void)write_fsdp_job(j, dir.path());
  const whatif::job_structure st = discover_fsdp_job(dir.path());
  CHECK_FALSE(st.fsdp.found());
  REQUIRE(st.parallel.dp.value);
  CHECK(*st.parallel.dp.value == 2);
  CHECK(st.parallel.dp.source.find("DATA_PARALLEL_GROUP") != std::string::npos);
}

TEST_CASE("a synthesised FSDP job: units are its layers, embedding and head, gathered in forward and backward",
          "[whatif][structure][fsdp]") {
  lumos_test::temp_dir dir;
  (void)write_fsdp_job(fsdp_synth_job(4, true), dir.path());
  const auto& f = discover_fsdp_job(dir.path()).fsdp;
  REQUIRE(f.found());
  CHECK(*f.units.value == 4);
  CHECK(*f.reduce_scatters.value == 4 * 2);
  CHECK(*f.all_gathers.value == 4 * 2 * 2);
  CHECK(*f.reshard_after_forward.value == "on");
  CHECK(*f.shard.value == 4);
}

TEST_CASE("whatif on FSDP traces agrees with the target synthesised directly: --dp, --fsdp off, --reshard-after-forward off",
          "[whatif][fsdp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_fsdp_job(fsdp_synth_job(4, true), a);
  const trace::job job = trace::load_job({a});

  SECTION("--dp 8: the units' collectives resized, their count kept") {
    const time_ns direct = write_fsdp_job(fsdp_synth_job(8, true), dir.path() / "b");
    whatif::whatif_options o;
    o.dp = 8, o.global_batch = 16;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, direct) < 0.03);
    const whatif::change* c = fsdp_change(r, "shard group");
    REQUIRE(c != nullptr);
    CHECK(c->from == "4");
    CHECK(c->to == "8");
    // Written out (the 4 traced ranks standing for the 8), the job reads back with shard groups of 8.
    const auto out = dir.path() / "written";
    (void)report::write_whatif_traces(o, r, job, out);
    const auto back = discover_fsdp_job(out);
    REQUIRE(back.fsdp.found());
    CHECK(*back.fsdp.shard.value == 8);
    CHECK(*back.parallel.dp.value == 8);
    CHECK(report::replay_job(trace::load_job({out})).simulated_ns == r.predicted.simulated_ns);
  }
  SECTION("--dp 2: written out, the first 2 ranks with shard groups of 2") {
    whatif::whatif_options o;
    o.dp = 2, o.global_batch = 4;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    const auto out = dir.path() / "written";
    const report::written_traces w = report::write_whatif_traces(o, r, job, out);
    CHECK(w.files.size() == 2);
    const auto back = discover_fsdp_job(out);
    REQUIRE(back.fsdp.found());
    CHECK(*back.fsdp.shard.value == 2);
    CHECK(*back.parallel.dp.value == 2);
    CHECK(*back.parallel.world.value == 2);
    CHECK(report::replay_job(trace::load_job({out})).simulated_ns == r.predicted.simulated_ns);
  }
  SECTION("--fsdp off: the distributed optimizer's buckets instead") {
    const time_ns direct = write_fsdp_job(fsdp_synth_job(4, false), dir.path() / "b");
    whatif::whatif_options o;
    o.fsdp = false;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, direct) < 0.03);
    const whatif::change* c = fsdp_change(r, "FSDP");
    REQUIRE(c != nullptr);
    CHECK(c->to == "off");
    // No all-gather before the optimizer step is left: they all follow it.
    REQUIRE(c->figures.size() == 2);
    // The rank's gathers are now one per bucket, after the step.
    std::size_t gathers = 0;
    for (const auto& ci : r.predicted.built.graph.collectives) gathers += ci.kind.find("gather") != std::string::npos;
    CHECK(static_cast<double>(gathers) == c->figures[1].after);
    REQUIRE(r.shape);
    CHECK(r.shape->predicted.memory_bytes_per_gpu > r.shape->baseline.memory_bytes_per_gpu);  // whole parameters
  }
  SECTION("--reshard-after-forward off: the backward gathers removed") {
    const time_ns direct = write_fsdp_job(fsdp_synth_job(4, true, false), dir.path() / "b");
    whatif::whatif_options o;
    o.reshard_after_forward = false;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, direct) < 0.03);
    const whatif::change* c = fsdp_change(r, "reshard after forward");
    REQUIRE(c != nullptr);
    REQUIRE(c->figures.size() == 1);
    CHECK(c->figures[0].after > 0);
    // The gathers left are those of the job synthesised without resharding.
    const trace::job direct_job = trace::load_job({dir.path() / "b"});
    const graph::built_job direct_graph = graph::build_graph(direct_job);
    auto gathers = [](const graph::task_graph& g) {
      std::size_t n = 0;
      for (const auto& ci : g.collectives) n += ci.kind.find("gather") != std::string::npos;
      return n;
    };
    CHECK(gathers(r.predicted.built.graph) == gathers(direct_graph.graph));
  }
  SECTION("a shard group that does not divide the DP ranks says so") {
    whatif::whatif_options o;
    o.hsdp = 3;
    CHECK_THROWS_WITH(whatif::run_whatif(job, o), Catch::Contains("must divide"));
  }
}

TEST_CASE("whatif --dp on FSDP traces with pipeline stages agrees with the target synthesised directly", "[whatif][fsdp]") {
  lumos_test::temp_dir dir;
  // 4 layers over 2 stages, 2 micro-batches per replica.
  auto staged = [](synth::job j) {
    j.model.layers = 4;
    j.parallel.pp = 2;
    return j;
  };
  auto check_dp = [&](const synth::job& from, const synth::job& to) {
    (void)write_fsdp_job(from, dir.path() / "a");
    const time_ns direct = write_fsdp_job(to, dir.path() / "b");
    whatif::whatif_options o;
    o.dp = to.parallel.dp, o.global_batch = to.parallel.global_batch;
    // Unfolded: every traced rank replays, the replicas beyond the target's DP too.
    whatif::whatif_result r = whatif::run_whatif(trace::load_job({dir.path() / "a"}), o);
    CHECK(fsdp_error(r.predicted.simulated_ns, direct) < 0.005);
    return r;
  };
  SECTION("DP 4 -> 2: the compute that waited for a gather waits for its re-timed end") {
    // Llama 3 8B's layer: the head's gather is long enough that its wait, kept at the traced
    // end, would hold each stage's head back by the time the smaller group saves.
    auto wide = [&](int dp) {
      synth::job j = staged(fsdp_synth_job(dp, true));
      j.model = model::detail::llama3("fsdp-pp-test", 4, 4096, 14336, 32);
      j.model.seq = 1024, j.model.vocab = 32000;
      return j;
    };
    check_dp(wide(4), wide(2));
  }
  SECTION("DP 8 -> 4: the stages' transfers of the replicas beyond the target's DP move onto one node too") {
    // Stages 8 ranks apart cross a node of 8 GPUs; 4 apart they share it. The traced replicas
    // 4..7 stand in for 0..3, and their shard groups' gathers join those of 0..3.
    const whatif::whatif_result r = check_dp(staged(fsdp_synth_job(8, true)), staged(fsdp_synth_job(4, true)));
    // Replicas are symmetric: each traced rank's transfers take the time of the rank it stands for.
    const graph::task_graph& g = r.predicted.built.graph;
    std::map<int, std::vector<time_ns>> transfers;
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      if (g.kind[t] == graph::task_kind::comm_complete || g.kind[t] == graph::task_kind::gpu_comm) transfers[g.rank[t]].push_back(g.duration[t]);
    }
    REQUIRE(transfers.size() == 16);
    for (const int rank : {4, 5, 6, 7, 12, 13, 14, 15}) CHECK(transfers.at(rank) == transfers.at(rank - 4));
  }
}

namespace {

// The HSDP job of `fsdp_synth_job`: shard groups of `shard` ranks, dp / shard replicas.
synth::job hsdp_synth_job(int dp, int shard) {
  synth::job j = fsdp_synth_job(dp, true);
  j.parallel.hsdp = shard;
  return j;
}

// Per rank, the elements of each replica all-reduce in `g` whose group's name starts with
// `prefix`, in order.
std::map<int, std::vector<std::int64_t>> replica_reduces(const graph::task_graph& g, std::string_view prefix) {
  std::map<int, std::vector<std::int64_t>> out;
  for (const auto& ci : g.collectives) {
    if (ci.kind != "allreduce" || !ci.group.starts_with(prefix)) continue;
    for (const graph::task_id t : ci.complete) out[g.rank[t]].push_back(ci.bytes);
  }
  return out;
}

}  // namespace

TEST_CASE("whatif --hsdp on FSDP and HSDP traces agrees with the HSDP job synthesised directly", "[whatif][fsdp][hsdp]") {
  lumos_test::temp_dir dir;
  (void)write_fsdp_job(fsdp_synth_job(4, true), dir.path() / "fsdp");
  (void)write_fsdp_job(hsdp_synth_job(4, 2), dir.path() / "hsdp");
  const trace::job fsdp = trace::load_job({dir.path() / "fsdp"});
  const trace::job hsdp = trace::load_job({dir.path() / "hsdp"});
  auto direct = [&](const synth::job& j, const std::string& name) { return write_fsdp_job(j, dir.path() / name); };

  SECTION("HSDP traces: DP is the shard group times its replicas") {
    const auto st = discover_fsdp_job(dir.path() / "hsdp");
    CHECK(*st.fsdp.shard.value == 2);
    CHECK(*st.fsdp.replicas.value == 2);
    CHECK(*st.parallel.dp.value == 4);
  }
  SECTION("FSDP -> --hsdp 2: each unit's shard all-reduced over 2 replicas after the final backward") {
    const time_ns t = direct(hsdp_synth_job(4, 2), "b");
    whatif::whatif_options o;
    o.hsdp = 2;
    const whatif::whatif_result r = whatif::run_whatif(fsdp, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    const whatif::change* c = fsdp_change(r, "HSDP");
    REQUIRE(c != nullptr);
    CHECK(c->from == "4 x 1");
    CHECK(c->to == "2 x 2");
    REQUIRE(fsdp_change(r, "HSDP shard group") != nullptr);
    // As many all-reduces per rank, of the same messages, as the job synthesised with HSDP.
    const trace::job b = trace::load_job({dir.path() / "b"});
    const auto want = replica_reduces(graph::build_graph(b).graph, "fsdp.replica.");
    const auto got = replica_reduces(r.predicted.built.graph, whatif::inserted_hsdp_group);
    REQUIRE(got.size() == r.predicted.ranks.size());
    for (const auto& [rank, elements] : got) {
      REQUIRE(want.contains(rank));
      CHECK(elements == want.at(rank));
    }
    for (const auto& ci : r.predicted.built.graph.collectives) {
      if (ci.group.starts_with(whatif::inserted_hsdp_group)) CHECK(ci.group_ranks.size() == 2);
    }
    REQUIRE(r.shape);
    CHECK(r.shape->predicted.memory_bytes_per_gpu > r.shape->baseline.memory_bytes_per_gpu);  // states over 2 ranks, not 4

    // Written out, the job reads back as the target (shard groups of 2, their replica
    // all-reduces, DP 4) and replays to the prediction.
    const auto out = dir.path() / "written";
    (void)report::write_whatif_traces(o, r, fsdp, out);
    const auto back = discover_fsdp_job(out);
    REQUIRE(back.fsdp.found());
    CHECK(*back.fsdp.shard.value == 2);
    CHECK(*back.fsdp.replicas.value == 2);
    CHECK(*back.parallel.dp.value == 4);
    CHECK(back.fsdp.replica_group.starts_with(whatif::inserted_hsdp_group));
    CHECK(report::replay_job(trace::load_job({out})).simulated_ns == r.predicted.simulated_ns);
  }
  SECTION("FSDP with interleaved pipeline stages -> --hsdp 2: each stage's chunks all-reduce their own units") {
    auto staged = [](synth::job j) {
      j.model.layers = 4;
      j.parallel.pp = 2, j.parallel.vp = 2, j.parallel.global_batch = 16;
      return j;
    };
    (void)write_fsdp_job(staged(fsdp_synth_job(4, true)), dir.path() / "pp");
    const time_ns t = direct(staged(hsdp_synth_job(4, 2)), "b");
    whatif::whatif_options o;
    o.hsdp = 2;
    const whatif::whatif_result r = whatif::run_whatif(trace::load_job({dir.path() / "pp"}), o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    // Per rank the all-reduces of the job synthesised with HSDP: both chunks' units, on both stages.
    const auto want = replica_reduces(graph::build_graph(trace::load_job({dir.path() / "b"})).graph, "fsdp.replica.");
    const auto got = replica_reduces(r.predicted.built.graph, whatif::inserted_hsdp_group);
    REQUIRE(got.size() == r.predicted.ranks.size());
    std::set<std::size_t> stages;
    for (const auto& [rank, elements] : got) {
      REQUIRE(want.contains(rank));
      CHECK(elements == want.at(rank));
      stages.insert(static_cast<std::size_t>(rank) / 4);
    }
    CHECK(stages.size() == 2);
  }
  SECTION("HSDP -> --hsdp 4: the replica all-reduces removed, plain FSDP") {
    const time_ns t = direct(fsdp_synth_job(4, true), "b");
    whatif::whatif_options o;
    o.hsdp = 4;
    const whatif::whatif_result r = whatif::run_whatif(hsdp, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    CHECK(replica_reduces(r.predicted.built.graph, "fsdp.replica.").empty());
    CHECK(replica_reduces(r.predicted.built.graph, whatif::inserted_hsdp_group).empty());
    // Written out: one shard group of the 4 ranks, no replicas, replaying to the prediction.
    const auto out = dir.path() / "written";
    (void)report::write_whatif_traces(o, r, hsdp, out);
    const auto back = discover_fsdp_job(out);
    REQUIRE(back.fsdp.found());
    CHECK(*back.fsdp.shard.value == 4);
    CHECK(back.fsdp.replicas.value.value_or(1) == 1);
    CHECK(*back.parallel.dp.value == 4);
    CHECK(report::replay_job(trace::load_job({out})).simulated_ns == r.predicted.simulated_ns);
  }
  SECTION("HSDP -> --dp 8: the shard group kept, 4 replicas") {
    const time_ns t = direct(hsdp_synth_job(8, 2), "b");
    whatif::whatif_options o;
    o.dp = 8, o.global_batch = 16;
    const whatif::whatif_result r = whatif::run_whatif(hsdp, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    for (const auto& ci : r.predicted.built.graph.collectives) {
      if (ci.group.starts_with(whatif::inserted_hsdp_group)) CHECK(ci.group_ranks.size() == 4);
    }
  }
  SECTION("HSDP -> --fsdp off: the distributed optimizer's buckets instead of every FSDP collective") {
    const time_ns t = direct(fsdp_synth_job(4, false), "b");
    whatif::whatif_options o;
    o.fsdp = false;
    const whatif::whatif_result r = whatif::run_whatif(hsdp, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    CHECK(replica_reduces(r.predicted.built.graph, "fsdp.replica.").empty());
  }
  SECTION("TP's backward all-reduces are not a replica group") {
    synth::job j = fsdp_synth_job(4, true);
    j.parallel.tp = 2;
    (void)write_fsdp_job(j, dir.path() / "tp");
    const auto st = discover_fsdp_job(dir.path() / "tp");
    REQUIRE(st.fsdp.found());
    CHECK(*st.fsdp.replicas.value == 1);
    CHECK(*st.parallel.dp.value == 4);
  }
  SECTION("what is not rewritten says so") {
    (void)write_fsdp_job(fsdp_synth_job(4, false), dir.path() / "zero1");
    whatif::whatif_options o;
    o.hsdp = 2;
    CHECK_THROWS_WITH(whatif::run_whatif(trace::load_job({dir.path() / "zero1"}), o), Catch::Contains("do not run FSDP"));
    o.hsdp = 1;
    CHECK_THROWS_WITH(whatif::run_whatif(fsdp, o), Catch::Contains("--hsdp 1"));
    o.hsdp = 2;
    o.layers = 4;
    CHECK_THROWS_WITH(whatif::run_whatif(fsdp, o), Catch::Contains("--layers"));
  }
}

namespace {

// The DDP job of `fsdp_synth_job`: gradients all-reduced in buckets, every rank stepping every parameter.
synth::job ddp_synth_job(int dp) {
  synth::job j = fsdp_synth_job(dp, false);
  j.parallel.zero_stage = 0;
  return j;
}

// Per traced rank: the all-gathers and reduce-scatters `--fsdp on` inserted into `g`.
std::map<int, std::pair<std::size_t, std::size_t>> inserted_fsdp(const graph::task_graph& g) {
  std::map<int, std::pair<std::size_t, std::size_t>> out;
  for (const auto& ci : g.collectives) {
    if (!ci.group.starts_with(whatif::inserted_fsdp_group)) continue;
    auto& [gathers, scatters] = out[g.rank[ci.complete.front()]];
    ++(ci.kind == "allgather" ? gathers : scatters);
  }
  return out;
}

// Every inserted collective's waits held in the replay: each gather ends before the first kernel
// of its unit starts, and each reduce-scatter starts after its unit's last kernel ends.
void check_fsdp_waits(const whatif::whatif_result& r) {
  const graph::task_graph& g = r.predicted.built.graph;
  const report::task_times times = r.predicted.simulated_times();
  std::vector<std::uint8_t> gather(g.task_count(), 0), scatter(g.task_count(), 0);
  for (const auto& ci : g.collectives) {
    if (!ci.group.starts_with(whatif::inserted_fsdp_group)) continue;
    (ci.kind == "allgather" ? gather : scatter)[ci.complete.front()] = 1;
    if (ci.kind != "allgather") scatter[ci.arrive.front()] = 1;
  }
  std::size_t fed = 0, waited = 0;
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::cross_stream) continue;
    if (gather[e.from] && g.kind[e.to] == graph::task_kind::gpu_compute) {
      ++fed;
      CHECK(times.begin_of(e.to) >= times.end_of(e.from));
    }
    if (scatter[e.to] && g.kind[e.to] == graph::task_kind::comm_arrive && g.kind[e.from] == graph::task_kind::gpu_compute) {
      ++waited;
      CHECK(times.begin_of(e.to) >= times.end_of(e.from));
    }
  }
  const auto counts = inserted_fsdp(g);
  std::size_t gathers = 0, scatters = 0;
  for (const auto& [rank, n] : counts) gathers += n.first, scatters += n.second;
  CHECK(fed == gathers);
  CHECK(waited == scatters);
}

// The data-parallel collectives left in `r`'s prediction of the traces' own groups.
std::size_t traced_dp_collectives(const whatif::whatif_result& r) {
  REQUIRE(r.structure);
  const std::set<std::string> dp = whatif::groups_with_role(*r.structure, whatif::group_role::dp);
  REQUIRE_FALSE(dp.empty());
  return static_cast<std::size_t>(std::count_if(r.predicted.built.graph.collectives.begin(), r.predicted.built.graph.collectives.end(),
                                                [&](const graph::collective_instance& ci) { return dp.contains(ci.group); }));
}

}  // namespace

TEST_CASE("whatif --fsdp on from distributed-optimizer and DDP traces agrees with the FSDP job synthesised directly",
          "[whatif][fsdp]") {
  lumos_test::temp_dir dir;
  (void)write_fsdp_job(fsdp_synth_job(4, false), dir.path() / "zero1");
  const trace::job job = trace::load_job({dir.path() / "zero1"});
  // The truth: the FSDP jobs synthesised directly, and what discovery counts of their collectives.
  auto direct = [&](int dp, bool reshard, const std::string& name) {
    const time_ns t = write_fsdp_job(fsdp_synth_job(dp, true, reshard), dir.path() / name);
    return std::pair{t, discover_fsdp_job(dir.path() / name).fsdp};
  };
  whatif::whatif_options on;
  on.fsdp = true;

  SECTION("the distributed optimizer's buckets replaced by each unit's gathers and reduce-scatters") {
    const auto [t, f] = direct(4, true, "b");
    const whatif::whatif_result r = whatif::run_whatif(job, on);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    const whatif::change* c = fsdp_change(r, "FSDP");
    REQUIRE(c != nullptr);
    CHECK(c->from == "off");
    CHECK(c->to == "on");
    REQUIRE(c->figures.size() == 3);
    CHECK(c->figures[0].after > 0);
    CHECK(traced_dp_collectives(r) == 0);
    const auto counts = inserted_fsdp(r.predicted.built.graph);
    REQUIRE(counts.size() == r.predicted.ranks.size());
    for (const auto& [rank, n] : counts) {
      CHECK(n.first == static_cast<std::size_t>(*f.all_gathers.value));
      CHECK(n.second == static_cast<std::size_t>(*f.reduce_scatters.value));
    }
    CHECK(c->figures[1].after == static_cast<double>(*f.all_gathers.value) * static_cast<double>(counts.size()));
    check_fsdp_waits(r);
    // The memory summary counts FSDP as it counts the FSDP job's own traces.
    whatif::whatif_options kept;
    kept.reshard_after_forward = true;
    const whatif::whatif_result fsdp = whatif::run_whatif(trace::load_job({dir.path() / "b"}), kept);
    REQUIRE(r.shape);
    REQUIRE(fsdp.shape);
    CHECK(r.shape->predicted.memory_bytes_per_gpu < r.shape->baseline.memory_bytes_per_gpu);
    CHECK(r.shape->predicted.memory_bytes_per_gpu == Approx(fsdp.shape->baseline.memory_bytes_per_gpu));
  }
  SECTION("reshard after forward off: the backward passes gather nothing") {
    const auto [t, f] = direct(4, false, "b");
    whatif::whatif_options o = on;
    o.reshard_after_forward = false;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    for (const auto& [rank, n] : inserted_fsdp(r.predicted.built.graph)) {
      CHECK(n.first == static_cast<std::size_t>(*f.all_gathers.value));
      CHECK(n.second == static_cast<std::size_t>(*f.reduce_scatters.value));
    }
  }
  SECTION("with --dp 8 and the global batch that keeps the micro-batches: a shard group of 8") {
    const auto [t, f] = direct(8, true, "b");
    whatif::whatif_options o = on;
    o.dp = 8, o.global_batch = 16;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    for (const auto& ci : r.predicted.built.graph.collectives) {
      if (ci.group.starts_with(whatif::inserted_fsdp_group)) CHECK(ci.group_ranks.size() == 8);
    }
    // The micro-batches per replica changing (the global batch kept) is not built.
    whatif::whatif_options kept = on;
    kept.dp = 8;
    CHECK_THROWS_WITH(whatif::run_whatif(job, kept), Catch::Contains("--global-batch"));
  }
  SECTION("from DDP: the all-reduce buckets removed and the optimizer sharded") {
    const auto [t, f] = direct(4, true, "b");
    (void)write_fsdp_job(ddp_synth_job(4), dir.path() / "ddp");
    const trace::job ddp = trace::load_job({dir.path() / "ddp"});
    const whatif::whatif_result r = whatif::run_whatif(ddp, on);
    CHECK(fsdp_error(r.predicted.simulated_ns, t) < 0.03);
    CHECK(traced_dp_collectives(r) == 0);
    const whatif::change* c = fsdp_change(r, "optimizer share");
    REQUIRE(c != nullptr);
    CHECK(c->to == "1/4");
    for (const auto& [rank, n] : inserted_fsdp(r.predicted.built.graph)) {
      CHECK(n.first == static_cast<std::size_t>(*f.all_gathers.value));
      CHECK(n.second == static_cast<std::size_t>(*f.reduce_scatters.value));
    }
    check_fsdp_waits(r);
  }
  SECTION("the written traces read back as the FSDP job and replay to the prediction") {
    const auto [t, f] = direct(4, true, "b");
    const whatif::whatif_result r = whatif::run_whatif(job, on);
    const auto out = dir.path() / "written";
    (void)report::write_whatif_traces(on, r, job, out);
    const auto& back = discover_fsdp_job(out).fsdp;
    REQUIRE(back.found());
    CHECK(*back.units.value == *f.units.value);
    CHECK(*back.all_gathers.value == *f.all_gathers.value);
    CHECK(*back.reduce_scatters.value == *f.reduce_scatters.value);
    CHECK(*back.shard.value == 4);
    CHECK(*back.reshard_after_forward.value == "on");
    const trace::job written = trace::load_job({out});
    CHECK(report::replay_job(written).simulated_ns == r.predicted.simulated_ns);
  }
  SECTION("what stays refused says so") {
    whatif::whatif_options layers = on;
    layers.layers = 4;
    CHECK_THROWS_WITH(whatif::run_whatif(job, layers), Catch::Contains("--layers"));
    whatif::whatif_options hsdp = on;
    hsdp.hsdp = 2;
    CHECK_THROWS_WITH(whatif::run_whatif(job, hsdp), Catch::Contains("hybrid sharding"));
    (void)write_fsdp_job(fsdp_synth_job(1, false), dir.path() / "one");
    CHECK_THROWS_WITH(whatif::run_whatif(trace::load_job({dir.path() / "one"}), on), Catch::Contains("reduce no data-parallel gradients"));
  }
}

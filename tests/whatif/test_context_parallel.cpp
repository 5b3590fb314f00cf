// Context parallelism in traces (whatif/structure/context_parallel.hpp) and the CP what-if
// (whatif/context_parallel.hpp): the hand-made Transformer Engine ring-attention traces of
// tests/data/cp (make_cp_trace.py says how they were built) and the exchange model; CP composed
// with DP, the global batch and pipeline changes on jobs synthesised at the kernel level, against
// the target synthesised directly.
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

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

// A Llama-style job of 2 layers (hidden 1024, SwiGLU, 8 KV heads, vocabulary 32000), sequence 4096,
// one sequence per micro-batch, `global_batch` sequences, with CP `cp` exchanging keys and values as
// `comm` says, DP `dp` and `pp` stages of `schedule`.
synth::job cp_synth_job(int cp, int dp, int global_batch, int pp = 1, const std::string& schedule = "",
                        model::cp_comm_kind comm = model::cp_comm_kind::p2p) {
  synth::job j;
  j.model = model::detail::llama3("cp-test", 2, 1024, 3584, 8);
  j.model.seq = 4096, j.model.vocab = 32000;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.cp = cp, j.parallel.dp = dp, j.parallel.pp = pp;
  j.parallel.cp_comm = comm;
  j.parallel.micro_batch = 1, j.parallel.global_batch = global_batch;
  j.parallel.zero_stage = 1;  // Megatron's distributed optimizer, as `lumos synth` runs it
  j.parallel.schedule = schedule;
  return j;
}

// Writes `j` as kernel-level traces of every rank into `dir`; returns its simulated iteration.
time_ns write_cp_job(const synth::job& j, const std::filesystem::path& dir) {
  synth::program_options opt;
  opt.unfold = true;
  const model::cost_profile profile = model::profile_preset("h100-sxm");
  opt.p2p_host_sync = profile.cpu_p2p_sync > 0;  // as `lumos synth` writes them
  return lumos_test::write_kernel_job(j, opt, profile, dir);
}

double cp_error(time_ns predicted, time_ns direct) {
  return std::abs(static_cast<double>(predicted - direct)) / static_cast<double>(direct);
}

const whatif::change* cp_change(const whatif::whatif_result& r, std::string_view subject) {
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [&](const whatif::change& x) { return x.subject == subject; });
  return c == r.changes.end() ? nullptr : &*c;
}

// Per rank of `g`, the exchange kernels on its context-parallel streams.
std::map<int, int> exchanges_per_rank(const graph::task_graph& g) {
  std::map<int, int> out;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] != graph::task_kind::comm_complete && g.kind[t] != graph::task_kind::gpu_comm) continue;
    if (g.processors[g.processor[t]].name.find("context-parallel") == std::string::npos) continue;
    ++out[g.rank[t]];
  }
  return out;
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

TEST_CASE("whatif --dp on CP traces resizes the DP x CP gradient group and keeps the global batch", "[whatif][cp][dp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(2, 2, 4), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.dp = 4;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const time_ns direct = write_cp_job(cp_synth_job(2, 4, 4), dir.path() / "b");
  CHECK(cp_error(r.predicted.simulated_ns, direct) <= 0.03);
  // The gradient group of 2 replicas x CP 2 becomes 4 x 2; 4 sequences over 4 replicas.
  const whatif::change* dp = cp_change(r, "DP");
  REQUIRE(dp != nullptr);
  CHECK(dp->from == "4");
  CHECK(dp->to == "8");
  const whatif::change* m = cp_change(r, "micro-batches per replica");
  REQUIRE(m != nullptr);
  CHECK(m->from == "2");
  CHECK(m->to == "1");
  std::size_t scatters = 0;
  for (const auto& ci : r.predicted.built.graph.collectives) {
    if (whatif::collective_of_kind(ci.kind) != model::collective::reduce_scatter) continue;
    CHECK(ci.group_ranks.size() == 8);
    ++scatters;
  }
  CHECK(scatters > 0);
  // The global batch in sequences: 8 over 2 replicas is 4 micro-batches each.
  whatif::whatif_options g;
  g.global_batch = 8;
  const whatif::whatif_result rg = whatif::run_whatif(job, g);
  const whatif::change* mg = cp_change(rg, "micro-batches per replica");
  REQUIRE(mg != nullptr);
  CHECK(mg->to == "4");
  CHECK(cp_error(rg.predicted.simulated_ns, write_cp_job(cp_synth_job(2, 2, 8), dir.path() / "g")) <= 0.03);
}

TEST_CASE("whatif --cp with --dp: the data-parallel pass resizes the gradients once to DP x CP", "[whatif][cp][dp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(2, 2, 4), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.shape.cp = 4, o.dp = 1;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const time_ns direct = write_cp_job(cp_synth_job(4, 1, 4), dir.path() / "b");
  CHECK(cp_error(r.predicted.simulated_ns, direct) <= 0.03);
  // The CP pass leaves the gradients to the data-parallel pass: none re-timed twice.
  const whatif::change* cp = cp_change(r, "CP");
  REQUIRE(cp != nullptr);
  CHECK(cp->figures[4].before == 0.0);
  const whatif::change* m = cp_change(r, "micro-batches per replica");
  REQUIRE(m != nullptr);
  CHECK(m->from == "2");
  CHECK(m->to == "4");
  const bool grouped = std::any_of(r.changes.begin(), r.changes.end(), [](const whatif::change& c) {
    return c.text.find("2 x 2 -> 1 x 4") != std::string::npos;
  });
  CHECK(grouped);
}

TEST_CASE("whatif --cp 2 --pp 2 from CP 1: every stage's passes carry the inserted exchanges", "[whatif][cp][pp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(1, 1, 2), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.shape.cp = 2, o.pp = 2;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  REQUIRE(r.stages);
  const time_ns direct = write_cp_job(cp_synth_job(2, 1, 2, 2), dir.path() / "b");
  CHECK(cp_error(r.predicted.simulated_ns, direct) <= 0.03);
  // Each stage holds one layer: one exchange per forward and per backward pass of its 2 micro-batches.
  const std::map<int, int> n = exchanges_per_rank(r.predicted.built.graph);
  REQUIRE(n.size() == 2);
  for (const auto& [rank, count] : n) CHECK(count == 4);
}

TEST_CASE("whatif with CP: a pipeline change the graph cannot make is refused", "[whatif][cp][pp]") {
  lumos_test::temp_dir dir;
  (void)write_cp_job(cp_synth_job(2, 1, 2, 2, "zb-h1"), dir.path());
  const trace::job job = trace::load_job({dir.path()});
  whatif::whatif_options o;
  o.schedule = synth::parse_schedule("1f1b");
  CHECK_THROWS_WITH(whatif::run_whatif(job, o), Catch::Contains("pass-level pipeline model does not time the key/value exchanges"));
}

TEST_CASE("whatif --cp 2 from CP 1 with more micro-batches repeats the inserted exchanges with their layers", "[whatif][cp][dp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(1, 1, 2), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.shape.cp = 2, o.global_batch = 4;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const time_ns direct = write_cp_job(cp_synth_job(2, 1, 4), dir.path() / "b");
  CHECK(cp_error(r.predicted.simulated_ns, direct) <= 0.03);
  // 2 layers x 4 micro-batches x forward and backward.
  const std::map<int, int> n = exchanges_per_rank(r.predicted.built.graph);
  REQUIRE(n.size() == 1);
  CHECK(n.begin()->second == 16);
}

namespace {

constexpr auto allgather = model::cp_comm_kind::allgather;

// Per rank of `g`: the collective instances of `kind` that a CP change inserted (their folded
// group `cp.folded.R`).
std::map<int, int> inserted_cp_collectives(const graph::task_graph& g, std::string_view kind) {
  std::map<int, int> out;
  for (const graph::collective_instance& ci : g.collectives) {
    if (!ci.group.starts_with("cp.folded.") || ci.kind != kind) continue;
    REQUIRE(ci.complete.size() == 1);
    CHECK(ci.group == "cp.folded." + std::to_string(g.rank[ci.complete.front()]));
    ++out[g.rank[ci.complete.front()]];
  }
  return out;
}

// The transfer of every inserted collective of `kind`, each checked to run on the compute
// stream (not on a context-parallel one).
std::vector<time_ns> inserted_transfers(const graph::task_graph& g, std::string_view kind) {
  std::vector<time_ns> out;
  for (const graph::collective_instance& ci : g.collectives) {
    if (!ci.group.starts_with("cp.folded.") || ci.kind != kind) continue;
    const graph::task_id t = ci.complete.front();
    CHECK(g.processors[g.processor[t]].name.find("context-parallel") == std::string::npos);
    out.push_back(g.duration[t]);
  }
  return out;
}

}  // namespace

TEST_CASE("the all-gather variant's traces: the CP group is found with its exchange and is no FSDP shard group",
          "[whatif][structure][cp]") {
  lumos_test::temp_dir dir;
  (void)write_cp_job(cp_synth_job(2, 2, 4, 1, "", allgather), dir.path());
  const trace::job job = trace::load_job({dir.path()});
  const auto st = discover_cp_job(job);
  REQUIRE(st.cp.found());
  CHECK(*st.cp.size.value == 2);
  CHECK(*st.cp.comm.value == "allgather");
  // One all-gather per layer of a forward pass (the reduce-scatters are the backward's).
  REQUIRE(st.cp.exchanges_per_layer.known());
  CHECK(*st.cp.exchanges_per_layer.value == 1);
  // It gathers in forward and reduce-scatters in backward as an FSDP shard group does, but its
  // description makes it CP: no parameters are sharded, and DP stays the gradient group's.
  CHECK_FALSE(st.fsdp.found());
  CHECK(st.parallel.dp.value == 4);
  const whatif::shape_config c = whatif::traced_shape(st);
  CHECK(c.cp == 2);
  CHECK(c.cp_comm == allgather);
  // The ring's traces keep theirs.
  CHECK(whatif::traced_shape(discover_cp_job(te_cp2_job())).cp_comm == model::cp_comm_kind::p2p);
}

TEST_CASE("whatif --cp-comm allgather from the ring: per layer an all-gather before the attention and a reduce-scatter after it",
          "[whatif][cp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(2, 1, 2), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.shape.cp_comm = allgather;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const synth::job target = cp_synth_job(2, 1, 2, 1, "", allgather);
  CHECK(cp_error(r.predicted.simulated_ns, write_cp_job(target, dir.path() / "b")) <= 0.03);
  // 2 layers x 2 micro-batches on each traced rank (both CP ranks are written).
  const std::map<int, int> gathers = inserted_cp_collectives(r.predicted.built.graph, "allgather");
  const std::map<int, int> scatters = inserted_cp_collectives(r.predicted.built.graph, "reducescatter");
  REQUIRE(gathers.size() == 2);
  REQUIRE(scatters.size() == 2);
  for (const auto& [rank, n] : gathers) CHECK(n == 4);
  for (const auto& [rank, n] : scatters) CHECK(n == 4);
  // Each the model's exchange of the whole K and V (cp x the chunk) over the CP group.
  const model::nccl_model nccl{model::profile_preset("h100-sxm")};
  const model::cp_exchange fwd = model::context_parallel_exchange(target.model, target.parallel, target.hardware, nccl, false);
  const model::cp_exchange bwd = model::context_parallel_exchange(target.model, target.parallel, target.hardware, nccl, true);
  CHECK(fwd.bytes == 2 * 2 * 2048 * 8 * 128 * 2);  // CP x (K, V) x seq / CP x KV heads x head dim x 2 bytes
  for (const time_ns t : inserted_transfers(r.predicted.built.graph, "allgather")) CHECK(t == fwd.duration);
  for (const time_ns t : inserted_transfers(r.predicted.built.graph, "reducescatter")) CHECK(t == bwd.duration);
  // The ring's exchanges are removed with their launches.
  const whatif::change* cp = cp_change(r, "CP");
  REQUIRE(cp != nullptr);
  CHECK(cp->from == "2 (p2p)");
  CHECK(cp->to == "2 (allgather)");
  CHECK(cp->text.find("exchange p2p -> allgather") != std::string::npos);
  CHECK(cp->figures[1].after == 16.0);  // 2 ranks x 2 layers x 2 micro-batches x forward and backward
  CHECK(cp->figures[2].after == 16.0);
  CHECK(cp->text.find("16 removed with their launches") != std::string::npos);
  CHECK(exchanges_per_rank(r.predicted.built.graph).empty());
}

TEST_CASE("whatif from the all-gather variant: re-timed with CP, emptied to CP 1, replaced by the ring", "[whatif][cp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(2, 1, 2, 1, "", allgather), a);
  const trace::job job = trace::load_job({a});

  whatif::whatif_options four;
  four.shape.cp = 4, four.shape.seq = 8192;
  const whatif::whatif_result r4 = whatif::run_whatif(job, four);
  synth::job four_job = cp_synth_job(4, 1, 2, 1, "", allgather);
  four_job.model.seq = 8192;
  CHECK(cp_error(r4.predicted.simulated_ns, write_cp_job(four_job, dir.path() / "four")) <= 0.03);
  const whatif::change* c4 = cp_change(r4, "CP");
  REQUIRE(c4 != nullptr);
  CHECK(c4->figures[0].after == 16.0);  // 2 ranks x 2 layers x 2 micro-batches x forward and backward
  CHECK(c4->figures[3].after > c4->figures[3].before);

  whatif::whatif_options one;
  one.shape.cp = 1;
  const whatif::whatif_result r1 = whatif::run_whatif(job, one);
  CHECK(cp_error(r1.predicted.simulated_ns, write_cp_job(cp_synth_job(1, 1, 2), dir.path() / "one")) <= 0.03);
  const whatif::change* c1 = cp_change(r1, "CP");
  REQUIRE(c1 != nullptr);
  CHECK(c1->figures[1].after == 16.0);
  CHECK(c1->figures[3].after == 0.0);

  whatif::whatif_options ring;
  ring.shape.cp_comm = model::cp_comm_kind::p2p;
  const whatif::whatif_result rr = whatif::run_whatif(job, ring);
  CHECK(cp_error(rr.predicted.simulated_ns, write_cp_job(cp_synth_job(2, 1, 2), dir.path() / "ring")) <= 0.03);
  for (const auto& [rank, n] : exchanges_per_rank(rr.predicted.built.graph)) CHECK(n == 8);
  // The traced all-gathers and reduce-scatters of the CP group are gone.
  const auto traced = std::count_if(rr.predicted.built.graph.collectives.begin(), rr.predicted.built.graph.collectives.end(),
                                    [](const graph::collective_instance& ci) { return ci.group.starts_with("cp.0."); });
  CHECK(traced == 0);

  whatif::whatif_options none;
  none.shape.cp = 1, none.shape.cp_comm = allgather;
  CHECK_THROWS_WITH(whatif::run_whatif(job, none), Catch::Contains("no context parallelism"));
}

TEST_CASE("whatif --cp 2 --cp-comm allgather from CP 1 with more micro-batches repeats the collectives with their layers",
          "[whatif][cp][dp]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "a";
  (void)write_cp_job(cp_synth_job(1, 1, 2), a);
  const trace::job job = trace::load_job({a});
  whatif::whatif_options o;
  o.shape.cp = 2, o.shape.cp_comm = allgather, o.global_batch = 4;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  CHECK(cp_error(r.predicted.simulated_ns, write_cp_job(cp_synth_job(2, 1, 4, 1, "", allgather), dir.path() / "b")) <= 0.03);
  // 2 layers x 4 micro-batches.
  const std::map<int, int> gathers = inserted_cp_collectives(r.predicted.built.graph, "allgather");
  const std::map<int, int> scatters = inserted_cp_collectives(r.predicted.built.graph, "reducescatter");
  REQUIRE(gathers.size() == 1);
  CHECK(gathers.begin()->second == 8);
  REQUIRE(scatters.size() == 1);
  CHECK(scatters.begin()->second == 8);
  CHECK(exchanges_per_rank(r.predicted.built.graph).empty());
}

TEST_CASE("whatif --cp-comm allgather on TE's ring: one all-gather and one reduce-scatter per layer, not one per ring step's attention call",
          "[whatif][cp]") {
  whatif::whatif_options o;
  o.shape.cp_comm = allgather;
  const whatif::whatif_result r = whatif::run_whatif(te_cp2_job(), o);
  // Each ring step runs its own flash-attn call (2 per layer at CP 2): 2 layers of one micro-batch.
  const std::map<int, int> gathers = inserted_cp_collectives(r.predicted.built.graph, "allgather");
  const std::map<int, int> scatters = inserted_cp_collectives(r.predicted.built.graph, "reducescatter");
  REQUIRE(gathers.size() == 2);
  REQUIRE(scatters.size() == 2);
  for (const auto& [rank, n] : gathers) CHECK(n == 2);
  for (const auto& [rank, n] : scatters) CHECK(n == 2);
  const whatif::change* cp = cp_change(r, "CP");
  REQUIRE(cp != nullptr);
  CHECK(cp->figures[1].after == 8.0);  // the ring's send/recv: 2 ranks x 2 layers x forward and backward
  CHECK(cp->figures[2].after == 8.0);
}

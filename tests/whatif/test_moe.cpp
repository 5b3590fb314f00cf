// The MoE what-if (include/lumos/whatif/moe.hpp): expert parallelism resized on a synth MoE job
// (the all-to-alls re-timed over the new EP group, removed at EP 1, inserted from EP 1 with their
// launches and joined over a new EP group, a target EP that does not divide DP refused), measured
// against balanced routing on the hand-made unbalanced traces, the expert gradients inserted from
// EP = DP, and a loop of per-expert GEMMs
// lengthened or shortened with the experts per rank; the traced configuration read right (a
// fused gate-and-up width, a shared expert and dense layers left out) and errors that name the flag;
// CP changes of the synth MoE job (the tokens per rank through the experts and all-to-alls, with
// and without an EP change) against the direct job, and what is refused on MoE layers.
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/report/json/whatif.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

using namespace lumos;

namespace {

const whatif::change* moe_test_change(const whatif::whatif_result& r) {
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.subject == "MoE"; });
  return c == r.changes.end() ? nullptr : &*c;
}

/// The all-to-all collective instances of `g`.
std::vector<const graph::collective_instance*> moe_test_all_to_alls(const graph::task_graph& g) {
  std::vector<const graph::collective_instance*> out;
  for (const auto& ci : g.collectives) {
    if (ci.kind == "alltoall" || ci.kind == "all_to_all") out.push_back(&ci);
  }
  return out;
}

/// Per rank, the summed time of the tasks whose name says grouped GEMM or names an expert GEMM.
std::map<int, time_ns> moe_test_expert_time(const graph::task_graph& g, std::string_view what) {
  std::map<int, time_ns> out;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.task_name(t).find(what) != std::string_view::npos) out[g.rank[t]] += g.duration[t];
  }
  return out;
}

/// The host time before the launches of the grouped expert GEMMs of `g`, summed.
time_ns moe_test_grouped_host(const graph::task_graph& g) {
  time_ns t = 0;
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && g.task_name(e.to).find("Grouped") != std::string_view::npos) t += g.busy_gap[e.from];
  }
  return t;
}

/// The host time before the launches of the grouped expert GEMMs of the forward passes of `b`
/// (whose traces' structure is `st`), summed.
time_ns moe_test_grouped_host(const graph::built_job& b, const whatif::job_structure& st, whatif::phase_kind phase) {
  std::vector<graph::task_id> call(b.graph.task_count(), graph::no_task);
  for (const graph::edge& e : b.graph.edges) {
    if (e.kind == graph::edge_kind::launch) call[e.to] = e.from;
  }
  time_ns t = 0;
  for (const whatif::gpu_op_context& c : st.gpu_ops) {
    if (c.phase != phase || c.rank >= b.ranks.size()) continue;
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
    const graph::task_id k = map[c.op];
    if (b.graph.task_name(k).find("Grouped") != std::string_view::npos && call[k] != graph::no_task) t += b.graph.busy_gap[call[k]];
  }
  return t;
}

}  // namespace

#ifdef LUMOS_CLI_PATH
namespace {

/// The job `lumos synth ARGS --out DIR` writes, written once for each `args`.
const std::filesystem::path& moe_test_synth(const std::string& args) {
  static lumos_test::temp_dir dir;
  static std::map<std::string, std::filesystem::path> made;
  auto [it, fresh] = made.try_emplace(args);
  if (fresh) {
    it->second = dir.path() / ("job" + std::to_string(made.size()));
    const auto r = lumos_test::run_cli("synth " + args + " --out " + it->second.string());
    REQUIRE(r.code == 0);
  }
  return it->second;
}

/// A synth MoE job (Qwen3-30B-A3B's layers, 1 layer, DP 4) at EP `ep`.
const std::filesystem::path& moe_test_one_layer_job(int ep) {
  return moe_test_synth("--model qwen3-30b-a3b --layers 1 --seq 1024 --tp 1 --pp 1 --dp 4 --ep " + std::to_string(ep) +
                        " --micro-batch 1 --global-batch 4 --gpu h100-sxm --detail kernel --unfold");
}

/// The one-layer job at EP 2.
const std::filesystem::path& moe_test_job_dir() { return moe_test_one_layer_job(2); }

/// The job with 2 layers (structure discovery places the backward of a layer between two others),
/// seq 1024, DP 4, with `flags` (its EP, CP): a what-if's input or the direct truth of its target.
const std::filesystem::path& moe_test_job_with(const std::string& flags) {
  return moe_test_synth("--model qwen3-30b-a3b --layers 2 --seq 1024 --tp 1 --pp 1 --dp 4 --micro-batch 1 "
                        "--global-batch 4 --gpu h100-sxm --detail kernel --unfold " + flags);
}

/// How far `x` is from `truth`: |x / truth - 1|.
template <class X, class T>
double moe_test_off(X x, T truth) {
  return std::abs(static_cast<double>(x) / static_cast<double>(truth) - 1.0);
}

/// A what-if and its truth: the job synthesized at its target, replayed as traced.
struct moe_test_prediction {
  whatif::whatif_result r, direct;
};

/// What-if `o` of the job `moe_test_job_with(from)`, and as its truth the job `moe_test_job_with(to)`.
moe_test_prediction moe_test_predict(const std::string& from, const whatif::whatif_options& o, const std::string& to) {
  return {whatif::run_whatif(trace::load_job({moe_test_job_with(from)}), o),
          whatif::run_whatif(trace::load_job({moe_test_job_with(to)}), whatif::whatif_options{})};
}

/// How far the predicted iteration of what-if `r` is from the iteration of its truth `direct`.
double moe_test_iteration_off(const whatif::whatif_result& r, const whatif::whatif_result& direct) {
  return moe_test_off(r.predicted.simulated_ns, direct.baseline.simulated_ns);
}

/// The job at EP `ep`: at 1 no all-to-all; at another, the direct truth of an EP change from 1.
const std::filesystem::path& moe_test_job_dir(int ep) { return moe_test_job_with("--ep " + std::to_string(ep)); }

/// Whether `lumos replay` of the traces a what-if wrote to `dir` gives the iteration its `--json`
/// output `whatif_json` predicted.
bool replays_to_prediction(const std::string& whatif_json, const std::filesystem::path& dir) {
  const auto again = lumos_test::run_cli("replay " + dir.string() + " --json");
  const std::string key = "\"predicted\":{\"iteration_ns\":";
  const auto predicted = whatif_json.find(key);
  if (again.code != 0 || predicted == std::string::npos) return false;
  const auto at = predicted + key.size();
  const std::string ns = whatif_json.substr(at, whatif_json.find(',', at) - at);
  return !ns.empty() && again.out.find("\"simulated_ns\":" + ns) != std::string::npos;
}

/// The optimizer's GPU time on rank 0 of a what-if's prediction or of its baseline.
time_ns moe_test_optimizer_ns(const whatif::whatif_result& w, bool predicted) {
  const auto& g = predicted ? w.predicted.built.graph : w.baseline.built.graph;
  time_ns n = 0;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.rank[t] == 0 && graph::is_gpu(g.kind[t]) && g.task_name(t).find("multi_tensor_apply") != std::string_view::npos) n += g.duration[t];
  }
  return n;
}

/// What `lumos inspect --structure` reads of a job's MoE layers and all-to-alls: the experts,
/// experts per rank, top-k, EP, tokens per expert, and each all-to-all's ranks and sizes (sorted).
struct moe_read_back {
  std::vector<int> facts;
  std::vector<std::int64_t> expert_tokens;
  std::vector<std::vector<std::int64_t>> all_to_alls;
  friend bool operator==(const moe_read_back&, const moe_read_back&) = default;
};

moe_read_back moe_read(const std::filesystem::path& dir) {
  const trace::job job = trace::load_job({dir});
  const whatif::job_structure st = whatif::discover_structure(job, graph::build_graph(job));
  moe_read_back out;
  for (const auto* f : {&st.moe.layers, &st.moe.experts, &st.moe.experts_per_rank, &st.moe.top_k, &st.moe.ep}) out.facts.push_back(f->value.value_or(-1));
  out.expert_tokens = st.moe.expert_tokens.value.value_or(std::vector<std::int64_t>{});
  for (const whatif::all_to_all_info& a : st.all_to_alls) {
    std::vector<std::int64_t> row(a.ranks.begin(), a.ranks.end());
    for (const auto* v : {&a.in_elements, &a.out_elements, &a.in_splits, &a.out_splits}) {
      row.push_back(-2);
      row.insert(row.end(), v->begin(), v->end());
    }
    out.all_to_alls.push_back(std::move(row));
  }
  std::sort(out.all_to_alls.begin(), out.all_to_alls.end());
  return out;
}

}  // namespace

TEST_CASE("whatif --ep N from EP 1: the dispatch and combine inserted with their launches and joined over a new EP group", "[whatif][moe]") {
  const trace::job job = trace::load_job({moe_test_job_dir(1)});
  for (const int ep : {2, 4}) {
    whatif::whatif_options o;
    o.moe.ep = ep;
    const whatif::whatif_result r = whatif::run_whatif(job, o);
    CHECK(moe_test_all_to_alls(r.baseline.built.graph).empty());
    const auto a2a = moe_test_all_to_alls(r.predicted.built.graph);
    // As many all-to-all instances as the job synthesized at that EP runs, each joined over EP ranks.
    const whatif::whatif_result direct = whatif::run_whatif(trace::load_job({moe_test_job_dir(ep)}), whatif::whatif_options{});
    CHECK(a2a.size() == moe_test_all_to_alls(direct.baseline.built.graph).size());
    std::size_t participants = 0;
    for (const auto* ci : a2a) {
      CHECK(ci->group.starts_with("ep.inserted."));
      CHECK(ci->group_ranks.size() == std::size_t(ep));
      CHECK(ci->arrive.size() == std::size_t(ep));
      CHECK(ci->join != graph::no_task);
      CHECK(ci->bytes > 0);
      participants += ci->arrive.size();
    }
    // Each participant launched by a call of its own.
    const auto launches = [](const graph::task_graph& g) {
      std::size_t n = 0;
      for (graph::task_id t = 0; t < g.task_count(); ++t) n += g.task_name(t) == "cudaLaunchKernel";
      return n;
    };
    // The expert-data-parallel gradient collectives' participants (removed with their launches
    // where EP = DP: one replica of each expert shard).
    const auto expert_dp = [](const graph::task_graph& g) {
      std::size_t n = 0;
      for (const auto& ci : g.collectives) n += ci.group.starts_with("edp.") ? ci.complete.size() : 0;
      return n;
    };
    CHECK(launches(r.predicted.built.graph) + expert_dp(r.baseline.built.graph) ==
          launches(r.baseline.built.graph) + participants + expert_dp(r.predicted.built.graph));
    const whatif::change* c = moe_test_change(r);
    REQUIRE(c != nullptr);
    CHECK(c->figures[5].after == double(participants));  // all-to-alls inserted
    // The prediction is near the job synthesized at that EP.
    CHECK(moe_test_iteration_off(r, direct) < 0.05);
  }
  whatif::whatif_options bad;
  bad.moe.ep = 3;
  CHECK_THROWS_WITH(whatif::run_whatif(job, bad), Catch::Contains("EP must divide DP x CP"));
  const auto cli = lumos_test::run_cli("whatif " + moe_test_job_dir(1).string() + " --ep 3");
  CHECK(cli.code == 2);
}

TEST_CASE("whatif --ep from EP = DP: the expert gradients are reduced over the new expert-data-parallel group", "[whatif][moe]") {
  // EP 4 over DP 4 holds one replica of each expert shard: its traces reduce no expert gradient.
  whatif::whatif_options o;
  o.moe.ep = 2;
  const auto [r, direct] = moe_test_predict("--ep 4", o, "--ep 2");
  // The truth's expert gradient collectives on rank 0: its reduce-scatters and all-gathers beyond
  // the dense ones the EP 4 job runs too (a transfer each: matched, or alone in a folded job).
  const auto kernels = [](const graph::task_graph& g, std::string_view what) {
    std::size_t n = 0;
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      const bool transfer = g.kind[t] == graph::task_kind::comm_complete || g.kind[t] == graph::task_kind::gpu_comm;
      n += transfer && g.rank[t] == 0 && g.task_name(t).find(what) != std::string_view::npos;
    }
    return n;
  };
  const std::size_t scatters = kernels(direct.baseline.built.graph, "ReduceScatter") - kernels(r.baseline.built.graph, "ReduceScatter");
  const std::size_t gathers = kernels(direct.baseline.built.graph, "AllGather") - kernels(r.baseline.built.graph, "AllGather");
  REQUIRE(scatters > 0);
  // The truth's expert-data-parallel group of rank 0.
  REQUIRE(direct.structure);
  std::vector<int> group;
  for (const auto& pg : direct.structure->groups) {
    if (pg.name.starts_with("edp.") && std::find(pg.ranks.begin(), pg.ranks.end(), 0) != pg.ranks.end()) group = pg.ranks;
  }
  REQUIRE(group.size() == 2);
  std::size_t inserted_scatters = 0, inserted_gathers = 0;
  for (const auto& ci : r.predicted.built.graph.collectives) {
    if (!ci.group.starts_with("expert_dp.inserted.") || r.predicted.built.graph.rank[ci.complete.front()] != 0) continue;
    CHECK(ci.group_ranks == group);
    CHECK(ci.bytes > 0);
    inserted_scatters += ci.kind == "reducescatter";
    inserted_gathers += ci.kind == "allgather";
  }
  CHECK(inserted_scatters == scatters);
  CHECK(inserted_gathers == gathers);
  const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.subject == "expert gradients"; });
  REQUIRE(c != r.changes.end());
  CHECK(c->text.find("inserted over 2 expert-data-parallel ranks") != std::string::npos);
  // The prediction is near the job synthesized at EP 2 (without them it is short of it).
  CHECK(moe_test_iteration_off(r, direct) < 0.03);
}

TEST_CASE("whatif --layers on MoE traces: the optimizer and the expert gradients follow the layers as the direct job has them", "[whatif][moe]") {
  // The optimizer phase's GPU time on rank 0 and its expert gradient collectives (transfers, by
  // their kind): the prediction's and the job synthesized with 4 layers'.
  const auto optimizer_ns = moe_test_optimizer_ns;
  const auto expert_collectives = [](const graph::task_graph& g) {
    std::map<std::string, std::size_t> n;
    for (const auto& ci : g.collectives) {
      const bool expert = ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp.inserted.");
      if (expert && !ci.complete.empty() && g.rank[ci.complete.front()] == 0) ++n[ci.kind];
    }
    return n;
  };
  for (const std::string from : {"--ep 2", "--ep 4"}) {
    INFO("from " + from);
    whatif::whatif_options o;
    o.layers = 4;
    if (from != "--ep 2") o.moe.ep = 2;  // from EP = DP: the expert gradients inserted
    const auto [r, direct] = moe_test_predict(from, o, "--ep 2 --layers 4");
    const double traced = static_cast<double>(optimizer_ns(r, false)), truth = static_cast<double>(optimizer_ns(direct, false));
    REQUIRE(traced > 0);
    REQUIRE(truth > traced);  // 4 layers step more parameters than 2
    CHECK(moe_test_off(optimizer_ns(r, true), truth) < 0.02);
    // Each bucket's reduce-scatter goes with its layer, which the layer change copies.
    const auto have = expert_collectives(r.predicted.built.graph), want = expert_collectives(direct.baseline.built.graph);
    REQUIRE(want.count("reducescatter"));
    CHECK(have.count("reducescatter"));
    if (have.count("reducescatter")) CHECK(have.at("reducescatter") == want.at("reducescatter"));
    CHECK(moe_test_iteration_off(r, direct) < 0.03);
  }
}

TEST_CASE("whatif --layers on MoE traces with 2 stages: each stage's optimizer follows its layers as the direct job has them", "[whatif][moe]") {
  whatif::whatif_options o;
  o.layers = 8;
  const auto [r, direct] = moe_test_predict("--ep 2 --pp 2 --layers 4", o, "--ep 2 --pp 2 --layers 8");
  const double truth = static_cast<double>(moe_test_optimizer_ns(direct, false));
  REQUIRE(truth > 1.5 * static_cast<double>(moe_test_optimizer_ns(r, false)));
  CHECK(moe_test_off(moe_test_optimizer_ns(r, true), truth) < 0.02);
  CHECK(moe_test_iteration_off(r, direct) < 0.03);
}

TEST_CASE("whatif --pp on MoE traces: each stage's optimizer and parameter all-gathers follow its layers as the direct job has them", "[whatif][moe]") {
  // Rank 0's parameter all-gathers after the step (the dense group's and the experts'): their
  // transfer time.
  const auto gathers_ns = [](const graph::task_graph& g) {
    std::map<bool, time_ns> n;
    for (const auto& ci : g.collectives) {
      if (ci.kind != "allgather" || ci.complete.empty() || g.rank[ci.complete.front()] != 0) continue;
      n[ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp.")] += g.duration[ci.complete.front()];
    }
    return n;
  };
  // PP 1 -> 2 is split in the graph (the buckets formed anew for each stage), 2 -> 1 and 4 -> 2
  // merged by the pass-level model (the traced buckets kept, their all-gathers by the stage's
  // parameters), whose own model of the passes misses by up to 3.5 % on this short job. Two
  // micro-batches per replica. From stages of one layer, whose backward leaves the router GEMMs
  // outside a delimited layer, the vocabulary is still the logits GEMM's (the embedding's share).
  for (const auto& [from, to, pp, within] : {std::tuple{"--ep 2 --layers 4 --global-batch 8", "--ep 2 --layers 4 --global-batch 8 --pp 2", 2, 0.03},
                                             std::tuple{"--ep 2 --layers 4 --global-batch 8 --pp 2", "--ep 2 --layers 4 --global-batch 8", 1, 0.035},
                                             std::tuple{"--ep 2 --layers 4 --global-batch 8 --pp 4", "--ep 2 --layers 4 --global-batch 8 --pp 2", 2, 0.035}}) {
    INFO(std::string("from ") + from + " to " + to);
    whatif::whatif_options o;
    o.pp = pp;
    const auto [r, direct] = moe_test_predict(from, o, to);
    const double truth = static_cast<double>(moe_test_optimizer_ns(direct, false));
    REQUIRE(moe_test_off(moe_test_optimizer_ns(r, false), truth) > 0.3);  // rank 0's stage holds another share
    CHECK(moe_test_off(moe_test_optimizer_ns(r, true), truth) < 0.02);
    const auto have = gathers_ns(r.predicted.built.graph), want = gathers_ns(direct.baseline.built.graph);
    for (const bool expert : {false, true}) {
      INFO((expert ? "expert all-gathers" : "dense all-gathers"));
      REQUIRE(want.count(expert));
      REQUIRE(have.count(expert));
      CHECK(moe_test_off(have.at(expert), want.at(expert)) < 0.05);
    }
    CHECK(moe_test_iteration_off(r, direct) < within);
  }
}

TEST_CASE("whatif --pp --vp from PP 1 on MoE traces: each chunk's dense and expert buckets reduced as the direct job reduces them", "[whatif][moe]") {
  // Rank 0's gradient reduce-scatters (the dense group's and the experts'), on the first stage,
  // whose chunks hold layers 0 and 2: the first layer's experts and the embedding's bucket close
  // one after the other at the end of the backward.
  const auto scatters = [](const graph::task_graph& g) {
    std::map<bool, std::size_t> n;
    for (const auto& ci : g.collectives) {
      if (ci.kind != "reducescatter" || ci.complete.empty() || g.rank[ci.complete.front()] != 0) continue;
      ++n[ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp.")];
    }
    return n;
  };
  whatif::whatif_options o;
  o.pp = 2, o.vp = 2;
  const whatif::whatif_result r = whatif::run_whatif(trace::load_job({moe_test_job_with("--ep 2 --layers 4 --global-batch 8")}), o);
  const whatif::whatif_result direct =
      whatif::run_whatif(trace::load_job({moe_test_job_with("--ep 2 --layers 4 --global-batch 8 --pp 2 --vp 2")}), whatif::whatif_options{});
  REQUIRE(r.stages);  // split in the graph
  const auto have = scatters(r.predicted.built.graph), want = scatters(direct.baseline.built.graph);
  REQUIRE(want.count(false));
  REQUIRE(want.count(true));
  CHECK(have == want);
  CHECK(std::abs(double(r.predicted.simulated_ns) / double(direct.baseline.simulated_ns) - 1.0) < 0.01);
}

TEST_CASE("whatif --pp with --dp from PP 1 on MoE traces: each stage's buckets formed over the target's groups as the direct job has them", "[whatif][moe]") {
  // Rank 0's gradient reduce-scatters, dense and the experts': how many, and their group sizes.
  const auto scatters = [](const graph::task_graph& g) {
    std::map<std::pair<bool, std::size_t>, std::size_t> n;
    for (const auto& ci : g.collectives) {
      if (ci.kind != "reducescatter" || ci.complete.empty() || g.rank[ci.complete.front()] != 0) continue;
      ++n[{ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp."), ci.group_ranks.size()}];
    }
    return n;
  };
  whatif::whatif_options o;
  o.pp = 2, o.dp = 8, o.global_batch = 16;
  const whatif::whatif_result r = whatif::run_whatif(trace::load_job({moe_test_job_with("--ep 2 --layers 4 --global-batch 8")}), o);
  const whatif::whatif_result direct = whatif::run_whatif(
      trace::load_job({moe_test_job_with("--ep 2 --layers 4 --global-batch 16 --pp 2 --dp 8")}), whatif::whatif_options{});
  REQUIRE(r.stages);
  const auto have = scatters(r.predicted.built.graph), want = scatters(direct.baseline.built.graph);
  REQUIRE(want.count({false, 8}));
  REQUIRE(want.count({true, 4}));
  CHECK(have == want);
  // The optimizer sharded once for the target's DP (the stage's share at the traced DP, then 4 / 8).
  CHECK(std::abs(static_cast<double>(moe_test_optimizer_ns(r, true)) / static_cast<double>(moe_test_optimizer_ns(direct, false)) - 1.0) < 0.02);
  CHECK(std::abs(double(r.predicted.simulated_ns) / double(direct.baseline.simulated_ns) - 1.0) < 0.01);
}

TEST_CASE("whatif --experts and --expert-ffn from EP = DP: the optimizer follows the expert parameters as the direct job has them", "[whatif][moe]") {
  // EP 4 over DP 4 reduces no expert gradient, so no collective tells the experts' share of the
  // optimizer's parameters: the model counts it.
  for (const std::string change : {"--experts 64", "--expert-ffn 1536"}) {
    INFO(change);
    whatif::whatif_options o;
    if (change == "--experts 64") o.moe.experts = 64;
    else o.moe.expert_ffn = 1536;
    const auto [r, direct] = moe_test_predict("--ep 4", o, "--ep 4 " + change);
    const double truth = static_cast<double>(moe_test_optimizer_ns(direct, false));
    REQUIRE(truth > 0);
    REQUIRE(moe_test_off(moe_test_optimizer_ns(r, false), truth) > 0.2);  // the experts are most parameters
    CHECK(moe_test_off(moe_test_optimizer_ns(r, true), truth) < 0.02);
    CHECK(moe_test_iteration_off(r, direct) < 0.03);
  }
}

TEST_CASE("whatif --dp on MoE traces across nodes: the expert-data-parallel group's members TP x EP apart as the direct job has them", "[whatif][moe]") {
  // DP 8 -> 16 at EP 2: the expert-DP group grows from 4 to 8 members 2 apart, over two nodes.
  const auto edp_ns = [](const graph::task_graph& g) {
    time_ns n = 0;
    for (const auto& ci : g.collectives) {
      if (!ci.group.starts_with("edp.")) continue;
      for (const graph::task_id t : ci.complete) n += g.rank[t] == 0 ? g.duration[t] : 0;
    }
    return n;
  };
  whatif::whatif_options o;
  o.dp = 16, o.global_batch = 16;
  const auto [r, direct] = moe_test_predict("--ep 2 --dp 8 --global-batch 8", o, "--ep 2 --dp 16 --global-batch 16");
  const double truth = static_cast<double>(edp_ns(direct.baseline.built.graph));
  REQUIRE(truth > 0);
  CHECK(moe_test_off(edp_ns(r.predicted.built.graph), truth) < 0.05);
  CHECK(moe_test_iteration_off(r, direct) < 0.03);
}

TEST_CASE("whatif --dp from EP = DP: the expert gradients of the replicated expert shards are inserted", "[whatif][moe]") {
  // With 2 stages too: the inserted groups are priced at the target's ranks, which the larger
  // stages' renumbering must not move again.
  for (const std::string stages : {"", " --pp 2 --layers 4"}) {
    INFO("from EP = DP" + stages);
    whatif::whatif_options o;
    o.dp = 8, o.global_batch = 8;
    const auto [r, direct] = moe_test_predict("--ep 4" + stages, o, "--ep 4 --dp 8 --global-batch 8" + stages);
    std::size_t inserted = 0;
    for (const auto& ci : r.predicted.built.graph.collectives) inserted += ci.group.starts_with("expert_dp.inserted.");
    CHECK(inserted > 0);
    const auto c = std::find_if(r.changes.begin(), r.changes.end(), [](const whatif::change& x) { return x.subject == "expert gradients"; });
    REQUIRE(c != r.changes.end());
    CHECK(c->text.find("inserted over 2 expert-data-parallel ranks") != std::string::npos);
    CHECK_FALSE(r.moe);  // no MoE flag: no MoE summary
    CHECK(moe_test_iteration_off(r, direct) < 0.03);
  }
}

TEST_CASE("whatif --ep --dp and --pp on DDP MoE traces: the expert buckets all-reduced as the direct DDP job reduces them", "[whatif][moe]") {
  // DDP (no distributed optimizer): the dense gradients all-reduced, each rank stepping every
  // parameter it holds; Qwen3-30B-A3B's layers, 2 of them, DP 4, one micro-batch per replica.
  lumos_test::temp_dir dir;
  const auto ddp_job = [&](int ep, int dp, int pp = 1) {
    synth::job j;
    j.model = model::model_preset("qwen3-30b-a3b");
    j.model.layers = 2, j.model.seq = 1024;
    j.hardware = model::hardware_preset("h100-sxm");
    j.parallel.dp = dp, j.parallel.ep = ep, j.parallel.micro_batch = 1, j.parallel.global_batch = dp;
    j.parallel.zero_stage = 0, j.parallel.pp = pp;
    synth::program_options opt;
    opt.unfold = true;
    const model::cost_profile profile = model::profile_preset("h100-sxm");
    opt.p2p_host_sync = profile.cpu_p2p_sync > 0;  // as `lumos synth` writes them (the PP target's receives)
    const auto out = dir.path() / ("ep" + std::to_string(ep) + "dp" + std::to_string(dp) + "pp" + std::to_string(pp));
    (void)lumos_test::write_kernel_job(j, opt, profile, out);
    return trace::load_job({out});
  };
  // Rank 0's expert gradient collectives by kind, and the group of its all-reduces.
  const auto experts = [](const graph::task_graph& g, std::vector<int>& group) {
    std::map<std::string, std::size_t> n;
    for (const auto& ci : g.collectives) {
      const bool expert = ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp.inserted.");
      if (!expert || ci.complete.empty() || g.rank[ci.complete.front()] != 0) continue;
      ++n[ci.kind];
      group = ci.group_ranks;
    }
    return n;
  };
  const trace::job traced = ddp_job(4, 4);
  for (const auto& [ep, dp] : {std::pair{2, 4}, std::pair{4, 8}}) {
    INFO("to EP " << ep << " DP " << dp);
    whatif::whatif_options o;
    if (ep != 4) o.moe.ep = ep;
    if (dp != 4) o.dp = dp, o.global_batch = dp;
    const whatif::whatif_result r = whatif::run_whatif(traced, o);
    const whatif::whatif_result direct = whatif::run_whatif(ddp_job(ep, dp), whatif::whatif_options{});
    REQUIRE(direct.structure);
    REQUIRE(direct.structure->gradients.method.value == std::optional<std::string>("all-reduce"));
    std::vector<int> have_group, want_group;
    const auto have = experts(r.predicted.built.graph, have_group), want = experts(direct.baseline.built.graph, want_group);
    REQUIRE(want.count("allreduce"));
    CHECK(have == want);  // all-reduces only, as many as the direct job's
    CHECK(have_group == want_group);
    CHECK(std::abs(double(r.predicted.simulated_ns) / double(direct.baseline.simulated_ns) - 1.0) < 0.02);
  }
  SECTION("PP 1 -> 2 from EP 2: each stage's dense and expert buckets all-reduced over its own parameters") {
    // Rank 0's gradient all-reduces (not the norm's few elements): dense or the experts', and size.
    const auto reduces = [](const graph::task_graph& g) {
      std::multiset<std::pair<bool, std::int64_t>> n;
      for (const auto& ci : g.collectives) {
        if (ci.kind != "allreduce" || ci.bytes <= 4096 || ci.complete.empty() || g.rank[ci.complete.front()] != 0) continue;
        n.insert({ci.group.starts_with("edp.") || ci.group.starts_with("expert_dp."), ci.bytes});
      }
      return n;
    };
    whatif::whatif_options o;
    o.pp = 2;
    const whatif::whatif_result r = whatif::run_whatif(ddp_job(2, 4), o);
    const whatif::whatif_result direct = whatif::run_whatif(ddp_job(2, 4, 2), whatif::whatif_options{});
    REQUIRE(r.stages);
    const auto have = reduces(r.predicted.built.graph), want = reduces(direct.baseline.built.graph);
    REQUIRE(want.size() == 2);  // the stage's one layer: its experts' bucket and its dense one with the embedding
    REQUIRE(have.size() == want.size());
    for (auto h = have.begin(), w = want.begin(); w != want.end(); ++h, ++w) {
      CHECK(h->first == w->first);
      CHECK(std::abs(static_cast<double>(h->second) / static_cast<double>(w->second) - 1.0) < 0.03);  // the attention's parameters as counted
    }
    // With the traced whole-model buckets kept this short job was +19 %. The split's hosts wait
    // for each receive and the compute stream (Megatron's torch.cuda.synchronize()), as the
    // target written with the profile's p2p sync above does (-0.02 %); a target written without
    // it enqueued each pass while the receive ran, 2 ms sooner (the split +6.7 %).
    CHECK(std::abs(double(r.predicted.simulated_ns) / double(direct.baseline.simulated_ns) - 1.0) < 0.005);
  }
}

TEST_CASE("whatif --ep with 2 local experts: launches folded into a grouped GEMM's host time follow the experts per rank", "[whatif][moe]") {
  // Synth folds one launch per local expert into the grouped GEMM's host time, forward and
  // backward: 4 experts over EP 2 hold 2 per rank, over EP 4 one. The prediction's host time
  // before the grouped launches (whose Input Dims give their experts) is the job synthesized at
  // EP 4's, in the forward passes and in the backward ones (whose host time before a launch is
  // less than the forward's).
  whatif::whatif_options o;
  o.moe.ep = 4;
  const auto [r, direct] = moe_test_predict("--experts 4 --top-k 2 --ep 2", o, "--experts 4 --top-k 2 --ep 4");
  REQUIRE(r.structure);
  REQUIRE(direct.structure);
  for (const whatif::phase_kind phase : {whatif::phase_kind::forward, whatif::phase_kind::backward}) {
    const time_ns traced = moe_test_grouped_host(r.baseline.built, *r.structure, phase),
                  predicted = moe_test_grouped_host(r.predicted.built, *r.structure, phase),
                  truth = moe_test_grouped_host(direct.baseline.built, *direct.structure, phase);
    CAPTURE(to_string(phase), traced, predicted, truth);
    REQUIRE(truth < traced);
    CHECK(moe_test_off(predicted, truth) < 0.01);
  }
}

TEST_CASE("whatif --ep --experts --expert-ffn on a one-layer MoE job: its backward layer lies between the head and the embedding", "[whatif][moe]") {
  // One layer repeats in no block, so the backward pass's layer is read between the head's
  // backward (its GEMMs over the vocabulary) and the embedding's: its expert GEMMs are rescaled as
  // the forward's are, and the prediction is the job synthesized at the target.
  const auto synth = [](const std::string& flags) {
    return moe_test_synth("--model mixtral-8x7b --layers 1 --seq 1024 --tp 1 --pp 1 --dp 4 --micro-batch 1 --global-batch 4 "
                          "--gpu h100-sxm --detail kernel " + flags);
  };
  const whatif::whatif_result two = whatif::run_whatif(trace::load_job({synth("--ep 2")}), whatif::whatif_options{});
  REQUIRE(two.structure);
  for (const auto& rs : two.structure->ranks) {
    for (const auto& p : rs.passes) CHECK(p.layers.value == std::optional<int>(1));
  }
  struct item {
    std::string from, to;
    whatif::whatif_options o;
  };
  std::vector<item> cases(4);
  cases[0] = {"--ep 2", "--ep 4", {}};
  cases[0].o.moe.ep = 4;
  cases[1] = {"--ep 4", "--ep 2", {}};
  cases[1].o.moe.ep = 2;
  cases[2] = {"--ep 2", "--ep 2 --experts 16", {}};
  cases[2].o.moe.experts = 16;
  cases[3] = {"--ep 2", "--ep 2 --expert-ffn 7168", {}};
  cases[3].o.moe.expert_ffn = 7168;
  for (const item& c : cases) {
    INFO(c.from << " to " << c.to);
    const whatif::whatif_result r = whatif::run_whatif(trace::load_job({synth(c.from)}), c.o);
    const whatif::whatif_result direct = whatif::run_whatif(trace::load_job({synth(c.to)}), whatif::whatif_options{});
    CHECK(moe_test_iteration_off(r, direct) < 0.03);
  }
}

TEST_CASE("synth MoE traces run the all-to-alls over an expert-parallel group", "[whatif][moe]") {
  const trace::job job = trace::load_job({moe_test_job_dir()});
  whatif::whatif_options o;
  o.moe.routing = whatif::moe_routing::measured;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  REQUIRE(r.structure);
  CHECK(r.structure->moe.ep.value == 2);
  CHECK(r.structure->parallel.ep.value == 2);
  bool ep_group = false;
  for (const auto& g : r.structure->groups) {
    for (const auto& role : g.roles) {
      ep_group = ep_group || (role.value == whatif::group_role::ep && g.description == "EXPERT_MODEL_PARALLEL_GROUP" && g.ranks.size() == 2);
    }
  }
  CHECK(ep_group);
  const auto a2a = moe_test_all_to_alls(r.baseline.built.graph);
  REQUIRE(!a2a.empty());
  for (const auto* ci : a2a) CHECK(ci->group_ranks.size() == 2);
  // Nothing asked but the traces' own routing: nothing moves.
  CHECK(r.predicted.simulated_ns == r.baseline.simulated_ns);
}

TEST_CASE("whatif --ep: all-to-alls re-timed over the new EP group and removed at EP 1 and a bad EP refused", "[whatif][moe]") {
  const trace::job job = trace::load_job({moe_test_job_dir()});
  whatif::whatif_options o;
  o.moe.ep = 4;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const whatif::change* c = moe_test_change(r);
  REQUIRE(c != nullptr);
  CHECK(c->from.find("EP 2") != std::string::npos);
  CHECK(c->to.find("EP 4") != std::string::npos);
  REQUIRE(r.moe);
  CHECK(r.moe->to.ep == 4);
  CHECK(r.moe->to.experts == 128);
  const auto before = moe_test_all_to_alls(r.baseline.built.graph), after = moe_test_all_to_alls(r.predicted.built.graph);
  CHECK(after.size() == before.size());
  time_ns t_before = 0, t_after = 0;
  for (const auto* ci : before) t_before += r.baseline.built.graph.duration[ci->complete.front()];
  for (const auto* ci : after) {
    CHECK(ci->group_ranks.size() == 4);
    t_after += r.predicted.built.graph.duration[ci->complete.front()];
  }
  // The same bytes per rank over twice the peers: more of them leave the rank.
  CHECK(t_after > t_before);
  // Balanced synth routing: each rank's experts compute the same copies, 32 experts instead of 64,
  // forward and backward, in the time the job synthesized at EP 4 takes for them.
  const whatif::whatif_result direct = whatif::run_whatif(trace::load_job({moe_test_one_layer_job(4)}), whatif::whatif_options{});
  const auto gemm_before = moe_test_expert_time(r.baseline.built.graph, "GemmGrouped"), gemm_after = moe_test_expert_time(r.predicted.built.graph, "GemmGrouped"),
             gemm_truth = moe_test_expert_time(direct.baseline.built.graph, "GemmGrouped");
  REQUIRE(gemm_before.size() == gemm_truth.size());
  for (const auto& [rank, t] : gemm_truth) {
    INFO("rank " << rank);
    REQUIRE(moe_test_off(gemm_before.at(rank), t) > 0.2);
    CHECK(moe_test_off(gemm_after.at(rank), t) < 0.01);
  }

  whatif::whatif_options one;
  one.moe.ep = 1;
  const whatif::whatif_result r1 = whatif::run_whatif(job, one);
  CHECK(moe_test_all_to_alls(r1.predicted.built.graph).empty());
  const whatif::change* c1 = moe_test_change(r1);
  REQUIRE(c1 != nullptr);
  REQUIRE(c1->figures.size() == 8);
  CHECK(c1->figures[3].after == double(before.size()));  // all-to-alls removed
  CHECK(r1.predicted.built.graph.task_count() < r1.baseline.built.graph.task_count());

  whatif::whatif_options bad;
  bad.moe.ep = 3;
  CHECK_THROWS_WITH(whatif::run_whatif(job, bad), Catch::Contains("EP must divide DP x CP"));
  bad.moe.ep = 8;
  CHECK_THROWS_WITH(whatif::run_whatif(job, bad), Catch::Contains("EP must divide DP x CP"));
  bad.dp = 8;  // the target's DP 8 takes EP 8
  CHECK_NOTHROW(whatif::run_whatif(job, bad));
}

TEST_CASE("whatif --ep --trace-out: the written traces replay to the prediction", "[whatif][moe]") {
  lumos_test::temp_dir dir;
  const auto out = dir.path() / "ep4";
  const auto r = lumos_test::run_cli("whatif " + moe_test_job_dir().string() + " --ep 4 --json --trace-out " + out.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("\"moe\":{\"baseline\":{\"ep\":2") != std::string::npos);
  CHECK(replays_to_prediction(r.out, out));
  const auto bad = lumos_test::run_cli("whatif " + moe_test_job_dir().string() + " --ep 3");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("EP must divide DP x CP") != std::string::npos);
}
TEST_CASE("whatif --ep and --top-k --trace-out: the written job reads back as the job synthesized at the target", "[whatif][moe]") {
  // Each what-if's written traces: the experts per rank, tokens per expert, top-k, EP and each
  // all-to-all's group and messages that structure discovery reads are the direct job's.
  struct item {
    std::string from, flags, to;
  };
  for (const item& c : {item{"--ep 2", "--ep 4", "--ep 4"}, item{"--ep 4", "--ep 2", "--ep 2"}, item{"--ep 2", "--top-k 4", "--ep 2 --top-k 4"},
                        item{"--ep 1", "--ep 2", "--ep 2"}, item{"--ep 2", "--ep 1", "--ep 1"}}) {
    INFO(c.from + " with " + c.flags);
    lumos_test::temp_dir dir;
    const auto out = dir.path() / "written";
    const auto r = lumos_test::run_cli("whatif " + moe_test_job_with(c.from).string() + " " + c.flags + " --json --trace-out " + out.string());
    REQUIRE(r.code == 0);
    const moe_read_back written = moe_read(out), direct = moe_read(moe_test_job_with(c.to));
    CHECK(written.facts == direct.facts);
    CHECK(written.expert_tokens == direct.expert_tokens);
    CHECK(written.all_to_alls == direct.all_to_alls);
    CHECK(replays_to_prediction(r.out, out));
  }
  // Recorded split sizes (rows to and from each EP peer): at top-1 from top-2 each peer's share
  // halves, as the measured routing keeps it.
  const std::string splits = LUMOS_TEST_DATA_DIR "/moe/ep2_grouped_splits";
  lumos_test::temp_dir dir;
  const auto out = dir.path() / "top1";
  REQUIRE(lumos_test::run_cli("whatif " + splits + " --top-k 1 --trace-out " + out.string()).code == 0);
  const trace::job traced_job = trace::load_job({splits}), written_job = trace::load_job({out});
  const whatif::job_structure traced = whatif::discover_structure(traced_job, graph::build_graph(traced_job));
  const whatif::job_structure written = whatif::discover_structure(written_job, graph::build_graph(written_job));
  REQUIRE(!traced.all_to_alls.empty());
  REQUIRE(written.all_to_alls.size() == traced.all_to_alls.size());
  for (std::size_t i = 0; i < traced.all_to_alls.size(); ++i) {
    for (const auto side : {&whatif::all_to_all_info::in_splits, &whatif::all_to_all_info::out_splits}) {
      const auto& was = traced.all_to_alls[i].*side;
      const auto& now = written.all_to_alls[i].*side;
      REQUIRE(now.size() == was.size());
      for (std::size_t k = 0; k < was.size(); ++k) CHECK(now[k] == (was[k] + 1) / 2);
    }
  }
  CHECK(written.moe.top_k.value == std::optional<int>(1));
}

TEST_CASE("whatif --micro-batch --seq and --experts --trace-out on MoE traces: the written router reads back as the job synthesized at the target",
          "[whatif][moe]") {
  // The written router GEMMs and top-k carry the target's tokens per rank and experts, so that
  // `lumos inspect --structure` reads the top-k (copies / router tokens), the experts (the router
  // GEMM's N) and the EP (experts / experts per rank) of the direct job. Seq 512: tokens per rank
  // other than the hidden width (2048) and the experts, which a dim could not be told from.
  struct item {
    std::string from, flags, to;
  };
  for (const item& c : {item{"--ep 2", "--seq 512", "--ep 2 --seq 512"},
                        item{"--ep 2 --seq 512", "--micro-batch 2", "--ep 2 --seq 512 --micro-batch 2 --global-batch 8"},
                        item{"--ep 2", "--experts 64", "--ep 2 --experts 64"},
                        item{"--ep 2 --seq 512", "--micro-batch 2 --experts 64 --ep 4",
                             "--ep 4 --seq 512 --micro-batch 2 --global-batch 8 --experts 64"}}) {
    INFO(c.from + " with " + c.flags);
    lumos_test::temp_dir dir;
    const auto out = dir.path() / "written";
    const auto r = lumos_test::run_cli("whatif " + moe_test_job_with(c.from).string() + " " + c.flags + " --json --trace-out " + out.string());
    REQUIRE(r.code == 0);
    const auto structure = [](const std::filesystem::path& d) {
      const auto s = lumos_test::run_cli("inspect --structure --json " + d.string());
      REQUIRE(s.code == 0);
      return s.out;
    };
    const std::string written = structure(out), direct = structure(moe_test_job_with(c.to));
    // Each MoE fact's value as the JSON writes it: `"experts":{"value":64,"source":...`.
    const auto value = [](const std::string& json, const std::string& key) {
      const auto at = json.find("\"" + key + "\":{\"value\":", json.find("\"moe\":{"));
      return at == std::string::npos ? std::string("absent") : json.substr(at, json.find(",\"source\"", at) - at);
    };
    for (const char* key : {"experts", "experts_per_rank", "top_k", "ep", "expert_tokens"}) {
      INFO(key);
      CHECK(value(written, key) == value(direct, key));
      CHECK(value(written, key) != "absent");
    }
    const moe_read_back w = moe_read(out), d = moe_read(moe_test_job_with(c.to));
    CHECK(w.facts == d.facts);
    CHECK(w.all_to_alls == d.all_to_alls);
    CHECK(replays_to_prediction(r.out, out));
  }
}

TEST_CASE("a shared expert and dense layers beside the routed grouped experts are no part of the MoE what-if", "[whatif][moe]") {
  // DeepSeek-V3's layers: 3 dense ones, then a MoE one with a shared expert of the routed
  // experts' FFN width beside them, its GEMMs over every token. Forward passes only: the
  // backward of these unlike layers is not delimited into layers.
  const auto synth = [](int top_k) {
    return moe_test_synth("--model deepseek-v3 --layers 4 --mtp-layers 0 --seq 1024 --tp 1 --pp 1 --dp 8 --ep 8 --top-k " +
                          std::to_string(top_k) + " --micro-batch 1 --global-batch 8 --gpu h100-sxm --detail kernel --forward-only");
  };
  const trace::job job = trace::load_job({synth(8)});
  {
    // The activations of the dense MLPs and of the shared expert keep their time when the
    // routed experts' top-k halves: as the job synthesized at top-4 has them.
    whatif::whatif_options half;
    half.moe.top_k = 4;
    const whatif::whatif_result r = whatif::run_whatif(job, half);
    const whatif::whatif_result direct = whatif::run_whatif(trace::load_job({synth(4)}), whatif::whatif_options{});
    const auto predicted = moe_test_expert_time(r.predicted.built.graph, "Silu"), truth = moe_test_expert_time(direct.baseline.built.graph, "Silu");
    REQUIRE(truth.size() == 1);
    CHECK(moe_test_off(predicted.at(0), truth.at(0)) < 0.05);
  }
  whatif::whatif_options o;
  o.moe.routing = whatif::moe_routing::measured;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  REQUIRE(r.structure);
  const whatif::job_structure& st = *r.structure;
  REQUIRE(st.model.hidden.known());
  const std::int64_t hidden = *st.model.hidden.value, experts = 256;
  const whatif::detail::expert_width width = whatif::detail::traced_expert_width(job, st, hidden, experts);
  whatif::detail::moe_ranks ranks;
  (void)whatif::detail::find_moe_ops(job, r.baseline.built, st, hidden, experts, width.n, ranks);
  // Synth routes evenly: a rank's experts compute its 1024 tokens x top-8, over 256 / EP 8 experts.
  REQUIRE(ranks.copies.size() == 1);
  CHECK(ranks.copies[0] == 1024.0 * 8);
  CHECK(ranks.local[0] == 256 / 8);
  // Which kind of layer 2 more would be (DeepSeek's: MoE ones) the traces do not tell.
  whatif::whatif_options more;
  more.layers = 6;
  CHECK_THROWS_WITH(whatif::run_whatif(job, more), Catch::Contains("mix dense and MoE layers (1 MoE of 4"));
  // Nor are the parameters of stages that hold both kinds counted.
  whatif::whatif_options stages;
  stages.pp = 2;
  CHECK_THROWS_WITH(whatif::run_whatif(job, stages), Catch::Contains("whatif --pp 2: the traces mix dense and MoE layers (1 MoE of 4"));
}

TEST_CASE("grouped MoE traces whose tokens per rank equal the expert FFN: only the grouped GEMMs are the experts'", "[whatif][moe]") {
  // Sequence 768 = Qwen3-30B-A3B's expert FFN: the attention's GEMMs over 768 tokens that read
  // the hidden width are no per-expert GEMMs of a loop.
  whatif::whatif_options o;
  o.moe.top_k = 4;
  const auto [r, direct] = moe_test_predict("--ep 2 --seq 768", o, "--ep 2 --seq 768 --top-k 4");
  const auto gemms = moe_test_expert_time(r.predicted.built.graph, "gemm"), truth = moe_test_expert_time(direct.baseline.built.graph, "gemm");
  REQUIRE(truth.count(0));
  CHECK(moe_test_off(gemms.at(0), truth.at(0)) < 0.03);
  CHECK(moe_test_iteration_off(r, direct) < 0.03);
}

TEST_CASE("structure discovery: the expert-data-parallel group is neither EP nor the DP degree", "[whatif][moe][structure]") {
  // DP 4 with EP 1 and 2: the expert-data-parallel groups hold 4 and 2 ranks, the EP groups 1 and 2.
  for (const int ep : {1, 2}) {
    INFO("EP " << ep);
    const trace::job job = trace::load_job({moe_test_job_dir(ep)});
    const whatif::job_structure st = whatif::discover_structure(job, graph::build_graph(job));
    CHECK(st.parallel.ep.value == ep);
    CHECK(st.parallel.dp.value == 4);
    CHECK(st.parallel.ep.source.find("EXPERT_DATA_PARALLEL") == std::string::npos);
  }
}
#endif  // LUMOS_CLI_PATH

TEST_CASE("whatif --routing on unbalanced EP traces: balanced evens the ranks' expert GEMMs and measured keeps them", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "ep2_grouped_splits"});
  whatif::whatif_options measured, balanced;
  measured.moe.routing = whatif::moe_routing::measured;
  balanced.moe.routing = whatif::moe_routing::balanced;
  const whatif::whatif_result m = whatif::run_whatif(job, measured), b = whatif::run_whatif(job, balanced);
  const auto traced = moe_test_expert_time(m.baseline.built.graph, "Grouped");
  const auto kept = moe_test_expert_time(m.predicted.built.graph, "Grouped"), even = moe_test_expert_time(b.predicted.built.graph, "Grouped");
  REQUIRE(traced.size() == 2);
  CHECK(kept == traced);
  // Rank 0's experts computed 480 rows, rank 1's 544: balanced, both compute 512.
  const int r0 = traced.begin()->first, r1 = std::next(traced.begin())->first;
  CHECK(even.at(r0) > traced.at(r0));
  CHECK(even.at(r1) < traced.at(r1));
  // The copies only move between the ranks: the expert GEMM time summed over both stays about the same.
  const double sum_traced = double(traced.at(r0) + traced.at(r1)), sum_even = double(even.at(r0) + even.at(r1));
  CHECK(std::abs(sum_even - sum_traced) <= 0.05 * sum_traced);
}

TEST_CASE("a router GEMM with as many token rows as experts: only the routers are taken for routers", "[whatif][moe]") {
  // The loop's layers over 8 tokens and 8 experts (make_moe_trace.py): every attention GEMM has
  // as many rows as the router has outputs. Each layer's one router GEMM is the only router op
  // (the backward GEMMs record no shapes), as in the same layers over 256 tokens: a GEMM taken for
  // a router is rescaled by the expert count.
  for (const char* name : {"router_rows_are_experts", "loop_unbalanced"}) {
    const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / name});
    const whatif::whatif_result r = whatif::run_whatif(job, whatif::whatif_options{});
    REQUIRE(r.structure);
    const whatif::job_structure& st = *r.structure;
    REQUIRE(st.moe.found());
    const std::int64_t hidden = *st.model.hidden.value, experts = *st.moe.experts.value;
    const whatif::detail::expert_width width = whatif::detail::traced_expert_width(job, st, hidden, experts);
    whatif::detail::moe_ranks ranks;
    const auto ops = whatif::detail::find_moe_ops(job, r.baseline.built, st, hidden, experts, width.n, ranks);
    const auto routers = std::count_if(ops.begin(), ops.end(), [](const auto& o) { return o.kind == whatif::detail::moe_op_kind::router; });
    CHECK(routers == *st.moe.layers.value);
  }
}

TEST_CASE("a grouped GEMM over 2 local experts that launches once keeps its host time when the experts per rank change", "[whatif][moe]") {
  // torch._grouped_mm over the 2 local experts of 4 at EP 2, with a framework's time before its
  // launch like every other operator's (make_moe_trace.py): no launch per expert to fold.
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "ep2_grouped_splits"});
  whatif::whatif_options o;
  o.moe.ep = 1;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const time_ns traced = moe_test_grouped_host(r.baseline.built.graph);
  REQUIRE(traced > 0);
  CHECK(moe_test_grouped_host(r.predicted.built.graph) == traced);
}

TEST_CASE("whatif --routing balanced on a loop of per-expert GEMMs: each expert's GEMMs at the mean rows", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "loop_unbalanced"});
  whatif::whatif_options o;
  o.moe.routing = whatif::moe_routing::balanced;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const whatif::change* c = moe_test_change(r);
  REQUIRE(c != nullptr);
  REQUIRE(c->figures.size() >= 2);
  CHECK(c->figures[0].after > 0);  // expert GEMMs rescaled
}

TEST_CASE("whatif --experts on a loop of per-expert GEMMs: the loop's units repeated or removed with their launches", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "loop_unbalanced"});
  // Kernels and launch calls of a graph.
  const auto counts = [](const graph::task_graph& g) {
    std::pair<std::size_t, std::size_t> n{0, 0};
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      if (g.kind[t] == graph::task_kind::gpu_compute) ++n.first;
      if (g.task_name(t) == "cudaLaunchKernel") ++n.second;
    }
    return n;
  };
  whatif::whatif_options twice, half;
  twice.moe.experts = 8;
  half.moe.experts = 2;
  const whatif::whatif_result r2 = whatif::run_whatif(job, twice), r05 = whatif::run_whatif(job, half);
  const auto base = counts(r2.baseline.built.graph), more = counts(r2.predicted.built.graph), fewer = counts(r05.predicted.built.graph);
  REQUIRE(more.first > base.first);
  CHECK(fewer.first < base.first);
  // Twice the experts add as many units as half of them remove, less the last unit's tail
  // (what follows its last GEMM, which the loop's last unit leaves out).
  const std::size_t added = more.first - base.first, removed = base.first - fewer.first;
  CHECK(added >= removed);
  CHECK(added <= 2 * removed + 2);
  // Every kernel comes or goes with its launch call.
  CHECK(more.second - base.second == added);
  CHECK(base.second - fewer.second == removed);
  const whatif::change* c = moe_test_change(r2);
  REQUIRE(c != nullptr);
  REQUIRE(c->figures.size() == 8);
  CHECK(c->figures[7].after == double(added));  // per-expert launches added
  // Each expert of the target computes an even share of the rank's copies: with twice the
  // experts, the expert GEMMs' time about stays (each of twice as many GEMMs has half the rows).
  CHECK(r2.predicted.simulated_ns > 0);
}

TEST_CASE("whatif --ep with measured routing on a loop of per-expert GEMMs: each expert keeps its traced rows", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "loop_unbalanced"});
  whatif::whatif_options o;
  o.moe.routing = whatif::moe_routing::measured;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  REQUIRE(r.structure);
  const whatif::job_structure& st = *r.structure;
  const std::int64_t hidden = *st.model.hidden.value, experts = *st.moe.experts.value;
  const whatif::detail::expert_width width = whatif::detail::traced_expert_width(job, st, hidden, experts);
  whatif::detail::moe_ranks ranks;
  (void)whatif::detail::find_moe_ops(job, r.baseline.built, st, hidden, experts, width.n, ranks);
  const whatif::moe_config from{.ep = 1, .experts = 4, .top_k = 2}, to{.ep = 2, .experts = 4, .top_k = 2};
  std::string note;
  const std::vector<double> copies = whatif::detail::target_copies(job, ranks, from, to, whatif::moe_routing::measured, 1, 1, note);
  // make_moe_trace.py's EXPERT_TOKENS: experts 0 and 1 (EP rank 0 of the target) received 200 + 130
  // rows, 2 and 3 (EP rank 1) 90 + 92. The target's EP group holds 2 ranks' tokens, and the one
  // traced rank stands for both EP ranks: it computes the slowest one's copies.
  REQUIRE(copies.size() == 1);
  CHECK(copies[0] == Approx(2.0 * (200 + 130)));
}

TEST_CASE("whatif --expert-ffn on grouped GEMMs with gate and up fused: the traced expert FFN is half their width", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "ep2_grouped_splits"});
  // make_moe_trace.py's EXPERT_FFN, its first grouped GEMM 2 x that wide (gate and up).
  whatif::whatif_options same, twice;
  same.moe.expert_ffn = 512;
  twice.moe.expert_ffn = 1024;
  const whatif::whatif_result r = whatif::run_whatif(job, same), r2 = whatif::run_whatif(job, twice);
  REQUIRE(r.moe);
  CHECK(r.moe->from.expert_ffn == 512);
  CHECK(r.predicted.simulated_ns == r.baseline.simulated_ns);
  const auto traced = moe_test_expert_time(r2.baseline.built.graph, "Grouped"), wider = moe_test_expert_time(r2.predicted.built.graph, "Grouped");
  REQUIRE(traced.size() == 2);
  for (const auto& [rank, t] : traced) CHECK(wider.at(rank) > t);
}

TEST_CASE("MoE what-if errors name the flag that asked and the traces' own configuration", "[whatif][moe]") {
  const trace::job job = trace::load_job({lumos_test::data_dir() / "moe" / "ep2_grouped_splits"});
  // The traces: EP 2 over 4 experts, top-2, DP 2.
  whatif::whatif_options experts;
  experts.moe.experts = 3;
  CHECK_THROWS_WITH(whatif::run_whatif(job, experts), Catch::Contains("whatif --experts 3: the 3 experts do not divide over 2 EP ranks"));
  whatif::whatif_options fewer;
  fewer.moe.ep = 1;
  fewer.moe.experts = 1;
  CHECK_THROWS_WITH(whatif::run_whatif(job, fewer), Catch::Contains("whatif --experts 1: top-2 is more than the 1 experts"));
  // A DP that EP 2 no longer divides: the world stays, so the experts cannot spread over it.
  whatif::whatif_options one;
  one.dp = 1;
  CHECK_THROWS_WITH(whatif::run_whatif(job, one), Catch::Contains("whatif --dp 1: EP must divide DP x CP of the target (EP 2, DP x CP 1)"));
  // A traced EP that does not divide the traced experts is the traces' to explain, not a flag's.
  whatif::job_structure st;
  st.moe.experts.value = 4;
  st.parallel.ep.value = 3;
  st.parallel.ep.source = "size of group 'x'";
  st.moe.top_k.value = 2;
  whatif::moe_target t;
  t.top_k = 1;
  CHECK_THROWS_WITH(whatif::detail::moe_configs(st, t, 512, 1, 6), Catch::Contains("the traces' EP 3 (size of group 'x') does not divide their 4 experts"));
}

TEST_CASE("MoE traces whose top-k is unknown: the what-if says so instead of top-1", "[whatif][moe]") {
  whatif::job_structure st;
  st.moe.layers.value = 2;
  st.moe.experts.value = 8;
  st.moe.ep.value = 2;
  st.moe.top_k.source = "no router found";
  whatif::moe_target t;
  t.ep = 4;
  const auto [from, to] = whatif::detail::moe_configs(st, t, 1024, 1, 4);
  CHECK_FALSE(from.top_k_known);
  CHECK_FALSE(to.top_k_known);
  CHECK(from.top_k == to.top_k);  // a placeholder whose ratio is 1
  std::string json;
  json_writer w(json);
  w.begin_object();
  report::detail::moe_config_fields(w, to);
  w.end_object();
  CHECK(json.find("\"top_k\":null") != std::string::npos);
  t = {};
  t.top_k = 2;
  CHECK_THROWS_WITH(whatif::detail::moe_configs(st, t, 1024, 1, 4), Catch::Contains("top-k is unknown"));
  st.moe.top_k.value = 4;
  CHECK(whatif::detail::moe_configs(st, t, 1024, 1, 4).first.top_k_known);
}

#ifdef LUMOS_CLI_PATH
namespace {

/// The summed message of the all-to-alls of `g` (the graph's `bytes`).
std::int64_t moe_test_a2a_bytes(const graph::task_graph& g) {
  std::int64_t n = 0;
  for (const auto* ci : moe_test_all_to_alls(g)) n += ci->bytes;
  return n;
}

}  // namespace

TEST_CASE("whatif --cp 2 on MoE traces: expert GEMMs and all-to-all messages follow the tokens per rank as the direct job has them", "[whatif][moe][cp]") {
  whatif::whatif_options o;
  o.shape.cp = 2;
  const auto [r, truth] = moe_test_predict("--ep 2", o, "--ep 2 --cp 2");
  // The all-to-alls keep their count and carry half the tokens: the direct job's messages.
  const auto& before = r.baseline.built.graph;
  const auto& after = r.predicted.built.graph;
  REQUIRE(!moe_test_all_to_alls(before).empty());
  CHECK(moe_test_all_to_alls(after).size() == moe_test_all_to_alls(before).size());
  CHECK(2 * moe_test_a2a_bytes(after) == moe_test_a2a_bytes(before));
  CHECK(moe_test_a2a_bytes(after) == moe_test_a2a_bytes(truth.baseline.built.graph) * static_cast<std::int64_t>(moe_test_all_to_alls(after).size()) /
                                         static_cast<std::int64_t>(moe_test_all_to_alls(truth.baseline.built.graph).size()));
  // The grouped expert GEMMs of half the copies: within 5 % of the direct job's, rank 0.
  const auto gemm_before = moe_test_expert_time(before, "GemmGrouped"), gemm_after = moe_test_expert_time(after, "GemmGrouped");
  const auto gemm_truth = moe_test_expert_time(truth.baseline.built.graph, "GemmGrouped");
  REQUIRE(gemm_before.count(0));
  CHECK(gemm_after.at(0) < gemm_before.at(0));
  CHECK(moe_test_off(gemm_after.at(0), gemm_truth.at(0)) <= 0.05);
  // The MoE change says the tokens per rank halve; the ring is inserted beside the attention.
  const whatif::change* c = moe_test_change(r);
  REQUIRE(c != nullptr);
  CHECK(c->text.find("tokens per rank x0.500") != std::string::npos);
  std::size_t exchanges = 0;
  for (const auto& ci : after.collectives) exchanges += ci.group.rfind("cp.folded.", 0) == 0;
  CHECK(exchanges > 0);
  CHECK_FALSE(r.moe);  // no MoE flag: no MoE summary
  CHECK(moe_test_iteration_off(r, truth) <= 0.03);
}

TEST_CASE("whatif --cp with --ep on MoE traces: the EP and expert-DP groups of DP x CP as the direct job runs them", "[whatif][moe][cp]") {
  const trace::job job = trace::load_job({moe_test_job_with("--ep 2")});
  whatif::whatif_options o;
  o.shape.cp = 2;
  o.moe.ep = 4;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  const whatif::whatif_result truth = whatif::run_whatif(trace::load_job({moe_test_job_with("--ep 4 --cp 2")}), {});
  for (const auto* ci : moe_test_all_to_alls(r.predicted.built.graph)) CHECK(ci->group_ranks.size() == 4);
  CHECK(moe_test_iteration_off(r, truth) <= 0.03);
  // EP 8 does not divide DP 4 x CP 1: the CP change that makes it fit is allowed, its absence refused.
  whatif::whatif_options big;
  big.moe.ep = 8;
  CHECK_THROWS_WITH(whatif::run_whatif(job, big), Catch::Contains("EP must divide DP x CP"));
  big.shape.cp = 2;
  CHECK_NOTHROW(whatif::run_whatif(job, big));
  // From CP 2 with EP 8 (DP 4 x CP 2) to CP 1: the traced EP no longer divides, named by --cp.
  whatif::whatif_options one;
  one.shape.cp = 1;
  CHECK_THROWS_WITH(whatif::run_whatif(trace::load_job({moe_test_job_with("--ep 8 --cp 2")}), one),
                    Catch::Contains("whatif --cp 1: EP must divide DP x CP of the target (EP 8, DP x CP 4)"));
}

TEST_CASE("whatif --cp --trace-out on MoE traces: the written traces replay to the prediction and refusals exit 2", "[whatif][moe][cp]") {
  lumos_test::temp_dir dir;
  const auto out = dir.path() / "cp2";
  const std::string in = moe_test_job_with("--ep 2").string();
  const auto r = lumos_test::run_cli("whatif " + in + " --cp 2 --json --trace-out " + out.string());
  REQUIRE(r.code == 0);
  CHECK(replays_to_prediction(r.out, out));
  for (const char* bad : {"--hidden 4096", "--tp 2", "--cp 2 --layers 4", "--cp 2 --pp 2"}) {
    const auto refused = lumos_test::run_cli("whatif " + in + " " + std::string(bad));
    CHECK(refused.code == 2);
    CHECK(refused.err.find("MoE layers") != std::string::npos);
  }
}
#endif  // LUMOS_CLI_PATH

// The stage split in its two steps, each on its own: planning (whatif/stage_plan.hpp) puts each
// layer's tasks on the stage that holds the layer and orders each stage's passes as its schedule
// does; emission (whatif/stage_emission.hpp) builds from the plan the ranks, tasks and transfers
// it says, and a graph that replays. Jobs: a synthesised kernel-level job without stages (what
// `lumos synth --detail kernel --unfold` writes) and the hand-made pipeline traces of
// tests/data/whatif (make_pipeline_traces.py).
#include "../synth/kernel_job_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/stage_emission.hpp>
#include <lumos/whatif/stage_plan.hpp>
#include <lumos/whatif/structure.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace stage_split_test {

namespace fs = std::filesystem;
using namespace lumos;
using graph::task_id;

// A job with its graph and structure, as `lumos whatif` discovers them.
struct traced {
  trace::job job;
  graph::built_job built;
  whatif::job_structure st;
};

traced discovered(const fs::path& dir) {
  traced d{trace::load_job({dir}), {}, {}};
  d.built = graph::build_graph(d.job);
  d.st = whatif::discover_structure(d.job, d.built);
  return d;
}

fs::path pipeline_traces(const char* name) { return lumos_test::data_dir() / "whatif" / name; }

// What `lumos synth --layers L --hidden 1024 --heads 16 --seq 512 --tp TP --pp PP --dp 1
// --micro-batch 1 --global-batch M --detail kernel --unfold` writes into `dir`.
void synthesise(const fs::path& dir, int layers, int micro_batches, int tp, int pp) {
  synth::job j;
  j.model = model::model_preset("gpt3-15b");
  j.model.layers = layers;
  j.model.hidden = 1024;
  j.model.ffn = 4096;
  j.model.heads = j.model.kv_heads = 16;
  j.model.seq = 512;
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.tp = tp;
  j.parallel.pp = pp;
  j.parallel.schedule = "1f1b";
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = micro_batches;
  j.parallel.zero_stage = 1;
  synth::program_options opt;
  opt.unfold = true;
  (void)lumos_test::write_kernel_job(j, opt, model::profile_preset(j.hardware.name), dir);
}

// The synthesised job without stages, written once: 8 layers, 4 micro-batches, TP 2.
const fs::path& synthesised_job() {
  static lumos_test::temp_dir dir;
  static const bool written = (synthesise(dir.path(), 8, 4, 2, 1), true);
  (void)written;
  return dir.path();
}

// The synthesised job with two 1F1B stages, written once: 8 layers, 4 micro-batches, TP 1.
const fs::path& synthesised_stages() {
  static lumos_test::temp_dir dir;
  static const bool written = (synthesise(dir.path(), 8, 4, 1, 2), true);
  (void)written;
  return dir.path();
}

// The passes stage s of a 1F1B pipeline of `pp` stages runs for `m` micro-batches, as unit codes
// (forward i: i, backward i: m + i): min(pp - s - 1, m) forwards, then one forward and one
// backward in turn, then the remaining backwards (Megatron's schedule).
std::vector<std::int32_t> one_f_one_b_order(int pp, int m, int s) {
  const int warmup = std::min(pp - s - 1, m);
  std::vector<std::int32_t> order;
  for (int i = 0; i < warmup; ++i) order.push_back(i);
  for (int i = 0; i < m - warmup; ++i) order.push_back(warmup + i), order.push_back(m + i);
  for (int i = m - warmup; i < m; ++i) order.push_back(m + i);
  return order;
}

// The units a stage runs on a processor, in its order (repeats of one unit merged): those of the
// tasks it keeps there, outside label_pre / label_post.
std::vector<std::int32_t> units_on(const whatif::stage_plan& p, int s, graph::processor_id q) {
  std::vector<std::int32_t> units;
  for (const whatif::stage_run& r : p.runs[static_cast<std::size_t>(s) * p.processors + q]) {
    for (std::uint32_t z = r.begin; z < r.end; ++z) {
      const task_id t = p.on[q][z];
      if (!p.kept[static_cast<std::size_t>(s)][t] || r.unit == whatif::detail::label_pre || r.unit == whatif::detail::label_post) continue;
      if (units.empty() || units.back() != r.unit) units.push_back(r.unit);
    }
  }
  return units;
}

// The stages that keep task t.
std::vector<int> stages_of(const whatif::stage_plan& p, task_id t) {
  std::vector<int> s;
  for (int x = 0; x < p.geometry.pp; ++x) {
    if (p.kept[static_cast<std::size_t>(x)][t]) s.push_back(x);
  }
  return s;
}

// Copies of the traced tasks the plan says the stages have.
std::size_t planned_copies(const whatif::stage_plan& p, const graph::task_graph& g) {
  std::size_t n = 0;
  for (int s = 0; s < p.geometry.pp; ++s) {
    for (task_id t = 0; t < p.tasks; ++t) n += p.copies(s, t, g) ? 1 : 0;
  }
  return n;
}

// Every layer task (but those kept on every stage) is on one stage: the one that holds its
// virtual stage, layer / per_chunk (slot q of a traced stage's block with stages), in the pass
// structure discovery found for it.
void check_layers_placed(const traced& d, const whatif::stage_plan& p) {
  const auto& geo = p.geometry;
  std::size_t checked = 0;
  for (const auto& lg : d.st.layer_groups) {
    const int sigma = geo.traced_stage(lg.rank);
    const int q = lg.layer / geo.per_chunk;
    const int vs = geo.traced_pp > 1 ? q / geo.cut * geo.pp + geo.first_stage(sigma) + q % geo.cut : q;
    for (const task_id t : lg.tasks) {
      if (p.everywhere[t]) continue;
      ++checked;
      CHECK(p.layer[t] == lg.layer);
      CHECK(p.virtual_stage[t] == vs);
      CHECK(stages_of(p, t) == std::vector<int>{vs % geo.pp});
      CHECK(geo.pass_of(p.code[t]) == whatif::detail::pass_code_of(lg.op, geo.micro_batches, lg.op.micro_batch));
      CHECK(p.unit_of(t) == geo.pass_of(p.code[t]) * geo.vp + vs / geo.pp);
    }
  }
  CHECK(checked > 0);
}

// Each stage runs the passes on each traced rank's compute stream in the order `expected(s)` gives.
template <class Expected>
void check_stage_orders(const traced& d, const whatif::stage_plan& p, Expected&& expected) {
  for (int s = 0; s < p.geometry.pp; ++s) {
    for (std::size_t i = 0; i < d.job.ranks.size(); ++i) {
      if (p.geometry.source_stage(s) != p.geometry.stage_of[i]) continue;
      CHECK(units_on(p, s, p.main_stream[i]) == expected(s));
    }
  }
}

// Every transfer runs between neighbouring stages, forward to the next and backward to the
// previous, from the pass the consumer's pass depends on (the same micro-batch and kind).
void check_transfers(const whatif::stage_plan& p) {
  const int m = p.geometry.micro_batches;
  for (const whatif::planned_transfer& x : p.transfers) {
    CHECK(x.to == x.from + (x.forward ? 1 : -1));
    CHECK(x.from_unit == x.to_unit);  // vp 1: the same pass code on both sides
    CHECK((x.to_unit < m) == x.forward);
    CHECK(p.receives[static_cast<std::size_t>(x.to)][static_cast<std::size_t>(x.to_unit)] == 1);
    CHECK(p.sends_to[static_cast<std::size_t>(x.from)][static_cast<std::size_t>(x.from_unit)] == 1);
  }
}

// Every traced task of rank i, read through its map before and after the split (`before`: the
// traced map), is the same op on its home stage when that stage keeps it, and gone when not.
void check_maps(const traced& d, const whatif::stage_plan& p, const graph::task_graph& before_graph,
                const std::vector<graph::rank_map>& before, const whatif::stage_split& out) {
  const graph::task_graph& g = d.built.graph;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const int home = p.geometry.first_stage(p.geometry.stage_of[i]);
    REQUIRE(home >= 0);
    std::size_t kept = 0;
    for (std::size_t e = 0; e < before[i].task_of_event.size(); ++e) {
      const task_id was = before[i].task_of_event[e], now = d.built.ranks[i].task_of_event[e];
      if (was == graph::no_task) continue;
      CHECK((now != graph::no_task) == p.copies(home, was, before_graph));
      if (now == graph::no_task) continue;
      ++kept;
      CHECK(g.task_name(now) == before_graph.task_name(was));
      CHECK(g.kind[now] == before_graph.kind[was]);
      CHECK(g.rank[now] == p.geometry.new_rank(before_graph.rank[was], home));
    }
    CHECK(kept > 0);
  }
  // The added ranks' maps point to their own stage's copies.
  REQUIRE(out.maps.size() == out.plans.size());
  for (std::size_t k = 0; k < out.maps.size(); ++k) {
    CHECK(out.maps[k].rank == out.plans[k].rank);
    CHECK(out.plans[k].rank == p.geometry.new_rank(d.job.ranks[out.traced_index[k]].rank, out.stage[k]));
    for (const task_id t : out.maps[k].task_of_event) {
      if (t != graph::no_task) CHECK(g.rank[t] == out.plans[k].rank);
    }
  }
}

// The added transfers: one send_recv instance per planned transfer, between the new numbers of
// its two stages' ranks, each side on a p2p stream of its own rank.
void check_added_transfers(const traced& d, const whatif::stage_plan& p, const whatif::stage_split& out) {
  const graph::task_graph& g = d.built.graph;
  std::multiset<std::vector<int>> planned, added;
  for (const whatif::planned_transfer& x : p.transfers) {
    planned.insert({p.geometry.new_rank(d.job.ranks[x.i_from].rank, x.from), p.geometry.new_rank(d.job.ranks[x.i].rank, x.to)});
  }
  for (const graph::collective_instance& ci : g.collectives) {
    if (ci.match != "added by the pipeline what-if (cross-stage transfer)") continue;
    REQUIRE(ci.complete.size() == 2);
    added.insert(ci.group_ranks);
    for (std::size_t x = 0; x < 2; ++x) {
      CHECK(g.rank[ci.complete[x]] == ci.group_ranks[x]);
      CHECK(g.processors[g.processor[ci.complete[x]]].name.find("p2p") != std::string::npos);
    }
  }
  CHECK(out.p2p == p.transfers.size());
  CHECK(added == planned);
}

TEST_CASE("whatif --pp plan of a job without stages: layers on their stages, passes in 1F1B and GPipe order", "[whatif][pipeline][stages]") {
  const traced d = discovered(synthesised_job());
  const int m = *d.st.parallel.micro_batches.value, layers = *d.st.model.layers.value;
  REQUIRE(d.st.parallel.pp.value.value_or(1) == 1);
  for (const auto& [kind, pp] : {std::pair{synth::policy_of<pipeline::one_f_one_b>(), 2}, std::pair{synth::policy_of<pipeline::gpipe>(), 4}}) {
    const whatif::stage_plan p = whatif::plan_stages(d.built, d.job, d.st, {.pp = pp, .vp = 1, .schedule = kind});
    const auto& geo = p.geometry;
    CHECK(geo.traced_pp == 1);
    CHECK(geo.micro_batches == m);
    CHECK(geo.per_chunk == layers / pp);
    CHECK(geo.width == static_cast<int>(d.job.ranks.size()));  // TP 2: the traced world
    CHECK(geo.new_rank(1, pp - 1) == (pp - 1) * geo.width + 1);
    check_layers_placed(d, p);
    // The work of a pass outside its layers is on an end stage or on every stage; every task on
    // one stage at least.
    for (task_id t = 0; t < p.tasks; ++t) {
      CHECK_FALSE(stages_of(p, t).empty());
      if (p.layer[t] < 0 && p.virtual_stage[t] >= 0 && d.built.graph.kind[t] != graph::task_kind::join) {
        CHECK((p.virtual_stage[t] == 0 || p.virtual_stage[t] == pp - 1));
      }
    }
    if (kind == synth::policy_of<pipeline::one_f_one_b>()) {
      check_stage_orders(d, p, [&](int s) { return one_f_one_b_order(pp, m, s); });
    } else {
      check_stage_orders(d, p, [&](int) {
        std::vector<std::int32_t> all(static_cast<std::size_t>(2 * m));
        std::iota(all.begin(), all.end(), 0);  // every forward, then every backward
        return all;
      });
    }
    // A forward and a backward transfer per micro-batch, stage boundary and traced rank.
    CHECK(p.transfers.size() == 2u * static_cast<std::size_t>(m) * static_cast<std::size_t>(pp - 1) * d.job.ranks.size());
    check_transfers(p);
    CHECK(p.resync.empty());  // no traced stages: synchronizations keep their sources
  }
}

TEST_CASE("whatif --pp plan with model chunks: layer l on virtual stage l / per_chunk, chunk by chunk", "[whatif][pipeline][stages]") {
  const traced d = discovered(synthesised_job());
  const whatif::stage_plan p =
      whatif::plan_stages(d.built, d.job, d.st, {.pp = 2, .vp = 2, .schedule = synth::policy_of<pipeline::interleaved_one_f_one_b>()});
  CHECK(p.geometry.per_chunk == *d.st.model.layers.value / 4);
  check_layers_placed(d, p);
  // Each chunk's forward goes to the next virtual stage: from the last stage back to the first
  // for the next chunk.
  for (const whatif::planned_transfer& x : p.transfers) {
    const int wrap = x.forward ? (x.from == 1 && x.to == 0) : (x.from == 0 && x.to == 1);
    const int along = x.forward ? (x.to == x.from + 1) : (x.to == x.from - 1);
    CHECK(wrap + along == 1);
    CHECK(x.from_unit % 2 == x.chunk);
  }
  CHECK_FALSE(p.transfers.empty());
}

TEST_CASE("whatif --pp plan from traces with stages: each traced stage cut into a block", "[whatif][pipeline][stages]") {
  const traced d = discovered(synthesised_stages());
  const int P = *d.st.parallel.pp.value, m = *d.st.parallel.micro_batches.value;
  REQUIRE(P == 2);
  const int pp = 2 * P;
  const whatif::stage_plan p = whatif::plan_stages(d.built, d.job, d.st, {.pp = pp, .vp = 1, .schedule = synth::policy_of<pipeline::one_f_one_b>()});
  const auto& geo = p.geometry;
  CHECK(geo.cut == 2);
  CHECK_FALSE(geo.cross_blocks);
  // Each traced rank keeps its number on the first stage of its block; the others are numbered
  // from the traced world up.
  std::set<int> numbers;
  for (std::size_t i = 0; i < d.job.ranks.size(); ++i) {
    const int r = d.job.ranks[i].rank;
    CHECK(geo.new_rank(r, geo.first_stage(geo.stage_of[i])) == r);
    for (int j = 1; j < geo.cut; ++j) CHECK(geo.new_rank(r, geo.first_stage(geo.stage_of[i]) + j) >= P * geo.traced_width);
    for (int j = 0; j < geo.cut; ++j) numbers.insert(geo.new_rank(r, geo.first_stage(geo.stage_of[i]) + j));
  }
  CHECK(numbers.size() == static_cast<std::size_t>(pp * geo.traced_width));  // every rank of every stage, once
  check_layers_placed(d, p);
  // A stage has the processors of its block's traced rank only.
  const graph::task_graph& g = d.built.graph;
  for (int s = 0; s < pp; ++s) {
    for (graph::processor_id q = 0; q < p.processors; ++q) {
      const int rank = g.processors[q].rank;
      if (rank >= 0) CHECK(p.present[static_cast<std::size_t>(s) * p.processors + q] == (geo.traced_stage(rank) == s / geo.cut));
    }
  }
  check_stage_orders(d, p, [&](int s) { return one_f_one_b_order(pp, m, s); });
  // Transfers are added within a block only: between traced stages the traced one stays, on the
  // block ends that face each other.
  CHECK(p.transfers.size() == 2u * static_cast<std::size_t>(m) * static_cast<std::size_t>(P));
  for (const whatif::planned_transfer& x : p.transfers) CHECK(geo.source_stage(x.from) == geo.source_stage(x.to));
  check_transfers(p);
  std::size_t traced_transfers = 0;
  for (task_id t = 0; t < p.tasks; ++t) {
    if (p.p2p_where[t] == 1 || g.kind[t] == graph::task_kind::cpu) continue;
    ++traced_transfers;
    const int sigma = geo.traced_stage(g.rank[t]);
    // A receive or send of traced stage 0 faces stage 1: the last of block 0; stage 1's the first of block 1.
    CHECK(stages_of(p, t) == std::vector<int>{sigma == 0 ? geo.cut - 1 : geo.cut});
  }
  CHECK(traced_transfers > 0);
}

TEST_CASE("whatif --pp plan of a zero-bubble schedule: weight gradients in their W pass, after its B", "[whatif][pipeline][stages]") {
  traced d = discovered(synthesised_job());
  const std::vector<std::uint8_t> weight = whatif::weight_gradient_tasks(d.job, d.built, d.st, whatif::traced_shape(d.st));
  const whatif::stage_plan p =
      whatif::plan_stages(d.built, d.job, d.st, {.pp = 2, .vp = 1, .schedule = synth::policy_of<pipeline::zero_bubble_h1>(), .weight = &weight});
  const int m = p.geometry.micro_batches;
  CHECK(p.weight_ops > 0);
  std::size_t moved = 0;
  for (task_id t = 0; t < p.tasks; ++t) {
    const std::int32_t c = p.code[t];
    if (c == whatif::detail::label_post || c < 2 * m || d.built.graph.kind[t] == graph::task_kind::cpu) continue;
    ++moved;
    for (const int s : stages_of(p, t)) CHECK(p.pos(s, p.unit_of(t)) > p.pos(s, p.unit_of(t) - m));  // W after its B
  }
  CHECK(moved >= p.weight_ops);
  // Every weight gradient of a backward pass runs in that pass's W.
  std::size_t weights = 0;
  for (task_id t = 0; t < p.tasks; ++t) {
    const std::int32_t pass = p.geometry.pass_of(p.code[t]);
    if (!weight[t] || d.built.graph.kind[t] == graph::task_kind::cpu || pass < m || pass >= 2 * m) continue;
    ++weights;
    CHECK(p.code[t] == pass + m);
  }
  CHECK(weights > 0);
  CHECK_THROWS_AS(whatif::plan_stages(d.built, d.job, d.st, {.pp = 2, .vp = 1, .schedule = synth::policy_of<pipeline::zero_bubble_h1>()}), error);
  // Emission marks every copy of a W pass's task.
  std::size_t w_copies = 0;
  for (int s = 0; s < 2; ++s) {
    for (task_id t = 0; t < p.tasks; ++t) w_copies += p.copies(s, t, d.built.graph) && p.code[t] != whatif::detail::label_post && p.code[t] >= 2 * m;
  }
  const std::vector<report::iteration_plan> plans = report::plan_iterations(d.job, d.built);
  const whatif::stage_split out = whatif::emit_stages(d.built, d.job, p, plans, {});
  CHECK(out.weight_ops == p.weight_ops);
  CHECK(out.weight_pass.size() == d.built.graph.task_count());
  CHECK(static_cast<std::size_t>(std::count(out.weight_pass.begin(), out.weight_pass.end(), 1)) == w_copies);
}

TEST_CASE("whatif --pp plan: a target the layers do not divide over is refused", "[whatif][pipeline][stages]") {
  const traced d = discovered(synthesised_job());
  const int layers = *d.st.model.layers.value;
  REQUIRE(layers % 3 != 0);
  CHECK_FALSE(whatif::stage_split_unsupported(d.st, 3, 1, synth::policy_of<pipeline::one_f_one_b>()).empty());
  CHECK_THROWS_WITH(whatif::plan_stages(d.built, d.job, d.st, {.pp = 3, .vp = 1}), Catch::Contains("do not divide"));
  // Traces whose transfers are not under c10d's nccl:send / nccl:recv operators (the hand-made
  // ones) cannot have their stages cut: which pass a transfer feeds is not known.
  const traced hand_made = discovered(pipeline_traces("pp2_1f1b"));
  CHECK_THROWS_WITH(whatif::plan_stages(hand_made.built, hand_made.job, hand_made.st, {.pp = 4, .vp = 1}), Catch::Contains("nccl:send"));
}

TEST_CASE("whatif --pp emission of a job without stages: ranks, copies and transfers as planned, and a graph that replays",
          "[whatif][pipeline][stages]") {
  traced d = discovered(synthesised_job());
  const std::vector<report::iteration_plan> plans = report::plan_iterations(d.job, d.built);
  const whatif::stage_plan p = whatif::plan_stages(d.built, d.job, d.st, {.pp = 2, .vp = 1, .schedule = synth::policy_of<pipeline::one_f_one_b>()});
  const graph::task_graph before = d.built.graph;
  const std::vector<graph::rank_map> maps = d.built.ranks;
  const whatif::stage_split out = whatif::emit_stages(d.built, d.job, p, plans, {.p2p = {.intra = 5'000, .inter = 20'000}});
  const graph::task_graph& g = d.built.graph;
  // Stage s of traced rank r is rank s·W + r.
  std::set<int> ranks;
  for (graph::processor_id q = 0; q < g.processors.size(); ++q) {
    if (g.processors[q].rank >= 0) ranks.insert(g.processors[q].rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(out.world == 2);
  CHECK(out.plans.size() == d.job.ranks.size());  // stage 1 of each traced rank
  CHECK(out.tasks_before == before.task_count());
  // The tasks: each stage's copies as planned, and per transfer a send launch on the producer's
  // host and a receive launch with two synchronizations on the consumer's; then per transfer an
  // arrive and a complete on each side and their join.
  CHECK(out.tasks_after == planned_copies(p, before) + 4 * out.p2p);
  CHECK(g.task_count() == out.tasks_after + 5 * out.p2p + out.world_joined);
  check_added_transfers(d, p, out);
  check_maps(d, p, before, maps, out);
  // Within one node (8 GPUs) every transfer takes the intra-node time.
  for (const graph::collective_instance& ci : g.collectives) {
    if (ci.kind == "send_recv") CHECK(g.duration[ci.complete.front()] == 5'000);
  }
  CHECK(out.change.starts_with("PP 1 -> 2, fine-grained"));
  const graph::compiled_graph compiled = graph::compile(g);
  CHECK(sim::replay(compiled).makespan() > 0);
}

TEST_CASE("whatif --pp emission from traces with stages: traced ranks keep their numbers, traced transfers stay between blocks",
          "[whatif][pipeline][stages]") {
  traced d = discovered(synthesised_stages());
  const std::vector<report::iteration_plan> plans = report::plan_iterations(d.job, d.built);
  const whatif::stage_plan p = whatif::plan_stages(d.built, d.job, d.st, {.pp = 4, .vp = 1, .schedule = synth::policy_of<pipeline::gpipe>()});
  const graph::task_graph before = d.built.graph;
  const std::vector<graph::rank_map> maps = d.built.ranks;
  std::size_t traced_pairs = 0;
  for (const graph::collective_instance& ci : before.collectives) traced_pairs += ci.complete.size() == 2 && ci.kind.find("send") != std::string::npos;
  const whatif::stage_split out = whatif::emit_stages(d.built, d.job, p, plans, {});
  const graph::task_graph& g = d.built.graph;
  CHECK(out.tasks_after == planned_copies(p, before) + 4 * out.p2p);
  check_added_transfers(d, p, out);
  check_maps(d, p, before, maps, out);
  // The traced transfers, kept: between the last stage of block 0 and the first of block 1.
  const auto& geo = p.geometry;
  std::size_t kept_pairs = 0;
  for (const graph::collective_instance& ci : g.collectives) {
    if (ci.match.starts_with("added by") || ci.complete.size() != 2 || ci.kind.find("send") == std::string::npos) continue;
    ++kept_pairs;
    std::set<int> ends;
    for (const task_id c : ci.complete) ends.insert(g.rank[c]);
    CHECK(ends == std::set<int>{geo.new_rank(0, geo.cut - 1), geo.new_rank(geo.traced_width, geo.cut)});
  }
  CHECK(traced_pairs > 0);
  CHECK(kept_pairs == traced_pairs);
  const graph::compiled_graph compiled = graph::compile(g);
  CHECK(sim::replay(compiled).makespan() > 0);
  // A plan is of one graph: emitting it again, on the split graph, is refused.
  CHECK_THROWS_AS(whatif::emit_stages(d.built, d.job, p, plans, {}), error);
}

TEST_CASE("whatif micro-batch change with stages: a middle micro-batch's passes repeated in place on every stage", "[whatif][pipeline][stages]") {
  const traced d = discovered(pipeline_traces("pp2_1f1b"));
  const int m = *d.st.parallel.micro_batches.value;
  const whatif::micro_batch_rewrite more = whatif::stage_micro_batches_to(d.built, d.job, d.st, m + 2);
  CHECK(more.from == m);
  CHECK(more.to == m + 2);
  CHECK(more.end == more.first + 1);
  CHECK(more.first > 0);  // the first micro-batch stays as traced
  REQUIRE(more.groups.size() == 2);  // its forward and its backward passes
  std::set<task_id> grouped;
  for (const auto& group : more.groups) {
    CHECK(group.count == 3u);
    grouped.insert(group.tasks.begin(), group.tasks.end());
  }
  // Every GPU op of the repeated micro-batch's passes is in a group, and no other pass's.
  for (const whatif::gpu_op_context& c : d.st.gpu_ops) {
    if (c.pass < 0 || c.p2p) continue;  // a traced transfer goes with the pass it feeds or drains
    const task_id t = d.built.ranks[c.rank].task_of_event[c.op];
    const int mb = d.st.ranks[c.rank].passes[static_cast<std::size_t>(c.pass)].op.micro_batch;
    CHECK(grouped.contains(t) == (mb == more.first));
  }
  const whatif::micro_batch_rewrite fewer = whatif::stage_micro_batches_to(d.built, d.job, d.st, m - 1);
  CHECK(fewer.end - fewer.first == 1);
  for (const auto& group : fewer.groups) CHECK(group.count == 0u);
  CHECK(whatif::stage_micro_batches_to(d.built, d.job, d.st, m).groups.empty());
}

}  // namespace stage_split_test

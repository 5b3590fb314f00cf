// build_compiled (synth/program.hpp): the compiled program emitted without a task graph is the
// compiled task graph of build_program — processor by processor, the same tasks with the same
// durations and replayed times, but for the zero-length ones it folds and the collectives it
// merges into the compute task before them; the same counts and the same figures — for folded
// and unfolded jobs, both granularities and the builder's options; a
// warm build reuses its buffers; a schedule whose ops wait on each other is the error
// graph::compile gives.

#include "../model/config_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/figures.hpp>
#include <lumos/synth/program.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace lg = lumos::graph;
namespace lm = lumos::model;
namespace lp = lumos::pipeline;
namespace ls = lumos::synth;

ls::job small_job(int tp, int pp, int dp, std::int64_t global_batch, int vp = 1) {
  ls::job j;
  j.model = lumos::model::test::small_gpt();
  j.hardware = lm::h100_sxm();
  j.parallel.tp = tp;
  j.parallel.pp = pp;
  j.parallel.dp = dp;
  j.parallel.vp = vp;
  j.parallel.global_batch = global_batch;
  return j;
}

// A processor by what it is, not by its index (the two builds number barriers apart).
using processor_key = std::tuple<int, int, std::int64_t, std::int64_t>;
processor_key key_of(const lg::processor_info& p) { return {static_cast<int>(p.kind), p.rank, p.owner, p.index}; }

// One task as the replay sees it.
struct task_view {
  lg::task_kind kind;
  lumos::time_ns duration, start, finish;
  friend bool operator==(const task_view&, const task_view&) = default;
};

// Every processor's tasks in order, replayed: of the compiled task graph `c` of `g` without the
// tasks the compiled program folds (`fold`) and with those it merges into the task before them
// (`merge`: their time added to it), or of the compiled program `p`.
std::map<processor_key, std::vector<task_view>> view(const lg::compiled_graph& c, const lg::task_graph& g, auto fold, auto merge) {
  const lumos::sim::record_timeline t = lumos::sim::replay(c);
  std::map<processor_key, std::vector<task_view>> out;
  for (std::uint32_t i = 0; i < c.size(); ++i) {
    const lg::task_id id = c.task[i];
    if (g.processors[g.processor[id]].kind == lg::processor_kind::barrier || fold(id)) continue;
    std::vector<task_view>& tasks = out[key_of(g.processors[g.processor[id]])];
    if (merge(id)) {
      REQUIRE(tasks.back().finish == t.start_of(lg::position{i}));  // it starts as the task before it ends
      tasks.back().duration += c.duration(i);
      tasks.back().finish = t.finish_of(lg::position{i});
      continue;
    }
    tasks.push_back({g.kind[id], c.duration(i), t.start_of(lg::position{i}), t.finish_of(lg::position{i})});
  }
  return out;
}
std::map<processor_key, std::vector<task_view>> view(const ls::compiled_program& p) {
  const lumos::sim::record_timeline t = lumos::sim::replay(p.graph);
  std::map<processor_key, std::vector<task_view>> out;
  for (std::uint32_t i = 0; i < p.graph.size(); ++i) {
    if (p.processors[p.graph.processor(i)].kind == lg::processor_kind::barrier) continue;
    out[key_of(p.processors[p.graph.processor(i)])].push_back({p.kind[i], p.graph.duration(i), t.start_of(lg::position{i}), t.finish_of(lg::position{i})});
  }
  return out;
}

template <class Compute = lm::roofline, class Comm = lm::ring_alpha_beta>
void require_same_program(const ls::job& j, const ls::program_options& opt, const Compute& compute = {}, const Comm& comm = {}) {
  const ls::program prog = ls::build_program(j, opt, compute, comm);
  const lg::task_graph& g = prog.graph;
  const lg::compiled_graph general = lg::compile(g);
  const ls::compiled_program direct = ls::build_compiled(j, opt, compute, comm);
  REQUIRE(direct.task_count() == g.task_count());
  REQUIRE(direct.edge_count() == g.edge_count());
  REQUIRE(direct.processor_count == g.processors.size());
  REQUIRE(direct.ranks.size() == prog.ranks.size());
  // What the compiled program folds (compiled_program): host waits (every host_sync task of a
  // thread but its last, the final sync) and the arrive of a collective with one participant
  // (no join edge into its complete, the next task).
  std::vector<char> joined(g.task_count(), 0), fold(g.task_count(), 0), merge(g.task_count(), 0);
  std::vector<int> edges_in(g.task_count(), 0);
  std::vector<std::pair<lg::task_id, std::int32_t>> launch(g.task_count(), {lg::no_task, 0});
  for (const lg::edge& e : g.edges) {
    if (g.kind[e.from] == lg::task_kind::join) joined[e.to] = 1;
    if (e.kind == lg::edge_kind::launch) launch[e.to] = {e.from, e.delay};
    ++edges_in[e.to];
  }
  std::vector<lg::task_id> last(g.processors.size(), lg::no_task), before(g.task_count(), lg::no_task);
  for (lg::task_id t = 0; t < g.task_count(); ++t) {
    before[t] = last[g.processor[t]];
    last[g.processor[t]] = t;
  }
  const lumos::string_id host_sync = g.strings.find("host_sync");
  for (lg::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] == lg::task_kind::cpu && g.name[t] == host_sync && last[g.processor[t]] != t) fold[t] = 1;
    if (g.kind[t] == lg::task_kind::comm_arrive && t + 1 < g.task_count() && joined[t + 1] == 0) fold[t] = 1;
  }
  // And what it merges: on the compute streams of ranks other than 0, a collective with one
  // participant whose arrive waits for nothing but its launch, launched by the same CPU task as
  // the compute task before it and no later (it starts when that task ends).
  for (lg::task_id t = 1; t < g.task_count(); ++t) {
    const lg::task_id a = t - 1, p = before[a];
    const lg::processor_info& where = g.processors[g.processor[t]];
    if (g.kind[t] != lg::task_kind::comm_complete || fold[a] == 0 || edges_in[a] != 1 || launch[a].first == lg::no_task ||
        p == lg::no_task || where.rank == 0 || where.index != 7 || g.kind[p] != lg::task_kind::gpu_compute) {
      continue;
    }
    if (launch[p].first == launch[a].first && launch[p].second >= launch[a].second) merge[t] = 1;
  }
  const auto a = view(general, g, [&](lg::task_id t) { return fold[t] != 0; }, [&](lg::task_id t) { return merge[t] != 0; });
  const auto b = view(direct);
  REQUIRE(a.size() == b.size());
  for (const auto& [key, tasks] : a) {
    INFO("processor kind " << std::get<0>(key) << " rank " << std::get<1>(key) << " index " << std::get<3>(key));
    REQUIRE(b.count(key) == 1);
    const auto& got = b.at(key);
    REQUIRE(got.size() == tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      INFO("task " << i);
      // A folded arrive's complete is the one task of the compiled program.
      REQUIRE(got[i] == tasks[i]);
    }
  }
  for (std::size_t r = 0; r < prog.ranks.size(); ++r) {
    const ls::simulated_rank& want = prog.ranks[r];
    const ls::compiled_rank& got = direct.ranks[r];
    REQUIRE(got.rank == want.rank);
    REQUIRE(got.stage == want.stage);
    REQUIRE(key_of(direct.processors[got.compute]) == key_of(g.processors[want.compute]));
    REQUIRE((got.pipeline_first == ls::no_position) == (want.pipeline_first == lg::no_task));
  }
  // The figures of both (replay_figures over compile_program's view of the task graph).
  const ls::compiled_program through_graph = ls::compile_program(prog);
  lumos::sim::replay_engine e1, e2;
  ls::figure_buffers f1, f2;
  const ls::timeline_figures x = ls::replay_figures(through_graph, e1, f1), y = ls::replay_figures(direct, e2, f2);
  CHECK(x.iteration_ns == y.iteration_ns);
  CHECK(x.pipeline_ns == y.pipeline_ns);
  CHECK(x.bubble_fraction == y.bubble_fraction);
  CHECK(x.breakdown_window_ns == y.breakdown_window_ns);
  CHECK(x.breakdown.exposed_compute == y.breakdown.exposed_compute);
  CHECK(x.breakdown.overlapped == y.breakdown.overlapped);
  CHECK(x.breakdown.exposed_comm == y.breakdown.exposed_comm);
  CHECK(x.breakdown.other == y.breakdown.other);
  CHECK(x.pipeline_ns > 0);
  // Rank 0's communication kernels from their arrives (what predict's breakdown with waits reads).
  REQUIRE(f1.kernel.size() == f2.kernel.size());
  for (std::size_t i = 0; i < f1.kernel.size(); ++i) {
    CHECK(f1.kernel[i].begin == f2.kernel[i].begin);
    CHECK(f1.kernel[i].end == f2.kernel[i].end);
  }
  // The timeline the builder computed as it placed the tasks is the replay's, position by
  // position, and so are the figures taken from it.
  const lumos::sim::record_timeline replayed = lumos::sim::replay(direct.graph);
  REQUIRE(direct.times.size() == 2 * direct.graph.size());
  std::uint32_t same = 0;
  while (same < direct.graph.size() && direct.times[2 * std::size_t{same}] == replayed.start_of(lg::position{same}) &&
         direct.times[2 * std::size_t{same} + 1] == replayed.finish_of(lg::position{same})) {
    ++same;
  }
  REQUIRE(same == direct.graph.size());
  CHECK(direct.makespan == replayed.makespan());
  ls::figure_buffers f3;
  const ls::timeline_figures z = ls::emitted_figures(direct, f3);
  CHECK(z.iteration_ns == y.iteration_ns);
  CHECK(z.pipeline_ns == y.pipeline_ns);
  CHECK(z.bubble_fraction == y.bubble_fraction);
  CHECK(z.breakdown_window_ns == y.breakdown_window_ns);
  CHECK(z.breakdown.exposed_compute == y.breakdown.exposed_compute);
  CHECK(z.breakdown.overlapped == y.breakdown.overlapped);
  CHECK(z.breakdown.exposed_comm == y.breakdown.exposed_comm);
  CHECK(z.breakdown.other == y.breakdown.other);
}

// A 1F1B whose first stage runs its backward before its forward: every op waits on another.
struct backward_first final {
  static constexpr std::string_view name = "backward-first";
  static constexpr std::string_view title = "backward first";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const lp::schedule_shape& shape) { lp::validate_shape(title, shape, supports_chunks); }
  [[nodiscard]] static constexpr std::vector<lp::op> stage_ops(const lp::schedule_shape& shape, std::int32_t stage) {
    std::vector<lp::op> ops = lp::one_f_one_b::stage_ops(shape, stage);
    if (stage == 0) std::reverse(ops.begin(), ops.end());
    return ops;
  }
};
static_assert(lp::PipelineSchedule<backward_first>);

}  // namespace

TEST_CASE("the compiled program is the compiled task graph, task by task", "[synth][compiled]") {
  ls::program_options pass;
  pass.detail = ls::granularity::pass;
  pass.record_collectives = false;
  ls::program_options kernel;
  kernel.detail = ls::granularity::kernel;
  SECTION("1F1B, interleaved, zero-bubble and GPipe, folded") {
    require_same_program(small_job(2, 2, 2, 16), pass);
    require_same_program(small_job(2, 4, 2, 32, 2), pass);
    auto zb = small_job(4, 2, 2, 16);
    zb.schedule = ls::policy_of<lp::zero_bubble_h1>();
    zb.parallel.recompute = lm::recompute_kind::selective;
    require_same_program(zb, pass);
    zb.schedule = ls::policy_of<lp::zero_bubble_h2>();
    zb.parallel.sp = true;
    zb.parallel.zero_stage = 3;
    require_same_program(zb, pass);
    auto gpipe = small_job(1, 4, 2, 16);
    gpipe.schedule = ls::policy_of<lp::gpipe>();
    gpipe.parallel.recompute = lm::recompute_kind::full;
    gpipe.parallel.zero_stage = 2;
    require_same_program(gpipe, pass);
  }
  SECTION("unfolded, and at the kernel granularity") {
    auto j = small_job(2, 2, 2, 16);
    j.parallel.zero_stage = 1;
    ls::program_options o = pass;
    o.unfold = true;
    require_same_program(j, o);
    require_same_program(j, kernel);
    kernel.unfold = true;
    require_same_program(small_job(2, 2, 1, 8, 2), kernel);
  }
  SECTION("the builder's options: host syncs, buckets after the backward, early all-gathers, forward only") {
    auto j = small_job(2, 4, 2, 32);
    j.parallel.zero_stage = 1;
    j.parallel.dtype = lm::precision::fp16;
    ls::program_options o = pass;
    o.p2p_host_sync = true;
    o.loss_scale_host_sync = true;
    require_same_program(j, o);
    o = pass;
    o.overlap_grad_reduce = false;
    require_same_program(j, o);
    j.parallel.overlap_param_gather = true;
    require_same_program(j, pass);
    o = pass;
    o.forward_only = true;
    require_same_program(j, o);
    require_same_program(j, kernel);
  }
  SECTION("the kernel-level model and NCCL, a GQA model without tied embeddings") {
    const lm::cost_profile profile = lm::profile_preset("h100-sxm");
    auto j = small_job(8, 2, 4, 32);
    j.model = lm::llama3_8b();
    j.model.layers = 4;
    j.model.seq = 1024;
    j.parallel.sp = true;
    j.parallel.tp_comm_overlap = true;
    require_same_program(j, pass, lm::kernel_level{profile}, lm::nccl_model{profile});
  }
}

TEST_CASE("build_compiled_into reuses its program and buffers from job to job", "[synth][compiled]") {
  ls::program_options o;
  o.detail = ls::granularity::pass;
  ls::compiled_program reused;
  ls::program_buffers buffers;
  for (const auto& j : {small_job(2, 4, 2, 32, 2), small_job(1, 1, 8, 16), small_job(2, 8, 1, 32), small_job(4, 2, 2, 16)}) {
    ls::build_compiled_into(reused, buffers, j, o);
    const ls::compiled_program fresh = ls::build_compiled(j, o);
    REQUIRE(reused.task_count() == fresh.task_count());
    REQUIRE(reused.edge_count() == fresh.edge_count());
    REQUIRE(reused.graph.size() == fresh.graph.size());
    REQUIRE(reused.processors.size() == fresh.processors.size());
    CHECK(lumos::sim::replay(reused.graph).makespan() == lumos::sim::replay(fresh.graph).makespan());
    for (std::uint32_t i = 0; i < fresh.graph.size(); ++i) {
      REQUIRE(reused.graph.tasks[i].duration == fresh.graph.tasks[i].duration);
      REQUIRE(reused.graph.tasks[i].pred_end == fresh.graph.tasks[i].pred_end);
      REQUIRE(reused.kind[i] == fresh.kind[i]);
    }
  }
}

TEST_CASE("a build that keeps the timeline alone has the whole program's timeline, and stops growing", "[synth][compiled]") {
  ls::program_options o;
  o.detail = ls::granularity::pass;
  o.p2p_host_sync = true;
  ls::compiled_program reused;
  ls::program_buffers buffers;
  const std::vector<ls::job> jobs = {small_job(2, 4, 2, 32, 2), small_job(1, 1, 8, 16), small_job(2, 8, 1, 64),
                                     small_job(4, 2, 2, 16)};
  std::size_t room = 0;
  for (int round = 0; round < 3; ++round) {
    for (const auto& j : jobs) {
      ls::build_compiled_into(reused, buffers, j, o, {}, {}, nullptr, ls::compiled_parts::timeline);
      const ls::compiled_program whole = ls::build_compiled(j, o);
      CHECK(reused.parts == ls::compiled_parts::timeline);
      CHECK(reused.graph.size() == 0);
      CHECK(reused.kind.empty());
      REQUIRE(reused.times.size() == whole.times.size());
      CHECK(std::equal(reused.times.begin(), reused.times.end(), whole.times.begin()));
      CHECK(reused.makespan == whole.makespan);
      CHECK(reused.task_count() == whole.task_count());
      CHECK(reused.edge_count() == whole.edge_count());
      ls::figure_buffers f1, f2;
      const ls::timeline_figures x = ls::emitted_figures(reused, f1), y = ls::emitted_figures(whole, f2);
      CHECK(x.bubble_fraction == y.bubble_fraction);
      CHECK(x.breakdown_window_ns == y.breakdown_window_ns);
      CHECK(x.breakdown.exposed_comm == y.breakdown.exposed_comm);
    }
    // Warm after the first round: the arrays keep their room (none grows build after build).
    const std::size_t now = reused.times.capacity() + reused.graph.preds.capacity();
    if (round == 2) CHECK(now == room);
    room = now;
  }
}

TEST_CASE("a schedule whose ops wait on each other is graph::compile's cycle error", "[synth][compiled]") {
  auto j = small_job(1, 2, 1, 4);
  j.schedule = ls::policy_of<backward_first>();
  std::string general, direct;
  try {
    (void)lg::compile(ls::build_program(j).graph);
  } catch (const lumos::error& e) {
    general = e.what();
  }
  try {
    (void)ls::build_compiled(j);
  } catch (const lumos::error& e) {
    direct = e.what();
  }
  CHECK_THAT(general, Catch::Contains("cycle"));
  CHECK(direct == general);
}

// Structure discovery, one facet at a time: each discover_X called on its own, after the facets
// it reads, on the hand-made pipeline traces of tests/data/whatif (make_pipeline_traces.py says
// how each was built), on small traces written here, or on a job `lumos synth` writes.
#include "../unit/test_support.hpp"

#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/reader.hpp>
#include <lumos/whatif/structure.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace structure_facets {

using namespace lumos;
namespace fs = std::filesystem;

/// A job, its graph, the facets' inputs and what the facets run so far found.
struct run {
  trace::job job;
  graph::built_job built;
  std::optional<whatif::discovery_inputs> in;
  whatif::job_structure out;
};

/// The facets of `discover_structure`, in its order.
enum class facet { inputs, iteration, phases, passes, layers, stages, layout, schedule, groups, degrees, gradients, shape, tasks };

/// Builds the graph and the inputs of `job` (held where the inputs' references stay valid).
std::unique_ptr<run> start(trace::job job, const whatif::structure_options& o = {}) {
  auto r = std::make_unique<run>();
  r->job = std::move(job);
  r->built = graph::build_graph(r->job);
  r->in.emplace(whatif::make_discovery_inputs(r->job, r->built, o));
  return r;
}

std::unique_ptr<run> start(const fs::path& dir, const whatif::structure_options& o = {}) { return start(trace::load_job({dir}), o); }

/// Runs the facets in `discover_structure`'s order, through `last`.
void through(run& r, facet last) {
  using namespace whatif;
  auto& in = *r.in;
  auto& out = r.out;
  const auto step = [&](facet f, auto&& call) {
    if (f <= last) call();
  };
  step(facet::iteration, [&] { discover_iteration(in, out); });
  step(facet::phases, [&] { discover_phases(in, out); });
  step(facet::passes, [&] { discover_passes(in, out); });
  step(facet::layers, [&] { discover_layers(in, out); });
  step(facet::stages, [&] { discover_stages(in, out); });
  step(facet::layout, [&] { discover_layout(in, out); });
  step(facet::schedule, [&] { discover_schedule(in, out); });
  step(facet::groups, [&] { discover_groups(in, out); });
  step(facet::degrees, [&] { discover_parallel_degrees(in, out); });
  step(facet::gradients, [&] { discover_gradients(in, out); });
  step(facet::shape, [&] { discover_model_shape(in, out); });
  step(facet::tasks, [&] {
    discover_layer_tasks(in, out);
    discover_gpu_ops(in, out);
  });
}

fs::path pipeline_dir(const char* name) { return lumos_test::data_dir() / "whatif" / name; }

/// One GPU op of a hand-written trace: its kernel, the annotations enclosing its launch
/// (outermost first) and, for a collective, the args of its kernel.
struct launch {
  std::vector<std::string> scopes;
  std::string kernel;
  std::string comm_args;  ///< JSON members ("\"Collective name\": \"allreduce\", ...") or empty
};

/// A one-rank Kineto trace (rank 0 of `world`): ProfilerStep#`step` over the launches, each
/// 100 us after the last, its annotations and runtime call on the main thread, its kernel on
/// stream 7. With `before`, one more kernel launched ahead of the step annotation.
trace::job one_rank(const std::vector<launch>& launches, int world = 1, int step = 1, bool before = false) {
  std::string ev;
  auto add = [&](const std::string& e) { ev += (ev.empty() ? "" : ",\n") + e; };
  auto x = [](const std::string& cat, const std::string& name, int pid, int tid, long ts, long dur, const std::string& args) {
    return R"({"ph": "X", "cat": ")" + cat + R"(", "name": ")" + name + R"(", "pid": )" + std::to_string(pid) +
           R"(, "tid": )" + std::to_string(tid) + R"(, "ts": )" + std::to_string(ts) + R"(, "dur": )" + std::to_string(dur) +
           R"(, "args": {)" + args + "}}";
  };
  auto add_launch = [&](const launch& l, long t, std::size_t corr) {
    for (std::size_t s = 0; s < l.scopes.size(); ++s) {
      add(x("user_annotation", l.scopes[s], 1, 1, t + static_cast<long>(s), 60 - 2 * static_cast<long>(s), ""));
    }
    const std::string c = R"("correlation": )" + std::to_string(corr);
    add(x("cuda_runtime", "cudaLaunchKernel", 1, 1, t + 10, 5, c));
    add(x("kernel", l.kernel, 0, 7, t + 20, 10, R"("device": 0, "stream": 7, )" + c + (l.comm_args.empty() ? "" : ", " + l.comm_args)));
  };
  add(x("user_annotation", "ProfilerStep#" + std::to_string(step), 1, 1, 50, 100 * static_cast<long>(launches.size()) + 50, ""));
  for (std::size_t i = 0; i < launches.size(); ++i) add_launch(launches[i], 100 + 100 * static_cast<long>(i), i + 1);
  if (before) add_launch({{}, "early_kernel", ""}, 0, launches.size() + 1);
  const std::string text =
      R"({"distributedInfo": {"rank": 0, "world_size": )" + std::to_string(world) + R"(}, "traceEvents": [)" + ev + "]}";
  trace::job j;
  j.ranks.push_back(trace::read_trace_bytes(text, "one_rank"));
  return j;
}

/// A rank's passes as letters, in execution order.
std::string letters(const whatif::rank_structure& rs) {
  std::string s;
  for (const auto& p : rs.passes) s += pipeline::op_letter(p.op.kind);
  return s;
}

/// A stage order as letters, W read as B (as the traces show a zero-bubble W pass).
std::string letters(const std::vector<pipeline::op>& ops) {
  std::string s;
  for (const auto& o : ops) s += pipeline::op_letter(o.kind == pipeline::op_kind::weight ? pipeline::op_kind::backward : o.kind);
  return s;
}

}  // namespace structure_facets

using namespace structure_facets;

TEST_CASE("structure classify: names of events say phases, collectives, kernels, data types", "[whatif][structure]") {
  using namespace lumos::whatif::detail;
  CHECK(phase_marker("## forward ##") == whatif::phase_kind::forward);
  CHECK(phase_marker("autograd::engine::evaluate_function: MmBackward0") == whatif::phase_kind::backward);
  CHECK(phase_marker("Optimizer.step#Adam.step") == whatif::phase_kind::optimizer);
  CHECK(phase_marker("Optimizer.zero_grad#Adam.zero_grad") == whatif::phase_kind::other);
  CHECK_FALSE(phase_marker("ProfilerStep#3").has_value());  // the iteration, not a phase
  CHECK_FALSE(phase_marker("aten::mm").has_value());
  CHECK_FALSE(phase_marker("FSDP::pre_forward").has_value());  // FSDP2's hooks wrap gathers, not the unit's compute
  CHECK_FALSE(phase_marker("FSDP::post_backward_reduce").has_value());
  CHECK(comm_kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "") == "allreduce");
  CHECK(comm_kind("ncclKernel_AllGather_RING_LL_Sum_int8_t", "") == "allgather");
  CHECK(comm_kind("anything", "all_to_allv") == "alltoall");  // the arg wins over the kernel name
  CHECK(comm_kind("anything", "send") == "sendrecv");
  // c10d's variants (FSDP2, DDP's coalesced ops) are the collective they run.
  for (const char* name : {"_allgather_base", "allgather_into_tensor_coalesced", "allgather_coalesced", "all_gather"}) {
    INFO(name);
    CHECK(comm_kind("ncclDevKernel_AllGather_RING_LL", name) == "allgather");
  }
  for (const char* name : {"_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "REDUCE_SCATTER"}) {
    INFO(name);
    CHECK(comm_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", name) == "reducescatter");
  }
  CHECK(comm_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce_coalesced") == "allreduce");
  CHECK(comm_kind("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce") == "reduce");  // not an all-reduce
  CHECK(comm_kind("anything", "_alltoall_base") == "alltoall");
  CHECK(dtype_of_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "bf16");
  CHECK(dtype_of_kernel("ampere_fp16_s16816gemm_fp16_128x128") == "fp16");
  CHECK(dtype_of_kernel("void gelu_kernel") == "");
  CHECK(is_gemm_kernel("nvjet_tst_128x256_64x4"));
  CHECK_FALSE(is_gemm_kernel("void softmax_warp_forward"));
  CHECK(is_attention_kernel("flash_fwd_kernel"));
  CHECK(group_size_of(8) == 8);
  CHECK_FALSE(group_size_of(0).has_value());
  CHECK_FALSE(group_size_of(std::int64_t{1} << 40).has_value());
  // Traced stage → stage of another depth: the ends stay ends.
  CHECK(whatif::traced_stage_to(0, 4, 2) == 0);
  CHECK(whatif::traced_stage_to(3, 4, 2) == 1);
  CHECK(whatif::traced_stage_to(3, 4, 8) == 7);
  CHECK(whatif::traced_stage_to(2, 4, 4) == 2);
}

TEST_CASE("structure inputs: the launches of the chosen step, in enqueue order, with their context", "[whatif][structure]") {
  // One op launched before the step annotation: outside the iteration.
  auto r = start(one_rank({{{"## forward ##"}, "k_fwd", ""}, {{"## backward ##"}, "k_bwd", ""}}, 1, 5, true));
  const auto& in = *r->in;
  CHECK(in.step == 5);
  REQUIRE(in.ranks.size() == 1);
  const auto& w = in.ranks[0];
  REQUIRE(w.launches.size() == 2);
  const auto& t = r->job.ranks[0];
  CHECK(t.name(t.events[w.launches[0].op]) == "k_fwd");
  CHECK(w.launches[0].phase == whatif::phase_kind::forward);
  CHECK(w.launches[1].phase == whatif::phase_kind::backward);
  CHECK(w.launches[0].enqueue < w.launches[1].enqueue);
  CHECK(w.launches[0].call != whatif::detail::no_event);
  CHECK(w.iteration.value == std::string("ProfilerStep#5"));
  // A step the rank lacks, and a graph of another job, are errors.
  whatif::structure_options o;
  o.step = 4;
  CHECK_THROWS_AS(whatif::make_discovery_inputs(r->job, r->built, o), lumos::error);
  const trace::job empty;
  CHECK_THROWS_AS(whatif::make_discovery_inputs(empty, r->built), lumos::error);
}

TEST_CASE("structure iteration: each rank's step and its window in job time", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp2_1f1b"));
  through(*r, facet::iteration);
  REQUIRE(r->out.ranks.size() == 2);
  for (std::size_t ri = 0; ri < 2; ++ri) {
    const auto& rs = r->out.ranks[ri];
    CHECK(rs.rank == r->job.ranks[ri].rank);
    REQUIRE(rs.iteration.known());
    CHECK(rs.iteration.value->starts_with("ProfilerStep#"));
    CHECK(rs.iteration.flag == "--step");
    CHECK(rs.iteration_start < rs.iteration_end);
    CHECK(rs.phases.empty());  // the phases facet has not run
  }
}

TEST_CASE("structure phases: forward, backward and optimizer from the annotations enclosing the launches", "[whatif][structure]") {
  auto r = start(one_rank({{{"## forward ##"}, "k1", ""},
                           {{"## forward ##"}, "k2", ""},
                           {{"## backward ##"}, "k3", ""},
                           {{"Optimizer.step#Adam.step"}, "k4", ""},
                           {{}, "k5", ""}}));
  through(*r, facet::phases);
  const auto& phases = r->out.ranks[0].phases;
  REQUIRE(phases.size() == 3);
  CHECK(phases[0].kind == whatif::phase_kind::forward);
  CHECK(phases[0].gpu_ops == 2);
  CHECK(phases[0].marked);
  CHECK(phases[0].source == "launches under '## forward ##'");
  CHECK(phases[1].kind == whatif::phase_kind::backward);
  CHECK(phases[1].gpu_ops == 1);
  CHECK(phases[2].kind == whatif::phase_kind::optimizer);
  CHECK(phases[2].gpu_ops == 1);
  CHECK(phases[0].start < phases[0].end);
  CHECK(phases[0].end <= phases[1].start);
  // With forward markers present the unmarked launch is in no phase.
  CHECK(r->in->ranks[0].launches.back().phase == whatif::phase_kind::other);
}

TEST_CASE("structure passes: one per micro-batch, in the order each stage ran them", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp2_1f1b"));
  through(*r, facet::passes);
  const pipeline::schedule_shape shape{2, 4, 1};  // make_pipeline_traces.py: pp2_1f1b
  for (std::size_t ri = 0; ri < 2; ++ri) {
    const auto& rs = r->out.ranks[ri];
    INFO("rank " << rs.rank);
    CHECK(letters(rs) == letters(pipeline::one_f_one_b::stage_ops(shape, rs.rank)));
    // Micro-batches in order of each kind, before the schedule is known.
    int f = 0, b = 0;
    for (const auto& p : rs.passes) CHECK(p.op.micro_batch == (p.op.kind == pipeline::op_kind::forward ? f++ : b++));
    // Each launch is in the pass whose launches list it.
    const auto& w = r->in->ranks[ri];
    REQUIRE(w.pass_launches.size() == rs.passes.size());
    for (std::size_t pi = 0; pi < w.pass_launches.size(); ++pi) {
      CHECK(w.pass_launches[pi].size() == rs.passes[pi].gpu_ops);
      for (const std::size_t li : w.pass_launches[pi]) CHECK(w.launches[li].pass == static_cast<int>(pi));
    }
  }
  CHECK(r->out.notes.empty());
}

#ifdef LUMOS_CLI_PATH
TEST_CASE("structure passes: a zero-bubble job's B and W told apart by the annotation marking each", "[whatif][structure]") {
  lumos_test::temp_dir dir;
  const auto res = lumos_test::run_cli("synth --layers 2 --hidden 512 --heads 8 --seq 256 --tp 1 --pp 2 --dp 1 --micro-batch 1 "
                                       "--global-batch 4 --schedule zb-h1 --gpu h100-sxm --detail kernel --out " +
                                       dir.path().string());
  REQUIRE(res.code == 0);
  auto r = start(dir.path());
  through(*r, facet::passes);
  for (const auto& rs : r->out.ranks) {
    const std::string order = letters(rs);
    const auto forwards = std::count(order.begin(), order.end(), 'F');
    CHECK(forwards == 4);  // global batch 4 of micro-batch 1
    CHECK(rs.passes.size() == 12);  // F, B and W of each micro-batch
  }
  REQUIRE(r->out.notes.size() == 1);
  CHECK(r->out.notes[0].find("two backward passes (B and W) per forward pass") != std::string::npos);
  through(*r, facet::schedule);
  CHECK(r->out.parallel.schedule.value == synth::policy_of<pipeline::zero_bubble_h1>());
}
#endif

TEST_CASE("structure layers: module scopes, else a repeating block with attention, backward in reverse", "[whatif][structure]") {
  for (const char* dir : {"pp2_1f1b", "pp4_1f1b"}) {
    INFO(dir);
    auto r = start(pipeline_dir(dir));
    through(*r, facet::layers);
    const bool annotated = std::string(dir) == "pp2_1f1b";  // make_pipeline_traces.py: annotate
    CHECK(r->out.layers_method.value == std::string(annotated ? "module annotations" : "kernel periodicity"));
    for (std::size_t ri = 0; ri < r->out.ranks.size(); ++ri) {
      const auto& rs = r->out.ranks[ri];
      const auto& w = r->in->ranks[ri];
      CHECK(rs.layers_per_pass.value == 2);
      for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
        CHECK(rs.passes[pi].layers.value == 2);
        // Layer numbers in launch order: 0 then 1 forward, 1 then 0 backward.
        std::vector<int> seen;
        for (const std::size_t li : w.pass_launches[pi]) {
          const int l = w.launches[li].layer;
          if (l >= 0 && (seen.empty() || seen.back() != l)) seen.push_back(l);
        }
        const bool forward = rs.passes[pi].op.kind == pipeline::op_kind::forward;
        CHECK(seen == (forward ? std::vector<int>{0, 1} : std::vector<int>{1, 0}));
      }
    }
  }
}

TEST_CASE("structure stages: chains and rings of point-to-point partners walked from stage 0", "[whatif][structure]") {
  for (const char* dir : {"pp4_1f1b", "pp4_interleaved"}) {
    INFO(dir);
    auto r = start(pipeline_dir(dir));
    through(*r, facet::stages);
    const auto& topo = r->in->topology;
    const bool ring = std::string(dir) == "pp4_interleaved";  // chunks wrap from the last stage to the first
    CHECK(topo.ring == ring);
    CHECK(topo.chain == !ring);
    CHECK(topo.pipelines == std::vector<std::vector<int>>{{0, 1, 2, 3}});  // the generator puts stage s on rank s
    CHECK(topo.unmatched_p2p.empty());
    for (const auto& rs : r->out.ranks) {
      CHECK(rs.stage.value == rs.rank);
      CHECK(rs.stage.flag == "--pp");
      CHECK(rs.p2p_partners.size() == (ring || (rs.rank > 0 && rs.rank < 3) ? 2u : 1u));
    }
  }
  // No transfer: stage 0, and no pipeline.
  auto r = start(one_rank({{{"## forward ##"}, "k", ""}}));
  through(*r, facet::stages);
  CHECK(r->out.ranks[0].stage.value == 0);
  CHECK(r->out.ranks[0].stage.source == "no point-to-point transfers on this rank");
  CHECK(r->in->topology.pipelines.empty());
}

TEST_CASE("structure layout: world from the traces, PP from the pipelines walked", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp4_gpipe"));
  through(*r, facet::layout);
  CHECK(r->out.parallel.world.value == 4);
  CHECK(r->out.parallel.pp.value == 4);
  CHECK(r->out.parallel.pp.source.find("1 chain(s)") != std::string::npos);
  CHECK_FALSE(r->out.parallel.tp.known());  // the groups give TP, later
  auto one = start(one_rank({{{"## forward ##"}, "k", ""}}, 1));
  through(*one, facet::layout);
  CHECK(one->out.parallel.world.value == 1);
  CHECK(one->out.parallel.pp.value == 1);
  CHECK(one->out.parallel.pp.source == "no point-to-point transfers between ranks");
}

TEST_CASE("structure schedule: every shipped schedule is recognised from its own stage orders", "[whatif][structure]") {
  for (const pipeline::schedule_kind k : pipeline::all_schedule_kinds) {
    const synth::schedule_policy kind = synth::policy_of(k);
    INFO(kind.name);
    const bool chunked = kind.supports_chunks;
    const pipeline::schedule_shape shape{4, chunked ? 4 : 8, chunked ? 2 : 1};
    const auto orders = kind.orders(shape);
    whatif::detail::schedule_search s;
    s.stage_ranks = {{0, 1, 2, 3}};
    for (const auto& o : orders) s.letters.push_back(letters(o));
    s.stages = shape.stages;
    s.forwards = shape.micro_batches * shape.chunks;
    s.split_backward = kind.splits_backward;
    s.ring = chunked, s.chain = !chunked;
    const auto found = whatif::detail::matching_schedules(s);
    REQUIRE(found.size() == 1);
    CHECK(found[0].schedule == kind);
    CHECK(found[0].shape == shape);
    REQUIRE(found[0].orders.size() == 1);
    CHECK(found[0].orders[0] == orders);
    // A ring of four stages is no unchunked schedule's, a chain of four no chunked one's.
    s.ring = !chunked, s.chain = chunked;
    for (const auto& c : whatif::detail::matching_schedules(s)) CHECK(c.schedule != kind);
  }
  // The message when none matches names the shipped schedules of the same backward split.
  synth::for_each_schedule([](auto t) {
    using S = typename decltype(t)::type;
    CHECK(whatif::detail::schedule_titles(S::splits_backward).find(S::title) != std::string::npos);
    CHECK(whatif::detail::schedule_titles(!S::splits_backward).find(S::title) == std::string::npos);
  });
}

TEST_CASE("structure schedule: two stages, told chain or ring by what stage 0 receives before a forward pass", "[whatif][structure]") {
  const pipeline::schedule_shape shape{2, 4, 1};
  whatif::detail::schedule_search s;
  s.stage_ranks = {{0, 1}};
  for (const auto& o : pipeline::all_stage_ops<pipeline::one_f_one_b>(shape)) s.letters.push_back(letters(o));
  s.stages = 2, s.forwards = 4, s.chain = true;
  const auto found = whatif::detail::matching_schedules(s);
  REQUIRE_FALSE(found.empty());
  CHECK(found[0].schedule == synth::policy_of<pipeline::one_f_one_b>());
  s.receives_activations = true;  // only a ring sends activations back to stage 0
  for (const auto& c : whatif::detail::matching_schedules(s)) CHECK(c.schedule == synth::policy_of<pipeline::interleaved_one_f_one_b>());
}

TEST_CASE("structure schedule: the traced order, its micro-batches and chunks, each pass's op", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp2_interleaved"));
  through(*r, facet::schedule);
  const auto& par = r->out.parallel;
  CHECK(par.schedule.value == synth::policy_of<pipeline::interleaved_one_f_one_b>());
  CHECK(par.chunks.value == 2);
  CHECK(par.micro_batches.value == 4);
  for (const auto& rs : r->out.ranks) {
    const auto want = pipeline::all_stage_ops<pipeline::interleaved_one_f_one_b>({2, 4, 2})[static_cast<std::size_t>(rs.rank)];
    REQUIRE(rs.passes.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) CHECK(rs.passes[k].op == want[k]);
  }
  // One forward and one backward pass on one stage: GPipe's order and 1F1B's, reported as both.
  auto one = start(one_rank({{{"## forward ##"}, "k1", ""}, {{"## backward ##"}, "k2", ""}}));
  through(*one, facet::schedule);
  const auto& p1 = one->out.parallel;
  CHECK_FALSE(p1.schedule.known());
  CHECK(p1.schedule.source == "stage 0 ran FB: ambiguous, the same order as gpipe (v 1), 1f1b (v 1)");
  CHECK(p1.chunks.value == 1);
  CHECK(p1.micro_batches.value == 1);
  CHECK(one->out.notes.empty());  // one stage, one micro-batch: every schedule is that order
  // --schedule narrows the candidates.
  whatif::structure_options o;
  o.schedule = synth::policy_of<pipeline::one_f_one_b>();
  auto narrowed = start(one_rank({{{"## forward ##"}, "k1", ""}, {{"## backward ##"}, "k2", ""}}), o);
  through(*narrowed, facet::schedule);
  CHECK(narrowed->out.parallel.schedule.value == synth::policy_of<pipeline::one_f_one_b>());
  CHECK(narrowed->out.parallel.schedule.source.find("(among candidates kept by --schedule/--vp)") != std::string::npos);
}

TEST_CASE("structure groups: collectives grouped by process group, with roles from where they run", "[whatif][structure]") {
  // The pipelines walked are PP groups, in stage order.
  auto r = start(pipeline_dir("pp4_1f1b"));
  through(*r, facet::groups);
  REQUIRE(r->out.groups.size() == 1);
  CHECK(r->out.groups[0].name == "p2p pipeline 0");
  CHECK(r->out.groups[0].ranks == std::vector<int>{0, 1, 2, 3});
  REQUIRE(r->out.groups[0].roles.size() == 1);
  CHECK(r->out.groups[0].roles[0].value == whatif::group_role::pp);
  CHECK(r->in->gradient_ops.empty());

  // Gradient-sized all-reduces in backward over a group with no description: DP; a few scalars
  // after the backward are no gradient reduction; an all-reduce inside forward is TP's.
  const std::string grads = R"("Collective name": "allreduce", "Process Group Name": "3", "Process Group Description": "undefined", )"
                            R"("Group size": 4, "In msg nelems": 1048576)";
  const std::string norm = R"("Collective name": "allreduce", "Process Group Name": "5", "Group size": 4, "In msg nelems": 1)";
  const std::string act = R"("Collective name": "allreduce", "Process Group Name": "7", "Group size": 2, "In msg nelems": 4096)";
  const std::string nccl = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL";
  auto c = start(one_rank({{{"## forward ##"}, "k1", ""},
                           {{"## forward ##"}, nccl, act},
                           {{"## backward ##"}, nccl, grads},
                           {{"## backward ##"}, nccl, grads},
                           {{"Optimizer.step#Adam.step"}, nccl, norm}},
                          8));
  through(*c, facet::gradients);
  const whatif::process_group* dp = nullptr;
  std::set<std::string> names;
  for (const auto& g : c->out.groups) names.insert(g.name);
  CHECK(names == std::set<std::string>{"3", "5", "7"});
  for (const auto& g : c->out.groups) {
    INFO(g.name);
    std::set<whatif::group_role> roles;
    for (const auto& role : g.roles) roles.insert(*role.value);
    if (g.name == "3") dp = &g;
    CHECK(roles == (g.name == "3"   ? std::set<whatif::group_role>{whatif::group_role::dp}
                    : g.name == "7" ? std::set<whatif::group_role>{whatif::group_role::tp}
                                    : std::set<whatif::group_role>{}));
  }
  REQUIRE(dp != nullptr);
  CHECK(dp->size.value == 4);
  CHECK(dp->size.source == "Group size arg");
  REQUIRE(c->in->gradient_ops.size() == 1);
  CHECK(c->in->gradient_ops.begin()->second.size() == 2);  // the norm's all-reduce is not DP's
  // The degrees facet reads the group sizes; the gradients facet the reductions kept.
  CHECK(c->out.parallel.dp.value == 4);
  CHECK(c->out.parallel.tp.value == 2);
  CHECK(c->out.gradients.method.value == std::string("all-reduce"));
  CHECK(c->out.gradients.buckets.value == 2);
  CHECK(c->out.gradients.bucket_elements.value == std::vector<std::int64_t>{1048576, 1048576});
}

TEST_CASE("structure groups: a recorded description names the role, else where its collectives run", "[whatif][structure]") {
  // A gradient-sized all-reduce in backward, over a group of 8 ranks of 8.
  auto roles_of = [](const std::string& description) {
    whatif::detail::group_acc acc;
    acc.g.description = description;
    acc.g.size.value = 8;
    acc.counts["allreduce in backward"][0] = 3;
    acc.kinds_phase.insert("allreduce in backward");
    acc.grad_elements = 1 << 20;
    whatif::detail::settle_group("name 2", acc, 8);
    REQUIRE(acc.g.collectives.size() == 1);
    CHECK(acc.g.collectives[0] == std::pair<std::string, std::size_t>{"allreduce in backward", 3});
    std::vector<whatif::group_role> roles;
    for (const auto& r : acc.g.roles) roles.push_back(*r.value);
    return roles;
  };
  using whatif::group_role;
  CHECK(roles_of("TENSOR_MODEL_PARALLEL_GROUP") == std::vector<group_role>{group_role::tp, group_role::world});
  CHECK(roles_of("MODEL_PARALLEL_GROUP") == std::vector<group_role>{group_role::world});  // a gradient norm's, not DP's
  CHECK(roles_of("undefined") == std::vector<group_role>{group_role::dp, group_role::world});
}

TEST_CASE("structure degrees and gradients: from the groups' roles and the reductions kept", "[whatif][structure]") {
  const trace::job none;
  const graph::built_job built;
  auto in = whatif::make_discovery_inputs(none, built);
  whatif::job_structure out;
  out.parallel.world.value = 8;
  out.parallel.pp.value = 2;
  whatif::process_group tp;
  tp.name = "tp";
  tp.size.value = 2;
  tp.roles.push_back({whatif::group_role::tp, "why", ""});
  out.groups.push_back(tp);
  whatif::discover_parallel_degrees(in, out);
  CHECK(out.parallel.tp.value == 2);
  CHECK(out.parallel.tp.source == "size of group 'tp': why");
  CHECK(out.parallel.dp.value == 2);  // world 8 / (TP 2 × PP 2)
  CHECK(out.parallel.ep.value == 1);
  in.gradient_ops[0] = {{"reducescatter", 100, "g"}, {"allgather", 100, "g"}, {"reducescatter", 0, "g"}};
  whatif::discover_gradients(in, out);
  CHECK(out.gradients.method.value == std::string("reduce-scatter + all-gather"));
  CHECK(out.gradients.buckets.value == 2);
  CHECK_FALSE(out.gradients.bucket_elements.known());  // one size not recorded
}

TEST_CASE("structure model shape: layers summed over the stages, widths from the middle layer's GEMMs", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp4_interleaved"));
  through(*r, facet::shape);
  const auto& md = r->out.model;
  // make_pipeline_traces.py: 4 stages × 2 chunks × 2 layers, hidden 1024, FFN 4096, 16 heads
  // of 64, sequence 512, micro-batch 2, bf16.
  CHECK(md.layers.value == 16);
  CHECK(md.hidden.value == 1024);
  CHECK(md.ffn.value == 4096);
  CHECK(md.heads.value == 16);
  CHECK(md.kv_heads.value == 16);
  CHECK(md.head_dim.value == 64);
  CHECK(md.seq.value == 512);
  CHECK(md.micro_batch_size.value == 2);
  CHECK(md.dtype.value == std::string("bf16"));
  CHECK_FALSE(md.gated_mlp);
  // No layer: every width says why.
  auto one = start(one_rank({{{"## forward ##"}, "k1", ""}}));
  through(*one, facet::shape);
  CHECK_FALSE(one->out.model.hidden.known());
  CHECK(one->out.model.hidden.source == "no transformer layer found to read shapes from");
  CHECK(one->out.model.layers.source == one->out.ranks[0].layers_per_pass.source);
}

TEST_CASE("structure tasks: the graph tasks of each layer of each pass, and every GPU op's context", "[whatif][structure]") {
  auto r = start(pipeline_dir("pp2_1f1b"));
  through(*r, facet::tasks);
  // 2 stages × (F and B of 4 micro-batches) × 2 layers.
  CHECK(r->out.layer_groups.size() == 2 * 2 * 4 * 2);
  std::set<graph::task_id> seen;
  for (const auto& lg : r->out.layer_groups) {
    CHECK(std::is_sorted(lg.tasks.begin(), lg.tasks.end()));
    for (const auto t : lg.tasks) {
      CHECK(r->built.graph.rank[t] == lg.rank);
      CHECK(seen.insert(t).second);
    }
  }
  std::size_t launches = 0;
  for (const auto& w : r->in->ranks) launches += w.launches.size();
  REQUIRE(r->out.gpu_ops.size() == launches);
  CHECK(r->out.gpu_ops.front().rank == 0);
  CHECK(r->out.gpu_ops.back().rank == 1);
}

TEST_CASE("structure overrides: the user's facts win, with a note where the trace said otherwise", "[whatif][structure]") {
  whatif::job_structure out;
  out.model.layers.value = 4;
  out.model.layers.source = "trace";
  out.parallel.chunks.value = 2;
  out.parallel.schedule.source = "no forward pass in the iteration";
  whatif::structure_options o;
  o.layers = 12;
  o.chunks = 4;  // the trace determined the chunks: kept
  o.schedule = synth::policy_of<pipeline::gpipe>();
  o.tp = 2;
  whatif::apply_overrides(o, out);
  CHECK(out.model.layers.value == 12);
  CHECK(out.model.layers.source == "given (--layers)");
  CHECK(out.parallel.chunks.value == 2);
  CHECK(out.parallel.tp.value == 2);
  CHECK(out.parallel.schedule.value == synth::policy_of<pipeline::gpipe>());
  CHECK(out.parallel.schedule.source == "given (--schedule); the trace did not determine it: no forward pass in the iteration");
  REQUIRE(out.notes.size() == 2);
  CHECK(out.notes[0] == "--layers 12 overrides the trace's 4 (trace)");
  CHECK(out.notes[1].starts_with("--layers given but no layer boundaries"));
}

TEST_CASE("structure driver: the facets run in order give what discover_structure gives", "[whatif][structure]") {
  for (const char* dir : {"pp2_1f1b", "pp4_gpipe", "pp4_interleaved"}) {
    INFO(dir);
    auto r = start(pipeline_dir(dir));
    through(*r, facet::tasks);
    whatif::apply_overrides(r->in->options, r->out);
    const auto whole = whatif::discover_structure(r->job, r->built);
    CHECK(whole.notes == r->out.notes);
    CHECK(whole.layer_groups.size() == r->out.layer_groups.size());
    CHECK(whole.gpu_ops.size() == r->out.gpu_ops.size());
    CHECK(whole.parallel.schedule.source == r->out.parallel.schedule.source);
    CHECK(whole.model.layers.source == r->out.model.layers.source);
    REQUIRE(whole.ranks.size() == r->out.ranks.size());
    for (std::size_t ri = 0; ri < whole.ranks.size(); ++ri) {
      REQUIRE(whole.ranks[ri].passes.size() == r->out.ranks[ri].passes.size());
      for (std::size_t k = 0; k < whole.ranks[ri].passes.size(); ++k) CHECK(whole.ranks[ri].passes[k].op == r->out.ranks[ri].passes[k].op);
    }
  }
}

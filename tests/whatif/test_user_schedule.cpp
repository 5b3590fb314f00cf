// A pipeline schedule defined here, outside the library, with no `schedule_kind` and no entry in
// the library's list of shipped schedules: it models `pipeline::PipelineSchedule`, builds on the
// public 1F1B skeleton, and `synth::policy_of<S>()` carries it through `synth::predict`,
// `sweep::evaluate` and the what-if API (in the graph on a synthesised job, and by the
// pass-level model on traces with stages) as a shipped schedule is.
#include "../synth/kernel_job_support.hpp"
#include "../model/config_support.hpp"
#include "../unit/test_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/sweep/evaluate.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/schedule_graph.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/stage_plan.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace user_schedule_test {

using namespace lumos;

// 1F1B that warms up one forward more: stage r runs min(m, p − r) warm-up forwards (1F1B:
// min(m, p − r − 1)), then a forward and a backward in turn. The warm-up does not grow from a
// stage to the next, so each stage's backward waits only for forwards its successor already ran:
// deadlock-free.
struct eager_1f1b final {
  static constexpr std::string_view name = "eager-1f1b";
  static constexpr std::string_view title = "eager 1F1B";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;

  static constexpr void validate(const pipeline::schedule_shape& shape) { pipeline::validate_shape(title, shape, supports_chunks); }

  [[nodiscard]] static constexpr std::int32_t warmup(const pipeline::schedule_shape& shape, std::int32_t stage) noexcept {
    return std::min(shape.micro_batches, shape.stages - stage);
  }

  [[nodiscard]] static constexpr std::vector<pipeline::op> stage_ops(const pipeline::schedule_shape& shape, std::int32_t stage) {
    validate(shape);
    pipeline::validate_stage(title, shape, stage);
    return pipeline::one_f_one_b_skeleton(
        shape.micro_batches, warmup(shape, stage), [](std::int32_t k) { return pipeline::forward_op(k); },
        [](std::int32_t k) { return pipeline::backward_op(k); });
  }
};
static_assert(pipeline::PipelineSchedule<eager_1f1b>);
template <class S>
concept has_kind = requires { S::kind; };
static_assert(!has_kind<eager_1f1b> && has_kind<pipeline::one_f_one_b>);  // nothing asks a schedule for a shipped kind

constexpr synth::schedule_policy eager = synth::policy_of<eager_1f1b>();
static_assert(eager.name == "eager-1f1b" && eager.title == "eager 1F1B" && !eager.splits_backward);

// Layer work only (no embedding, head or optimizer): one forward, one input-gradient and one
// weight-gradient op per layer. With free communication and no launch cost the pipeline phase is
// the schedule's timeline.
struct fixed_layers {
  time_ns f = 1000, b = 2000, w = 700;
  [[nodiscard]] static model::op_cost op(std::string_view name, model::op_phase phase, time_ns d) {
    model::op_cost o;
    o.name = name;
    o.kind = model::op_class::gemm;
    o.phase = phase;
    o.duration = d;
    return o;
  }
  [[nodiscard]] model::op_list layer(const model::transformer&, const model::parallel_config&, const model::hardware&) const {
    model::op_list l;
    l.ops = {op("f", model::op_phase::forward, f), op("b", model::op_phase::backward_input, b), op("w", model::op_phase::backward_weight, w)};
    return l;
  }
  [[nodiscard]] model::op_list embedding(const model::transformer&, const model::parallel_config&, const model::hardware&) const { return {}; }
  [[nodiscard]] model::op_list head(const model::transformer&, const model::parallel_config&, const model::hardware&) const { return {}; }
  [[nodiscard]] model::op_list optimizer(const model::transformer&, const model::parallel_config&, const model::hardware&, int) const {
    return {};
  }
};
static_assert(model::ComputeModel<fixed_layers>);

struct free_comm {
  [[nodiscard]] time_ns collective_time(const model::collective_op&, const model::hardware&) const { return 0; }
  [[nodiscard]] time_ns p2p_time(const model::p2p_op&, const model::hardware&) const { return 0; }
};
static_assert(model::CommModel<free_comm>);

// The schedule's timeline with the per-stage costs of `layers` layers of `c`.
time_ns schedule_makespan(const synth::schedule_policy& s, const pipeline::schedule_shape& shape, std::int64_t layers, const fixed_layers& c) {
  const pipeline::op_costs<time_ns> stage{layers * c.f, layers * (c.b + c.w), 0};
  return synth::simulate_schedule(s, shape, stage).makespan;
}

// What `lumos synth --detail kernel --unfold` writes into `dir` for an 8-layer job without
// stages: TP 2, `micro_batches` micro-batches of one sequence.
void synthesise(const std::filesystem::path& dir, int micro_batches) {
  synth::job j;
  j.model = lumos::model::test::small_gpt();
  j.hardware = model::hardware_preset("h100-sxm");
  j.parallel.tp = 2;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = micro_batches;
  j.parallel.zero_stage = 1;
  synth::program_options opt;
  opt.unfold = true;
  (void)lumos_test::write_kernel_job(j, opt, model::profile_preset(j.hardware.name), dir);
}

// The units (pass codes) a stage runs on a compute stream, repeats of one unit merged, outside
// the work before the first pass and after the last.
std::vector<std::int32_t> units_on(const whatif::stage_plan& p, int s, graph::processor_id q) {
  std::vector<std::int32_t> units;
  for (const whatif::stage_run& r : p.runs[static_cast<std::size_t>(s) * p.processors + q]) {
    for (std::uint32_t z = r.begin; z < r.end; ++z) {
      if (!p.kept[static_cast<std::size_t>(s)][p.on[q][z]] || r.unit == whatif::detail::label_pre || r.unit == whatif::detail::label_post) continue;
      if (units.empty() || units.back() != r.unit) units.push_back(r.unit);
    }
  }
  return units;
}

}  // namespace user_schedule_test

using namespace user_schedule_test;

TEST_CASE("a user schedule: complete, deadlock-free orders that differ from 1F1B's", "[schedule][user]") {
  for (std::int32_t p = 1; p <= 6; ++p) {
    for (std::int32_t m = 1; m <= 12; ++m) {
      const pipeline::schedule_shape shape{p, m, 1};
      INFO("p=" << p << " m=" << m);
      const auto orders = eager.orders(shape);
      REQUIRE(orders.size() == static_cast<std::size_t>(p));
      for (std::int32_t s = 0; s < p; ++s) {
        const auto& order = orders[static_cast<std::size_t>(s)];
        CHECK_NOTHROW(pipeline::check_stage_order(shape, s, order, false));
        // The forwards before the first backward: its warm-up and the first steady forward, one
        // more than 1F1B's while m allows.
        const auto first_backward = std::find_if(order.begin(), order.end(), [](const pipeline::op& o) { return o.kind == pipeline::op_kind::backward; });
        CHECK(first_backward - order.begin() == std::min(m, p - s + 1));
      }
      // The reference evaluator runs every op (it throws on a deadlock).
      CHECK(pipeline::evaluate_orders(shape, orders, pipeline::op_costs<std::int64_t>{1, 2, 0}, false).makespan > 0);
    }
  }
  CHECK(eager.orders({4, 8, 1}) != pipeline::all_stage_ops<pipeline::one_f_one_b>({4, 8, 1}));
  CHECK_THROWS_WITH(eager.validate({2, 4, 2}), "eager 1F1B has no model chunks: v must be 1 (got v = 2); interleaved 1F1B runs v > 1");
  // The shipped registry does not know it: a user schedule is passed as its policy, not by name.
  CHECK_THROWS_WITH(synth::parse_schedule("eager-1f1b"), Catch::Contains("unknown pipeline schedule 'eager-1f1b'"));
}

TEST_CASE("a user schedule in synth::predict: the program runs its orders, the iteration follows them", "[schedule][user][predict]") {
  synth::job j;
  j.model = lumos::model::test::small_gpt();
  j.hardware = model::h100_sxm();
  j.parallel.pp = 4;
  j.parallel.dp = 2;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = 16;
  j.schedule = eager;
  const synth::program prog = synth::build_program(j);
  CHECK(prog.schedule == eager);
  CHECK(prog.orders == pipeline::all_stage_ops<eager_1f1b>(prog.shape));

  const fixed_layers layers;
  synth::predict_options o;
  o.program.launch_cost = 0;
  const synth::prediction p = synth::predict(j, o, layers, free_comm{});
  CHECK(p.schedule.name == "eager-1f1b");
  REQUIRE(p.shape == pipeline::schedule_shape{4, 8, 1});
  // With free communication the pipeline phase is exactly the schedule's timeline.
  CHECK(p.pipeline_ns == schedule_makespan(eager, p.shape, 2, layers));
  // Stage 0 holds its p warm-up forwards and the next at its peak: one micro-batch more than 1F1B.
  CHECK(p.stages[0].in_flight_microbatches == 5);
  j.schedule = synth::policy_of<pipeline::one_f_one_b>();
  const synth::prediction q = synth::predict(j, o, layers, free_comm{});
  CHECK(q.stages[0].in_flight_microbatches == 4);
  CHECK(p.stages[0].memory.activations > q.stages[0].memory.activations);
}

TEST_CASE("a user schedule in sweep::evaluate: a configuration of the space like any other", "[schedule][user][sweep]") {
  sweep::problem problem;
  problem.model = lumos::model::test::small_gpt();
  problem.global_batch = 16;
  problem.gpus = 8;
  problem.options.program.launch_cost = 0;
  const fixed_layers layers;
  const sweep::evaluator<fixed_layers, free_comm> ev(problem, layers);
  sweep::space s;
  s.pp = {2, 4};
  s.schedules = {synth::policy_of<pipeline::one_f_one_b>(), eager};
  std::size_t evaluated = 0;
  for (const sweep::configuration& c : sweep::enumerate(s, 8)) {
    if (c.schedule != eager) continue;
    const sweep::result r = ev.evaluate(c);
    INFO("pp " << c.pp << ": " << r.why());
    REQUIRE(r.ok());
    ++evaluated;
    const synth::job j = ev.job_of(c);
    CHECK(j.schedule == eager);
    CHECK(r.m.pipeline_ns == schedule_makespan(eager, {c.pp, static_cast<std::int32_t>(r.micro_batches), 1}, 8 / c.pp, layers));
    CHECK(r.m.iteration_ns == synth::predict(j, ev.fixed().options, layers, free_comm{}).iteration_ns);
  }
  CHECK(evaluated == 2);
  // Model chunks are refused by its own flag.
  sweep::configuration c;
  c.pp = 2, c.dp = 4, c.vp = 2, c.schedule = eager;
  CHECK(ev.validate(c).reason == sweep::rejection::schedule);
}

TEST_CASE("a user schedule in the what-if: the stage split runs its order", "[schedule][user][whatif]") {
  lumos_test::temp_dir dir;
  synthesise(dir.path(), 4);
  const trace::job job = trace::load_job({dir.path()});
  graph::built_job built = graph::build_graph(job);
  const whatif::job_structure st = whatif::discover_structure(job, built);
  const int m = *st.parallel.micro_batches.value;
  REQUIRE(m == 4);

  // The plan: each stage's passes on every traced rank's compute stream in the schedule's order.
  const whatif::stage_plan plan = whatif::plan_stages(built, job, st, {.pp = 2, .vp = 1, .schedule = eager});
  const pipeline::schedule_shape shape{2, m, 1};
  REQUIRE(plan.orders == pipeline::all_stage_ops<eager_1f1b>(shape));
  REQUIRE(plan.orders != pipeline::all_stage_ops<pipeline::one_f_one_b>(shape));
  std::size_t checked = 0;
  for (int s = 0; s < 2; ++s) {
    std::vector<std::int32_t> want;
    for (const pipeline::op& o : plan.orders[static_cast<std::size_t>(s)]) want.push_back(plan.geometry.unit_of_op(o));
    for (std::size_t i = 0; i < job.ranks.size(); ++i) {
      CHECK(units_on(plan, s, plan.main_stream[i]) == want);
      ++checked;
    }
  }
  CHECK(checked == 2 * job.ranks.size());

  // The whole what-if: made in the graph, reported under the schedule's own names.
  whatif::whatif_options o;
  o.pp = 2;
  o.schedule = eager;
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  REQUIRE(r.stages);
  CHECK(r.pipeline_reason.empty());
  CHECK(r.stages->schedule == eager);
  CHECK(r.stages->stages == 2);
  CHECK(r.stages->change.find("in eager 1F1B order") != std::string::npos);
  CHECK(r.predicted.simulated_ns > 0);
  o.schedule = synth::policy_of<pipeline::one_f_one_b>();
  const whatif::whatif_result standard = whatif::run_whatif(job, o);
  REQUIRE(standard.stages);
  CHECK(standard.stages->tasks_after == r.stages->tasks_after);  // the same passes, in another order
}

TEST_CASE("a user schedule in the pass-level pipeline model", "[schedule][user][whatif]") {
  // The hand-made 1F1B traces with four stages: a schedule change is modelled pass by pass.
  whatif::whatif_options o;
  o.schedule = eager;
  const whatif::whatif_result r = whatif::run_whatif(trace::load_job({lumos_test::data_dir() / "whatif" / "pp4_1f1b"}), o);
  REQUIRE(r.pipeline);
  CHECK(r.pipeline->predicted.schedule == eager);
  CHECK(r.pipeline->baseline.schedule.name == "1f1b");
  CHECK(r.pipeline->predicted.shape == pipeline::schedule_shape{4, 8, 1});
  REQUIRE_FALSE(r.pipeline->changes.empty());
  CHECK(r.pipeline->changes.front().find("1f1b -> eager-1f1b") != std::string::npos);
  // The prediction is the model of its orders, with the traces' measured costs.
  const whatif::pipeline_simulation again = whatif::simulate_passes(r.pipeline->costs, eager, {4, 8, 1}, r.pipeline->predicted.layers_per_chunk);
  CHECK(again.makespan == r.pipeline->predicted.makespan);
  CHECK(again.bubble_fraction == r.pipeline->predicted.bubble_fraction);
}

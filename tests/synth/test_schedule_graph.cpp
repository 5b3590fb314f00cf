// Pipeline schedules as execution graphs: the replay engine against the reference timeline
// evaluator (every op's interval, a grid of shapes and costs) and the closed forms.

#include <lumos/pipeline/timeline.hpp>
#include <lumos/synth/schedule_graph.hpp>
#include <lumos/synth/schedules.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lp = lumos::pipeline;
namespace ls = lumos::synth;
using lp::schedule_shape;
using costs = lp::op_costs<std::int64_t>;

namespace {

constexpr std::array<costs, 7> graph_cost_grid = {{{1, 1, 1}, {1, 2, 0}, {2, 3, 1}, {3, 2, 1}, {5, 7, 2}, {4, 4, 4}, {1000, 2000, 500}}};

// Scales the costs so that every one divides by v (interleaved splits each stage's costs in v).
costs for_chunks(costs c, std::int32_t v) { return {c.forward * v, c.backward * v, c.weight * v}; }

// Replays schedule S on `shape` and checks every op against the reference evaluator.
template <class S>
void check_against_timeline(const schedule_shape& shape, const costs& c) {
  const auto reference = lp::evaluate_timeline<S>(shape, c);
  const auto sim = ls::simulate(ls::build_schedule_graph<S>(shape, c));
  INFO(S::title << " p=" << shape.stages << " m=" << shape.micro_batches << " v=" << shape.chunks
                << " F=" << c.forward << " B=" << c.backward << " W=" << c.weight);
  REQUIRE(sim.makespan == reference.makespan);
  REQUIRE(sim.stage_work == reference.stage_work);
  REQUIRE(sim.bubble_fraction == Approx(reference.bubble_fraction).margin(1e-12));
  for (std::size_t s = 0; s < sim.orders.size(); ++s) {
    REQUIRE(sim.orders[s].size() == reference.stages[s].size());
    for (std::size_t i = 0; i < sim.orders[s].size(); ++i) {
      REQUIRE(sim.orders[s][i] == reference.stages[s][i].what);
      REQUIRE(sim.start[s][i] == reference.stages[s][i].start);
      REQUIRE(sim.end[s][i] == reference.stages[s][i].end);
    }
  }
}

}  // namespace

TEST_CASE("replay-engine schedules equal the reference timeline, op by op", "[synth][schedule]") {
  for (std::int32_t p = 1; p <= 5; ++p) {
    for (std::int32_t m = 1; m <= 10; ++m) {
      for (const costs& c : graph_cost_grid) {
        check_against_timeline<lp::gpipe>({p, m, 1}, c);
        check_against_timeline<lp::one_f_one_b>({p, m, 1}, c);
        check_against_timeline<lp::zero_bubble_h1>({p, m, 1}, c);
        check_against_timeline<lp::zero_bubble_h2>({p, m, 1}, c);
        if (m % p == 0) {
          for (std::int32_t v = 2; v <= 4; ++v) check_against_timeline<lp::interleaved_one_f_one_b>({p, m, v}, for_chunks(c, v));
        }
      }
    }
  }
}

TEST_CASE("closed forms through the replay engine", "[synth][schedule]") {
  for (std::int32_t p = 1; p <= 6; ++p) {
    for (std::int32_t m = 1; m <= 16; ++m) {
      for (const costs& c : graph_cost_grid) {
        const std::int64_t F = c.forward, B = c.backward, W = c.weight;
        // GPipe and 1F1B: (m + p − 1)(F + B), W folded into B.
        for (const auto& schedule : {ls::policy_of<lp::gpipe>(), ls::policy_of<lp::one_f_one_b>()}) {
          const auto sim = ls::simulate_schedule(schedule, {p, m, 1}, c);
          CHECK(sim.makespan == (m + p - 1) * (F + B + W));
        }
        // Interleaved: m(F + B) + (p − 1)(F + B)/v.
        if (m % p == 0) {
          for (std::int32_t v = 2; v <= 4; ++v) {
            const costs cv = for_chunks(c, v);
            const auto sim = ls::simulate_schedule(ls::policy_of<lp::interleaved_one_f_one_b>(), {p, m, v}, cv);
            const std::int64_t FB = cv.forward + cv.backward + cv.weight;
            CHECK(sim.makespan == m * FB + (p - 1) * FB / v);
          }
        }
        // ZB-H1: m(F + B + W) + (p − 1)(F + B − W) when W ≤ min(F, B) and (m ≥ p or W = 0).
        if (W <= std::min(F, B) && (m >= p || W == 0)) {
          const auto sim = ls::simulate_schedule(ls::policy_of<lp::zero_bubble_h1>(), {p, m, 1}, c);
          CHECK(sim.makespan == m * (F + B + W) + (p - 1) * (F + B - W));
        }
      }
      // ZB-H2 with F = B = W = 1 and m ≥ 2p − 1 ends at 3m + p − 1.
      if (m >= 2 * p - 1) {
        const auto sim = ls::simulate_schedule(ls::policy_of<lp::zero_bubble_h2>(), {p, m, 1}, costs{1, 1, 1});
        CHECK(sim.makespan == 3 * m + p - 1);
        CHECK(sim.bubble_fraction == Approx(static_cast<double>(p - 1) / static_cast<double>(3 * m + p - 1)));
      }
    }
  }
}

TEST_CASE("decimal costs keep the 1/v split exact", "[synth][schedule]") {
  // p = 4, m = 8, v = 2, F = 1, B = 2: 8·3 + 3·3/2 = 28.5.
  const auto sim = ls::simulate_schedule(ls::policy_of<lp::interleaved_one_f_one_b>(), {4, 8, 2}, lp::op_costs<double>{1, 2, 0});
  CHECK(sim.makespan == 28.5);
  CHECK(sim.stage_work == 24.0);
  CHECK(sim.bubble_fraction == Approx(4.5 / 28.5));
  const auto z = ls::simulate_schedule(ls::policy_of<lp::zero_bubble_h1>(), {4, 8, 1}, lp::op_costs<double>{0.5, 0.5, 0.25});
  CHECK(z.makespan == Approx(8 * 1.25 + 3 * 0.75));
  CHECK_THROWS_AS(ls::simulate_schedule(ls::policy_of<lp::gpipe>(), {2, 2, 1}, lp::op_costs<double>{1e300, 1, 0}), lumos::error);
}

TEST_CASE("the schedule graph: one stream per stage, tasks in schedule order, dependency edges", "[synth][schedule]") {
  const auto sg = ls::build_schedule_graph<lp::one_f_one_b>({3, 4, 1}, costs{1, 2, 0});
  REQUIRE(sg.graph.processors.size() == 3);
  REQUIRE(sg.graph.task_count() == 3 * 8);
  CHECK(sg.graph.task_name(sg.tasks[0][0]) == "F0");
  CHECK(sg.graph.task_name(sg.tasks[0][3]) == "B0");
  // Every op but F on stage 0 has exactly one dependency edge.
  CHECK(sg.graph.edge_count() == 3 * 8 - 4);
  for (const auto& e : sg.graph.edges) CHECK(e.kind == lumos::graph::edge_kind::dependency);
}

TEST_CASE("the registry of shipped schedules: dispatch, names, descriptors", "[synth][schedule]") {
  std::vector<std::string_view> names;
  ls::for_each_schedule([&](auto t) { names.push_back(decltype(t)::type::name); });
  CHECK(names == std::vector<std::string_view>{"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"});
  for (const auto kind : lp::all_schedule_kinds) {
    const auto got = ls::visit_schedule(kind, [](auto t) { return decltype(t)::type::kind; });
    CHECK(got == kind);
    // Every shipped name parses back to the same descriptor.
    const ls::schedule_policy p = ls::policy_of(kind);
    CHECK(ls::parse_schedule(p.name) == p);
  }
  CHECK(ls::parse_schedule("interleaved") == ls::policy_of<lp::interleaved_one_f_one_b>());
  CHECK(ls::parse_schedule("interleaved-1f1b").title == "interleaved 1F1B");
  CHECK(ls::parse_schedule("zb-h2") == ls::policy_of<lp::zero_bubble_h2>());
  CHECK_THROWS_WITH(ls::parse_schedule("pipedream"),
                    "unknown pipeline schedule 'pipedream' (expected gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-h2; "
                    "interleaved for interleaved-1f1b)");
  CHECK_THROWS_WITH(ls::parse_schedule("1F1B"), Catch::Contains("unknown pipeline schedule '1F1B'"));
  constexpr ls::schedule_policy zb = ls::policy_of<lp::zero_bubble_h1>();
  static_assert(zb.splits_backward && !zb.supports_chunks && zb.name == "zb-h1" && zb.title == "ZB-H1");
  CHECK_FALSE(ls::policy_of<lp::one_f_one_b>().splits_backward);
  CHECK(ls::policy_of<lp::one_f_one_b>() != ls::policy_of<lp::gpipe>());
  CHECK_THROWS_WITH(ls::policy_of<lp::interleaved_one_f_one_b>().validate({4, 6, 2}), Catch::Contains("multiple of the number of stages"));
  CHECK(ls::policy_of<lp::gpipe>().orders({2, 3, 1}) == lp::all_stage_ops<lp::gpipe>({2, 3, 1}));
}

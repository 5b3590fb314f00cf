// The reference timeline against the closed forms, deadlock detection, cost conventions, and the
// text formats (op names, --costs).

#include <lumos/pipeline/format.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/pipeline/zero_bubble.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace lp = lumos::pipeline;
using lp::schedule_shape;
using costs = lp::op_costs<std::int64_t>;

namespace {

// Cost combinations used throughout, including non-unit and F ≠ B ≠ W.
constexpr std::array<costs, 9> cost_grid = {{{1, 1, 1},
                                             {1, 2, 0},
                                             {2, 3, 1},
                                             {3, 2, 1},
                                             {5, 7, 2},
                                             {4, 4, 4},
                                             {7, 3, 3},
                                             {2, 5, 2},
                                             {1000, 2000, 500}}};

// Each op starts at max(stage free, dependency end) and takes its cost: the evaluator's
// contract, rechecked on its own output.
template <class T>
void check_consistent(const lp::timeline<T>& t, const lp::op_costs<T>& per_op) {
  for (std::int32_t s = 0; s < t.shape.stages; ++s) {
    T free{};
    for (const auto& x : t.stages[static_cast<std::size_t>(s)]) {
      T ready = free;
      if (const auto dep = lp::dependency_of(t.shape, s, x.what)) {
        const T dep_end = t.find(dep->on.stage, dep->on.what).end;
        if (dep_end > ready) ready = dep_end;
      }
      REQUIRE(x.start == ready);
      const T cost = x.what.kind == lp::op_kind::forward    ? per_op.forward
                     : x.what.kind == lp::op_kind::backward ? per_op.backward
                                                            : per_op.weight;
      REQUIRE(x.end == x.start + cost);
      free = x.end;
    }
  }
}

}  // namespace

TEST_CASE("GPipe and 1F1B: makespan (m + p - 1)(F + B)", "[pipeline][timeline]") {
  for (const costs& c : cost_grid) {
    for (std::int32_t p = 1; p <= 7; ++p) {
      for (std::int32_t m = 1; m <= 14; ++m) {
        INFO("p=" << p << " m=" << m << " F=" << c.forward << " B=" << c.backward
                  << " W=" << c.weight);
        // W is folded into the unsplit backward.
        const std::int64_t fb = c.forward + c.backward + c.weight;
        const schedule_shape shape{p, m, 1};
        const auto g = lp::evaluate_timeline<lp::gpipe>(shape, c);
        const auto o = lp::evaluate_timeline<lp::one_f_one_b>(shape, c);
        CHECK(g.makespan == (m + p - 1) * fb);
        CHECK(o.makespan == (m + p - 1) * fb);
        CHECK(o.stage_work == m * fb);
        CHECK(o.bubble_fraction ==
              Approx(static_cast<double>((p - 1) * fb) / static_cast<double>((m + p - 1) * fb)));
      }
    }
  }
  const auto t = lp::evaluate_timeline<lp::one_f_one_b>(schedule_shape{4, 8, 1}, costs{1, 2, 0});
  CHECK(t.makespan == 33);
  CHECK(t.bubble_fraction == Approx(9.0 / 33.0));
  check_consistent(t, costs{1, 2, 0});
  // Stage 0 of 1F1B waits for B0 to come back through 3 stages: F0..F3 then B0 at 4F + 3B + B.
  CHECK(t.find(0, lp::backward_op(0)).start == 4 * 1 + 4 * 2 - 2);
}

TEST_CASE("interleaved 1F1B: makespan m(F + B) + (p - 1)(F + B)/v", "[pipeline][timeline]") {
  for (const costs& base : cost_grid) {
    for (std::int32_t v = 2; v <= 4; ++v) {
      // Per-stage costs divisible by v, so integer time is exact.
      const costs c{base.forward * v * 3, base.backward * v * 3, base.weight * v * 3};
      const std::int64_t fb = c.forward + c.backward + c.weight;
      for (std::int32_t p = 1; p <= 6; ++p) {
        for (std::int32_t m = p; m <= 4 * p; m += p) {
          INFO("p=" << p << " m=" << m << " v=" << v << " F=" << c.forward << " B=" << c.backward
                    << " W=" << c.weight);
          const schedule_shape shape{p, m, v};
          const auto t = lp::evaluate_timeline<lp::interleaved_one_f_one_b>(shape, c);
          CHECK(t.makespan == m * fb + (p - 1) * fb / v);
          CHECK(t.stage_work == m * fb);
        }
      }
    }
  }
  // Floating-point costs need not divide by v.
  const auto t = lp::evaluate_timeline<lp::interleaved_one_f_one_b>(
      schedule_shape{4, 8, 3}, lp::op_costs<double>{1.0, 2.0, 0.5});
  CHECK(t.makespan == Approx(8 * 3.5 + 3 * 3.5 / 3));
  CHECK(t.bubble_fraction == Approx((3 * 3.5 / 3) / (8 * 3.5 + 3 * 3.5 / 3)));
  const auto per_op =
      lp::per_op_costs<lp::interleaved_one_f_one_b>(schedule_shape{2, 4, 2}, costs{4, 6, 2});
  CHECK(per_op == costs{2, 4, 0});
  check_consistent(
      lp::evaluate_timeline<lp::interleaved_one_f_one_b>(schedule_shape{2, 4, 2}, costs{4, 6, 2}),
      per_op);
}

TEST_CASE("ZB-H1: makespan m(F + B + W) + (p - 1)(F + B - W)", "[pipeline][timeline][zb-h1]") {
  std::int32_t checked = 0;
  for (std::int64_t f = 1; f <= 4; ++f) {
    for (std::int64_t b = 1; b <= 4; ++b) {
      for (std::int64_t w = 0; w <= 4; ++w) {
        const costs c{f, b, w};
        for (std::int32_t p = 1; p <= 6; ++p) {
          for (std::int32_t m = 1; m <= 13; ++m) {
            INFO("p=" << p << " m=" << m << " F=" << f << " B=" << b << " W=" << w);
            const auto t = lp::evaluate_timeline<lp::zero_bubble_h1>({p, m, 1}, c);
            const std::int64_t closed = m * (f + b + w) + (p - 1) * (f + b - w);
            if (w <= f && w <= b && (m >= p || w == 0)) {
              CHECK(t.makespan == closed);
              ++checked;
            } else {
              // Outside the documented conditions the closed form is not reached.
              CHECK((p == 1 ? t.makespan == closed : t.makespan > closed));
            }
          }
        }
      }
    }
  }
  CHECK(checked > 1000);
  const costs big{1000, 1500, 700};
  CHECK(lp::evaluate_timeline<lp::zero_bubble_h1>({8, 24, 1}, big).makespan ==
        24 * 3200 + 7 * 1800);
  // F = B = W: a third of 1F1B's bubble.
  const auto zb = lp::evaluate_timeline<lp::zero_bubble_h1>({4, 8, 1}, costs{1, 1, 1});
  const auto ofob = lp::evaluate_timeline<lp::one_f_one_b>({4, 8, 1}, costs{1, 1, 1});
  CHECK(zb.makespan - zb.stage_work == 3);
  CHECK(ofob.makespan - ofob.stage_work == 9);
  check_consistent(zb, costs{1, 1, 1});
}

TEST_CASE("ZB-H2 with F = B = W: no gap on any stage, ends at 3m + p - 1",
          "[pipeline][timeline][zb-h2]") {
  for (const std::int64_t unit : {1, 5}) {
    for (std::int32_t p = 1; p <= 8; ++p) {
      for (std::int32_t m = 2 * p - 1; m <= 2 * p + 12; ++m) {
        INFO("p=" << p << " m=" << m << " unit=" << unit);
        const auto t =
            lp::evaluate_timeline<lp::zero_bubble_h2>({p, m, 1}, costs{unit, unit, unit});
        CHECK(t.makespan == (3 * m + p - 1) * unit);
        for (std::int32_t r = 0; r < p; ++r) {
          CHECK(t.first_start(r) == r * unit);
          CHECK(t.last_end(r) == (r + 3 * m) * unit);
          CHECK(t.idle_inside(r) == 0);
        }
      }
    }
  }
  // Below m = 2p − 1 the order stays valid but stage 0 cannot fill the wait for its first B.
  const auto short_job = lp::evaluate_timeline<lp::zero_bubble_h2>({4, 6, 1}, costs{1, 1, 1});
  CHECK(short_job.idle_inside(0) > 0);
  check_consistent(short_job, costs{1, 1, 1});
}

TEST_CASE("a deadlocking order is reported", "[pipeline][timeline][errors]") {
  using lp::backward_op;
  using lp::forward_op;
  const schedule_shape shape{2, 1, 1};
  // Stage 0 insists on B0 first, which needs stage 1's B0, which needs F0 from stage 0.
  const std::vector<std::vector<lp::op>> orders = {{backward_op(0), forward_op(0)},
                                                   {forward_op(0), backward_op(0)}};
  CHECK_THROWS_WITH(lp::evaluate_orders(shape, orders, costs{1, 1, 0}, false),
                    "pipeline order deadlocks: stage 0 waits at B0 for B0 on stage 1; stage 1 "
                    "waits at F0 for F0 on stage 0");
  // A W before its own B can never run.
  const std::vector<std::vector<lp::op>> weight_first = {
      {forward_op(0), lp::weight_op(0), backward_op(0)}};
  CHECK_THROWS_WITH(
      lp::evaluate_orders(schedule_shape{1, 1, 1}, weight_first, costs{1, 1, 1}, true),
      "pipeline order deadlocks: stage 0 waits at W0 for B0 on stage 0");
  // Chunked ops are named with their chunk.
  const std::vector<std::vector<lp::op>> chunk_swap = {
      {forward_op(0, 1), forward_op(0, 0), backward_op(0, 1), backward_op(0, 0)}};
  CHECK_THROWS_WITH(lp::evaluate_orders(schedule_shape{1, 1, 2}, chunk_swap, costs{1, 1, 0}, false),
                    "pipeline order deadlocks: stage 0 waits at F0.1 for F0.0 on stage 0");
  CHECK_THROWS_WITH(
      lp::evaluate_orders(shape, {{forward_op(0), backward_op(0)}}, costs{1, 1, 0}, false),
      "pipeline timeline: got orders for 1 stages, the shape has 2");
  CHECK_THROWS_AS(lp::evaluate_orders(shape, {{forward_op(0)}, {forward_op(0), backward_op(0)}},
                                      costs{1, 1, 0}, false),
                  lumos::error);
}

TEST_CASE("cost conventions and their errors", "[pipeline][timeline][errors]") {
  // Unsplit schedules run W inside B.
  CHECK(lp::per_op_costs<lp::one_f_one_b>({4, 8, 1}, costs{1, 2, 3}) == costs{1, 5, 0});
  CHECK(lp::per_op_costs<lp::zero_bubble_h1>({4, 8, 1}, costs{1, 2, 3}) == costs{1, 2, 3});
  CHECK_THROWS_WITH(lp::per_op_costs<lp::interleaved_one_f_one_b>({4, 8, 3}, costs{4, 6, 0}),
                    "interleaved 1F1B splits each stage's work into v = 3 chunks: the forward cost "
                    "4 is not a multiple of 3; scale the costs or use a floating-point cost type");
  CHECK_THROWS_WITH(lp::evaluate_timeline<lp::gpipe>({4, 8, 1}, costs{-1, 2, 0}),
                    "pipeline costs: F must be a non-negative number");
  CHECK_THROWS_WITH(
      lp::evaluate_timeline<lp::gpipe>({4, 8, 1}, lp::op_costs<double>{1, 2, 0.0 / 0.0}),
      "pipeline costs: W must be a non-negative number");
  CHECK_THROWS_WITH(
      lp::evaluate_timeline<lp::interleaved_one_f_one_b>({4, 6, 2}, costs{2, 2, 0}),
      "interleaved 1F1B needs the number of micro-batches (6) to be a multiple of the "
      "number of stages (4)");
  CHECK_THROWS_WITH(lp::evaluate_timeline<lp::gpipe>({4, 8, 1}, costs{INT64_MAX / 8, 1, 0}),
                    "pipeline costs: the total work of the pipeline would overflow the cost type");
  CHECK_THROWS_WITH(lp::evaluate_timeline<lp::gpipe>({4, 8, 1}, costs{1, INT64_MAX, 1}),
                    "pipeline costs: B + W overflows the cost type");
  CHECK_THROWS_WITH(lp::evaluate_orders(schedule_shape{0, 1, 1}, {}, costs{1, 1, 0}, false),
                    "pipeline timeline: bad shape p = 0, m = 1, v = 1 (each must be at least 1, "
                    "within the limits of schedule.hpp)");
  const auto zero = lp::evaluate_timeline<lp::gpipe>({2, 2, 1}, costs{0, 0, 0});
  CHECK(zero.makespan == 0);
  CHECK(zero.bubble_fraction == 0.0);
}

// ---------------------------------------------------------------------------------------------
// Text

TEST_CASE("ops format as F3 or F3.1 and parse back", "[pipeline][format]") {
  CHECK(lp::format_op(lp::forward_op(3, 1), true) == "F3.1");
  CHECK(lp::format_op(lp::forward_op(3)) == "F3");
  CHECK(lp::format_op(lp::weight_op(12)) == "W12");
  CHECK(lp::format_ops(std::vector<lp::op>{}) == "");
  CHECK(lp::format_stage<lp::gpipe>({2, 2, 1}, 0) == "F0 F1 B0 B1");
  // Chunks appear exactly when v > 1; W only in zero-bubble orders.
  CHECK(lp::format_stage<lp::interleaved_one_f_one_b>({1, 1, 2}, 0) == "F0.0 F0.1 B0.1 B0.0");
  CHECK(lp::format_stage<lp::one_f_one_b>({2, 3, 1}, 1).find('W') == std::string::npos);
  CHECK(lp::format_stage<lp::zero_bubble_h1>({2, 3, 1}, 1).find('W') != std::string::npos);

  CHECK(lp::parse_op("F3.1") == lp::forward_op(3, 1));
  CHECK(lp::parse_op("B0") == lp::backward_op(0));
  CHECK(lp::parse_op("W17") == lp::weight_op(17));
  const std::string text = lp::format_stage<lp::interleaved_one_f_one_b>({4, 8, 2}, 1);
  CHECK(lp::parse_ops(text) == lp::interleaved_one_f_one_b::stage_ops({4, 8, 2}, 1));
  for (const char* bad :
       {"", "F", "X3", "F-1", "F3.", "F.1", "F3.1.2", "f3", "F 3", "F99999999999", "F3x"}) {
    INFO(bad);
    CHECK_THROWS_AS(lp::parse_op(bad), lumos::error);
  }
  CHECK_THROWS_WITH(lp::parse_op("X3"),
                    "bad pipeline op 'X3': expected F, B or W, a micro-batch "
                    "index and optionally '.' and a chunk (e.g. F3, B0.1)");
}

TEST_CASE("parse_costs reads the value of --costs", "[pipeline][format][costs]") {
  CHECK(lp::parse_costs("F=1,B=2,W=0") == lp::op_costs<double>{1, 2, 0});
  CHECK(lp::parse_costs("B=2.5, F=.5") == lp::op_costs<double>{0.5, 2.5, 0});
  CHECK(lp::parse_costs(" f = 1 , b=3 ,w=1.25 ") == lp::op_costs<double>{1, 3, 1.25});
  CHECK(lp::parse_costs<std::int64_t>("F=1000,B=2000,W=500") == costs{1000, 2000, 500});

  CHECK_THROWS_WITH(lp::parse_costs(""), "--costs: empty cost list (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1,,B=2"),
                    "--costs: empty item in 'F=1,,B=2' (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1,B=2,"),
                    "--costs: empty item in 'F=1,B=2,' (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F1,B=2"),
                    "--costs: 'F1' is not KIND=VALUE (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1,X=2"),
                    "--costs: unknown op kind 'X' in 'X=2': use F, B or W (expected e.g. "
                    "F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1,B=2,F=3"),
                    "--costs: F is given twice (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1,B="),
                    "--costs: no value for B in 'B=' (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=abc,B=2"),
                    "--costs: 'abc' in 'F=abc' is not a non-negative decimal number within range "
                    "(expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs<std::int64_t>("F=1.5,B=2"),
                    "--costs: '1.5' in 'F=1.5' is not a non-negative integer within range "
                    "(expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=1"), "--costs: missing B (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("B=1,W=1"), "--costs: missing F (expected e.g. F=1,B=2,W=0)");
  CHECK_THROWS_WITH(lp::parse_costs("F=0,B=1"),
                    "--costs: F must be greater than 0 (expected e.g. F=1,B=2,W=0)");
  for (const char* bad : {"F=-1,B=2", "F=1e3,B=2", "F=inf,B=2", "F=nan,B=2", "F=1..2,B=2",
                          "F=.,B=2", "F=0x10,B=2", "F=+1,B=2", "F=1 2,B=2"}) {
    INFO(bad);
    CHECK_THROWS_AS(lp::parse_costs(bad), lumos::error);
  }
  CHECK_THROWS_AS(lp::parse_costs<std::int32_t>("F=99999999999,B=1"), lumos::error);
}

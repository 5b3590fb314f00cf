// Op orders of every schedule against the published rules, their validity, compile-time use,
// shape validation and the dependency rules.

#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/pipeline/zero_bubble.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lp = lumos::pipeline;
using lp::schedule_shape;

namespace {

template <class S>
std::string stage_text(std::int32_t p, std::int32_t m, std::int32_t v, std::int32_t stage) {
  return lp::format_stage<S>(schedule_shape{p, m, v}, stage);
}

// Megatron-LM's non-interleaved loop, transliterated with its own counters: an oracle written
// independently of the policy's skeleton.
std::vector<lp::op> megatron_one_f_one_b(std::int32_t p, std::int32_t m, std::int32_t r) {
  std::vector<lp::op> ops;
  std::int32_t next_f = 0;
  std::int32_t next_b = 0;
  const std::int32_t warmup = std::min(p - r - 1, m);
  const std::int32_t remaining = m - warmup;
  for (std::int32_t i = 0; i < warmup; ++i) ops.push_back(lp::forward_op(next_f++));
  for (std::int32_t i = 0; i < remaining; ++i) {
    ops.push_back(lp::forward_op(next_f++));
    ops.push_back(lp::backward_op(next_b++));
  }
  for (std::int32_t i = 0; i < warmup; ++i) ops.push_back(lp::backward_op(next_b++));
  return ops;
}

// Megatron-LM's interleaved loop as written in megatron/schedules.py (2021): the chunk comes from
// get_model_chunk_id, the micro-batch from each chunk's own data iterator (forwards) and from
// the FIFO of its stored inputs (backwards). No closed-form micro-batch mapping involved.
std::vector<lp::op> megatron_interleaved(std::int32_t p, std::int32_t m, std::int32_t v,
                                         std::int32_t r) {
  const std::int32_t total = m * v;
  std::int32_t warmup = 0;
  if (m == p) {
    warmup = total;
  } else {
    warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  }
  const auto chunk_id = [&](std::int32_t k, bool forward) {
    const std::int32_t in_group = k % (p * v);
    const std::int32_t chunk = in_group / p;
    return forward ? chunk : v - chunk - 1;
  };
  std::vector<std::int32_t> forwards_done(static_cast<std::size_t>(v), 0);
  std::vector<std::int32_t> backwards_done(static_cast<std::size_t>(v), 0);
  std::vector<lp::op> ops;
  const auto fwd = [&](std::int32_t k) {
    const std::int32_t c = chunk_id(k, true);
    ops.push_back(lp::forward_op(forwards_done[static_cast<std::size_t>(c)]++, c));
  };
  const auto bwd = [&](std::int32_t k) {
    const std::int32_t c = chunk_id(k, false);
    ops.push_back(lp::backward_op(backwards_done[static_cast<std::size_t>(c)]++, c));
  };
  for (std::int32_t k = 0; k < warmup; ++k) fwd(k);
  for (std::int32_t k = 0; k < total - warmup; ++k) {
    fwd(k + warmup);
    bwd(k);
  }
  for (std::int32_t k = total - warmup; k < total; ++k) bwd(k);
  return ops;
}

template <class S>
void check_all_valid(const schedule_shape& shape) {
  INFO(S::name << " p=" << shape.stages << " m=" << shape.micro_batches
                << " v=" << shape.chunks);
  const auto orders = lp::all_stage_ops<S>(shape);
  REQUIRE(orders.size() == static_cast<std::size_t>(shape.stages));
  for (std::int32_t s = 0; s < shape.stages; ++s) {
    const auto& order = orders[static_cast<std::size_t>(s)];
    CHECK_NOTHROW(lp::check_stage_order(shape, s, order, S::splits_backward));
    // W of a micro-batch never precedes its B, and chunks are consistent with the policy.
    for (const lp::op& o : order) {
      CHECK((o.kind != lp::op_kind::weight || S::splits_backward));
    }
  }
  // No deadlock: the evaluator runs every op.
  const auto t =
      lp::evaluate_orders(shape, orders, lp::op_costs<std::int64_t>{1, 1, 1}, S::splits_backward);
  CHECK(t.makespan > 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Compile time: the concept, the flags and whole orders are constant expressions.

static_assert(lp::PipelineSchedule<lp::gpipe>);
static_assert(lp::PipelineSchedule<lp::one_f_one_b>);
static_assert(lp::PipelineSchedule<lp::interleaved_one_f_one_b>);
static_assert(lp::PipelineSchedule<lp::zero_bubble_h1>);
static_assert(lp::PipelineSchedule<lp::zero_bubble_h2>);
static_assert(!lp::PipelineSchedule<int>);

namespace {
struct runtime_flag_schedule {  // flags that are not constants do not model the concept
  static constexpr std::string_view name = "runtime-flag";
  static constexpr std::string_view title = "runtime flag";
  static inline bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const schedule_shape&) {}
  static constexpr std::vector<lp::op> stage_ops(const schedule_shape&, std::int32_t) { return {}; }
};
struct unnamed_schedule {  // a schedule_kind is no name: the concept asks for `name` and `title`
  static constexpr lp::schedule_kind kind = lp::schedule_kind::gpipe;
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const schedule_shape&) {}
  static constexpr std::vector<lp::op> stage_ops(const schedule_shape&, std::int32_t) { return {}; }
};
struct runtime_name_schedule {  // names that are not constants do not model it either
  static inline std::string name = "runtime-name";
  static constexpr std::string_view title = "runtime name";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const schedule_shape&) {}
  static constexpr std::vector<lp::op> stage_ops(const schedule_shape&, std::int32_t) { return {}; }
};
struct kindless_schedule {  // no `kind`: a schedule outside the shipped list
  static constexpr std::string_view name = "kindless";
  static constexpr const char title[] = "kindless";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const schedule_shape&) {}
  static constexpr std::vector<lp::op> stage_ops(const schedule_shape&, std::int32_t) { return {}; }
};
}  // namespace
static_assert(!lp::PipelineSchedule<runtime_flag_schedule>);
static_assert(!lp::PipelineSchedule<unnamed_schedule>);
static_assert(!lp::PipelineSchedule<runtime_name_schedule>);
static_assert(lp::PipelineSchedule<kindless_schedule>);

static_assert(!lp::gpipe::splits_backward && !lp::gpipe::supports_chunks);
static_assert(!lp::one_f_one_b::splits_backward && !lp::one_f_one_b::supports_chunks);
static_assert(!lp::interleaved_one_f_one_b::splits_backward &&
              lp::interleaved_one_f_one_b::supports_chunks);
static_assert(lp::zero_bubble_h1::splits_backward && !lp::zero_bubble_h1::supports_chunks);
static_assert(lp::zero_bubble_h2::splits_backward && !lp::zero_bubble_h2::supports_chunks);

namespace {
using lp::backward_op;
using lp::forward_op;
constexpr auto one_f_one_b_4_8_stage0 =
    lp::static_stage_ops<lp::one_f_one_b, schedule_shape{4, 8, 1}, 0>();
}  // namespace
static_assert(one_f_one_b_4_8_stage0 ==
              std::array{forward_op(0), forward_op(1), forward_op(2), forward_op(3), backward_op(0),
                         forward_op(4), backward_op(1), forward_op(5), backward_op(2),
                         forward_op(6), backward_op(3), forward_op(7), backward_op(4),
                         backward_op(5), backward_op(6), backward_op(7)});
static_assert(lp::static_stage_ops<lp::interleaved_one_f_one_b, schedule_shape{2, 4, 2}, 1>()[3] ==
              backward_op(0, 1));
static_assert(lp::static_stage_ops<lp::zero_bubble_h1, schedule_shape{4, 8, 1}, 0>().size() == 24);
static_assert(lp::one_f_one_b::stage_ops(schedule_shape{3, 5, 1}, 2).front() == forward_op(0));
// A whole timeline is a constant expression too: 1F1B, p = 4, m = 8, F = 1, B = 2: (8+3)·3.
static_assert(lp::evaluate_timeline<lp::one_f_one_b>(schedule_shape{4, 8, 1},
                                                     lp::op_costs<int>{1, 2, 0})
                  .makespan == 33);

TEST_CASE("a stage order can be materialised at compile time", "[pipeline][constexpr]") {
  CHECK(lp::format_ops(one_f_one_b_4_8_stage0) ==
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
}

// ---------------------------------------------------------------------------------------------
// GPipe

TEST_CASE("gpipe runs every forward, then every backward, on every stage", "[pipeline][gpipe]") {
  for (std::int32_t s = 0; s < 4; ++s) {
    CHECK(stage_text<lp::gpipe>(4, 8, 1, s) == "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7");
  }
  CHECK(stage_text<lp::gpipe>(1, 1, 1, 0) == "F0 B0");
  CHECK(stage_text<lp::gpipe>(5, 2, 1, 4) == "F0 F1 B0 B1");
}

// ---------------------------------------------------------------------------------------------
// 1F1B

TEST_CASE("1F1B follows Megatron's non-interleaved schedule", "[pipeline][1f1b]") {
  // Stage 0 of p = 4, m = 8 and of p = 2, m = 4: Lumos, Figure 4 (0-based).
  CHECK(stage_text<lp::one_f_one_b>(4, 8, 1, 0) ==
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(stage_text<lp::one_f_one_b>(2, 4, 1, 0) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(stage_text<lp::one_f_one_b>(4, 8, 1, 1) ==
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(stage_text<lp::one_f_one_b>(4, 8, 1, 2) ==
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(stage_text<lp::one_f_one_b>(4, 8, 1, 3) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // m < p: the warm-up is capped at m, so early stages degenerate to GPipe.
  CHECK(stage_text<lp::one_f_one_b>(4, 2, 1, 0) == "F0 F1 B0 B1");
  CHECK(stage_text<lp::one_f_one_b>(4, 2, 1, 2) == "F0 F1 B0 B1");
  CHECK(stage_text<lp::one_f_one_b>(4, 2, 1, 3) == "F0 B0 F1 B1");
  CHECK(stage_text<lp::one_f_one_b>(8, 1, 1, 0) == "F0 B0");
  // p = 1: nothing to warm up.
  CHECK(stage_text<lp::one_f_one_b>(1, 3, 1, 0) == "F0 B0 F1 B1 F2 B2");
  CHECK(lp::one_f_one_b::warmup_forwards(schedule_shape{4, 8, 1}, 0) == 3);
  CHECK(lp::one_f_one_b::warmup_forwards(schedule_shape{4, 2, 1}, 0) == 2);

  for (std::int32_t p = 1; p <= 9; ++p) {
    for (std::int32_t m = 1; m <= 20; ++m) {
      for (std::int32_t r = 0; r < p; ++r) {
        INFO("p=" << p << " m=" << m << " r=" << r);
        CHECK(lp::one_f_one_b::stage_ops(schedule_shape{p, m, 1}, r) ==
              megatron_one_f_one_b(p, m, r));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Interleaved 1F1B

TEST_CASE("interleaved 1F1B follows Megatron's interleaved schedule", "[pipeline][interleaved]") {
  CHECK(stage_text<lp::interleaved_one_f_one_b>(2, 4, 2, 0) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(stage_text<lp::interleaved_one_f_one_b>(2, 4, 2, 1) ==
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // p = 4, m = 8, v = 2: 10 warm-up forwards on stage 0 (2·3 + 4), as in Narayanan et al., Fig. 4.
  CHECK(stage_text<lp::interleaved_one_f_one_b>(4, 8, 2, 0) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 "
        "F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  CHECK(stage_text<lp::interleaved_one_f_one_b>(4, 8, 2, 3) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 "
        "F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  // m == p: Megatron runs every forward first (num_warmup_microbatches = total), on every stage,
  // although the formula would give stage 1 fewer.
  CHECK(stage_text<lp::interleaved_one_f_one_b>(2, 2, 2, 0) ==
        "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  CHECK(stage_text<lp::interleaved_one_f_one_b>(2, 2, 2, 1) ==
        "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  CHECK(lp::interleaved_one_f_one_b::warmup_forwards(schedule_shape{4, 4, 3}, 3) == 12);
  CHECK(lp::interleaved_one_f_one_b::warmup_forwards(schedule_shape{4, 8, 3}, 3) == 8);
  CHECK(lp::interleaved_one_f_one_b::warmup_forwards(schedule_shape{4, 8, 3}, 0) == 14);
  // p = 1: chunks follow each other on the single stage.
  CHECK(stage_text<lp::interleaved_one_f_one_b>(1, 1, 2, 0) == "F0.0 F0.1 B0.1 B0.0");
  CHECK(stage_text<lp::interleaved_one_f_one_b>(1, 3, 2, 0) ==
        "F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 F2.0 B1.0 F2.1 B2.1 B2.0");

  for (std::int32_t p = 1; p <= 6; ++p) {
    for (std::int32_t v = 2; v <= 4; ++v) {
      for (std::int32_t m = p; m <= 5 * p; m += p) {
        for (std::int32_t r = 0; r < p; ++r) {
          INFO("p=" << p << " m=" << m << " v=" << v << " r=" << r);
          CHECK(lp::interleaved_one_f_one_b::stage_ops(schedule_shape{p, m, v}, r) ==
                megatron_interleaved(p, m, v, r));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Zero bubble

TEST_CASE("ZB-H1 orders", "[pipeline][zb-h1]") {
  CHECK(stage_text<lp::zero_bubble_h1>(4, 8, 1, 0) ==
        "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 8, 1, 1) ==
        "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 8, 1, 2) ==
        "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 8, 1, 3) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 2, 1, 0) == "F0 F1 B0 W0 B1 W1");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 2, 1, 2) == "F0 F1 B0 B1 W0 W1");
  CHECK(stage_text<lp::zero_bubble_h1>(4, 2, 1, 3) == "F0 B0 F1 B1 W0 W1");
  CHECK(stage_text<lp::zero_bubble_h1>(1, 3, 1, 0) == "F0 B0 W0 F1 B1 W1 F2 B2 W2");
}

TEST_CASE("ZB-H2 orders", "[pipeline][zb-h2]") {
  CHECK(stage_text<lp::zero_bubble_h2>(4, 8, 1, 0) ==
        "F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7");
  CHECK(stage_text<lp::zero_bubble_h2>(4, 8, 1, 1) ==
        "F0 F1 F2 F3 F4 B0 F5 B1 F6 B2 W0 F7 B3 W1 B4 W2 B5 W3 B6 W4 B7 W5 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h2>(4, 8, 1, 2) ==
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 W0 F7 B5 W1 B6 W2 B7 W3 W4 W5 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h2>(4, 8, 1, 3) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7");
  CHECK(stage_text<lp::zero_bubble_h2>(2, 5, 1, 0) ==
        "F0 F1 F2 B0 W0 F3 B1 W1 F4 B2 W2 B3 W3 B4 W4");
  CHECK(stage_text<lp::zero_bubble_h2>(2, 5, 1, 1) ==
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 F4 B4 W2 W3 W4");
  CHECK(stage_text<lp::zero_bubble_h2>(4, 2, 1, 0) == "F0 F1 B0 W0 B1 W1");
  CHECK(stage_text<lp::zero_bubble_h2>(1, 2, 1, 0) == "F0 B0 W0 F1 B1 W1");
}

namespace {
// Peak number of micro-batches whose forward ran and whose W has not (activation memory).
std::int32_t peak_in_flight(const std::vector<lp::op>& ops) {
  std::int32_t in_flight = 0;
  std::int32_t peak = 0;
  for (const lp::op& o : ops) {
    if (o.kind == lp::op_kind::forward) peak = std::max(peak, ++in_flight);
    if (o.kind == lp::op_kind::weight) --in_flight;
  }
  return peak;
}
}  // namespace

TEST_CASE("zero-bubble schedules keep their memory bounds", "[pipeline][zb-h1][zb-h2]") {
  for (std::int32_t p = 1; p <= 8; ++p) {
    for (std::int32_t m = 1; m <= 24; ++m) {
      std::int32_t h1 = 0;
      std::int32_t h2 = 0;
      std::int32_t f1 = 0;
      for (std::int32_t r = 0; r < p; ++r) {
        h1 = std::max(h1, peak_in_flight(lp::zero_bubble_h1::stage_ops({p, m, 1}, r)));
        h2 = std::max(h2, peak_in_flight(lp::zero_bubble_h2::stage_ops({p, m, 1}, r)));
        // 1F1B holds a micro-batch from F to B (B is the whole backward).
        std::int32_t in_flight = 0;
        for (const lp::op& o : lp::one_f_one_b::stage_ops({p, m, 1}, r)) {
          if (o.kind == lp::op_kind::forward) f1 = std::max(f1, ++in_flight);
          if (o.kind == lp::op_kind::backward) --in_flight;
        }
      }
      INFO("p=" << p << " m=" << m);
      CHECK(h1 == f1);  // ZB-H1: the peak of 1F1B, min(p, m)
      CHECK(f1 == std::min(p, m));
      CHECK(h2 == std::min(2 * p - 1, m));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validity over many shapes

TEST_CASE("every order is complete and deadlock-free", "[pipeline][valid]") {
  for (std::int32_t p = 1; p <= 7; ++p) {
    for (std::int32_t m = 1; m <= 17; ++m) {
      check_all_valid<lp::gpipe>({p, m, 1});
      check_all_valid<lp::one_f_one_b>({p, m, 1});
      check_all_valid<lp::zero_bubble_h1>({p, m, 1});
      check_all_valid<lp::zero_bubble_h2>({p, m, 1});
      if (m % p == 0) {
        for (std::int32_t v = 2; v <= 4; ++v)
          check_all_valid<lp::interleaved_one_f_one_b>({p, m, v});
      }
    }
  }
}

TEST_CASE("check_stage_order rejects incomplete or duplicated orders", "[pipeline][valid]") {
  const schedule_shape shape{2, 2, 1};
  CHECK_THROWS_WITH(lp::check_stage_order(shape, 1, {forward_op(0), backward_op(0)}, false),
                    "pipeline order of stage 1 has 2 ops; every stage must run 4");
  CHECK_THROWS_WITH(
      lp::check_stage_order(shape, 0,
                            {forward_op(0), forward_op(0), backward_op(0), backward_op(1)}, false),
      "pipeline order of stage 0: runs an op twice: F0.0");
  CHECK_THROWS_WITH(
      lp::check_stage_order(shape, 0,
                            {forward_op(0), forward_op(2), backward_op(0), backward_op(1)}, false),
      "pipeline order of stage 0: has an op out of range: F2.0");
  CHECK_THROWS_WITH(
      lp::check_stage_order(
          shape, 0, {forward_op(0), forward_op(1), backward_op(0), lp::weight_op(1)}, false),
      "pipeline order of stage 0: has an op of a kind this schedule does not run: W1.0");
}

// ---------------------------------------------------------------------------------------------
// Shape validation

TEST_CASE("bad shapes raise lumos::error with the reason", "[pipeline][errors]") {
  using lp::interleaved_one_f_one_b;
  CHECK_THROWS_AS(interleaved_one_f_one_b::stage_ops({4, 10, 2}, 0), lumos::error);
  CHECK_THROWS_WITH(interleaved_one_f_one_b::stage_ops({4, 10, 2}, 0),
                    "interleaved 1F1B needs the number of micro-batches (10) to be a multiple of "
                    "the number of stages (4)");
  CHECK_THROWS_WITH(interleaved_one_f_one_b::validate({4, 8, 1}),
                    "interleaved 1F1B needs at least 2 model chunks per stage (v = 1)");
  CHECK_THROWS_WITH(lp::one_f_one_b::validate({0, 8, 1}), "1F1B needs at least one stage (p = 0)");
  CHECK_THROWS_WITH(lp::gpipe::validate({4, 0, 1}), "GPipe needs at least one micro-batch (m = 0)");
  CHECK_THROWS_WITH(lp::zero_bubble_h1::validate({4, -3, 1}),
                    "ZB-H1 needs at least one micro-batch (m = -3)");
  CHECK_THROWS_WITH(interleaved_one_f_one_b::validate({4, 8, 0}),
                    "interleaved 1F1B needs at least one model chunk (v = 0)");
  CHECK_THROWS_WITH(
      lp::one_f_one_b::validate({4, 8, 2}),
      "1F1B has no model chunks: v must be 1 (got v = 2); interleaved 1F1B runs v > 1");
  CHECK_THROWS_WITH(lp::zero_bubble_h2::stage_ops({4, 8, 1}, 4),
                    "ZB-H2: stage 4 is out of range for 4 stages");
  CHECK_THROWS_WITH(lp::gpipe::stage_ops({1, 8, 1}, -1),
                    "GPipe: stage -1 is out of range for 1 stage");
  CHECK_THROWS_WITH(lp::gpipe::validate({100000, 8, 1}),
                    "GPipe: 100000 stages is more than the supported 65536");
  CHECK_THROWS_WITH(interleaved_one_f_one_b::validate({1, 1 << 20, 32}),
                    "interleaved 1F1B: 33554432 virtual micro-batches (m*v) is more than the "
                    "supported 16777216");
  CHECK_NOTHROW(interleaved_one_f_one_b::validate({4, 8, 2}));
}

TEST_CASE("shipped schedules have names and titles", "[pipeline][names]") {
  static_assert(lp::gpipe::name == "gpipe" && lp::gpipe::title == "GPipe");
  static_assert(lp::one_f_one_b::name == "1f1b" && lp::one_f_one_b::title == "1F1B");
  static_assert(lp::interleaved_one_f_one_b::name == "interleaved-1f1b" &&
                lp::interleaved_one_f_one_b::title == "interleaved 1F1B");
  static_assert(lp::zero_bubble_h1::name == "zb-h1" && lp::zero_bubble_h1::title == "ZB-H1");
  static_assert(lp::zero_bubble_h2::name == "zb-h2" && lp::zero_bubble_h2::title == "ZB-H2");
  // Messages start with the title the policy passes to the shape checks.
  CHECK_THROWS_WITH(lp::validate_shape("my schedule", {2, 0, 1}, false),
                    "my schedule needs at least one micro-batch (m = 0)");
  CHECK_THROWS_WITH(lp::validate_stage("my schedule", {2, 4, 1}, 2),
                    "my schedule: stage 2 is out of range for 2 stages");
}

// ---------------------------------------------------------------------------------------------
// Dependency rules

TEST_CASE("dependency rules", "[pipeline][dependencies]") {
  using lp::dependency;
  using lp::dependency_kind;
  using lp::weight_op;
  const schedule_shape plain{4, 8, 1};
  CHECK_FALSE(lp::dependency_of(plain, 0, forward_op(3)).has_value());
  CHECK(lp::dependency_of(plain, 2, forward_op(3)) ==
        dependency{{1, forward_op(3)}, dependency_kind::activation});
  CHECK(lp::dependency_of(plain, 1, backward_op(5)) ==
        dependency{{2, backward_op(5)}, dependency_kind::gradient});
  CHECK(lp::dependency_of(plain, 3, backward_op(5)) ==
        dependency{{3, forward_op(5)}, dependency_kind::loss});
  CHECK(lp::dependency_of(plain, 0, weight_op(5)) ==
        dependency{{0, backward_op(5)}, dependency_kind::weight});
  CHECK(lp::dependency_of(plain, 2, forward_op(3))->crosses_stages(2));
  CHECK_FALSE(lp::dependency_of(plain, 3, backward_op(5))->crosses_stages(3));

  const schedule_shape chunked{4, 8, 3};
  // F on stage 0 of chunk c > 0 waits for the previous chunk on the last stage.
  CHECK(lp::dependency_of(chunked, 0, forward_op(2, 1)) ==
        dependency{{3, forward_op(2, 0)}, dependency_kind::activation});
  CHECK(lp::dependency_of(chunked, 3, forward_op(2, 2)) ==
        dependency{{2, forward_op(2, 2)}, dependency_kind::activation});
  // B on the last stage of chunk c < v − 1 waits for chunk c + 1 on stage 0.
  CHECK(lp::dependency_of(chunked, 3, backward_op(2, 1)) ==
        dependency{{0, backward_op(2, 2)}, dependency_kind::gradient});
  // The last virtual stage turns F into B.
  CHECK(lp::dependency_of(chunked, 3, backward_op(2, 2)) ==
        dependency{{3, forward_op(2, 2)}, dependency_kind::loss});
  CHECK(lp::dependency_of(chunked, 0, backward_op(2, 0)) ==
        dependency{{1, backward_op(2, 0)}, dependency_kind::gradient});

  const schedule_shape single{1, 2, 2};
  CHECK(lp::dependency_of(single, 0, forward_op(1, 1)) ==
        dependency{{0, forward_op(1, 0)}, dependency_kind::activation});
  CHECK(lp::dependency_of(single, 0, backward_op(1, 0)) ==
        dependency{{0, backward_op(1, 1)}, dependency_kind::gradient});
  CHECK(lp::dependency_of(single, 0, backward_op(1, 1)) ==
        dependency{{0, forward_op(1, 1)}, dependency_kind::loss});
}

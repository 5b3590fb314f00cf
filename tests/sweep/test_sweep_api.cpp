// The sweep API: evaluate agrees with synth::predict bit for bit, validate's reasons with what
// the builder refuses; workspaces reused across configurations and threads give the sequential
// results; a schedule defined here (not one of the shipped kinds) goes through the program
// builder, predict and the sweep.

#include "../model/config_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/zero_bubble.hpp>
#include <lumos/report/sweep_html.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>
#include <lumos/synth/predict.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace lm = lumos::model;
namespace lp = lumos::pipeline;
namespace ls = lumos::synth;
namespace sw = lumos::sweep;

namespace {

// 1F1B with a deeper warm-up: stage r runs min(m, 2(p-1-r)) forwards before its first backward.
// Warm-ups that do not grow with the stage keep the pipeline deadlock-free (each stage's k-th
// backward waits only for forwards its successor has already run). A user's policy type: not
// one of the shipped schedules, with a name of its own and no `kind`.
struct deep_warmup_1f1b final {
  static constexpr std::string_view name = "deep-warmup-1f1b";
  static constexpr std::string_view title = "deep warm-up 1F1B";
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const lp::schedule_shape& shape) { lp::validate_shape(title, shape, supports_chunks); }
  [[nodiscard]] static constexpr std::vector<lp::op> stage_ops(const lp::schedule_shape& shape, std::int32_t stage) {
    validate(shape);
    lp::validate_stage(title, shape, stage);
    const std::int32_t warmup = std::min(shape.micro_batches, 2 * (shape.stages - 1 - stage));
    return lp::one_f_one_b_skeleton(
        shape.micro_batches, warmup, [](std::int32_t k) { return lp::forward_op(k); },
        [](std::int32_t k) { return lp::backward_op(k); });
  }
};
static_assert(lp::PipelineSchedule<deep_warmup_1f1b>);

sw::problem small_problem(std::int64_t gpus = 16) {
  sw::problem p;
  p.model = lumos::model::test::small_gpt();
  p.gpus = gpus;
  p.global_batch = 64;
  return p;
}

sw::space small_space() {
  sw::space s;
  s.tp = {1, 2, 4, 8};
  s.pp = {1, 2, 4, 8};
  s.vp = {1, 2};
  s.micro_batch = {1, 2, 3};
  s.schedules = {ls::policy_of<lp::one_f_one_b>(), ls::policy_of<lp::interleaved_one_f_one_b>(),
                 ls::policy_of<lp::zero_bubble_h1>()};
  s.recompute = {lm::recompute_kind::none, lm::recompute_kind::full};
  s.sp = {false, true};
  return s;
}

// Field by field (the struct's padding is not part of a result).
void require_same(const sw::result& a, const sw::result& b) {
  REQUIRE(a.config == b.config);
  REQUIRE(a.reason == b.reason);
  REQUIRE(std::string(a.why()) == std::string(b.why()));
  REQUIRE(a.micro_batches == b.micro_batches);
  REQUIRE(a.memory_bytes == b.memory_bytes);
  REQUIRE(a.memory_stage == b.memory_stage);
  REQUIRE(a.predicted == b.predicted);
  REQUIRE(a.m.iteration_ns == b.m.iteration_ns);
  REQUIRE(a.m.mfu == b.m.mfu);
  REQUIRE(a.m.bubble_fraction == b.m.bubble_fraction);
  REQUIRE(a.m.breakdown.exposed_compute == b.m.breakdown.exposed_compute);
  REQUIRE(a.m.breakdown.exposed_comm == b.m.breakdown.exposed_comm);
  REQUIRE(a.m.breakdown.other == b.m.breakdown.other);
  REQUIRE(a.m.tasks == b.m.tasks);
}

template <class Evaluator>
void require_matches_predict(const Evaluator& ev, const sw::result& r, const ls::predict_options& opt,
                             const auto& compute, const auto& comm) {
  REQUIRE(r.ok());
  REQUIRE(r.predicted);
  const ls::prediction p = ls::predict(ev.job_of(r.config), opt, compute, comm);
  CHECK(r.m.iteration_ns == p.iteration_ns);
  CHECK(r.m.mfu == p.mfu);
  CHECK(r.m.hfu == p.hfu);
  CHECK(r.m.tokens_per_s == p.tokens_per_s);
  CHECK(r.m.bubble_fraction == p.bubble_fraction);
  CHECK(r.m.pipeline_ns == p.pipeline_ns);
  CHECK(r.memory_bytes == p.memory.total());
  CHECK(r.memory_stage == p.memory_stage);
  CHECK(r.in_flight_microbatches == p.in_flight_microbatches);
  CHECK(r.m.breakdown_window_ns == p.breakdown_window_ns);
  CHECK(r.m.breakdown.exposed_compute == p.breakdown.exposed_compute);
  CHECK(r.m.breakdown.overlapped == p.breakdown.overlapped);
  CHECK(r.m.breakdown.exposed_comm == p.breakdown.exposed_comm);
  CHECK(r.m.breakdown.other == p.breakdown.other);
  CHECK(static_cast<std::size_t>(r.m.tasks) == p.tasks);
}

}  // namespace

TEST_CASE("evaluate gives synth::predict's figures, with the kernel-level model and the roofline", "[sweep]") {
  const lm::cost_profile profile = lm::profile_preset("h100-sxm");
  const sw::problem p = small_problem();
  const auto kernel = sw::make_evaluator(p, profile);
  const sw::evaluator<lm::roofline, lm::ring_alpha_beta> roofline(p);
  sw::workspace w;  // one workspace through configurations of different sizes
  for (const sw::configuration& c : sw::enumerate(small_space(), p.gpus)) {
    const sw::result r = kernel.evaluate(c, w);
    if (!r.ok() || (c.micro_batch == 3) || c.recompute == lm::recompute_kind::full) continue;
    require_matches_predict(kernel, r, kernel.fixed().options, kernel.compute_model(), kernel.comm_model());
    const sw::result q = roofline.evaluate(c, w);
    require_matches_predict(roofline, q, roofline.fixed().options, roofline.compute_model(), roofline.comm_model());
  }
}

TEST_CASE("evaluate with overlapped parameter all-gathers gives synth::predict's figures", "[sweep]") {
  const lm::cost_profile profile = lm::profile_preset("h100-sxm");
  sw::problem p = small_problem();
  p.overlap_param_gather = true;
  const auto kernel = sw::make_evaluator(p, profile);
  sw::workspace w;
  std::size_t compared = 0;
  for (const sw::configuration& c : sw::enumerate(small_space(), p.gpus)) {
    const sw::result r = kernel.evaluate(c, w);
    if (!r.ok() || c.dp == 1) continue;
    REQUIRE(kernel.job_of(c).parallel.overlap_param_gather);
    require_matches_predict(kernel, r, kernel.fixed().options, kernel.compute_model(), kernel.comm_model());
    ++compared;
  }
  CHECK(compared > 0);
}

TEST_CASE("precision: a dimension of the space, predicted as synth::predict, rejected where the GPU lacks it", "[sweep][precision]") {
  const lm::cost_profile profile = lm::profile_preset("h100-sxm");
  const sw::problem p = small_problem();
  sw::space s = small_space();
  const std::vector<sw::configuration> one = sw::enumerate(s, p.gpus);
  s.precisions = {lm::precision::bf16, lm::precision::fp8, lm::precision::bf16};
  const std::vector<sw::configuration> both = sw::enumerate(s, p.gpus);
  REQUIRE(both.size() == 2 * one.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    CHECK(both[2 * i] == one[i]);
    sw::configuration fp8 = one[i];
    fp8.dtype = lm::precision::fp8;
    CHECK(both[2 * i + 1] == fp8);
  }
  const auto kernel = sw::make_evaluator(p, profile);
  // The fp16 loss-scale host sync is on, and acts only in fp16: a bf16 configuration predicts as
  // `lumos predict` does with it off.
  REQUIRE(kernel.fixed().options.program.loss_scale_host_sync);
  ls::predict_options without_sync = kernel.fixed().options;
  without_sync.program.loss_scale_host_sync = false;
  sw::workspace w;
  std::size_t compared = 0;
  for (std::size_t i = 0; i < both.size() && compared < 12; ++i) {
    const sw::result r = kernel.evaluate(both[i], w);
    if (!r.ok() || both[i].recompute == lm::recompute_kind::full) continue;
    CHECK(kernel.job_of(both[i]).parallel.dtype == both[i].dtype);
    require_matches_predict(kernel, r, both[i].dtype == lm::precision::fp8 ? kernel.fixed().options : without_sync, kernel.compute_model(),
                            kernel.comm_model());
    ++compared;
  }
  CHECK(compared == 12);
  sw::configuration fp16 = one.front();
  fp16.dtype = lm::precision::fp16;
  const sw::result r16 = kernel.evaluate(fp16, w);
  if (r16.ok()) require_matches_predict(kernel, r16, kernel.fixed().options, kernel.compute_model(), kernel.comm_model());

  sw::problem a100 = small_problem();
  a100.hardware = lm::hardware_preset("a100-sxm-80gb");
  const sw::evaluator<lm::roofline, lm::ring_alpha_beta> ev(a100);  // constructs: no fixed precision to refuse
  const sw::result r8 = ev.validate(both[1]);
  CHECK(r8.reason == sw::rejection::precision);
  CHECK(std::string(r8.why()).find("fp8") != std::string::npos);
  CHECK(ev.validate(both[0]).reason != sw::rejection::precision);
  CHECK(sw::precisions(std::vector<sw::result>{r8, ev.validate(both[0])}) == std::vector<lm::precision>{lm::precision::fp8, lm::precision::bf16});
}

TEST_CASE("enumerate: a value listed twice counts once", "[sweep]") {
  const sw::space once = small_space();
  sw::space twice = once;
  twice.tp = {1, 2, 1, 4, 8, 8};
  twice.micro_batch = {3, 1, 2, 3};
  twice.schedules.push_back(twice.schedules.front());
  twice.sp = {false, true, false};
  const auto a = sw::enumerate(once, 16), b = sw::enumerate(twice, 16);
  CHECK(b.size() == a.size());
  // The first occurrence keeps its place: micro-batch 3 now comes first.
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) CHECK(b[i].tp == a[i].tp);
  CHECK(b.front().micro_batch == 3);
}

TEST_CASE("sm_utilization: 1 ms buckets, and a window too long for them takes wider ones", "[sweep][report]") {
  using lumos::report::interval;
  const auto u = lumos::report::sm_utilization({{0, 1'500'000}}, interval{0, 3'000'000});
  CHECK(u.bucket == 1'000'000);
  REQUIRE(u.series.size() == 3);
  CHECK(u.series[0] == 1.0);
  CHECK(u.series[1] == 0.5);
  CHECK(u.series[2] == 0.0);
  // Ten hours (a what-if of a huge model): 36 million 1 ms buckets would take 288 MB; a whole
  // number of milliseconds per bucket keeps the series to 65536 at most.
  const lumos::time_ns hours = 36'000'000'000'000;
  const auto w = lumos::report::sm_utilization({{0, hours / 2}}, interval{0, hours});
  CHECK(w.series.size() <= 65536);
  CHECK(w.series.size() > 32768);
  CHECK(w.bucket % 1'000'000 == 0);
  CHECK(w.mean == Approx(0.5));
}

TEST_CASE("compute_breakdown_into: the breakdown in the caller's buffers, left as the unions", "[sweep][report]") {
  using lumos::report::interval;
  const interval window{0, 35};
  // Two sorted runs of compute (stream by stream), overlapping, one interval outside, one empty.
  std::vector<interval> compute = {{0, 3}, {2, 4}, {5, 9}, {20, 30}, {-5, 1}, {8, 8}, {30, 40}};
  std::vector<interval> comm = {{25, 40}, {3, 6}, {10, 12}, {11, 15}};
  std::vector<interval> scratch;
  const auto b = lumos::report::compute_breakdown_into(compute, comm, window, scratch);
  // Unions inside [0, 35): compute [0, 4) [5, 9) [20, 35), comm [3, 6) [10, 15) [25, 35).
  auto same = [](const std::vector<interval>& a, const std::vector<interval>& want) {
    return std::equal(a.begin(), a.end(), want.begin(), want.end(),
                      [](const interval& x, const interval& y) { return x.begin == y.begin && x.end == y.end; });
  };
  CHECK(same(compute, {{0, 4}, {5, 9}, {20, 35}}));
  CHECK(same(comm, {{3, 6}, {10, 15}, {25, 35}}));
  CHECK(b.overlapped == 2 + 10);            // [3, 4) [5, 6) and [25, 35)
  CHECK(b.exposed_compute == 4 + 4 + 15 - 12);
  CHECK(b.exposed_comm == 3 + 5 + 10 - 12);
  CHECK(b.other == 35 - b.exposed_compute - b.exposed_comm - b.overlapped);
  CHECK(b.total() == 35);
  // The scratch, once large enough, is used again without growing.
  const auto capacity = scratch.capacity();
  std::vector<interval> c2 = {{6, 7}, {1, 2}}, m2 = {{0, 1}};
  (void)lumos::report::compute_breakdown_into(c2, m2, window, scratch);
  CHECK(scratch.capacity() == capacity);
}

TEST_CASE("compute_breakdown with waits and sm_utilization match a nanosecond-by-nanosecond count", "[sweep][report]") {
  // The truth: each instant of the window classified on its own, from the raw intervals (the
  // library merges sorted lists instead: compute with transfers, compute with communication).
  using lumos::report::interval;
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::uniform_int_distribution<int> at(-50, 1050), len(0, 120), count(0, 40);
    auto some = [&](int n) {
      std::vector<interval> v;
      for (int i = 0; i < n; ++i) {
        const int b = at(rng);
        v.push_back({b, b + len(rng)});
      }
      return v;
    };
    const std::vector<interval> compute = some(count(rng));
    const std::vector<interval> comm = some(count(rng));
    std::vector<interval> waits;  // a prefix of each op: the wait before its transfer
    for (const interval& c : comm) waits.push_back({c.begin, c.begin + (c.end - c.begin) * static_cast<int>(rng() % 3) / 2});
    const interval window{0, 1000};
    auto covers = [](const std::vector<interval>& v, lumos::time_ns t) {
      return std::any_of(v.begin(), v.end(), [&](const interval& i) { return i.begin <= t && t < i.end; });
    };
    lumos::report::breakdown want;
    lumos::time_ns busy = 0;
    for (lumos::time_ns t = window.begin; t < window.end; ++t) {
      const bool c = covers(compute, t), m = covers(comm, t), w = covers(waits, t);
      bool transfer = false;
      for (std::size_t i = 0; i < comm.size(); ++i) transfer = transfer || (waits[i].end <= t && t < comm[i].end);
      (c && m ? want.overlapped : c ? want.exposed_compute : m ? want.exposed_comm : want.other) += 1;
      want.exposed_comm_wait += w && !c && !transfer ? 1 : 0;
      busy += c || m ? 1 : 0;
    }
    const auto got = lumos::report::compute_breakdown(compute, comm, waits, window);
    INFO("round " << round);
    CHECK(got.exposed_compute == want.exposed_compute);
    CHECK(got.overlapped == want.overlapped);
    CHECK(got.exposed_comm == want.exposed_comm);
    CHECK(got.other == want.other);
    CHECK(got.exposed_comm_wait == want.exposed_comm_wait);
    std::vector<interval> all = compute;
    all.insert(all.end(), comm.begin(), comm.end());
    const auto u = lumos::report::sm_utilization(all, window);
    CHECK(u.mean == Approx(static_cast<double>(busy) / 1000.0).epsilon(1e-12));
  }
}

TEST_CASE("validate rejects exactly what the program builder refuses, with a reason", "[sweep]") {
  const sw::evaluator<lm::roofline, lm::ring_alpha_beta> ev(small_problem(0));  // any GPU count
  sw::space s = small_space();
  s.dp = {1, 2, 3};
  s.tp = {1, 2, 3, 4, 32};  // 3 does not divide the heads, 32 neither
  s.pp = {1, 2, 3, 8};      // 3 does not divide the layers
  s.micro_batch = {1, 2, 3, 5};
  std::size_t rejected = 0;
  for (const sw::configuration& c : sw::enumerate(s, 0)) {
    const sw::result r = ev.validate(c);
    bool throws = false;
    try {
      (void)ls::build_program(ev.job_of(c), ev.fixed().options.program);
    } catch (const lumos::error&) {
      throws = true;
    }
    INFO(std::string(r.why()));
    if (r.reason == sw::rejection::memory || r.ok()) {
      REQUIRE_FALSE(throws);
    } else {
      REQUIRE(throws);
      REQUIRE_FALSE(r.why().empty());
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("the memory check uses the stated margin", "[sweep]") {
  sw::problem p = small_problem();
  sw::configuration c;
  c.dp = 16;
  p.memory_margin = 0;
  const sw::result fits = sw::evaluator<lm::roofline, lm::ring_alpha_beta>(p).validate(c);
  REQUIRE(fits.ok());
  // A margin that leaves just less than this configuration needs.
  p.memory_margin = 1.0 - 0.999 * fits.memory_bytes / static_cast<double>(p.hardware.gpu.hbm_capacity);
  const sw::result r = sw::evaluator<lm::roofline, lm::ring_alpha_beta>(p).evaluate(c);
  CHECK(r.reason == sw::rejection::memory);
  CHECK_FALSE(r.predicted);
  CHECK(r.memory_bytes == fits.memory_bytes);
}

TEST_CASE("evaluations from several threads, one workspace each, equal the sequential ones", "[sweep][threads]") {
  const auto ev = sw::make_evaluator(small_problem(), lm::profile_preset("h100-sxm"));
  const std::vector<sw::configuration> configs = sw::enumerate(small_space(), 16);
  REQUIRE(configs.size() > 100);
  std::vector<sw::result> sequential;
  {
    sw::workspace w;
    for (const auto& c : configs) sequential.push_back(ev.evaluate(c, w));
  }
  REQUIRE(std::count_if(sequential.begin(), sequential.end(), [](const sw::result& r) { return r.ok(); }) > 20);
  // Every thread walks the whole list from a different offset: all share the evaluator.
  constexpr int threads = 3;
  std::vector<std::vector<sw::result>> by_thread(threads, std::vector<sw::result>(configs.size()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      sw::workspace w;
      for (std::size_t k = 0; k < configs.size(); ++k) {
        const std::size_t i = (k + static_cast<std::size_t>(t) * configs.size() / threads) % configs.size();
        by_thread[static_cast<std::size_t>(t)][i] = ev.evaluate(configs[i], w);
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& results : by_thread) {
    for (std::size_t i = 0; i < configs.size(); ++i) require_same(results[i], sequential[i]);
  }
  // sweep::run: the same results and order for 1 and 4 threads, and split over 3 "ranks".
  const auto one = sw::run(ev, configs, {.threads = 1});
  const auto four = sw::run(ev, configs, {.threads = 4});
  for (std::size_t i = 0; i < configs.size(); ++i) {
    require_same(one[i], sequential[i]);
    require_same(four[i], sequential[i]);
  }
  std::vector<sw::result> merged(configs.size());
  for (int rank = 0; rank < 3; ++rank) {
    const auto part = sw::run(ev, configs, {.threads = 2, .rank = rank, .ranks = 3, .block = 7});
    const auto idx = sw::owned_indices(configs.size(), rank, 3, 7);
    REQUIRE(part.size() == idx.size());
    for (std::size_t k = 0; k < idx.size(); ++k) merged[idx[k]] = part[k];
  }
  for (std::size_t i = 0; i < configs.size(); ++i) require_same(merged[i], sequential[i]);
  CHECK(sw::top(four, 5) == sw::top(sequential, 5));
}

TEST_CASE("a user-defined PipelineSchedule builds, predicts and sweeps", "[sweep][schedule]") {
  constexpr auto policy = ls::policy_of<deep_warmup_1f1b>();
  static_assert(policy.name == "deep-warmup-1f1b");
  ls::job j;
  j.model = lumos::model::test::small_gpt();
  j.hardware = lm::h100_sxm();
  j.parallel.pp = 4;
  j.parallel.dp = 2;
  j.parallel.global_batch = 16;
  j.schedule = policy;
  const ls::program prog = ls::build_program(j);
  REQUIRE(prog.orders == lp::all_stage_ops<deep_warmup_1f1b>(prog.shape));
  REQUIRE(prog.orders != lp::all_stage_ops<lp::one_f_one_b>(prog.shape));
  const ls::prediction custom = ls::predict(j);
  j.schedule.reset();
  const ls::prediction standard = ls::predict(j);
  REQUIRE(custom.iteration_ns > 0);
  // Stage 0 holds its 2(p-1) = 6 warm-up forwards plus one at its peak, 1F1B p = 4.
  CHECK(custom.stages[0].in_flight_microbatches == 7);
  CHECK(standard.stages[0].in_flight_microbatches == 4);
  CHECK(custom.memory.total() > standard.memory.total());

  // In a sweep: beside the shipped schedules, evaluated like them.
  const sw::evaluator<lm::roofline, lm::ring_alpha_beta> ev(small_problem(8));
  sw::space s;
  s.tp = {1, 2};
  s.pp = {2, 4};
  s.schedules = {ls::policy_of<lp::one_f_one_b>(), policy};
  const auto results = sw::run(ev, sw::enumerate(s, 8), {.threads = 2});
  std::size_t custom_ok = 0;
  for (const sw::result& r : results) {
    if (r.config.schedule == policy && r.ok()) {
      ++custom_ok;
      j = ev.job_of(r.config);
      REQUIRE(j.schedule == policy);
      CHECK(ls::predict(j, ev.fixed().options).iteration_ns == r.m.iteration_ns);
    }
  }
  CHECK(custom_ok == 4);
  // Chunks are refused by its own flag, not by its kind.
  sw::configuration c;
  c.pp = 2;
  c.dp = 4;
  c.vp = 2;
  c.schedule = policy;
  CHECK(ev.validate(c).reason == sw::rejection::schedule);
}

namespace {

// The values of attribute `attr` of the tags that open with `opening` (e.g. "<circle class=\"config "),
// within the part of `page` from `from` to the next `to` (the whole page when `from` is empty).
std::vector<std::string> attribute_values(const std::string& page, const std::string& opening, const std::string& attr,
                                          const std::string& from = "", const std::string& to = "") {
  std::size_t begin = 0, end = page.size();
  if (!from.empty()) {
    begin = page.find(from);
    REQUIRE(begin != std::string::npos);
    end = page.find(to, begin);
    REQUIRE(end != std::string::npos);
  }
  std::vector<std::string> out;
  const std::regex value(" " + attr + "=\"([^\"]*)\"");
  for (std::size_t at = page.find(opening, begin); at < end; at = page.find(opening, at + 1)) {
    const std::string tag = page.substr(at, page.find('>', at) - at);
    std::smatch m;
    REQUIRE(std::regex_search(tag, m, value));
    out.push_back(m[1]);
  }
  return out;
}

}  // namespace

TEST_CASE("sweep_html: a point per predicted configuration, the Pareto front, the rejections, no script", "[sweep][report]") {
  sw::problem p = small_problem();
  const std::vector<sw::configuration> configs = sw::enumerate(small_space(), p.gpus);
  {
    // A memory limit at the median of what the valid configurations need: the larger half is
    // rejected for memory, the front has memories to trade against time.
    const auto checked = sw::run(sw::make_evaluator(p, lm::profile_preset("h100-sxm")), configs, {.threads = 2, .simulate = false});
    std::vector<double> memory;
    for (const sw::result& r : checked) {
      if (r.ok()) memory.push_back(r.memory_bytes);
    }
    REQUIRE(memory.size() > 40);
    std::nth_element(memory.begin(), memory.begin() + static_cast<std::ptrdiff_t>(memory.size() / 2), memory.end());
    p.memory_margin = 1.0 - memory[memory.size() / 2] / static_cast<double>(p.hardware.gpu.hbm_capacity);
  }
  const auto ev = sw::make_evaluator(p, lm::profile_preset("h100-sxm"));
  const std::vector<sw::result> rs = sw::run(ev, configs, {.threads = 2});
  const std::string page = lumos::report::sweep_html(p, rs, {.profile = "h100-sxm", .top = 5});

  // Every predicted configuration once, as a "config" point carrying its index.
  std::set<std::size_t> predicted;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].ok() && rs[i].predicted) predicted.insert(i);
  }
  REQUIRE(predicted.size() > 20);
  REQUIRE(predicted.size() < rs.size());
  const auto points = attribute_values(page, "<circle class=\"config ", "data-index");
  CHECK(points.size() == predicted.size());
  std::set<std::size_t> drawn;
  for (const std::string& v : points) drawn.insert(std::stoul(v));
  CHECK(drawn == predicted);

  // The front, by brute force: a configuration no other one matches or beats on time and memory
  // while beating it on one of them.
  std::set<std::size_t> front;
  for (const std::size_t i : predicted) {
    const auto dominates = [&](std::size_t j) {
      const sw::result &a = rs[j], &b = rs[i];
      return a.m.iteration_ns <= b.m.iteration_ns && a.memory_bytes <= b.memory_bytes &&
             (a.m.iteration_ns < b.m.iteration_ns || a.memory_bytes < b.memory_bytes);
    };
    if (std::none_of(predicted.begin(), predicted.end(), dominates)) front.insert(i);
  }
  REQUIRE(front.size() > 1);
  std::set<std::size_t> listed;
  for (const std::string& v : attribute_values(page, "<tr class=\"front-row\"", "data-index", "<table id=\"pareto\"", "</table>")) {
    CHECK(listed.insert(std::stoul(v)).second);
  }
  CHECK(listed == front);
  const auto library = sw::pareto_front(rs);
  CHECK(std::set<std::size_t>(library.begin(), library.end()) == front);
  CHECK(page.find("class=\"pareto-line\"") != std::string::npos);

  // The rejections per reason, as the results give them.
  std::map<std::string, std::size_t> reasons;
  for (const sw::result& r : rs) {
    if (!r.ok()) ++reasons[std::string(sw::to_string(r.reason))];
  }
  CHECK(reasons.count("memory") == 1);
  const auto names = attribute_values(page, "<tr data-reason=", "data-reason", "<table id=\"rejected\"", "</table>");
  const auto counts = attribute_values(page, "<tr data-reason=", "data-count", "<table id=\"rejected\"", "</table>");
  REQUIRE(names.size() == counts.size());
  std::map<std::string, std::size_t> shown;
  for (std::size_t k = 0; k < names.size(); ++k) shown[names[k]] = std::stoul(counts[k]);
  CHECK(shown == reasons);

  // The ranking's rows are sweep::top's, each with a 4-part breakdown bar.
  const auto top = sw::top(rs, 5);
  const auto ranked = attribute_values(page, "<tr class=\"top-row\"", "data-index", "<table id=\"top\"", "</table>");
  REQUIRE(ranked.size() == top.size());
  for (std::size_t k = 0; k < top.size(); ++k) CHECK(std::stoul(ranked[k]) == top[k]);
  CHECK(page.find("<svg class=\"split\"") != std::string::npos);

  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("http") == std::string::npos);  // loads nothing
  CHECK(page.rfind("</html>\n") == page.size() - 8);
}

TEST_CASE("sweep_html: a space where nothing fits still makes a page", "[sweep][report]") {
  sw::problem p = small_problem();
  p.memory_margin = 0.9999;
  const auto ev = sw::make_evaluator(p, lm::profile_preset("h100-sxm"));
  const std::vector<sw::result> rs = sw::run(ev, sw::enumerate(small_space(), p.gpus), {.threads = 2});
  REQUIRE(sw::count_reasons(rs)[0] == 0);
  const std::string page = lumos::report::sweep_html(p, rs);
  CHECK(page.find("<circle class=\"config ") == std::string::npos);
  CHECK(page.find("No configuration of the space fits") != std::string::npos);
  CHECK(page.find("<tr class=\"front-row\"") == std::string::npos);
  CHECK(page.find("data-reason=\"memory\"") != std::string::npos);
}

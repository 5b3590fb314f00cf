// FSDP / ZeRO-3 / HSDP: the configuration's rules, the per-GPU memory, and the per-unit
// all-gathers and reduce-scatters of the program builder (counts, sizes, prefetch overlap,
// hybrid sharding's all-reduces, reshard-after-forward off), folded and unfolded.

#include "../model/config_support.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace fsdp_test {

namespace lm = lumos::model;
namespace ls = lumos::synth;
namespace lg = lumos::graph;

// small_gpt with 4 layers on tp·pp·dp GPUs, one sequence per micro-batch, FSDP on.
ls::job fsdp_job(int tp, int pp, int dp, std::int64_t global_batch, int hsdp = 0) {
  ls::job j;
  j.model = lm::test::small_gpt(4);
  j.hardware = lm::h100_sxm();
  j.parallel.tp = tp;
  j.parallel.pp = pp;
  j.parallel.dp = dp;
  j.parallel.micro_batch = 1;
  j.parallel.global_batch = global_batch;
  j.parallel.fsdp = true;
  j.parallel.zero_stage = 3;
  j.parallel.hsdp = hsdp;
  return j;
}

// The data-parallel collectives of a program's rank-0 stage, by kind and group prefix.
struct dp_collectives {
  std::size_t gathers = 0, reduce_scatters = 0, all_reduces = 0;
  std::int64_t gathered_bytes = 0, reduced_bytes = 0, all_reduced_bytes = 0;
  std::size_t layer_gathers = 0;  ///< all-gathers of one layer's parameters
};

dp_collectives count(const ls::program& p, std::int64_t layer_gather_bytes) {
  dp_collectives c;
  for (const auto& ci : p.graph.collectives) {
    const bool shard = ci.group.rfind("dp.0.", 0) == 0 || ci.group.rfind("fsdp.shard.0.", 0) == 0;
    const bool replica = ci.group.rfind("fsdp.replica.0.", 0) == 0;
    if (shard && ci.kind == "allgather") {
      ++c.gathers;
      c.gathered_bytes += ci.bytes;
      c.layer_gathers += ci.bytes == layer_gather_bytes;
    } else if (shard && ci.kind == "reduce_scatter") {
      ++c.reduce_scatters;
      c.reduced_bytes += ci.bytes;
    } else if (replica && ci.kind == "allreduce") {
      ++c.all_reduces;
      c.all_reduced_bytes += ci.bytes;
    }
  }
  return c;
}

}  // namespace fsdp_test

TEST_CASE("FSDP: the configuration's rules are clear errors", "[fsdp][model]") {
  using namespace fsdp_test;
  const lm::transformer m = lm::test::small_gpt(4);
  lm::parallel_config p = fsdp_job(1, 1, 8, 8).parallel;
  CHECK_NOTHROW(p.validate(m));
  CHECK(p.sharded_parameters());
  CHECK(p.shard_size() == 8);
  p.hsdp = 4;
  CHECK_NOTHROW(p.validate(m));
  CHECK(p.shard_size() == 4);
  p.hsdp = 3;
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("hsdp (3) must divide dp (8)"));
  p.hsdp = -1;
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("hsdp must be 0"));
  p.hsdp = 2;
  p.fsdp = false;
  p.zero_stage = 1;
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("turn fsdp on"));
  p.hsdp = 0;
  p.fsdp = true;
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("zero_stage 1 contradicts it"));
  // With pipeline parallelism it is a configuration like any other.
  CHECK_NOTHROW(fsdp_job(1, 2, 4, 16).parallel.validate(m));
}

TEST_CASE("FSDP memory: the states shard over the shard group and the gathered units are added", "[fsdp][memory]") {
  using namespace fsdp_test;
  const lm::transformer m = lm::test::small_gpt(4);
  lm::memory_options mo;
  mo.per_param = lm::megatron_state_bytes;
  const auto at = [&](const ls::job& j) { return lm::memory_per_gpu(m, j.parallel, 0, mo); };
  const auto dp4 = at(fsdp_job(1, 1, 4, 8));
  const auto dp8 = at(fsdp_job(1, 1, 8, 8));
  const double n = static_cast<double>(lm::stage_parameters_per_rank(m, fsdp_job(1, 1, 4, 8).parallel, 0));
  CHECK(dp4.parameters == Approx(2 * n / 4));
  CHECK(dp4.gradients == Approx(4 * n / 4));
  CHECK(dp4.optimizer_states == Approx(12 * n / 4));
  CHECK(dp8.model_states() == Approx(dp4.model_states() / 2));
  // The unsharded buffers do not shrink with dp: two units gathered (bf16) and one unit's fp32
  // gradients, the largest unit being the embedding here.
  const lm::fsdp_units u = lm::fsdp_unit_parameters(m, fsdp_job(1, 1, 4, 8).parallel, 0);
  CHECK(u.largest == m.vocab * m.hidden + m.seq * m.hidden);
  CHECK(u.pair == u.largest + lm::layer_parameters_per_rank(m, 1));
  CHECK(dp4.fsdp_buffers == Approx(2.0 * static_cast<double>(u.pair) + 4.0 * static_cast<double>(u.largest)));
  CHECK(dp8.fsdp_buffers == dp4.fsdp_buffers);
  CHECK(dp4.total() == Approx(dp4.model_states() + dp4.activations + dp4.io_activations + dp4.fsdp_buffers));
  // HSDP: the states of a shard group of 4 whatever the replicas.
  const auto hsdp = at(fsdp_job(1, 1, 8, 8, 4));
  CHECK(hsdp.model_states() == Approx(dp4.model_states()));
  // Reshard after forward off keeps every layer gathered from the forward to the backward.
  ls::job keep = fsdp_job(1, 1, 4, 8);
  keep.parallel.reshard_after_forward = false;
  const auto kept = at(keep);
  CHECK(kept.fsdp_buffers == Approx(2.0 * n + 4.0 * static_cast<double>(u.largest)));
  CHECK(kept.total() > dp4.total());
  // Without FSDP (ZeRO-1) no buffers, and the parameters are whole.
  ls::job zero1 = fsdp_job(1, 1, 4, 8);
  zero1.parallel.fsdp = false;
  zero1.parallel.zero_stage = 1;
  const auto z1 = at(zero1);
  CHECK(z1.fsdp_buffers == 0);
  CHECK(z1.parameters == Approx(2 * n));
}

TEST_CASE("FSDP program: one all-gather per unit before forward and backward, one reduce-scatter per unit",
          "[fsdp][synth][program]") {
  using namespace fsdp_test;
  // 4 layers, the embedding and the head: 6 units; dp 4, 2 micro-batches.
  ls::job j = fsdp_job(1, 1, 4, 8);
  const std::int64_t micro = j.parallel.micro_batches();
  const std::int64_t units = j.model.layers + 2;
  const std::int64_t layer = lm::layer_parameters_per_rank(j.model, 1);
  const std::int64_t stage = lm::stage_parameters_per_rank(j.model, j.parallel, 0);
  ls::program_options o;
  for (const auto g : {ls::granularity::pass, ls::granularity::kernel}) {
    o.detail = g;
    const dp_collectives c = count(ls::build_program(j, o), 2 * layer);
    CHECK(c.gathers == static_cast<std::size_t>(2 * units * micro));
    CHECK(c.layer_gathers == static_cast<std::size_t>(2 * j.model.layers * micro));
    CHECK(c.gathered_bytes == 2 * 2 * stage * micro);  // bf16, forward and backward, each micro-batch
    CHECK(c.reduce_scatters == static_cast<std::size_t>(units * micro));
    CHECK(c.reduced_bytes == 4 * stage * micro);  // fp32 gradients, each micro-batch
    CHECK(c.all_reduces == 0);
  }
  // ZeRO-3 without the fsdp flag is the same path.
  ls::job z3 = j;
  z3.parallel.fsdp = false;
  const dp_collectives c3 = count(ls::build_program(z3, o), 2 * layer);
  CHECK(c3.gathers == static_cast<std::size_t>(2 * units * micro));
  CHECK(c3.reduce_scatters == static_cast<std::size_t>(units * micro));

  SECTION("reshard after forward off: no gathers before the backward") {
    j.parallel.reshard_after_forward = false;
    const dp_collectives c = count(ls::build_program(j, o), 2 * layer);
    CHECK(c.gathers == static_cast<std::size_t>(units * micro));
    CHECK(c.reduce_scatters == static_cast<std::size_t>(units * micro));
  }
  SECTION("HSDP: gathers and reduce-scatters over the shard group, one all-reduce per unit over the replicas") {
    ls::job h = fsdp_job(1, 1, 4, 8, 2);
    const dp_collectives c = count(ls::build_program(h, o), 2 * layer);
    CHECK(c.gathers == static_cast<std::size_t>(2 * units * micro));
    CHECK(c.reduce_scatters == static_cast<std::size_t>(units * micro));
    CHECK(c.all_reduces == static_cast<std::size_t>(units));  // after the last micro-batch only
    CHECK(c.all_reduced_bytes == 4 * stage / 2);              // each rank's shard of the fp32 gradients
    for (const auto& ci : ls::build_program(h, o).graph.collectives) {
      if (ci.group.rfind("fsdp.shard.", 0) == 0) CHECK(ci.group_ranks.size() == 2);
      if (ci.group.rfind("fsdp.replica.", 0) == 0) CHECK(ci.group_ranks.size() == 2);
    }
  }
  SECTION("a split backward reduce-scatters after the weight gradients; pipeline stages shard their own units") {
    ls::job zb = fsdp_job(1, 2, 2, 8);
    zb.schedule = ls::policy_of<lumos::pipeline::zero_bubble_h1>();
    const std::int64_t m = zb.parallel.micro_batches();
    const dp_collectives c = count(ls::build_program(zb, o), 2 * layer);
    // Stage 0: 2 layers and the embedding; F and B gather, W does not.
    CHECK(c.gathers == static_cast<std::size_t>(2 * 3 * m));
    CHECK(c.reduce_scatters == static_cast<std::size_t>(3 * m));
  }
}

TEST_CASE("FSDP program: the next unit's all-gather overlaps the current unit's compute", "[fsdp][synth][program]") {
  using namespace fsdp_test;
  ls::job j = fsdp_job(1, 1, 8, 16);
  j.model.seq = 2048;  // compute enough to hide the gathers
  ls::program_options o;
  o.detail = ls::granularity::kernel;
  const ls::program p = ls::build_program(j, o);
  const auto c = lg::compile(p.graph);
  const auto t = lumos::sim::replay(c);
  // Rank 0's compute-stream busy intervals, and its all-gathers' time inside them.
  std::vector<std::pair<lumos::time_ns, lumos::time_ns>> busy;
  std::vector<std::pair<lumos::time_ns, lumos::time_ns>> gathers;
  for (std::uint32_t i = 0; i < c.size(); ++i) {
    const lg::task_id id = c.task[i];
    const auto& proc = p.graph.processors[p.graph.processor[id]];
    if (proc.kind != lg::processor_kind::gpu_stream || p.graph.rank[id] != 0 || c.duration(i) <= 0) continue;
    const std::pair<lumos::time_ns, lumos::time_ns> span{t.start_of(lg::position{i}), t.finish_of(lg::position{i})};
    if (p.graph.kind[id] == lg::task_kind::gpu_compute) busy.push_back(span);
    if (p.graph.kind[id] == lg::task_kind::comm_complete && p.graph.task_name(id) == "param_all_gather") gathers.push_back(span);
  }
  REQUIRE(gathers.size() == static_cast<std::size_t>(2 * (j.model.layers + 2) * j.parallel.micro_batches()));
  lumos::time_ns total = 0, hidden = 0;
  for (const auto& [s, f] : gathers) {
    total += f - s;
    for (const auto& [bs, bf] : busy) hidden += std::max<lumos::time_ns>(0, std::min(f, bf) - std::max(s, bs));
  }
  INFO("gathers " << total << " ns, under compute " << hidden << " ns");
  CHECK(total > 0);
  CHECK(hidden > total / 2);
  // Without the overlap (every gather exposed) the step would be longer by the hidden part.
  const auto r = ls::predict(j);
  CHECK(r.iteration_ns > 0);
}

TEST_CASE("FSDP: folded and unfolded programs predict the same iteration", "[fsdp][synth][program]") {
  using namespace fsdp_test;
  std::vector<ls::job> jobs = {fsdp_job(2, 1, 4, 8), fsdp_job(1, 2, 4, 16), fsdp_job(1, 1, 8, 16, 4)};
  jobs.push_back(fsdp_job(1, 2, 2, 8));
  jobs.back().schedule = ls::policy_of<lumos::pipeline::zero_bubble_h2>();
  jobs.back().parallel.reshard_after_forward = false;
  for (const ls::job& j : jobs) {
    INFO("tp " << j.parallel.tp << " pp " << j.parallel.pp << " dp " << j.parallel.dp << " hsdp " << j.parallel.hsdp);
    for (const auto g : {ls::granularity::pass, ls::granularity::kernel}) {
      ls::predict_options folded, unfolded;
      folded.program.detail = unfolded.program.detail = g;
      unfolded.program.unfold = true;
      CHECK(ls::predict(j, folded).iteration_ns == ls::predict(j, unfolded).iteration_ns);
    }
  }
}

// Sweep API example from the README: the fastest layout of GPT-3 175B on 64 H100s.
#include <lumos/model/profile.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>

#include <cstdio>

int main() {
  namespace sweep = lumos::sweep;
  sweep::problem p;  // GPT-3 175B on H100s, bf16, global batch 1536, ZeRO-1
  p.gpus = 64;
  const auto ev = sweep::make_evaluator(p, lumos::model::profile_preset("h100-sxm"));
  sweep::space s;  // tp x pp (dp = 64 / (tp pp)), micro-batch 1 or 2, recompute full or not
  s.tp = {2, 4, 8};
  s.pp = {4, 8, 16};
  s.micro_batch = {1, 2};
  s.recompute = {lumos::model::recompute_kind::none, lumos::model::recompute_kind::full};
  const auto results = sweep::run(ev, sweep::enumerate(s, p.gpus));  // all cores
  for (const std::size_t i : sweep::top(results, 3)) {
    const sweep::result& r = results[i];
    std::printf("tp %d pp %d dp %d mb %lld recompute %s: %.2f s, MFU %.1f %%, %.1f GiB\n", r.config.tp,
                r.config.pp, r.config.dp, static_cast<long long>(r.config.micro_batch),
                lumos::model::to_string(r.config.recompute).data(), r.m.iteration_ns / 1e9, 100 * r.m.mfu,
                r.memory_bytes / (1 << 30));
  }
  // One configuration, reusing a workspace (one per thread): no simulation if it cannot run.
  sweep::workspace w;
  const sweep::result r = ev.evaluate({.tp = 8, .pp = 4, .dp = 2}, w);
  std::printf("tp 8 pp 4 dp 2: %s\n", r.ok() ? "fits" : r.why().data());
}

// lumos_autotune — the fastest configuration of GPT-3 175B on 1024 H100s within a memory
// budget, found by a random-restart hill climb (autotune.hpp) on the sweep API, against the
// exhaustive sweep of the same space. Usage: lumos_autotune [RESTARTS] [MEMORY_GIB]
#include "autotune.hpp"

#include <lumos/model/profile.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  namespace sweep = lumos::sweep;
  const int restarts = argc > 1 ? std::atoi(argv[1]) : 8;
  const double budget_gib = argc > 2 ? std::atof(argv[2]) : 64;

  sweep::problem p;  // GPT-3 175B, H100, global batch 1536, bf16, ZeRO-1
  p.gpus = 1024;
  // The budget as the memory margin: fit when the largest GPU needs at most budget_gib.
  p.memory_margin = 1.0 - budget_gib * 1073741824.0 / static_cast<double>(p.hardware.gpu.hbm_capacity);
  if (p.memory_margin < 0) p.memory_margin = 0;
  const auto ev = sweep::make_evaluator(p, lumos::model::profile_preset("h100-sxm"));

  sweep::space s;
  s.tp = {1, 2, 4, 8};
  s.pp = {1, 2, 4, 8, 16};
  s.micro_batch = {1, 2};
  s.recompute = {lumos::model::recompute_kind::none, lumos::model::recompute_kind::selective,
                 lumos::model::recompute_kind::full};
  s.sp = {false, true};

  const auto t0 = std::chrono::steady_clock::now();
  const auto found = lumos_autotune::hill_climb(ev, s, {.restarts = restarts, .seed = 1});
  const auto t1 = std::chrono::steady_clock::now();
  const auto all = sweep::run(ev, sweep::enumerate(s, p.gpus));
  const auto t2 = std::chrono::steady_clock::now();
  const auto best = sweep::top(all, 1);

  auto show = [](const char* who, const sweep::result& r) {
    std::printf("%-10s tp %d pp %d dp %d mb %lld recompute %s sp %s: %.3f s, MFU %.1f %%, %.1f GiB per GPU\n", who,
                r.config.tp, r.config.pp, r.config.dp, static_cast<long long>(r.config.micro_batch),
                std::string(lumos::model::to_string(r.config.recompute)).c_str(), r.config.sp ? "on" : "off",
                static_cast<double>(r.m.iteration_ns) / 1e9, 100 * r.m.mfu, r.memory_bytes / 1073741824.0);
  };
  if (found.best) show("autotune", *found.best);
  if (!best.empty()) show("exhaustive", all[best.front()]);
  std::printf("autotune: %zu evaluations in %.2f s; exhaustive: %zu in %.2f s\n", found.evaluations,
              std::chrono::duration<double>(t1 - t0).count(), all.size(), std::chrono::duration<double>(t2 - t1).count());
  const bool same = found.best && !best.empty() && found.best->config == all[best.front()].config;
  std::printf("same optimum: %s\n", same ? "yes" : "no");
  return same ? 0 : 1;
}

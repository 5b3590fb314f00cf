#pragma once
// A random-restart hill climber over a sweep space, built on the sweep API: what an autotuner
// embedding lumos looks like. It evaluates only the configurations its walk visits (each once),
// so on large spaces it needs a fraction of the exhaustive sweep's evaluations.
//
// The search: a configuration is a point of the grid of the space's lists (tp, pp, vp,
// micro-batch, schedule, recompute, sp; dp = GPUs / (tp·pp)). From a random start it moves to
// the fastest accepted neighbour (one list step along one dimension) while that is faster, then
// restarts from another random point; the best accepted point over all walks wins. Rejected
// points (memory above the budget, divisibility) are never moved to. Deterministic for a seed.

#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace lumos_autotune {

struct search_options {
  int restarts = 8;
  std::uint64_t seed = 1;
};

struct search_result {
  std::optional<lumos::sweep::result> best;  ///< empty: no accepted configuration was found
  std::size_t evaluations = 0;               ///< distinct configurations evaluated
};

template <class Evaluator>
search_result hill_climb(const Evaluator& ev, const lumos::sweep::space& s, const search_options& o = {}) {
  using point = std::array<std::size_t, 7>;  // indices into tp, pp, vp, micro_batch, schedules, recompute, sp
  const std::array<std::size_t, 7> size = {s.tp.size(), s.pp.size(), s.vp.size(), s.micro_batch.size(),
                                           s.schedules.size(), s.recompute.size(), s.sp.size()};
  const std::int64_t gpus = ev.fixed().gpus;
  lumos::sweep::workspace w;
  std::map<point, lumos::sweep::result> seen;
  search_result out;

  auto configuration_of = [&](const point& p) -> std::optional<lumos::sweep::configuration> {
    lumos::sweep::configuration c;
    c.tp = s.tp[p[0]];
    c.pp = s.pp[p[1]];
    const std::int64_t tp_pp = std::int64_t{c.tp} * c.pp;
    if (gpus <= 0 || gpus % tp_pp != 0) return std::nullopt;  // not a layout of this machine
    c.dp = static_cast<int>(gpus / tp_pp);
    c.vp = s.vp[p[2]];
    c.micro_batch = s.micro_batch[p[3]];
    c.schedule = s.schedules[p[4]];
    c.recompute = s.recompute[p[5]];
    c.sp = s.sp[p[6]];
    return c;
  };
  // The accepted result at `p`, or nothing (evaluated at most once).
  auto at = [&](const point& p) -> const lumos::sweep::result* {
    if (const auto it = seen.find(p); it != seen.end()) return it->second.ok() ? &it->second : nullptr;
    const auto c = configuration_of(p);
    lumos::sweep::result r;
    if (c) {
      r = ev.evaluate(*c, w);
      ++out.evaluations;
    } else {
      r.reason = lumos::sweep::rejection::gpu_count;
    }
    const auto& stored = seen.emplace(p, r).first->second;
    return stored.ok() ? &stored : nullptr;
  };
  auto better = [](const lumos::sweep::result& a, const lumos::sweep::result& b) {
    return a.m.iteration_ns < b.m.iteration_ns;
  };

  std::mt19937_64 rng(o.seed);
  for (int restart = 0; restart < o.restarts; ++restart) {
    point p{};
    for (std::size_t d = 0; d < p.size(); ++d) p[d] = static_cast<std::size_t>(rng() % size[d]);
    const lumos::sweep::result* here = at(p);
    if (here == nullptr) continue;  // a rejected start: the next restart draws another
    while (true) {
      const lumos::sweep::result* best_next = nullptr;
      point best_point = p;
      for (std::size_t d = 0; d < p.size(); ++d) {
        for (const int step : {-1, +1}) {
          if ((step < 0 && p[d] == 0) || (step > 0 && p[d] + 1 >= size[d])) continue;
          point q = p;
          q[d] = step < 0 ? q[d] - 1 : q[d] + 1;
          const lumos::sweep::result* r = at(q);
          if (r != nullptr && better(*r, best_next != nullptr ? *best_next : *here)) {
            best_next = r;
            best_point = q;
          }
        }
      }
      if (best_next == nullptr) break;  // a local optimum
      p = best_point;
      here = best_next;
    }
    if (!out.best || better(*here, *out.best)) out.best = *here;
  }
  return out;
}

}  // namespace lumos_autotune

#pragma once
// space — the configurations a sweep enumerates: the cartesian product of lists of sizes,
// micro-batches, schedules, recomputation kinds and sp settings, in a fixed order, so that a
// configuration has an index (what threads and MPI ranks split, and what results are sorted by).

#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/sweep/evaluate.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace lumos::sweep {

/// Lists of values per dimension. An empty `dp` list means "whatever makes tp·pp·dp equal the
/// GPU count" (one dp per (tp, pp), when it divides). Every other list must be non-empty.
struct space {
  std::vector<int> tp{1};
  std::vector<int> pp{1};
  std::vector<int> dp;  ///< empty: gpus / (tp·pp)
  std::vector<int> vp{1};
  std::vector<std::int64_t> micro_batch{1};
  std::vector<synth::schedule_policy> schedules{synth::policy_of<pipeline::one_f_one_b>()};
  std::vector<model::recompute_kind> recompute{model::recompute_kind::none};
  std::vector<bool> sp{false};
};

/// The configurations of `s` for `gpus` GPUs (0: no constraint), in order: tp, pp, dp, vp,
/// micro-batch, schedule, recompute, sp — the first varying slowest. Combinations whose sizes do
/// not multiply to `gpus` are left out (they are not configurations of this machine); vp > 1
/// with a schedule that has no chunks, are kept and rejected by `validate` with their reason.
/// sp on with tp = 1 shards nothing (the same job as sp off) and is left out when off is listed.
/// A value listed twice counts once (`--tp 1,1` is the configurations of `--tp 1`, not each
/// of them twice). O(product of the list sizes).
[[nodiscard]] inline std::vector<configuration> enumerate(const space& listed, std::int64_t gpus) {
  auto once = [](const auto& v) {  // first occurrences, in order
    std::remove_cvref_t<decltype(v)> out;
    out.reserve(v.size());
    for (const auto& x : v) {
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    }
    return out;
  };
  const space s{once(listed.tp), once(listed.pp), once(listed.dp), once(listed.vp), once(listed.micro_batch),
                once(listed.schedules), once(listed.recompute), once(listed.sp)};
  std::vector<configuration> out;
  for (const int tp : s.tp) {
    for (const int pp : s.pp) {
      std::vector<int> dps = s.dp;
      if (dps.empty()) {
        const std::int64_t tp_pp = std::int64_t{tp} * pp;
        if (gpus <= 0 || tp_pp <= 0 || gpus % tp_pp != 0) continue;
        dps.push_back(static_cast<int>(gpus / tp_pp));
      }
      for (const int dp : dps) {
        if (gpus > 0 && std::int64_t{tp} * pp * dp != gpus) continue;
        for (const int vp : s.vp) {
          for (const std::int64_t mb : s.micro_batch) {
            for (const synth::schedule_policy& sched : s.schedules) {
              for (const model::recompute_kind rc : s.recompute) {
                for (const bool sp : s.sp) {
                  if (sp && tp == 1 && std::find(s.sp.begin(), s.sp.end(), false) != s.sp.end()) continue;
                  configuration c;
                  c.tp = tp;
                  c.pp = pp;
                  c.dp = dp;
                  c.vp = vp;
                  c.micro_batch = mb;
                  c.schedule = sched;
                  c.recompute = rc;
                  c.sp = sp;
                  out.push_back(c);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

/// Powers of two from 1 to `limit` (inclusive when a power): the default size lists.
[[nodiscard]] inline std::vector<int> powers_of_two(std::int64_t limit) {
  std::vector<int> v;
  for (std::int64_t x = 1; x <= limit && x <= (std::int64_t{1} << 24); x *= 2) v.push_back(static_cast<int>(x));
  return v;
}

}  // namespace lumos::sweep

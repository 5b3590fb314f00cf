#pragma once
// space — the configurations a sweep enumerates: the cartesian product of lists of sizes,
// micro-batches, schedules, recomputation kinds, sp and FSDP settings and precisions, in a
// fixed order, so that a configuration has an index (what threads and MPI ranks split, and
// what results are sorted by).

#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/sweep/evaluate.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lumos::sweep {

/// Lists of values per dimension. An empty `dp` list means "whatever makes tp·pp·cp·dp equal
/// the GPU count" (one dp per (tp, pp, cp), when it divides). Every other list must be non-empty.
struct space {
  std::vector<int> tp{1};
  std::vector<int> pp{1};
  std::vector<int> cp{1};  ///< context-parallel sizes
  std::vector<int> dp;  ///< empty: gpus / (tp·pp·cp)
  std::vector<int> vp{1};
  std::vector<int> ep{1};  ///< expert-parallel sizes (MoE models); ep·etp must divide tp·cp·dp
  int expert_tp = 0;       ///< expert-tensor-parallel size (`parallel_config::etp`; 0 = each configuration's tp)
  std::vector<std::int64_t> micro_batch{1};
  std::vector<synth::schedule_policy> schedules{synth::policy_of<pipeline::one_f_one_b>()};
  std::vector<model::recompute_kind> recompute{model::recompute_kind::none};
  std::vector<bool> sp{false};
  std::vector<bool> fsdp{false};  ///< FSDP off (the problem's ZeRO stage) and/or on
  std::vector<model::precision> precisions{model::precision::bf16};  ///< training precisions
};

/// The configurations of `s` for `gpus` GPUs (0: no constraint), in order: tp, pp, cp, dp, vp,
/// ep, micro-batch, schedule, recompute, sp, fsdp, precision — the first varying slowest (so
/// that one precision enumerates as a space without the dimension). An ep whose
/// expert grid ep·etp does not divide tp·cp·dp is left out (not a layout of these ranks; etp =
/// `expert_tp`, or tp: then ep must divide dp·cp). A cp that does not divide the
/// sequence into 2·cp chunks is kept and rejected by `validate`. Combinations whose sizes do
/// not multiply to `gpus` are left out (they are not configurations of this machine); vp > 1
/// with a schedule that has no chunks, are kept and rejected by `validate` with their reason.
/// sp on with tp = 1 shards nothing (the same job as sp off) and is left out when off is listed.
/// A precision the GPU lacks is kept and rejected by `validate` (`rejection::precision`).
/// A value listed twice counts once (`--tp 1,1` is the configurations of `--tp 1`, not each
/// of them twice). O(product of the list sizes).
[[nodiscard]] inline std::vector<configuration> enumerate(const space& s, std::int64_t gpus) {
  // Whether v[i] is listed before index i too (then it counts once, at its first place).
  auto again = [](const auto& v, std::size_t i) {
    const auto at = v.begin() + static_cast<std::ptrdiff_t>(i);
    return std::find(v.begin(), at, v[i]) != at;
  };
  std::vector<configuration> out;
  for (std::size_t itp = 0; itp < s.tp.size(); ++itp) {
    if (again(s.tp, itp)) continue;
    const int tp = s.tp[itp];
    for (std::size_t ipp = 0; ipp < s.pp.size(); ++ipp) {
      if (again(s.pp, ipp)) continue;
      const int pp = s.pp[ipp];
      for (std::size_t icp = 0; icp < s.cp.size(); ++icp) {
      if (again(s.cp, icp) || s.cp[icp] < 1) continue;
      const int cp = s.cp[icp];
      std::vector<int> dps = s.dp;
      if (dps.empty()) {
        const std::int64_t tp_pp = std::int64_t{tp} * pp * cp;
        if (gpus <= 0 || tp_pp <= 0 || gpus % tp_pp != 0) continue;
        dps.push_back(static_cast<int>(gpus / tp_pp));
      }
      for (std::size_t idp = 0; idp < dps.size(); ++idp) {
        if (again(dps, idp)) continue;
        const int dp = dps[idp];
        if (gpus > 0 && std::int64_t{tp} * pp * cp * dp != gpus) continue;
        for (std::size_t ivp = 0; ivp < s.vp.size(); ++ivp) {
          if (again(s.vp, ivp)) continue;
          for (std::size_t iep = 0; iep < s.ep.size(); ++iep) {
          const std::int64_t etp = s.expert_tp > 0 ? s.expert_tp : tp;
          if (again(s.ep, iep) || s.ep[iep] < 1 || (std::int64_t{tp} * dp * cp) % (s.ep[iep] * etp) != 0) continue;
          for (std::size_t imb = 0; imb < s.micro_batch.size(); ++imb) {
            if (again(s.micro_batch, imb)) continue;
            for (std::size_t isc = 0; isc < s.schedules.size(); ++isc) {
              if (again(s.schedules, isc)) continue;
              for (std::size_t irc = 0; irc < s.recompute.size(); ++irc) {
                if (again(s.recompute, irc)) continue;
                for (std::size_t isp = 0; isp < s.sp.size(); ++isp) {
                  if (again(s.sp, isp)) continue;
                  const bool sp = s.sp[isp];
                  if (sp && tp == 1 && std::find(s.sp.begin(), s.sp.end(), false) != s.sp.end()) continue;
                  for (std::size_t ifs = 0; ifs < s.fsdp.size(); ++ifs) {
                    if (again(s.fsdp, ifs)) continue;
                    for (std::size_t ipr = 0; ipr < s.precisions.size(); ++ipr) {
                      if (again(s.precisions, ipr)) continue;
                      configuration c;
                      c.tp = tp;
                      c.pp = pp;
                      c.dp = dp;
                      c.cp = cp;
                      c.vp = s.vp[ivp];
                      c.ep = s.ep[iep];
                      c.micro_batch = s.micro_batch[imb];
                      c.schedule = s.schedules[isc];
                      c.recompute = s.recompute[irc];
                      c.sp = sp;
                      c.fsdp = s.fsdp[ifs];
                      c.dtype = s.precisions[ipr];
                      out.push_back(c);
                    }
                  }
                }
              }
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

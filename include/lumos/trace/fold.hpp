#pragma once
// Folding identical ranks. The ranks of a data- or tensor-parallel group often run exactly the
// same work at the same times (always in a job `lumos synth --unfold` writes): replaying one of
// them stands for all, as `lumos synth` without `--unfold` writes a job. A what-if that changes
// every rank alike keeps them identical, so it can run on one rank per class: the what-if of a
// 512-rank job then reads 512 traces but rewrites and replays a few.

#include <lumos/trace/data.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::trace {

namespace detail {

[[nodiscard]] constexpr std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
  // splitmix64's finaliser over the running hash: order-sensitive and well spread.
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

[[nodiscard]] inline std::uint64_t hash_text(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

/// Args that only name the rank or its groups: left out of the fingerprint, so that the members
/// of different groups that run the same work fold together.
[[nodiscard]] constexpr bool names_the_rank(arg_key k) noexcept {
  return k == arg_key::process_group_name || k == arg_key::process_group_ranks || k == arg_key::collective_rank ||
         k == arg_key::global_rank_start;
}

/// The members of each process group the ranks' collectives name ("Process Group Ranks").
[[nodiscard]] inline std::set<std::vector<int>> named_groups(const job& j) {
  std::set<std::vector<int>> out;
  for (const rank_trace& t : j.ranks) {
    std::set<string_id> seen;
    for (std::size_t a = 0; a < t.arg_keys.size(); ++a) {
      if (t.arg_keys[a] != arg_key::process_group_ranks) continue;
      const auto id = static_cast<string_id>(t.arg_values[a]);
      if (!seen.insert(id).second) continue;
      std::vector<int> members;
      std::int64_t v = -1;
      for (const char c : t.str(id)) {
        if (c >= '0' && c <= '9') {
          v = (v < 0 ? 0 : v) * 10 + (c - '0');
          if (v >= max_world_size) break;
        } else if (v >= 0) {
          members.push_back(static_cast<int>(v)), v = -1;
        }
      }
      if (v >= 0 && v < max_world_size) members.push_back(static_cast<int>(v));
      std::sort(members.begin(), members.end());
      if (!members.empty()) out.insert(std::move(members));
    }
    for (const process_group_info& pg : t.process_groups) {
      std::vector<int> members = pg.ranks;
      std::sort(members.begin(), members.end());
      if (!members.empty()) out.insert(std::move(members));
    }
  }
  return out;
}

}  // namespace detail

/// A fingerprint of what rank `t` ran: every event's phase, category, name, start and duration
/// (absolute), correlation and external ids, thread or stream (by position: the ids and names
/// name the process), and args, without what only names the rank (its process and thread ids
/// and names, its GPU index, the names and members of its groups, its rank in them). Two ranks with one fingerprint
/// ran the same work at the same times. O(events + args + strings).
[[nodiscard]] inline std::uint64_t work_fingerprint(const rank_trace& t) {
  std::vector<std::uint64_t> text(t.strings.size());
  for (string_id i = 0; i < t.strings.size(); ++i) text[i] = detail::hash_text(t.strings[i]);
  auto str = [&](string_id id) { return id == no_string || id >= text.size() ? std::uint64_t{0} : text[id]; };
  std::uint64_t h = detail::mix(0, t.events.size());
  h = detail::mix(h, t.lanes.size());  // their names carry the rank ("rank 3 stream 7"): not hashed
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    h = detail::mix(h, static_cast<std::uint64_t>(e.ph) << 8 | static_cast<std::uint64_t>(e.cat));
    h = detail::mix(h, str(e.name) ^ (str(e.cat_name) << 1));
    h = detail::mix(h, static_cast<std::uint64_t>(e.ts + t.base_ns));
    h = detail::mix(h, static_cast<std::uint64_t>(e.dur));
    h = detail::mix(h, static_cast<std::uint64_t>(e.correlation) ^ (static_cast<std::uint64_t>(e.external_id) << 32));
    h = detail::mix(h, static_cast<std::uint64_t>(e.lane) << 32 | static_cast<std::uint32_t>(e.stream));
    const auto [b, end] = t.arg_range(i);
    for (std::uint32_t a = b; a < end; ++a) {
      const arg_key k = t.arg_keys[a];
      if (detail::names_the_rank(k)) continue;
      const std::int64_t v = t.arg_values[a];
      h = detail::mix(h, static_cast<std::uint64_t>(k));
      h = detail::mix(h, is_string_arg(k) ? str(static_cast<string_id>(v)) : static_cast<std::uint64_t>(v));
    }
  }
  return h;
}

/// How a job was folded: per kept rank (in `job.ranks` order), the ranks it stands for, itself
/// first. Empty when nothing was folded.
struct rank_folding {
  std::size_t traced = 0;  ///< ranks before folding
  std::vector<std::vector<int>> stands_for;

  [[nodiscard]] bool folded() const noexcept { return !stands_for.empty(); }
};

/// Folds `j` onto one rank per class of identical ranks (`work_fingerprint`): the lowest rank of
/// each class stays and stands for the others, whose traces are dropped. Only when the fold reads
/// as `lumos synth` writes a folded job: every process group the collectives name holds none, one
/// or all of its members among the kept ranks (the world group excepted), so that each collective
/// is either matched as traced or folded onto one participant whose peers are absent. Otherwise,
/// or when no two ranks are identical, `j` stays as it is. Deterministic; O(events).
inline rank_folding fold_identical_ranks(job& j) {
  rank_folding out;
  out.traced = j.ranks.size();
  if (j.ranks.size() < 2) return out;
  std::vector<std::uint64_t> print(j.ranks.size());
  for (std::size_t i = 0; i < j.ranks.size(); ++i) print[i] = work_fingerprint(j.ranks[i]);
  std::unordered_map<std::uint64_t, std::size_t> first;  // fingerprint -> its lowest rank's index
  std::vector<std::size_t> class_of(j.ranks.size());
  for (std::size_t i = 0; i < j.ranks.size(); ++i) class_of[i] = first.emplace(print[i], i).first->second;
  if (first.size() == j.ranks.size()) return out;
  std::set<int> kept;
  for (std::size_t i = 0; i < j.ranks.size(); ++i) {
    if (class_of[i] == i) kept.insert(j.ranks[i].rank);
  }
  const int world = j.ranks.front().world_size.value_or(static_cast<int>(j.ranks.size()));
  for (const std::vector<int>& g : detail::named_groups(j)) {
    const auto in = static_cast<std::size_t>(std::count_if(g.begin(), g.end(), [&](int r) { return kept.count(r) > 0; }));
    if (in > 1 && in != g.size() && static_cast<int>(g.size()) != world) return out;
  }
  std::map<std::size_t, std::vector<int>> members;
  for (std::size_t i = 0; i < j.ranks.size(); ++i) members[class_of[i]].push_back(j.ranks[i].rank);
  std::vector<rank_trace> ranks;
  ranks.reserve(members.size());
  for (auto& [i, m] : members) {
    ranks.push_back(std::move(j.ranks[i]));
    out.stands_for.push_back(std::move(m));
  }
  j.ranks = std::move(ranks);
  return out;
}

}  // namespace lumos::trace

#pragma once
// The rows of a what-if's replays, one per rank of the target job, for its views (`lumos whatif`'s
// table and its --json): a replay made with identical ranks folded (trace/fold.hpp) or with
// pipeline stages added (whatif/pipeline_change.hpp) has fewer ranks than the job it stands for.

#include <lumos/report/replay_report.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/whatif/stage_split.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace lumos::report {

/// One (rank number, replayed rank) pair per rank the replay `s` stands for. With identical
/// ranks folded, every traced rank a kept one stood for gets the kept one's row, in rank order.
/// A rank that a pipeline split added (`stages`, or null) copies a kept traced rank r; the ranks
/// it stands for are the copies of r's class, as far from it as their traced ranks are from r.
/// O(rows · log rows).
[[nodiscard]] inline std::vector<std::pair<int, const rank_replay*>> whatif_rank_rows(const replay_session& s, const trace::rank_folding& folding,
                                                                                      const trace::job& job, const whatif::stage_split* stages) {
  std::map<int, const std::vector<int>*> members;
  for (const auto& ranks : folding.stands_for) members[ranks.front()] = &ranks;
  const std::size_t added = stages != nullptr ? stages->traced_index.size() : 0;
  const std::size_t traced_kept = s.ranks.size() - std::min(added, s.ranks.size());
  std::vector<std::pair<int, const rank_replay*>> rows;
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const rank_replay& r = s.ranks[i];
    const int source = i < traced_kept ? r.rank : job.ranks[stages->traced_index[i - traced_kept]].rank;
    const auto it = members.find(source);
    if (it == members.end()) {
      rows.emplace_back(r.rank, &r);
      continue;
    }
    for (const int k : *it->second) rows.emplace_back(r.rank - source + k, &r);
  }
  if (folding.folded()) std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return rows;
}

}  // namespace lumos::report

#pragma once
// What a what-if cannot move: the overheads the graph keeps from the trace (docs/replay.md, "Delays"),
// summed by kind over one rank's iteration, with the largest of them (`lumos replay --explain`,
// the `frozen` section of `--json`).

#include <lumos/core/parallel.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/report/iteration.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

namespace lumos::report {

/// The kept overheads of one rank's iteration.
struct frozen_report {
  /// Sum per `graph::overhead_kind` over the tasks of the window. Overheads on different
  /// processors overlap in time, so the sums are not a partition of the window.
  std::array<time_ns, graph::overhead_kind_count> by_kind{};
  std::vector<graph::kept_delay> largest;  ///< the largest kept delays, longest first
  [[nodiscard]] time_ns total() const noexcept {
    time_ns t = 0;
    for (const time_ns v : by_kind) t += v;
    return t;
  }
};

/// The kept overheads of every rank's iteration (same order as `plans` and `windows`, the
/// measured windows); `top` largest each. A kept delay lies right before its task's measured
/// start; only its part inside the window counts. O(kept + tasks of the plans · log).
[[nodiscard]] inline std::vector<frozen_report> frozen_overheads(const graph::built_job& b, const std::vector<iteration_plan>& plans,
                                                                 const std::vector<interval>& windows, std::size_t top = 10) {
  std::vector<frozen_report> out(plans.size());
  const graph::task_graph& g = b.graph;
  // Each plan's tasks, sorted: ranks in parallel (a 512-rank job's plans hold 15 M tasks).
  std::vector<std::vector<graph::task_id>> members(plans.size());
  parallel_for(plans.size(), hardware_threads(), [&](std::size_t i) {
    members[i].reserve(plans[i].cpu.size() + plans[i].gpu.size());
    members[i].assign(plans[i].cpu.begin(), plans[i].cpu.end());
    members[i].insert(members[i].end(), plans[i].gpu.begin(), plans[i].gpu.end());
    std::sort(members[i].begin(), members[i].end());
  });
  std::vector<int> plan_of_rank;  // rank number → plan index (ranks are validated small on load)
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const int r = plans[i].rank;
    if (r < 0) continue;
    if (static_cast<std::size_t>(r) >= plan_of_rank.size()) plan_of_rank.resize(static_cast<std::size_t>(r) + 1, -1);
    plan_of_rank[static_cast<std::size_t>(r)] = static_cast<int>(i);
  }
  for (const graph::kept_delay& k : b.kept) {
    const int r = g.rank[k.task];
    if (r < 0 || static_cast<std::size_t>(r) >= plan_of_rank.size() || plan_of_rank[static_cast<std::size_t>(r)] < 0) continue;
    const auto i = static_cast<std::size_t>(plan_of_rank[static_cast<std::size_t>(r)]);
    if (!std::binary_search(members[i].begin(), members[i].end(), k.task)) continue;
    const time_ns at = k.at;
    const time_ns inside = std::min(at, windows[i].end) - std::max(at - k.amount, windows[i].begin);
    if (inside <= 0) continue;
    out[i].by_kind[static_cast<std::size_t>(k.kind)] += inside;
    out[i].largest.push_back({k.task, k.kind, inside, at});
  }
  for (auto& f : out) {
    auto longer = [](const graph::kept_delay& x, const graph::kept_delay& y) {
      return x.amount != y.amount ? x.amount > y.amount : x.task < y.task;
    };
    const std::size_t keep = std::min(top, f.largest.size());
    std::partial_sort(f.largest.begin(), f.largest.begin() + static_cast<std::ptrdiff_t>(keep), f.largest.end(), longer);
    f.largest.resize(keep);
  }
  return out;
}

}  // namespace lumos::report

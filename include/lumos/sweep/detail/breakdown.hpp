#pragma once
// The 4-way breakdown of report::compute_breakdown over caller-owned interval buffers: the same
// clip, sort and merge, in place, so that a sweep's evaluation allocates nothing once the buffers
// are large enough. Equal to report::compute_breakdown (tests/sweep).

#include <lumos/report/breakdown.hpp>

#include <algorithm>
#include <vector>

namespace lumos::sweep::detail {

// Clips `v` to `w`, sorts and merges it in place into disjoint intervals.
inline void merge_in_place(std::vector<report::interval>& v, report::interval w) {
  for (auto& i : v) {
    i.begin = std::max(i.begin, w.begin);
    i.end = std::min(i.end, w.end);
  }
  std::erase_if(v, [](const report::interval& i) { return i.end <= i.begin; });
  std::sort(v.begin(), v.end(), [](const report::interval& a, const report::interval& b) { return a.begin < b.begin; });
  std::size_t out = 0;
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (out > 0 && v[k].begin <= v[out - 1].end) {
      v[out - 1].end = std::max(v[out - 1].end, v[k].end);
    } else {
      v[out++] = v[k];
    }
  }
  v.resize(out);
}

/// report::compute_breakdown(compute, comm, window), consuming the two buffers.
[[nodiscard]] inline report::breakdown breakdown_in_place(std::vector<report::interval>& compute,
                                                          std::vector<report::interval>& comm, report::interval window) {
  merge_in_place(compute, window);
  merge_in_place(comm, window);
  const time_ns both = report::detail::overlap(compute, comm);
  report::breakdown b;
  b.overlapped = both;
  b.exposed_compute = report::detail::total_length(compute) - both;
  b.exposed_comm = report::detail::total_length(comm) - both;
  b.other = window.length() - b.exposed_compute - b.exposed_comm - both;
  return b;
}

}  // namespace lumos::sweep::detail

#pragma once
// Sorting sequences that are already nearly in order: a trace lane whose step annotation was
// written last, the intervals of a rank gathered stream by stream. std::sort ignores the order
// it is given; merging the sorted runs costs O(n log runs).

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <vector>

namespace lumos {

/// Sorts [first, last) by `less` (a strict weak order), stably: splits the range into its
/// maximal sorted runs and merges them pairwise, bottom-up. Linear on sorted input, n log r on
/// r runs; a range of many short runs (more than one per 16 elements) is sorted by
/// std::stable_sort instead, which is then as fast.
template <std::random_access_iterator It, class Less>
void sort_runs(It first, It last, Less less) {
  const auto n = static_cast<std::size_t>(last - first);
  std::vector<It> bounds{first};  // run starts, then `last`
  for (It i = first; i != last;) {
    i = std::is_sorted_until(i, last, less);
    bounds.push_back(i);
    if (bounds.size() > n / 16 + 2) {
      std::stable_sort(first, last, less);
      return;
    }
  }
  while (bounds.size() > 2) {
    const std::size_t runs = bounds.size() - 1;
    std::vector<It> next{bounds[0]};
    next.reserve(runs / 2 + 2);
    for (std::size_t k = 0; k + 2 <= runs; k += 2) {
      std::inplace_merge(bounds[k], bounds[k + 1], bounds[k + 2], less);
      next.push_back(bounds[k + 2]);
    }
    if (runs % 2 == 1) next.push_back(bounds[runs]);
    bounds = std::move(next);
  }
}

}  // namespace lumos

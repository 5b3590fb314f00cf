#pragma once
// The 4-way breakdown and SM utilisation (docs/replay.md, "Metrics"), computed the same way for measured and
// simulated timelines: from the GPU op intervals of one rank inside its iteration window.

#include <lumos/core/time.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lumos::report {

/// A half-open time interval [begin, end), ns.
struct interval {
  time_ns begin = 0;
  time_ns end = 0;
  [[nodiscard]] constexpr time_ns length() const noexcept { return end > begin ? end - begin : 0; }
};

/// Time of the window in each state. The four add up to the window length.
struct breakdown {
  time_ns exposed_compute = 0;  ///< a compute op active, no communication
  time_ns overlapped = 0;       ///< both active
  time_ns exposed_comm = 0;     ///< communication active, no compute
  time_ns other = 0;            ///< nothing active (idle)
  /// The part of `exposed_comm` in which communication ops only wait for their peers (from a
  /// participant's arrival to the start of the transfer): a wait, not communication time.
  time_ns exposed_comm_wait = 0;
  [[nodiscard]] constexpr time_ns total() const noexcept { return exposed_compute + overlapped + exposed_comm + other; }
};

namespace detail {

// Sorts `v` by begin without allocating once `scratch` has v's size: a sorted `v` is left as it
// is; up to 64 sorted runs (a rank's intervals gathered stream by stream) are merged pairwise
// through `scratch`, O(n log runs); more runs go to std::sort. Not stable: equal begins may
// swap, which no union of the intervals can tell.
inline void sort_by_begin(std::vector<interval>& v, std::vector<interval>& scratch) {
  const auto earlier = [](const interval& a, const interval& b) { return a.begin < b.begin; };
  constexpr std::size_t max_runs = 64;
  std::array<std::size_t, max_runs + 1> bounds{};  // run starts, then v.size()
  std::size_t runs = 0;
  for (std::size_t i = 0; i < v.size();) {
    if (runs == max_runs) {
      std::sort(v.begin(), v.end(), earlier);
      return;
    }
    bounds[runs++] = i;
    i = static_cast<std::size_t>(std::is_sorted_until(v.begin() + static_cast<std::ptrdiff_t>(i), v.end(), earlier) - v.begin());
  }
  if (runs <= 1) return;
  bounds[runs] = v.size();
  scratch.resize(v.size());
  std::vector<interval>* from = &v;
  std::vector<interval>* to = &scratch;
  while (runs > 1) {
    std::size_t out = 0;
    for (std::size_t k = 0; k < runs; k += 2) {
      const auto at = [&](std::size_t b) { return from->begin() + static_cast<std::ptrdiff_t>(bounds[b]); };
      const std::size_t end = std::min(k + 2, runs);
      std::merge(at(k), at(std::min(k + 1, runs)), at(std::min(k + 1, runs)), at(end), to->begin() + static_cast<std::ptrdiff_t>(bounds[k]), earlier);
      bounds[out++] = bounds[k];
    }
    bounds[out] = v.size();
    runs = out;
    std::swap(from, to);
  }
  if (from != &v) std::copy(from->begin(), from->end(), v.begin());
}

// Clips `v` to the window, sorts and merges it in place: the union of `v` inside `w` as
// disjoint intervals in ascending order. No allocation once `scratch` has v's size.
inline void merge_in_place(std::vector<interval>& v, interval w, std::vector<interval>& scratch) {
  for (auto& i : v) {
    i.begin = std::max(i.begin, w.begin);
    i.end = std::min(i.end, w.end);
  }
  std::erase_if(v, [](const interval& i) { return i.end <= i.begin; });
  sort_by_begin(v, scratch);
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

// `merge_in_place` on a copy.
inline std::vector<interval> merged(std::vector<interval> v, interval w) {
  std::vector<interval> scratch;
  merge_in_place(v, w, scratch);
  return v;
}

// The union of two sorted disjoint lists (from `merged`), as `merged` of both together would
// give it: a linear pass instead of sorting the two again.
inline std::vector<interval> united(const std::vector<interval>& a, const std::vector<interval>& b) {
  std::vector<interval> out;
  out.reserve(a.size() + b.size());
  std::size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const interval& x = j == b.size() || (i < a.size() && a[i].begin <= b[j].begin) ? a[i++] : b[j++];
    if (!out.empty() && x.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, x.end);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

inline time_ns total_length(const std::vector<interval>& v) {
  time_ns t = 0;
  for (const auto& i : v) t += i.length();
  return t;
}

// Length of the intersection of two sorted disjoint interval lists (two-pointer sweep).
inline time_ns overlap(const std::vector<interval>& a, const std::vector<interval>& b) {
  time_ns t = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const time_ns lo = std::max(a[i].begin, b[j].begin);
    const time_ns hi = std::min(a[i].end, b[j].end);
    if (hi > lo) t += hi - lo;
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return t;
}

}  // namespace detail

namespace detail {

// The breakdown from the merged lists (`merged`) of compute, communication, peer waits and
// compute or transfer (`busy`).
[[nodiscard]] inline breakdown breakdown_of(const std::vector<interval>& c, const std::vector<interval>& m, interval window) {
  const time_ns both = overlap(c, m);
  breakdown b;
  b.overlapped = both;
  b.exposed_compute = total_length(c) - both;
  b.exposed_comm = total_length(m) - both;
  b.other = window.length() - b.exposed_compute - b.exposed_comm - both;
  return b;
}
[[nodiscard]] inline breakdown breakdown_of(const std::vector<interval>& c, const std::vector<interval>& m,
                                            const std::vector<interval>& waits, const std::vector<interval>& busy, interval window) {
  breakdown b = breakdown_of(c, m, window);
  b.exposed_comm_wait = total_length(waits) - overlap(waits, busy);
  return b;
}

// comm minus waits, per op: [wait end, op end).
[[nodiscard]] inline std::vector<interval> transfers_of(const std::vector<interval>& comm, const std::vector<interval>& waits) {
  std::vector<interval> transfers;
  transfers.reserve(comm.size());
  for (std::size_t i = 0; i < comm.size() && i < waits.size(); ++i) transfers.push_back({waits[i].end, comm[i].end});
  return transfers;
}

}  // namespace detail

/// Breakdown of `window` given the intervals of compute ops and of communication ops (any
/// order, may overlap each other or the window's edges), in the caller's buffers: `compute`
/// and `comm` are left as their unions inside the window (sorted, disjoint), and `scratch` is
/// working memory. No allocation once `scratch` is as large as the larger list (a sweep
/// computes one breakdown after another). O(n log r) for lists of r sorted runs, O(n log n) at
/// worst.
[[nodiscard]] inline breakdown compute_breakdown_into(std::vector<interval>& compute, std::vector<interval>& comm,
                                                      interval window, std::vector<interval>& scratch) {
  detail::merge_in_place(compute, window, scratch);
  detail::merge_in_place(comm, window, scratch);
  return detail::breakdown_of(compute, comm, window);
}

/// `compute_breakdown_into` on copies of the lists.
[[nodiscard]] inline breakdown compute_breakdown(std::vector<interval> compute, std::vector<interval> comm,
                                                 interval window) {
  std::vector<interval> scratch;
  return compute_breakdown_into(compute, comm, window, scratch);
}

namespace detail {

// The breakdown with peer waits (below), and the union of compute and communication inside the
// window (what SM utilisation reads): each list sorted once, the unions merges of sorted lists.
struct window_split {
  breakdown split;
  std::vector<interval> busy;
};
[[nodiscard]] inline window_split split_window(std::vector<interval> compute, std::vector<interval> comm,
                                               std::vector<interval> waits, interval window) {
  const auto transfers = merged(transfers_of(comm, waits), window);
  const auto c = merged(std::move(compute), window);
  const auto m = merged(std::move(comm), window);
  return {breakdown_of(c, m, merged(std::move(waits), window), united(c, transfers), window), united(c, m)};
}

}  // namespace detail

/// As above, with the peer-wait part of each communication op (`waits`, a sub-interval of
/// its op): `exposed_comm_wait` is the time in which some op waits and no compute op and no
/// transfer is active.
[[nodiscard]] inline breakdown compute_breakdown(std::vector<interval> compute, std::vector<interval> comm,
                                                 std::vector<interval> waits, interval window) {
  return detail::split_window(std::move(compute), std::move(comm), std::move(waits), window).split;
}

/// SM utilisation as Lumos defines it: for each bucket (1 ms by default) of the window, the
/// fraction of it during which at least one GPU op is active; `mean` is the fraction of the
/// whole window. A window of more than `max_utilization_buckets` buckets (over a minute at
/// 1 ms) takes a multiple of the bucket that makes it that many, so that a long window (a
/// what-if of a huge model: hours) does not make a series of billions.
struct utilization {
  time_ns bucket = 1'000'000;
  std::vector<double> series;
  double mean = 0.0;
};

inline constexpr time_ns max_utilization_buckets = time_ns{1} << 16;

namespace detail {

// SM utilisation from the merged list (`merged`) of the GPU ops' intervals.
[[nodiscard]] inline utilization utilization_of(const std::vector<interval>& busy, interval window, time_ns bucket = 1'000'000) {
  utilization u;
  const time_ns length = window.length();
  if (bucket > 0 && length / bucket >= max_utilization_buckets) {
    const time_ns per = (length + max_utilization_buckets * bucket - 1) / (max_utilization_buckets * bucket);
    bucket *= per;
  }
  u.bucket = bucket;
  if (length <= 0 || bucket <= 0) return u;
  u.mean = static_cast<double>(detail::total_length(busy)) / static_cast<double>(length);
  const auto buckets = static_cast<std::size_t>((length + bucket - 1) / bucket);
  std::vector<time_ns> active(buckets, 0);
  for (const auto& i : busy) {
    for (time_ns t = i.begin; t < i.end;) {
      const auto k = static_cast<std::size_t>((t - window.begin) / bucket);
      const time_ns bucket_end = window.begin + static_cast<time_ns>(k + 1) * bucket;
      const time_ns stop = std::min(i.end, bucket_end);
      active[k] += stop - t;
      t = stop;
    }
  }
  u.series.resize(buckets);
  for (std::size_t k = 0; k < buckets; ++k) {
    const time_ns bucket_begin = window.begin + static_cast<time_ns>(k) * bucket;
    const time_ns size = std::min(bucket, window.end - bucket_begin);
    u.series[k] = static_cast<double>(active[k]) / static_cast<double>(size);
  }
  return u;
}

}  // namespace detail

[[nodiscard]] inline utilization sm_utilization(std::vector<interval> ops, interval window,
                                               time_ns bucket = 1'000'000) {
  return detail::utilization_of(detail::merged(std::move(ops), window), window, bucket);
}

}  // namespace lumos::report

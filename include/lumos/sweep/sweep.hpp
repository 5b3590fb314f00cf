#pragma once
// sweep — evaluate a list of configurations on several threads (and, split by rank, on several
// processes), rank the accepted ones and count the rejected ones per reason.
//
// Determinism: result k is the evaluation of configuration k whatever thread computed it, and
// an evaluation depends only on its configuration (a workspace carries capacity, not state), so
// the results and their order are the same for any thread count and any split across ranks.

#include <lumos/sweep/evaluate.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace lumos::sweep {

/// How `run` splits and reports its work.
struct run_options {
  unsigned threads = 0;  ///< 0: std::thread::hardware_concurrency()
  /// This process's share of the space: blocks of `block` consecutive configurations dealt
  /// round-robin to `ranks` processes (static block-cyclic; neighbours in the enumeration have
  /// similar sizes, so the blocks balance). `rank` evaluates the blocks b with b % ranks == rank.
  int rank = 0;
  int ranks = 1;
  std::size_t block = 16;
  bool simulate = true;  ///< false: `validate` only (no prediction)
  /// Called on the calling thread about every `progress_interval` with (done, total) of this
  /// process's share, and once at the end; empty: no reports.
  std::function<void(std::size_t, std::size_t)> progress{};
  std::chrono::milliseconds progress_interval{200};
};

/// Indices of `n` configurations that rank `rank` of `ranks` evaluates (ascending).
[[nodiscard]] inline std::vector<std::size_t> owned_indices(std::size_t n, int rank, int ranks, std::size_t block) {
  std::vector<std::size_t> out;
  if (ranks <= 1) {
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  block = std::max<std::size_t>(block, 1);
  for (std::size_t b = static_cast<std::size_t>(rank); b * block < n; b += static_cast<std::size_t>(ranks)) {
    for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) out.push_back(i);
  }
  return out;
}

/// Evaluates this rank's share of `configs` (all of them when `ranks` is 1) on `threads`
/// threads, one workspace each, and returns the results in the order of `owned_indices`.
/// Threads take the next configuration from a shared counter (dynamic: sizes differ by 100x).
/// The evaluator is shared read-only.
template <class Compute, class Comm>
[[nodiscard]] std::vector<result> run(const evaluator<Compute, Comm>& ev, const std::vector<configuration>& configs,
                                      const run_options& o = {}) {
  const std::vector<std::size_t> mine = owned_indices(configs.size(), o.rank, o.ranks, o.block);
  std::vector<result> out(mine.size());
  unsigned threads = o.threads != 0 ? o.threads : std::max(1U, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(mine.size(), 1)));
  std::atomic<std::size_t> next{0}, done{0};
  auto work = [&] {
    workspace w;
    for (std::size_t k = next.fetch_add(1, std::memory_order_relaxed); k < mine.size();
         k = next.fetch_add(1, std::memory_order_relaxed)) {
      const configuration& c = configs[mine[k]];
      out[k] = o.simulate ? ev.evaluate(c, w) : ev.validate(c, w);
      done.fetch_add(1, std::memory_order_release);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  if (o.progress) {
    // The caller's thread reports and does not evaluate, unless it is the only thread.
    if (threads == 1) {
      std::thread single(work);
      while (done.load(std::memory_order_acquire) < mine.size()) {
        o.progress(done.load(std::memory_order_acquire), mine.size());
        std::this_thread::sleep_for(o.progress_interval);
      }
      single.join();
    } else {
      std::thread last(work);
      while (done.load(std::memory_order_acquire) < mine.size()) {
        o.progress(done.load(std::memory_order_acquire), mine.size());
        std::this_thread::sleep_for(o.progress_interval);
      }
      last.join();
    }
    o.progress(mine.size(), mine.size());
  } else {
    work();
  }
  for (auto& t : pool) t.join();
  return out;
}

/// Indices into `results` of the `k` fastest accepted configurations, by iteration time then
/// by index (a total order: ties never depend on threads).
[[nodiscard]] inline std::vector<std::size_t> top(const std::vector<result>& results, std::size_t k) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok() && results[i].predicted) idx.push_back(i);
  }
  const auto faster = [&](std::size_t a, std::size_t b) {
    if (results[a].m.iteration_ns != results[b].m.iteration_ns) return results[a].m.iteration_ns < results[b].m.iteration_ns;
    return a < b;
  };
  const std::size_t keep = std::min(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep), idx.end(), faster);
  idx.resize(keep);
  return idx;
}

/// Indices into `results` of the Pareto front of iteration time against memory per GPU: the
/// accepted, predicted configurations that no other one dominates (another dominates when it is
/// at most as slow and at most as large, and strictly better in one of the two; two with the
/// same time and memory are both on the front). Ordered by memory, then time, then index.
/// O(n log n) in the number of results.
[[nodiscard]] inline std::vector<std::size_t> pareto_front(const std::vector<result>& results) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok() && results[i].predicted) idx.push_back(i);
  }
  const auto before = [&](std::size_t a, std::size_t b) {
    const result& x = results[a];
    const result& y = results[b];
    if (x.memory_bytes != y.memory_bytes) return x.memory_bytes < y.memory_bytes;
    if (x.m.iteration_ns != y.m.iteration_ns) return x.m.iteration_ns < y.m.iteration_ns;
    return a < b;
  };
  std::sort(idx.begin(), idx.end(), before);
  std::vector<std::size_t> front;
  // The fastest time among strictly smaller memories; within one memory, only the group's
  // fastest can survive, and only when it beats every smaller memory.
  time_ns best = std::numeric_limits<time_ns>::max();
  for (std::size_t g = 0; g < idx.size();) {
    const double memory = results[idx[g]].memory_bytes;
    const time_ns fastest = results[idx[g]].m.iteration_ns;
    std::size_t e = g;
    for (; e < idx.size() && results[idx[e]].memory_bytes == memory; ++e) {
      if (fastest < best && results[idx[e]].m.iteration_ns == fastest) front.push_back(idx[e]);
    }
    best = std::min(best, fastest);
    g = e;
  }
  return front;
}

/// The precisions of `results`' configurations, each once, in the order of their first
/// result (a sweep's listed precisions, as `enumerate` varies them fastest). O(results).
[[nodiscard]] inline std::vector<model::precision> precisions(const std::vector<result>& results) {
  std::vector<model::precision> out;
  for (const result& r : results) {
    if (std::find(out.begin(), out.end(), r.config.dtype) == out.end()) out.push_back(r.config.dtype);
  }
  return out;
}

/// The names of `ps` ("bf16", "fp8") joined by `separator`.
[[nodiscard]] inline std::string precision_names(const std::vector<model::precision>& ps, std::string_view separator) {
  std::string out;
  for (const model::precision p : ps) {
    if (!out.empty()) out += separator;
    out += model::to_string(p);
  }
  return out;
}

/// Count of results per reason, indexed by `static_cast<std::size_t>(rejection)`.
[[nodiscard]] inline std::array<std::size_t, all_rejections.size()> count_reasons(const std::vector<result>& results) {
  std::array<std::size_t, all_rejections.size()> n{};
  for (const result& r : results) ++n[static_cast<std::size_t>(r.reason)];
  return n;
}

}  // namespace lumos::sweep

#pragma once
// The trace data model without loading: what the graph builder, the reports and the rewrites
// read. Loading (JSON, gzip) lives in trace/reader.hpp and trace/job.hpp, which lumos::core does
// not depend on; a job can also be filled in memory, e.g. by a test or an embedding tool.

#include <lumos/trace/event.hpp>

#include <cstddef>
#include <vector>

namespace lumos::trace {

/// All ranks of one job, sorted by rank.
struct job {
  std::vector<rank_trace> ranks;

  [[nodiscard]] const rank_trace* find(int rank) const noexcept {
    for (const auto& r : ranks) {
      if (r.rank == rank) return &r;
    }
    return nullptr;
  }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& r : ranks) total += r.memory_bytes();
    return total;
  }
  /// Frees every rank's events and their args, keeping the rest (files, rank numbers, strings,
  /// lanes, process groups): for a caller done with the events, e.g. once a graph is built
  /// (`report::replay_options::release_events` frees them rank by rank during the build). Events
  /// are most of a job's memory.
  void drop_events() noexcept {
    for (auto& r : ranks) r.drop_events();
  }
};

}  // namespace lumos::trace

#pragma once
// Structure facet: the forward, backward and optimizer phases of each rank's iteration.

#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

namespace lumos::whatif {

/// Fills each rank's `phases`: for forward, backward and optimizer in that order, the span and
/// count of the GPU ops launched in it, and the annotations or ops that marked it (at most
/// three named). A phase with no launch is left out. Runs after `discover_iteration`. Linear in
/// launches.
inline void discover_phases(const discovery_inputs& in, job_structure& out) {
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const trace::rank_trace& t = in.job.ranks[ri];
    const time_ns offset = in.built.ranks[ri].offset;
    const detail::rank_work& w = in.ranks[ri];
    for (const phase_kind k : {phase_kind::forward, phase_kind::backward, phase_kind::optimizer}) {
      phase_span span;
      span.kind = k;
      span.start = std::numeric_limits<time_ns>::max();
      span.end = std::numeric_limits<time_ns>::min();
      for (const auto& l : w.launches) {
        if (l.phase != k) continue;
        ++span.gpu_ops;
        span.start = std::min(span.start, l.enqueue + offset);
        span.end = std::max(span.end, t.events[l.op].end() + offset);
      }
      if (span.gpu_ops == 0) continue;
      const auto found = w.markers.find(k);
      const std::size_t count = found == w.markers.end() ? 0 : found->second.size();
      span.marked = count > 0;
      if (count == 0) {
        span.source = "launches under no forward/backward/optimizer annotation or op";
      } else {
        span.source = "launches under ";
        std::size_t n = 0;
        for (const auto& nm : found->second) {
          if (n++ == 3) {
            span.source += ", ... (" + std::to_string(count) + " names)";
            break;
          }
          span.source += (n > 1 ? ", '" : "'") + nm.substr(0, 60) + "'";
        }
      }
      out.ranks[ri].phases.push_back(std::move(span));
    }
  }
}

}  // namespace lumos::whatif

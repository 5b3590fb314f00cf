#pragma once
// Structure facet: the iteration each rank's facts are read from (see inputs.hpp for how its
// window is chosen).

#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <cstddef>

namespace lumos::whatif {

/// Starts `out`: one `rank_structure` per rank of the job, with its rank number, the iteration
/// (the ProfilerStep#N annotation, or the whole trace window) and its span in job time. The
/// first facet; every other one fills the ranks it sizes. Linear in ranks.
inline void discover_iteration(const discovery_inputs& in, job_structure& out) {
  out.ranks.resize(in.rank_count());
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    rank_structure& rs = out.ranks[ri];
    const detail::rank_work& w = in.ranks[ri];
    rs.rank = in.job.ranks[ri].rank;
    rs.iteration = w.iteration;
    rs.iteration_start = w.iteration_start;
    rs.iteration_end = w.iteration_end;
  }
}

}  // namespace lumos::whatif

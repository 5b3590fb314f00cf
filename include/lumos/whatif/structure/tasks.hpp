#pragma once
// Structure facet: what the what-if rewrites act on — the graph tasks of each layer of each
// pass, and the launch context of every GPU op of the iteration.

#include <lumos/graph/task_graph.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// Fills `out.layer_groups`: per rank, per pass in order, per layer in increasing order, the
/// launch calls, arrive tasks and complete tasks of the launches in that layer, sorted, each
/// once. Runs after `discover_layers` and `discover_schedule` (which gives each pass its op).
/// O(launches log launches).
inline void discover_layer_tasks(const discovery_inputs& in, job_structure& out) {
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const auto& map = in.built.ranks[ri];
    const auto& rs = out.ranks[ri];
    const detail::rank_work& w = in.ranks[ri];
    for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
      std::map<int, std::vector<graph::task_id>> by_layer;
      for (const std::size_t li : w.pass_launches[pi]) {
        const auto& l = w.launches[li];
        if (l.layer < 0) continue;
        auto& v = by_layer[l.layer];
        auto add = [&](const std::vector<graph::task_id>& m, std::uint32_t e) {
          if (e != detail::no_event && e < m.size() && m[e] != graph::no_task) v.push_back(m[e]);
        };
        add(map.task_of_event, l.call);
        add(map.arrive_of_event, l.op);
        add(map.task_of_event, l.op);
      }
      for (auto& [layer, tasks] : by_layer) {
        std::sort(tasks.begin(), tasks.end());  // a call that launched several ops appears once
        tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
        out.layer_groups.push_back({rs.rank, layer, rs.passes[pi].op, std::move(tasks)});
      }
    }
  }
}

/// Fills `out.gpu_ops`: every GPU op launched in the iteration, per rank in launch order, with
/// its phase, pass, layer and enclosing operators. Runs after `discover_layers`. Linear in
/// launches.
inline void discover_gpu_ops(const discovery_inputs& in, job_structure& out) {
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    for (const auto& l : in.ranks[ri].launches) {
      out.gpu_ops.push_back({ri, l.op, l.shape_op, l.cpu_op, l.phase, l.pass, l.layer, l.comm, l.p2p, l.inner_op});
    }
  }
}

}  // namespace lumos::whatif

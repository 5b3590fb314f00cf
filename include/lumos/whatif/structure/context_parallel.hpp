#pragma once
// Structure facet: context parallelism. The groups with the CP role (their description names
// context parallelism, or their send/recv run inside the layers' attention: discover_groups),
// their size, how they exchange keys and values (ring send/recv or all-gather) and how many
// exchange kernels a layer of a forward pass launches.

#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace lumos::whatif {

/// Fills `out.cp` from the groups of role CP (`discover_groups` runs first): the size of the
/// first, its exchange (`p2p` when its collectives are send/recv, `allgather` otherwise) and the
/// exchange kernels per layer of the first forward pass with layers of the first rank that runs
/// them. Leaves every fact unknown when no group has the role. Linear in launches.
inline void discover_context_parallel(const discovery_inputs& in, job_structure& out) {
  cp_structure& cp = out.cp;
  std::string why;
  for (const process_group& pg : out.groups) {
    for (const auto& role : pg.roles) {
      if (role.value != group_role::cp) continue;
      cp.groups.push_back(pg.name);
      if (cp.size.known() || !pg.size.known()) break;
      cp.size.value = *pg.size.value;
      cp.size.source = "size of group '" + pg.name + "': " + role.source;
      bool sendrecv = false;
      for (const auto& [kp, n] : pg.collectives) sendrecv = sendrecv || kp.rfind("sendrecv", 0) == 0;
      cp.comm.value = sendrecv ? "p2p" : "allgather";
      cp.comm.source = sendrecv ? "send/recv over group '" + pg.name + "' (ring attention)"
                                : "collectives of group '" + pg.name + "' (all-gather of the keys and values)";
      break;
    }
  }
  if (!cp.found()) return;
  const std::set<std::string> names(cp.groups.begin(), cp.groups.end());
  for (std::size_t ri = 0; ri < in.rank_count() && !cp.exchanges_per_layer.known(); ++ri) {
    const trace::rank_trace& t = in.job.ranks[ri];
    const detail::comm_args_source args_of(t);
    int pass = -1;
    std::set<int> layers;
    std::size_t count = 0;
    for (const auto& l : in.ranks[ri].launches) {
      if (l.phase != phase_kind::forward || l.layer < 0 || (pass >= 0 && l.pass != pass)) continue;
      if (pass < 0) pass = l.pass;
      layers.insert(l.layer);
      if (l.comm && names.count(std::string(t.arg_text(args_of.of(l.op), trace::arg_key::process_group_name)))) ++count;
    }
    if (count == 0 || layers.empty()) continue;
    cp.exchanges_per_layer.value = static_cast<int>(count / layers.size());
    cp.exchanges_per_layer.source = std::to_string(count) + " kernels of the CP group in the " + std::to_string(layers.size()) +
                                    " layers of forward pass " + std::to_string(pass) + " of rank " + std::to_string(t.rank);
  }
  if (!cp.exchanges_per_layer.known()) cp.exchanges_per_layer.source = "no kernel of the CP group inside a forward pass's layers";
}

}  // namespace lumos::whatif

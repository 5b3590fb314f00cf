#pragma once
// Structure facet: the parallel layout — world size and pipeline depth from the traces and the
// pipelines walked; tensor-, data- and expert-parallel degrees from the process groups' roles.

#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/groups.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <cstddef>
#include <set>
#include <string>

namespace lumos::whatif {

/// Fills `out.parallel.world` (distributedInfo.world_size, else the number of trace files) and
/// `out.parallel.pp` (the length of the pipelines walked, when they agree; 1 when no rank
/// transfers point to point), and names the flags of TP, PP and DP. Runs after
/// `discover_stages`. Linear in ranks.
inline void discover_layout(const discovery_inputs& in, job_structure& out) {
  auto& par = out.parallel;
  // Flags name options `lumos inspect --structure` (and `lumos whatif`) accept; facts no option
  // supplies (world, EP, micro-batch count) have none.
  par.tp.flag = "--tp", par.pp.flag = "--pp", par.dp.flag = "--dp";
  for (const auto& r : in.job.ranks) {
    if (r.world_size && !par.world.known()) {
      par.world.value = *r.world_size;
      par.world.source = "distributedInfo.world_size";
    }
  }
  if (!par.world.known()) {
    par.world.value = static_cast<int>(in.rank_count());
    par.world.source = "number of trace files (no distributedInfo.world_size)";
  }
  const detail::pipeline_topology& topo = in.topology;
  if (!topo.pipelines.empty()) {
    std::set<std::size_t> lengths;
    for (const auto& p : topo.pipelines) lengths.insert(p.size());
    if (lengths.size() == 1) {
      par.pp.value = static_cast<int>(*lengths.begin());
      par.pp.source = std::to_string(topo.pipelines.size()) + (topo.ring ? " ring(s)" : " chain(s)") + " of point-to-point partners of " +
                      std::to_string(*lengths.begin()) + " ranks";
    } else {
      par.pp.source = "chains of point-to-point partners have different lengths";
    }
  } else if (topo.unmatched_p2p.empty() && topo.partners.empty()) {
    par.pp.value = 1;
    par.pp.source = "no point-to-point transfers between ranks";
  } else {
    par.pp.source = topo.unmatched_p2p.empty() ? "see notes" : "send/recv ops whose peers are absent from the job";
  }
}

namespace detail {

/// `f` from group `pg` when it has role `r` (a note when it disagrees with the size already found).
inline void role_size_of(job_structure& out, group_role r, const process_group& pg, fact<int>& f) {
  for (const auto& role : pg.roles) {
    if (role.value != r || !pg.size.known() || (r == group_role::pp)) continue;
    if (f.known() && *f.value != *pg.size.value) {
      out.notes.push_back(std::string(to_string(r)) + " groups of different sizes (" + std::to_string(*f.value) + " and " +
                          std::to_string(*pg.size.value) + ")");
      continue;
    }
    f.value = *pg.size.value;
    f.source = "size of group '" + pg.name + "': " + role.source;
  }
}

/// Sets `f` to the size of the groups of role `r` (notes groups of that role that disagree). The
/// expert-data-parallel groups of a MoE job are data-parallel for the experts' weights only: DP
/// and TP come from the other groups when there are any.
inline void role_size(job_structure& out, group_role r, fact<int>& f) {
  const auto expert_group = [](const process_group& pg) {
    return pg.name.starts_with("edp.") || lower(pg.name).find("expert") != std::string::npos ||
           expert_data_parallel_description(lower(pg.description));
  };
  const bool experts_last = r == group_role::dp || r == group_role::tp;
  for (const auto& pg : out.groups) {
    if (!experts_last || !expert_group(pg)) role_size_of(out, r, pg, f);
  }
  if (!experts_last || f.known()) return;
  for (const auto& pg : out.groups) {
    if (expert_group(pg)) role_size_of(out, r, pg, f);
  }
}

}  // namespace detail

/// Fills `out.parallel.tp`, `dp` and `ep`: the size of the groups with that role; else TP and
/// EP are 1 (no collective in a forward pass, no all-to-all) unless some communication found no
/// peer, and DP is world / (TP × PP) when those are known and divide it. Under hybrid sharding
/// DP is the shard group's size times its replicas (`discover_fsdp`). Runs after
/// `discover_layout`, `discover_groups` and `discover_fsdp`. Linear in groups.
inline void discover_parallel_degrees(const discovery_inputs& in, job_structure& out) {
  auto& par = out.parallel;
  detail::role_size(out, group_role::tp, par.tp);
  if (const fsdp_structure& f = out.fsdp; f.found() && f.shard.known() && f.replicas.value.value_or(1) > 1) {
    // Hybrid sharding: the DP ranks are the shard groups' ranks times the replicas of each shard
    // (the two kinds of DP group differ in size, and neither alone is the DP degree).
    par.dp.value = *f.shard.value * *f.replicas.value;
    par.dp.source = "HSDP: shard group of " + std::to_string(*f.shard.value) + " ranks x " + std::to_string(*f.replicas.value) +
                    " replicas (" + f.replicas.source + ")";
  } else {
    detail::role_size(out, group_role::dp, par.dp);
  }
  detail::role_size(out, group_role::ep, par.ep);
  const bool all_ranks = static_cast<int>(in.rank_count()) == *par.world.value;
  if (!par.tp.known()) {
    if (!in.unmatched_comm) {
      par.tp.value = 1;
      par.tp.source = "no collective inside forward passes";
    } else {
      par.tp.source = "communication whose peers are absent from the job";
    }
  }
  if (!par.ep.known() && !in.unmatched_comm) {
    par.ep.value = 1;
    par.ep.source = "no all-to-all";
  } else if (!par.ep.known()) {
    par.ep.source = "communication whose peers are absent from the job";
  }
  if (!par.dp.known() && par.tp.known() && par.pp.known() && (all_ranks || !in.unmatched_comm)) {
    const int denom = *par.tp.value * *par.pp.value;
    if (denom > 0 && *par.world.value % denom == 0) {
      par.dp.value = *par.world.value / denom;
      par.dp.source = "world " + std::to_string(*par.world.value) + " / (TP " + std::to_string(*par.tp.value) + " × PP " +
                      std::to_string(*par.pp.value) + "); no gradient reduction in the trace";
    }
  }
  if (!par.dp.known() && par.dp.source.empty()) {
    par.dp.source = in.gradient_ops.empty() ? "no gradient reduction, and world / (TP × PP) is not known"
                                            : "gradients are reduced, but the group's size is not recorded and its peers are absent";
  }
}

}  // namespace lumos::whatif

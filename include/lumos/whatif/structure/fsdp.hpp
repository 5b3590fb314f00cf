#pragma once
// Structure facet: fully sharded data parallelism (PyTorch FSDP2 `fully_shard`, ZeRO-3, and the
// FSDP traces `lumos synth --fsdp on` writes). A job shards its parameters when one process group
// all-gathers parameters inside forward passes and reduce-scatters gradients in backward: the
// distributed optimizer (ZeRO-1) gathers only after the optimizer step, and TP's collectives are
// not reduce-scatters of gradients. FSDP2's record_functions (`FSDP::all_gather`,
// `FSDP::pre_forward`, `FSDP::post_backward_reduce`, ...), when the traces have them, confirm it.
// The counts are read from the lowest rank that runs the shard group's collectives.

#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/groups.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// One group's collectives on one rank, as the FSDP facet counts them.
struct fsdp_group_counts {
  int gathers_forward = 0, gathers = 0, scatters_backward = 0;
  int reduces = 0;  ///< gradient-sized all-reduces in the backward or optimizer phase (HSDP)
};

/// FSDP2's record_function names on rank `t` (those starting `FSDP::`), sorted.
[[nodiscard]] inline std::set<std::string> fsdp2_names(const trace::rank_trace& t) {
  std::set<std::string> out;
  for (const trace::event& e : t.events) {
    const std::string_view n = t.name(e);
    if (n.starts_with("FSDP::")) out.emplace(n);
  }
  return out;
}

/// The collectives of each group on rank `ri`, keyed by group name ("world" when matched by
/// order without args).
[[nodiscard]] inline std::map<std::string, fsdp_group_counts> fsdp_counts(const discovery_inputs& in, std::size_t ri) {
  std::map<std::string, fsdp_group_counts> out;
  const trace::rank_trace& t = in.job.ranks[ri];
  const comm_args_source args_of(t);
  for (const launch_rec& l : in.ranks[ri].launches) {
    if (!l.comm || l.p2p) continue;
    const std::size_t src = args_of.of(l.op);
    const std::string kind = comm_kind(t.name(t.events[l.op]), t.arg_text(src, trace::arg_key::collective_name));
    std::string name(t.arg_text(src, trace::arg_key::process_group_name));
    if (name.empty()) name = l.instance >= 0 ? "world" : "(unmatched, peers absent)";
    fsdp_group_counts& c = out[name];
    const bool grad_phase = l.phase == phase_kind::backward || l.phase == phase_kind::optimizer;
    if (kind == "allgather") {
      ++c.gathers;
      c.gathers_forward += l.phase == phase_kind::forward;
    } else if (kind == "reducescatter" && l.phase == phase_kind::backward) {
      ++c.scatters_backward;
    } else if (kind == "allreduce" && grad_phase) {
      const auto v = t.arg(src, trace::arg_key::in_msg_nelems);
      if (!v || *v > 1024) ++c.reduces;  // a gradient norm or a loss is a few scalars
    }
  }
  return out;
}

[[nodiscard]] inline const process_group* group_named(const job_structure& st, const std::string& name) {
  for (const process_group& g : st.groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

}  // namespace detail

namespace detail {

/// Whether the group's recorded description gives it roles other than data parallelism and not
/// data parallelism (TENSOR_MODEL_PARALLEL_GROUP, an expert or pipeline group; Megatron's
/// DATA_PARALLEL_GROUP_WITH_CP is data parallel), or names expert tensor parallelism (no role:
/// its all-gathers and reduce-scatters around the experts are tokens, not shards of parameters).
[[nodiscard]] inline bool described_as_other_than_dp(const process_group& g) {
  if (expert_tensor_parallel_description(lower(g.description))) return true;
  bool other = false;
  for (const auto& r : g.roles) {
    if (!r.source.starts_with("Process Group Description")) continue;
    if (r.value == group_role::dp) return false;
    other = other || r.value != group_role::world;
  }
  return other;
}

/// The shard group is data parallelism: where group-role discovery took it for TP because it
/// gathers inside forward passes (a group with no description, as FSDP2 over the whole world runs
/// on `default_pg`), those gathers are the units' parameters, not activations. Drops that inferred
/// TP role and gives it the DP role (or says why its inferred DP role holds), before the parallel
/// degrees are read off the roles.
inline void label_shard_group(job_structure& out, const std::string& shard, const std::string& why) {
  for (process_group& g : out.groups) {
    if (g.name != shard) continue;
    std::erase_if(g.roles, [](const auto& r) {
      return r.value == group_role::tp && r.source.find("inside forward passes") != std::string::npos;
    });
    // A DP role the description gave stays as it is; one inferred from the reduce-scatters says
    // why the group is DP: it shards the parameters.
    const auto dp = std::find_if(g.roles.begin(), g.roles.end(), [](const auto& r) { return r.value == group_role::dp; });
    if (dp == g.roles.end()) g.roles.insert(g.roles.begin(), {group_role::dp, "FSDP shard group: " + why, ""});
    else if (dp->source.find("Process Group Description") == std::string::npos) dp->source = "FSDP shard group: " + why;
  }
}

}  // namespace detail

/// Fills `out.fsdp` (see the header comment): the shard group (the group that all-gathers in
/// forward passes and reduce-scatters in backward), its size, the units (reduce-scatters per
/// backward pass: each unit reduces its gradients once per micro-batch), the all-gathers and
/// reduce-scatters per iteration, whether backward passes gather again (reshard after forward),
/// and HSDP's replica groups (gradient all-reduces over another group). Leaves it not `found()`
/// when no group shards parameters, and labels the shard group DP (`label_shard_group`). Runs after
/// `discover_groups` and `discover_passes`, before `discover_parallel_degrees`. Linear in
/// the launches and events of the ranks it reads.
inline void discover_fsdp(const discovery_inputs& in, job_structure& out) {
  fsdp_structure& f = out.fsdp;
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const auto counts = detail::fsdp_counts(in, ri);
    const std::string* shard = nullptr;
    for (const auto& [name, c] : counts) {
      // Context parallelism's all-gather variant gathers keys and values in forward and
      // reduce-scatters their gradients in backward too, over the CP group (discovered before).
      if (std::find(out.cp.groups.begin(), out.cp.groups.end(), name) != out.cp.groups.end()) continue;
      // Sequence parallelism gathers activations in forward and reduce-scatters their gradients
      // in backward over the TP group: a group whose description names another role is no
      // shard group (Megatron FSDP shards over its data-parallel group).
      if (const process_group* g = detail::group_named(out, name); g && detail::described_as_other_than_dp(*g)) continue;
      if (c.gathers_forward > 0 && c.scatters_backward > 0) {
        shard = &name;
        break;
      }
    }
    if (shard == nullptr) continue;
    const detail::fsdp_group_counts& c = counts.at(*shard);
    const std::set<std::string> names = detail::fsdp2_names(in.job.ranks[ri]);
    const rank_structure& rs = out.ranks[ri];
    int forward = 0, backward = 0;
    for (const pass_info& p : rs.passes) {
      forward += p.op.kind == pipeline::op_kind::forward;
      backward += p.op.kind != pipeline::op_kind::forward;
    }
    const std::string where = "group '" + *shard + "' on rank " + std::to_string(rs.rank);
    f.group = *shard;
    f.source = "all-gathers in forward passes and reduce-scatters in backward over " + where;
    if (!names.empty()) {
      f.source += "; FSDP2 record_functions";
      for (const std::string& n : names) f.source += " " + n;
    }
    f.all_gathers.value = c.gathers;
    f.all_gathers.source = "all-gathers of " + where + " in the iteration";
    f.reduce_scatters.value = c.scatters_backward;
    f.reduce_scatters.source = "reduce-scatters of " + where + " in backward passes";
    if (backward > 0 && c.scatters_backward % backward == 0) {
      f.units.value = c.scatters_backward / backward;
      f.units.source = std::to_string(c.scatters_backward) + " reduce-scatters / " + std::to_string(backward) + " backward passes";
    } else {
      f.units.source = std::to_string(c.scatters_backward) + " reduce-scatters do not divide over " + std::to_string(backward) +
                       " backward passes";
    }
    if (f.units.value && forward > 0) {
      const int per_forward = *f.units.value * forward;
      f.reshard_after_forward.value = c.gathers > per_forward ? "on" : "off";
      f.reshard_after_forward.source = std::to_string(c.gathers) + " all-gathers for " + std::to_string(*f.units.value) + " units x " +
                                       std::to_string(forward) + " forward passes: backward passes " +
                                       (c.gathers > per_forward ? "gather again" : "do not gather");
    } else {
      f.reshard_after_forward.source = "units or forward passes unknown";
    }
    if (const process_group* g = detail::group_named(out, *shard); g && g->size.value) {
      f.shard.value = *g->size.value;
      f.shard.source = "size of " + where + " (" + g->size.source + ")";
    } else {
      f.shard.source = "the size of " + where + " is unknown";
      f.shard.flag = "--dp";
    }
    f.replicas.value = 1;
    f.replicas.source = "no gradient all-reduce over another group";
    for (const auto& [name, rc] : counts) {
      if (name == *shard || rc.reduces == 0) continue;
      const process_group* g = detail::group_named(out, name);
      if (g == nullptr || !g->size.value || *g->size.value < 2) continue;
      // TP's (and CP's, EP's) backward all-reduces are activations, not gradients.
      const bool other_role = std::any_of(g->roles.begin(), g->roles.end(), [](const auto& r) {
        return r.value == group_role::tp || r.value == group_role::cp || r.value == group_role::ep || r.value == group_role::pp;
      });
      if (other_role) continue;
      f.replicas.value = *g->size.value;
      f.replica_group = name;
      f.replicas.source = "gradient all-reduces over group '" + name + "' of " + std::to_string(*g->size.value) +
                          " ranks after the reduce-scatters (hybrid sharding)";
      break;
    }
    const std::string why = "all-gathers in forward passes and reduce-scatters in backward";
    detail::label_shard_group(out, *shard, why);
    // Ranks whose shard group has a name of its own (each rank's group of a folded job) shard
    // the same way: their groups' forward gathers are parameters too.
    for (std::size_t other = ri + 1; other < in.rank_count(); ++other) {
      for (const auto& [name, oc] : detail::fsdp_counts(in, other)) {
        if (name != *shard && oc.gathers_forward > 0 && oc.scatters_backward > 0) detail::label_shard_group(out, name, why);
      }
    }
    return;
  }
}

}  // namespace lumos::whatif

#pragma once
// Structure facet: the process groups, as their collectives show them, and the role of each
// (TP, DP, PP, EP, world): from the group's recorded description, else from where its
// collectives run.

#include <lumos/graph/trace_builder.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// A process group while its collectives are read.
struct group_acc {
  process_group g;
  std::map<std::string, std::map<int, std::size_t>> counts;  ///< "kind in phase" → rank → count
  std::set<std::string> kinds_phase;
  /// Backward/optimizer all-reduces and reduce-scatters: the largest recorded message
  /// (elements) and whether any has none recorded.
  std::int64_t grad_elements = 0;
  bool grad_size_unknown = false;
  std::string bad_size;  ///< a Group size arg out of range, noted once
  /// Send/recv launched in the layers, and of those the ones launched inside an attention
  /// operator (ring attention's key/value exchange: Transformer Engine's CP attention).
  std::size_t layer_sendrecv = 0, attention_sendrecv = 0;
};

/// The ranks collective launch `l` of rank trace `t` (its args on event `src`) runs over, as its
/// args and the job tell them.
struct collective_ranks {
  std::vector<int> listed;               ///< its `Process Group Ranks` (empty: not recorded)
  std::vector<int> joined;               ///< the ranks of the job that joined it, sorted (empty: peers absent)
  std::optional<std::int64_t> size_arg;  ///< its `Group size` arg as recorded (see group_size_of)

  /// How many: its `Group size`, else its `Process Group Ranks`, else the ranks that joined it
  /// (0: none says).
  [[nodiscard]] int count() const {
    if (size_arg) {
      if (const auto size = group_size_of(*size_arg)) return *size;
    }
    return static_cast<int>(!listed.empty() ? listed.size() : joined.size());
  }
};

[[nodiscard]] inline collective_ranks collective_ranks_of(const discovery_inputs& in, const trace::rank_trace& t, std::size_t src,
                                                          const launch_rec& l) {
  return {graph::detail::parse_rank_list(t.arg_text(src, trace::arg_key::process_group_ranks)),
          l.instance >= 0 ? in.participants(l.instance) : std::vector<int>{}, t.arg(src, trace::arg_key::group_size)};
}

/// Whether launch `l` of `t` runs inside an attention operator of a layer: its innermost GEMM or
/// attention operator, or its outermost CPU operator, is named as attention.
[[nodiscard]] inline bool launched_in_attention(const trace::rank_trace& t, const launch_rec& l) {
  if (l.layer < 0) return false;
  for (const std::uint32_t op : {l.shape_op, l.cpu_op}) {
    if (op != no_event && op < t.events.size() && is_attention_kernel(t.name(t.events[op]))) return true;
  }
  return false;
}

/// Adds launch `l` (a collective; point-to-point pairs are reported as one PP group per
/// pipeline instead) of rank `ri` to its group in `groups`
/// (keyed by group name, else by the ranks that joined it, else "unmatched"), and to
/// `grad_ops` when it may reduce gradients.
inline void add_collective(const discovery_inputs& in, std::size_t ri, const comm_args_source& args_of, const launch_rec& l,
                           std::map<std::string, group_acc>& groups, std::map<int, std::vector<gradient_op>>& grad_ops,
                           std::vector<std::string>& notes) {
  const trace::rank_trace& t = in.job.ranks[ri];
  const std::size_t src = args_of.of(l.op);
  std::string kind = comm_kind(t.name(t.events[l.op]), t.arg_text(src, trace::arg_key::collective_name));
  const collective_ranks cr = collective_ranks_of(in, t, src, l);
  std::string name(t.arg_text(src, trace::arg_key::process_group_name));
  // Ring attention's send/recv (context parallelism) are no all-to-all, whatever their group size.
  const bool ring = kind == "sendrecv" && (context_parallel_description(t.arg_text(src, trace::arg_key::process_group_desc)) ||
                                           launched_in_attention(t, l));
  if (kind == "sendrecv" && (cr.joined.size() > 2 || cr.listed.size() > 2) && !l.p2p && !ring) kind = "alltoall";
  std::string key;
  if (!name.empty()) {
    key = "name " + name;
  } else if (l.instance >= 0) {
    name = "world";
    key = "ranks " + join_ints(cr.joined);
  } else {
    name = "(unmatched, peers absent)";
    key = "unmatched";
  }
  auto& acc = groups[key];
  if (acc.g.name.empty()) {
    acc.g.name = name;
    acc.g.description = std::string(t.arg_text(src, trace::arg_key::process_group_desc));
  }
  std::set<int> rs(acc.g.ranks.begin(), acc.g.ranks.end());
  rs.insert(cr.listed.begin(), cr.listed.end());
  rs.insert(cr.joined.begin(), cr.joined.end());
  acc.g.ranks.assign(rs.begin(), rs.end());
  if (const auto& gs = cr.size_arg; gs && !acc.g.size.known()) {
    if (const auto size = group_size_of(*gs)) {
      acc.g.size.value = *size;
      acc.g.size.source = "Group size arg";
    } else if (acc.bad_size.empty()) {
      acc.bad_size = "group '" + name + "': Group size " + std::to_string(*gs) + " (" + t.file +
                     ") is not a group size; taken from the ranks seen instead";
      notes.push_back(acc.bad_size);
    }
  }
  const std::string kp = kind + " in " + std::string(to_string(l.phase));
  ++acc.counts[kp][t.rank];
  acc.kinds_phase.insert(kp);
  if (kind == "sendrecv" && l.layer >= 0) {
    ++acc.layer_sendrecv;
    if (launched_in_attention(t, l)) ++acc.attention_sendrecv;
  }
  if ((kind == "allreduce" || kind == "reducescatter" || kind == "allgather") &&
      (l.phase == phase_kind::backward || l.phase == phase_kind::optimizer)) {
    std::int64_t el = 0;
    if (const auto v = t.arg(src, trace::arg_key::in_msg_nelems)) el = *v;
    else if (l.instance >= 0) el = in.built.graph.collectives[static_cast<std::size_t>(l.instance)].bytes;
    grad_ops[t.rank].push_back({kind, el, key});
    if (kind != "allgather") {
      acc.grad_elements = std::max(acc.grad_elements, el);
      acc.grad_size_unknown = acc.grad_size_unknown || el <= 0;
    }
  }
}

/// Whether `wd` appears in `d` as a whole word (no letter or digit on either side).
[[nodiscard]] inline bool has_word(std::string_view d, std::string_view wd) {
  for (std::size_t at = d.find(wd); at != std::string_view::npos; at = d.find(wd, at + 1)) {
    const bool left = at == 0 || !std::isalnum(static_cast<unsigned char>(d[at - 1]));
    const bool right = at + wd.size() >= d.size() || !std::isalnum(static_cast<unsigned char>(d[at + wd.size()]));
    if (left && right) return true;
  }
  return false;
}

/// Whether a group's description says expert data parallelism (Megatron's EXPERT_DATA_PARALLEL_GROUP):
/// the ranks that hold the same experts and reduce their gradients, data-parallel rather than EP.
[[nodiscard]] inline bool expert_data_parallel_description(std::string_view d) {
  return has_word(d, "expert") && (has_word(d, "data") || has_word(d, "dp"));
}

/// Whether a group's description says expert tensor parallelism (Megatron's
/// EXPERT_TENSOR_PARALLEL_GROUP, EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP): the ranks splitting each
/// expert's width, neither the TP group of the dense layers nor the expert-parallel group.
[[nodiscard]] inline bool expert_tensor_parallel_description(std::string_view d) {
  return has_word(d, "expert") && (has_word(d, "tensor") || has_word(d, "tp"));
}

/// The size, per-iteration collective counts and roles of group `key`. `world`: the world size.
inline void settle_group(const std::string& key, group_acc& acc, int world) {
  auto& pg = acc.g;
  // A group no rank is recorded in (its collectives carry neither ranks nor a size) has no size:
  // 0 would read as TP 0 downstream.
  if (!pg.size.known() && key != "unmatched" && !pg.ranks.empty()) {
    pg.size.value = static_cast<int>(pg.ranks.size());
    pg.size.source = "ranks that joined its collectives";
  } else if (!pg.size.known()) {
    pg.size.source = "no group args and the peers are absent from the job";
    pg.size.flag = "--tp/--dp";
  }
  for (const auto& [kp, per_rank] : acc.counts) {
    std::size_t most = 0;
    for (const auto& [r, c] : per_rank) most = std::max(most, c);
    pg.collectives.emplace_back(kp, most);
  }
  auto has = [&](std::string_view kind, phase_kind ph) { return acc.kinds_phase.count(std::string(kind) + " in " + std::string(to_string(ph))) > 0; };
  const std::string d = lower(pg.description);
  const std::string desc_src = "Process Group Description '" + pg.description + "'";
  const bool expert_tp = expert_tensor_parallel_description(d);
  if ((has_word(d, "tp") || has_word(d, "tensor")) && !expert_tp) pg.roles.push_back({group_role::tp, desc_src, ""});
  if (has_word(d, "dp") || has_word(d, "data")) pg.roles.push_back({group_role::dp, desc_src, ""});
  if (has_word(d, "pp") || has_word(d, "pipeline")) pg.roles.push_back({group_role::pp, desc_src, ""});
  if ((has_word(d, "ep") || has_word(d, "expert") || has_word(d, "moe")) && !expert_data_parallel_description(d) && !expert_tp) {
    pg.roles.push_back({group_role::ep, desc_src, ""});
  }
  if (context_parallel_description(d)) pg.roles.push_back({group_role::cp, desc_src, ""});
  auto add_role = [&](group_role r, std::string why) {
    for (const auto& x : pg.roles) {
      if (x.value == r) return;
    }
    pg.roles.push_back({r, std::move(why), ""});
  };
  if (key == "unmatched") return;
  const bool spans_world = pg.size.value && *pg.size.value == world && world > 1;
  // A recorded description says what the group is (Megatron names every group: a gradient-norm
  // all-reduce over MODEL_PARALLEL_GROUP or a TP all-reduce in backward is no DP reduction);
  // roles are inferred from where its collectives run only when it has none (PyTorch writes
  // "undefined" for groups created without one).
  if (!d.empty() && d != "undefined" && d != "default_pg") {
    if (spans_world) add_role(group_role::world, "spans every rank of the world");
    return;
  }
  for (const char* k : {"allreduce", "allgather", "reducescatter"}) {
    if (has(k, phase_kind::forward)) add_role(group_role::tp, std::string(k) + " inside forward passes (activations)");
  }
  // Gradients are buckets of parameters; an all-reduce of a few scalars after the backward (a
  // gradient norm, a loss, a found-inf flag) is not a gradient reduction.
  const bool gradient_sized = acc.grad_size_unknown || acc.grad_elements > 1024;
  for (const char* k : {"allreduce", "reducescatter"}) {
    if ((has(k, phase_kind::backward) || has(k, phase_kind::optimizer)) && gradient_sized) {
      add_role(group_role::dp, std::string(k) + " in the backward/optimizer phase (gradients)");
    }
  }
  // Send/recv that run inside the layers' attention are ring attention's key/value exchange.
  if (acc.attention_sendrecv > 0 && acc.attention_sendrecv == acc.layer_sendrecv) {
    add_role(group_role::cp, "send/recv launched inside the layers' attention (ring attention's key/value exchange)");
  }
  for (const phase_kind ph : {phase_kind::forward, phase_kind::backward, phase_kind::other, phase_kind::optimizer}) {
    if (has("alltoall", ph)) add_role(group_role::ep, "all-to-all (experts in MoE; embedding shards in recommender models)");
  }
  if (spans_world) add_role(group_role::world, "spans every rank of the world");
}

/// Keeps in `grad_ops` the gradient reductions: the collectives of DP groups, or, when no group
/// is known to be DP (unmatched ops), those of groups whose description names no other role.
inline void keep_gradient_reductions(const std::map<std::string, group_acc>& groups, std::map<int, std::vector<gradient_op>>& grad_ops) {
  std::set<std::string> dp_groups;
  for (const auto& [key, acc] : groups) {
    for (const auto& role : acc.g.roles) {
      if (role.value == group_role::dp) dp_groups.insert(key);
    }
  }
  if (!dp_groups.empty()) {
    for (auto& [r, ops] : grad_ops) std::erase_if(ops, [&](const gradient_op& o) { return dp_groups.count(o.group) == 0; });
  } else {
    for (auto& [r, ops] : grad_ops) {
      std::erase_if(ops, [&](const gradient_op& o) {
        const auto it = groups.find(o.group);
        return it != groups.end() && !it->second.g.description.empty() && it->second.g.description != "undefined";
      });
    }
  }
  std::erase_if(grad_ops, [](const auto& kv) { return kv.second.empty(); });
}

}  // namespace detail

/// Fills `out.groups`: one PP group per pipeline walked (first), then every group of the
/// collectives launched in the iteration, with its size, its collectives per iteration and its
/// roles. Sets `in.gradient_ops` (each rank's gradient reductions) and `in.unmatched_comm`.
/// Notes Group size args that are no size. Runs after `discover_stages` and `discover_layout`.
/// Linear in launches.
inline void discover_groups(discovery_inputs& in, job_structure& out) {
  std::map<std::string, detail::group_acc> groups;
  std::map<int, std::vector<detail::gradient_op>> grad_ops;
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const detail::comm_args_source args_of(in.job.ranks[ri]);
    for (const auto& l : in.ranks[ri].launches) {
      if (l.comm && !l.p2p) detail::add_collective(in, ri, args_of, l, groups, grad_ops, out.notes);
    }
  }
  for (std::size_t pi = 0; pi < in.topology.pipelines.size(); ++pi) {
    process_group pg;
    pg.name = "p2p pipeline " + std::to_string(pi);
    pg.ranks = in.topology.pipelines[pi];
    pg.size.value = static_cast<int>(pg.ranks.size());
    pg.size.source = "ranks of the chain of point-to-point partners";
    pg.roles.push_back({group_role::pp, "send/recv between neighbouring stages", ""});
    out.groups.push_back(std::move(pg));
  }
  for (auto& [key, acc] : groups) detail::settle_group(key, acc, *out.parallel.world.value);
  detail::keep_gradient_reductions(groups, grad_ops);
  for (auto& [key, acc] : groups) out.groups.push_back(std::move(acc.g));
  in.gradient_ops = std::move(grad_ops);
  in.unmatched_comm = groups.count("unmatched") > 0;
}

}  // namespace lumos::whatif

#pragma once
// The data-parallel what-if (`lumos whatif --dp N`): the gradient collectives of the traced ranks
// resized for N replicas with a communication model fitted on the trace's own collectives, and
// the micro-batches per replica that the global batch implies. DP replicas are symmetric, so the
// traced ranks stand for all of them: the predicted job keeps its ranks, and only their DP
// collectives (transfer time and group size) change.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/detail/shape_groups.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

/// What the DP rewrite did (`dp_changes` turns it into change records).
struct dp_rewrite_stats {
  int from = 1, to = 1;
  int tp = 1, tp_to = 1;        ///< the traced TP and the target's (a group's members are TP apart)
  std::size_t collectives = 0;  ///< instances resized
  std::size_t lone = 0;         ///< of them, ops whose peers are absent from the job (`lone_collective`)
  std::size_t modelled = 0;     ///< of them, by the profile's NCCL model
  time_ns before = 0, after = 0;  ///< their transfer time, summed over participants
  bool unchanged = false;         ///< the same DP and TP: nothing to resize
  bool no_dp_group = false;       ///< the traces have no gradient collective: nothing was resized
  bool unsized = false;           ///< some gradient collectives record no message size (ring factor alone)
  bool others = false;            ///< the DP groups run collectives that are not gradient reductions (kept)
  std::map<model::collective, comm_fit> fits;  ///< the fits of the traces' own collectives that were used
  std::string profile;            ///< the NCCL model's profile, when `modelled`
  int modelled_per_node = 1;      ///< with it: a group's members on one node (GPUs per node / TP)
  int gpus_per_node = 8;          ///< GPUs per NVLink domain of the machine that places the groups
  double inter_over_intra = 1.0;  ///< inter-node over intra-node bandwidth, and where it comes from
  std::string inter_source;
  std::size_t ranks = 0;          ///< traced ranks, which stand for every replica
};

/// Micro-batches per replica for `dp` replicas: keeps the global batch when `m·dp_old` divides
/// by `dp`, else keeps the per-replica batch; `global_batch` (in micro-batches of the trace's
/// size over all replicas) overrides. `why` says which.
struct micro_batch_plan {
  int micro_batches = 1;
  std::string why;
};

[[nodiscard]] inline micro_batch_plan plan_micro_batches(int m, int dp_old, int dp_new, std::optional<std::int64_t> global_micro_batches) {
  micro_batch_plan p;
  if (global_micro_batches) {
    if (*global_micro_batches <= 0 || *global_micro_batches % dp_new != 0) {
      throw error("whatif --global-batch: " + std::to_string(*global_micro_batches) + " micro-batches do not divide over " +
                  std::to_string(dp_new) + " data-parallel replicas");
    }
    model::check_micro_batch_count(*global_micro_batches / dp_new,
                                   "whatif --global-batch: " + std::to_string(*global_micro_batches) + " micro-batches over " +
                                       std::to_string(dp_new) + " data-parallel replicas",
                                   "lower --global-batch, or raise --micro-batch or --dp");
    p.micro_batches = static_cast<int>(*global_micro_batches / dp_new);
    p.why = "global batch " + std::to_string(*global_micro_batches) + " micro-batches (--global-batch): " +
            std::to_string(p.micro_batches) + " per replica";
    return p;
  }
  const long long global = static_cast<long long>(m) * dp_old;
  if (global % dp_new == 0) {
    model::check_micro_batch_count(global / dp_new,
                                   "whatif --dp " + std::to_string(dp_new) + ": the traces' " + std::to_string(global) +
                                       " micro-batches per iteration kept",
                                   "give --global-batch, or raise --dp or --micro-batch");
    p.micro_batches = static_cast<int>(global / dp_new);
    p.why = "global batch kept (" + std::to_string(global) + " micro-batches = " + std::to_string(dp_new) + " replicas x " +
            std::to_string(p.micro_batches) + ")";
  } else {
    p.micro_batches = m;
    p.why = "global batch of " + std::to_string(global) + " micro-batches does not divide over " + std::to_string(dp_new) +
            " replicas: per-replica batch kept (" + std::to_string(m) + " micro-batches), global batch becomes " +
            std::to_string(static_cast<long long>(m) * dp_new);
  }
  return p;
}

/// How the ranks of a Megatron job are laid out: TP innermost, then DP, then PP.
struct rank_layout {
  int tp = 1, dp = 1, pp = 1;
  [[nodiscard]] constexpr std::int64_t stage_stride() const noexcept { return static_cast<std::int64_t>(tp) * dp; }
};

/// Re-times the transfers whose members change how many nodes they span when the job goes
/// from layout `from` to `to`. Megatron numbers ranks TP innermost, then DP, then PP, so pipeline
/// neighbours are tp·dp apart: a larger stage can move a stage's partner onto another node, and
/// its transfers then go over the NIC; a deeper pipeline moves the last stage further away. A
/// traced rank s·(tp·dp) + d·tp + t becomes s'·(tp'·dp') + (d mod dp')·tp' + (t mod tp'), with s' =
/// `traced_stage_to(s)`. Collectives across stages (the tied embedding's first and last stage)
/// are re-timed by the profile's NCCL model (hierarchical placement), send/recv pairs too (intra-
/// or inter-node link) unless the depth changes (then the pipeline model times the transfers
/// between the new stages), when their node count changes, anchored on the measured time; groups
/// whose role is TP or DP are left to their own rewrites; `p2p_to_split`: the send/recv pairs are
/// left to the stage split, which re-times them itself (`split_stages`). Returns a sentence for
/// `changes` (empty: nothing moved).
inline std::string retime_across_nodes(graph::task_graph& g, const job_structure& st, rank_layout from, rank_layout to,
                                       const model::nccl_model& nccl, const model::hardware& hw, bool p2p_to_split = false) {
  if (st.parallel.pp.value.value_or(1) <= 1) return {};
  std::set<std::string> own_rewrite;
  for (const auto& pg : st.groups) {
    for (const auto& r : pg.roles) {
      if (r.value == group_role::dp || r.value == group_role::tp) own_rewrite.insert(pg.name);
    }
  }
  const std::int64_t G = hw.nvlink_domain_size(), old_stride = from.stage_stride(), new_stride = to.stage_stride();
  const bool depth_changes = from.pp != to.pp;
  // A smaller TP folds the traced TP ranks beyond the new size onto the new group's ranks
  // (traced rank t replays as t mod the new TP), so they land on the node of the rank they stand for.
  // So does a smaller DP: the traced replicas beyond it still replay (their collectives resized),
  // as stand-ins for replica d mod the new DP, and transfers that crossed a node and no longer do
  // must not keep their old link there, or their stage waits on them (FSDP's gathers join them).
  auto renumbered = [&](std::int64_t r) {
    const std::int64_t x = r % old_stride;
    const std::int64_t s = traced_stage_to(static_cast<int>(r / old_stride), from.pp, to.pp);
    return s * new_stride + x / from.tp % std::max(to.dp, 1) * to.tp + x % from.tp % to.tp;
  };
  std::size_t moved = 0;
  time_ns before = 0, after = 0;
  for (auto& ci : g.collectives) {
    if (ci.bytes <= 0 || ci.group_ranks.size() < 2 || own_rewrite.count(ci.group)) continue;
    if (made_by_whatif(ci.group)) continue;  // priced at the target's ranks when it was made
    // The traced elements in bytes: priced at a quarter of its size, the tied embedding's fp32
    // all-reduce of a 4-layer hidden-1024 job moved to another node was 1.93 ms where the job
    // synthesised so ran 2.25 (`--dp 4` from TP 2 PP 2 DP 2: -1.92 %).
    const std::int64_t bytes = ci.bytes * element_bytes_of(ci, g);
    const bool p2p = ci.kind == "sendrecv" || ci.kind == "send_recv";
    const auto kind = collective_of_kind(ci.kind);
    if ((!p2p && !kind) || (p2p && (depth_changes || p2p_to_split))) continue;
    std::vector<std::int64_t> nodes_old, nodes_new;
    for (const int r : ci.group_ranks) {
      nodes_old.push_back(r / G);
      nodes_new.push_back(renumbered(r) / G);
    }
    auto distinct = [](std::vector<std::int64_t> v) {
      std::sort(v.begin(), v.end());
      return static_cast<std::size_t>(std::unique(v.begin(), v.end()) - v.begin());
    };
    if (distinct(nodes_old) == distinct(nodes_new)) continue;
    time_ns t_old = 0, t_new = 0;
    if (p2p) {
      if (ci.group_ranks.size() != 2) continue;
      t_old = nccl.p2p_time({bytes, nodes_old[0] == nodes_old[1]}, hw);
      t_new = nccl.p2p_time({bytes, nodes_new[0] == nodes_new[1]}, hw);
    } else {
      try {
        t_old = nccl.collective_time({*kind, bytes, model::group_placement::from_nodes(nodes_old)}, hw);
        t_new = nccl.collective_time({*kind, bytes, model::group_placement::from_nodes(nodes_new)}, hw);
      } catch (const error&) {
        continue;  // uneven placement: not modelled, the measured time stays
      }
    }
    if (t_old <= 0) continue;
    const double r = static_cast<double>(t_new) / static_cast<double>(t_old);
    for (const graph::task_id t : ci.complete) {
      before += g.duration[t];
      g.duration[t] = static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * r));
      after += g.duration[t];
    }
    ++moved;
  }
  if (moved == 0) return {};
  char text[400];
  std::snprintf(text, sizeof text,
                "%d pipeline stages %lld ranks apart instead of %d stages %lld apart: %zu %s change how many nodes they span, "
                "re-timed by the profile's NCCL model (%.3f -> %.3f ms)",
                to.pp, static_cast<long long>(new_stride), from.pp, static_cast<long long>(old_stride), moved,
                depth_changes ? "cross-stage collectives (tied embedding)" : "send/recv transfers and cross-stage collectives (tied embedding)",
                static_cast<double>(before) / 1e6, static_cast<double>(after) / 1e6);
  return text;
}

/// Resizes the DP collectives of `g` (instances of a process group whose role is DP) from
/// `st.parallel.dp` to `dp` replicas: each transfer time t becomes
/// t · T(n') / T(n), T from the fit of its kind on the trace's own collectives; when n' spans
/// more nodes than n (`gpus_per_node` GPUs per node: per NVLink domain), the bandwidth term of T(n') uses the
/// inter-node bandwidth (`inter_over_intra` of the intra-node one). Group sizes in the graph
/// are set to n' (ranks beyond the traced ones are not in the graph: replicas are symmetric).
/// Identity (n' = n) leaves every duration as it is. Throws when the trace's DP size or DP
/// collectives are unknown.
///
/// With `nccl` and `hw` (the cost profile and machine of the GPU the traces ran on), a sized
/// collective's ratio is the profile's NCCL model (protocols, hierarchical intra/inter-node
/// placement, as `lumos synth` and `predict` time it) of the new group over the old one, with
/// the members TP apart: min(n, GPUs per NVLink domain / TP) of them on a node.
///
/// `lone`: the gradient collectives whose peers are absent from the job (`lone_collectives`),
/// resized the same way; without them, traces written one rank per stage keep their gradient
/// collectives' measured time whatever the new DP.
///
/// `tp_to`: the target's TP (0: the traces'). A group's members are TP apart, so a larger TP
/// spreads a DP group over more nodes even at the same DP (TP 2 -> 8 with DP 2: from one node to
/// two); the ratio then places the old group at the traced TP and the new one at `tp_to`, both
/// with the message the target's TP leaves each rank (the traced one x TP / tp_to: the shape
/// rewrite has already scaled the measured time by the size at the old placement).
[[nodiscard]] inline dp_rewrite_stats resize_data_parallel(graph::task_graph& g, const job_structure& st, int dp, int gpus_per_node,
                                                           double inter_over_intra, const std::string& inter_source,
                                                           const model::nccl_model* nccl = nullptr, const model::hardware* hw = nullptr,
                                                           const std::vector<lone_collective>& lone = {}, int tp_to = 0) {
  if (dp <= 0) throw error("whatif --dp: the data-parallel size must be positive (got " + std::to_string(dp) + ")");
  if (!st.parallel.dp.known()) throw error("whatif --dp: the traces' data-parallel size is unknown (" + st.parallel.dp.source + ")");
  dp_rewrite_stats out;
  out.from = *st.parallel.dp.value;
  if (out.from <= 0) throw error("whatif --dp: the traces' data-parallel size " + std::to_string(out.from) + " is not a size (" + st.parallel.dp.source + ")");
  out.to = dp;
  const std::set<std::string> dp_groups = groups_with_role(st, group_role::dp);
  // An expert-data-parallel group's members are expert TP x EP apart (Megatron folds the expert
  // grid over the stage's ranks), so it leaves a node EP x expert TP / TP times sooner than the
  // dense group.
  const std::set<std::string> expert_groups = detail::expert_dp_groups(st);
  const int tp = st.parallel.tp.value.value_or(1);
  const double ep = std::max(1, st.moe.ep.value.value_or(st.parallel.ep.value.value_or(1))) * static_cast<double>(traced_expert_tp(st)) / tp;
  const int tp_new = tp_to > 0 ? tp_to : tp;
  out.tp = tp, out.tp_to = tp_new;
  out.gpus_per_node = gpus_per_node, out.inter_over_intra = inter_over_intra, out.inter_source = inter_source;
  out.ranks = st.ranks.size();
  if (nccl != nullptr) out.profile = nccl->profile.name;
  if (hw != nullptr) out.modelled_per_node = std::max(1, hw->nvlink_domain_size() / std::max(1, tp_new));
  if (out.from == dp && tp_new == tp) {
    out.unchanged = true;
    return out;
  }
  if (dp_groups.empty()) {
    out.no_dp_group = true;
    return out;
  }
  auto& fits = out.fits;
  bool& unsized = out.unsized;
  bool& others = out.others;
  // Gradient collectives only: an all-to-all or broadcast in the same group (embedding
  // exchange, parameter broadcast) is not data-parallel traffic and keeps its measured time.
  auto gradient_kind = [&](std::string_view k) -> std::optional<model::collective> {
    const auto kind = collective_of_kind(k);
    if (!kind || !(*kind == model::collective::all_reduce || *kind == model::collective::reduce_scatter ||
                   *kind == model::collective::all_gather)) {
      others = true;
      return std::nullopt;
    }
    return kind;
  };
  // The members of the DP group of traced rank `rank` with `members` replicas at TP `tp_of`, as
  // Megatron numbers ranks (TP innermost, then DP, then PP): the rank's stage and TP column kept
  // (an expert-data-parallel group's, `apart` = EP: its EP column too).
  // A group need not start at a node boundary (TP 2, DP 3: stage 1's groups are {6, 8, 10} and
  // {7, 9, 11}, two members on one node and one on the next), which the placement then prices
  // as lumos synth does (`model::placement_of`).
  auto members_of = [&](int rank, std::int64_t members, int tp_of, double apart) {
    const std::int64_t stage = rank / (static_cast<std::int64_t>(tp) * out.from), stride = std::max<std::int64_t>(1, std::llround(tp_of * apart));
    const std::int64_t first = stage * stride * members + rank % std::max<std::int64_t>(1, std::llround(tp * apart)) % stride;
    std::vector<int> ranks;
    for (std::int64_t i = 0; i < members; ++i) ranks.push_back(static_cast<int>(first + i * stride));
    return ranks;
  };
  // The factor on the transfer time of a collective of `kind` and `bytes` (0: unknown) from n
  // to n_new members; `rank`, a traced member's number (-1: unknown, the groups then start at a
  // node boundary); `apart`, EP x expert TP / TP for an expert-data-parallel group, else 1.
  auto ratio_of = [&](model::collective kind, std::int64_t bytes, std::int64_t n, std::int64_t n_new, int rank, double apart) {
    // GPUs a group's ranks occupy: its members are TP (x EP) apart, so it leaves a node once
    // n · tp exceeds the node.
    const bool crossed_before = static_cast<double>(n * tp) * apart > gpus_per_node, crossed_after = static_cast<double>(n_new * tp_new) * apart > gpus_per_node;
    const double slower = crossed_after && !crossed_before ? inter_over_intra : 1.0;
    if (bytes > 0 && nccl != nullptr && hw != nullptr) {
      auto placed = [&](std::int64_t members, int tp_of) {
        const std::int64_t per_node = std::max<std::int64_t>(1, hw->nvlink_domain_size() / std::max<std::int64_t>(1, std::llround(tp_of * apart)));
        const std::int64_t r = std::min(members, per_node);
        return model::group_placement{members - members % r, r};
      };
      const std::int64_t size = std::max<std::int64_t>(1, bytes * tp / tp_new);
      // (Groups whose ranks would pass 2^30 are placed from a node boundary instead.)
      const std::int64_t stages = rank / (static_cast<std::int64_t>(tp) * out.from) + 1;
      const bool at_ranks = rank >= 0 && static_cast<double>(std::max(n * tp, n_new * tp_new)) * apart <= static_cast<double>((std::int64_t{1} << 30) / stages);
      const auto t_old =
          nccl->collective_time({kind, size, at_ranks ? model::placement_of(members_of(rank, n, tp, apart), *hw) : placed(n, tp)}, *hw);
      const auto t_new = nccl->collective_time(
          {kind, size, at_ranks ? model::placement_of(members_of(rank, n_new, tp_new, apart), *hw) : placed(n_new, tp_new)}, *hw);
      ++out.modelled;
      return t_old > 0 ? static_cast<double>(t_new) / static_cast<double>(t_old) : 1.0;
    }
    if (bytes > 0) {
      if (!fits.count(kind)) fits.emplace(kind, fit_collective(g, kind));
      const comm_fit& f = fits.at(kind);
      comm_fit after = f;
      after.busbw = f.busbw * slower;
      const auto b = static_cast<double>(bytes);
      const double t_old = f.time_ns(kind, b, n), t_new = after.time_ns(kind, b, n_new);
      return t_old > 0 ? t_new / t_old : 1.0;
    }
    // No size recorded: no latency can be told from bandwidth, so the whole measured time is
    // taken as bandwidth time (an upper bound on the change for small messages).
    unsized = true;
    const double b_old = model::bus_factor(kind, n);
    return b_old > 0 ? model::bus_factor(kind, n_new) / b_old / slower : 1.0;
  };
  auto rescale = [&](graph::task_id t, double ratio) {
    out.before += g.duration[t];
    g.duration[t] = static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * ratio));
    out.after += g.duration[t];
  };
  for (auto& ci : g.collectives) {
    if (!dp_groups.count(ci.group)) continue;
    const auto kind = gradient_kind(ci.kind);
    if (!kind) continue;
    const auto n = static_cast<std::int64_t>(ci.group_ranks.empty() ? out.from : static_cast<int>(ci.group_ranks.size()));
    // A DP group of n replicas: scaled by the DP ratio (a world group that is also DP grows the same way).
    const std::int64_t n_new = std::max<std::int64_t>(1, n * dp / out.from);
    const int member = ci.complete.empty() ? -1 : g.rank[ci.complete.front()];
    const double ratio = ratio_of(*kind, ci.bytes * element_bytes_of(ci, g), n, n_new, member, expert_groups.count(ci.group) ? ep : 1.0);
    for (const graph::task_id t : ci.complete) rescale(t, ratio);
    // Members beyond the traced ranks get numbers past the largest (they are not in the graph).
    int next = ci.group_ranks.empty() ? 0 : *std::max_element(ci.group_ranks.begin(), ci.group_ranks.end()) + 1;
    while (static_cast<std::int64_t>(ci.group_ranks.size()) < n_new) ci.group_ranks.push_back(next++);
    if (static_cast<std::int64_t>(ci.group_ranks.size()) > n_new) ci.group_ranks.resize(static_cast<std::size_t>(n_new));
    ++out.collectives;
  }
  for (const lone_collective& c : lone) {
    if (!dp_groups.count(c.group) || c.task >= g.task_count() || g.kind[c.task] != graph::task_kind::gpu_comm) continue;
    const auto kind = gradient_kind(c.kind);
    if (!kind) continue;
    const std::int64_t n = c.group_size > 0 ? c.group_size : out.from;
    const double ratio = ratio_of(*kind, c.elements * c.element_bytes, n, std::max<std::int64_t>(1, n * dp / out.from), g.rank[c.task],
                                  expert_groups.count(c.group) ? ep : 1.0);
    rescale(c.task, ratio);
    ++out.collectives, ++out.lone;
  }
  return out;
}

/// `resize_data_parallel` of the DP groups of `st` (the structure of `b`, or a view of it) to `to`
/// ranks, timed as `ctx` says (its communication hardware, the NCCL model, the target's TP).
[[nodiscard]] inline dp_rewrite_stats resize_gradient_group(const context& ctx, graph::built_job& b, const job_structure& st, int to) {
  const model::hardware& hw = ctx.comm_hw;
  const double ratio = hw.inter_node.effective_bandwidth() / hw.intra_node.effective_bandwidth();
  const auto& nccl = ctx.nccl;
  return resize_data_parallel(b.graph, st, to, hw.nvlink_domain_size(), ratio, ctx.comm_hw_note, nccl ? &nccl->first : nullptr,
                              nccl ? &nccl->second : nullptr, lone_collectives(ctx.job, b), ctx.shape_to ? ctx.shape_to->tp : 0);
}

/// The DP rewrite as change records: the resize (subject "DP") and the notes on how it was timed.
[[nodiscard]] inline change_list dp_changes(const dp_rewrite_stats& d) {
  const std::string pass = "data parallel";
  if (d.unchanged) return {changed(pass, "DP", std::to_string(d.to), std::to_string(d.to), "DP " + std::to_string(d.to) + " -> " + std::to_string(d.to) + ": unchanged")};
  if (d.no_dp_group) {
    return {changed(pass, "DP", std::to_string(d.from), std::to_string(d.to),
                    "DP " + std::to_string(d.from) + " -> " + std::to_string(d.to) +
                        ": the trace has no gradient collective (no DP group), nothing to resize")};
  }
  change_list out;
  if (d.modelled > 0) {
    out.push_back(note(pass, "gradient collectives",
                       std::to_string(d.modelled) + " sized gradient collectives resized by the " + d.profile +
                           " profile's NCCL model (new group over old, each placed at its members' ranks: TP " + std::to_string(d.tp_to) +
                           (d.tp_to != d.tp ? " apart, the traced TP " + std::to_string(d.tp) : std::string(" apart")) + ", up to " +
                           std::to_string(d.modelled_per_node) + " on a node), anchored on each measured time"));
  }
  if (d.unsized) {
    out.push_back(note(pass, "gradient collectives",
                       "the trace records no message size for some gradient collectives: their measured time is scaled by the "
                       "ring factor alone (bus_factor(n')/bus_factor(n)), as if it were all bandwidth time"));
  }
  if (d.others) {
    out.push_back(note(pass, "other DP collectives",
                       "collectives of the DP group that are not gradient reductions (all-to-all, broadcast) keep their measured "
                       "time and group"));
  }
  char line[640];
  for (const auto& [kind, f] : d.fits) {
    std::snprintf(line, sizeof line, "communication model for %s: %.1f us + bus_factor(n) x bytes / %.1f GB/s (%s)",
                  std::string(model::to_string(kind)).c_str(), f.alpha_ns / 1e3, f.busbw, f.how.c_str());
    out.push_back(note(pass, "communication model", line));
  }
  const std::string with_tp =
      d.tp_to != d.tp ? " with TP " + std::to_string(d.tp) + " -> " + std::to_string(d.tp_to) + " (a group's members are TP apart)" : "";
  const std::string lone = d.lone > 0 ? ", " + std::to_string(d.lone) + " of them ops whose peers are absent from the job" : "";
  const bool leaves_node = static_cast<long long>(d.to) * d.tp_to > d.gpus_per_node && static_cast<long long>(d.from) * d.tp <= d.gpus_per_node;
  const std::string inter = leaves_node ? "; beyond " + std::to_string(d.gpus_per_node) +
                                              " GPUs per node the bandwidth term uses the inter-node link, x" +
                                              std::to_string(d.inter_over_intra).substr(0, 5) + " of the fitted one (" + d.inter_source + ")"
                                        : "";
  std::snprintf(line, sizeof line,
                "DP %d -> %d%s: %zu gradient collectives resized%s (ring factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter "
                "and all-gather%s): %.3f -> %.3f ms of transfer time over the traced ranks; the traced ranks stand for every "
                "replica (replicas are symmetric), so the predicted job keeps %zu ranks rather than growing x%.2f",
                d.from, d.to, with_tp.c_str(), d.collectives, lone.c_str(), inter.c_str(), static_cast<double>(d.before) / 1e6,
                static_cast<double>(d.after) / 1e6, d.ranks, static_cast<double>(d.to) / d.from);
  out.push_back(changed(pass, "DP", std::to_string(d.from), std::to_string(d.to), line,
                        {time_figure("gradient transfer time", d.before, d.after), count_figure("collectives resized", d.collectives)}));
  return out;
}

/// A TP change alone moves the DP groups' members (TP apart) across nodes.
[[nodiscard]] inline bool tp_moves_dp(const context& ctx) {
  return ctx.shape_from && ctx.shape_to && ctx.shape_from->tp != ctx.shape_to->tp && ctx.known_structure() &&
         ctx.known_structure()->parallel.dp.value.value_or(1) > 1;
}

/// A copy of `st` whose groups that a pass before re-timed for the target's DP
/// (`context::gradient_groups_sized`) are no DP group, as their collectives are the target's
/// already; none when there are no such groups.
[[nodiscard]] inline std::optional<job_structure> without_sized_groups(const context& ctx, const job_structure& st) {
  if (ctx.gradient_groups_sized.empty()) return std::nullopt;
  return with_dp_groups(st, [&](const std::string& name) { return !ctx.gradient_groups_sized.contains(name); });
}

/// Pass: data-parallel replicas (`--dp`; `--global-batch` alone keeps the traces' DP, and a TP
/// change alone moves the DP groups across nodes). The traced gradient collectives are resized
/// (`resize_data_parallel`); from one replica Megatron's reduction is inserted
/// (gradient_buckets.hpp); the distributed optimizer's kernels step 1/N of the parameters.
/// Sets `ctx.dp_from` and `ctx.dp_to`.
struct data_parallel_pass {
  [[nodiscard]] bool wanted(const context& ctx) const {
    return ctx.options.dp || ctx.options.global_batch || tp_moves_dp(ctx);
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    if (ctx.hsdp_rewritten) return {};  // the shard and replica groups' collectives are HSDP's (hsdp.hpp)
    const job_structure& st = ctx.structure(b);
    // Under context parallelism the gradient group holds DP x CP ranks: it is resized from its
    // size in the graph (the traces' DP x CP, or the target's where the stage buckets were
    // inserted) to the target's, and the CP pass leaves the gradients to this one.
    const int cp_from = ctx.traced_cp(), cp_to = ctx.target_cp();
    const std::optional<int> replicas = ctx.traced_replicas();
    const int group_to = ctx.target_gradient_group();
    const std::optional<job_structure> trimmed = without_sized_groups(ctx, st);
    const dp_rewrite_stats d = resize_gradient_group(ctx, b, trimmed ? *trimmed : st, group_to);
    ctx.dp_from = replicas.value_or(d.from), ctx.dp_to = group_to / cp_to;
    change_list out;
    if (d.from == 1 && d.to > 1 && d.no_dp_group) {
      out.push_back(insert_reduction(ctx, b, d.to));
    } else {
      out = dp_changes(d);
    }
    if (cp_from > 1 || cp_to > 1) {
      out.push_back(note("data parallel", "DP x CP",
                         "the gradient group holds DP x CP ranks: " + std::to_string(*ctx.dp_from) + " x " + std::to_string(cp_from) + " -> " +
                             std::to_string(*ctx.dp_to) + " x " + std::to_string(cp_to) + " (the replicas follow --dp, CP --cp)"));
    }
    const int group_from = replicas ? *replicas * cp_from : d.from;
    if (group_from != d.to) {
      const change_list shard = shard_change(ctx, b, group_from, d.to);
      out.insert(out.end(), shard.begin(), shard.end());
    }
    return out;
  }

  /// The distributed optimizer's step over 1/`to` of the parameters instead of 1/`from` (the
  /// traced gradient group and the target's).
  [[nodiscard]] static change_list shard_change(context& ctx, graph::built_job& b, int from, int to) {
    const double min_ns = ctx.costs(b).profile.min_kernel_ns;
    const shape_stats sh = shard_optimizer(b, ctx.structure(b), from, to, min_ns, ctx.buckets_inserted);
    if (sh.optimizer == 0) return {};
    char line[256];
    std::snprintf(line, sizeof line,
                  "distributed optimizer (gradients reduce-scattered, parameters all-gathered): each rank steps 1/%d of the "
                  "parameters instead of 1/%d, %zu optimizer kernels %.3f -> %.3f ms",
                  to, from, sh.optimizer, static_cast<double>(sh.before) / 1e6, static_cast<double>(sh.after) / 1e6);
    return {changed("data parallel", "optimizer share", "1/" + std::to_string(from), "1/" + std::to_string(to), line,
                    {time_figure("optimizer kernel time", sh.before, sh.after)})};
  }

  /// One replica traced and `dp` asked: no gradient reduction to resize, so Megatron's is inserted.
  [[nodiscard]] static change insert_reduction(context& ctx, graph::built_job& b, int dp) {
    try {
      const job_structure& st = ctx.structure(b);
      const shape_config from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
      const std::int64_t vocab = traced_vocab_local(ctx.job, st, from) * from.tp;
      const bucket_insertion bi = insert_target_buckets(ctx, b, dp, from, vocab);
      return bucket_change(bi, dp, bucket_profile_name(ctx, b), ctx.options.layers.has_value());
    } catch (const error& e) {
      return note("data parallel", "gradient buckets", "DP 1 -> " + std::to_string(dp) + ": no gradient reduction inserted (" + e.what() + ")");
    }
  }
};
static_assert(Rewrite<data_parallel_pass>);

/// Pass: the micro-batches per replica that the global batch implies, after a DP change or with
/// `--global-batch` (`plan_micro_batches`), or when the micro-batch size changes and the global
/// batch stays. Sets `ctx.micro_batches`; the micro-batch and stage-split passes make the change.
struct batch_pass {
  [[nodiscard]] bool wanted(const context& ctx) const {
    const bool replicas = ctx.dp_from && (*ctx.dp_from != *ctx.dp_to || ctx.options.global_batch);
    return replicas || size_changes(ctx);
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    change_list out;
    if (ctx.dp_from && (*ctx.dp_from != *ctx.dp_to || ctx.options.global_batch)) out = for_replicas(ctx, b);
    if (size_changes(ctx)) out.push_back(for_size(ctx, b));
    return out;
  }

  /// The micro-batch size changes and the global batch stays (no `--global-batch`).
  [[nodiscard]] static bool size_changes(const context& ctx) {
    return ctx.shape_from && ctx.shape_to && ctx.shape_to->micro_batch != ctx.shape_from->micro_batch && !ctx.options.global_batch &&
           ctx.known_structure() && ctx.known_structure()->parallel.micro_batches.known();
  }

  /// After a DP change or with `--global-batch`.
  [[nodiscard]] static change_list for_replicas(context& ctx, graph::built_job& b) {
    const whatif_options& o = ctx.options;
    const job_structure& st = ctx.structure(b);
    const auto& par = st.parallel;
    const int from = *ctx.dp_from, to = *ctx.dp_to;
    const std::string pass = "global batch";
    if (!par.micro_batches.known()) {
      // Without the traces' count neither the global batch nor a new count per replica can be
      // made: say so, rather than take the traces for one micro-batch.
      const std::string& why = par.micro_batches.source.empty() ? par.schedule.source : par.micro_batches.source;
      if (o.global_batch) {
        throw error("whatif --global-batch: the traces' micro-batches per replica are not known (" + why +
                    "); `lumos inspect --structure` shows what was found");
      }
      return {note(pass, "micro-batches per replica",
                   "micro-batches per replica: not known in the traces (" + why +
                       "): the per-replica batch is kept, so the global batch goes with the replicas (x" + std::to_string(to) + "/" +
                       std::to_string(from) + ")")};
    }
    change_list out;
    const int m = *par.micro_batches.value;
    std::optional<std::int64_t> global_micro_batches;
    if (o.global_batch) {
      // In sequences: counted in micro-batches of the target's size (--micro-batch), else the traces'.
      const auto& mbs = st.model.micro_batch_size;
      const bool resized = ctx.shape_to && ctx.shape_from && ctx.shape_to->micro_batch != ctx.shape_from->micro_batch;
      const std::int64_t sequences = resized ? ctx.shape_to->micro_batch : mbs.value.value_or(1);
      if (*o.global_batch % sequences != 0) {
        throw error("whatif --global-batch " + std::to_string(*o.global_batch) + ": not a multiple of the " +
                    (resized ? "target's" : "traces'") + " micro-batch size " + std::to_string(sequences));
      }
      global_micro_batches = *o.global_batch / sequences;
      if (!resized && !mbs.known()) {
        out.push_back(note(pass, "global batch",
                           "--global-batch counted in micro-batches of 1 sequence: the traces' micro-batch size is not known (" + mbs.source + ")"));
      }
    }
    const micro_batch_plan mp = plan_micro_batches(m, from, to, global_micro_batches);
    if (mp.micro_batches != m) {
      ctx.micro_batches = mp.micro_batches;
      out.push_back(changed(pass, "micro-batches per replica", std::to_string(m), std::to_string(mp.micro_batches),
                            "micro-batches per replica " + std::to_string(m) + " -> " + std::to_string(mp.micro_batches) + ": " + mp.why));
    } else {
      out.push_back(note(pass, "micro-batches per replica", "micro-batches per replica: " + mp.why));
    }
    return out;
  }

  /// Sequences per micro-batch changed: the global batch stays, so the count of micro-batches per
  /// replica changes inversely (as `lumos predict --micro-batch` with the same --global-batch).
  [[nodiscard]] static change for_size(context& ctx, graph::built_job& b) {
    const job_structure& st = ctx.structure(b);
    const std::string pass = "global batch";
    const std::int64_t m = ctx.micro_batches.value_or(*st.parallel.micro_batches.value);
    const std::int64_t sequences = m * ctx.shape_from->micro_batch;
    const std::int64_t size = ctx.shape_to->micro_batch;
    if (m == 1 && st.parallel.pp.value.value_or(1) <= 1) {
      // One micro-batch and no stages: no gradient accumulation to trade against, the
      // micro-batch is the batch (a plain training loop), so the batch changes with it.
      return changed(pass, "batch per replica", std::to_string(sequences), std::to_string(size),
                     "one micro-batch per iteration and no pipeline stages (no gradient accumulation): the batch per replica changes "
                     "with the micro-batch size, " + std::to_string(sequences) + " -> " + std::to_string(size) + " sequences");
    }
    if (sequences % size != 0) {
      return note(pass, "micro-batches per replica",
                  "micro-batch size " + std::to_string(size) + " does not divide the " + std::to_string(sequences) +
                      " sequences per replica: the count of micro-batches is kept (" + std::to_string(m) + "), the batch grows");
    }
    model::check_micro_batch_count(sequences / size,
                                   "whatif --micro-batch " + std::to_string(size) + ": the " + std::to_string(sequences) +
                                       " sequences per replica kept",
                                   "raise --micro-batch or --dp, or lower --global-batch");
    ctx.micro_batches = static_cast<int>(sequences / size);
    return changed(pass, "micro-batches per replica", std::to_string(m), std::to_string(*ctx.micro_batches),
                   "micro-batches per replica " + std::to_string(m) + " -> " + std::to_string(*ctx.micro_batches) + ": the " +
                       std::to_string(sequences) + " sequences per replica kept at micro-batch size " + std::to_string(size));
  }
};
static_assert(Rewrite<batch_pass>);

/// Pass: larger stages move pipeline neighbours (and the tied embedding's stages) apart, a deeper
/// pipeline moves the last stage: the transfers whose members change how many nodes they span
/// are re-timed by the traced cluster's NCCL model (`retime_across_nodes`). Without a profile or
/// preset they keep their time. The stage split re-times the traced send/recv pairs itself.
struct node_placement_pass {
  [[nodiscard]] bool wanted(const context& ctx) const {
    if (!ctx.known_structure() || !ctx.nccl) return false;
    const auto [from, to] = layouts(ctx);
    return from.tp != to.tp || from.dp != to.dp || from.pp != to.pp;
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const auto [from, to] = layouts(ctx);
    const std::string moved = retime_across_nodes(b.graph, ctx.structure(b), from, to, ctx.nccl->first, ctx.nccl->second, ctx.split.in_graph);
    if (moved.empty()) return {};
    return {note("node placement", "cross-node transfers", moved)};
  }
  /// The traced rank layout and the target's; a stage's ranks are TP x DP x CP (`dp`: the
  /// gradient group of DP x CP ranks).
  [[nodiscard]] static std::pair<rank_layout, rank_layout> layouts(const context& ctx) {
    const auto& par = ctx.traced_structure()->parallel;
    const rank_layout from{ctx.shape_from ? ctx.shape_from->tp : par.tp.value.value_or(1), par.dp.value.value_or(1), ctx.traced_pp()};
    const rank_layout to{ctx.shape_to ? ctx.shape_to->tp : from.tp, ctx.target_gradient_group(), ctx.options.pp.value_or(from.pp)};
    return {from, to};
  }
};
static_assert(Rewrite<node_placement_pass>);

}  // namespace lumos::whatif

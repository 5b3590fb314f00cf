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

/// Latency + bandwidth fit of one collective kind: t = alpha + bus_factor(n)·bytes / busbw.
struct comm_fit {
  double alpha_ns = 0;   ///< fixed time per collective
  double busbw = 0;      ///< bytes/ns on the bus (nccl-tests convention)
  std::size_t samples = 0;
  std::string how;       ///< "least squares over K collectives", "one size: bandwidth only", ...

  [[nodiscard]] double time_ns(model::collective c, double bytes, std::int64_t n) const noexcept {
    if (n <= 1 || bytes <= 0) return 0.0;
    return alpha_ns + model::bus_factor(c, n) * bytes / busbw;
  }
};

/// The names of the process groups structure discovery gave `role`.
[[nodiscard]] inline std::set<std::string> groups_with_role(const job_structure& st, group_role role) {
  std::set<std::string> out;
  for (const auto& pg : st.groups) {
    for (const auto& r : pg.roles) {
      if (r.value == role) out.insert(pg.name);
    }
  }
  return out;
}

/// The model kind of a graph collective's kind string, if it is one the fit knows.
[[nodiscard]] inline std::optional<model::collective> collective_of_kind(std::string_view kind) {
  std::string k(kind);
  std::erase(k, '_');
  if (k == "allreduce") return model::collective::all_reduce;
  if (k == "allgather") return model::collective::all_gather;
  if (k == "reducescatter") return model::collective::reduce_scatter;
  if (k == "broadcast") return model::collective::broadcast;
  if (k == "alltoall") return model::collective::all_to_all;
  return std::nullopt;
}

/// Bytes per element of the data type an NCCL kernel's name carries (ncclDevKernel_AllReduce_
/// Sum_f32_RING_LL: 4; NCCL before 2.19, ncclKernel_AllReduce_RING_LL_Sum_float: 4), else 1: a
/// traced `collective_instance::bytes` counts elements (In msg nelems), and the NCCL model wants
/// bytes. All-gather and send/recv kernels name no type (they copy bytes): 1, their elements.
[[nodiscard]] inline std::int64_t element_bytes_of_kernel(std::string_view name) noexcept {
  struct type {
    std::string_view token;
    std::int64_t bytes;
  };
  constexpr type types[] = {{"_f32_", 4}, {"_bf16_", 2}, {"_f16_", 2}, {"_f64_", 8}, {"_i32_", 4}, {"_u32_", 4},
                            {"_i64_", 8}, {"_u64_", 8}, {"_i8_", 1}, {"_u8_", 1}, {"_bfloat16", 2}, {"_half", 2},
                            {"_double", 8}, {"_float", 4}};
  for (const type& t : types) {
    if (name.find(t.token) != std::string_view::npos) return t.bytes;
  }
  return 1;
}

/// Fits `comm_fit` for kind `c` on every matched instance of that kind in `g` with a known size:
/// x = bus_factor(n)·bytes, y = the transfer time (mean over participants). Least squares when
/// the sizes differ and the fit is physical (alpha ≥ 0, bandwidth > 0), else bandwidth through
/// the origin. Throws when no instance has a size.
[[nodiscard]] inline comm_fit fit_collective(const graph::task_graph& g, model::collective c) {
  std::vector<double> xs, ys;
  for (const auto& ci : g.collectives) {
    const auto k = collective_of_kind(ci.kind);
    if (!k || *k != c || ci.bytes <= 0 || ci.complete.empty()) continue;
    const auto n = static_cast<std::int64_t>(ci.group_ranks.empty() ? ci.complete.size() : ci.group_ranks.size());
    if (n <= 1) continue;
    double sum = 0;
    for (const graph::task_id t : ci.complete) sum += static_cast<double>(g.duration[t]);
    xs.push_back(model::bus_factor(c, n) * static_cast<double>(ci.bytes));
    ys.push_back(sum / static_cast<double>(ci.complete.size()));
  }
  if (xs.empty()) throw error("whatif --dp: the trace has no sized collective of this kind to fit a communication model on");
  comm_fit f;
  f.samples = xs.size();
  const double n = static_cast<double>(xs.size());
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) mx += xs[i] / n, my += ys[i] / n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  if (xs.size() >= 2 && sxx > 0 && sxy > 0 && my - sxy / sxx * mx >= 0) {
    f.busbw = sxx / sxy;
    f.alpha_ns = my - mx / f.busbw;
    f.how = "least squares over " + std::to_string(xs.size()) + " collectives";
  } else {
    f.busbw = my > 0 ? mx / my : 1.0;
    f.alpha_ns = 0;
    f.how = "bandwidth through the origin over " + std::to_string(xs.size()) + " collective(s) (sizes too alike for a latency)";
  }
  return f;
}

/// A communication op whose peers are absent from the job (traces written one rank per pipeline
/// stage: its DP partners were not written), with what its arguments say. Unmatched, it is a
/// single gpu_comm task, not a `collective_instance`, and `resize_data_parallel` resizes it as it
/// does the matched ones.
struct lone_collective {
  graph::task_id task = graph::no_task;  ///< its gpu_comm task
  graph::task_id arrive = graph::no_task;  ///< its comm_arrive task (its peer wait leads to `task`)
  std::string group;                     ///< Process Group Name ("" when not recorded)
  std::string kind;                      ///< "allreduce", "reducescatter", ... (detail::comm_kind)
  std::int64_t elements = 0;             ///< In msg nelems, as collective_instance::bytes (0: unknown)
  std::int64_t group_size = 0;           ///< Group size (0: unknown)
};

/// The communication ops of `job` that matched no peer, read from their args or from those of
/// the record_param_comms op that carries them. Needs the event-to-task maps (`b.ranks`).
[[nodiscard]] inline std::vector<lone_collective> lone_collectives(const trace::job& job, const graph::built_job& b) {
  std::vector<lone_collective> out;
  for (std::size_t ri = 0; ri < job.ranks.size() && ri < b.ranks.size(); ++ri) {
    const trace::rank_trace& t = job.ranks[ri];
    const auto& task_of = b.ranks[ri].task_of_event;
    const detail::comm_args_source args_of(t);
    for (std::uint32_t i = 0; i < t.events.size() && i < task_of.size(); ++i) {
      const graph::task_id task = task_of[i];
      if (task == graph::no_task || task >= b.graph.task_count() || b.graph.kind[task] != graph::task_kind::gpu_comm) continue;
      const std::uint32_t src = args_of.of(i);
      lone_collective c;
      c.task = task;
      const auto& arrive_of = b.ranks[ri].arrive_of_event;
      if (i < arrive_of.size()) c.arrive = arrive_of[i];
      c.group = std::string(t.arg_text(src, trace::arg_key::process_group_name));
      c.kind = detail::comm_kind(t.name(t.events[i]), t.arg_text(src, trace::arg_key::collective_name));
      if (const auto v = t.arg(src, trace::arg_key::in_msg_nelems)) c.elements = *v;
      if (const auto v = t.arg(src, trace::arg_key::group_size)) c.group_size = detail::group_size_of(*v).value_or(0);
      out.push_back(std::move(c));
    }
  }
  return out;
}

/// What the DP rewrite did.
struct dp_rewrite_stats {
  int from = 1, to = 1;
  std::size_t collectives = 0;  ///< instances resized
  std::size_t lone = 0;         ///< of them, ops whose peers are absent from the job (`lone_collective`)
  std::size_t modelled = 0;     ///< of them, by the profile's NCCL model
  time_ns before = 0, after = 0;  ///< their transfer time, summed over participants
  bool no_dp_group = false;       ///< the traces have no gradient collective: nothing was resized
  std::vector<std::string> changes;
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
    p.micro_batches = static_cast<int>(*global_micro_batches / dp_new);
    p.why = "global batch " + std::to_string(*global_micro_batches) + " micro-batches (--global-batch): " +
            std::to_string(p.micro_batches) + " per replica";
    return p;
  }
  const long long global = static_cast<long long>(m) * dp_old;
  if (global % dp_new == 0) {
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
/// traced rank s·(tp·dp) + d·tp + t becomes s'·(tp'·dp') + d·tp' + (t mod tp'), with s' =
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
  const std::int64_t G = hw.gpus_per_node, old_stride = from.stage_stride(), new_stride = to.stage_stride();
  const bool depth_changes = from.pp != to.pp;
  // A smaller TP folds the traced TP ranks beyond the new size onto the new group's ranks
  // (traced rank t replays as t mod the new TP), so they land on the node of the rank they stand for.
  auto renumbered = [&](std::int64_t r) {
    const std::int64_t x = r % old_stride;
    const std::int64_t s = traced_stage_to(static_cast<int>(r / old_stride), from.pp, to.pp);
    return s * new_stride + x / from.tp * to.tp + x % from.tp % to.tp;
  };
  std::size_t moved = 0;
  time_ns before = 0, after = 0;
  for (auto& ci : g.collectives) {
    if (ci.bytes <= 0 || ci.group_ranks.size() < 2 || own_rewrite.count(ci.group)) continue;
    // The traced elements in bytes: priced at a quarter of its size, the tied embedding's fp32
    // all-reduce of a 4-layer hidden-1024 job moved to another node was 1.93 ms where the job
    // synthesised so ran 2.25 (`--dp 4` from TP 2 PP 2 DP 2: -1.92 %).
    const std::int64_t bytes = ci.bytes * (ci.complete.empty() ? 1 : element_bytes_of_kernel(g.task_name(ci.complete.front())));
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
/// more nodes than n (`gpus_per_node` GPUs per node), the bandwidth term of T(n') uses the
/// inter-node bandwidth (`inter_over_intra` of the intra-node one). Group sizes in the graph
/// are set to n' (ranks beyond the traced ones are not in the graph: replicas are symmetric).
/// Identity (n' = n) leaves every duration as it is. Throws when the trace's DP size or DP
/// collectives are unknown.
///
/// With `nccl` and `hw` (the cost profile and machine of the GPU the traces ran on), a sized
/// collective's ratio is the profile's NCCL model (protocols, hierarchical intra/inter-node
/// placement, as `lumos synth` and `predict` time it) of the new group over the old one, with
/// the members TP apart: min(n, gpus_per_node / TP) of them on a node.
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
  const int tp = st.parallel.tp.value.value_or(1);
  const int tp_new = tp_to > 0 ? tp_to : tp;
  if (out.from == dp && tp_new == tp) {
    out.changes.push_back("DP " + std::to_string(dp) + " -> " + std::to_string(dp) + ": unchanged");
    return out;
  }
  if (dp_groups.empty()) {
    out.no_dp_group = true;
    out.changes.push_back("DP " + std::to_string(out.from) + " -> " + std::to_string(dp) +
                          ": the trace has no gradient collective (no DP group), nothing to resize");
    return out;
  }
  std::map<model::collective, comm_fit> fits;
  bool unsized = false, others = false;
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
  // Megatron numbers ranks (TP innermost, then DP, then PP): the rank's stage and TP column kept.
  // A group need not start at a node boundary (TP 2, DP 3: stage 1's groups are {6, 8, 10} and
  // {7, 9, 11}, two members on one node and one on the next), which the placement then prices
  // as lumos synth does (`model::placement_of`).
  auto members_of = [&](int rank, std::int64_t members, int tp_of) {
    const std::int64_t stage = rank / (static_cast<std::int64_t>(tp) * out.from);
    const std::int64_t first = stage * tp_of * members + rank % tp % std::max(1, tp_of);
    std::vector<int> ranks;
    for (std::int64_t i = 0; i < members; ++i) ranks.push_back(static_cast<int>(first + i * tp_of));
    return ranks;
  };
  // The factor on the transfer time of a collective of `kind` and `bytes` (0: unknown) from n
  // to n_new members; `rank`, a traced member's number (-1: unknown, the groups then start at a
  // node boundary).
  auto ratio_of = [&](model::collective kind, std::int64_t bytes, std::int64_t n, std::int64_t n_new, int rank) {
    // GPUs a group's ranks occupy: its members are TP apart, so it leaves a node once n · tp
    // exceeds the node.
    const bool crossed_before = n * tp > gpus_per_node, crossed_after = n_new * tp_new > gpus_per_node;
    const double slower = crossed_after && !crossed_before ? inter_over_intra : 1.0;
    if (bytes > 0 && nccl != nullptr && hw != nullptr) {
      auto placed = [&](std::int64_t members, int tp_of) {
        const std::int64_t per_node = std::max<std::int64_t>(1, hw->gpus_per_node / std::max(1, tp_of));
        const std::int64_t r = std::min(members, per_node);
        return model::group_placement{members - members % r, r};
      };
      const std::int64_t size = std::max<std::int64_t>(1, bytes * tp / tp_new);
      // (Groups whose ranks would pass 2^30 are placed from a node boundary instead.)
      const std::int64_t stages = rank / (static_cast<std::int64_t>(tp) * out.from) + 1;
      const bool at_ranks = rank >= 0 && std::max(n * tp, n_new * tp_new) <= (std::int64_t{1} << 30) / stages;
      const auto t_old = nccl->collective_time({kind, size, at_ranks ? model::placement_of(members_of(rank, n, tp), *hw) : placed(n, tp)}, *hw);
      const auto t_new =
          nccl->collective_time({kind, size, at_ranks ? model::placement_of(members_of(rank, n_new, tp_new), *hw) : placed(n_new, tp_new)}, *hw);
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
    const double ratio = ratio_of(*kind, ci.bytes, n, n_new, member);
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
    const double ratio = ratio_of(*kind, c.elements, n, std::max<std::int64_t>(1, n * dp / out.from), g.rank[c.task]);
    rescale(c.task, ratio);
    ++out.collectives, ++out.lone;
  }
  if (out.modelled > 0) {
    out.changes.push_back(std::to_string(out.modelled) + " sized gradient collectives resized by the " + (nccl != nullptr ? nccl->profile.name : std::string()) +
                          " profile's NCCL model (new group over old, each placed at its members' ranks: TP " + std::to_string(tp_new) +
                          (tp_new != tp ? " apart, the traced TP " + std::to_string(tp) : std::string(" apart")) +
                          ", up to " + std::to_string(std::max(1, hw->gpus_per_node / std::max(1, tp_new))) +
                          " on a node), anchored on each measured time");
  }
  if (unsized) {
    out.changes.push_back("the trace records no message size for some gradient collectives: their measured time is scaled by the "
                          "ring factor alone (bus_factor(n')/bus_factor(n)), as if it were all bandwidth time");
  }
  if (others) {
    out.changes.push_back("collectives of the DP group that are not gradient reductions (all-to-all, broadcast) keep their measured "
                          "time and group");
  }
  char line[640];
  for (const auto& [kind, f] : fits) {
    std::snprintf(line, sizeof line, "communication model for %s: %.1f us + bus_factor(n) x bytes / %.1f GB/s (%s)",
                  std::string(model::to_string(kind)).c_str(), f.alpha_ns / 1e3, f.busbw, f.how.c_str());
    out.changes.emplace_back(line);
  }
  std::snprintf(line, sizeof line,
                "DP %d -> %d%s: %zu gradient collectives resized%s (ring factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter "
                "and all-gather%s): %.3f -> %.3f ms of transfer time over the traced ranks; the traced ranks stand for every "
                "replica (replicas are symmetric), so the predicted job keeps %zu ranks rather than growing x%.2f",
                out.from, dp, tp_new != tp ? (" with TP " + std::to_string(tp) + " -> " + std::to_string(tp_new) + " (a group's members are TP apart)").c_str() : "",
                out.collectives,
                out.lone > 0 ? (", " + std::to_string(out.lone) + " of them ops whose peers are absent from the job").c_str() : "",
                (static_cast<long long>(dp) * tp_new > gpus_per_node && static_cast<long long>(out.from) * tp <= gpus_per_node)
                    ? ("; beyond " + std::to_string(gpus_per_node) + " GPUs per node the bandwidth term uses the inter-node link, x" +
                       std::to_string(inter_over_intra).substr(0, 5) + " of the fitted one (" + inter_source + ")")
                          .c_str()
                    : "",
                static_cast<double>(out.before) / 1e6, static_cast<double>(out.after) / 1e6, st.ranks.size(),
                static_cast<double>(dp) / out.from);
  out.changes.emplace_back(line);
  return out;
}

}  // namespace lumos::whatif

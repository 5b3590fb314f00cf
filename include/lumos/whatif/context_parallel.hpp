#pragma once
// The context-parallel what-if (`lumos whatif --cp N`, with or without `--seq`). Context
// parallelism is a per-rank sequence change plus an attention fraction, which the shape pass makes
// (shape.hpp with `shape_config::cp`): a rank holds seq / cp tokens of every sequence, its
// per-token kernels follow them and its attention is 1/cp of the causal attention of the whole
// sequence (causal load balancing), through the kernel-level model. This pass, after it, does
// what only context parallelism has:
//  - the key/value exchange of each layer's attention, as `model::context_parallel_exchange`
//    prices it: ring attention (Transformer Engine's p2p: cp - 1 send/recv steps of the rank's
//    K/V chunk, 2·b·s/cp·kv heads/TP·head dim·2 bytes in forward and twice that in backward, by
//    the NCCL model's p2p time) or the all-gather variant (Llama 3's: an all-gather of the whole K
//    and V, cp chunks, before the forward attention and a reduce-scatter of dK, dV after the
//    backward one, by the NCCL model's collective time over the CP group, its ranks TP apart).
//    Traced exchanges are re-timed by the model's ratio (their kernel count kept), emptied to CP 1
//    (their launches kept) or removed with their launches where the other variant replaces them; the target's
//    are inserted from CP 1 or from the other variant as the synthetic builder places them — the
//    ring launched right before the attention kernel, on a context-parallel stream of the rank's
//    own, after the GPU op before the attention, and the op after the attention waits for it; the
//    all-gather on the compute stream right before the forward attention, the reduce-scatter
//    right after the backward attention, each launched after that op's launch;
//  - the gradient reduction over DP × CP: each gradient collective re-timed by the NCCL model
//    from the traced group's size to size / traced CP × target CP (the data-parallel size stays
//    the traces'), and a distributed optimizer's step over 1/(DP × CP) of the parameters; with a
//    data-parallel change the data-parallel pass resizes the group instead, to DP' × CP'.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/detail/shape_groups.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/precision.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/tensor_parallel.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// What a context-parallel change did.
struct cp_stats {
  std::size_t retimed = 0, removed = 0, inserted = 0;  ///< exchange kernels
  std::size_t gradient = 0;                            ///< gradient collectives re-timed
  time_ns exchange_before = 0, exchange_after = 0;     ///< exchange transfer time
  time_ns gradient_before = 0, gradient_after = 0;
  std::int64_t chunk_from = 0, chunk_to = 0;           ///< K/V bytes of a rank's chunk
  int gradient_from = 0, gradient_to = 0;              ///< gradient group size
};

/// One layer's all-gather of K and V (forward) or reduce-scatter of dK, dV (backward) with `cp`
/// ranks, chunk `chunk`, TP `tp`: the NCCL model's collective of cp x chunk bytes over the CP group
/// at its placement (`model::context_parallel_group`: cp ranks TP apart); 0 at CP 1.
[[nodiscard]] inline double cp_collective_ns(int cp, int tp, std::int64_t chunk, bool backward, const model::cost_profile& profile,
                                             const model::hardware& hw) {
  if (cp <= 1) return 0.0;
  const model::collective_op op{backward ? model::collective::reduce_scatter : model::collective::all_gather, chunk * cp,
                                model::detail::place(0, tp, cp, hw)};
  return static_cast<double>(model::nccl_model{profile}.collective_time(op, hw));
}

/// Bytes of a rank's key/value chunk in shape `c` (`model::context_parallel_kv_bytes`): 2 (K, V)
/// x b x seq/cp x kv heads/TP x head dim x 2 bytes. `kv_heads` of the whole model.
[[nodiscard]] inline std::int64_t cp_chunk_bytes(const shape_config& c, std::int64_t kv_heads) {
  return 2 * c.micro_batch * c.local_seq() * (kv_heads / std::max(c.tp, 1)) * c.head_dim * 2;
}

/// One layer's exchange in forward (or backward: K, V and their gradients, twice the bytes) with
/// `cp` ranks and chunk `chunk`: cp - 1 steps of the NCCL model's p2p time on `link` (0 at CP 1).
[[nodiscard]] inline double cp_exchange_ns(int cp, std::int64_t chunk, bool backward, const model::nccl_link& link) {
  if (cp <= 1) return 0.0;
  const double bytes = static_cast<double>(chunk) * (backward ? 2.0 : 1.0);
  return static_cast<double>(cp - 1) * (link.simple_base_ns + bytes / link.busbw * 1e9);
}

namespace detail {

/// Per task, the task after it on its processor, from `prev` (`previous_on_processor`).
[[nodiscard]] inline std::vector<graph::task_id> next_on_processor(const std::vector<graph::task_id>& prev) {
  std::vector<graph::task_id> next(prev.size(), graph::no_task);
  for (graph::task_id t = 0; t < prev.size(); ++t) {
    if (prev[t] != graph::no_task) next[prev[t]] = t;
  }
  return next;
}

/// An attention operator of a forward or backward pass where an exchange goes: its first and last
/// GPU ops.
struct cp_site {
  graph::task_id first = graph::no_task, last = graph::no_task;
  bool backward = false;
};

/// The attention of each layer where an exchange is inserted, in every forward and backward pass:
/// the attention operators of a layer in a pass are one site, those of its forward apart from
/// those of its backward (a recomputed forward's own; by the operator's name), since Transformer
/// Engine's ring runs one attention call per ring step where the all-gather variant runs one.
[[nodiscard]] inline std::vector<cp_site> attention_sites(const trace::job& job, const graph::built_job& b, const job_structure& st) {
  std::vector<cp_site> out;
  std::tuple<std::size_t, int, int, bool> last{~std::size_t{0}, -1, -1, false};  // rank, pass, layer, a backward operator
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.comm || c.layer < 0 || c.shape_op == no_event || (c.phase != phase_kind::forward && c.phase != phase_kind::backward)) continue;
    const trace::rank_trace& tr = job.ranks[c.rank];
    const auto gs = gemm_of(tr.name(tr.events[c.shape_op]), parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)));
    if (!gs || gs->kind != gemm_shape::role::attention) continue;
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
    const std::string_view op = tr.name(tr.events[c.shape_op]);
    const std::tuple<std::size_t, int, int, bool> key{c.rank, c.pass, c.layer,
                                                      op.find("backward") != std::string_view::npos || op.find("Backward") != std::string_view::npos};
    if (key == last && !out.empty()) {
      out.back().last = map[c.op];
      continue;
    }
    last = key;
    out.push_back({map[c.op], map[c.op], c.phase == phase_kind::backward});
  }
  return out;
}

}  // namespace detail

/// Adds each exchange inserted by a CP change (its folded group's send/recv, all-gather or
/// reduce-scatter) and its launch to the layer task group of its attention — found from the ring's
/// op after the attention, which waits for it, the GPU op after an all-gather and the one before a
/// reduce-scatter — so that a layer or micro-batch change repeats or removes it with the layer.
/// `st` is the structure of `b`.
inline void attach_exchanges(job_structure& st, const graph::built_job& b) {
  const graph::task_graph& g = b.graph;
  const std::vector<graph::task_id> prev = detail::previous_on_processor(g);
  const std::vector<graph::task_id> next = detail::next_on_processor(prev);
  std::map<graph::task_id, graph::task_id> after, call;
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::cross_stream) after.emplace(e.from, e.to);
    if (e.kind == graph::edge_kind::launch) call.emplace(e.to, e.from);
  }
  std::map<graph::task_id, std::size_t> group_of;
  for (std::size_t i = 0; i < st.layer_groups.size(); ++i) {
    for (const graph::task_id t : st.layer_groups[i].tasks) group_of.emplace(t, i);
  }
  for (const graph::collective_instance& ci : g.collectives) {
    if (ci.group.rfind("cp.folded.", 0) != 0 || ci.arrive.size() != 1 || ci.complete.size() != 1) continue;
    graph::task_id anchor = graph::no_task;
    if (ci.kind == "allgather") {
      anchor = next[ci.complete.front()];
    } else if (ci.kind == "reducescatter") {
      anchor = prev[ci.arrive.front()];
    } else if (const auto a = after.find(ci.complete.front()); a != after.end()) {
      anchor = a->second;
    }
    const auto it = group_of.find(anchor);
    if (it == group_of.end()) continue;
    auto& tasks = st.layer_groups[it->second].tasks;
    if (const auto c = call.find(ci.arrive.front()); c != call.end()) tasks.push_back(c->second);
    tasks.insert(tasks.end(), {ci.arrive.front(), ci.complete.front()});
  }
}

/// From CP 1: an exchange inserted beside each of `sites` (attention kernel, backward) of `b` on a
/// context-parallel stream per rank (see the header comment), its transfer `fwd` or `bwd` ns,
/// launched with the profile's host time, a folded group per rank (`cp.folded.R`: the CP peers
/// run the same, so the transfer is its time). Returns the kernels inserted and their transfer
/// time.
inline std::pair<std::size_t, time_ns> insert_cp_exchanges(graph::built_job& b, const std::vector<detail::cp_site>& sites, time_ns fwd,
                                                           time_ns bwd, const model::cost_profile& profile) {
  graph::task_graph& g = b.graph;
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> launch_of(g.task_count(), none);
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    if (g.edges[i].kind == graph::edge_kind::launch) launch_of[g.edges[i].to] = i;
  }
  const std::vector<graph::task_id> prev = detail::previous_on_processor(g);
  const std::vector<graph::task_id> next = detail::next_on_processor(prev);
  const time_ns launch = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch);
  struct site {
    graph::task_id attention, before, after;
    std::uint32_t launch_edge;
    bool backward;
  };
  std::vector<insertion> ins;
  std::vector<site> placed;
  for (const detail::cp_site& cs : sites) {
    const graph::task_id t = cs.first;
    const bool backward = cs.backward;
    if (prev[t] == graph::no_task || next[t] == graph::no_task) continue;
    const std::uint32_t l = launch_of[t];
    const graph::task_id call = l != none ? g.edges[l].from : graph::no_task;
    if (call == graph::no_task || prev[call] == graph::no_task) continue;
    const time_ns at = g.observed_start[t];
    ins.push_back({.after = prev[call],
                   .spec = {.kind = graph::task_kind::cpu, .duration = launch, .busy_gap = host, .rank = g.rank[t],
                            .observed_start = g.observed_start[call], .observed_end = g.observed_start[call]},
                   .name = "cudaLaunchKernel"});
    for (const graph::task_kind k : {graph::task_kind::comm_arrive, graph::task_kind::comm_complete}) {
      ins.push_back({.after = prev[t],
                     .spec = {.kind = k, .duration = k == graph::task_kind::comm_complete ? (backward ? bwd : fwd) : 0, .rank = g.rank[t],
                              .observed_start = at, .observed_end = at},
                     .name = "ncclDevKernel_SendRecv"});
    }
    placed.push_back({t, prev[t], next[t], l, backward});
  }
  edited_graph e = insert_after(g, ins);
  std::map<int, graph::processor_id> stream;  // per rank: its context-parallel stream
  std::map<int, std::int64_t> sequence;
  time_ns transfer = 0;
  for (std::size_t i = 0; i < placed.size(); ++i) {
    const site& s = placed[i];
    transfer += s.backward ? bwd : fwd;
    const graph::task_id call = e.inserted[3 * i], arrive = e.inserted[3 * i + 1], complete = e.inserted[3 * i + 2];
    const int rank = e.graph.rank[arrive];
    auto [it, fresh] = stream.try_emplace(rank, graph::processor_id{});
    if (fresh) {
      const graph::processor_info& p = e.graph.processors[e.graph.processor[arrive]];
      it->second = e.graph.add_processor({.kind = graph::processor_kind::gpu_stream, .rank = rank, .owner = p.owner, .index = -15,
                                          .name = "rank " + std::to_string(rank) + " context-parallel stream"});
    }
    e.graph.processor[arrive] = e.graph.processor[complete] = it->second;
    const graph::edge& le = g.edges[s.launch_edge];
    e.graph.add_edge(call, arrive, le.delay, graph::edge_kind::launch, le.flags());
    e.graph.add_edge(arrive, complete, 0, graph::edge_kind::dependency);
    e.graph.add_edge(e.first(s.before), arrive, 0, graph::edge_kind::cross_stream);
    e.graph.add_edge(complete, e.first(s.after), 0, graph::edge_kind::cross_stream);
    add_folded_collective(e.graph, "sendrecv", "cp.folded." + std::to_string(rank), {}, 0, sequence[rank]++, arrive, complete,
                          "inserted by a CP change from 1 (the CP group folded onto its traced rank)");
  }
  (void)adopt(b, std::move(e));
  return {placed.size(), transfer};
}

/// The all-gather variant's collectives inserted at each of `sites` of `b` (see the header
/// comment), as TP collectives are (`insert_tp_hooks`: on the stream of the op they follow, launched
/// after its launch with the profile's host time): an all-gather of `fwd` ns after the GPU op
/// before a forward attention, a reduce-scatter of `bwd` ns after a backward attention's last op;
/// a folded group per rank (`cp.folded.R`: the CP peers run the same, so the transfer is its time).
/// Returns the collectives inserted and their transfer time.
inline std::pair<std::size_t, time_ns> insert_cp_collectives(graph::built_job& b, const std::vector<detail::cp_site>& sites, time_ns fwd,
                                                             time_ns bwd, const model::cost_profile& profile) {
  const std::vector<graph::task_id> prev = detail::previous_on_processor(b.graph);
  std::vector<tp_hook> hooks;
  time_ns transfer = 0;
  for (const detail::cp_site& s : sites) {
    const graph::task_id after = s.backward ? s.last : prev[s.first];
    if (after == graph::no_task) continue;
    hooks.push_back({after, s.backward ? tp_message::scatter : tp_message::gather});
    transfer += s.backward ? bwd : fwd;
  }
  std::array<tp_collective, tp_message_count> kind{};
  kind[static_cast<std::size_t>(tp_message::gather)] = launched_collective("allgather", fwd, "ncclDevKernel_AllGather_RING_LL", profile);
  kind[static_cast<std::size_t>(tp_message::scatter)] =
      launched_collective("reducescatter", bwd, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", profile);
  (void)adopt(b, insert_tp_hooks(b.graph, hooks, kind, "cp.folded.", "inserted by a CP change (the CP group folded onto its traced rank)"));
  return {hooks.size(), transfer};
}

/// Pass: a context-parallel change (`--cp`), or a shape change of traces with context parallelism
/// (their exchanges follow the chunk): see the header comment. Runs after the shape pass, which
/// rescales the kernels, and before the layers and micro-batches are copied.
struct context_parallel_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept {
    return ctx.shape_from && ctx.shape_to && (ctx.shape_from->cp > 1 || ctx.shape_to->cp > 1) && *ctx.shape_from != *ctx.shape_to;
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const shape_config& from = *ctx.shape_from;
    const shape_config& to = *ctx.shape_to;
    const job_structure& st = ctx.structure(b);
    const shape_costs costs = ctx.costs(b);
    const std::int64_t kv_from = st.model.kv_heads.value.value_or(from.heads);
    const std::int64_t kv_to = counted_transformer(to, st, 0, st.model.gated_mlp).kv_heads;
    cp_stats s;
    s.chunk_from = cp_chunk_bytes(from, kv_from), s.chunk_to = cp_chunk_bytes(to, kv_to);
    auto exchange_ns = [&](const shape_config& c, std::int64_t chunk, bool backward) {
      if (c.cp_comm == model::cp_comm_kind::allgather) return cp_collective_ns(c.cp, c.tp, chunk, backward, costs.profile, costs.hw);
      // The CP group inside an NVLink domain when TP x CP fits in it (model::context_parallel_group).
      const bool inter = static_cast<std::int64_t>(c.tp) * c.cp > costs.hw.nvlink_domain_size();
      return cp_exchange_ns(c.cp, chunk, backward, inter ? costs.profile.inter : costs.profile.intra);
    };
    const std::array<double, 2> old_ns{exchange_ns(from, s.chunk_from, false), exchange_ns(from, s.chunk_from, true)};
    const std::array<double, 2> new_ns{exchange_ns(to, s.chunk_to, false), exchange_ns(to, s.chunk_to, true)};
    // The traced exchanges of the other variant are emptied, the target's inserted.
    const bool replaced = from.cp > 1 && to.cp > 1 && from.cp_comm != to.cp_comm;
    retime(ctx, b, st, old_ns, replaced ? std::array<double, 2>{} : new_ns, s);
    // With a data-parallel change (or a TP change that moves the DP groups) the data-parallel
    // pass resizes the DP x CP group from the traces' to the target's in one step.
    const bool dp_resizes = data_parallel_pass{}.wanted(ctx);
    if (from.cp != to.cp && !dp_resizes) {
      gradients(ctx, b, st, from.cp, to.cp, from.tp, to.tp, costs, s);
      ctx.cp_gradients = true;
    }
    if (replaced) remove_exchanges(ctx, b, st);
    if ((from.cp == 1 && to.cp > 1) || replaced) {
      const auto fwd = static_cast<time_ns>(std::llround(new_ns[0])), bwd = static_cast<time_ns>(std::llround(new_ns[1]));
      const bool ring = to.cp_comm == model::cp_comm_kind::p2p;
      const std::vector<detail::cp_site> sites = detail::attention_sites(ctx.job, b, ctx.structure(b));
      const auto [n, transfer] = ring ? insert_cp_exchanges(b, sites, fwd, bwd, costs.profile) : insert_cp_collectives(b, sites, fwd, bwd, costs.profile);
      if (n == 0) {
        throw error("whatif --cp " + std::to_string(to.cp) + ": no attention operator with recorded shapes (SDPA, flash-attn) in the traces' layers to place " +
                    (ring ? "the ring exchanges beside" : "the key/value all-gathers at"));
      }
      s.inserted = n;
      s.exchange_after += transfer;
      ctx.layer_placers.emplace_back(attach_exchanges);
      ctx.refresh(b);
    }
    change_list out{record(from, to, s)};
    if (from.cp != to.cp && dp_resizes) {
      out.push_back(note("context parallel", "gradients", "the gradient collectives over DP x CP are resized by the data-parallel pass"));
    } else if (from.cp != to.cp && to.cp > 1 && s.gradient == 0) {
      out.push_back(note("context parallel", "gradients",
                         "the traces reduce no gradients (one replica at CP 1): the gradient reduction over the " + std::to_string(to.cp) +
                             " ranks of DP x CP is not inserted, and the prediction lacks it"));
    }
    return out;
  }

 private:
  /// Removes the traced exchanges (emptied by `retime`) with their launches and joins, where the
  /// other kind replaces them: a host-bound job would keep their host time (a 2-layer Llama-like
  /// job at CP 2 was 4.4 % slow with them emptied). Rediscovers the structure.
  static void remove_exchanges(context& ctx, graph::built_job& b, const job_structure& st) {
    const std::set<std::string> groups(st.cp.groups.begin(), st.cp.groups.end());
    const std::vector<repeat_group> drop = detail::collectives_to_remove(b, ctx.job, groups, [](std::string_view, std::int64_t) { return true; });
    if (drop.empty()) return;
    (void)adopt(b, repeat_groups(b.graph, drop));
    ctx.refresh(b);
  }

  /// The traced exchanges re-timed by `new_ns / old_ns` of their phase (emptied where `new_ns` is 0).
  static void retime(const context& ctx, graph::built_job& b, const job_structure& st, const std::array<double, 2>& old_ns,
                     const std::array<double, 2>& new_ns, cp_stats& s) {
    if (st.cp.groups.empty()) return;
    const std::set<std::string> groups(st.cp.groups.begin(), st.cp.groups.end());
    graph::task_graph& g = b.graph;
    for (const gpu_op_context& c : st.gpu_ops) {
      if (!c.comm) continue;
      const trace::rank_trace& tr = ctx.job.ranks[c.rank];
      if (!groups.count(std::string(tr.arg_text(c.op, trace::arg_key::process_group_name)))) continue;
      const auto& map = b.ranks[c.rank].task_of_event;
      if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
      const graph::task_id t = map[c.op];
      if (g.kind[t] != graph::task_kind::gpu_comm && g.kind[t] != graph::task_kind::comm_complete) continue;
      const std::size_t i = c.phase == phase_kind::backward ? 1 : 0;
      s.exchange_before += g.duration[t];
      g.duration[t] = old_ns[i] > 0 ? static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * new_ns[i] / old_ns[i])) : 0;
      s.exchange_after += g.duration[t];
      ++(new_ns[i] > 0 ? s.retimed : s.removed);
    }
  }

  /// The gradient collectives over DP x CP: re-timed from the traced group's size to size /
  /// `cp_from` x `cp_to` by the NCCL model (ranks at stride `tp`, `tp_to` in the target; an
  /// expert-data-parallel group's, TP x DP x CP / (EP x expert TP), at stride expert TP x EP of
  /// the traces' EP, whose change is the MoE pass's), and a distributed optimizer's step sharded
  /// as they are.
  static void gradients(const context& ctx, graph::built_job& b, const job_structure& st, int cp_from, int cp_to, int tp, int tp_to,
                        const shape_costs& costs, cp_stats& s) {
    const std::map<std::string, bool> grad = detail::gradient_groups(st);
    const std::set<std::string> experts = detail::expert_dp_groups(st);
    const int ep = std::max(1, st.moe.ep.value.value_or(st.parallel.ep.value.value_or(1))), etp = traced_expert_tp(st);
    const auto instance = detail::collectives_by_complete(b.graph);
    graph::task_graph& g = b.graph;
    for (const gpu_op_context& c : st.gpu_ops) {
      if (!c.comm || c.p2p) continue;
      const trace::rank_trace& tr = ctx.job.ranks[c.rank];
      const std::string pg(tr.arg_text(c.op, trace::arg_key::process_group_name));
      const auto known = grad.find(pg);
      if (known == grad.end() || !known->second) continue;
      const auto& map = b.ranks[c.rank].task_of_event;
      if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
      const graph::task_id t = map[c.op];
      const auto inst = instance.find(t);
      std::int64_t n = 0;
      if (inst != instance.end()) {
        n = static_cast<std::int64_t>(inst->second->group_ranks.empty() ? inst->second->arrive.size() : inst->second->group_ranks.size());
      } else if (const auto gs = tr.arg(c.op, trace::arg_key::group_size)) {
        n = *gs;
      }
      if (n <= 0 || n % cp_from != 0) continue;
      const std::int64_t n_to = n / cp_from * cp_to;
      s.gradient_from = static_cast<int>(n), s.gradient_to = static_cast<int>(n_to);
      const auto coll = modelled_collective(detail::comm_kind(tr.name(tr.events[c.op]), tr.arg_text(c.op, trace::arg_key::collective_name)));
      const double d = static_cast<double>(g.duration[t]);
      double bytes = 0;
      if (const auto ne = tr.arg(c.op, trace::arg_key::in_msg_nelems); ne && *ne > 0) {
        const std::int64_t traced = trace::dtype_bytes(tr.arg_text(c.op, trace::arg_key::dtype));
        bytes = static_cast<double>(*ne) * (traced > 0 ? static_cast<double>(traced) : costs.element_bytes);
      } else {
        bytes = bytes_for_time(coll, d, n, n * tp > costs.hw.nvlink_domain_size() ? costs.profile.inter : costs.profile.intra);
      }
      // The DP x CP group's ranks at stride TP (model::data_parallel_group), hierarchical across
      // NVLink domains as the NCCL model times it.
      const model::nccl_model nccl{costs.profile};
      auto time = [&](std::int64_t ranks, int stride) {
        const model::collective_op op{coll, static_cast<std::int64_t>(std::llround(bytes)), model::detail::place(0, stride, ranks, costs.hw)};
        return std::max<double>(1.0, static_cast<double>(nccl.collective_time(op, costs.hw)));
      };
      const bool expert = experts.count(pg) > 0;
      const int stride_from = expert ? etp * ep : tp, stride_to = expert ? (etp == tp ? tp_to : etp) * ep : tp_to;
      s.gradient_before += g.duration[t];
      g.duration[t] = static_cast<time_ns>(std::llround(d * time(n_to, stride_to) / time(n, stride_from)));
      s.gradient_after += g.duration[t];
      ++s.gradient;
    }
    if (s.gradient_from > 0) (void)shard_optimizer(b, st, s.gradient_from, s.gradient_to, costs.profile.min_kernel_ns);
  }

  /// How the CP ranks of `c` exchange keys and values, for the record.
  [[nodiscard]] static const char* exchange_text(const shape_config& c) {
    if (c.cp <= 1) return "none";
    return c.cp_comm == model::cp_comm_kind::p2p ? "p2p" : "allgather";
  }

  [[nodiscard]] static change record(const shape_config& from, const shape_config& to, const cp_stats& s) {
    const bool ring = to.cp <= 1 || to.cp_comm == model::cp_comm_kind::p2p;
    char line[1536];
    std::snprintf(line, sizeof line,
                  "CP %d -> %d (sequence %lld, %lld tokens per rank -> %lld): exchange %s -> %s (%s); key/value chunk %lld -> %lld bytes; "
                  "%zu traced exchanges re-timed, %zu %s, %zu inserted %s: %.3f -> %.3f ms of transfer; %zu "
                  "gradient collectives over DP x CP (%d -> %d ranks): %.3f -> %.3f ms",
                  from.cp, to.cp, static_cast<long long>(to.seq), static_cast<long long>(from.local_seq()),
                  static_cast<long long>(to.local_seq()), exchange_text(from), exchange_text(to),
                  ring ? "cp - 1 ring steps per attention, twice the bytes in backward, by the NCCL model's p2p time"
                       : "an all-gather of K and V before the forward attention and a reduce-scatter of dK, dV after the backward one, "
                         "by the NCCL model over the CP group",
                  static_cast<long long>(s.chunk_from),
                  static_cast<long long>(s.chunk_to), s.retimed, s.removed,
                  from.cp > 1 && to.cp > 1 && from.cp_comm != to.cp_comm ? "removed with their launches" : "emptied", s.inserted,
                  ring ? "beside the attention on a context-parallel stream" : "around the attention on the compute stream",
                  static_cast<double>(s.exchange_before) / 1e6,
                  static_cast<double>(s.exchange_after) / 1e6, s.gradient, s.gradient_from, s.gradient_to,
                  static_cast<double>(s.gradient_before) / 1e6, static_cast<double>(s.gradient_after) / 1e6);
    // The exchange of each side with CP is named where either all-gathers (the ring is the default).
    const bool named = (from.cp > 1 && from.cp_comm == model::cp_comm_kind::allgather) || (to.cp > 1 && to.cp_comm == model::cp_comm_kind::allgather);
    auto side = [&](const shape_config& c) {
      return std::to_string(c.cp) + (named && c.cp > 1 ? " (" + std::string(model::to_string(c.cp_comm)) + ")" : "");
    };
    return changed("context parallel", "CP", side(from), side(to), line,
                   {count_figure("exchanges re-timed", s.retimed), count_figure("exchanges emptied", s.removed),
                    count_figure("exchanges inserted", s.inserted), time_figure("exchange transfer time", s.exchange_before, s.exchange_after),
                    time_figure("gradient collective time", s.gradient_before, s.gradient_after)});
  }
};
static_assert(Rewrite<context_parallel_pass>);

}  // namespace lumos::whatif

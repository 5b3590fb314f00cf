#pragma once
// The mixture-of-experts what-if (`lumos whatif --ep N --experts N --top-k K --expert-ffn N
// --routing balanced|measured`): the MoE layers of the traces (structure/moe.hpp finds them)
// rewritten for another expert-parallel degree, expert count, top-k or expert FFN width.
//
// Per rank, the token copies its experts compute set the expert work: with balanced routing
// every rank computes its tokens x top-k copies whatever the EP degree; with the measured
// routing each expert keeps the share of the copies the traces gave it, the experts are dealt
// to the target's EP ranks in order (experts / EP each), and a rank computes the copies of the
// experts it holds. Where the traced ranks do not stand for every rank of the target's EP
// group, each computes the copies of the slowest one: the dispatch and combine all-to-alls wait
// for it, so it sets the pace. Then:
//  - each grouped expert GEMM (`aten::_grouped_mm` and the like) is rescaled by the kernel-level
//    model's time of its experts (experts / EP of the target, rows = copies / experts, the
//    expert FFN width) over the traced one; a loop of per-expert GEMMs by each expert's rows
//    (routing) and the width; the experts' activation by copies x width;
//  - the router GEMM by the expert count, its top-k by the expert count, the permutation and
//    unpermutation by the token copies they move (1 + top-k);
//  - each all-to-all of the EP group (its message: the rank's tokens x top-k x hidden) re-timed
//    through the NCCL model over the target's EP group (a group that spans nodes costs the
//    cross-node link), as a ratio on its measured time, its group's members renumbered as the
//    target's; to EP 1 they are removed with their launches; from EP 1 they are inserted around
//    the experts of each MoE layer pass (moe_dispatch.hpp);
//  - the launches that run once per local expert follow the experts per rank
//    (detail/moe_launches.hpp);
//  - the optimizer kernels follow the parameters per rank (dense + the experts it holds) and the
//    expert-data-parallel gradient collectives the expert parameters per rank over a group of
//    DP x CP / EP ranks.
// Other measured launches and CPU work stay. Runs after the tensor-parallel and precision passes and
// before the data-parallel one (which prices the gradients of the target) and before the
// layers are copied, so that copies carry it.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/detail/moe_comms.hpp>
#include <lumos/whatif/detail/moe_launches.hpp>
#include <lumos/whatif/detail/moe_ops.hpp>
#include <lumos/whatif/detail/moe_stages.hpp>
#include <lumos/whatif/detail/moe_written.hpp>
#include <lumos/whatif/detail/shape_groups.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/moe_dispatch.hpp>
#include <lumos/whatif/moe_gradients.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/tensor_parallel.hpp>
#include <lumos/whatif/structure/moe.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// Per job rank, the token copies its experts compute in the target (see the header comment).
/// `note` says how they were set. `dpcp`: the traces' DP x CP.
[[nodiscard]] inline std::vector<double> target_copies(const trace::job& job, const moe_ranks& r, const moe_config& from,
                                                       const moe_config& to, moe_routing routing, int tp, int dpcp, std::string& note) {
  const std::size_t n = job.ranks.size();
  std::vector<double> out(n, 0.0);
  double sum = 0;
  std::size_t seen = 0;
  for (const double c : r.copies) {
    if (c > 0) sum += c, ++seen;
  }
  if (seen == 0) return out;
  const double k = static_cast<double>(to.top_k) / static_cast<double>(from.top_k);
  const double mean = sum / static_cast<double>(seen);
  if (routing == moe_routing::balanced || to.experts != from.experts) {
    note = routing == moe_routing::balanced ? "balanced routing: every rank's experts compute the mean copies of the traced ranks"
                                            : "another expert count: the traces' per-expert loads do not apply, routing taken as balanced";
    for (std::size_t i = 0; i < n; ++i) out[i] = r.copies[i] > 0 ? mean * k : 0.0;
    return out;
  }
  // The traced experts' loads: each expert's rows where a loop tells them, else each rank's
  // copies spread over its experts.
  const std::size_t experts = static_cast<std::size_t>(from.experts);
  const std::int64_t local1 = from.experts / from.ep;
  std::vector<double> load(experts, -1.0);
  for (std::size_t i = 0; i < n; ++i) {
    if (r.copies[i] <= 0 || r.local[i] <= 0) continue;
    const int p = dp_index_of(job.ranks[i].rank, tp, dpcp) % from.ep;
    const bool own = i < r.expert_rows.size() && static_cast<std::int64_t>(r.expert_rows[i].size()) == local1;
    for (std::int64_t x = 0; x < local1; ++x) {
      load[static_cast<std::size_t>(p * local1 + x)] =
          own ? r.expert_rows[i][static_cast<std::size_t>(x)] : r.copies[i] / static_cast<double>(r.local[i]);
    }
  }
  double known = 0;
  std::size_t known_n = 0;
  for (const double l : load) {
    if (l >= 0) known += l, ++known_n;
  }
  for (double& l : load) {
    if (l < 0) l = known / static_cast<double>(std::max<std::size_t>(1, known_n));
  }
  const std::int64_t local2 = to.experts / to.ep;
  const double tokens = static_cast<double>(to.ep) / static_cast<double>(from.ep);  // the group's tokens
  std::vector<double> at(static_cast<std::size_t>(to.ep), 0.0);
  for (int q = 0; q < to.ep; ++q) {
    for (std::int64_t x = 0; x < local2; ++x) at[static_cast<std::size_t>(q)] += load[static_cast<std::size_t>(q * local2 + x)];
    at[static_cast<std::size_t>(q)] *= tokens * k;
  }
  std::set<int> covered;
  for (std::size_t i = 0; i < n; ++i) {
    if (r.copies[i] > 0) covered.insert(dp_index_of(job.ranks[i].rank, tp, dpcp) % to.ep);
  }
  const bool every = static_cast<int>(covered.size()) == to.ep;
  const double slowest = *std::max_element(at.begin(), at.end());
  note = every ? "measured routing: each rank's experts compute the traced loads of the experts it holds"
               : "measured routing: the traced ranks do not stand for every EP rank, each computes the copies of the slowest (" +
                     std::to_string(static_cast<long long>(std::llround(slowest))) + ")";
  for (std::size_t i = 0; i < n; ++i) {
    if (r.copies[i] > 0) out[i] = every ? at[static_cast<std::size_t>(dp_index_of(job.ranks[i].rank, tp, dpcp) % to.ep)] : slowest;
  }
  return out;
}

/// Scales the duration of `t` by `ratio`, no kernel shorter than `min_ns` (a kernel already
/// shorter keeps its time).
inline void moe_scale(graph::task_graph& g, graph::task_id t, double ratio, double min_ns) {
  const double d = static_cast<double>(g.duration[t]);
  g.duration[t] = static_cast<time_ns>(std::llround(std::max(d * ratio, std::min(d, min_ns))));
}

/// Rescales the MoE ops `ops` of `g` from `from` to `to` (see the header comment): `copies`,
/// the target's per rank (`target_copies`), `hidden` the traces', `even`: the experts' loads
/// evened out (balanced routing). `tokens`: the tokens per rank, target over traced (a sequence,
/// micro-batch or CP change), which the copies already carry; the shape pass has rescaled the
/// memory-bound ops (top-k, permutation, activation) by it, the router GEMM is rescaled here.
/// Returns what it did.
inline moe_stats rescale_moe_ops(graph::task_graph& g, const std::vector<moe_op>& ops, const moe_ranks& r,
                                 const std::vector<double>& copies, const moe_config& from, const moe_config& to, std::int64_t hidden,
                                 std::int64_t width_to, bool even, const shape_costs& costs, double tokens = 1.0) {
  moe_stats st;
  const model::kernel_level k{.profile = costs.profile};
  const double peak = costs.hw.peak_flops(costs.dtype), min_ns = costs.profile.min_kernel_ns, h = static_cast<double>(hidden);
  const double w1 = static_cast<double>(r.width), w2 = static_cast<double>(width_to);
  const double l1 = static_cast<double>(from.experts) / from.ep, l2 = static_cast<double>(to.experts) / to.ep;
  const double topk = static_cast<double>(to.top_k) / static_cast<double>(from.top_k);
  // The model's time without its shortest-kernel floor: the measured kernel is what the ratio
  // scales, and `moe_scale` floors the result.
  auto gemm = [&](double rows, double w, double batch) {
    return k.gemm_ns(costs.hw, peak, costs.element_bytes, std::max(rows, 1.0), w, h, 2.0, batch);
  };
  for (const moe_op& o : ops) {
    const double c1 = r.copies[o.rank], c2 = copies[o.rank];
    const double rows = c1 > 0 ? c2 / c1 : topk;
    const time_ns before = g.duration[o.task];
    switch (o.kind) {
      case moe_op_kind::expert_gemm: {
        double ratio = 1;
        if (o.rows > 0) {
          // A loop: this expert's rows in the target, an even share of the rank's copies or its
          // own; an even share of the target's experts per rank when their count changes (the
          // loop's length follows them: detail/moe_launches.hpp).
          const double local = l1 != l2 ? l2 : static_cast<double>(std::max<std::int64_t>(1, r.local[o.rank]));
          const double n2 = (even || l1 != l2) && c1 > 0 ? c2 / local : static_cast<double>(o.rows) * rows;
          ratio = gemm(n2, w2, 1) / gemm(static_cast<double>(o.rows), w1, 1);
        } else if (o.experts > 0 && c1 > 0) {
          // Its dims in the target: the rows per expert (M, or K of a weight gradient) and the
          // width (whichever of the others is it) follow, the hidden width stays.
          const double rows2 = c2 / l2;
          const auto width = [&](double d) { return d == w1 ? w2 : 2 * d == w1 ? w2 / 2 : d; };
          const double c_bytes = o.wgrad ? 8.0 : 2.0;
          const auto at = [&](double M, double N, double K, double batch) {
            return k.gemm_ns(costs.hw, peak, costs.element_bytes, std::max(M, 1.0), N, K, c_bytes, batch);
          };
          ratio = o.wgrad ? at(width(o.m), width(o.n), rows2, l2) / at(o.m, o.n, o.k, o.experts)
                          : at(rows2, width(o.n), width(o.k), l2) / at(o.m, o.n, o.k, o.experts);
        } else if (c1 > 0) {
          ratio = gemm(c2 / l2, w2, l2) / gemm(c1 / l1, w1, l1);
        }
        moe_scale(g, o.task, ratio, min_ns);
        ++st.expert_gemms;
        st.expert_before += before;
        st.expert_after += g.duration[o.task];
        break;
      }
      case moe_op_kind::expert_act:
        // A loop's activation is one expert's: its rows follow the copies per local expert.
        moe_scale(g, o.task, rows / tokens * w2 / w1 * (r.loop && !r.grouped ? l1 / l2 : 1.0), min_ns);
        ++st.activations;
        break;
      case moe_op_kind::router:
        moe_scale(g, o.task, tokens * static_cast<double>(to.experts) / from.experts, min_ns);
        ++st.routers;
        break;
      case moe_op_kind::route:
        moe_scale(g, o.task, static_cast<double>(to.experts) / from.experts, min_ns);
        ++st.routes;
        break;
      case moe_op_kind::permute:
        moe_scale(g, o.task, (1.0 + from.top_k * topk) / (1.0 + from.top_k), min_ns);
        ++st.permutes;
        break;
    }
  }
  for (std::size_t i = 0; i < copies.size(); ++i) {
    if (r.copies[i] > 0 && copies[i] > st.copies_to) st.copies_from = r.copies[i], st.copies_to = copies[i];
  }
  return st;
}

/// The dispatch sites of `ops` (detail/moe_dispatch.hpp): per rank, pass, layer and forward or
/// backward phase, its first and last expert GEMM, and the rank's tokens x top-k x hidden in
/// bytes (`copies` per job rank as traced, `topk` the target's over the traced top-k).
[[nodiscard]] inline std::vector<dispatch_site> dispatch_sites(const graph::task_graph& g, const std::vector<moe_op>& ops,
                                                               const std::vector<double>& copies, double topk, double hidden,
                                                               double element_bytes) {
  std::map<std::tuple<std::size_t, int, int, int>, dispatch_site> by;
  for (const moe_op& o : ops) {
    if (o.kind != moe_op_kind::expert_gemm || o.layer < 0) continue;
    if (o.phase != static_cast<int>(phase_kind::forward) && o.phase != static_cast<int>(phase_kind::backward)) continue;
    if (o.rank >= copies.size() || copies[o.rank] <= 0) continue;
    auto [it, fresh] = by.try_emplace({o.rank, o.pass, o.layer, o.phase});
    dispatch_site& s = it->second;
    if (fresh) {
      s = {.first = o.task, .last = o.task, .rank = g.rank[o.task], .bytes = copies[o.rank] * topk * hidden * element_bytes};
    } else if (g.processor[o.task] == g.processor[s.first]) {
      s.first = std::min(s.first, o.task), s.last = std::max(s.last, o.task);
    }
  }
  std::vector<dispatch_site> out;
  for (auto& [key, site] : by) out.push_back(site);
  return out;
}

/// The factor on the optimizer's work per rank: its parameters per rank follow the expert
/// parameters (`params`: target over traced, per rank), weighed against the dense ones by the
/// gradients each reduces on one rank (the bytes of the gradient collectives of `comms` on the
/// rank of the first: dense ones over the DP groups, expert ones over the expert-DP groups). With
/// reduce-scatters (a distributed optimizer) each steps its shard: 1 / DP of the dense ones,
/// 1 / (DP x CP / EP) of the expert ones (`edp_to`: the target's divisor of the experts, over the
/// sharding a later pass applies to the whole optimizer, so it may be below 1). 1 when no gradient
/// collective tells the split.
[[nodiscard]] inline double optimizer_factor(const graph::task_graph& g, const std::vector<moe_comm>& comms, double params, int dp,
                                             int edp_from, double edp_to) {
  double dense = 0, mine = 0;
  bool sharded = false;
  int rank = -1;
  for (const moe_comm& c : comms) {
    if (c.kind != model::collective::reduce_scatter && c.kind != model::collective::all_reduce) continue;
    const int r = g.rank[c.transfer.front()];
    if (rank < 0) rank = r;
    if (r != rank) continue;
    sharded = sharded || c.kind == model::collective::reduce_scatter;
    (c.expert ? mine : dense) += c.bytes;
  }
  if (dense + mine <= 0) return 1.0;
  const double sd = sharded ? dp : 1, s1 = sharded ? edp_from : 1, s2 = sharded && edp_to > 0 ? edp_to : 1;
  return (dense / sd + mine * params / s2) / (dense / sd + mine / s1);
}

/// Scales the optimizer-phase GPU ops of `st` in `b` by each rank's ratio (`ratios[rank]`;
/// memory-bound: no kernel under the profile's shortest). Returns how many.
inline std::size_t scale_optimizer(graph::built_job& b, const job_structure& st, const std::vector<double>& ratios, double min_ns) {
  std::size_t n = 0;
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.comm || c.phase != phase_kind::optimizer || c.rank >= b.ranks.size() || c.rank >= ratios.size()) continue;
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
    const graph::task_id t = map[c.op];
    b.graph.duration[t] = static_cast<time_ns>(std::llround(memory_scaled_ns(static_cast<double>(b.graph.duration[t]), ratios[c.rank], min_ns)));
    ++n;
  }
  return n;
}

/// The traced MoE configuration of `st` (its expert FFN per rank `width`, its expert TP `tp`) and
/// the target `t` asks, checked: throws `lumos::error` naming the rule a target breaks and the
/// flag that asked it. `dpcp_flag`: the flag that set the target's DP x CP `dpcp_to` (with its
/// value), named where EP does not divide it and `--ep` was not given. `tp_dense`: the TP of the
/// attention where the expert TP differs (0: the same), `dpcp_to` then the stage's TP x DP x CP
/// ranks over the expert TP.
[[nodiscard]] inline std::pair<moe_config, moe_config> moe_configs(const job_structure& st, const moe_target& t, std::int64_t width,
                                                                   int tp, int dpcp_to, const std::string& dpcp_flag = {}, int tp_dense = 0) {
  const moe_structure& m = st.moe;
  moe_config from;
  from.experts = m.experts.value.value_or(0);
  from.ep = m.ep.value.value_or(st.parallel.ep.value.value_or(1));
  from.top_k = m.top_k.value.value_or(0);
  from.expert_ffn = width * tp;
  if (from.ep <= 0 || from.experts % from.ep != 0) {
    throw error("whatif: the traces' EP " + std::to_string(from.ep) + " (" + (m.ep.known() ? m.ep.source : st.parallel.ep.source) +
                ") does not divide their " + std::to_string(from.experts) + " experts (" + m.experts.source + ")");
  }
  if (t.top_k && from.top_k <= 0) throw error("whatif --top-k: the traces' top-k is unknown (" + m.top_k.source + ")");
  from.top_k_known = from.top_k > 0;
  if (from.top_k <= 0) from.top_k = 1;  // only ratios of it are used
  if (t.expert_ffn && width <= 0) {
    throw error("whatif --expert-ffn: the traces' expert FFN width is unknown (no expert GEMM reading the hidden width with recorded "
                "Input Dims)");
  }
  moe_config to = from;
  auto positive = [](const auto& v, const char* flag) {
    if (v && *v <= 0) throw error(std::string("whatif ") + flag + ": must be positive (got " + std::to_string(*v) + ")");
  };
  positive(t.ep, "--ep"), positive(t.experts, "--experts"), positive(t.top_k, "--top-k"), positive(t.expert_ffn, "--expert-ffn");
  if (t.ep) to.ep = *t.ep;
  if (t.experts) to.experts = *t.experts;
  if (t.top_k) to.top_k = *t.top_k;
  if (t.expert_ffn) to.expert_ffn = *t.expert_ffn;
  const std::string ep = std::to_string(to.ep);
  // The flag that asked what breaks a rule: the traces' value stands where none was given.
  const auto asked = [](const auto& given, const char* flag, const char* other, const auto& value) {
    return std::string(given ? flag : other) + " " + std::to_string(value);
  };
  if (dpcp_to % to.ep != 0) {
    const bool folded = tp_dense > 0 && tp_dense != tp;  // the expert grid is not the dense one
    const std::string flag =
        t.ep || dpcp_flag.empty() ? asked(t.ep, "--ep", "--dp", t.ep ? to.ep : folded ? dpcp_to * tp / tp_dense : dpcp_to) : dpcp_flag;
    throw error("whatif " + flag +
                (folded ? ": EP x expert TP must divide TP x DP x CP of the target (EP " + ep + " x expert TP " + std::to_string(tp) +
                              ", TP x DP x CP " + std::to_string(dpcp_to * tp) + "): the expert grid folds over a stage's ranks, the world stays"
                        : ": EP must divide DP x CP of the target (EP " + ep + ", DP x CP " + std::to_string(dpcp_to) +
                              "): expert parallelism shards the experts over data-parallel ranks, the world stays"));
  }
  if (to.experts % to.ep != 0) {
    throw error("whatif " + asked(t.ep, "--ep", "--experts", t.ep ? to.ep : to.experts) + ": the " + std::to_string(to.experts) +
                " experts do not divide over " + ep + " EP ranks");
  }
  if (to.top_k > to.experts) {
    throw error("whatif " + asked(t.top_k, "--top-k", "--experts", t.top_k ? to.top_k : to.experts) + ": top-" + std::to_string(to.top_k) +
                " is more than the " + std::to_string(to.experts) + " experts");
  }
  if (to.expert_ffn % tp != 0) {
    throw error("whatif --expert-ffn " + std::to_string(to.expert_ffn) + ": does not divide over " + (tp_dense > 0 && tp_dense != tp ? "expert TP " : "TP ") +
                std::to_string(tp));
  }
  return {from, to};
}

}  // namespace detail

/// Pass: a mixture-of-experts change (`--ep`, `--experts`, `--top-k`, `--expert-ffn`,
/// `--routing`; see the header comment). Refused with an error when the traces have no MoE
/// layer, when a loop of per-expert GEMMs must change length and its per-expert units cannot be
/// told, and from EP 1 when no MoE layer pass has launched expert GEMMs to place the all-to-alls.
struct moe_pass {
  std::optional<moe_summary> made;
  report::arg_edits written;  ///< the target's sizes for `--trace-out` (detail/moe_written.hpp)

  /// Wanted for a MoE flag, on MoE traces whose tokens per rank change (`--seq`, `--micro-batch`,
  /// `--cp`): the experts' copies, the router and the all-to-alls follow them, and where another
  /// DP x CP regroups the experts (`--dp`: an expert shard replicated, or EP no longer dividing).
  [[nodiscard]] bool wanted(const context& ctx) const {
    return ctx.options.moe.any() || tokens_ratio(ctx) != 1.0 || layers_unpriced(ctx) || experts_regrouped(ctx);
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) {
    const moe_target& t = ctx.options.moe;
    const job_structure& st = ctx.structure(b);
    if (!st.moe.found()) throw error("whatif --ep/--experts/--top-k/--expert-ffn/--routing: no MoE layer in the traces (" + st.moe.layers.source + ")");
    if (!st.model.hidden.known()) throw error("whatif: the MoE change needs the traces' hidden size (" + st.model.hidden.source + ")");
    const std::int64_t hidden = static_cast<std::int64_t>(*st.model.hidden.value);
    // The expert grid folds expert TP x EP x expert DP over a stage's TP x DP x CP ranks: here it
    // is Megatron's order with `tp` the expert TP and `dp` (DP x CP) the stage's ranks over it,
    // the traces' DP x CP `dp_dense` when expert TP = TP.
    const int tp_dense = st.parallel.tp.value.value_or(1), tp = traced_expert_tp(st);
    const int dp_dense = st.parallel.dp.value.value_or(1);  // the traces' DP x CP (their gradient group)
    const int dp = expert_grid_ranks(st, dp_dense);
    const double tokens = tokens_ratio(ctx);
    // The target's DP x CP: its replicas (`--dp`, else the traces') x its CP. The gradient
    // collectives as the MoE pass finds them: re-timed by the CP pass to DP x CP of the target
    // CP (`dpcp_base`) where it resized them.
    const int cp_from = ctx.traced_cp(), cp_to = ctx.target_cp();
    const int dpcp_to = expert_grid_ranks(st, ctx.options.dp.value_or(std::max(1, dp_dense / cp_from)) * cp_to);
    const int dpcp_dense = ctx.cp_gradients ? std::max(1, dp_dense / cp_from) * cp_to : dp_dense, dpcp_base = expert_grid_ranks(st, dpcp_dense);
    const std::string dpcp_flag = cp_to != cp_from && !t.ep ? "--cp " + std::to_string(cp_to) : std::string();
    const detail::expert_width traced = detail::traced_expert_width(ctx.job, st, hidden, st.moe.experts.value.value_or(0));
    const std::int64_t width = traced.n;
    // Named references, not structured bindings: lambdas below capture them (clang 14 cannot).
    const std::pair<moe_config, moe_config> configs = detail::moe_configs(st, t, traced.ffn(), tp, dpcp_to, dpcp_flag, tp_dense);
    const moe_config& from = configs.first;
    const moe_config& to = configs.second;
    // `--layers`, `--pp`: the optimizer steps the parameters of the target's stage (see `stage_ratios_of`).
    const int layers_from = st.model.layers.value.value_or(1);
    const std::optional<detail::stage_parameter_ratios> staged =
        layers_unpriced(ctx) ? stage_ratios_of(ctx, st, from, to, traced, dp_dense / cp_from, cp_from, ctx.options.layers.value_or(layers_from),
                                               ctx.options.pp.value_or(ctx.traced_pp()))
                             : std::nullopt;
    const std::vector<double> layered = staged ? per_rank(ctx, st, staged->optimizer) : std::vector<double>{};
    const model::nccl_model nccl = ctx.nccl ? ctx.nccl->first : model::nccl_model{ctx.traced_profile()};
    const model::hardware& hw = ctx.nccl ? ctx.nccl->second : ctx.comm_hw;
    if (!t.any() && tokens == 1.0 && !experts_regrouped(ctx)) {
      bool inserted = false;
      change_list out = rebucket(ctx, b, from, traced, hidden, tp, dp, dpcp_to, nccl, hw, inserted);
      for (change& c : layers_only(ctx, b, ctx.structure(b), from, staged, tp, dp, !inserted, nccl, hw)) out.push_back(std::move(c));
      return out;
    }
    const moe_routing routing = t.routing.value_or(moe_routing::measured);
    detail::moe_ranks ranks;
    const std::vector<detail::moe_op> ops = detail::find_moe_ops(ctx.job, b, st, hidden, from.experts, width, ranks);
    std::vector<detail::router_op_ref> routers;
    for (const detail::moe_op& o : ops) {
      if (o.kind == detail::moe_op_kind::router && o.owner != detail::no_event) routers.push_back({o.rank, o.owner, o.layer, true});
    }
    detail::add_score_ops(ctx.job, st, routers);  // before a refresh renews `st`
    std::string routing_note;
    std::vector<double> copies = detail::target_copies(ctx.job, ranks, from, to, routing, tp, dp, routing_note);
    if (tokens != 1.0) {
      for (double& c : copies) c *= tokens;
      routing_note += "; the tokens per rank x" + decimal(tokens, 3) + " (sequence / CP x micro-batch)";
    }
    const shape_costs& costs = ctx.costs(b);
    moe_stats s = detail::rescale_moe_ops(b.graph, ops, ranks, copies, from, to, hidden, to.expert_ffn / tp * (traced.fused ? 2 : 1),
                                          routing == moe_routing::balanced || to.experts != from.experts, costs, tokens);
    detail::expert_launch_plan launches = plan_launches(b, ops, ranks, from, to);
    // From EP 1: where the dispatch and combine go, taken before the edits below renumber.
    std::vector<detail::dispatch_anchor> anchors;
    if (from.ep == 1 && to.ep > 1) {
      anchors = detail::dispatch_anchors(b.graph, detail::dispatch_sites(b.graph, ops, ranks.copies, tokens * to.top_k / from.top_k,
                                                                         static_cast<double>(hidden), costs.element_bytes));
    }
    s.launch_runs = launches.runs, s.launches_removed = launches.kernels_removed, s.launches_added = launches.kernels_added;
    s.folded = launches.folded, s.host_before = launches.host_before, s.host_after = launches.host_after;
    std::vector<detail::moe_comm> comms = detail::moe_comms(ctx.job, b, st);
    scale_all_to_all_messages(b.graph, comms, tokens);
    const double params = (static_cast<double>(to.experts) / to.ep * static_cast<double>(to.expert_ffn)) /
                          (static_cast<double>(from.experts) / from.ep * static_cast<double>(from.expert_ffn));
    // The traced expert-DP group: DP x CP / EP, 1 where the traces show fewer DP ranks than EP
    // (a partial job whose DP group is not in it).
    const int edp_traced = std::max(1, dp / from.ep), edp_from = edp_traced == 1 ? 1 : std::max(1, dpcp_base / from.ep);
    // The data-parallel pass then steps the whole optimizer on the traced gradient group over the
    // target's; the experts' share here is taken at the target's EP over that ratio, so that the
    // two give the target's expert shard once.
    const int group_from = ctx.traced_replicas().value_or(std::max(1, dp_dense / cp_from)) * cp_from;
    const bool dp_shards = data_parallel_pass{}.wanted(ctx) && expert_grid_ranks(st, group_from) != dpcp_to;
    const double edp_to = (dp_shards ? static_cast<double>(expert_grid_ranks(st, group_from)) : static_cast<double>(dpcp_to)) / to.ep;
    // No expert gradient traced (EP = DP x CP) tells the experts' share: the model counts it. Under
    // DDP each rank steps its whole expert shard, experts / EP, so an EP change moves it too.
    const bool ddp = traced_ddp(st);
    std::vector<double> optimizer = layered;
    if (optimizer.empty() && edp_traced == 1 && (to.experts != from.experts || to.expert_ffn != from.expert_ffn || (ddp && to.ep != from.ep))) {
      const auto r = stage_ratios_of(ctx, st, from, to, traced, dp_dense / cp_from, cp_from, layers_from, ctx.traced_pp());
      if (r) optimizer = per_rank(ctx, st, r->optimizer);
    }
    if (optimizer.empty()) optimizer.assign(b.ranks.size(), detail::optimizer_factor(b.graph, comms, params, dpcp_dense, edp_from, edp_to));
    if (std::any_of(optimizer.begin(), optimizer.end(), [](double r) { return r != 1.0; })) {
      s.optimizer = detail::scale_optimizer(b, st, optimizer, costs.profile.min_kernel_ns);
    }
    std::vector<detail::moe_comm> removed;
    const bool resized = to.ep != from.ep || to.experts != from.experts || to.expert_ffn != from.expert_ffn;
    for (const detail::moe_comm& c : comms) {
      const bool a2a = c.kind == model::collective::all_to_all;
      if (!a2a && !c.expert) continue;
      if (a2a ? to.ep == 1 : dpcp_to / to.ep == 1) {
        // EP 1 dispatches no tokens; one replica of each expert shard reduces no gradients.
        removed.push_back(c);
        ++(a2a ? s.removed : s.gradients_removed);
      } else if (a2a ? (to.ep != from.ep || to.top_k != from.top_k) : resized || (staged && c.kind == model::collective::all_gather)) {
        // The expert parameters' all-gathers after the optimizer are those of every layer of the
        // stage; the reduce-scatters go with their layers, which the layer change or split moves.
        const double layer_part = staged && c.kind == model::collective::all_gather
                                      ? detail::stage_parameter_ratios::at(staged->experts, detail::stage_of(c.rank, tp, dp))
                                      : 1.0;
        detail::retime_moe_comm(b.graph, c, from, to, tp, dpcp_base, dpcp_to, params * layer_part, nccl, hw, s);
        if (c.expert) ctx.gradient_groups_sized.insert(c.group);
      }
    }
    if (staged && stages_changed(ctx)) detail::retime_stage_gathers(b.graph, comms, *staged, from, tp, dp, false, true, nccl, hw, s);
    std::vector<std::vector<graph::task_id>> moved;  // where the edit put each task (empty: no edit)
    if (!removed.empty() || !launches.groups.empty()) {
      time_ns gone = 0;
      moved = detail::remove_moe_comms(b, removed, gone, std::move(launches.groups));
      if (to.ep == 1) s.a2a_before += gone;
      ctx.refresh(b);
    }
    if (from.ep == 1 && to.ep > 1) {
      const auto members = [&](int rank) { return detail::ep_members(rank, tp, dp, to.ep); };
      const detail::dispatch_insertion d = detail::insert_dispatch(b, anchors, moved, members, nccl, hw, costs.profile, costs.element_bytes);
      if (d.all_to_alls == 0) {
        throw error("whatif --ep " + std::to_string(to.ep) + ": no MoE layer pass with launched expert GEMMs to place the dispatch and "
                    "combine all-to-alls beside");
      }
      s.inserted = d.all_to_alls, s.joined = d.joined, s.a2a_after += d.transfer;
      ctx.refresh(b);
    }
    std::optional<change> gradients;
    if (edp_traced == 1 && dpcp_to / to.ep > 1) {
      const auto members = [&](int rank) {
        detail::moe_comm c;
        c.kind = model::collective::reduce_scatter, c.rank = rank;
        return detail::moe_members(c, from, to, tp, dp, dpcp_to).second;
      };
      gradients = insert_gradients(ctx, b, to, hidden, tp, traced, members, nccl, hw);
    }
    written = written_args(ctx.job, ops, routers, ranks, copies, from, to, hidden, width, to.expert_ffn / tp * (traced.fused ? 2 : 1), tokens, tp,
                           dpcp_to);
    if (t.any()) made = moe_summary{from, to, routing};
    change_list out{moe_change(from, to, routing, routing_note, s)};
    if (gradients) out.push_back(*gradients);
    return out;
  }
  void after_replay(const context&, whatif_result& out) const {
    out.moe = made;
    out.written_args = written;
  }

 private:
  /// The shape pass re-timed the all-to-alls for the tokens per rank (x `tokens`): their messages,
  /// in `comms` and in the graph's collectives, follow.
  static void scale_all_to_all_messages(graph::task_graph& g, std::vector<detail::moe_comm>& comms, double tokens) {
    if (tokens == 1.0) return;
    for (detail::moe_comm& c : comms) {
      if (c.kind != model::collective::all_to_all) continue;
      c.bytes *= tokens;
      if (c.instance < g.collectives.size() && g.collectives[c.instance].bytes > 0) {
        std::int64_t& n = g.collectives[c.instance].bytes;
        n = std::max<std::int64_t>(1, std::llround(static_cast<double>(n) * tokens));
      }
    }
  }
  /// The tokens per rank of the target over the traces' (1 without a shape change or on traces
  /// without MoE layers).
  [[nodiscard]] static double tokens_ratio(const context& ctx) noexcept {
    const auto& st = ctx.traced_structure();
    if (!ctx.shape_from || !ctx.shape_to || !st || !st->moe.found() || ctx.shape_from->tokens() <= 0) return 1.0;
    return static_cast<double>(ctx.shape_to->tokens()) / static_cast<double>(ctx.shape_from->tokens());
  }

  /// Whether the target's DP x CP at the traced EP is refused (EP no longer divides it) or needs
  /// the expert gradients the traces do not reduce (EP = DP x CP: one replica of each shard).
  [[nodiscard]] static bool experts_regrouped(const context& ctx) {
    const auto& st = ctx.traced_structure();
    if (!st || !st->moe.found() || !st->model.hidden.known() || ctx.options.moe.ep) return false;
    const int ep = st->moe.ep.value.value_or(st->parallel.ep.value.value_or(1));
    const int dpcp = expert_grid_ranks(*st, st->parallel.dp.value.value_or(1)), to = expert_grid_ranks(*st, ctx.target_gradient_group());
    return ep > 1 && to != dpcp && (to % ep != 0 || (dpcp / ep == 1 && to / ep > 1));
  }

  /// `--layers` or `--pp` alone on MoE traces: the optimizer kernels by the parameters each rank
  /// steps in the target's stage (`staged`, unset: unknown) and, with `gathers` (the traced
  /// buckets kept), the parameters' all-gathers after it by the stage's expert parameters, and
  /// with a stage change its dense ones too (a layer change alone keeps them, as measured against
  /// the direct jobs); the reduce-scatters go with the layers, which the layer pass copies and the
  /// split moves.
  [[nodiscard]] static change_list layers_only(context& ctx, graph::built_job& b, const job_structure& st, const moe_config& c,
                                               const std::optional<detail::stage_parameter_ratios>& staged, int tp, int dp,
                                               bool gathers, const model::nccl_model& nccl, const model::hardware& hw) {
    if (!staged) {
      return {note("moe", "optimizer", "optimizer and gradient work kept as traced: the traces do not tell the attention's shape, so "
                                       "the parameters per stage of the MoE layers are not counted")};
    }
    moe_stats s;
    s.optimizer = detail::scale_optimizer(b, st, per_rank(ctx, st, staged->optimizer), ctx.costs(b).profile.min_kernel_ns);
    const std::size_t dense =
        gathers ? detail::retime_stage_gathers(b.graph, detail::moe_comms(ctx.job, b, st), *staged, c, tp, dp, true, stages_changed(ctx), nccl, hw, s)
                : 0;
    const std::string what = ctx.options.layers && stages_changed(ctx) ? "layers and stages"
                             : ctx.options.layers                    ? "layers " + std::to_string(st.model.layers.value.value_or(0)) + " -> " +
                                                                        std::to_string(*ctx.options.layers)
                                                                     : "PP " + std::to_string(ctx.traced_pp()) + " -> " + std::to_string(*ctx.options.pp);
    char line[640];
    std::snprintf(line, sizeof line,
                  "%s on MoE layers: %zu optimizer kernels by the parameters per rank of each rank's stage (x%.3f on rank 0; the routed "
                  "experts' over the expert-data-parallel group, the rest over DP x CP); the parameters' all-gathers after the step by "
                  "the stage's: %zu of the experts', %.3f -> %.3f ms, and %zu dense",
                  what.c_str(), s.optimizer, staged->optimizer.front(), s.expert_gradients, static_cast<double>(s.gradient_before) / 1e6,
                  static_cast<double>(s.gradient_after) / 1e6, dense);
    return {note("moe", "optimizer", line)};
  }

  /// From PP 1 to stages with the distributed optimizer (gradient_bucket_pass's case on dense
  /// traces, which the MoE layers' unknown FFN keeps from it): the traced buckets span the whole
  /// model and Megatron forms each stage's from its own parameters, so the data-parallel
  /// reduce-scatters and all-gathers, dense and expert, are removed and the target stages'
  /// inserted: the dense buckets of each layer's attention, router and norms (with the embedding
  /// and the head) over DP x CP, the routed experts' over the expert-data-parallel group, both of
  /// the target's DP x CP `dpcp_to` (the data-parallel pass then finds them sized and shards the
  /// optimizer from the traces' `dp`). Empty when not asked; `b` unchanged, with a note, when a
  /// bucket cannot be placed. Sets `inserted`.
  [[nodiscard]] static change_list rebucket(context& ctx, graph::built_job& b, const moe_config& c, const detail::expert_width& traced,
                                            std::int64_t hidden, int tp, int dp, int dpcp_to, const model::nccl_model& nccl,
                                            const model::hardware& hw, bool& inserted) {
    if (!gradient_bucket_pass::stages_rebucketed(ctx, true, true)) return {};
    // DDP traces (the dense gradients all-reduced): each stage's buckets all-reduced, none gathered.
    const bool ddp = traced_ddp(ctx.structure(b));
    return gradient_bucket_pass::kept_on_error(ctx, b, [&]() -> change_list {
      const job_structure& st = ctx.structure(b);
      const shape_config shape = traced_shape(st, true);
      const std::int64_t vocab = traced_vocab_local(ctx.job, st, shape) * shape.tp;
      model::transformer m = counted_transformer(shape, st, vocab, st.model.gated_mlp || traced.fused || traced.inputs > 1);
      m.moe.experts = c.experts, m.moe.top_k = c.top_k, m.moe.expert_ffn = c.expert_ffn;
      const std::size_t removed = strip_gradient_collectives(b, ctx.job, st, ddp);
      if (removed == 0) return {};
      ctx.refresh(b);
      const int group = ctx.target_gradient_group();
      const bucket_insertion bi =
          insert_target_buckets(ctx, b, group, shape, vocab, model::moe_layer_dense_parameters_per_rank(m, shape.tp), ddp);
      gradient_bucket_pass::require_formed(bi);
      change_list out{bucket_change(bi, group, bucket_profile_name(ctx, b), ctx.options.layers.has_value(),
                                    "PP 1 -> " + std::to_string(*ctx.options.pp) + " on MoE layers: the traces' " + std::to_string(removed) +
                                        (ddp ? " data-parallel and expert-data-parallel all-reduces" : " data-parallel and expert-data-parallel "
                                                                                                        "reduce-scatters and all-gathers") +
                                        " (buckets over the whole model) removed, since Megatron forms each stage's buckets from its own parameters, and each target "
                                        "stage's reduction of the dense parameters (attention, router, norms, embedding, head) inserted")};
      if (dpcp_to / c.ep > 1) {
        const auto members = [&](int rank) {
          detail::moe_comm e;
          e.kind = model::collective::reduce_scatter, e.rank = rank;
          return detail::moe_members(e, c, c, tp, dp, dpcp_to).second;
        };
        change experts = insert_gradients(ctx, b, c, hidden, tp, traced, members, nccl, hw,
                                          "the traces' expert buckets span the whole model", "the traces' buckets", bi.in_layers, ddp);
        if (experts.from.empty()) throw error(experts.text);  // a note: none placed
        out.push_back(std::move(experts));
      }
      inserted = true;
      return out;
    });
  }

  /// Whether the pipeline's stage count changes (`--pp` other than the traces').
  [[nodiscard]] static bool stages_changed(const context& ctx) noexcept { return ctx.options.pp && *ctx.options.pp != ctx.traced_pp(); }

  /// Whether a layer or stage change leaves the parameters per rank to this pass: on MoE traces the
  /// shape pass counts none (their dense FFN is unknown).
  [[nodiscard]] static bool layers_unpriced(const context& ctx) noexcept {
    const auto& st = ctx.traced_structure();
    return (ctx.options.layers || stages_changed(ctx)) && !ctx.shape_from && st && st->moe.found();
  }

  /// Per traced stage: the parameters of the stage it stands for in the target (`layers_to` layers
  /// over `pp_to` stages, the target's MoE layers `to`) over its own (detail::stage_ratios of the
  /// model of the traces' attention, vocabulary and MoE layers), both at the traces' DP `dp` x CP
  /// `cp`: the data-parallel pass shards the optimizer for the target's DP. Unset when the traces
  /// do not tell the attention's shape.
  [[nodiscard]] static std::optional<detail::stage_parameter_ratios> stage_ratios_of(const context& ctx, const job_structure& st,
                                                                                      const moe_config& from, const moe_config& to,
                                                                                      const detail::expert_width& traced, int dp, int cp,
                                                                                      int layers_to, int pp_to) {
    shape_config shape;
    try {
      shape = traced_shape(st, true);
    } catch (const error&) {
      return std::nullopt;
    }
    const bool gated = st.model.gated_mlp || traced.fused || traced.inputs > 1;
    const std::int64_t vocab = traced_vocab_local(ctx.job, st, shape) * shape.tp;
    const bool distributed = st.gradients.method.value.value_or("") == "reduce-scatter + all-gather";
    const int pp_from = std::max(1, st.parallel.pp.value.value_or(1));
    const auto model_of = [&](const moe_config& c, int layers, int pp) {
      model::transformer m = counted_transformer(shape, st, vocab, gated, std::max(layers, pp));
      m.moe.experts = c.experts, m.moe.top_k = c.top_k, m.moe.expert_ffn = c.expert_ffn;
      model::parallel_config par;
      // The distributed optimizer's expert share (experts / DP x CP) holds at the traced EP too.
      par.tp = shape.tp, par.pp = pp, par.dp = std::max(1, dp), par.cp = std::max(1, cp), par.ep = distributed ? from.ep : c.ep;
      if (traced_expert_tp(st) != shape.tp) par.etp = traced_expert_tp(st);
      par.zero_stage = distributed ? 1 : 0;
      return std::pair{m, par};
    };
    const auto [m_from, par_from] = model_of(from, st.model.layers.value.value_or(1), pp_from);
    const auto [m_to, par_to] = model_of(to, layers_to, std::max(1, pp_to));
    detail::stage_parameter_ratios r = detail::stage_ratios(m_from, par_from, m_to, par_to);
    const auto bad = [](double x) { return !(x > 0) || !std::isfinite(x); };
    if (std::any_of(r.optimizer.begin(), r.optimizer.end(), bad)) return std::nullopt;
    return r;
  }

  /// Per rank of the traces: `of` its stage's.
  [[nodiscard]] static std::vector<double> per_rank(const context& ctx, const job_structure& st, const std::vector<double>& of) {
    std::vector<double> out(ctx.job.ranks.size(), 1.0);
    for (std::size_t ri = 0; ri < out.size(); ++ri) {
      out[ri] = detail::stage_parameter_ratios::at(of, ri < st.ranks.size() ? st.ranks[ri].stage.value.value_or(0) : 0);
    }
    return out;
  }

  /// The traced args the written traces carry with the target's sizes (detail/moe_written.hpp).
  [[nodiscard]] static report::arg_edits written_args(const trace::job& job, const std::vector<detail::moe_op>& ops,
                                                      const std::vector<detail::router_op_ref>& routers, const detail::moe_ranks& ranks,
                                                      const std::vector<double>& copies, const moe_config& from, const moe_config& to,
                                                      std::int64_t hidden, std::int64_t width_from, std::int64_t width_to, double tokens,
                                                      int tp, int dpcp) {
    std::vector<detail::grouped_op_ref> grouped;
    for (const detail::moe_op& o : ops) {
      if (o.kind == detail::moe_op_kind::expert_gemm && o.experts > 0 && o.owner != detail::no_event) grouped.push_back({o.rank, o.owner, o.wgrad});
    }
    const detail::moe_written_sizes z{.local_from = from.experts / std::max(1, from.ep), .local_to = to.experts / std::max(1, to.ep),
                                      .width_from = width_from, .width_to = width_to, .hidden = hidden,
                                      .messages = tokens * static_cast<double>(to.top_k) / static_cast<double>(std::max(1, from.top_k)),
                                      .tp = std::max(1, tp), .dpcp = std::max(1, dpcp), .ep = to.ep, .ep_from = from.ep,
                                      .experts_from = from.experts, .experts_to = to.experts, .tokens = tokens};
    return detail::moe_written_args(job, grouped, copies, ranks.copies, routers, ranks.tokens, z);
  }

  /// The routed experts' gradient reduction of the target inserted where the traces reduce none
  /// (moe_gradients.hpp): its parameters per MoE layer and rank, `members` the target's
  /// expert-data-parallel group of a global rank. `why`: what the traces' reduction was, `was`
  /// its short form; `dense`: the reduce-scatters of the dense buckets a pass inserted just before
  /// (`bucket_insertion::in_layers`), put back in their layers with the experts'; `ddp_traced`:
  /// the traces ran DDP (their all-reduces since replaced).
  template <class Members>
  [[nodiscard]] static change insert_gradients(context& ctx, graph::built_job& b, const moe_config& to, std::int64_t hidden, int tp,
                                               const detail::expert_width& traced, Members&& members, const model::nccl_model& nccl,
                                               const model::hardware& hw,
                                               const char* why = "the traces reduce no expert gradients (EP = DP x CP: one replica of each "
                                                                 "expert shard)",
                                               const char* was = "none (1 expert-data-parallel rank)",
                                               const std::vector<std::array<graph::task_id, 4>>& dense = {}, bool ddp_traced = false) {
    const job_structure& st = ctx.structure(b);
    // DDP (the dense gradients all-reduced, or `ddp_traced` where a pass replaced the traced
    // ones): the experts' buckets all-reduced, nothing gathered.
    const bool ddp = ddp_traced || traced_ddp(st);
    // The buckets need the traced TP and layers only (the experts' parameters are given): a MoE
    // trace's FFN width, which the dense shape needs, is often unread.
    shape_config shape = ctx.shape_from ? *ctx.shape_from : shape_config{};
    if (!ctx.shape_from) shape.hidden = hidden, shape.ffn = hidden, shape.heads = 1, shape.seq = 1, shape.tp = std::max(1, tp);
    const int matrices = st.model.gated_mlp || traced.fused || traced.inputs > 1 ? 3 : 2;  // gate, up and down; or up and down
    const std::int64_t params = matrices * hidden * (to.expert_ffn / std::max(1, tp)) * (to.experts / to.ep);
    const int dp_to = ctx.options.dp.value_or(st.parallel.dp.value.value_or(1));
    // With `--layers` the all-gathers are the target's layers', with a pipeline change each target
    // chunk's buckets are over its own layers; each reduce-scatter goes with the layer closing its
    // bucket, which the layer change repeats or removes and the split moves. (A zero-bubble
    // target's weight gradients are told by the layers' shape, which MoE traces may not give.)
    std::vector<std::uint8_t> weight_gradients;
    bucket_target layout;
    layout.layers = ctx.options.layers.value_or(0);
    if (ctx.shape_from || !ctx.options.schedule || !ctx.options.schedule->splits_backward) layout = bucket_layout(ctx, b, shape, weight_gradients);
    const expert_gradient_insertion g = insert_expert_gradients(ctx.job, b, st, shape, layout, params, model::megatron_bucket_params(dp_to), members,
                                                                nccl, hw, ctx.costs(b).profile, ddp);
    if (g.buckets == 0) {
      return note("moe", "expert gradients", "the traces reduce no expert gradients (EP = DP x CP) and no final backward pass was found to "
                                             "place the target's after: the prediction lacks them");
    }
    ctx.refresh(b);
    attach_to_layers(ctx.structure(b), g.in_layers);
    std::vector<std::array<graph::task_id, 4>> carried;
    for (const auto& tasks : dense) {
      std::array<graph::task_id, 4> now{};
      for (std::size_t i = 0; i < tasks.size(); ++i) {
        now[i] = tasks[i] == graph::no_task || tasks[i] >= g.moved.size() || g.moved[tasks[i]].empty() ? graph::no_task : g.moved[tasks[i]].front();
      }
      if (now[0] != graph::no_task && now[2] != graph::no_task && now[3] != graph::no_task) carried.push_back(now);
    }
    attach_to_layers(ctx.structure(b), carried);
    char reduced[128];
    if (ddp) {
      std::snprintf(reduced, sizeof reduced, "all-reduced in %.3f ms", static_cast<double>(g.scatter_first) / 1e6);
    } else {
      std::snprintf(reduced, sizeof reduced, "reduce-scattered in %.3f ms and all-gathered in %.3f ms", static_cast<double>(g.scatter_first) / 1e6,
                    static_cast<double>(g.gather_first) / 1e6);
    }
    char line[640];
    std::snprintf(line, sizeof line,
                  "%s; the target's are inserted "
                  "over %d expert-data-parallel ranks as Megatron's %s reduces them: %zu buckets on %zu ranks "
                  "(%zu on a stream of their own), the first rank's %lld expert parameters %s (NCCL model)",
                  why, g.group, ddp ? "DDP (no distributed optimizer)" : "distributed optimizer", g.buckets, g.ranks, g.own_streams,
                  static_cast<long long>(g.params_first), reduced);
    return changed("moe", "expert gradients", was, std::to_string(g.group) + " expert-data-parallel ranks",
                   line, {count_figure("expert gradient buckets inserted", g.buckets),
                          time_figure(ddp ? "expert all-reduce time (first rank)" : "expert reduce-scatter time (first rank)", 0, g.scatter_first)});
  }

  /// The per-expert launches of `ops` planned for the target's local experts (one edit with the
  /// removals). Throws `lumos::error` when a loop of per-expert GEMMs must change length and its
  /// units cannot be told.
  [[nodiscard]] static detail::expert_launch_plan plan_launches(graph::built_job& b, const std::vector<detail::moe_op>& ops,
                                                                const detail::moe_ranks& ranks, const moe_config& from,
                                                                const moe_config& to) {
    std::vector<detail::expert_launch> launches;
    for (const detail::moe_op& o : ops) {
      if (o.kind != detail::moe_op_kind::expert_gemm) continue;
      launches.push_back({.task = o.task, .rank = o.rank, .owner = o.owner, .pass = o.pass, .layer = o.layer, .phase = o.phase,
                          .loop = o.rows > 0, .experts = static_cast<std::int64_t>(o.experts)});
    }
    const std::int64_t l1 = from.experts / from.ep, l2 = to.experts / to.ep;
    detail::expert_launch_plan plan = detail::expert_launch_groups(b.graph, detail::expert_runs(b.graph, launches, ranks.local), l1, l2);
    if (ranks.loop && !ranks.grouped && l1 != l2 && plan.runs == 0) {
      throw error("whatif --ep/--experts: the traces run their experts as a loop of per-expert GEMMs whose per-expert units "
                  "(the same GEMM count for each expert, launched from one host thread) cannot be told, so the loop's length "
                  "cannot follow the experts per rank; only --top-k, --expert-ffn and --routing rewrite them");
    }
    return plan;
  }

  [[nodiscard]] static change moe_change(const moe_config& from, const moe_config& to, moe_routing routing, const std::string& note,
                                         const moe_stats& s) {
    auto text = [](const moe_config& c) {
      return "EP " + std::to_string(c.ep) + ", " + std::to_string(c.experts) + " experts, " +
             (c.top_k_known ? "top-" + std::to_string(c.top_k) : std::string("top-k unknown")) + ", expert FFN " +
             std::to_string(c.expert_ffn);
    };
    char line[2048];
    std::snprintf(line, sizeof line,
                  "%s -> %s (%s routing; %s): %zu expert GEMMs rescaled by the kernel model of the copies each rank computes "
                  "(%.0f -> %.0f on the slowest rank) over experts / EP, %.3f -> %.3f ms; %zu routers, %zu top-k, %zu "
                  "permutations, %zu expert activations rescaled; %zu all-to-alls re-timed through the NCCL model over the "
                  "target's EP group, %zu removed (EP 1), %zu inserted from EP 1 (%zu joined over their EP group), %.3f -> %.3f ms; %zu expert-data-parallel gradient collectives re-timed "
                  "for the expert parameters per rank over DP x CP / EP ranks, %.3f -> %.3f ms, %zu removed (one replica of each "
                  "expert shard); %zu optimizer kernels by the parameters per rank; per-expert launches of %zu runs: %zu removed, "
                  "%zu added (each with its launch call); %zu grouped operators with the launches folded into their host time: "
                  "%.3f -> %.3f ms; other launches and CPU work as traced",
                  text(from).c_str(), text(to).c_str(), routing == moe_routing::balanced ? "balanced" : "measured", note.c_str(),
                  s.expert_gemms, s.copies_from, s.copies_to, static_cast<double>(s.expert_before) / 1e6,
                  static_cast<double>(s.expert_after) / 1e6, s.routers, s.routes, s.permutes, s.activations, s.all_to_alls, s.removed, s.inserted,
                  s.joined, static_cast<double>(s.a2a_before) / 1e6, static_cast<double>(s.a2a_after) / 1e6, s.expert_gradients,
                  static_cast<double>(s.gradient_before) / 1e6, static_cast<double>(s.gradient_after) / 1e6, s.gradients_removed,
                  s.optimizer, s.launch_runs, s.launches_removed, s.launches_added, s.folded, static_cast<double>(s.host_before) / 1e6,
                  static_cast<double>(s.host_after) / 1e6);
    return changed("moe", "MoE", text(from), text(to), line,
                   {count_figure("expert GEMMs rescaled", s.expert_gemms), time_figure("expert GEMM time", s.expert_before, s.expert_after),
                    count_figure("all-to-alls re-timed", s.all_to_alls), count_figure("all-to-alls removed", s.removed),
                    time_figure("all-to-all time", s.a2a_before, s.a2a_after), count_figure("all-to-alls inserted", s.inserted),
                    count_figure("per-expert launches removed", s.launches_removed),
                    count_figure("per-expert launches added", s.launches_added)});
  }
};
static_assert(Rewrite<moe_pass>);

}  // namespace lumos::whatif

#pragma once
// What a MoE what-if's written traces (`lumos whatif --trace-out`) record for the target: the
// traced events keep their names and args, but an event whose args size the experts' work or the
// EP messages is written with the target's sizes (report::arg_edits), so that `lumos inspect
// --structure` of the written job reads the target's experts per rank, tokens per expert, top-k
// and all-to-all messages, as a job traced at the target would record them:
//  - each grouped expert GEMM's `Input Dims`: the target's experts per rank, their token rows
//    (the copies the rank computes in the target) and the expert FFN width;
//  - each EP all-to-all's `In`/`Out msg nelems`, `In`/`Out split size` (each peer's share as
//    traced where the EP degree stays, else the target's peers evenly) and its operator's
//    `Input Dims` (the first dimension of each tensor), by the messages' ratio (top-k and
//    tokens per rank); its group's name, ranks and size the target's EP group's.
//  - the router's operators of each MoE layer (its GEMMs, forward and backward, and the
//    operators whose `Input Dims` hold the tokens x experts scores: top-k, softmax, their
//    gradients): the tokens by the tokens-per-rank ratio (`--micro-batch`, `--seq`, `--cp`) and
//    the experts the target's, so that the written job's top-k (copies / router tokens) and
//    experts (the router GEMM's N) read the target's. A dim whose traced size is two of tokens,
//    experts and hidden cannot be told and is left as traced.
// A context-parallel all-to-all (Ulysses) is left as traced; the other GEMMs keep their traced
// shapes (the shape pass writes no dims).

#include <lumos/report/simulated_job.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/moe_comms.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/moe.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lumos::whatif::detail {

/// A grouped expert GEMM's operator in the traces: job rank index, event, and whether it
/// computes a weight gradient (its tokens are the K of each expert's GEMM).
struct grouped_op_ref {
  std::size_t rank = 0;
  std::uint32_t event = 0;
  bool wgrad = false;
};

/// An operator of a MoE layer in the traces that may hold the router's sizes: job rank index,
/// event, its layer, and whether it is the router's GEMM (else another operator of the layer,
/// rewritten only where one of its tensors is the tokens x experts scores).
struct router_op_ref {
  std::size_t rank = 0;
  std::uint32_t event = 0;
  int layer = -1;
  bool gemm = false;
};

/// Adds to `routers` (the router GEMMs of `st`'s MoE layers) the enclosing operators (innermost
/// and outermost) of each GPU op of those layers that scores or selects experts (top-k, softmax,
/// sigmoid, scatter, their gradients) by its kernel's or operators' names: a rotary table of seq
/// x head dim elsewhere in the layer can have the scores' shape. Linear in the GPU ops.
inline void add_score_ops(const trace::job& job, const job_structure& st, std::vector<router_op_ref>& routers) {
  static constexpr const char* score_ops[] = {"topk", "softmax", "sigmoid", "scatter"};
  std::set<std::pair<std::size_t, int>> layers;
  for (const router_op_ref& r : routers) layers.insert({r.rank, r.layer});
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.comm || c.layer < 0 || c.shape_op != no_event || !layers.count({c.rank, c.layer})) continue;
    const trace::rank_trace& t = job.ranks[c.rank];
    std::string names = lower(t.name(t.events[c.op]));
    for (const std::uint32_t e : {c.inner_op, c.cpu_op}) {
      if (e != no_event) names += "|" + lower(t.name(t.events[e]));
    }
    if (std::none_of(std::begin(score_ops), std::end(score_ops), [&](const char* n) { return names.find(n) != std::string::npos; })) continue;
    for (const std::uint32_t e : {c.inner_op, c.cpu_op}) {
      if (e != no_event) routers.push_back({c.rank, e, c.layer, false});
    }
  }
}

/// `{{4, 8}, {2}}` → `[[4, 8], [2]]`, as the traces write `Input Dims`.
[[nodiscard]] inline std::string dims_json(const std::vector<std::vector<std::int64_t>>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    out += i ? ", [" : "[";
    for (std::size_t j = 0; j < dims[i].size(); ++j) out += (j ? ", " : "") + std::to_string(dims[i][j]);
    out += "]";
  }
  return out + "]";
}

/// The sizes a MoE what-if changes: the experts per rank, the expert FFN width per rank (as
/// the GEMMs see it: fused gate and up twice the FFN) and the all-to-all messages' ratio.
struct moe_written_sizes {
  std::int64_t local_from = 0, local_to = 0, width_from = 0, width_to = 0, hidden = 0;
  double messages = 1.0;
  int tp = 1, dpcp = 1, ep = 1;  ///< the target's EP group: Megatron's order over TP and DP x CP
  int ep_from = 1;
  std::int64_t experts_from = 0, experts_to = 0;  ///< the experts of a MoE layer, traced and target
  double tokens = 1.0;                            ///< the tokens per rank, target over traced
};

/// The router operator's dims `d` for the target, `tokens` the rows its rank's router saw in the
/// traces; empty when nothing changes or (not the router's GEMM, `gemm`) no tensor of `d` is
/// the tokens x experts scores.
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> router_dims_for(std::vector<std::vector<std::int64_t>> d, std::int64_t tokens,
                                                                           bool gemm, const moe_written_sizes& z) {
  const std::int64_t e = z.experts_from;
  const auto scores = [&](const std::vector<std::int64_t>& v) { return v.size() == 2 && v[0] == tokens && v[1] == e; };
  if (tokens <= 0 || (!gemm && std::none_of(d.begin(), d.end(), scores))) return {};
  // With as many tokens as experts or as the hidden width a dim of that size could be either.
  const bool by_tokens = tokens != e && tokens != z.hidden, by_experts = e != tokens && e != z.hidden;
  const std::int64_t tokens_to = std::max<std::int64_t>(1, std::llround(static_cast<double>(tokens) * z.tokens));
  bool changed = false;
  for (auto& v : d) {
    for (std::int64_t& x : v) {
      const std::int64_t to = by_tokens && x == tokens ? tokens_to : by_experts && x == e ? z.experts_to : x;
      changed = changed || to != x;
      x = to;
    }
  }
  return changed ? d : std::vector<std::vector<std::int64_t>>{};
}

/// The grouped GEMM's dims `d` for the target, `rows` its token copies there; empty when they
/// are not the tokens-by-weights shapes the MoE structure reads (left as traced).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> grouped_dims_for(std::vector<std::vector<std::int64_t>> d, bool wgrad, double rows,
                                                                            const moe_written_sizes& z) {
  const auto g = grouped_dims_of(d);
  if (!g || g->experts != z.local_from || z.local_to <= 0) return {};
  const auto width = [&](std::int64_t v) {
    if (v == z.hidden) return v;
    if (v == z.width_from) return z.width_to;
    return 2 * v == z.width_from ? z.width_to / 2 : v;
  };
  const std::int64_t to_rows = std::max<std::int64_t>(0, std::llround(rows));
  if (wgrad) {
    // Per expert: [experts x width, rows / experts] and [experts, rows / experts, width].
    if (d[0][1] != d[1][1] || d[0][0] % z.local_from != 0) return {};
    const std::int64_t per = to_rows / z.local_to;
    d[0] = {z.local_to * width(d[0][0] / z.local_from), per};
    d[1] = {z.local_to, per, width(d[1][2])};
  } else {
    d[0] = {to_rows, width(d[0][1])};
    d[1] = {z.local_to, width(d[1][1]), width(d[1][2])};
  }
  for (std::size_t i = 2; i < d.size(); ++i) {
    if (d[i].size() == 1 && d[i][0] == z.local_from) d[i][0] = z.local_to;
  }
  return d;
}

/// `[a, b]` with `total` elements over `peers` entries, evenly (the remainder on the first).
[[nodiscard]] inline std::string even_splits(std::int64_t total, int peers) {
  std::string out = "[";
  for (int i = 0; i < peers; ++i) out += (i ? ", " : "") + std::to_string(total / peers + (i < total % peers ? 1 : 0));
  return out + "]";
}

/// The edits of an all-to-all event `i` of `t` (a kernel, a `record_param_comms` or the
/// all-to-all operator) for the target. `name`: its target group's name.
inline void all_to_all_edits(const trace::rank_trace& t, std::uint32_t i, const moe_written_sizes& z, const std::string& name,
                             std::vector<report::arg_edit>& out) {
  const auto scaled = [&](std::int64_t v) { return std::max<std::int64_t>(0, std::llround(static_cast<double>(v) * z.messages)); };
  for (const auto key : {trace::arg_key::in_msg_nelems, trace::arg_key::out_msg_nelems}) {
    if (const auto v = t.arg(i, key)) out.push_back({key, std::to_string(scaled(*v))});
  }
  for (const auto key : {trace::arg_key::in_split_size, trace::arg_key::out_split_size}) {
    const auto splits = parse_int_list(t.arg_text(i, key));
    std::int64_t total = 0;
    for (const std::int64_t s : splits) total += s;
    if (splits.empty()) continue;
    // As many peers: each keeps its share (the measured routing); else the target's peers evenly.
    std::string text = even_splits(scaled(total), z.ep);
    if (splits.size() == static_cast<std::size_t>(z.ep)) {
      text = "[";
      for (std::size_t k = 0; k < splits.size(); ++k) text += (k ? ", " : "") + std::to_string(scaled(splits[k]));
      text += "]";
    }
    out.push_back({key, "\"" + text + "\""});
  }
  if (!t.arg_text(i, trace::arg_key::process_group_name).empty() && !name.empty()) {
    out.push_back({trace::arg_key::process_group_name, "\"" + name + "\""});
  }
  if (t.arg(i, trace::arg_key::group_size)) out.push_back({trace::arg_key::group_size, std::to_string(z.ep)});
  if (!t.arg_text(i, trace::arg_key::process_group_ranks).empty()) {
    std::string ranks = "[";
    const std::vector<int> members = ep_members(t.rank, z.tp, z.dpcp, z.ep);
    for (std::size_t k = 0; k < members.size(); ++k) ranks += (k ? ", " : "") + std::to_string(members[k]);
    out.push_back({trace::arg_key::process_group_ranks, "\"" + ranks + "]\""});
  }
  if (t.events[i].cat == trace::category::cpu_op && is_all_to_all_op(t.name(t.events[i]))) {
    auto dims = parse_dims(t.arg_text(i, trace::arg_key::input_dims));
    bool plain = !dims.empty();
    for (auto& d : dims) {
      plain = plain && !d.empty();
      if (!d.empty()) d[0] = scaled(d[0]);
    }
    if (plain) out.push_back({trace::arg_key::input_dims, dims_json(dims)});
  }
}

/// Whether event `i` of `t` is an EP all-to-all's: a kernel or `record_param_comms` whose
/// collective is one (not of a context-parallel group), or an all-to-all operator.
[[nodiscard]] inline bool ep_all_to_all_event(const trace::rank_trace& t, std::uint32_t i) {
  std::string name = lower(t.arg_text(i, trace::arg_key::collective_name));
  std::erase(name, '_');
  if (name.find("alltoall") != std::string::npos) return !context_parallel_description(t.arg_text(i, trace::arg_key::process_group_desc));
  return t.events[i].cat == trace::category::cpu_op && is_all_to_all_op(t.name(t.events[i])) && !t.arg_text(i, trace::arg_key::input_dims).empty();
}

/// The args of `job`'s events the written traces carry for the target (see the header comment).
/// `grouped`: the grouped expert GEMMs; `copies`, `traced_copies`: per job rank, the token
/// copies its experts compute in the target and in the traces; `routers`: the operators of the
/// MoE layers that may hold the router's sizes, `router_tokens` per job rank the rows its router
/// saw. O(events).
[[nodiscard]] inline report::arg_edits moe_written_args(const trace::job& job, const std::vector<grouped_op_ref>& grouped,
                                                        const std::vector<double>& copies, const std::vector<double>& traced_copies,
                                                        const std::vector<router_op_ref>& routers,
                                                        const std::vector<std::int64_t>& router_tokens, const moe_written_sizes& z) {
  report::arg_edits out;
  for (const grouped_op_ref& g : grouped) {
    const trace::rank_trace& t = job.ranks[g.rank];
    const double from = g.rank < traced_copies.size() ? traced_copies[g.rank] : 0.0;
    if (from <= 0 || out.count({t.rank, g.event})) continue;
    const auto dims = parse_dims(t.arg_text(g.event, trace::arg_key::input_dims));
    const auto d = grouped_dims_of(dims);
    if (!d) continue;
    // A weight gradient's tokens are its experts x K; another's its rows.
    const double rows = static_cast<double>(g.wgrad ? d->experts * d->k : d->rows) * copies[g.rank] / from;
    if (const auto to = grouped_dims_for(dims, g.wgrad, rows, z); !to.empty()) out[{t.rank, g.event}].push_back({trace::arg_key::input_dims, dims_json(to)});
  }
  for (const router_op_ref& r : routers) {
    const trace::rank_trace& t = job.ranks[r.rank];
    if (r.rank >= router_tokens.size() || out.count({t.rank, r.event})) continue;
    const auto to = router_dims_for(parse_dims(t.arg_text(r.event, trace::arg_key::input_dims)), router_tokens[r.rank], r.gemm, z);
    if (!to.empty()) out[{t.rank, r.event}].push_back({trace::arg_key::input_dims, dims_json(to)});
  }
  if (z.ep <= 1) return out;  // the all-to-alls are removed
  // Each rank's traced EP group; a target group is named after its first member's, and where
  // it is a part of it (a smaller EP), by which part it is, so that the ranks of one group
  // share its name and no two groups do.
  std::map<int, std::string> traced;
  for (const trace::rank_trace& t : job.ranks) {
    for (std::uint32_t i = 0; i < t.events.size() && !traced.count(t.rank); ++i) {
      if (ep_all_to_all_event(t, i) && !t.arg_text(i, trace::arg_key::process_group_name).empty()) {
        traced[t.rank] = std::string(t.arg_text(i, trace::arg_key::process_group_name));
      }
    }
  }
  for (const trace::rank_trace& t : job.ranks) {
    const int first = ep_members(t.rank, z.tp, z.dpcp, z.ep).front();
    std::string name = traced.count(first) ? traced[first] : std::string();
    if (z.ep < z.ep_from && !name.empty()) name += "/" + std::to_string(dp_index_of(first, z.tp, z.dpcp) % z.ep_from / z.ep);
    for (std::uint32_t i = 0; i < t.events.size(); ++i) {
      if (!ep_all_to_all_event(t, i)) continue;
      std::vector<report::arg_edit> edits;
      all_to_all_edits(t, i, z, name, edits);
      if (!edits.empty()) out[{t.rank, i}] = std::move(edits);
    }
  }
  return out;
}

}  // namespace lumos::whatif::detail

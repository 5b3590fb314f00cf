#pragma once
// Structure facet: mixture-of-experts layers and the all-to-alls of the iteration. A MoE layer
// is read from the first forward pass of each rank as PyTorch and Megatron-LM trace it: the
// router (a GEMM from the hidden width to one score per expert, then a top-k operator:
// `aten::topk`, `torch.ops.aten.topk`), then the rank's experts, either one grouped GEMM
// (`aten::_grouped_mm`, grouped_gemm's `gmm`, Transformer Engine's grouped linear) whose `Input
// Dims` give the rows and the local experts, or a loop of per-expert GEMMs whose rows are the
// tokens each expert received. The all-to-alls (NCCL AllToAll / SendRecv kernels, c10d
// all-to-all operators) are listed joined across ranks, with the sizes and split sizes recorded.

#include <lumos/graph/detail/builder.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/groups.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// Whether CPU operator `name` selects the top-k experts of a router's scores.
[[nodiscard]] inline bool is_topk_op(std::string_view name) { return lower(name).find("topk") != std::string::npos; }

/// Whether CPU operator `name` is a grouped GEMM over several experts.
[[nodiscard]] inline bool is_grouped_gemm_op(std::string_view name) {
  const std::string l = lower(name);
  return l.find("grouped_mm") != std::string::npos || l.find("grouped_gemm") != std::string::npos ||
         l.find("groupedgemm") != std::string::npos || l.find("groupedlinear") != std::string::npos || l.ends_with("::gmm") ||
         l == "gmm";
}

/// `[2048, 1024, 0]` → {2048, 1024, 0}: a list of integers as `In split size` records it.
[[nodiscard]] inline std::vector<std::int64_t> parse_int_list(std::string_view text) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < text.size();) {
    if ((text[i] >= '0' && text[i] <= '9') || text[i] == '-') {
      std::int64_t v = 0;
      const auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
      if (ec != std::errc{}) return out;
      out.push_back(v);
      i = static_cast<std::size_t>(p - text.data());
    } else {
      ++i;
    }
  }
  return out;
}

/// A grouped GEMM's `Input Dims`: tokens [rows, K] and weights [experts, K, N] (or [experts,
/// N, K], transposed).
struct grouped_gemm_dims {
  std::int64_t rows = 0, experts = 0, k = 0, n = 0;
};

[[nodiscard]] inline std::optional<grouped_gemm_dims> grouped_dims_of(const std::vector<std::vector<std::int64_t>>& d) {
  if (d.size() < 2 || d[0].size() != 2 || d[1].size() != 3) return std::nullopt;
  if (d[0][1] == d[1][1]) return grouped_gemm_dims{d[0][0], d[1][0], d[0][1], d[1][2]};
  if (d[0][1] == d[1][2]) return grouped_gemm_dims{d[0][0], d[1][0], d[0][1], d[1][1]};
  return std::nullopt;
}

/// One MoE layer as one rank's forward pass shows it.
struct moe_layer_rec {
  std::int64_t tokens = 0, hidden = 0, experts = 0;  ///< the router GEMM's M, K and N
  std::string router, topk;                          ///< the operators' names
  std::int64_t local = 0;                            ///< experts the rank computes (0: not seen)
  std::int64_t rows = 0;                             ///< token copies its experts computed
  std::vector<std::int64_t> per_expert;              ///< loop of GEMMs: rows of each expert
  std::string grouped;                               ///< the grouped GEMM operator, if any
  std::uint32_t a2a = no_event;                      ///< the first all-to-all launched in the layer
  std::int64_t received = -1;                        ///< its `Out msg nelems` (-1: not recorded)
  /// An all-gather launched between the router and the experts: its `In`/`Out msg nelems` (-1:
  /// not recorded), the ranks it gathers over (0: not recorded), and whether the layer's
  /// all-to-all came before it. See `copy_replicas`.
  struct gather {
    std::int64_t in = -1, out = -1;
    int ranks = 0;
    bool after_all_to_all = false;
  };
  std::vector<gather> gathers;
};

/// The GEMM launch `l` ran under, when it is a plain (M × K)·(K × N) one with recorded dims.
[[nodiscard]] inline std::optional<gemm_shape> linear_gemm_of(const trace::rank_trace& t, const launch_rec& l) {
  if (l.shape_op == no_event) return std::nullopt;
  auto gs = gemm_of(t.name(t.events[l.shape_op]), parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)));
  if (!gs || gs->kind != gemm_shape::role::linear) return std::nullopt;
  return gs;
}

/// The launches of the first forward pass of rank `ri` (every forward launch when no pass
/// was found).
[[nodiscard]] inline std::vector<std::size_t> first_forward_launches(const discovery_inputs& in, const job_structure& out, std::size_t ri) {
  const rank_work& rw = in.ranks[ri];
  const auto& passes = out.ranks[ri].passes;
  for (std::size_t p = 0; p < passes.size() && p < rw.pass_launches.size(); ++p) {
    if (passes[p].op.kind == pipeline::op_kind::forward) return rw.pass_launches[p];
  }
  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < rw.launches.size(); ++i) {
    if (rw.launches[i].phase == phase_kind::forward) all.push_back(i);
  }
  return all;
}

/// The expert GEMMs launch `l` adds to the open MoE layer `m`: a grouped GEMM reading the
/// hidden width, or (in a loop) a GEMM that writes the hidden width from another width for
/// fewer rows than the router saw: one expert's down projection (a shared expert or a dense
/// MLP computes every token).
inline void add_expert_gemm(const trace::rank_trace& t, const launch_rec& l, std::uint32_t& last_op, moe_layer_rec& m) {
  if (const auto gs = linear_gemm_of(t, l)) {
    if (l.shape_op == last_op) return;
    last_op = l.shape_op;
    if (m.grouped.empty() && gs->n == m.hidden && gs->k != m.hidden && gs->m != m.tokens) {
      m.per_expert.push_back(gs->m);
      m.rows += gs->m;
      m.local = static_cast<std::int64_t>(m.per_expert.size());
    }
    return;
  }
  if (l.cpu_op == no_event || l.cpu_op == last_op || !m.grouped.empty() || !m.per_expert.empty()) return;
  last_op = l.cpu_op;
  const std::string_view name = t.name(t.events[l.cpu_op]);
  if (!is_grouped_gemm_op(name)) return;
  if (const auto g = grouped_dims_of(parse_dims(t.arg_text(l.cpu_op, trace::arg_key::input_dims))); g && g->k == m.hidden) {
    m.grouped = std::string(name);
    m.local = g->experts;
    m.rows = g->rows;
  }
}

/// What collective launch `l` of rank `ri` inside MoE layer `m` tells: the layer's first
/// all-to-all, or an all-gather before its experts (of tokens or of token copies: which, is
/// told once the experts' rows are known, by `copy_replicas`).
inline void note_layer_comm(const discovery_inputs& in, std::size_t ri, const comm_args_source& args_of, const launch_rec& l,
                            moe_layer_rec& m) {
  const trace::rank_trace& t = in.job.ranks[ri];
  const std::uint32_t src = args_of.of(l.op);
  std::string kind = comm_kind(t.name(t.events[l.op]), t.arg_text(src, trace::arg_key::collective_name));
  const std::size_t peers = l.instance >= 0 ? in.participants(l.instance).size() : 0;
  if (kind == "sendrecv" && peers > 2) kind = "alltoall";
  if (kind == "alltoall" && m.a2a == no_event) {
    m.a2a = l.op;
    m.received = t.arg(src, trace::arg_key::out_msg_nelems).value_or(-1);
  }
  if (kind != "allgather" || m.rows != 0) return;
  moe_layer_rec::gather g;
  g.in = t.arg(src, trace::arg_key::in_msg_nelems).value_or(-1);
  g.out = t.arg(src, trace::arg_key::out_msg_nelems).value_or(-1);
  g.ranks = collective_ranks_of(in, t, src, l).count();
  g.after_all_to_all = m.a2a != no_event;
  m.gathers.push_back(g);
}

/// The MoE layers of rank `ri`'s first forward pass, in launch order. Linear in its launches.
[[nodiscard]] inline std::vector<moe_layer_rec> read_moe_layers(const discovery_inputs& in, const job_structure& out, std::size_t ri) {
  const trace::rank_trace& t = in.job.ranks[ri];
  const rank_work& rw = in.ranks[ri];
  std::vector<moe_layer_rec> layers;
  std::optional<gemm_shape> last_gemm;
  std::string last_gemm_name;
  std::uint32_t last_op = no_event, last_expert_op = no_event;
  const comm_args_source args_of(t);
  for (const std::size_t li : first_forward_launches(in, out, ri)) {
    const launch_rec& l = rw.launches[li];
    if (l.comm) {
      if (!layers.empty() && !l.p2p) note_layer_comm(in, ri, args_of, l, layers.back());
      continue;
    }
    if (!layers.empty()) add_expert_gemm(t, l, last_expert_op, layers.back());
    if (const auto gs = linear_gemm_of(t, l)) {
      last_gemm = gs;
      last_gemm_name = std::string(t.name(t.events[l.shape_op]));
      continue;
    }
    if (l.cpu_op == no_event || l.cpu_op == last_op) continue;
    last_op = l.cpu_op;
    const std::string_view name = t.name(t.events[l.cpu_op]);
    // A router scores each token against every expert: fewer outputs than inputs.
    if (is_topk_op(name) && last_gemm && last_gemm->n > 1 && last_gemm->n < last_gemm->k) {
      moe_layer_rec m;
      m.tokens = last_gemm->m, m.hidden = last_gemm->k, m.experts = last_gemm->n;
      m.router = last_gemm_name, m.topk = std::string(name);
      layers.push_back(std::move(m));
      last_gemm.reset();
      last_expert_op = no_event;
    }
  }
  return layers;
}

/// Whether CPU operator `name` is an all-to-all (`c10d::alltoall_base_`, `all_to_all_single`).
[[nodiscard]] inline bool is_all_to_all_op(std::string_view name) {
  const std::string l = lower(name);
  return l.find("alltoall") != std::string::npos || l.find("all_to_all") != std::string::npos;
}

/// The CPU operators of rank trace `t` that are all-to-alls, by start (then event order).
[[nodiscard]] inline std::vector<std::uint32_t> all_to_all_ops(const trace::rank_trace& t) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < t.events.size(); ++i) {
    if (t.events[i].cat == trace::category::cpu_op && is_all_to_all_op(t.name(t.events[i]))) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(), [&](std::uint32_t a, std::uint32_t b) { return t.events[a].ts < t.events[b].ts; });
  return out;
}

/// The innermost all-to-all operator of `ops` (`all_to_all_ops`) around the runtime call of
/// launch `l` (an autograd function or a module's operator may enclose it), or `no_event`: the
/// latest to start before the call that encloses it (the last in event order among equal
/// starts). Searched back from the call, so an enclosed launch costs the operators nested in
/// the innermost one, not all of them.
[[nodiscard]] inline std::uint32_t enclosing_all_to_all(const trace::rank_trace& t, const std::vector<std::uint32_t>& ops, const launch_rec& l) {
  if (l.call == no_event) return no_event;
  const trace::event& c = t.events[l.call];
  auto it = std::upper_bound(ops.begin(), ops.end(), c.ts, [&](const auto ts, std::uint32_t i) { return ts < t.events[i].ts; });
  while (it != ops.begin()) {
    const trace::event& e = t.events[*--it];
    if (e.lane == c.lane && e.end() >= c.end()) return *it;
  }
  return no_event;
}

/// The elements an all-to-all launch sent and received: its `In`/`Out msg nelems`, else the
/// input and output tensors of the all-to-all operator `op` that launched it (`Input Dims`:
/// output first). -1 where neither says.
[[nodiscard]] inline std::pair<std::int64_t, std::int64_t> all_to_all_elements(const trace::rank_trace& t, std::uint32_t src,
                                                                               std::uint32_t op, std::string& source) {
  const auto i = t.arg(src, trace::arg_key::in_msg_nelems), o = t.arg(src, trace::arg_key::out_msg_nelems);
  if (i || o) {
    source = "In/Out msg nelems";
    return {i.value_or(-1), o.value_or(-1)};
  }
  if (op == no_event) return {-1, -1};
  const auto d = parse_dims(t.arg_text(op, trace::arg_key::input_dims));
  if (d.size() < 2) return {-1, -1};
  auto numel = [](const std::vector<std::int64_t>& v) {
    std::int64_t n = 1;
    for (const auto x : v) n *= x;
    return v.empty() ? std::int64_t{-1} : n;
  };
  source = "Input Dims of '" + std::string(t.name(t.events[op])) + "' (output, input)";
  return {numel(d[1]), numel(d[0])};
}

}  // namespace detail

/// Fills `out.all_to_alls`: every all-to-all launched in the iteration of any rank, one entry
/// per graph collective instance (its ranks, each rank's message sizes, the split sizes), in
/// the order the first rank that ran each launched it. Runs after `discover_groups`. Linear in
/// launches where each all-to-all launch is inside an all-to-all operator (see
/// `enclosing_all_to_all`).
inline void discover_all_to_alls(const discovery_inputs& in, job_structure& out) {
  std::map<int, std::size_t> of_instance;
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const trace::rank_trace& t = in.job.ranks[ri];
    const detail::comm_args_source args_of(t);
    const std::vector<std::uint32_t> ops = detail::all_to_all_ops(t);
    for (const auto& l : in.ranks[ri].launches) {
      if (!l.comm || l.p2p) continue;
      const std::uint32_t src = args_of.of(l.op);
      std::string kind = detail::comm_kind(t.name(t.events[l.op]), t.arg_text(src, trace::arg_key::collective_name));
      if (kind == "sendrecv" && l.instance >= 0 && in.participants(l.instance).size() > 2) kind = "alltoall";
      if (kind != "alltoall") continue;
      const auto found = l.instance >= 0 ? of_instance.find(l.instance) : of_instance.end();
      if (found == of_instance.end()) {
        all_to_all_info a;
        a.group = std::string(t.arg_text(src, trace::arg_key::process_group_name));
        if (a.group.empty()) a.group = l.instance >= 0 ? "world" : "(unmatched, peers absent)";
        a.phase = l.phase;
        if (l.instance >= 0) of_instance[l.instance] = out.all_to_alls.size();
        out.all_to_alls.push_back(std::move(a));
      }
      all_to_all_info& a = out.all_to_alls[found == of_instance.end() ? out.all_to_alls.size() - 1 : found->second];
      std::string from = "not recorded";
      const auto [sent, received] = detail::all_to_all_elements(t, src, detail::enclosing_all_to_all(t, ops, l), from);
      a.ranks.push_back(t.rank);
      a.in_elements.push_back(sent);
      a.out_elements.push_back(received);
      if (a.source.empty() || a.source == "not recorded") a.source = from;
      if (a.in_splits.empty() && a.out_splits.empty()) {
        a.in_splits = detail::parse_int_list(t.arg_text(src, trace::arg_key::in_split_size));
        a.out_splits = detail::parse_int_list(t.arg_text(src, trace::arg_key::out_split_size));
        if (!a.in_splits.empty() || !a.out_splits.empty()) a.source += "; In/Out split size of rank " + std::to_string(t.rank);
      }
    }
  }
}

namespace detail {

/// The ranks that compute each token copy a router of MoE layer `m` sent (expert tensor
/// parallelism splits each expert's width over them), from the all-gather that brought its
/// experts their rows, as Megatron's token dispatchers launch it:
///  - after the dispatch all-to-all, the received copies all-gathered over the expert-TP group:
///    its whole is the experts' rows;
///  - with no all-to-all, the router's tokens (its shard) all-gathered over EP x expert TP ranks
///    (the allgather dispatcher: the ranks / EP) or, at EP 1, the copies over the expert-TP
///    group (their whole the experts' rows).
/// The ranks gathered from: the whole over the input where `In msg nelems` is less than `Out`
/// (PyTorch records the input), else (a writer that gives the gathered whole for both, as
/// `lumos synth` does) over the rank's shard or the copies the all-to-all received, else the
/// group's ranks (`tp` where not recorded). The whole of a token gather given alone is the shard
/// times at most the `world`. An all-gather of other sizes (FSDP's of the experts' weights, the
/// dropless dispatcher's token counts) gathers no token; one whose sizes are not recorded is
/// taken as a gather of tokens. 1 when none gathers; `how` says which did.
[[nodiscard]] inline std::int64_t copy_replicas(const moe_layer_rec& m, std::int64_t tp, std::int64_t world, std::string& how) {
  const std::int64_t ep = m.local > 0 && m.experts % m.local == 0 ? m.experts / m.local : 1;
  const std::int64_t shard = m.tokens * m.hidden, rows = m.rows * m.hidden;
  std::int64_t replicas = 1;
  for (const moe_layer_rec::gather& g : m.gathers) {
    const std::int64_t whole = std::max(g.in, g.out), input = g.in > 0 && g.in < whole ? g.in : -1;
    // With no all-to-all at EP > 1 the dispatcher gathers tokens, even where their whole
    // happens to be the experts' rows (top-k = EP).
    const bool copies = whole < 0 || (rows > 0 && whole == rows && (g.after_all_to_all || ep == 1));
    const bool tokens = !g.after_all_to_all && (whole < 0 || (shard > 0 && (input > 0 ? input == shard
                                                                                        : whole % shard == 0 && whole / shard <= world)));
    if (!copies && !tokens) continue;
    std::int64_t part = input;
    if (part < 0 && copies && g.after_all_to_all && m.received > 0 && m.received < whole) part = m.received;
    if (part < 0 && !copies && whole > shard) part = shard;
    const std::int64_t parts = part > 0 && whole % part == 0 ? whole / part : g.ranks > 0 ? g.ranks : tp;
    const std::int64_t per_copy = g.after_all_to_all ? parts : parts % ep == 0 ? parts / ep : 0;
    if (per_copy <= 0) continue;
    replicas = per_copy;
    how = std::string(copies ? "the copies" : "the tokens") + " all-gathered from " + std::to_string(parts) + " ranks " +
          (g.after_all_to_all ? "after the all-to-all" : "before the experts" + (ep > 1 ? std::string(", EP ") + std::to_string(ep) : std::string()));
  }
  return replicas;
}

/// `moe.top_k`: the token copies the experts computed over the tokens the routers saw times the
/// ranks that compute each copy (`copy_replicas`), summed over the ranks (every token visits
/// top-k experts, so the sums agree when no token is dropped or padded and every rank of the
/// expert-parallel group is in the job).
inline void moe_top_k(const std::vector<std::vector<moe_layer_rec>>& per_rank, const fact<int>& tp, std::int64_t world, moe_structure& moe) {
  std::int64_t rows = 0, tokens = 0, replicated = 1;
  std::string how;
  for (const auto& layers : per_rank) {
    if (layers.empty() || layers.front().rows <= 0) continue;
    rows += layers.front().rows;
    std::string gathered;
    const std::int64_t replicas = copy_replicas(layers.front(), tp.value.value_or(1), world, gathered);
    tokens += layers.front().tokens * replicas;
    if (replicas > replicated) replicated = replicas, how = gathered;
  }
  if (rows <= 0 || tokens <= 0) {
    moe.top_k.source = "no expert GEMM with recorded shapes after the router";
    moe.expert_tp.source = moe.top_k.source;
    return;
  }
  moe.expert_tp.value = static_cast<int>(replicated);
  moe.expert_tp.source = replicated > 1 ? how + " (first MoE layer)"
                                        : "no all-gather of the token copies before the experts: each copy computed on one rank";
  const double ratio = static_cast<double>(rows) / static_cast<double>(tokens);
  const double k = std::round(ratio);
  const std::string why = "token copies the experts computed (" + std::to_string(rows) + ") / tokens the routers saw" +
                          (replicated > 1 ? " × the " + std::to_string(replicated) + " ranks computing each copy (" + how + ")" : std::string()) +
                          " (" + std::to_string(tokens) + "), first MoE layer summed over the ranks";
  if (k >= 1 && std::abs(ratio - k) <= 0.02 * k) {
    moe.top_k.value = static_cast<int>(k);
    moe.top_k.source = why;
  } else {
    moe.top_k.source = why + " is not a whole number (capacity padding, dropped tokens, or EP peers absent)";
  }
}

/// `moe.expert_tokens` from the first MoE layer `m` of job rank index `ri`: the rows of each expert's GEMMs
/// in a loop, else the split sizes its dispatch all-to-all received, else the grouped GEMM's
/// rows divided evenly.
inline void moe_expert_tokens(const discovery_inputs& in, std::size_t ri, const moe_layer_rec& m, moe_structure& moe) {
  const trace::rank_trace& t = in.job.ranks[ri];
  const std::string where = " (first MoE layer of the first forward pass on rank " + std::to_string(t.rank) + ")";
  if (!m.per_expert.empty()) {
    moe.expert_tokens.value = m.per_expert;
    moe.expert_tokens.source = "M of each expert's down-projection GEMM" + where;
    moe.expert_tokens_per = "expert";
    return;
  }
  if (m.a2a != no_event) {
    const comm_args_source args_of(t);
    auto splits = parse_int_list(t.arg_text(args_of.of(m.a2a), trace::arg_key::out_split_size));
    if (!splits.empty()) {
      moe.expert_tokens.value = std::move(splits);
      moe.expert_tokens.source = "Out split size of the dispatch all-to-all" + where;
      moe.expert_tokens_per = "ep_peer";
      return;
    }
  }
  if (!m.grouped.empty() && m.local > 0) {
    // Even, the remainder one each on the first experts: the sizes still sum to the rows.
    std::vector<std::int64_t> even(static_cast<std::size_t>(m.local), m.rows / m.local);
    for (std::int64_t x = 0; x < m.rows % m.local; ++x) ++even[static_cast<std::size_t>(x)];
    moe.expert_tokens.value = std::move(even);
    moe.expert_tokens.source = "rows of '" + m.grouped + "' (" + std::to_string(m.rows) + ") / " + std::to_string(m.local) +
                               " experts, taken as even: the per-expert sizes are not recorded" + where;
    moe.expert_tokens_per = "expert";
    return;
  }
  moe.expert_tokens.source = "no expert GEMM with recorded shapes after the router" + where;
}

}  // namespace detail

/// Fills `out.moe`: the MoE layers, experts, experts per rank, top-k, EP degree, expert TP and per-expert
/// tokens, each with where it was read; all unknown when no rank's first forward pass has a
/// router. Sets `out.parallel.ep` from the experts' sharding when the groups gave none or 1.
/// Runs after `discover_passes` and `discover_parallel_degrees`. Linear in launches.
inline void discover_moe(const discovery_inputs& in, job_structure& out) {
  moe_structure& moe = out.moe;
  std::vector<std::vector<detail::moe_layer_rec>> per_rank;
  std::size_t first = in.rank_count();
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    per_rank.push_back(detail::read_moe_layers(in, out, ri));
    if (first == in.rank_count() && !per_rank.back().empty()) first = ri;
  }
  if (first == in.rank_count()) {
    moe.layers.source = "no router (a GEMM to fewer outputs than inputs, then a top-k operator) in a forward pass";
    return;
  }
  const detail::moe_layer_rec& m = per_rank[first].front();
  const std::string where = " (first forward pass on rank " + std::to_string(in.job.ranks[first].rank) + ")";
  moe.layers.value = static_cast<int>(per_rank[first].size());
  moe.layers.source = "routers: a GEMM to one score per expert, then '" + m.topk + "'" + where;
  moe.experts.value = static_cast<int>(m.experts);
  moe.experts.source = "N of the router GEMM '" + m.router + "' (" + std::to_string(m.tokens) + " × " + std::to_string(m.hidden) +
                       " · " + std::to_string(m.hidden) + " × " + std::to_string(m.experts) + ")" + where;
  if (m.local > 0) {
    moe.experts_per_rank.value = static_cast<int>(m.local);
    moe.experts_per_rank.source = !m.grouped.empty() ? "experts of the weights of '" + m.grouped + "' (Input Dims)" + where
                                                     : "per-expert GEMMs writing the hidden width after the router" + where;
  } else {
    moe.experts_per_rank.source = "no expert GEMM with recorded shapes after the router" + where;
  }
  if (m.local > 0 && m.experts % m.local == 0) {
    moe.ep.value = static_cast<int>(m.experts / m.local);
    moe.ep.source = "experts " + std::to_string(m.experts) + " / experts per rank " + std::to_string(m.local);
    // The groups' EP stands when a group's role said it; "no all-to-all" (a dispatch over a
    // group named for another role, or none) yields to the experts' sharding.
    auto& par = out.parallel.ep;
    if (!par.known() || (*par.value == 1 && *moe.ep.value > 1)) {
      par = moe.ep;
    } else if (*par.value != *moe.ep.value) {
      out.notes.push_back("MoE: experts / experts per rank gives EP " + std::to_string(*moe.ep.value) + ", the all-to-all groups " +
                          std::to_string(*par.value));
    }
  } else {
    moe.ep = out.parallel.ep;
  }
  std::int64_t world = static_cast<std::int64_t>(in.rank_count());
  for (const trace::rank_trace& t : in.job.ranks) world = std::max<std::int64_t>(world, t.world_size.value_or(0));
  detail::moe_top_k(per_rank, out.parallel.tp, world, moe);
  // No token gathered before the experts: the copies are the routers' own. Under sequence
  // parallelism (reduce-scatters over the TP group in forward passes) each router holds 1/TP of
  // the tokens, so each copy is computed on one rank (expert TP 1); without it every TP rank routes
  // every token and computes every copy, on its 1/TP of the experts' width (expert TP = TP).
  const int tp = out.parallel.tp.value.value_or(1);
  if (moe.expert_tp.value == 1 && tp > 1) {
    const bool sp = std::any_of(out.groups.begin(), out.groups.end(), [](const process_group& g) {
      const bool is_tp = std::any_of(g.roles.begin(), g.roles.end(), [](const auto& r) { return r.value == group_role::tp; });
      return is_tp && std::any_of(g.collectives.begin(), g.collectives.end(), [](const auto& c) { return c.first == "reducescatter in forward"; });
    });
    if (!sp) {
      moe.expert_tp.value = tp;
      moe.expert_tp.source = "no all-gather of the token copies before the experts and no sequence parallelism (no reduce-scatter "
                             "over the TP group in forward passes): every TP rank computes every copy on its share of the experts' width";
    }
  }
  detail::moe_expert_tokens(in, first, m, moe);
}

/// The traces' expert-tensor-parallel size: `st.moe.expert_tp`, else (no expert GEMM with
/// recorded shapes) the TP size, Megatron's default.
[[nodiscard]] inline int traced_expert_tp(const job_structure& st) noexcept {
  return std::max(1, st.moe.expert_tp.value.value_or(st.parallel.tp.value.value_or(1)));
}

/// The expert grid's ranks beside one expert-TP group for `dpcp` DP x CP ranks of a stage: the
/// stage's TP x `dpcp` ranks over the traces' expert TP (`dpcp` itself when expert TP = TP), over
/// which EP and the expert-data-parallel groups fold.
[[nodiscard]] inline int expert_grid_ranks(const job_structure& st, int dpcp) noexcept {
  return std::max(1, st.parallel.tp.value.value_or(1) * dpcp / traced_expert_tp(st));
}

}  // namespace lumos::whatif

#pragma once
// Mixture-of-experts layer shapes on one rank (tokens routed, token copies its experts compute,
// grouped-GEMM sizes) and the token-dispatch collectives of one MoE layer, for the compute
// models (compute.hpp, kernel_costs.hpp), the program builder and the memory model.

#include <lumos/core/error.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::model {

/// The sizes of one MoE layer on one rank for one micro-batch of T = b s tokens, t = tp,
/// x = expert_tp() (the expert-tensor-parallel size), balanced routing (every expert receives the same share; what the Megatron-Bridge
/// benchmarks force). See `expert_token_factor` (memory.hpp) for the derivation of `copies`.
/// Unbalanced routing (`moe_spec::load_imbalance` f > 1) gives the busiest EP rank's sizes: its
/// experts compute f x `copies` (and f x `rows`); what it routes (`tokens`, `routed`) does not change.
struct moe_layer_shape {
  double tokens = 0;         ///< tokens the rank's router sees: T / t (its sequence shard), T when t = 1
  double routed = 0;         ///< token copies the rank sends to experts: tokens x top_k x capacity
  /// token copies the rank's experts compute: routed x x, the copies of the x ranks of its
  /// expert-tensor-parallel group (T x top_k x capacity when x = t)
  double copies = 0;
  double local_experts = 0;  ///< routed experts on the rank: experts / ep
  double rows = 0;           ///< rows of each expert's GEMMs: copies / local_experts
  double width = 0;          ///< each expert's FFN slice: expert_ffn / x
  double shared_width = 0;   ///< the shared experts' FFN slice: shared_experts x expert_ffn / t
  /// Model FLOPs per executed FLOP of the expert GEMMs: 1 / capacity factor (padding is not
  /// useful work, dropped tokens are not done), 1 when dropless.
  double model_fraction = 1;
};

/// The shape of one MoE layer of `m` under `par`. Precondition: `m.is_moe()` and `par` validates.
[[nodiscard]] constexpr moe_layer_shape moe_shape(const transformer& m, const parallel_config& par) noexcept {
  moe_layer_shape x;
  const double t = par.tp;
  const double T = static_cast<double>(par.local_seq(m)) * static_cast<double>(par.micro_batch);
  const double factor = expert_token_factor(m);
  x.tokens = par.sequence_parallel() ? T / t : T;
  x.routed = x.tokens * factor;
  const int etp = par.expert_tp();
  x.copies = (etp == par.tp ? T : x.tokens * etp) * factor * m.moe.load_imbalance;
  x.local_experts = static_cast<double>(m.moe.experts / par.ep);
  x.rows = x.copies / x.local_experts;
  x.width = static_cast<double>(m.moe.expert_ffn) / etp;
  x.shared_width = static_cast<double>(m.moe.shared_experts * m.moe.expert_ffn) / t;
  x.model_fraction = m.moe.capacity_factor > 0 ? 1.0 / m.moe.capacity_factor : 1.0;
  return x;
}

/// The group a token-dispatch collective runs over: the expert-parallel group (ep ranks,
/// stride expert_tp()), the expert-tensor-parallel group (expert_tp() consecutive ranks; the
/// tensor-parallel group when expert_tp() = tp), or both together (ep x expert_tp() consecutive
/// ranks: the allgather dispatcher's group).
enum class moe_group : std::uint8_t { ep, tp, ep_tp };

/// Where a dispatch collective sits in the MoE layer's ops (see `moe_layer_collectives`).
enum class moe_hook : std::uint8_t {
  after_permute,     ///< forward, after the permutation (alltoall dispatch)
  before_permute,    ///< forward, before the permutation (allgather dispatch)
  before_unpermute,  ///< forward, before the unpermutation (alltoall combine)
  after_unpermute,   ///< forward, after the unpermutation (allgather combine)
  after_unpermute_grad,   ///< backward, after the unpermutation's gradient
  before_unpermute_grad,  ///< backward, before it (allgather)
  before_permute_grad,    ///< backward, before the permutation's gradient
  after_permute_grad,     ///< backward, after it (allgather)
};

/// One token-dispatch collective of a MoE layer per micro-batch.
struct moe_collective {
  std::string_view name;
  collective kind;
  std::int64_t bytes;  ///< nccl-tests convention (comm.hpp `collective`)
  moe_group group;
  moe_hook hook;
};

/// The dispatch collectives of one MoE layer in execution order, forward then backward
/// (Megatron's token dispatchers):
///  - alltoall: dropless, before the permutation, the all-gather of the token counts per expert
///    (int64) over the EP x expert-TP group; forward, after the permutation, the all-to-all dispatch over the EP group (each
///    rank's `routed` copies, h wide) and, with expert_tp() > 1, the all-gather of the received
///    copies over the expert-TP group (expert tensor parallelism); before the unpermutation their reverse
///    (reduce-scatter, all-to-all combine). Backward mirrors them: after the unpermutation's
///    gradient the all-to-all and the all-gather, before the permutation's gradient the
///    reduce-scatter and the all-to-all. Empty when ep = 1 and expert_tp() = 1.
///  - allgather: the tokens (not their copies) all-gathered over the EP x expert-TP group before
///    the permutation, the outputs reduce-scattered after the unpermutation; backward the reverse.
///    Empty when ep x expert_tp() = 1.
/// Full recomputation repeats the forward ones in backward; callers add them. Into `out`
/// (overwritten). Precondition: `m.is_moe()` (else `out` is empty).
inline void moe_layer_collectives(const transformer& m, const parallel_config& par, std::vector<moe_collective>& out) {
  out.clear();
  if (!m.is_moe()) return;
  const moe_layer_shape x = moe_shape(m, par);
  const double row = static_cast<double>(m.hidden) * activation_bytes(par.dtype);
  using C = collective;
  using H = moe_hook;
  const int etp = par.expert_tp();
  if (m.moe.dispatcher == moe_dispatcher::allgather) {
    if (std::int64_t{par.ep} * etp <= 1) return;
    const auto gathered = static_cast<std::int64_t>(x.tokens * row * par.ep * etp);
    out.push_back({"moe_dispatch_all_gather", C::all_gather, gathered, moe_group::ep_tp, H::before_permute});
    out.push_back({"moe_combine_reduce_scatter", C::reduce_scatter, gathered, moe_group::ep_tp, H::after_unpermute});
    out.push_back({"moe_combine_grad_all_gather", C::all_gather, gathered, moe_group::ep_tp, H::before_unpermute_grad});
    out.push_back({"moe_dispatch_grad_reduce_scatter", C::reduce_scatter, gathered, moe_group::ep_tp, H::after_permute_grad});
    return;
  }
  // The busiest EP rank receives load_imbalance x the balanced copies; an all-to-all ends with
  // its largest receiver (moe_spec::load_imbalance).
  const auto sent = static_cast<std::int64_t>(x.routed * row * m.moe.load_imbalance);
  const auto gathered = static_cast<std::int64_t>(x.copies * row);
  const bool ep = par.ep > 1, tp = etp > 1;
  // Dropless: the int64 token counts per expert all-gathered over the EP x expert-TP group
  // (the dispatcher's preprocess; tiny, latency-bound, before the host reads the splits).
  if (m.moe.capacity_factor <= 0 && (ep || tp)) {
    out.push_back({"moe_token_count_all_gather", C::all_gather, m.moe.experts * 8 * par.ep * etp, moe_group::ep_tp, H::before_permute});
  }
  if (ep) out.push_back({"moe_dispatch_all_to_all", C::all_to_all, sent, moe_group::ep, H::after_permute});
  if (tp) out.push_back({"moe_dispatch_tp_all_gather", C::all_gather, gathered, moe_group::tp, H::after_permute});
  if (tp) out.push_back({"moe_combine_tp_reduce_scatter", C::reduce_scatter, gathered, moe_group::tp, H::before_unpermute});
  if (ep) out.push_back({"moe_combine_all_to_all", C::all_to_all, sent, moe_group::ep, H::before_unpermute});
  if (ep) out.push_back({"moe_combine_grad_all_to_all", C::all_to_all, sent, moe_group::ep, H::after_unpermute_grad});
  if (tp) out.push_back({"moe_combine_grad_tp_all_gather", C::all_gather, gathered, moe_group::tp, H::after_unpermute_grad});
  if (tp) out.push_back({"moe_dispatch_grad_tp_reduce_scatter", C::reduce_scatter, gathered, moe_group::tp, H::before_permute_grad});
  if (ep) out.push_back({"moe_dispatch_grad_all_to_all", C::all_to_all, sent, moe_group::ep, H::before_permute_grad});
}

/// The `moe_spec::load_imbalance` of measured routing: `loads[j]` token copies per expert j of a
/// trace, spread over the target's `experts` experts (each traced expert's load split evenly
/// over experts / loads.size() consecutive target experts, or consecutive groups of
/// loads.size() / experts traced experts summed), the target experts dealt to the `ep` ranks
/// in consecutive blocks of experts / ep as Megatron places them, and the busiest rank's share
/// over the mean (1 / ep). Throws `lumos::error` when the counts do not nest (neither of
/// loads.size() and experts divides the other), ep does not divide experts, or the loads are
/// empty, negative or all zero. O(loads + experts).
[[nodiscard]] inline double expert_load_imbalance(const std::vector<std::int64_t>& loads, std::int64_t experts, int ep) {
  const auto n = static_cast<std::int64_t>(loads.size());
  if (n == 0) throw error("measured routing: no per-expert token counts");
  if (experts <= 0 || ep <= 0 || experts % ep != 0) {
    throw error("measured routing: ep (" + std::to_string(ep) + ") must divide the experts (" + std::to_string(experts) + ")");
  }
  if (experts % n != 0 && n % experts != 0) {
    throw error("measured routing: the trace's " + std::to_string(n) + " expert loads do not map onto " + std::to_string(experts) +
                " experts (one count must divide the other)");
  }
  double total = 0;
  for (const std::int64_t v : loads) {
    if (v < 0) throw error("measured routing: a negative token count (" + std::to_string(v) + ")");
    total += static_cast<double>(v);
  }
  if (!(total > 0)) throw error("measured routing: every expert received 0 tokens");
  std::vector<double> share(static_cast<std::size_t>(experts), 0.0);
  if (n >= experts) {
    for (std::int64_t j = 0; j < n; ++j) share[static_cast<std::size_t>(j / (n / experts))] += static_cast<double>(loads[static_cast<std::size_t>(j)]) / total;
  } else {
    const double split = static_cast<double>(experts / n);
    for (std::int64_t e = 0; e < experts; ++e) share[static_cast<std::size_t>(e)] = static_cast<double>(loads[static_cast<std::size_t>(e / (experts / n))]) / total / split;
  }
  const std::int64_t per_rank = experts / ep;
  double busiest = 0;
  for (std::int64_t r = 0; r < ep; ++r) {
    double sum = 0;
    for (std::int64_t e = r * per_rank; e < (r + 1) * per_rank; ++e) sum += share[static_cast<std::size_t>(e)];
    busiest = std::max(busiest, sum);
  }
  return std::max(1.0, busiest * ep);
}

/// Placement of an expert-parallel group in the folded expert grid (`parallel_config`): ep
/// ranks, stride expert_tp() (with etp = tp: ep ranks of the DP x CP group). Its node span (an
/// EP group wider than a node sends its all-to-alls over the network) follows. O(ep).
[[nodiscard]] inline group_placement expert_parallel_group(const parallel_config& par, const hardware& hw) {
  return detail::place(0, par.expert_tp(), par.ep, hw);
}

/// Placement of an expert-data-parallel group (the replicas of one expert shard):
/// `expert_data_parallel()` ranks, stride ep x expert_tp(). O(expert_data_parallel()).
[[nodiscard]] inline group_placement expert_data_parallel_group(const parallel_config& par, const hardware& hw) {
  return detail::place(0, std::int64_t{par.expert_tp()} * par.ep, par.expert_data_parallel(), hw);
}

/// Placement of the group `g` of `par`.
[[nodiscard]] inline group_placement moe_group_placement(moe_group g, const parallel_config& par, const hardware& hw) {
  switch (g) {
    case moe_group::ep: return expert_parallel_group(par, hw);
    case moe_group::tp: return par.expert_tp() == par.tp ? tensor_parallel_group(par, hw) : detail::place(0, 1, par.expert_tp(), hw);
    case moe_group::ep_tp: return detail::place(0, 1, std::int64_t{par.expert_tp()} * par.ep, hw);
  }
  return {};
}

}  // namespace lumos::model

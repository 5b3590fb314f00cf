#pragma once
// The parameters of each pipeline stage of a MoE job whose layers or stages change (`lumos whatif
// --layers N`, `--pp N` on MoE traces), which the shape pass cannot count there (no dense FFN in
// the layers): per traced stage, those of the target stage it stands for (`traced_stage_to`: the
// first stays first, the last stays last) over its own, by the model's count
// (model::stage_parameters_per_rank and its routed experts' share). The optimizer's kernels of a
// rank follow the parameters it steps, its data-parallel gradient collectives after the backward
// (the parameters' all-gathers) the stage's dense parameters and its expert-data-parallel ones
// the stage's routed experts'; the buckets reduced inside the layers go with their layers.

#include <lumos/model/flops.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/whatif/detail/moe_comms.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <vector>

namespace lumos::whatif::detail {

/// Per traced stage: the target's parameters on one rank of the stage it stands for over the
/// traces' on one rank of it.
struct stage_parameter_ratios {
  std::vector<double> optimizer;  ///< the parameters its optimizer steps (model::optimizer_parameters_per_rank)
  std::vector<double> dense;      ///< its parameters apart from the routed experts' (the data-parallel group's)
  std::vector<double> experts;    ///< its routed experts' (the expert-data-parallel group's)

  /// The ratio of `of` for traced stage `stage` (1 out of range).
  [[nodiscard]] static double at(const std::vector<double>& of, int stage) noexcept {
    return stage >= 0 && static_cast<std::size_t>(stage) < of.size() ? of[static_cast<std::size_t>(stage)] : 1.0;
  }
};

/// The pipeline stage of global rank `rank` in Megatron's numbering (TP x DP x CP ranks a stage).
[[nodiscard]] constexpr int stage_of(int rank, int tp, int dp) noexcept { return rank / (std::max(1, tp) * std::max(1, dp)); }

/// The ratios of model `to` on `par_to` over `from` on `par_from`, per stage of `par_from`. A
/// count that is 0 in both (no routed expert on a stage of dense layers) gives 1.
[[nodiscard]] inline stage_parameter_ratios stage_ratios(const model::transformer& from, const model::parallel_config& par_from,
                                                         const model::transformer& to, const model::parallel_config& par_to) {
  const auto ratio = [](double b, double a) { return a > 0 ? b / a : 1.0; };
  stage_parameter_ratios out;
  for (int s = 0; s < par_from.pp; ++s) {
    const int t = std::clamp(traced_stage_to(s, par_from.pp, par_to.pp), 0, par_to.pp - 1);
    const auto all_a = static_cast<double>(model::stage_parameters_per_rank(from, par_from, s));
    const auto all_b = static_cast<double>(model::stage_parameters_per_rank(to, par_to, t));
    const auto experts_a = static_cast<double>(model::stage_expert_parameters_per_rank(from, par_from, s));
    const auto experts_b = static_cast<double>(model::stage_expert_parameters_per_rank(to, par_to, t));
    out.optimizer.push_back(ratio(model::optimizer_parameters_per_rank(to, par_to, t), model::optimizer_parameters_per_rank(from, par_from, s)));
    out.dense.push_back(ratio(all_b - experts_b, all_a - experts_a));
    out.experts.push_back(ratio(experts_b, experts_a));
  }
  return out;
}

/// Re-times the parameters' all-gathers of `comms` (a distributed optimizer's, after its step) for
/// the parameters of their rank's stage (`r`: the dense ones' over the data-parallel group, the
/// experts' over the expert-data-parallel one; `c` the traces' MoE configuration, `tp` and `dp`
/// their TP and DP x CP, a stage TP x DP x CP ranks on); the experts' only with `experts` (else
/// another re-timing takes them), the dense ones only with `dense`. The experts' counted in
/// `s.expert_gradients` and its times; returns how many dense ones were re-timed.
inline std::size_t retime_stage_gathers(graph::task_graph& g, const std::vector<moe_comm>& comms, const stage_parameter_ratios& r,
                                        const moe_config& c, int tp, int dp, bool experts, bool dense, const model::nccl_model& nccl,
                                        const model::hardware& hw, moe_stats& s) {
  moe_config dp_group = c;
  dp_group.ep = 1;  // the data-parallel group: every DP x CP rank at the same TP index
  moe_stats dense_stats;
  for (const moe_comm& m : comms) {
    if (m.kind != model::collective::all_gather || (m.expert ? !experts : !dense)) continue;
    const double f = stage_parameter_ratios::at(m.expert ? r.experts : r.dense, stage_of(m.rank, tp, dp));
    if (f == 1.0) continue;
    retime_moe_comm(g, m, m.expert ? c : dp_group, m.expert ? c : dp_group, tp, dp, dp, f, nccl, hw, m.expert ? s : dense_stats);
  }
  return dense_stats.expert_gradients;
}

}  // namespace lumos::whatif::detail

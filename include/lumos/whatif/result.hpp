#pragma once
// What a trace-driven what-if returns: the baseline replay, the predicted one, and the changes
// that made the prediction.

#include <lumos/report/replay_report.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/whatif/attribution.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/pipeline.hpp>
#include <lumos/whatif/pipeline_graph.hpp>
#include <lumos/whatif/summary.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/structure.hpp>

#include <optional>
#include <string>
#include <vector>

namespace lumos::whatif {

/// One side of a MoE what-if (whatif/moe.hpp): the EP degree, routed experts, top-k and expert
/// FFN width (full, not per TP rank).
struct moe_config {
  int ep = 1, experts = 0, top_k = 0;
  std::int64_t expert_ffn = 0;
  /// False when the traces do not tell their top-k (`top_k` is then 1, a placeholder: only the
  /// ratio of the two sides' top-k is used, and no --top-k change is made).
  bool top_k_known = true;
  friend bool operator==(const moe_config&, const moe_config&) = default;
};

/// A MoE what-if's traced and target configuration and its routing.
struct moe_summary {
  moe_config from, to;
  moe_routing routing = moe_routing::measured;
};

/// The baseline replay, the predicted one, and what was changed.
struct whatif_result {
  report::replay_session baseline;
  report::replay_session predicted;
  /// What the passes did, in the order they did it (change.hpp).
  std::vector<change> changes;
  /// Set when the pipeline changed (stages, chunks, schedule or micro-batches) and the change
  /// was not made in the graph: the pass-level prediction; `predicted.simulated_ns` is then its
  /// iteration and `predicted.ranks` keep the replay it is anchored on (the traces' stages with
  /// any DP change).
  std::optional<pipeline_prediction> pipeline;
  /// Set when the pipeline change was made in the graph (pipeline_change.hpp): `predicted.ranks`
  /// then hold every rank of every stage.
  std::optional<stage_split> stages;
  /// With `pipeline`: why the change was not made in the graph (empty: no stage count asked for).
  std::string pipeline_reason;
  std::optional<shape_summary> shape;  ///< when the traces' model shape is known
  /// What structure discovery found in the traces (`lumos inspect --structure`).
  std::optional<job_structure> structure;
  /// Pipeline bubble of the prediction: the pass-level model's (whatif/pipeline.hpp) when the
  /// pipeline changed or the traces have stages (the model of the rewritten graph's own passes),
  /// 0 without pipeline parallelism; unset when the traces' schedule is not known.
  std::optional<double> bubble_fraction;
  std::string bubble_source;
  /// Why the step moved as much as it did (attribution.hpp).
  attribution why;
  /// The predicted step at other host speeds, when the prediction's critical path is mostly
  /// host work (the step then follows the host): `host_sensitivity` in whatif.hpp.
  struct host_point {
    double host_speed;     ///< relative to the prediction's host
    time_ns iteration_ns;  ///< the predicted step on that host
  };
  std::vector<host_point> host_sensitivity;
  /// Set when a MoE change was asked (`--ep`, `--experts`, `--top-k`, `--expert-ffn`, `--routing`).
  std::optional<moe_summary> moe;
  /// The traced events' args `--trace-out` writes with the target's values (a MoE change's
  /// expert GEMM shapes and all-to-all messages: whatif/detail/moe_written.hpp).
  report::arg_edits written_args;
  double host_speed = 1.0;  ///< the prediction's host speed relative to the traced host's (whatif_options)
  /// With `whatif_options::host_profile`: the profile's name and the ops its host entry shares
  /// with the traces, whose median ratio gave `host_speed`.
  std::string host_profile;
  std::size_t host_ops = 0;
};

}  // namespace lumos::whatif

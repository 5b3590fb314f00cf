#pragma once
// The target configuration of a trace-driven what-if (`lumos whatif`): what to change, and the
// facts about the traces that the rewrites may need from the user.

#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace lumos::whatif {

/// How the experts' loads of a MoE what-if are set (whatif/moe.hpp): as the traces measured
/// them, or even over the experts.
enum class moe_routing : std::uint8_t { measured, balanced };

/// The mixture-of-experts part of a target (whatif/moe.hpp); unset fields keep the traces' own.
struct moe_target {
  std::optional<int> ep, experts, top_k;
  std::optional<std::int64_t> expert_ffn;  ///< each expert's FFN width (full, not per TP rank)
  std::optional<moe_routing> routing;

  [[nodiscard]] bool any() const noexcept { return ep || experts || top_k || expert_ffn || routing; }
};

/// One target configuration. Unset fields keep the traces' own.
struct whatif_options {
  report::replay_options replay;  ///< step and scales, applied to the baseline and the prediction
  std::string gpu;                ///< target hardware preset
  std::string from_gpu;           ///< source preset, when the traces' device name has none
  /// Transformer layers of the target (the traces' layers from structure discovery).
  std::optional<int> layers;
  shape_target shape;  ///< hidden/FFN/heads/sequence/micro-batch/TP of the target (configuration.hpp)
  structure_options structure;  ///< facts the user supplies about the traces (`--structure-*`)
  /// The traced cluster's cost profile (`lumos calibrate`): the kernel model of the shape and TP
  /// rewrites and the NCCL model of the DP and cross-node re-timing. Unset: the preset of the
  /// traced GPU.
  std::optional<model::cost_profile> profile;
  /// Data-parallel replicas (whatif/data_parallel.hpp) and the global batch in sequences (as
  /// `lumos predict --global-batch`), counted in micro-batches of the traces' size.
  std::optional<int> dp;
  std::optional<std::int64_t> global_batch;
  /// Pipeline stages, chunks and schedule (whatif/pipeline_change.hpp, whatif/pipeline.hpp). The
  /// schedule is any `pipeline::PipelineSchedule` type, as `synth::policy_of<S>()` (a user's
  /// included), or a shipped one by name (`synth::parse_schedule`).
  std::optional<int> pp, vp;
  std::optional<synth::schedule_policy> schedule;
  /// Training precision of the target (whatif/precision.hpp): fp8 from bf16 or fp16 traces.
  std::optional<model::precision> precision;
  /// Expert parallelism, experts, top-k, expert FFN and routing of a MoE target (whatif/moe.hpp).
  moe_target moe;
  /// Fully sharded data parallelism of the target (whatif/fsdp.hpp): on or off, hybrid sharding's
  /// shard group, and whether backward passes gather the parameters again. Unset: the traces'.
  std::optional<bool> fsdp;
  std::optional<int> hsdp;
  std::optional<bool> reshard_after_forward;
  /// The target host's CPU speed relative to the traced host's: the prediction's CPU times are
  /// the traced ones / `host_speed`. 1 (the default) keeps the traced host, also under `gpu`.
  double host_speed = 1.0;
  /// The target host as a cost profile with a host entry (`lumos calibrate` on a trace recorded
  /// on the target machine): the host speed is then its entry against the traces' own
  /// (`model::relative_host_speed`), in place of `host_speed`, which must stay 1.
  std::optional<model::cost_profile> host_profile;

  /// The replay options of the prediction: `replay` with the host's speed applied.
  [[nodiscard]] report::replay_options predicted_replay() const {
    report::replay_options r = replay;
    r.scales.cpu /= host_speed;
    return r;
  }

  /// A pipeline change is asked: stages, chunks or schedule.
  [[nodiscard]] bool pipeline_asked() const noexcept { return pp || vp || schedule; }
  /// A change that reads the traces' structure (layers, passes, groups, shape) is asked.
  [[nodiscard]] bool needs_structure() const noexcept {
    return dp || global_batch || pipeline_asked() || layers || shape.any() || precision || moe.any() || fsdp || hsdp ||
           reshard_after_forward;
  }
};

}  // namespace lumos::whatif

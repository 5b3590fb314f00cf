#pragma once
// The context a what-if's rewrite passes share, and the concept a pass models.
//
// A what-if is an ordered list of rewrite passes over one context (whatif.hpp folds them). The
// context resolves once what every pass needs — the job and the options, the traced and the
// target hardware, the cost profile, the NCCL model, the kernel cost model and the discovered
// structure — and carries what a pass decides for the passes after it (the shapes, the
// micro-batches per replica, where the layers were copied, how the pipeline change is made).
// A pass that renumbers the graph's tasks calls `refresh`, so that the structure the later
// passes read names the new tasks.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/detail/tp_hook.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// How a pipeline change is made, decided once the micro-batches per replica are known
/// (`stage_plan_pass`): in the graph (the stages cut out of the traced ranks), or by the
/// pass-level model (`refused` says why not in the graph), or not at all.
struct split_choice {
  bool staged = false;  ///< the traces have pipeline stages
  bool asked = false;   ///< a split is asked: a pipeline change, or another micro-batch count with traced stages
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();  ///< the target's
  int pp = 0;  ///< the target's stages (0: none)
  int vp = 1;  ///< model chunks per stage
  std::string refused;  ///< why the change is not made in the graph ("" when it is, or none was asked)
  bool in_graph = false;
  bool merging = false;     ///< fewer stages than traced: each merged stage made from one traced stage
  bool accumulate = false;  ///< the micro-batch count changes in the graph (periods or passes repeated)
  int layers = 0;           ///< the model's layers in the split (0: the traces')
};

/// Where the micro-batch rewrite put each task, and which micro-batches it repeated or removed.
struct micro_batch_copies {
  std::vector<std::vector<graph::task_id>> copies;
  int from = 0, to = 0;    ///< micro-batches per replica before and after
  int first = 0, end = 0;  ///< micro-batches [first, end) repeated or removed
};

/// The shared state of one what-if (see the header comment).
class context {
 public:
  /// Resolves the hardware, profiles and NCCL model of `job` under `options`. Throws
  /// `lumos::error` when `--gpu` is asked of traces whose GPU has no preset.
  context(const trace::job& traced, const whatif_options& asked) : job(traced), options(asked) {
    try {
      traced_gpu = source_gpu(job, options.from_gpu);
    } catch (const error& e) {
      traced_gpu_error = e.what();
    }
    resolve_notes();
    if (traced_gpu) {
      comm_hw = *traced_gpu;
      comm_hw_note = "NVLink and NIC of the " + comm_hw.name + " preset";
    } else {
      comm_hw = model::hardware_preset("h100-sxm");
      comm_hw_note = "the traces' GPU has no preset: NVLink and NIC of the h100-sxm preset";
    }
    try {
      model::hardware hw = options.profile ? model::hardware_preset(options.profile->hardware) : source_gpu(job, options.from_gpu);
      model::nccl_model n{options.profile ? *options.profile : model::profile_preset(hw.name)};
      nccl.emplace(std::move(n), std::move(hw));
    } catch (const error&) {
      nccl.reset();  // no preset and no profile: the rewrites fit the traces' own collectives
    }
    if (!options.gpu.empty()) {
      if (!traced_gpu) throw error(traced_gpu_error);
      target_gpu = model::hardware_preset(options.gpu);
    }
  }

  const trace::job& job;
  const whatif_options& options;

  // Resolved once, before any pass.
  std::optional<model::hardware> traced_gpu;  ///< the traces' GPU preset (`--from-gpu`, else their device name)
  std::string traced_gpu_error;               ///< why there is none
  std::optional<model::hardware> target_gpu;  ///< `--gpu`
  /// The machine whose links price communication the traces do not measure: the traced GPU's
  /// preset, else the H100's (`comm_hw_note` says which).
  model::hardware comm_hw;
  std::string comm_hw_note;
  /// The NCCL model and machine of the traced cluster: the user's profile, else the traced GPU's
  /// preset profile; unset when neither is known.
  std::optional<std::pair<model::nccl_model, model::hardware>> nccl;
  /// Notes on how the inputs were read, reported before the passes' changes.
  change_list notes;

  /// The cost profile of the traced cluster: the user's calibrated one, else the traced GPU's preset.
  [[nodiscard]] model::cost_profile traced_profile() const {
    return options.profile ? *options.profile : model::profile_preset(traced_gpu ? traced_gpu->name : std::string("h100-sxm"));
  }

  // The structure of the graph being rewritten.

  /// Discovery's options: the user's facts and the replayed step.
  [[nodiscard]] structure_options discovery_options() const {
    structure_options so = options.structure;
    so.step = options.replay.step;
    return so;
  }
  /// The structure of `b`: discovered on first use, on the graph as it is then.
  [[nodiscard]] job_structure& structure(const graph::built_job& b) {
    if (!structure_) discover(b);
    return *structure_;
  }
  /// The structure discovered last, if any.
  [[nodiscard]] const std::optional<job_structure>& known_structure() const noexcept { return structure_; }
  /// Discovers the structure of `b` again after an edit that renumbered its tasks; the first
  /// structure, of the unedited graph, stays as the traces' (`traced_structure`).
  void refresh(const graph::built_job& b) {
    if (!traced_structure_) traced_structure_ = std::move(structure_);
    discover(b);
    for (const auto& place : layer_placers) place(*structure_, b);
  }
  /// What passes that inserted tasks into the layers (which discovery, reading the traces' events,
  /// does not see) run after every `refresh` to put them back in their layer groups.
  std::vector<std::function<void(job_structure&, const graph::built_job&)>> layer_placers;
  /// The structure of the traces as they were: the first one discovered.
  [[nodiscard]] const std::optional<job_structure>& traced_structure() const noexcept {
    return traced_structure_ ? traced_structure_ : structure_;
  }
  /// Sets both structures back (a pass that undoes its edit).
  void restore_structure(std::optional<job_structure> current, std::optional<job_structure> traced) {
    structure_ = std::move(current);
    traced_structure_ = std::move(traced);
  }
  [[nodiscard]] const std::optional<job_structure>& refreshed_from() const noexcept { return traced_structure_; }

  /// The kernel cost context of the traces (their GPU's profile and peaks, their dtype),
  /// resolved with the first structure. `costs_note` says when no preset named the GPU.
  [[nodiscard]] const shape_costs& costs(const graph::built_job& b) {
    (void)structure(b);
    return *costs_;
  }
  [[nodiscard]] const std::string& costs_note() const noexcept { return costs_note_; }

  // What the passes decide for the ones after them.

  std::optional<shape_config> shape_from, shape_to;  ///< the traces' model shape and the target's
  std::vector<tp_hook> tp_hooks;                     ///< where TP collectives go, from TP 1 (shape pass)
  std::optional<int> dp_from, dp_to;                 ///< the data-parallel change, when one was made
  /// The CP pass re-timed the gradient collectives (dense and expert) for the target's DP x CP.
  bool cp_gradients = false;
  /// Gradient groups a pass re-timed for the target's DP already (the MoE pass's expert-DP
  /// groups): the data-parallel pass leaves them.
  std::set<std::string> gradient_groups_sized;
  std::optional<int> micro_batches;                  ///< per replica, when a pass changed them
  bool buckets_inserted = false;                     ///< gradient buckets were inserted (one replica traced)
  bool fsdp_inserted = false;                        ///< FSDP's collectives were inserted (`--fsdp on` from DDP or ZeRO-1, or HSDP's)
  bool hsdp_rewritten = false;                       ///< the FSDP pass resized the gradient collectives for HSDP (hsdp.hpp)
  split_choice split;                                ///< how the pipeline change is made
  /// Per task, 1 for a weight gradient (zero bubble split in the graph), found before layer copies.
  std::vector<std::uint8_t> weight_tasks;
  /// Where the layer rewrite put each task, when it ran.
  std::optional<std::vector<std::vector<graph::task_id>>> layer_copies;
  /// Where the micro-batch rewrite put each task, when it ran.
  std::optional<micro_batch_copies> period_copies;

  /// The traces' pipeline stages (1 when not known), from the first structure discovered.
  [[nodiscard]] int traced_pp() const {
    const auto& st = traced_structure();
    return st ? st->parallel.pp.value.value_or(1) : 1;
  }

  /// The traces' context parallelism (their shape's, else their CP group's size; 1 without) and
  /// the target's (`--cp`, else the traces').
  [[nodiscard]] int traced_cp() const {
    if (shape_from) return shape_from->cp;
    const auto& st = traced_structure();
    return st && st->cp.found() ? std::max(*st->cp.size.value, 1) : 1;
  }
  [[nodiscard]] int target_cp() const { return shape_to ? shape_to->cp : traced_cp(); }

  /// The traces' data-parallel replicas: their gradient group's size / their CP, since under
  /// context parallelism Megatron reduces the gradients over DP x CP ranks (discovery's DP is
  /// that group's size). Unset when the group's size is unknown; throws when it is no multiple
  /// of CP.
  [[nodiscard]] std::optional<int> traced_replicas() const {
    const auto& st = traced_structure();
    if (!st || !st->parallel.dp.known()) return std::nullopt;
    const int group = *st->parallel.dp.value, cp = traced_cp();
    if (group % cp != 0) {
      throw error("whatif: the traces' gradient group of " + std::to_string(group) + " ranks (" + st->parallel.dp.source +
                  ") is no multiple of their CP " + std::to_string(cp) + ": DP x CP ranks reduce the gradients");
    }
    return group / cp;
  }
  /// The target's gradient group: its replicas (`--dp`, else the traces') x its CP.
  [[nodiscard]] int target_gradient_group() const { return options.dp.value_or(traced_replicas().value_or(1)) * target_cp(); }

 private:
  void discover(const graph::built_job& b) {
    structure_ = discover_structure(job, b, discovery_options());
    if (!costs_) {
      std::string note;
      costs_ = costs_of(job, *structure_, options.from_gpu, &note, options.profile ? &*options.profile : nullptr);
      costs_note_ = std::move(note);
    }
  }
  /// Meant for traces that name no preset; over one they name, say which was taken.
  void resolve_notes() {
    if (options.from_gpu.empty()) return;
    const std::string device = traced_device(job);
    const std::string named = model::preset_of_device(device);
    if (!named.empty() && named != model::hardware_preset(options.from_gpu).name) {
      notes.push_back(note("input", "--from-gpu",
                           "--from-gpu " + options.from_gpu + ": the traces name '" + device + "' (" + named + "); the costs of the " +
                               options.from_gpu + " preset are taken for the traced GPU"));
    }
  }

  std::optional<job_structure> structure_, traced_structure_;
  std::optional<shape_costs> costs_;
  std::string costs_note_;
};

/// A rewrite pass of a what-if. `wanted(ctx)` says whether the options (and what the passes
/// before it decided) ask for it; `apply(ctx, b)` rewrites the graph `b` (its durations, or its
/// tasks, keeping `b.ranks` in step and calling `ctx.refresh(b)` when it renumbers them) and
/// returns what it did. A pass may also define `after_replay(ctx, result)`, which runs once the
/// rewritten graph was replayed (whatif.hpp). A user's type that models this concept runs
/// wherever a shipped pass does: `run_whatif(job, options, my_pass{})`.
template <class R>
concept Rewrite = requires(const R& r, R& m, const context& cc, context& c, graph::built_job& b) {
  { r.wanted(cc) } -> std::convertible_to<bool>;
  { m.apply(c, b) } -> std::same_as<change_list>;
};

}  // namespace lumos::whatif

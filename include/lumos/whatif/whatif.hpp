#pragma once
// Trace-driven what-if (`lumos whatif`): the graph built from a job's traces, rewritten for
// another configuration and replayed. Everything the trace measured that the change does not
// touch — CPU dispatch, launch gaps, kernels of unchanged shape, measured collectives, the kept
// overheads — stays; the waits are recomputed by the replay (docs/replay.md, *Delays*).

#include <lumos/report/replay_report.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/layers.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace lumos::whatif {

/// One target configuration. Unset fields keep the traces' own.
struct whatif_options {
  report::replay_options replay;  ///< step and scales, applied to the baseline and the prediction
  std::string gpu;                ///< target hardware preset
  std::string from_gpu;           ///< source preset, when the traces' device name has none
  /// Transformer layers of the target (the traces' layers from structure discovery).
  std::optional<int> layers;
  shape_target shape;  ///< hidden/FFN/heads/sequence/micro-batch/TP of the target (shape.hpp)
  structure_options structure;  ///< facts the user supplies about the traces (`--structure-*`)
  /// Further structural rewrites given in code: groups of tasks repeated or removed, with a
  /// sentence for the report.
  std::vector<repeat_group> groups;
  std::string groups_change;
};

/// The baseline replay, the predicted one, and what was changed.
struct whatif_result {
  report::replay_session baseline;
  report::replay_session predicted;
  std::vector<std::string> changes;
  std::optional<shape_summary> shape;  ///< when the traces' model shape is known and a shape or layer change was asked
};

/// Applies `edited` to a built job: the graph is replaced and every map follows its tasks.
inline void adopt(graph::built_job& b, edited_graph&& edited) {
  for (auto& r : b.ranks) {
    for (auto& t : r.task_of_event) t = t == graph::no_task ? t : edited.first(t);
    for (auto& t : r.arrive_of_event) t = t == graph::no_task ? t : edited.first(t);
  }
  std::vector<graph::kept_delay> kept;
  for (const auto& k : b.kept) {
    for (const graph::task_id c : edited.copies[k.task]) kept.push_back({c, k.kind, k.amount});
  }
  b.kept = std::move(kept);
  b.graph = std::move(edited.graph);
}

/// Runs the baseline and the what-if of `job`.
[[nodiscard]] inline whatif_result run_whatif(const trace::job& job, const whatif_options& o) {
  whatif_result out;
  out.baseline = report::replay_job(job, o.replay);
  std::optional<gpu_ratios> gpu;
  if (!o.gpu.empty()) {
    const model::hardware from = source_gpu(job, o.from_gpu);
    const model::hardware to = model::hardware_preset(o.gpu);
    gpu = ratios(from, to);
    char line[256];
    std::snprintf(line, sizeof line,
                  "GPU %s -> %s: compute-bound kernels x%.3f (tensor peak), memory-bound x%.3f (HBM bandwidth), transfers x%.3f "
                  "(NVLink), %.1f us per kernel kept",
                  from.name.c_str(), to.name.c_str(), gpu->compute, gpu->memory, gpu->communication,
                  static_cast<double>(gpu->fixed) / 1e3);
    out.changes.emplace_back(line);
  }
  if (!o.groups.empty()) out.changes.push_back(o.groups_change);
  std::optional<job_structure> structure;
  std::optional<shape_config> shape_from, shape_to;
  out.predicted = report::replay_job(job, o.replay, [&](graph::built_job& b) {
    std::vector<repeat_group> groups = o.groups;
    if (o.layers || o.shape.any()) {
      structure_options so = o.structure;
      so.step = o.replay.step;
      structure = discover_structure(job, b, so);
    }
    if (o.shape.any()) {
      // Shape first: layer copies and the GPU change then start from the rescaled durations.
      shape_from = traced_shape(*structure);
      shape_to = target_shape(*shape_from, o.shape);
      std::string note;
      const shape_costs costs = costs_of(job, *structure, o.from_gpu, &note);
      if (!note.empty()) out.changes.push_back(note);
      if (*shape_from == *shape_to) {
        out.changes.emplace_back("shape: the traces' own (nothing rescaled)");
      } else {
        const shape_stats ss = rescale_shape(b, job, *structure, *shape_from, *shape_to, costs);
        out.changes.push_back(describe(*shape_from, *shape_to, ss));
        if (shape_to->tp != shape_from->tp) {
          const auto world = structure->parallel.world.value.value_or(static_cast<int>(job.ranks.size()));
          out.changes.push_back(tp_fold_note(shape_from->tp, shape_to->tp, job.ranks.size(), world));
        }
      }
    }
    if (o.layers) {
      const layer_rewrite lr = layers_to(b, *structure, *o.layers);
      groups.insert(groups.end(), lr.groups.begin(), lr.groups.end());
      out.changes.push_back(lr.change);
    }
    if (!groups.empty()) {
      edited_graph e = repeat_groups(b.graph, groups);
      if (e.edges_dropped > 0) {
        out.changes.push_back(std::to_string(e.edges_dropped) + " edges of removed tasks dropped (their processors still order the rest)");
      }
      adopt(b, std::move(e));
    }
    if (gpu) {
      const gpu_change_stats st = change_gpu(b.graph, *gpu);
      char line[256];
      std::snprintf(line, sizeof line, "%zu compute-bound, %zu memory-bound, %zu host-copy and %zu communication ops rescaled: %.3f -> %.3f ms of GPU time",
                    st.compute, st.memory, st.host_copy, st.communication, static_cast<double>(st.before) / 1e6,
                    static_cast<double>(st.after) / 1e6);
      out.changes.emplace_back(line);
    }
  });
  if (structure && !shape_from) {
    try {
      shape_from = shape_to = traced_shape(*structure);
    } catch (const error&) {
      // the shape is unknown: no memory or MFU figures
    }
  }
  if (structure && shape_from) out.shape = summarize(job, *structure, *shape_from, *shape_to, o.layers, o.from_gpu, o.gpu, out.baseline.simulated_ns, out.predicted.simulated_ns);
  if (out.shape && !out.shape->memory_warning.empty()) out.changes.push_back(out.shape->memory_warning);
  return out;
}

}  // namespace lumos::whatif

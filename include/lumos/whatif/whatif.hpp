#pragma once
// Trace-driven what-if (`lumos whatif`): the graph built from a job's traces, rewritten for
// another configuration and replayed. Everything the trace measured that the change does not
// touch — CPU dispatch, launch gaps, kernels of unchanged shape, measured collectives, the kept
// overheads — stays; the waits are recomputed by the replay (docs/replay.md, *Delays*).

#include <lumos/report/replay_report.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/layers.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/pipeline.hpp>
#include <lumos/whatif/pipeline_graph.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdio>
#include <limits>
#include <optional>
#include <utility>
#include <set>
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
  /// The traced cluster's cost profile (`lumos calibrate`): the kernel model of the shape and TP
  /// rewrites and the NCCL model of the DP and cross-node re-timing. Unset: the preset of the
  /// traced GPU.
  std::optional<model::cost_profile> profile;
  /// Further structural rewrites given in code: groups of tasks repeated or removed, with a
  /// sentence for the report.
  std::vector<repeat_group> groups;
  std::string groups_change;
  /// Data-parallel replicas (whatif/data_parallel.hpp) and the global batch in sequences (as
  /// `lumos predict --global-batch`), counted in micro-batches of the traces' size.
  std::optional<int> dp;
  std::optional<std::int64_t> global_batch;
  /// Pipeline stages, chunks and schedule (whatif/pipeline.hpp).
  std::optional<int> pp, vp;
  std::optional<pipeline::schedule_kind> schedule;
};

/// The baseline replay, the predicted one, and what was changed.
struct whatif_result {
  report::replay_session baseline;
  report::replay_session predicted;
  std::vector<std::string> changes;
  /// Set when the pipeline changed (stages, chunks, schedule or micro-batches): the pass-level
  /// prediction; `predicted.simulated_ns` is then its iteration and `predicted.ranks` keep the
  /// replay it is anchored on (the traces' stages with any DP change).
  std::optional<pipeline_prediction> pipeline;
  /// Set when the pipeline change was made in the graph (PP 1 traces to 1F1B or GPipe stages,
  /// whatif/pipeline_graph.hpp): `predicted.ranks` then hold every rank of every stage.
  std::optional<stage_split> stages;
  /// With `pipeline`: why the change was not made in the graph (empty: no stage count asked for).
  std::string pipeline_reason;
  std::optional<shape_summary> shape;  ///< when the traces' model shape is known and a shape or layer change was asked
  /// What structure discovery found in the traces (`lumos inspect --structure`).
  std::optional<job_structure> structure;
  /// Pipeline bubble of the prediction: the pass-level model's (whatif/pipeline.hpp) when the
  /// pipeline changed or the traces have stages (the model of the rewritten graph's own passes),
  /// 0 without pipeline parallelism; unset when the traces' schedule is not known.
  std::optional<double> bubble_fraction;
  std::string bubble_source;
};

/// The traced TP groups' members, `from` of them, as `to` (the members beyond the traced ranks
/// numbered past the largest, as `resize_data_parallel` numbers a DP group's): what `--trace-out`
/// writes as the collectives' group, so that the written (folded) job reads back as the target.
inline void resize_tp_groups(graph::task_graph& g, const job_structure& st, int from, int to) {
  const std::set<std::string> tp_groups = groups_with_role(st, group_role::tp);
  for (auto& ci : g.collectives) {
    if (!tp_groups.count(ci.group) || static_cast<int>(ci.group_ranks.size()) != from) continue;
    int next = *std::max_element(ci.group_ranks.begin(), ci.group_ranks.end()) + 1;
    while (static_cast<int>(ci.group_ranks.size()) < to) ci.group_ranks.push_back(next++);
    ci.group_ranks.resize(static_cast<std::size_t>(to));
  }
}

/// From TP 1 to `to.tp`: Megatron's tensor-parallel collectives (`tp_hook`: tokens x hidden of
/// the target shape, or the cross-entropy's tokens in fp32, over the TP group by the NCCL model,
/// with the profile's host time per collective) inserted where `ss` found them. Returns the line
/// for `changes`.
inline std::string insert_tp_collectives(graph::built_job& b, const shape_stats& ss, const shape_config& to,
                                         const shape_costs& costs) {
  const double tokens = static_cast<double>(to.tokens());
  const double bytes = tokens * static_cast<double>(to.hidden) * costs.element_bytes;
  const auto& link = to.tp > costs.hw.gpus_per_node ? costs.profile.inter : costs.profile.intra;
  const std::string dtype = costs.dtype == model::precision::fp16 ? "f16" : "bf16";
  auto made = [&](model::collective coll, double size, std::string kind, std::string kernel) {
    tp_collective c;
    c.kind = std::move(kind);
    c.transfer = static_cast<time_ns>(std::llround(collective_ns(coll, size, to.tp, link)));
    c.launch = static_cast<time_ns>(std::llround(costs.profile.cpu_launch_ns));
    c.host = std::max<time_ns>(0, static_cast<time_ns>(std::llround(costs.profile.cpu_collective_ns)) - c.launch);
    c.kernel = std::move(kernel);
    return c;
  };
  using model::collective;
  const std::array<tp_collective, tp_message_count> kind = {
      made(collective::all_reduce, bytes, "allreduce", "ncclDevKernel_AllReduce_Sum_" + dtype + "_RING_LL"),
      made(collective::all_reduce, tokens * 4, "allreduce", "ncclDevKernel_AllReduce_Max_f32_RING_LL"),
      made(collective::all_reduce, tokens * 4, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
      made(collective::all_gather, bytes, "allgather", "ncclDevKernel_AllGather_RING_LL"),
      made(collective::reduce_scatter, bytes, "reducescatter", "ncclDevKernel_ReduceScatter_Sum_" + dtype + "_RING_LL")};
  std::array<std::size_t, tp_message_count> count{};
  for (const tp_hook& h : ss.tp_collectives) ++count[static_cast<std::size_t>(h.message)];
  (void)adopt(b, insert_tp_hooks(b.graph, ss.tp_collectives, kind));
  auto us = [&](tp_message m) { return static_cast<double>(kind[static_cast<std::size_t>(m)].transfer) / 1e3; };
  const std::size_t loss = count[1] + count[2];
  char line[768];
  if (to.sp) {
    std::snprintf(line, sizeof line,
                  "TP 1 -> %d with sequence parallelism: %zu tensor-parallel collectives inserted: %zu reduce-scatters of the "
                  "activation (after the attention output and FC2 GEMMs of every forward and recomputed forward, the QKV and FC1 "
                  "input gradients, the embedding lookup, the logits' input gradient), %.3f us; %zu all-gathers (before the QKV, "
                  "FC1 and logits GEMMs, the FC2 and attention-output input gradients, the QKV, FC1 and logits weight gradients, "
                  "the embedding's backward), %.3f us; %.0f bytes each over %d ranks by the NCCL model; %zu all-reduces of the "
                  "cross-entropy (3 after each logits GEMM), %.0f bytes each, %.3f us; %.1f us of host time each",
                  to.tp, count[4] + count[3] + loss, count[4], us(tp_message::scatter), count[3], us(tp_message::gather), bytes,
                  to.tp, loss, tokens * 4, us(tp_message::loss_max), static_cast<double>(kind[0].host + kind[0].launch) / 1e3);
  } else {
    std::snprintf(line, sizeof line,
                  "TP 1 -> %d: %zu tensor-parallel all-reduces inserted: %zu of the activation (after the attention output "
                  "and FC2 GEMMs of every forward and recomputed forward, the QKV and FC1 input gradients, the embedding "
                  "lookup, the logits' input gradient), %.0f bytes each, %.3f us by the NCCL model over %d ranks; %zu of "
                  "the cross-entropy (3 after each logits GEMM), %.0f bytes each, %.3f us; %.1f us of host time each",
                  to.tp, count[0] + loss, count[0], bytes, us(tp_message::activation), to.tp, loss, tokens * 4,
                  us(tp_message::loss_max), static_cast<double>(kind[0].host + kind[0].launch) / 1e3);
  }
  return line;
}

/// The machine whose links price communication the trace does not measure: the traces' GPU
/// preset (or `from`), else the H100 preset, with a sentence saying which.
[[nodiscard]] inline std::pair<model::hardware, std::string> comm_hardware(const trace::job& job, const std::string& from) {
  try {
    model::hardware hw = source_gpu(job, from);
    std::string note = "NVLink and NIC of the " + hw.name + " preset";
    return {std::move(hw), std::move(note)};
  } catch (const error&) {
    model::hardware hw = model::hardware_preset("h100-sxm");
    return {std::move(hw), "the traces' GPU has no preset: NVLink and NIC of the h100-sxm preset"};
  }
}

/// The NCCL model and machine that time collectives of the traced cluster: the user's profile,
/// else the preset of the traced GPU; none when the GPU has no preset.
[[nodiscard]] inline std::optional<std::pair<model::nccl_model, model::hardware>> traced_nccl(const trace::job& job,
                                                                                              const whatif_options& o) {
  try {
    model::hardware hw = o.profile ? model::hardware_preset(o.profile->hardware) : source_gpu(job, o.from_gpu);
    model::nccl_model nccl{o.profile ? *o.profile : model::profile_preset(hw.name)};
    return std::pair{std::move(nccl), std::move(hw)};
  } catch (const error&) {
    return std::nullopt;
  }
}

/// Runs the baseline and the what-if of `job`.
[[nodiscard]] inline whatif_result run_whatif(const trace::job& job, const whatif_options& o) {
  whatif_result out;
  out.baseline = report::replay_job(job, o.replay);
  if (!o.from_gpu.empty()) {
    // Meant for traces that name no preset; over one they name, say which was taken.
    const std::string device = traced_device(job);
    const std::string named = preset_of_device(device);
    if (!named.empty() && named != model::hardware_preset(o.from_gpu).name) {
      out.changes.push_back("--from-gpu " + o.from_gpu + ": the traces name '" + device + "' (" + named + "); the costs of the " +
                            o.from_gpu + " preset are taken for the traced GPU");
    }
  }
  std::optional<gpu_ratios> gpu;
  if (!o.gpu.empty()) {
    const model::hardware from = source_gpu(job, o.from_gpu);
    const model::hardware to = model::hardware_preset(o.gpu);
    // The source's costs: the user's calibrated profile when given, else the preset's.
    gpu = ratios(from, o.profile ? *o.profile : model::profile_preset(from.name), to, model::profile_preset(to.name));
    char line[512];
    std::snprintf(line, sizeof line,
                  "GPU %s -> %s (peaks x the profiles' efficiencies): GEMMs x%.3f, attention x%.3f forward x%.3f backward, "
                  "memory-bound x%.3f (norms x%.3f, softmax x%.3f, optimizer x%.3f), all-reduce x%.3f, other transfers x%.3f, "
                  "%.1f us per kernel kept",
                  from.name.c_str(), to.name.c_str(), gpu->compute, gpu->attention_forward, gpu->attention_backward, gpu->memory,
                  gpu->norm, gpu->softmax, gpu->optimizer, gpu->allreduce, gpu->communication, static_cast<double>(gpu->fixed) / 1e3);
    out.changes.emplace_back(line);
    // The algorithm is the trace's: FlashAttention stays FlashAttention on a GPU whose preset
    // profile (and so `lumos synth` and `predict` by default) runs Megatron's unfused attention.
    const model::cost_profile target_costs = model::profile_preset(to.name);
    if (target_costs.attention == model::attention_impl::unfused && traced_flash_attention(job)) {
      out.changes.push_back("the traces' FlashAttention kernels are kept (rescaled); lumos predict and synth model the " + to.name +
                            " with unfused attention unless given --attention flash");
    }
  }
  if (!o.groups.empty()) out.changes.push_back(o.groups_change);
  const bool pipeline_asked = o.pp || o.vp || o.schedule;
  std::optional<job_structure> structure;
  std::optional<job_structure> traced_structure;  // set when `structure` is discovered again on an edited graph
  std::optional<int> micro_batches;  // per replica, when DP changes them
  std::optional<shape_config> shape_from, shape_to;
  bool staged = false;  // the traces have pipeline stages
  std::optional<stage_split> split;
  std::string split_refused;  // why the pipeline change was not made in the graph
  bool buckets_inserted = false;  // a DP change from one replica inserted gradient buckets (gradient_buckets.hpp)
  out.predicted = report::replay_job(job, o.replay, [&](graph::built_job& b) {
    std::vector<repeat_group> groups = o.groups;
    if (o.dp || o.global_batch || pipeline_asked || o.layers || o.shape.any()) {
      structure_options so = o.structure;
      so.step = o.replay.step;
      structure = discover_structure(job, b, so);
    }
    // The layer copies below (or the pipeline model) repeat each layer's own work; the work
    // that follows the parameter count (optimizer kernels, gradient collectives) is rescaled with
    // the shape, the layer count and the pipeline depth.
    const int layer_params = o.layers.value_or(0);
    const int traced_pp = structure ? structure->parallel.pp.value.value_or(1) : 1;
    const int pp_params = o.pp && *o.pp != traced_pp ? *o.pp : 0;
    std::optional<shape_config> layers_shape;
    if ((layer_params || pp_params) && !o.shape.any()) {
      try {
        layers_shape = traced_shape(*structure);
      } catch (const error& e) {
        out.changes.push_back(std::string("optimizer and gradient work kept as traced: ") + e.what());
      }
    }
    if (o.shape.any() || layers_shape) {
      // Shape first: DP, layer copies and the GPU change then start from the rescaled durations.
      shape_from = layers_shape ? *layers_shape : traced_shape(*structure);
      shape_to = layers_shape ? *layers_shape : target_shape(*shape_from, o.shape);
      std::string note;
      const shape_costs costs = costs_of(job, *structure, o.from_gpu, &note, o.profile ? &*o.profile : nullptr);
      if (!note.empty()) out.changes.push_back(note);
      if (*shape_from == *shape_to && !layer_params && !pp_params) {
        out.changes.emplace_back("shape: the traces' own (nothing rescaled)");
      } else if (*shape_from == *shape_to) {
        const shape_stats ss = rescale_shape(b, job, *structure, *shape_from, *shape_to, costs, structure->model.gated_mlp, layer_params, pp_params);
        char line[256];
        std::snprintf(line, sizeof line,
                      "parameters per rank x%.3f (rank 0) with the %s: %zu optimizer ops and %zu gradient collectives rescaled, %.3f -> "
                      "%.3f ms of GPU time",
                      ss.parameter_ratio, layer_params && pp_params ? "layers and stages" : pp_params ? "stages" : "layers",
                      ss.optimizer, ss.gradient_communication, static_cast<double>(ss.before) / 1e6, static_cast<double>(ss.after) / 1e6);
        out.changes.emplace_back(line);
      } else {
        const shape_stats ss = rescale_shape(b, job, *structure, *shape_from, *shape_to, costs, structure->model.gated_mlp, layer_params, pp_params);
        out.changes.push_back(describe(*shape_from, *shape_to, ss));
        if (shape_to->tp != shape_from->tp) {
          const auto world = structure->parallel.world.value.value_or(static_cast<int>(job.ranks.size()));
          out.changes.push_back(tp_fold_note(shape_from->tp, shape_to->tp, job.ranks.size(), world));
          resize_tp_groups(b.graph, *structure, shape_from->tp, shape_to->tp);
        }
        if (!ss.tp_collectives.empty()) {
          out.changes.push_back(insert_tp_collectives(b, ss, *shape_to, costs));
          // Discovered again: the layer groups and pass costs that DP, the layer copies and the
          // pipeline model read are task ids, and now take in the inserted collectives.
          // The traces' own stays for what reads the baseline graph (the bubble, the report).
          structure_options so = o.structure;
          so.step = o.replay.step;
          traced_structure = std::move(structure);
          structure = discover_structure(job, b, so);
        }
      }
    }
    // The layout inserted gradient buckets are formed for: with a pipeline change, the target's
    // chunks and stages; to a zero-bubble target each bucket waits for its weight gradients, in
    // the W passes. `weight_gradients` holds what `bucket_target` points to.
    auto target_layout = [&](const shape_config& from, std::vector<std::uint8_t>& weight_gradients) {
      bucket_target bt;
      bt.layers = o.layers.value_or(0);
      if (!pipeline_asked) return bt;
      bt.pp = o.pp.value_or(structure->parallel.pp.value.value_or(1));
      const bool interleaved = o.vp.value_or(1) > 1 || (o.schedule && *o.schedule == pipeline::schedule_kind::interleaved_one_f_one_b);
      bt.vp = interleaved ? o.vp.value_or(2) : 1;
      if (o.schedule && synth::splits_backward(*o.schedule)) {
        weight_gradients = weight_gradient_tasks(job, b, *structure, from);
        bt.weight_gradients = &weight_gradients;
      }
      return bt;
    };
    // A pipeline split of traces without stages that ran the distributed optimizer: Megatron
    // forms each stage's buckets from the stage's own parameters, where the traced ones span the
    // whole model, so they are replaced by the target chunks' as for DP from one replica
    // (gradient_buckets.hpp), of the target's shape. With a DP change too they stay as traced,
    // their time scaled with the stage's parameters (above), and the DP change resizes them.
    const int traced_dp = structure ? structure->parallel.dp.value.value_or(1) : 1;
    // The distributed optimizer's reduction: reduce-scatters in the backward and all-gathers in the
    // optimizer step, and no DP collective in a forward pass (FSDP gathers parameters there).
    auto distributed_optimizer = [](const job_structure& st) {
      if (st.gradients.method.value.value_or("") != "reduce-scatter + all-gather") return false;
      for (const auto& pg : st.groups) {
        const bool dp = std::any_of(pg.roles.begin(), pg.roles.end(), [](const fact<group_role>& r) { return r.value == group_role::dp; });
        for (const auto& [what, count] : pg.collectives) {
          if (dp && count > 0 && what.ends_with("in forward")) return false;
        }
      }
      return true;
    };
    if (o.pp && *o.pp > 1 && traced_pp == 1 && traced_dp > 1 && (!o.dp || *o.dp == traced_dp) && distributed_optimizer(*structure)) {
      // Restored when no bucket could be formed: the traced ones are then better than none.
      graph::built_job kept = b;
      std::optional<job_structure> kept_structure = structure, kept_traced = traced_structure;
      try {
        const shape_config from = shape_from ? *shape_from : traced_shape(*structure);
        const shape_costs costs = costs_of(job, *structure, o.from_gpu, nullptr, o.profile ? &*o.profile : nullptr);
        const model::nccl_model model_of_costs{costs.profile};
        const auto nccl = traced_nccl(job, o);
        const std::int64_t vocab = traced_vocab_local(job, *structure, from) * from.tp;
        const std::size_t removed = strip_gradient_collectives(b, job, *structure);
        if (removed > 0) {
          structure_options so = o.structure;
          so.step = o.replay.step;
          if (!traced_structure) traced_structure = std::move(structure);
          structure = discover_structure(job, b, so);
          std::vector<std::uint8_t> weight_gradients;
          const bucket_target bt = target_layout(from, weight_gradients);
          const bucket_insertion bi = insert_gradient_buckets(b, *structure, shape_to ? *shape_to : from, vocab, structure->model.gated_mlp, traced_dp,
                                                              nccl ? nccl->first : model_of_costs, nccl ? nccl->second : costs.hw,
                                                              costs.profile, bt);
          if (bi.buckets == 0 || !bi.skipped.empty()) {
            throw error(bi.skipped.empty() ? "no bucket formed" : "no bucket formed on " + bi.skipped.front());
          }
          out.changes.push_back(describe_buckets(
              bi, traced_dp, nccl ? nccl->first.profile.name : costs.profile.name, o.layers.has_value(),
              "PP 1 -> " + std::to_string(*o.pp) + ": the traces' " + std::to_string(removed) +
                  " data-parallel reduce-scatters and all-gathers (buckets over the whole model) removed, since Megatron forms each "
                  "stage's buckets from its own parameters, and each target stage's reduction inserted"));
          buckets_inserted = true;
          structure = discover_structure(job, b, so);
          attach_to_layers(*structure, bi);
        }
      } catch (const error& e) {
        b = std::move(kept);
        structure = std::move(kept_structure);
        traced_structure = std::move(kept_traced);
        out.changes.push_back(std::string("gradient buckets kept as traced: ") + e.what());
      }
    }
    // A TP change alone moves the DP groups' members (TP apart) across nodes.
    const bool tp_moves_dp = shape_from && shape_to && shape_from->tp != shape_to->tp && structure->parallel.dp.value.value_or(1) > 1;
    if (o.dp || o.global_batch || tp_moves_dp) {  // --global-batch alone: the traces' DP
      const int dp = o.dp ? *o.dp : structure->parallel.dp.value.value_or(1);
      const auto [hw, hw_note] = comm_hardware(job, o.from_gpu);
      const double ratio = hw.inter_node.effective_bandwidth() / hw.intra_node.effective_bandwidth();
      // The traced GPU's preset profile times sized collectives as synth and predict do; a GPU
      // without a preset falls back on the fit of the trace's own collectives.
      const auto nccl = traced_nccl(job, o);
      const dp_rewrite_stats d = resize_data_parallel(b.graph, *structure, dp, hw.gpus_per_node, ratio, hw_note,
                                                      nccl ? &nccl->first : nullptr, nccl ? &nccl->second : nullptr,
                                                      lone_collectives(job, b), shape_to ? shape_to->tp : 0);
      // One replica traced and more asked: the line below says what is inserted instead.
      if (!(d.no_dp_group && d.from == 1 && d.to > 1)) out.changes.insert(out.changes.end(), d.changes.begin(), d.changes.end());
      if (d.from == 1 && d.to > 1 && d.no_dp_group) {
        // One replica traced: no gradient reduction to resize, so Megatron's is inserted.
        try {
          const shape_config from = shape_from ? *shape_from : traced_shape(*structure);
          const shape_config to = shape_to ? *shape_to : from;
          const shape_costs costs = costs_of(job, *structure, o.from_gpu, nullptr, o.profile ? &*o.profile : nullptr);
          const model::nccl_model model_of_costs{costs.profile};
          std::vector<std::uint8_t> weight_gradients;
          const bucket_target bt = target_layout(from, weight_gradients);
          const bucket_insertion bi =
              insert_gradient_buckets(b, *structure, to, traced_vocab_local(job, *structure, from) * from.tp, structure->model.gated_mlp,
                                      d.to, nccl ? nccl->first : model_of_costs, nccl ? nccl->second : costs.hw, costs.profile, bt);
          out.changes.push_back(describe_buckets(bi, d.to, nccl ? nccl->first.profile.name : costs.profile.name, o.layers.has_value()));
          if (bi.buckets > 0) {
            buckets_inserted = true;
            structure_options so = o.structure;
            so.step = o.replay.step;
            if (!traced_structure) traced_structure = std::move(structure);
            structure = discover_structure(job, b, so);
            attach_to_layers(*structure, bi);
          }
        } catch (const error& e) {
          out.changes.push_back("DP 1 -> " + std::to_string(d.to) + ": no gradient reduction inserted (" + e.what() + ")");
        }
      }
      if (d.from != d.to) {
        const double min_ns = costs_of(job, *structure, o.from_gpu, nullptr, o.profile ? &*o.profile : nullptr).profile.min_kernel_ns;
        const shape_stats sh = shard_optimizer(b, *structure, d.from, d.to, min_ns, buckets_inserted);
        if (sh.optimizer > 0) {
          char line[256];
          std::snprintf(line, sizeof line,
                        "distributed optimizer (gradients reduce-scattered, parameters all-gathered): each rank steps 1/%d of the "
                        "parameters instead of 1/%d, %zu optimizer kernels %.3f -> %.3f ms",
                        d.to, d.from, sh.optimizer, static_cast<double>(sh.before) / 1e6, static_cast<double>(sh.after) / 1e6);
          out.changes.emplace_back(line);
        }
      }
      const auto& par = structure->parallel;
      if ((d.from != d.to || o.global_batch) && !par.micro_batches.known()) {
        // Without the traces' count neither the global batch nor a new count per replica can be
        // made: say so, rather than take the traces for one micro-batch.
        const std::string& why = par.micro_batches.source.empty() ? par.schedule.source : par.micro_batches.source;
        if (o.global_batch) {
          throw error("whatif --global-batch: the traces' micro-batches per replica are not known (" + why +
                      "); `lumos inspect --structure` shows what was found");
        }
        out.changes.push_back("micro-batches per replica: not known in the traces (" + why +
                              "): the per-replica batch is kept, so the global batch goes with the replicas (x" +
                              std::to_string(d.to) + "/" + std::to_string(d.from) + ")");
      } else if (d.from != d.to || o.global_batch) {
        const int m = *par.micro_batches.value;
        std::optional<std::int64_t> global_micro_batches;
        if (o.global_batch) {
          // In sequences: counted in micro-batches of the target's size (--micro-batch), else the traces'.
          const auto& mbs = structure->model.micro_batch_size;
          const bool resized = shape_to && shape_from && shape_to->micro_batch != shape_from->micro_batch;
          const std::int64_t sequences = resized ? shape_to->micro_batch : mbs.value.value_or(1);
          if (*o.global_batch % sequences != 0) {
            throw error("whatif --global-batch " + std::to_string(*o.global_batch) + ": not a multiple of the " +
                        (resized ? "target's" : "traces'") + " micro-batch size " + std::to_string(sequences));
          }
          global_micro_batches = *o.global_batch / sequences;
          if (!resized && !mbs.known()) out.changes.push_back("--global-batch counted in micro-batches of 1 sequence: the traces' micro-batch size is not known (" + mbs.source + ")");
        }
        const micro_batch_plan mp = plan_micro_batches(m, d.from, d.to, global_micro_batches);
        if (mp.micro_batches != m) {
          micro_batches = mp.micro_batches;
          out.changes.push_back("micro-batches per replica " + std::to_string(m) + " -> " + std::to_string(mp.micro_batches) + ": " + mp.why);
        } else {
          out.changes.push_back("micro-batches per replica: " + mp.why);
        }
      }
    }
    // With --global-batch the count was set above, in micro-batches of the target's size.
    if (shape_from && shape_to && shape_to->micro_batch != shape_from->micro_batch && !o.global_batch &&
        structure->parallel.micro_batches.known()) {
      // Sequences per micro-batch changed: the global batch stays, so the count of micro-batches
      // per replica changes inversely (as `lumos predict --micro-batch` with the same --global-batch).
      const std::int64_t m = micro_batches.value_or(*structure->parallel.micro_batches.value);
      const std::int64_t sequences = m * shape_from->micro_batch;
      if (m == 1 && structure->parallel.pp.value.value_or(1) <= 1) {
        // One micro-batch and no stages: no gradient accumulation to trade against, the
        // micro-batch is the batch (a plain training loop), so the batch changes with it.
        out.changes.push_back("one micro-batch per iteration and no pipeline stages (no gradient accumulation): the batch per "
                              "replica changes with the micro-batch size, " + std::to_string(sequences) + " -> " +
                              std::to_string(shape_to->micro_batch) + " sequences");
      } else if (sequences % shape_to->micro_batch != 0) {
        out.changes.push_back("micro-batch size " + std::to_string(shape_to->micro_batch) + " does not divide the " + std::to_string(sequences) +
                              " sequences per replica: the count of micro-batches is kept (" + std::to_string(m) + "), the batch grows");
      } else {
        micro_batches = static_cast<int>(sequences / shape_to->micro_batch);
        out.changes.push_back("micro-batches per replica " + std::to_string(m) + " -> " + std::to_string(*micro_batches) + ": the " +
                              std::to_string(sequences) + " sequences per replica kept at micro-batch size " + std::to_string(shape_to->micro_batch));
      }
    }
    // Without pipeline stages the micro-batches run one after the other (gradient accumulation):
    // a count change repeats or removes whole micro-batches in the graph (micro_batches.hpp).
    staged = structure && structure->parallel.pp.value.value_or(1) > 1;
    // A schedule orders stages: on traces without them it needs the stages to make.
    if (pipeline_asked && !o.pp && !staged) {
      throw error(std::string("whatif ") + (o.schedule ? "--schedule" : "--vp") +
                  " without --pp: the traces have no pipeline stages (" +
                  (structure->parallel.pp.value ? "PP 1" : "PP unknown") + ", " + structure->parallel.pp.source +
                  "); give --pp N (N >= 2) for the stages to schedule");
    }
    // From traces without stages to GPipe, 1F1B or interleaved stages the change is made in the
    // graph; with another count of micro-batches per replica, their periods are repeated or
    // removed first, as without stages, and the split then orders the new count. With traced
    // stages a micro-batch change alone is a split too: the traced passes repeated or removed
    // (stage_micro_batches_to), then ordered by the traces' schedule.
    const bool staged_batches = micro_batches && staged;
    const bool split_asked = pipeline_asked || staged_batches;
    // The default schedule: the traces' own when they have stages, else 1F1B (interleaved with --vp).
    const auto& traced_schedule = structure ? structure->parallel.schedule.value : std::nullopt;
    const pipeline::schedule_kind split_kind = o.schedule.value_or(
        o.vp.value_or(1) > 1   ? pipeline::schedule_kind::interleaved_one_f_one_b
        : staged && traced_schedule ? *traced_schedule
                                    : pipeline::schedule_kind::one_f_one_b);
    const int split_vp = o.vp.value_or(split_kind == pipeline::schedule_kind::interleaved_one_f_one_b ? 2 : 1);
    // The target's stages: the traces' own when only the schedule changes.
    const int split_pp = o.pp ? *o.pp : staged ? traced_pp : 0;  // 0: no target stages
    // After TP collectives were inserted (TP from 1) the structure is the edited graph's, and the
    // inserted tasks go with the layer they sit in.
    if (split_asked && split_pp > 0) {
      split_refused = stage_split_unsupported(*structure, split_pp, split_vp, split_kind, micro_batches.value_or(0), &job, o.layers.value_or(0));
      // A layer change is made first (layers repeated or removed in place), then the micro-batch
      // periods (or passes, with traced stages) over its copies, and the split numbers the
      // copies; not with the API's own task groups.
      if (split_refused.empty() && !groups.empty()) split_refused = "task groups are repeated with it";
    }
    const bool split_in_graph = split_asked && split_pp > 0 && split_refused.empty();
    // Fewer stages than traced: each merged stage is made from one traced stage, its layers
    // repeated to the block's count here, then the split drops the other traced stages' ranks.
    const bool merging = split_in_graph && split_pp < traced_pp;
    const bool accumulate = micro_batches && (staged ? split_in_graph : !pipeline_asked || split_in_graph);
    if (structure) {
      // Larger stages move pipeline neighbours (and the tied embedding's stages) apart; a deeper
      // pipeline moves the last stage. Without a profile, cross-stage transfers keep their time.
      // The split re-times the traced send/recv pairs itself.
      const auto& par = structure->parallel;
      const rank_layout from{shape_from ? shape_from->tp : par.tp.value.value_or(1), par.dp.value.value_or(1), traced_pp};
      const rank_layout to{shape_to ? shape_to->tp : from.tp, o.dp.value_or(from.dp), o.pp.value_or(from.pp)};
      if (from.tp != to.tp || from.dp != to.dp || from.pp != to.pp) {
        if (const auto n = traced_nccl(job, o)) {
          const std::string moved = retime_across_nodes(b.graph, *structure, from, to, n->first, n->second, split_in_graph);
          if (!moved.empty()) out.changes.push_back(moved);
        }
      }
    }
    // The model's layers in the split (0: the traces').
    const int split_layers = merging ? o.layers.value_or(*structure->model.layers.value) : o.layers.value_or(0);
    if ((o.layers || merging) && (split_in_graph || !(pipeline_asked || (micro_batches && staged)))) {
      // Discovered again when DP rewrote the graph (its maps follow the rewritten tasks).
      structure_options so = o.structure;
      so.step = o.replay.step;
      // (Not after gradient buckets were inserted: that structure holds them in their layers.)
      const job_structure& st = o.dp && !buckets_inserted ? discover_structure(job, b, so) : *structure;
      if (merging) {
        // Each kept traced stage runs its block's layers: the model's split_layers over split_pp
        // stages, which is what layers_to makes of split_layers x (traced_pp / split_pp) over the
        // traced stages. The stages the split drops are left as they are.
        const int k = traced_pp / split_pp;
        layer_rewrite lr = layers_to(b, st, split_layers * k);
        const int per_stage = *structure->parallel.world.value / traced_pp;
        std::vector<std::uint8_t> kept_stage(static_cast<std::size_t>(traced_pp), 0);
        for (int s = 0; s < split_pp; ++s) kept_stage[static_cast<std::size_t>(merge_source_stage(traced_pp, split_pp, s))] = 1;
        std::erase_if(lr.groups, [&](const repeat_group& g) {
          // A group is one stage's (its joins have no rank).
          const auto t = std::find_if(g.tasks.begin(), g.tasks.end(), [&](graph::task_id x) { return b.graph.rank[x] >= 0; });
          if (t == g.tasks.end()) return true;
          const auto stage = static_cast<std::size_t>(b.graph.rank[*t] / per_stage);
          return stage >= kept_stage.size() || !kept_stage[stage];
        });
        out.changes.push_back("PP " + std::to_string(traced_pp) + " -> " + std::to_string(split_pp) + ": the layers of each kept traced stage (" +
                              std::to_string(*structure->model.layers.value / traced_pp) + ") repeated in place to " +
                              std::to_string(split_layers / split_pp) + ", the stage's share of " + std::to_string(split_layers) +
                              " layers over " + std::to_string(split_pp) + " stages (" + std::to_string(lr.groups.size()) +
                              " layer task groups); each copy keeps the layer's measured kernels, launches and overheads");
        groups.insert(groups.end(), lr.groups.begin(), lr.groups.end());
      } else {
        const layer_rewrite lr = layers_to(b, st, *o.layers);
        groups.insert(groups.end(), lr.groups.begin(), lr.groups.end());
        out.changes.push_back(lr.change);
      }
    }
    std::size_t edges_dropped = 0;
    std::optional<std::vector<std::vector<graph::task_id>>> copies;  // where the structure's tasks went
    // Zero bubble: the weight gradients, found on the graph before a layer or micro-batch change
    // (the split marks every copy of one).
    std::vector<std::uint8_t> weight_tasks;
    if (split_in_graph && synth::splits_backward(split_kind)) {
      weight_tasks = weight_gradient_tasks(job, b, *structure, traced_shape(*structure));
      if (std::find(weight_tasks.begin(), weight_tasks.end(), std::uint8_t{1}) == weight_tasks.end()) {
        throw error("whatif --schedule " + std::string(pipeline::schedule_title(split_kind)) +
                    ": no weight-gradient GEMM found in the layers' backward passes (their operators need recorded shapes, "
                    "`lumos inspect --structure`), so the backward passes cannot be split into B and W");
      }
    }
    if (!groups.empty()) {
      edited_graph e = repeat_groups(b.graph, groups);
      edges_dropped += e.edges_dropped;
      if (e.edges_bridged > 0) {
        out.changes.push_back(std::to_string(e.edges_bridged) +
                              " edges out of removed tasks moved to the last kept task before them on their processor");
      }
      copies = adopt(b, std::move(e));
    }
    std::vector<std::vector<graph::task_id>> period_copies;  // where the micro-batch change put each task
    std::optional<micro_batch_remap> remap;
    if (accumulate) {
      const micro_batch_rewrite mr = staged ? stage_micro_batches_to(b, job, *structure, *micro_batches, copies ? &*copies : nullptr)
                                            : micro_batches_to(b, *structure, *micro_batches, copies ? &*copies : nullptr);
      out.changes.push_back(mr.change);
      // With stages the passes are reordered next (group_edges::passes).
      edited_graph e = repeat_groups(b.graph, mr.groups, staged ? group_edges::passes : group_edges::plain);
      edges_dropped += e.edges_dropped;
      if (e.edges_bridged > 0) {
        out.changes.push_back(std::to_string(e.edges_bridged) +
                              " edges out of removed tasks moved to the last kept task before them on their processor");
      }
      period_copies = adopt(b, std::move(e));
      if (const std::size_t zeroed = keep_in_last_copy(b.graph, mr, period_copies); zeroed > 0) {
        out.changes.push_back(std::to_string(mr.last_copy_only.size()) +
                              " data-parallel gradient collectives in the traced micro-batch's backward kept in its last copy only "
                              "(gradients are reduced once, after the last micro-batch): " +
                              std::to_string(zeroed) + " copies take no transfer time");
      }
      if (split_in_graph && mr.from != mr.to) remap = micro_batch_remap{&period_copies, mr.from, mr.to, mr.first, mr.end};
    }
    if (edges_dropped > 0) {
      out.changes.push_back(std::to_string(edges_dropped) + " edges of removed tasks dropped (their processors still order the rest)");
    }
    if (split_in_graph) {
      const pipeline::schedule_kind kind = split_kind;
      const int vp = split_vp;
      {
        const model::hardware hw = comm_hardware(job, o.from_gpu).first;
        const shape_costs costs = costs_of(job, *structure, o.from_gpu, nullptr, o.profile ? &*o.profile : nullptr);
        const auto [intra, source] = p2p_model_time(*structure, hw, true);
        p2p_latency p2p{intra, p2p_model_time(*structure, hw, false).first, hw.gpus_per_node};
        p2p.host = static_cast<time_ns>(std::llround(costs.profile.cpu_collective_ns));
        p2p.bytes = p2p_bytes(*structure);
        // Tied input and output embeddings (the GPT-style model the parameter counts assume):
        // the end stages all-reduce the embedding's fp32 gradient, V/TP x hidden, every step.
        // Traces with stages run it already (kept, and re-timed above for the new layout).
        std::optional<tied_embedding_reduce> tied;
        std::string tied_missing;
        try {
          if (staged) throw error("the traces' own is kept");
          // Llama's layers (a gated MLP) come with untied embeddings: nothing to all-reduce.
          if (structure->model.gated_mlp) throw error("the layers' MLP is gated (Llama-style), whose models untie their embeddings");
          const shape_config sc = shape_from ? *shape_from : traced_shape(*structure);
          const shape_config to = shape_to ? *shape_to : sc;
          const std::int64_t vocab_local = traced_vocab_local(job, *structure, sc);
          if (vocab_local > 0) {
            tied_embedding_reduce t;
            // The embedding of the predicted shape: V / its TP x its hidden (sized by the traced
            // V / TP and hidden, TP 2 -> 4 made it twice too large: +2.2 ms on every stage).
            t.bytes = vocab_local * sc.tp / std::max(1, to.tp) * to.hidden * 4;
            const auto bytes = static_cast<double>(t.bytes);
            t.intra = static_cast<time_ns>(std::llround(collective_ns(model::collective::all_reduce, bytes, 2, costs.profile.intra)));
            t.inter = static_cast<time_ns>(std::llround(collective_ns(model::collective::all_reduce, bytes, 2, costs.profile.inter)));
            tied = t;
          } else {
            tied_missing = "no logits GEMM found to size it by";
          }
        } catch (const error& e) {
          tied_missing = e.what();
        }
        if (!tied && !staged) out.changes.push_back("no all-reduce of the tied embedding between the end stages added: " + tied_missing);
        const auto plans = report::plan_iterations(job, b, o.replay.step);
        const int tp_to = shape_to ? shape_to->tp : structure->parallel.tp.value.value_or(1);
        const int dp_to = o.dp.value_or(structure->parallel.dp.value.value_or(1));
        split = split_stages(b, job, *structure, plans, split_pp, vp, kind, p2p, source, tied ? &*tied : nullptr, tp_to * dp_to,
                             remap ? &*remap : nullptr, weight_tasks.empty() ? nullptr : &weight_tasks,
                             (o.layers || merging) && copies ? &*copies : nullptr, split_layers);
        out.changes.push_back(split->change);
      }
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
  if (split) {
    // Ranks of merged stages that the split dropped are not in the predicted job: the session keeps
    // the others, in order (their maps and plans with them).
    if (std::find(split->dropped.begin(), split->dropped.end(), std::uint8_t{1}) != split->dropped.end()) {
      auto& p = out.predicted;
      std::size_t kept = 0;
      for (std::size_t i = 0; i < p.ranks.size(); ++i) {
        if (i < split->dropped.size() && split->dropped[i]) continue;
        if (kept != i) {
          p.ranks[kept] = std::move(p.ranks[i]);
          p.plans[kept] = std::move(p.plans[i]);
          p.built.ranks[kept] = std::move(p.built.ranks[i]);
          if (i < p.held_out.size()) p.held_out[kept] = std::move(p.held_out[i]);
        }
        ++kept;
      }
      p.ranks.resize(kept), p.plans.resize(kept), p.built.ranks.resize(kept);
      if (!p.held_out.empty()) p.held_out.resize(kept);
      p.measured_ns = p.simulated_ns = 0;
      for (const auto& r : p.ranks) p.measured_ns = std::max(p.measured_ns, r.measured_ns), p.simulated_ns = std::max(p.simulated_ns, r.simulated_ns);
    }
    // The added stages' ranks: their plans evaluated on the prediction's timeline.
    const report::task_times simulated = out.predicted.simulated_times();
    const report::task_times measured = report::observed_times(out.predicted.built.graph);
    for (std::size_t k = 0; k < split->plans.size(); ++k) {
      const report::iteration_plan& p = split->plans[k];
      const std::size_t i = split->traced_index[k];
      report::rank_replay r;
      r.rank = p.rank;
      r.file = job.ranks[i].file + " (stage " + std::to_string(split->stage[k]) + ")";
      r.step = p.step;
      r.measured = report::evaluate(p, measured);
      r.simulated = report::evaluate(p, simulated, o.replay.scales.cpu);
      r.measured_ns = r.measured.window.length();
      r.simulated_ns = r.simulated.window.length();
      r.error = report::relative_error(r.simulated_ns, r.measured_ns);
      out.predicted.simulated_ns = std::max(out.predicted.simulated_ns, r.simulated_ns);
      out.predicted.ranks.push_back(std::move(r));
      out.predicted.plans.push_back(p);
    }
    out.predicted.error = report::relative_error(out.predicted.simulated_ns, out.predicted.measured_ns);
    split->plans.clear();
    out.stages = std::move(split);
  } else if (pipeline_asked || (micro_batches && staged)) {
    if (!split_refused.empty()) out.changes.push_back("pipeline change by the pass-level model, not in the graph: " + split_refused);
    out.pipeline_reason = split_refused;
    pipeline_target t;
    t.pp = o.pp, t.vp = o.vp, t.schedule = o.schedule, t.micro_batches = micro_batches, t.layers = o.layers;
    const auto hw = comm_hardware(job, o.from_gpu).first;
    pipeline_prediction pp;
    try {
      pp = predict_pipeline(out.predicted.built.graph, out.predicted.simulated_times(), *structure, out.predicted.simulated_ns, t, hw);
    } catch (const error& e) {
      if (split_refused.empty()) throw;
      throw error(std::string(e.what()) + "; nor can the graph be cut into stages: " + split_refused);
    }
    out.changes.insert(out.changes.end(), pp.changes.begin(), pp.changes.end());
    out.predicted.simulated_ns = pp.iteration_ns;
    out.pipeline = std::move(pp);
  }
  if (traced_structure) structure = std::move(traced_structure);
  if (!structure) {
    try {
      structure_options so = o.structure;
      so.step = o.replay.step;
      structure = discover_structure(job, out.baseline.built, so);
    } catch (const error& e) {
      out.changes.push_back(std::string("structure discovery failed: ") + e.what());
    }
  }
  if (out.pipeline) {
    out.bubble_fraction = out.pipeline->predicted.bubble_fraction;
    out.bubble_source = "pass-level pipeline model of the target";
  } else if (out.stages) {
    time_ns begin = std::numeric_limits<time_ns>::max();
    for (const auto& r : out.predicted.ranks) begin = std::min(begin, r.simulated.window.begin);
    out.bubble_fraction = split_bubble(*out.stages, out.predicted.simulated_times(), begin);
    out.bubble_source = "the rewritten graph's replay: 1 - mean compute-stream busy time of its ranks / the pipeline phase (step "
                        "start to the end of the last pass)";
  } else if (structure && structure->parallel.pp.value.value_or(0) == 1) {
    out.bubble_fraction = 0.0;
    out.bubble_source = "no pipeline parallelism";
  } else if (structure && structure->parallel.pp.known()) {
    // The pass-level model of the target on the traces' passes. Not on the prediction's graph:
    // structure discovery's task ids are the unedited graph's, and a layer change renumbers them.
    try {
      const auto hw = comm_hardware(job, o.from_gpu).first;
      pipeline_target t;
      t.layers = o.layers;
      const pipeline_prediction model = predict_pipeline(out.baseline.built.graph, out.baseline.simulated_times(), *structure,
                                                         out.baseline.simulated_ns, t, hw);
      out.bubble_fraction = model.predicted.bubble_fraction;
      out.bubble_source = "pass-level pipeline model of the target with the traces' pass costs";
    } catch (const error& e) {
      out.bubble_source = e.what();
    }
  } else {
    out.bubble_source = "pipeline stages not known";
  }
  if (structure && !shape_from) {
    try {
      shape_from = shape_to = traced_shape(*structure);
    } catch (const error&) {
      // the shape is unknown: no memory or MFU figures
    }
  }
  if (structure && shape_from) {
    parallel_target target;
    target.pp = o.pp, target.dp = o.dp, target.micro_batches = micro_batches, target.chunks = o.vp, target.schedule = o.schedule;
    if (buckets_inserted) target.distributed_optimizer = true;
    if (pipeline_asked) {
      // As the pipeline change: the traces' schedule when they have stages, else 1F1B; interleaved
      // with --vp, and with two chunks without it.
      const auto& traced = structure->parallel.schedule.value;
      target.schedule = o.schedule.value_or(o.vp.value_or(1) > 1 ? pipeline::schedule_kind::interleaved_one_f_one_b
                                            : staged && traced ? *traced
                                                               : pipeline::schedule_kind::one_f_one_b);
      if (!o.vp) target.chunks = *target.schedule == pipeline::schedule_kind::interleaved_one_f_one_b ? 2 : 1;
    }
    out.shape = summarize(job, *structure, *shape_from, *shape_to, o.layers, o.from_gpu, o.gpu, out.baseline.simulated_ns,
                          out.predicted.simulated_ns, target);
    if (!out.shape->memory_warning.empty()) out.changes.push_back(out.shape->memory_warning);
  }
  out.structure = std::move(structure);
  return out;
}

}  // namespace lumos::whatif

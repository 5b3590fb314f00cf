#pragma once
// Memory per GPU and MFU of the traced and the predicted configuration of a what-if.

#include <lumos/core/error.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/eager_memory.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

/// The shape-dependent figures of a configuration: memory per GPU (model/memory.hpp) and the
/// model FLOPs one rank runs per iteration (transformer layers; the logits GEMM when the
/// vocabulary is known).
struct shape_figures {
  double memory_bytes_per_gpu = 0;
  double model_flops_per_rank = 0;
  std::int64_t world = 0;
  bool vocab_known = false;
};

/// Fully sharded data parallelism for the memory summary: parameters, gradients and optimizer
/// states sharded over DP (model/memory.hpp's fsdp terms), with or without the backward's
/// re-gathers.
struct fsdp_memory {
  bool on = false;
  bool reshard_after_forward = true;
  int hsdp = 0;  ///< hybrid sharding's shard group (0, or the DP size: every DP rank shards)
};

/// The traces' FSDP for the memory summary (`job_structure::fsdp`).
[[nodiscard]] inline fsdp_memory traced_fsdp_memory(const job_structure& st) {
  const fsdp_structure& f = st.fsdp;
  return {f.found(), f.reshard_after_forward.value.value_or("on") == "on", f.replicas.value.value_or(1) > 1 ? f.shard.value.value_or(0) : 0};
}

/// The figures of `m` (a `counted_transformer`: its layers, KV heads, MLP and embeddings; `vocab`
/// 0 when unknown) under TP `c.tp` over `pp` stages and `dp` replicas, `passes` forward passes
/// per rank per iteration (micro-batches × chunks), `backward` whether the iteration trains.
/// `recipe`: the traced step is PyTorch eager with a torch.optim Adam optimizer
/// (whatif/structure/memory_recipe.hpp): on one GPU its memory is model/eager_memory.hpp's peak.
/// `dtype`: the training precision; fp8 adds what model/memory.hpp counts for it (the weights'
/// fp8 copies, the scaling state, the fp8 GEMM inputs saved for backward) to the Megatron model's
/// figure (the eager recipe counts the traced autocast as it is).
[[nodiscard]] inline shape_figures figures_of(const shape_config& c, model::transformer m, int pp, int dp,
                                              std::int64_t passes, bool backward, double in_flight,
                                              bool distributed_optimizer = false, const memory_recipe_facts* recipe = nullptr,
                                              const fsdp_memory* fsdp = nullptr, model::precision dtype = model::precision::bf16) {
  shape_figures f;
  f.world = static_cast<std::int64_t>(c.tp) * pp * dp * c.cp;
  m.name = "whatif";
  const std::int64_t vocab = m.vocab;
  f.vocab_known = vocab > 0;
  // Unknown: a vocabulary of one row per rank, i.e. none; known: padded to a multiple of TP
  // as Megatron pads it.
  m.vocab = vocab > 0 ? (vocab + c.tp - 1) / c.tp * c.tp : c.tp;
  model::parallel_config par;
  par.tp = c.tp, par.pp = pp, par.dp = dp, par.micro_batch = c.micro_batch;
  par.cp = c.cp;  // activations of seq / cp tokens, and the exchange's K/V buffers (model/memory.hpp)
  par.cp_comm = c.cp_comm;
  par.dtype = dtype;
  par.global_batch = c.micro_batch * dp * std::max<std::int64_t>(passes, 1);
  par.zero_stage = distributed_optimizer ? 1 : 0;  // the optimizer's states sharded over DP
  if (fsdp != nullptr && fsdp->on && dp > 1) {
    par.fsdp = true, par.zero_stage = 3, par.reshard_after_forward = fsdp->reshard_after_forward;
    if (fsdp->hsdp > 0 && fsdp->hsdp < dp && dp % fsdp->hsdp == 0) par.hsdp = fsdp->hsdp;
  }
  if (recipe && recipe->recipe && backward && c.tp == 1 && pp == 1 && dp == 1 && m.vocab > 1 && m.hidden % m.heads == 0) {
    m.tied_embeddings = recipe->tied_embeddings;
    const auto params = static_cast<double>(model::stage_parameters_per_rank(m, par, 0));
    f.memory_bytes_per_gpu = model::eager_memory_per_gpu(m, params, c.micro_batch, std::max<std::int64_t>(passes, 1), *recipe->recipe).total();
  } else if (m.hidden % m.heads == 0 && m.layers % pp == 0) {
    model::memory_options mo;
    mo.in_flight_microbatches = in_flight;
    mo.per_param = model::megatron_state_bytes;  // as predict: the traces are of Megatron's training
    try {
      f.memory_bytes_per_gpu = model::memory_per_gpu(m, par, 0, mo).total();
    } catch (const error&) {
      f.memory_bytes_per_gpu = 0; // a shape the memory model does not take: no figure
    }
  }
  // flops.hpp's count (GQA's narrower K and V, a gated MLP's third GEMM) for the rank's share.
  const double layer_flops =
      model::layer_forward_flops_per_sequence(m) * static_cast<double>(c.micro_batch) / static_cast<double>(c.tp) / static_cast<double>(c.cp);
  const double per_pass =
      static_cast<double>(m.layers / pp) * layer_flops +
      (vocab > 0 ? 2.0 * static_cast<double>(c.tokens()) * static_cast<double>(c.hidden) * static_cast<double>(vocab) /
                       static_cast<double>(c.tp) / static_cast<double>(pp)
                 : 0.0);
  f.model_flops_per_rank = per_pass * static_cast<double>(passes) * (backward ? 3.0 : 1.0);
  return f;
}

/// Memory per GPU and MFU of the traced and the predicted configuration (shape.hpp).
struct shape_summary {
  shape_config from, to;
  shape_figures baseline, predicted;
  double mfu_baseline = 0, mfu_predicted = 0; ///< 0 when the GPU's peak is unknown
  std::string memory_warning; ///< when the prediction does not fit in the target GPU's memory: by how much
};

/// The target's pipeline and data parallelism, for `summarize` (unset: the traces').
struct parallel_target {
  std::optional<int> pp, dp, chunks;
  /// The target runs a distributed optimizer (ZeRO-1; default: as the traces, whose gradients it
  /// tells by a reduce-scatter + all-gather reduction).
  std::optional<bool> distributed_optimizer;
  std::optional<int> micro_batches;  ///< per replica
  std::optional<synth::schedule_policy> schedule;
  std::optional<fsdp_memory> fsdp;  ///< the target's FSDP (default: as the traces, `job_structure::fsdp`)
  std::optional<model::precision> precision;  ///< the target's training precision (default: the traces')
};

/// The training precision of the traces, as their GEMM kernels name it (`model_shape::dtype`;
/// bf16 when unknown).
[[nodiscard]] inline model::precision traced_precision(const job_structure& st) {
  const std::string dt = st.model.dtype.value.value_or("bf16");
  return dt == "fp8" ? model::precision::fp8 : dt == "fp16" ? model::precision::fp16 : model::precision::bf16;
}

/// Micro-batches whose activations a stage holds at once, for the memory summary: all m when
/// stage 0 of `schedule` on (p, m, v) runs every forward before its first backward and keeps its
/// backward whole (GPipe; any order whose warm-up covers the micro-batches), else Megatron's 1F1B
/// bound min(p, m), which also stands for an unknown schedule or one that rejects the shape. The
/// zero-bubble orders are counted at that bound too: this is the summary's estimate, where
/// `synth::predict` takes each stage's peak from its order. O(p·m·v).
[[nodiscard]] inline double summary_in_flight(const std::optional<synth::schedule_policy>& schedule, int stages,
                                              std::int64_t micro_batches, int chunks) {
  const double bound = static_cast<double>(std::min<std::int64_t>(stages, micro_batches));
  if (!schedule || schedule->splits_backward || micro_batches > pipeline::max_virtual_micro_batches) return bound;
  const pipeline::schedule_shape shape{stages, static_cast<std::int32_t>(micro_batches), std::max(chunks, 1)};
  std::vector<std::vector<pipeline::op>> orders;
  try {
    orders = schedule->orders(shape);
  } catch (const error&) {
    return bound;
  }
  const auto& first = orders.front();
  const auto forwards = std::find_if(first.begin(), first.end(), [](const pipeline::op& o) { return o.kind != pipeline::op_kind::forward; });
  const bool all_first = forwards - first.begin() == micro_batches * shape.chunks;
  return all_first ? static_cast<double>(micro_batches) : bound;
}

/// Memory and MFU of the traced and the predicted configuration. MFU counts the model FLOPs of
/// the transformer layers (and the logits GEMM when a logits GEMM named the vocabulary) that one
/// rank runs per iteration, against the dense peak of each side's GPU in its precision (the
/// traces' for the baseline, `target.precision` or the traces' for the prediction).
/// `target`: the predicted configuration's stages, replicas, chunks, micro-batches and schedule.
[[nodiscard]] inline shape_summary summarize(const trace::job& job, const job_structure& st, const shape_config& from,
                                             const shape_config& to, std::optional<int> layers,
                                             std::string_view from_gpu, std::string_view gpu, time_ns baseline_ns,
                                             time_ns predicted_ns, const parallel_target& target = {}) {
  shape_summary s;
  s.from = from, s.to = to;
  const int pp = st.parallel.pp.value.value_or(1);
  int dp = st.parallel.dp.value.value_or(1);
  // Under context parallelism the gradient (DP) group holds DP x CP ranks, and a world with no
  // gradient group is TP x PP x DP x CP: the replicas are that / CP.
  const int world = st.parallel.world.value.value_or(0);
  if (from.cp > 1 && dp % from.cp == 0 && static_cast<std::int64_t>(from.tp) * pp * dp == world) dp /= from.cp;
  std::int64_t passes = 0;
  bool backward = false;
  if (!st.ranks.empty()) {
    for (const auto& p : st.ranks.front().passes) {
      passes += p.op.kind == pipeline::op_kind::forward;
      backward = backward || p.op.kind == pipeline::op_kind::backward;
    }
  }
  const std::int64_t layers_from = st.model.layers.value.value_or(0);
  const std::int64_t layers_to_n = layers ? *layers : layers_from;
  const int chunks = st.parallel.chunks.value.value_or(1);
  const std::int64_t m = std::max<std::int64_t>(passes / std::max(chunks, 1), 1);
  const std::int64_t vocab_local = traced_vocab_local(job, st, from);
  const std::int64_t vocab = vocab_local * from.tp;
  const model::precision traced_dtype = traced_precision(st);
  if (layers_from > 0) {
    const int pp_to = target.pp.value_or(pp), dp_to = target.dp.value_or(dp), chunks_to = target.chunks.value_or(chunks);
    const std::int64_t m_to = target.micro_batches.value_or(m);
    const auto kind_to = target.schedule ? target.schedule : st.parallel.schedule.value;
    const bool distributed = st.gradients.method.value == std::string("reduce-scatter + all-gather");
    const bool gated = st.model.gated_mlp;
    const fsdp_memory traced_fsdp = traced_fsdp_memory(st);
    const fsdp_memory fsdp_to = target.fsdp.value_or(traced_fsdp);
    s.baseline = figures_of(from, counted_transformer(from, st, vocab, gated, static_cast<int>(layers_from)), pp, dp, passes, backward,
                            summary_in_flight(st.parallel.schedule.value, pp, m, chunks), distributed, &st.memory, &traced_fsdp,
                            traced_dtype);
    s.predicted = figures_of(to, counted_transformer(to, st, vocab, gated, static_cast<int>(layers_to_n)), pp_to, dp_to, m_to * chunks_to,
                             backward, summary_in_flight(kind_to, pp_to, m_to, chunks_to), target.distributed_optimizer.value_or(distributed),
                             &st.memory, &fsdp_to, target.precision.value_or(traced_dtype));
  }
  std::string from_preset(from_gpu);
  if (from_preset.empty()) {
    for (const auto& r : job.ranks) {
      for (const auto& d : r.devices) {
        if (from_preset.empty() && !d.name.empty()) from_preset = preset_of_device(d.name);
      }
    }
  }
  const std::string preset = !gpu.empty() ? std::string(gpu) : from_preset;
  // Each side against the peak of its own precision, as `lumos predict` reports MFU: an fp8
  // what-if is measured against the fp8 peak, not credited with the bf16 one.
  auto mfu = [&](const std::string& p, model::precision dt, double flops, time_ns t) {
    if (p.empty() || t <= 0 || flops <= 0) return 0.0;
    const model::hardware hw = model::hardware_preset(p);
    if (!hw.supports(dt)) return 0.0;
    return flops / (static_cast<double>(t) * 1e-9 * hw.peak_flops(dt));
  };
  s.mfu_baseline = mfu(from_preset, traced_dtype, s.baseline.model_flops_per_rank, baseline_ns);
  s.mfu_predicted = mfu(preset, target.precision.value_or(traced_dtype), s.predicted.model_flops_per_rank, predicted_ns);
  if (!preset.empty() && s.predicted.memory_bytes_per_gpu > 0) {
    const model::hardware hw = model::hardware_preset(preset);
    const double cap = static_cast<double>(hw.gpu.hbm_capacity);
    if (s.predicted.memory_bytes_per_gpu > cap) {
      char line[256];
      std::snprintf(
          line, sizeof line,
          "warning: the predicted configuration needs %.1f GiB per GPU, %.1f GiB more than the %.0f GiB of the %s",
          s.predicted.memory_bytes_per_gpu / 1073741824.0, (s.predicted.memory_bytes_per_gpu - cap) / 1073741824.0,
          cap / 1073741824.0, hw.name.c_str());
      s.memory_warning = line;
    }
  }
  return s;
}

}  // namespace lumos::whatif

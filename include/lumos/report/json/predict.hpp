#pragma once
// A prediction as JSON: the object `lumos predict --json` prints and the Python package's
// `lumos.predict(...).to_dict()` holds (one writer: the same fields, the same numbers).

#include <lumos/core/json_writer.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/job.hpp>
#include <lumos/synth/predict.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace lumos::report {

namespace detail {

// The job predicted: model shape, machine, cost model, parallelism, batch and schedule.
inline void predict_job_json(json_writer& w, const synth::job& j, const synth::prediction& r, std::string_view profile_name,
                             bool measured_routing) {
  const auto& m = j.model;
  const auto& p = j.parallel;
  w.key("job").begin_object();
  w.field("model", m.name).field("layers", m.layers).field("hidden", m.hidden).field("ffn", m.ffn);
  w.field("heads", m.heads).field("kv_heads", m.kv_heads).field("seq", m.seq).field("vocab", m.vocab);
  if (m.is_moe()) {
    // Only for MoE models, so that a dense model's object keeps its fields.
    w.field("experts", m.moe.experts).field("top_k", m.moe.top_k).field("expert_ffn", m.moe.expert_ffn);
    w.field("shared_experts", m.moe.shared_experts).field("capacity_factor", m.moe.capacity_factor);
    w.field("moe_dispatcher", model::to_string(m.moe.dispatcher)).field("ep", p.ep).field("expert_tp", p.expert_tp());
    w.field("expert_data_parallel", p.expert_data_parallel());
    // Only when routing is measured (`--routing measured`), even where the loads read are even.
    if (measured_routing || m.moe.load_imbalance != 1.0) w.field("load_imbalance", m.moe.load_imbalance);
  }
  if (m.mtp_layers > 0) w.field("mtp_layers", m.mtp_layers);
  w.field("gpu", j.hardware.name).field("precision", model::to_string(p.dtype)).field("gpus", r.gpus);
  w.field("profile", profile_name);
  w.field("tp", p.tp).field("pp", p.pp).field("dp", p.dp).field("vp", p.vp).field("sp", p.sp);
  w.field("cp", p.cp).field("cp_comm", model::to_string(p.cp_comm));
  w.field("tp_comm_overlap", p.tp_comm_overlap).field("overlap_param_gather", p.overlap_param_gather);
  w.field("micro_batch", p.micro_batch).field("global_batch", p.global_batch);
  w.field("micro_batches_per_pipeline", static_cast<std::int64_t>(r.shape.micro_batches));
  w.field("schedule", r.schedule.name).field("recompute", model::to_string(p.recompute));
  w.field("zero_stage", p.zero_stage);
  w.field("fsdp", p.fsdp).field("hsdp", p.hsdp).field("reshard_after_forward", p.reshard_after_forward);
  if (!p.layout.empty()) {
    // Only for an explicit layout: the blocks (transformer layers and MTP blocks) of each
    // virtual stage, in virtual-stage order.
    w.key("pipeline_layout").begin_array();
    for (const std::int64_t n : p.layout.blocks) w.value(n);
    w.end_array();
  }
  w.end_object();
}

// Per-GPU memory of the largest stage, against the GPU's capacity.
inline void predict_memory_json(json_writer& w, const synth::job& j, const synth::prediction& r) {
  const auto& mem = r.memory;
  w.key("memory_bytes_per_gpu").begin_object();
  w.field("stage", r.memory_stage).field("in_flight_microbatches", r.in_flight_microbatches);
  w.field("parameters", mem.parameters).field("gradients", mem.gradients).field("optimizer", mem.optimizer_states);
  w.field("activations", mem.activations + mem.io_activations + mem.recompute_working);
  if (j.model.is_moe()) w.field("moe_dispatch_buffers", mem.moe_dispatch_buffers);
  if (j.parallel.cp > 1) w.field("cp_buffers", mem.cp_buffers);  // the K/V exchange's buffers
  if (j.parallel.fsdp) w.field("fsdp_buffers", mem.fsdp_buffers);
  if (j.parallel.dtype == model::precision::fp8) w.field("fp8_weights", mem.fp8_weights).field("fp8_scaling_state", mem.fp8_scaling_state);
  w.field("total", mem.total());
  w.field("capacity", static_cast<std::int64_t>(j.hardware.gpu.hbm_capacity)).field("fits", mem.fits(j.hardware));
  w.end_object();
}

}  // namespace detail

/// Prediction `r` of job `j` as one JSON object: the job, iteration time, throughput, FLOP/s
/// and MFU/HFU (with the FLOP convention), bubble, rank 0's breakdown, memory per GPU, the
/// stages and the simulated graph. `wall_ms`: how long the prediction took; `profile_name`: the
/// cost model's (`predict_request::profile_name`); `measured_routing`: the routing was read from
/// traces (`--routing measured`), whose loads may be even.
inline void predict_json(json_writer& w, const synth::job& j, const synth::prediction& r, double wall_ms, std::string_view profile_name,
                         bool measured_routing = false) {
  w.begin_object();
  detail::predict_job_json(w, j, r, profile_name, measured_routing);
  w.field("iteration_ns", r.iteration_ns);
  w.field("tokens_per_s", r.tokens_per_s);
  w.field("tflops_per_gpu", r.model_tflops_per_gpu);
  w.field("hardware_tflops_per_gpu", r.hardware_tflops_per_gpu);
  w.field("mfu", r.mfu).field("hfu", r.hfu);
  w.field("peak_tflops_per_gpu", r.peak_flops_per_gpu / 1e12);
  w.field("model_flops_per_iteration", r.model_flops);
  w.field("hardware_flops_per_iteration", r.hardware_flops);
  w.field("flops_convention",
          r.forward_only ? "Megatron's forward third: 24*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) model FLOPs per forward-only "
                             "iteration (generalised to GQA/SwiGLU); nothing recomputed; dense tensor-core peak"
                           : "Megatron: 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) model FLOPs per iteration (generalised to "
                             "GQA/SwiGLU); hardware FLOPs add recomputed forward work; dense tensor-core peak");
  w.field("bubble_fraction", r.bubble_fraction);
  w.field("pipeline_ns", r.pipeline_ns);
  w.field("bubble_definition",
          "1 - mean over stages of compute-stream busy time during the pipeline phase / pipeline_ns "
          "(pipeline phase: from 0 to the end of the last forward/backward op of any stage)");
  w.key("breakdown").begin_object();
  w.field("rank", r.breakdown_rank).field("window_ns", r.breakdown_window_ns);
  w.field("exposed_compute_ns", r.breakdown.exposed_compute).field("overlapped_ns", r.breakdown.overlapped);
  w.field("exposed_comm_ns", r.breakdown.exposed_comm).field("other_ns", r.breakdown.other);
  w.end_object();
  w.field("sm_utilization", r.sm_utilization);
  detail::predict_memory_json(w, j, r);
  w.key("stages").begin_array();
  for (const auto& s : r.stages) {
    w.begin_object().field("stage", s.stage).field("rank", s.rank).field("pipeline_busy_ns", s.pipeline_busy_ns);
    w.field("pipeline_end_ns", s.pipeline_end_ns).field("in_flight_microbatches", s.in_flight_microbatches);
    w.field("memory_total_bytes", s.memory.total()).end_object();
  }
  w.end_array();
  w.key("graph").begin_object();
  w.field("unfolded", r.unfolded).field("granularity", synth::to_string(r.detail));
  w.field("simulated_ranks", static_cast<std::int64_t>(r.simulated_ranks)).field("tasks", static_cast<std::int64_t>(r.tasks));
  w.field("edges", static_cast<std::int64_t>(r.edges)).field("processors", static_cast<std::int64_t>(r.processors));
  w.field("wall_ms", wall_ms);
  w.end_object();
  w.end_object();
}

/// The same, appended to `out` as one line (ending in a newline).
inline void predict_json(const synth::job& j, const synth::prediction& r, double wall_ms, std::string& out,
                         std::string_view profile_name = "", bool measured_routing = false) {
  json_writer w(out);
  predict_json(w, j, r, wall_ms, profile_name, measured_routing);
  out += '\n';
}

}  // namespace lumos::report

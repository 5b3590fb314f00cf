#pragma once
// predict — build the iteration of a model-driven job (in compiled form), replay it with the
// engine that replays traces, and report what a performance engineer asks first: iteration
// time, throughput, FLOP/s and MFU/HFU, the pipeline bubble, the 4-way breakdown and per-GPU
// memory.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/compiled_program.hpp>
#include <lumos/synth/figures.hpp>
#include <lumos/synth/program.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lumos::synth {

/// Options of `predict`. The program defaults to the `pass` granularity without collective
/// records (the fast path: same timeline as `kernel` whenever the launch thread runs ahead).
struct predict_options {
  program_options program = [] {
    program_options o;
    o.detail = granularity::pass;
    o.record_collectives = false;
    return o;
  }();
  /// Bytes of model state per parameter (Megatron's: bf16 weights, fp32 main gradients, Adam's
  /// fp32 master copy and two moments).
  model::state_bytes state = model::megatron_state_bytes;
  /// FlashAttention keeps no s×s attention matrices (see model/memory.hpp).
  bool flash_attention = true;
};

/// The schedule-dependent activation peak of stage `stage`: the largest number of micro-batches
/// whose activations the stage holds at once, in units of the stage's whole layer set. Walking
/// the stage's order, a forward adds 1/v, the op that frees the micro-batch's activations (B, or
/// W for schedules that split the backward: the weight gradient still reads the GEMM inputs)
/// subtracts 1/v. O(ops of the stage).
[[nodiscard]] inline double in_flight_microbatches(const std::vector<pipeline::op>& order, std::int32_t chunks,
                                                   bool splits_backward) {
  const pipeline::op_kind release = splits_backward ? pipeline::op_kind::weight : pipeline::op_kind::backward;
  std::int64_t held = 0, peak = 0;
  for (const pipeline::op& o : order) {
    if (o.kind == pipeline::op_kind::forward) {
      peak = std::max(peak, ++held);
    } else if (o.kind == release) {
      --held;
    }
  }
  return static_cast<double>(peak) / static_cast<double>(chunks);
}

/// Per-stage figures of a prediction.
struct stage_prediction {
  int stage = 0;
  int rank = 0;                  ///< the representative rank (tp 0, dp 0)
  time_ns pipeline_busy_ns = 0;  ///< compute-stream busy time during the pipeline phase
  time_ns pipeline_end_ns = 0;   ///< end of its last pipeline op
  double in_flight_microbatches = 0;
  model::memory_breakdown memory;
};

/// What `predict` reports. Times in ns; FLOP/s per GPU in TFLOP/s (10¹² FLOP/s).
struct prediction {
  schedule_policy schedule = policy_of<pipeline::one_f_one_b>();  ///< the schedule the job ran
  pipeline::schedule_shape shape{};  ///< p stages, m micro-batches per pipeline, v chunks
  std::int64_t gpus = 1;
  bool unfolded = false;
  granularity detail = granularity::pass;

  time_ns iteration_ns = 0;  ///< latest finish of any task (every rank starts at 0)
  double tokens_per_s = 0;
  /// FLOPs of one iteration: model FLOPs by Megatron's convention
  /// 72·B·s·l·h²·(1 + s/6h + V/12lh) (exact for GPT shapes; `model::model_flops` generalises it
  /// to GQA/SwiGLU), hardware FLOPs adding the forward work recomputation reruns. A forward-only
  /// step (`program_options::forward_only`) counts a third of it: 24·B·s·l·h²·(...).
  double model_flops = 0;
  double hardware_flops = 0;
  bool forward_only = false;  ///< the step was forward only (the FLOPs above count a third)
  double peak_flops_per_gpu = 0;  ///< dense tensor-core peak of the training precision
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  double mfu = 0;
  double hfu = 0;

  /// Pipeline bubble: 1 − mean over stages of (compute-stream busy time during the pipeline
  /// phase) / pipeline_ns, where the pipeline phase runs from 0 to the end of the last forward/
  /// backward op of any stage and "busy" counts passes and their TP collectives on each stage's
  /// representative rank. With free communication and equal stages it is the schedule's
  /// (makespan − m·(F+B+W)) / makespan; p2p transfers and waits count as bubble.
  double bubble_fraction = 0;
  time_ns pipeline_ns = 0;

  /// 4-way breakdown (exposed compute, overlap, exposed communication, idle: docs/replay.md) of
  /// `breakdown_rank`'s GPU timeline over its iteration window
  /// [0, end of its last GPU op]. Communication intervals are transfers (the complete tasks),
  /// not the time a collective waits for its peers, which counts as other (idle).
  report::breakdown breakdown;
  /// The same with communication kernels as a trace of the job shows them: active from the
  /// participant's arrival to the end of the transfer (how the replay of a measured trace counts
  /// them, applied to `lumos synth` traces). Pipeline waits in early-posted receives count as
  /// communication here.
  report::breakdown breakdown_with_waits;
  int breakdown_rank = 0;
  time_ns breakdown_window_ns = 0;
  double sm_utilization = 0;  ///< mean of Lumos's 1 ms-bucket series, same rank and window

  /// Memory of the GPU with the largest total (its stage in `memory_stage`).
  model::memory_breakdown memory;
  int memory_stage = 0;
  double in_flight_microbatches = 0;
  model::state_bytes state{};

  std::vector<stage_prediction> stages;

  std::size_t tasks = 0;
  std::size_t edges = 0;
  std::size_t processors = 0;
  std::size_t simulated_ranks = 0;
};

namespace detail {

// The figures of `prediction` that the replay of `prog` gives (replay_figures, then SM
// utilisation and the breakdown with peer waits from rank 0's intervals it leaves in `buffers`).
inline void predicted_timeline(const timeline_figures& f, figure_buffers& buffers, prediction& out) {
  out.iteration_ns = f.iteration_ns;
  out.pipeline_ns = f.pipeline_ns;
  out.bubble_fraction = f.bubble_fraction;
  out.breakdown_rank = 0;
  out.breakdown = f.breakdown;
  out.breakdown_window_ns = f.breakdown_window_ns;
  const report::interval window{0, f.breakdown_window_ns};
  // Compute and transfers are their unions inside the window by now: the union of both is
  // what SM utilisation merges, and compute merged again is itself.
  std::vector<report::interval> all = buffers.compute;
  all.insert(all.end(), buffers.transfer.begin(), buffers.transfer.end());
  out.sm_utilization = report::sm_utilization(std::move(all), window).mean;
  out.breakdown_with_waits = report::compute_breakdown(buffers.compute, buffers.kernel, window);
}

}  // namespace detail

/// Builds `j`'s iteration in compiled form (`build_compiled_into`: the program of
/// `build_program`), replays it, and derives the figures of `prediction`. Throws `lumos::error`
/// for invalid configurations (one-line reasons). Cost: linear in the tasks built; the folded
/// `pass` program of GPT-3 175B on 1024 GPUs has ~10⁵ tasks.
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
[[nodiscard]] prediction predict(const job& j, const predict_options& opt = {}, const Compute& compute = {},
                                 const Comm& comm = {}) {
  compiled_program prog;
  program_buffers buffers;
  build_compiled_into(prog, buffers, j, opt.program, compute, comm);
  sim::replay_engine engine;
  figure_buffers figures;
  const timeline_figures f = replay_figures(prog, engine, figures);
  const time_ns makespan = f.iteration_ns;

  const model::transformer& m = j.model;
  const model::parallel_config& par = j.parallel;
  const model::hardware& hw = j.hardware;

  prediction out;
  out.schedule = prog.schedule;
  out.shape = prog.shape;
  out.gpus = par.world_size();
  out.unfolded = prog.unfolded;
  out.detail = prog.detail;
  out.tokens_per_s = model::tokens_per_second(m, par.global_batch, makespan);
  out.model_flops = model::model_flops(m, par.global_batch);
  out.hardware_flops = model::hardware_flops(m, par.global_batch, par.recompute);
  out.forward_only = opt.program.forward_only;
  if (out.forward_only) {
    // The forward third of a training step's work (its backward does twice the forward's), and
    // nothing is recomputed: 24·B·s·l·h²·(1 + s/6h + V/12lh) for GPT shapes.
    out.model_flops /= 3.0;
    out.hardware_flops = out.model_flops;
  }
  out.peak_flops_per_gpu = hw.peak_flops(par.dtype);
  out.model_tflops_per_gpu = model::tflops_per_gpu(out.model_flops, makespan, out.gpus);
  out.hardware_tflops_per_gpu = model::tflops_per_gpu(out.hardware_flops, makespan, out.gpus);
  out.mfu = model::utilisation(out.model_flops, makespan, out.gpus, out.peak_flops_per_gpu);
  out.hfu = model::utilisation(out.hardware_flops, makespan, out.gpus, out.peak_flops_per_gpu);

  detail::predicted_timeline(f, figures, out);
  // Per stage: the pipeline phase of its representative rank, and its memory.
  const std::vector<std::vector<pipeline::op>>& orders = buffers.orders;
  for (int s = 0; s < par.pp; ++s) {
    const compiled_rank& r = prog.representative(s);
    stage_prediction sp;
    sp.stage = s;
    sp.rank = r.rank;
    sp.pipeline_busy_ns = figures.stages[static_cast<std::size_t>(s)].busy;
    sp.pipeline_end_ns = figures.stages[static_cast<std::size_t>(s)].end;
    sp.in_flight_microbatches =
        in_flight_microbatches(orders[static_cast<std::size_t>(s)], prog.shape.chunks, prog.split_backward);
    model::memory_options mo;
    mo.in_flight_microbatches = sp.in_flight_microbatches;
    mo.flash_attention = opt.flash_attention;
    mo.per_param = opt.state;
    sp.memory = model::memory_per_gpu(m, par, s, mo);
    out.stages.push_back(sp);
  }
  std::size_t worst = 0;
  for (std::size_t s = 1; s < out.stages.size(); ++s) {
    if (out.stages[s].memory.total() > out.stages[worst].memory.total()) worst = s;
  }
  out.memory = out.stages[worst].memory;
  out.memory_stage = out.stages[worst].stage;
  out.in_flight_microbatches = out.stages[worst].in_flight_microbatches;
  out.state = opt.state;

  out.tasks = prog.task_count();
  out.edges = prog.edge_count();
  out.processors = prog.processor_count;
  out.simulated_ranks = prog.ranks.size();
  return out;
}

}  // namespace lumos::synth

#pragma once
// What a model-driven job is and what building it gives: the job (model, parallel
// configuration, machine, schedule), the options of `build_program`, and the built `program`
// with its ranks and the notes a kernel-level trace writer reads. synth/program.hpp builds it.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::synth {

/// How finely a program is emitted (see the header comment).
enum class granularity : std::uint8_t {
  kernel,  ///< one task per compute-model op and per TP collective (trace-like)
  pass,    ///< one compute task and one coalesced TP collective per pipeline pass
};

[[nodiscard]] constexpr std::string_view to_string(granularity g) noexcept {
  return g == granularity::kernel ? "kernel" : "pass";
}

/// Options of `build_program`. Defaults follow Megatron-LM with bf16 mixed precision.
struct program_options {
  /// Build every rank (tp·pp·dp) instead of one rank per stage.
  bool unfold = false;
  granularity detail = granularity::kernel;
  /// Start each gradient bucket's reduction as soon as its gradients are final (Megatron's
  /// `overlap_grad_reduce`); otherwise all buckets start after the stage's last pipeline op.
  bool overlap_grad_reduce = true;
  /// Parameters per gradient bucket; 0 = Megatron's max(40e6, 1e6·dp).
  std::int64_t bucket_params = 0;
  /// CPU time of one kernel launch; negative = the hardware's `kernel_launch_overhead`. Ops of
  /// the compute model that state their own host time (`model::op_cost::cpu` >= 0) use that.
  time_ns launch_cost = -1;
  /// Host time to enqueue one collective or p2p transfer; negative = `launch_cost`.
  time_ns collective_cpu = -1;
  /// The launching thread waits for the device after posting each pipeline receive (Megatron-LM's
  /// torch.cuda.synchronize() after batch_isend_irecv), so its lead over the GPU is lost there.
  bool p2p_host_sync = false;
  /// fp16: the launching thread reads the found-inf flag back before the optimizer step.
  bool loss_scale_host_sync = false;
  /// Only the forward passes (an inference or forward-only profiling step): no backward, no
  /// gradient reduction, no optimizer.
  bool forward_only = false;
  /// Bytes per gradient element reduced over data parallelism (fp32 main gradients).
  double grad_reduce_bytes = 4;
  /// Bytes per parameter element all-gathered under ZeRO (bf16/fp16 model weights).
  double param_gather_bytes = 2;
  /// Record a `graph::collective_instance` per collective (trace writers need them; replay and
  /// predict do not).
  bool record_collectives = true;
  /// Give processors and tasks their descriptive names. Reports and trace writers need them;
  /// a sweep does not, and skips the string building (one std::string per processor and per
  /// op template). Without names every task and processor is unnamed; the timeline is the same.
  bool names = true;
  /// Record what a kernel-level trace writer needs (`program::notes`): the model op of each GPU
  /// task, what each collective carries, and the CPU task spans of passes, layers and the
  /// optimizer. Only at the `kernel` granularity.
  bool notes = false;
};

/// A span of one rank's CPU launch tasks that a trace shows as an annotation (`program_notes`).
enum class span_kind : std::uint8_t {
  forward,          ///< one forward pass (pipeline op F)
  backward,         ///< one backward pass (B, or W of split-backward schedules)
  layer,            ///< one transformer layer inside a forward pass
  layer_recompute,  ///< the recomputed forward of one layer inside a backward pass
  optimizer,        ///< the optimizer step (with ZeRO's parameter all-gathers)
};

/// What a collective of the program carries (`program_notes::comms`).
enum class comm_group : std::uint8_t { tp, dp, pp, model_parallel, world, embedding, expert_dp, context_parallel, ep, expert_tp };

/// What a kernel-level trace writer needs beyond the graph (`program_options::notes`).
struct program_notes {
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  /// GPU task → index into `ops` (compute tasks) or `comms` (the arrive and complete of
  /// collectives); `none` for other tasks. Sized to the graph's task count.
  std::vector<std::uint32_t> op_of_task, comm_of_task;
  std::vector<model::op_cost> ops;
  struct comm {
    comm_group group = comm_group::tp;
    std::int64_t element_bytes = 2;  ///< bytes per element of the message (fp32 gradients: 4)
  };
  std::vector<comm> comms;
  struct span {
    int rank = 0;
    span_kind kind = span_kind::forward;
    int index = 0;  ///< layer within its chunk (layers), micro-batch (passes)
    graph::task_id first = graph::no_task, last = graph::no_task;  ///< CPU tasks
  };
  std::vector<span> spans;
  /// CPU tasks that block until GPU work has finished (written as the synchronize their sync
  /// edges make: a cudaStreamSynchronize of one stream, a cudaDeviceSynchronize of several,
  /// lasting from their issue to the end of what they wait for).
  std::vector<graph::task_id> host_syncs;
};

/// A model-driven job: model, parallel configuration, machine and pipeline schedule.
struct job {
  model::transformer model;
  model::parallel_config parallel;
  model::hardware hardware;
  /// Any `pipeline::PipelineSchedule` type, as `policy_of<S>()` (a user's included). Empty: the
  /// shipped schedule named by `parallel.schedule` if set, else interleaved 1F1B when vp > 1 and
  /// 1F1B otherwise.
  std::optional<schedule_policy> schedule;
};

/// The schedule `j` runs (see `job::schedule`). Throws `lumos::error` for an unknown name.
[[nodiscard]] inline schedule_policy resolve_schedule(const job& j) {
  if (j.schedule) return *j.schedule;
  if (!j.parallel.schedule.empty()) return parse_schedule(j.parallel.schedule);
  return j.parallel.vp > 1 ? policy_of<pipeline::interleaved_one_f_one_b>() : policy_of<pipeline::one_f_one_b>();
}

inline constexpr graph::processor_id no_processor = ~graph::processor_id{0};

/// One rank present in the graph, with its processors and the span of its pipeline phase.
struct simulated_rank {
  int rank = 0;
  int stage = 0;
  int tp_index = 0;
  int dp_index = 0;
  graph::processor_id cpu = no_processor;
  graph::processor_id compute = no_processor;
  graph::processor_id data_parallel = no_processor;
  graph::processor_id send_next = no_processor;
  graph::processor_id send_prev = no_processor;
  graph::processor_id recv_prev = no_processor;
  graph::processor_id recv_next = no_processor;
  graph::processor_id context_parallel = no_processor;  ///< the ring exchange of context parallelism
  /// First and last task of the schedule's ops on the compute stream (the pipeline phase);
  /// the tasks of that stream between them are the passes and their TP collectives.
  graph::task_id pipeline_first = graph::no_task;
  graph::task_id pipeline_last = graph::no_task;
};

/// The built iteration.
struct program {
  graph::task_graph graph;
  std::vector<simulated_rank> ranks;  ///< ascending global rank
  schedule_policy schedule = policy_of<pipeline::one_f_one_b>();
  pipeline::schedule_shape shape{};
  std::vector<std::vector<pipeline::op>> orders;  ///< per stage
  bool unfolded = false;
  granularity detail = granularity::kernel;
  std::int64_t world_size = 1;
  /// The schedule's backward is split into B and W (its policy's `splits_backward`).
  bool split_backward = false;
  /// Filled when `program_options::notes` is set (kernel granularity).
  program_notes notes;

  /// The simulated rank with tp_index 0 and dp_index 0 of `stage` (present in both modes).
  [[nodiscard]] const simulated_rank& representative(int stage) const {
    for (const auto& r : ranks) {
      if (r.stage == stage && r.tp_index == 0 && r.dp_index == 0) return r;
    }
    throw error("program: no rank for stage " + std::to_string(stage));
  }
};

}  // namespace lumos::synth

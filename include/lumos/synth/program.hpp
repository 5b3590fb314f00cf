#pragma once
// The pipeline program builder: from a model description and a parallel configuration, the
// execution graph of one training iteration, ready for graph::compile and the replay engine
// (the same engine a replayed trace uses) and carrying what a Kineto trace writer needs.
//
// What is built, per simulated rank (global rank = stage·tp·dp + dp_index·tp + tp_index,
// Megatron's tp-dp-pp order):
//   processors  a CPU launch thread (pid = tid = 10000 + rank); the compute stream (device
//               rank % gpus_per_node, stream 7), which also runs the tensor-parallel collectives
//               (Megatron makes the compute stream wait for each TP collective, so they serialise
//               with compute as if they ran on it; the async overlap of SP's weight-gradient
//               re-gathers with dgrad GEMMs is not modelled); a data-parallel stream (13) for
//               gradient reductions, ZeRO parameter all-gathers and the embedding-copies all-reduce;
//               four pipeline p2p streams (21 send to the next stage, 22 send to the previous,
//               23 receive from the previous, 24 receive from the next), one per direction so
//               that a waiting receive never holds a send back. Receives are posted as early as
//               the stream allows (Megatron's overlapped p2p), so with free communication the
//               pipeline phase is exactly the schedule of pipeline/timeline.hpp (tests/synth).
//   program     the stage's ops in schedule order (any `pipeline::PipelineSchedule`, carried as the
//               job's `schedule_policy`, schedules.hpp); each op is "receive its input if
//               it crosses stages (`pipeline::dependency_of`) → its pass → send its output if
//               another stage consumes it". A pass F / B / W of model chunk c runs the chunk's
//               layers (F ascending, B and W descending), with the embedding before the layers of
//               the first virtual stage's F (after them in backward) and the final norm, logits
//               and loss after the last virtual stage's layers (before them in backward).
//               Schedules without a split backward run one backward pass with B and W ops
//               interleaved as the compute model lists them; zero-bubble schedules run the
//               backward_input ops in B and the backward_weight ops in W.
//   TP          per layer and micro-batch the collectives of `tensor_parallel_layer_collectives`
//               at Megatron's positions: without SP, all-reduces after the attention output
//               projection and the last MLP GEMM (forward) and after the QKV and first MLP dgrad
//               (backward); with SP, all-gather before / reduce-scatter after each of the two
//               blocks, and in backward the output-gradient all-gathers, the input re-gathers
//               (before the weight-gradient GEMMs, so in W for zero-bubble schedules) and the
//               dgrad reduce-scatters; full recomputation repeats the forward ones. With
//               `parallel_config::tp_comm_overlap` each of these keeps only the time its GEMM
//               does not hide (`exposed_tp_comm`; the embedding and head ones stay whole).
//               Embedding:
//               all-reduce (SP: reduce-scatter) of its output, SP all-gather of its gradient.
//               Head: SP all-gather before the logits, three small fp32 all-reduces of the
//               vocabulary-parallel cross-entropy, all-reduce (SP: reduce-scatter) of the logits
//               dgrad, SP re-gather for its weight gradient. A multi-token-prediction module:
//               its lookup's as the embedding's; its column-parallel projection eh_proj's on its
//               2h-wide input (all-reduce of the input gradient; SP: all-gather of the input,
//               reduce-scatter of its gradient, re-gather for the weight gradient), the
//               all-gather of its output over TP, and with SP the all-gather of the output's
//               gradient (its split back over the sequence); its head's as the head's.
//   DP          gradients in buckets of `bucket_params` parameters (Megatron's max(40e6, 1e6·dp)),
//               formed over each chunk's layers in backward order; a bucket's reduction starts
//               when its last layer's gradients are final — after the chunk's last B (or W) of
//               the iteration — on the DP stream (`overlap_grad_reduce`; otherwise after the
//               stage's last op). ZeRO-0: all-reduce. ZeRO-1: reduce-scatter, and after the
//               optimizer step an all-gather of the updated bf16 parameters per bucket. ZeRO-2:
//               gradients cannot be accumulated unsharded, so each weight-gradient pass
//               reduce-scatters its chunk's gradients (every micro-batch), then the ZeRO-1
//               all-gather. ZeRO-3: additionally all-gathers the chunk's parameters before every
//               F and B pass, prefetched one op ahead on the DP stream; no final all-gather.
//   end         the all-reduce of the word embedding's gradient between its copies on the first
//               and last stage (pp > 1 with tied embeddings or multi-token prediction),
//               then on the compute stream, after every reduction: the gradient norm, its fp32
//               all-reduce over the model-parallel group (the whole world under ZeRO ≥ 1), the
//               Adam step.
//   tasks       every GPU op is launched by a CPU task ("cudaLaunchKernel", the hardware preset's
//               `kernel_launch_overhead` of CPU time per kernel unless overridden) through a
//               launch edge that counts from the call's start (as the trace builder's do);
//               collectives are `comm_arrive` (0 long) then, as the next task id on the same
//               stream, `comm_complete` (the communication model's transfer time), joined by one
//               `join` task on a barrier processor per process group (arrive → join → complete,
//               `edge_kind::collective`); each is recorded as a `graph::collective_instance`
//               (kind "allreduce", "allgather", "reduce_scatter", "send_recv", or "coalesced" for
//               the merged TP collectives of the `pass` granularity; group "tp.<stage>.<dp>",
//               "dp.<stage>.<tp>", "pp.fwd.<s>-<s+1>.<column>", "pp.bwd.…", "mp.<dp>", "world",
//               "embd.<column>"). Cross-stream data dependencies (receive → consumer, producer →
//               send, gradients → reduction, reduction → optimizer, all-gather → pass) are
//               `dependency` edges. The CPU thread never waits (Megatron's loop has no host sync
//               inside an iteration once p2p is overlapped), so it runs ahead of the GPU.
//
// Granularity: `kernel` emits one task per op of the compute model's lists and one collective
// per TP collective (what a trace of the job looks like); `pass` emits one compute task and one
// coalesced TP collective per pipeline pass (split per layer in the passes that trigger gradient
// buckets), durations summed, with one CPU launch task per pipeline op whose launch edges let
// each GPU task start once its first kernel is launched. Both give the same timeline when the
// launch thread runs ahead of the GPU (any model whose kernels outlast their launches); `pass`
// is 10-20x smaller and is what `predict` uses.
//
// Notes (`program_options::notes`, kernel granularity): the model op of each compute task, the
// process group and element size of each collective, the CPU task spans of passes, layers and
// the optimizer, and a final host wait for the device — what synth/kernel_trace.hpp needs to
// write the iteration as a framework's trace. The timeline is the same with or without them.
//
// Folding: by default only distinct programs are built — one data-parallel replica and one
// tensor-parallel rank per stage (pp simulated ranks). A TP or DP collective then has one
// participant (no join), whose complete still costs the full transfer time of the whole group;
// p2p transfers and cross-stage collectives keep their stage-representative participants and
// joins. A folded stage boundary's p2p costs its slowest pair (NVLink or NIC by placement).
// `unfold` builds every rank with true joins; both agree within 0.1 % (tests/synth). Groups
// whose members sit unevenly on nodes are priced as if each member were on its own node.
//
// Two forms, one emission: `build_program` adds the tasks to a task graph (what traces are
// written from), `build_compiled_into` places them straight into the compiled form the replay
// engine runs (synth/compiled_program.hpp; what predict and a sweep replay). Both go through the
// same emission of each rank (synth/detail/program_emission.hpp); only the primitives that add a
// task (synth/detail/program_tasks.hpp) differ.

#include <lumos/graph/compile.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/compiled_program.hpp>
#include <lumos/synth/detail/program_builder.hpp>
#include <lumos/synth/detail/program_emission.hpp>
#include <lumos/synth/detail/program_groups.hpp>
#include <lumos/synth/detail/program_tasks.hpp>
#include <lumos/synth/detail/program_templates.hpp>

namespace lumos::synth {

/// Builds the execution graph of one training iteration of `j` (see the header comment for
/// what it contains). `compute` gives per-op durations (`model::ComputeModel`), `comm` the
/// transfer times (`model::CommModel`). Throws `lumos::error` with a one-line reason for an
/// invalid configuration (model shape, divisibility by tp and pp·vp, global batch, schedule
/// constraints, unsupported precision). Time and memory are linear in the tasks built:
/// per simulated rank, (schedule ops) × (ops per pass at `kernel`, about 4 at `pass`).
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
[[nodiscard]] program build_program(const job& j, const program_options& opt = {}, const Compute& compute = {},
                                    const Comm& comm = {}) {
  program out;
  program_buffers buffers;
  detail::program_builder<Compute, Comm>(j, opt, compute, comm, buffers).build(out);
  return out;
}

/// `build_program` into `out`, whose graph arrays keep their capacity: in a loop over
/// configurations the large arrays are allocated once. `out` is overwritten (its string table
/// is kept, see `program_builder::clear`). Same graph as `build_program`.
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
void build_program_into(program& out, const job& j, const program_options& opt = {}, const Compute& compute = {},
                        const Comm& comm = {}) {
  program_buffers buffers;
  detail::program_builder<Compute, Comm>(j, opt, compute, comm, buffers).build(out);
}

/// The compiled program of a built one: `graph::compile` of its graph, with each position's
/// task kind, its processors (unnamed) and its ranks' pipeline phases as positions — what
/// `build_compiled` emits directly, reached through the task graph (a program built for its
/// traces, say, replayed and reported as `predict` does).
[[nodiscard]] inline compiled_program compile_program(const program& prog) {
  compiled_program out;
  out.graph = graph::compile(prog.graph);
  out.tasks = prog.graph.task_count();
  out.edges = prog.graph.edge_count();
  out.processor_count = prog.graph.processors.size();
  out.kind.resize(out.graph.size());
  for (std::uint32_t i = 0; i < out.graph.size(); ++i) out.kind[i] = prog.graph.kind[out.graph.task[i]];
  for (const graph::processor_info& p : prog.graph.processors) out.processors.push_back({p.kind, p.rank, p.owner, p.index, {}});
  std::vector<std::uint8_t> watch(prog.graph.processors.size(), 0);
  for (std::size_t p = 0; p < watch.size(); ++p) {
    if (prog.graph.processors[p].rank == 0 && prog.graph.processors[p].kind == graph::processor_kind::gpu_stream) watch[p] = 2;
  }
  for (const simulated_rank& r : prog.ranks) {
    if (r.tp_index == 0 && r.dp_index == 0) watch[r.compute] |= 1;
  }
  for (std::uint32_t i = 0; i < out.graph.size(); ++i) {
    for (std::size_t l = 0; l < 2; ++l) {
      if ((watch[out.graph.processor(i)] >> l & 1U) != 0) out.watched[l].push_back({i, out.graph.processor(i), out.kind[i]});
    }
  }
  for (const simulated_rank& r : prog.ranks) {
    compiled_rank c{r.rank, r.stage, r.tp_index, r.dp_index, r.compute, no_position, no_position};
    if (r.pipeline_first != graph::no_task) c.pipeline_first = out.graph.position_of(r.pipeline_first);
    if (r.pipeline_last != graph::no_task) c.pipeline_last = out.graph.position_of(r.pipeline_last);
    out.ranks.push_back(c);
  }
  out.schedule = prog.schedule;
  out.shape = prog.shape;
  out.unfolded = prog.unfolded;
  out.detail = prog.detail;
  out.world_size = prog.world_size;
  out.split_backward = prog.split_backward;
  return out;
}

/// The iteration of `build_program(j, opt, compute, comm)` in compiled form, emitted straight
/// into `out` (see compiled_program) with `buffers` as working memory: no task graph is built
/// and nothing is compiled, and a caller that keeps `out` and `buffers` between builds (a sweep)
/// allocates nothing once they have grown to its largest program — provided `compute` has the
/// allocation-free overloads of the shipped models (`layer(m, p, hw, out)`, ...) and `orders`
/// are given. `orders`: the schedule's stage orders for j's shape (`policy.orders(shape)`), when
/// the caller keeps them. Replayed, `out.graph` gives the timeline of
/// `graph::compile(build_program(...).graph)`, the same for every task (tests/synth), with the
/// same task, edge and processor counts. Throws as `build_program` does, and the error of
/// `graph::compile` when the graph has a cycle (a schedule whose ops wait on each other).
/// `out.times` and `out.makespan` hold the replay's timeline (computed as the tasks are placed);
/// `parts`: whether `out` keeps the graph too, or the timeline alone (compiled_parts).
/// Time and memory: linear in the tasks, as `build_program`, without the task graph's columns.
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
void build_compiled_into(compiled_program& out, program_buffers& buffers, const job& j, const program_options& opt = {},
                         const Compute& compute = {}, const Comm& comm = {},
                         const std::vector<std::vector<pipeline::op>>* orders = nullptr,
                         compiled_parts parts = compiled_parts::all) {
  if (detail::program_builder<Compute, Comm>(j, opt, compute, comm, buffers).build(out, orders, parts)) return;
  // Tasks that wait for each other (a schedule whose ops wait on each other), or for an arrive
  // that never comes (a schedule that never runs an op another waits for): through the task
  // graph, whose compile names the cycle, or compiles what was not placed; its timeline replayed.
  out = compile_program(build_program(j, opt, compute, comm));
  sim::replay_engine engine;
  out.makespan = engine.run(out.graph);
  out.times = engine.release_times();
}

/// `build_compiled_into` a new compiled program.
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
[[nodiscard]] compiled_program build_compiled(const job& j, const program_options& opt = {}, const Compute& compute = {},
                                              const Comm& comm = {}) {
  compiled_program out;
  program_buffers buffers;
  build_compiled_into(out, buffers, j, opt, compute, comm);
  return out;
}

}  // namespace lumos::synth

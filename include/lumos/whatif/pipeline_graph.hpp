#pragma once
// The fine-grained pipeline what-if of traces without pipeline stages (`lumos whatif --pp N` on a
// PP 1 job, to GPipe, 1F1B, interleaved 1F1B, ZB-H1 or ZB-H2): the traced graph is cut into N
// stages, each a copy of every traced rank that keeps its own layers' launches and kernels, runs
// its passes (per model chunk, interleaved; each backward pass split into B and W by its weight
// gradients, zero bubble) in the order the schedule policy gives, and waits for its neighbour's
// activation or gradient. A change of the micro-batches per replica is made on the graph first
// (whatif/micro_batches.hpp) and reaches the split as a `micro_batch_remap`.
//
// From traces with P stages to a multiple of them (or another schedule on the same P), each traced
// stage σ is cut the same way into the block of target stages [σ·k, σ·k + k): a traced transfer
// between two stages stays, on the end stage of each block that faces its peer (it belongs to the
// pass it feeds or drains, told by its nccl:recv / nccl:send operator), only transfers within a
// block are added, and a host synchronization waits for what its thread enqueued before it in
// the new order. Each traced rank keeps its number on the first stage of its block. Another
// count of micro-batches per replica on traces with stages is made first by repeating or removing
// passes in place (`stage_micro_batches_to`), and the split (on the same stages, or more) orders
// the new count. To fewer stages (a divisor of P, at least 2), each target stage is made from one
// traced stage of the block it merges (`merge_source_stage`: the first, and the traced last for the
// last target stage), whose layers the caller has repeated to the block's count; the other traced
// ranks are dropped and every transfer of the new order is added.
//
// Each task is labelled with the pass it belongs to: a GPU op by structure discovery's pass of its
// launch, a launch call by the op it launched, every other task by the last labelled task before it
// on its processor (work before the first pass and after the last — the optimizer, say — is kept
// whole on every stage, at its place). In a pass, a layer's tasks stay on the stage that holds the
// layer; the other work of a forward pass before its first layer (the embedding) stays on the first
// stage, after its last layer (head, loss) on the last; in a backward pass the reverse; work between
// layers, and the data-parallel gradient collectives, stay on every stage. Every edge whose two tasks
// a stage keeps is kept unless the new order puts its source's pass after its target's (an edge the
// traces had between passes the schedule now swaps). A cross-stage transfer is what Megatron runs:
// the producer's host launches a send kernel on a p2p stream after the pass, which waits for the
// pass's last kernel on the compute stream; the consumer's host launches the receive on its own p2p
// stream before the pass and then waits for it and for its compute stream to drain (the
// torch.cuda.synchronize() after each batched transfer); send and receive are one p2p instance,
// joined, with the NCCL model's time. `lumos whatif --trace-out` writes them as the
//
// The split runs in two steps: planning (whatif/stage_plan.hpp, with the geometry of
// whatif/stage_geometry.hpp and the pass labels of whatif/pass_labels.hpp) decides what each task
// becomes without editing the graph; emission (whatif/stage_emission.hpp) builds the new graph
// from the plan and says what it made (whatif/stage_split.hpp). A micro-batch change on traces
// with stages (`stage_micro_batches_to`) is whatif/micro_batches.hpp's.

#include <lumos/graph/build_options.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/stage_emission.hpp>
#include <lumos/whatif/stage_geometry.hpp>
#include <lumos/whatif/stage_plan.hpp>
#include <lumos/whatif/stage_split.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lumos::whatif {

/// Rewrites `b` (the graph of a job whose structure is `st`: without pipeline stages, or with
/// stages that `pp` is a multiple of) into `pp` stages run by `schedule` (see the header
/// comment). `plans` are the traced ranks' plans on `b` before the rewrite; a cross-stage transfer
/// takes `p2p.intra` between ranks of one node (`p2p.gpus_per_node` consecutive ranks),
/// `p2p.inter` across nodes, placed as Megatron numbers ranks: stage s of column r is rank s·W + r,
/// W the larger of `ranks_per_stage` and the traced ranks per stage (without traced stages that
/// is also the output's number; with them each traced rank keeps its own on the first stage of its
/// block and the others are numbered from the traced world up). `remap`: the micro-batch change
/// already made on `b` (the structure's tasks are those before it); `layer_copies` and
/// `layers_to`: a layer change already made on `b` instead (`edited_graph::copies` of
/// `repeat_groups`, the new layer count). `weight`: per task of the structure's graph, 1 for a
/// weight gradient (`weight_gradient_tasks`; needed by the zero-bubble schedules). Throws
/// `lumos::error` when `stage_split_unsupported` says why, or when a processor's passes are not in
/// pass order.
/// It plans (`plan_stages`), then emits (`emit_stages`).
[[nodiscard]] inline stage_split split_stages(graph::built_job& b, const trace::job& job, const job_structure& st,
                                              const std::vector<report::iteration_plan>& plans, int pp, int vp,
                                              const synth::schedule_policy& schedule, const p2p_latency& p2p, const std::string& latency_source,
                                              const tied_embedding_reduce* tied = nullptr, int ranks_per_stage = 0,
                                              const micro_batch_remap* remap = nullptr,
                                              const std::vector<std::uint8_t>* weight = nullptr,
                                              const std::vector<std::vector<graph::task_id>>* layer_copies = nullptr,
                                              int layers_to = 0) {
  const stage_plan plan = plan_stages(b, job, st,
                                      {.pp = pp,
                                       .vp = vp,
                                       .schedule = schedule,
                                       .ranks_per_stage = ranks_per_stage,
                                       .remap = remap,
                                       .weight = weight,
                                       .layer_copies = layer_copies,
                                       .layers_to = layers_to});
  return emit_stages(b, job, plan, plans, {.p2p = p2p, .latency_source = latency_source, .tied = tied});
}

}  // namespace lumos::whatif

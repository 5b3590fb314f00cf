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
//               gradient reductions, ZeRO parameter all-gathers and the tied-embedding all-reduce;
//               four pipeline p2p streams (21 send to the next stage, 22 send to the previous,
//               23 receive from the previous, 24 receive from the next), one per direction so
//               that a waiting receive never holds a send back. Receives are posted as early as
//               the stream allows (Megatron's overlapped p2p), so with free communication the
//               pipeline phase is exactly the schedule of pipeline/timeline.hpp (tests/synth).
//   program     the stage's ops in schedule order (`pipeline::PipelineSchedule`, dispatched from
//               the runtime `schedule_kind` in schedules.hpp); each op is "receive its input if
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
//               dgrad, SP re-gather for its weight gradient.
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
//   end         the tied-embedding gradient all-reduce between the first and last stage (pp > 1),
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

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/detail/program_parts.hpp>
#include <lumos/synth/job.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::synth {

namespace detail {

template <model::ComputeModel Compute, model::CommModel Comm>
class program_builder {
 public:
  program_builder(const job& j, const program_options& opt, const Compute& compute, const Comm& comm)
      : m_(j.model), par_(j.parallel), hw_(j.hardware), opt_(opt), compute_(compute), comm_(comm) {
    policy_ = resolve_policy(j);
    kind_ = policy_.kind;
    par_.validate(m_, hw_);
    if (par_.vp > 1 && !policy_.supports_chunks) {
      throw error("vp = " + std::to_string(par_.vp) + " model chunks need the interleaved schedule, not " +
                  (j.policy ? std::string(policy_.name) : std::string(pipeline::schedule_title(kind_))) +
                  " (set the schedule to interleaved or vp = 1)");
    }
    const std::int64_t micro = par_.micro_batches();
    if (micro > std::numeric_limits<std::int32_t>::max()) throw error("too many micro-batches: " + std::to_string(micro));
    shape_ = {par_.pp, static_cast<std::int32_t>(micro), par_.vp};
    policy_.validate(shape_);
    split_ = policy_.splits_backward;
    if (par_.world_size() > (1 << 24)) {
      throw error("world size " + std::to_string(par_.world_size()) + " is beyond what lumos models (2^24 ranks)");
    }
    tp_ = par_.tp;
    pp_ = par_.pp;
    dp_ = par_.dp;
    world_ = static_cast<int>(par_.world_size());
    launch_cost_ = opt_.launch_cost >= 0 ? opt_.launch_cost : hw_.kernel_launch_overhead;
    collective_cpu_ = opt_.collective_cpu >= 0 ? opt_.collective_cpu : launch_cost_;
    bucket_params_ = opt_.bucket_params > 0 ? opt_.bucket_params : std::max<std::int64_t>(40'000'000, 1'000'000LL * dp_);
    layers_per_chunk_ = static_cast<int>(par_.layers_per_chunk(m_));
    if (par_.zero_stage == 3 && dp_ > 1) zero3_ = true;
  }

  program build() {
    program out;
    build(out);
    return out;
  }

  /// Builds into `out`, reusing the capacity of its graph arrays (a sweep's workspace).
  void build(program& out) {
    clear(out);
    out.schedule = kind_;
    out.split_backward = split_;
    out.shape = shape_;
    out.unfolded = opt_.unfold;
    out.detail = opt_.detail;
    out.world_size = world_;
    out.orders = policy_.orders(shape_);
    if (opt_.forward_only) {
      for (auto& o : out.orders) {
        std::erase_if(o, [](const pipeline::op& x) { return x.kind != pipeline::op_kind::forward; });
      }
    }
    orders_ = &out.orders;
    g_ = &out.graph;
    out_ = &out;
    notes_ = opt_.notes && opt_.detail == granularity::kernel;

    intern_names();
    build_templates();
    build_groups();
    plan_stages();
    reserve();

    if (opt_.unfold) {
      for (int r = 0; r < world_; ++r) emit_rank(out, r);
    } else {
      for (int s = 0; s < pp_; ++s) emit_rank(out, s * tp_ * dp_);
    }
    if (notes_) {
      out.notes.op_of_task.resize(g_->task_count(), program_notes::none);
      out.notes.comm_of_task.resize(g_->task_count(), program_notes::none);
    }
  }

  // Empties `out` and keeps the capacity of its arrays. The string table is kept too: the names
  // a builder interns are a small fixed set, so a reused table stops growing (ids may differ from
  // a fresh build's; the names they stand for do not).
  static void clear(program& out) {
    graph::task_graph& g = out.graph;
    g.processors.clear();
    g.processor.clear();
    g.kind.clear();
    g.duration.clear();
    g.idle_gap.clear();
    g.busy_gap.clear();
    g.name.clear();
    g.rank.clear();
    g.source.clear();
    g.observed_start.clear();
    g.observed_end.clear();
    g.edges.clear();
    g.collectives.clear();
    out.ranks.clear();
    out.notes = {};
  }

 private:
  // ---- configuration ----
  model::transformer m_;
  model::parallel_config par_;
  model::hardware hw_;
  program_options opt_;
  const Compute& compute_;
  const Comm& comm_;
  schedule_policy policy_{};
  pipeline::schedule_kind kind_{};
  pipeline::schedule_shape shape_{};
  bool split_ = false;
  bool zero3_ = false;
  int tp_ = 1, pp_ = 1, dp_ = 1, world_ = 1;
  int layers_per_chunk_ = 1;
  time_ns launch_cost_ = 0;
  time_ns collective_cpu_ = 0;
  std::int64_t bucket_params_ = 0;
  const std::vector<std::vector<pipeline::op>>* orders_ = nullptr;
  graph::task_graph* g_ = nullptr;
  program* out_ = nullptr;
  bool notes_ = false;

  // ---- names ----
  string_id n_unnamed_ = 0;
  string_id n_launch_ = 0, n_join_ = 0, n_send_fwd_ = 0, n_recv_fwd_ = 0, n_send_bwd_ = 0, n_recv_bwd_ = 0;
  string_id n_grad_ar_ = 0, n_grad_rs_ = 0, n_param_ag_ = 0, n_embd_ar_ = 0, n_norm_ar_ = 0, n_host_sync_ = 0;
  std::array<string_id, 4> n_pass_compute_{}, n_pass_comm_{};

  // ---- pass templates ----
  // [pass_kind] → items of one layer / the head / the embedding.
  std::array<std::vector<item>, 4> layer_items_, head_items_, embed_items_;
  std::int64_t layer_params_ = 0, head_params_ = 0, embed_params_ = 0;
  // [pass_kind][first][last] → totals of a whole chunk pass.
  std::array<std::array<std::array<totals, 2>, 2>, 4> pass_totals_{};
  // [first][last] → (backward segment index closing a bucket, bucket params).
  std::array<std::array<std::vector<std::pair<int, std::int64_t>>, 2>, 2> buckets_;
  std::array<std::array<std::int64_t, 2>, 2> chunk_params_{};

  // ---- optimizer, per stage ----
  std::vector<model::op_list> optimizer_;

  // ---- p2p ----
  std::int64_t p2p_bytes_ = 0;
  std::vector<time_ns> p2p_folded_;  ///< [stage boundary s → s+1 mod p]: slowest pair

  // ---- per stage plan ----
  std::vector<std::vector<std::uint8_t>> final_grad_;  ///< [stage][op index]: last grad op of its chunk

  // ---- groups ----
  std::vector<group_state> groups_;
  int tp_base_ = 0, dp_base_ = 0, act_base_ = 0, grad_base_ = 0, norm_base_ = 0, embd_base_ = 0;
  model::group_placement tp_placement_;

  // ---- per rank emission state ----
  struct rank_state {
    simulated_rank info;
    std::int64_t seq_tp = 0, seq_dp = 0, seq_act_out = 0, seq_act_in = 0, seq_grad_out = 0, seq_grad_in = 0;
    std::int64_t seq_norm = 0, seq_embd = 0;
    std::vector<graph::task_id> pending;  ///< start edges into the next compute-stream task
    graph::task_id last_compute = graph::no_task;
    graph::task_id last_dp = graph::no_task;
    struct pending_launch {
      graph::task_id gpu;
      time_ns cpu;   ///< host time of its dispatch
      time_ns lead;  ///< launch edge, relative to the start of its dispatch
    };
    std::vector<pending_launch> launches;  ///< batched (pass granularity)
    std::vector<graph::task_id> cpu_tasks;  ///< its CPU tasks in order (with notes)
  };

  // ===================================================================================== names

  string_id intern(std::string_view s) { return g_->strings.intern(s); }

  void intern_names() {
    n_unnamed_ = intern("");
    n_launch_ = intern("cudaLaunchKernel");
    n_join_ = intern("join");
    n_send_fwd_ = intern("send_forward");
    n_recv_fwd_ = intern("recv_forward");
    n_send_bwd_ = intern("send_backward");
    n_recv_bwd_ = intern("recv_backward");
    n_grad_ar_ = intern("grad_all_reduce");
    n_grad_rs_ = intern("grad_reduce_scatter");
    n_param_ag_ = intern("param_all_gather");
    n_embd_ar_ = intern("embedding_grad_all_reduce");
    n_norm_ar_ = intern("grad_norm_all_reduce");
    n_host_sync_ = intern("host_sync");
    constexpr std::array<std::string_view, 4> pass_names = {"forward", "backward_input", "backward_weight", "backward"};
    if (!opt_.names) {
      n_pass_compute_.fill(n_unnamed_);
      n_pass_comm_.fill(n_unnamed_);
      return;
    }
    for (std::size_t i = 0; i < 4; ++i) {
      n_pass_compute_[i] = intern(std::string(pass_names[i]) + " compute");
      n_pass_comm_[i] = intern(std::string(pass_names[i]) + " tp collectives");
    }
  }

  // ================================================================================= templates

  [[nodiscard]] static bool in_pass(const model::op_cost& o, pass_kind pk) noexcept {
    switch (pk) {
      case pass_kind::forward: return o.phase == model::op_phase::forward;
      case pass_kind::input_grad: return o.phase == model::op_phase::backward_input;
      case pass_kind::weight_grad: return o.phase == model::op_phase::backward_weight;
      case pass_kind::backward:
        return o.phase == model::op_phase::backward_input || o.phase == model::op_phase::backward_weight;
    }
    return false;
  }

  std::uint32_t note_op(const model::op_cost& o) {
    if (!notes_) return program_notes::none;
    out_->notes.ops.push_back(o);
    return static_cast<std::uint32_t>(out_->notes.ops.size() - 1);
  }

  item compute_item(const model::op_cost& o) {
    if (!opt_.names) {
      item i;
      i.duration = o.duration;
      i.kernels = o.kernels;
      i.cpu = o.cpu >= 0 ? o.cpu : launch_cost_ * o.kernels;
      i.name = n_unnamed_;
      i.op = note_op(o);
      i.recompute = o.recompute;
      return i;
    }
    std::string name(o.name);
    if (o.recompute) {
      name += "_recompute";
    } else if (o.phase == model::op_phase::backward_input) {
      name += "_bwd";
    } else if (o.phase == model::op_phase::backward_weight) {
      name += "_wgrad";
    }
    item i;
    i.comm = false;
    i.duration = o.duration;
    i.kernels = o.kernels;
    i.cpu = o.cpu >= 0 ? o.cpu : launch_cost_ * o.kernels;
    i.name = intern(name);
    i.op = note_op(o);
    i.recompute = o.recompute;
    return i;
  }

  item comm_item(std::string_view name, model::collective c, std::int64_t bytes, std::int64_t element_bytes = 0) {
    item i;
    i.comm = true;
    i.element_bytes = element_bytes > 0 ? element_bytes : static_cast<std::int64_t>(model::activation_bytes(par_.dtype));
    i.name = opt_.names ? intern(name) : n_unnamed_;
    i.kind = c;
    i.bytes = bytes;
    i.duration = comm_.collective_time({c, bytes, tp_placement_}, hw_);
    i.cpu = collective_cpu_;
    return i;
  }

  // Where the TP collectives of a layer sit among its ops (comm.hpp lists them; Megatron's
  // positions): `fwd` hooks apply to forward ops and to recomputed forward ops (full
  // recomputation repeats the forward collectives), `dgrad` to input-gradient ops, `wgrad` to
  // weight-gradient ops.
  enum class hook_phase : std::uint8_t { fwd, dgrad, wgrad };
  // How Transformer Engine overlaps a sequence-parallel collective with a GEMM under
  // `tp_comm_overlap`: `ring` splits the GEMM into tp chunks fed (all-gather) or drained
  // (reduce-scatter) by a ring exchange, so one chunk of the GEMM cannot overlap; `bulk` runs
  // the whole collective beside an independent GEMM of the same size (the dgrad / wgrad pair).
  enum class overlap_kind : std::uint8_t { ring, bulk };
  struct hook {
    model::op_role role;  // the op it attaches to
    hook_phase phase;
    bool after;
    std::string_view collective_name;
    overlap_kind overlap = overlap_kind::ring;
  };

  [[nodiscard]] std::vector<hook> layer_hooks() const {
    if (tp_ <= 1) return {};
    using R = model::op_role;
    if (!par_.sp) {
      return {{R::attn_out, hook_phase::fwd, true, "attn_out_proj_all_reduce"},
              {R::mlp_out, hook_phase::fwd, true, "mlp_out_all_reduce"},
              {R::mlp_in, hook_phase::dgrad, true, "mlp_in_dgrad_all_reduce"},
              {R::qkv, hook_phase::dgrad, true, "qkv_dgrad_all_reduce"}};
    }
    // The input re-gather precedes the first weight-gradient GEMM of the MLP input in backward
    // order: fc1, or the up GEMM of a gated MLP (backward runs down, act, up, gate).
    const R first_input_wgrad = m_.mlp == model::mlp_kind::gelu ? R::mlp_in : R::mlp_up;
    // TE overlaps the re-gathers with the dgrad GEMM and the dgrad reduce-scatters with the
    // wgrad GEMM (bulk); both GEMMs of a linear layer have the same FLOPs, so the hook's own GEMM
    // stands for its partner.
    constexpr auto bulk = overlap_kind::bulk;
    return {{R::qkv, hook_phase::fwd, false, "qkv_input_all_gather"},
            {R::attn_out, hook_phase::fwd, true, "attn_out_proj_reduce_scatter"},
            {R::mlp_in, hook_phase::fwd, false, "mlp_input_all_gather"},
            {R::mlp_out, hook_phase::fwd, true, "mlp_out_reduce_scatter"},
            {R::mlp_out, hook_phase::dgrad, false, "mlp_out_grad_all_gather"},
            {first_input_wgrad, hook_phase::wgrad, false, "mlp_input_regather", bulk},
            {R::mlp_in, hook_phase::dgrad, true, "mlp_in_dgrad_reduce_scatter", bulk},
            {R::attn_out, hook_phase::dgrad, false, "attn_out_proj_grad_all_gather"},
            {R::qkv, hook_phase::wgrad, false, "qkv_input_regather", bulk},
            {R::qkv, hook_phase::dgrad, true, "qkv_dgrad_reduce_scatter", bulk}};
  }

  // The part of a TP collective of `comm` ns that its GEMM of `gemm` ns does not hide. Ring:
  // the tp chunks of the GEMM alternate with tp - 1 exchange steps, max(gemm, comm + gemm/tp)
  // in all; bulk: max(gemm, comm). The collective's task keeps the remainder, so the kernel and
  // pass granularities fold it alike. Not modelled: the GEMM slowing down beside the
  // exchange's SMs and the split GEMM's lower efficiency.
  [[nodiscard]] time_ns exposed_tp_comm(time_ns comm, time_ns gemm, overlap_kind k) const noexcept {
    const time_ns hidden = k == overlap_kind::bulk ? gemm : gemm - gemm / tp_;
    return std::max<time_ns>(0, comm - hidden);
  }

  [[nodiscard]] static hook_phase phase_of(const model::op_cost& o) noexcept {
    if (o.phase == model::op_phase::forward || o.recompute) return hook_phase::fwd;
    return o.phase == model::op_phase::backward_weight ? hook_phase::wgrad : hook_phase::dgrad;
  }

  void layer_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
    const auto collectives = model::tensor_parallel_layer_collectives(m_, par_);
    const auto hooks = layer_hooks();
    auto emit_hooks = [&](const model::op_cost& o, bool after) {
      for (const hook& h : hooks) {
        if (h.after != after || h.phase != phase_of(o) || o.role != h.role) continue;
        for (const auto& c : collectives) {
          if (c.name != h.collective_name) continue;
          item i = comm_item(c.name, c.kind, c.bytes);
          if (par_.tp_comm_overlap) i.duration = exposed_tp_comm(i.duration, o.duration, h.overlap);
          out.push_back(i);
        }
      }
    };
    for (const model::op_cost& o : ops.ops) {
      if (!in_pass(o, pk)) continue;
      emit_hooks(o, false);
      out.push_back(compute_item(o));
      emit_hooks(o, true);
    }
  }

  // Embedding and head: their TP collectives (Megatron's vocabulary-parallel embedding,
  // output layer and cross-entropy).
  void embed_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
    const std::int64_t B = activation_message();
    for (const model::op_cost& o : ops.ops) {
      if (!in_pass(o, pk)) continue;
      const hook_phase ph = phase_of(o);
      if (tp_ > 1 && par_.sp && o.role == model::op_role::word_embedding && ph == hook_phase::wgrad) {
        out.push_back(comm_item("embedding_grad_all_gather", model::collective::all_gather, B));
      }
      out.push_back(compute_item(o));
      if (tp_ > 1 && o.role == model::op_role::word_embedding && ph == hook_phase::fwd) {
        out.push_back(par_.sp ? comm_item("embedding_reduce_scatter", model::collective::reduce_scatter, B)
                              : comm_item("embedding_all_reduce", model::collective::all_reduce, B));
      }
    }
  }

  void head_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
    const std::int64_t B = activation_message();
    const std::int64_t loss_bytes = par_.micro_batch * m_.seq * 4;
    for (const model::op_cost& o : ops.ops) {
      if (!in_pass(o, pk)) continue;
      const hook_phase ph = phase_of(o);
      if (tp_ > 1 && par_.sp && o.role == model::op_role::logits) {
        if (ph == hook_phase::fwd) out.push_back(comm_item("final_norm_all_gather", model::collective::all_gather, B));
        if (ph == hook_phase::wgrad) out.push_back(comm_item("logits_input_regather", model::collective::all_gather, B));
      }
      out.push_back(compute_item(o));
      if (tp_ > 1 && o.role == model::op_role::cross_entropy && ph == hook_phase::fwd) {
        // max, target logit and sum of exponentials: three fp32 all-reduces over the tokens
        for (const char* n : {"cross_entropy_max_all_reduce", "cross_entropy_target_all_reduce",
                              "cross_entropy_sum_all_reduce"}) {
          out.push_back(comm_item(n, model::collective::all_reduce, loss_bytes, 4));
        }
      }
      if (tp_ > 1 && o.role == model::op_role::logits && ph == hook_phase::dgrad) {
        out.push_back(par_.sp ? comm_item("logits_dgrad_reduce_scatter", model::collective::reduce_scatter, B)
                              : comm_item("logits_dgrad_all_reduce", model::collective::all_reduce, B));
      }
    }
  }

  [[nodiscard]] std::int64_t activation_message() const {
    return par_.micro_batch * m_.seq * m_.hidden * static_cast<std::int64_t>(model::activation_bytes(par_.dtype));
  }

  void build_templates() {
    tp_placement_ = model::tensor_parallel_group(par_, hw_);
    const model::op_list layer = compute_.layer(m_, par_, hw_);
    const model::op_list embed = compute_.embedding(m_, par_, hw_);
    const model::op_list head = compute_.head(m_, par_, hw_);
    for (std::size_t k = 0; k < 4; ++k) {
      const auto pk = static_cast<pass_kind>(k);
      layer_template(layer, pk, layer_items_[k]);
      embed_template(embed, pk, embed_items_[k]);
      head_template(head, pk, head_items_[k]);
    }
    layer_params_ = model::layer_parameters_per_rank(m_, tp_);
    embed_params_ = m_.vocab * m_.hidden / tp_ + (m_.position == model::position_kind::learned ? m_.seq * m_.hidden : 0);
    head_params_ = model::norm_parameter_count(m_) + ((!m_.tied_embeddings || pp_ > 1) ? m_.vocab * m_.hidden / tp_ : 0);

    for (std::size_t k = 0; k < 4; ++k) {
      for (int first = 0; first < 2; ++first) {
        for (int last = 0; last < 2; ++last) {
          // In execution order (backward passes run the head first and the embedding last):
          // the run's lead depends on it, and the per-kernel graph follows this order.
          const auto pk = static_cast<pass_kind>(k);
          const bool forward = pk == pass_kind::forward;
          totals t;
          if (first && forward) t.add(embed_items_[k]);
          if (last && !forward) t.add(head_items_[k]);
          t.add(layer_items_[k], layers_per_chunk_);
          if (last && forward) t.add(head_items_[k]);
          if (first && !forward) t.add(embed_items_[k]);
          pass_totals_[k][static_cast<std::size_t>(first)][static_cast<std::size_t>(last)] = t;
        }
      }
    }
    // Buckets over the backward order of a chunk's segments: head, layers (last first),
    // embedding; a bucket closes once it holds `bucket_params_`, the rest closes at the end.
    for (int first = 0; first < 2; ++first) {
      for (int last = 0; last < 2; ++last) {
        auto& list = buckets_[static_cast<std::size_t>(first)][static_cast<std::size_t>(last)];
        std::int64_t acc = 0, total = 0;
        int index = 0;
        auto add = [&](std::int64_t params) {
          acc += params;
          total += params;
          if (acc >= bucket_params_) {
            list.emplace_back(index, acc);
            acc = 0;
          }
          ++index;
        };
        if (last) add(head_params_);
        for (int l = 0; l < layers_per_chunk_; ++l) add(layer_params_);
        if (first) add(embed_params_);
        if (acc > 0) list.emplace_back(index - 1, acc);
        chunk_params_[static_cast<std::size_t>(first)][static_cast<std::size_t>(last)] = total;
      }
    }
    optimizer_.clear();
    for (int s = 0; s < pp_; ++s) optimizer_.push_back(compute_.optimizer(m_, par_, hw_, s));

    p2p_bytes_ = model::pipeline_p2p_bytes(m_, par_);
    p2p_folded_.assign(static_cast<std::size_t>(pp_), 0);
    for (int s = 0; s < pp_ && pp_ > 1; ++s) {
      time_ns worst = 0;
      for (int col = 0; col < tp_ * dp_; ++col) worst = std::max(worst, p2p_time(s, col));
      p2p_folded_[static_cast<std::size_t>(s)] = worst;
    }
  }

  [[nodiscard]] int global_rank(int stage, int col) const noexcept { return stage * tp_ * dp_ + col; }

  // Transfer from stage s to stage (s + 1) mod p of column `col` (either direction: same pair).
  [[nodiscard]] time_ns p2p_time(int s, int col) const {
    const int a = global_rank(s, col);
    const int b = global_rank((s + 1) % pp_, col);
    return comm_.p2p_time({p2p_bytes_, a / hw_.gpus_per_node == b / hw_.gpus_per_node}, hw_);
  }

  // ==================================================================================== plan

  void plan_stages() {
    final_grad_.assign(static_cast<std::size_t>(pp_), {});
    const pipeline::op_kind grad_kind = split_ ? pipeline::op_kind::weight : pipeline::op_kind::backward;
    for (int s = 0; s < pp_; ++s) {
      const auto& order = (*orders_)[static_cast<std::size_t>(s)];
      auto& flags = final_grad_[static_cast<std::size_t>(s)];
      flags.assign(order.size(), 0);
      std::vector<int> last(static_cast<std::size_t>(shape_.chunks), -1);
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (order[i].kind == grad_kind) last[static_cast<std::size_t>(order[i].chunk)] = static_cast<int>(i);
      }
      for (const int i : last) {
        if (i >= 0) flags[static_cast<std::size_t>(i)] = 1;
      }
    }
  }

  void reserve() {
    // Tasks and edges, counted from the templates (exact up to joins, buckets and the tail), so
    // that the big arrays are allocated once and no more than needed.
    const int virtual_stages = pp_ * shape_.chunks;
    std::size_t tasks = 0, edges = 0;
    for (int s = 0; s < pp_; ++s) {
      std::size_t t = 64, e = 64;
      for (const pipeline::op& o : (*orders_)[static_cast<std::size_t>(s)]) {
        const int vs = o.chunk * pp_ + s;
        const std::size_t k = static_cast<std::size_t>(
            o.kind == pipeline::op_kind::forward ? pass_kind::forward
            : o.kind == pipeline::op_kind::weight ? pass_kind::weight_grad
            : split_                              ? pass_kind::input_grad
                                                  : pass_kind::backward);
        const totals& tot = pass_totals_[k][vs == 0][vs == virtual_stages - 1];
        if (opt_.detail == granularity::kernel) {
          t += 2 * static_cast<std::size_t>(tot.compute_kernels) + 4 * static_cast<std::size_t>(tot.comm_kernels);
          e += static_cast<std::size_t>(tot.compute_kernels) + 3 * static_cast<std::size_t>(tot.comm_kernels);
        } else {
          t += 6;
          e += 4;
        }
        if (pp_ > 1) {
          t += 8;  // receive and send: launch, arrive, complete each, and a join per pair
          e += 8;
        }
      }
      tasks += t * (opt_.unfold ? static_cast<std::size_t>(tp_ * dp_) : 1);
      edges += e * (opt_.unfold ? static_cast<std::size_t>(tp_ * dp_) : 1);
    }
    g_->processor.reserve(tasks);
    g_->kind.reserve(tasks);
    g_->duration.reserve(tasks);
    g_->idle_gap.reserve(tasks);
    g_->busy_gap.reserve(tasks);
    g_->name.reserve(tasks);
    g_->rank.reserve(tasks);
    g_->source.reserve(tasks);
    g_->observed_start.reserve(tasks);
    g_->observed_end.reserve(tasks);
    g_->edges.reserve(edges);
  }

  // ================================================================================== groups

  enum class group_type : std::uint8_t { tp, dp, act, grad, norm, embd };

  void build_groups() {
    // Dense ids: tp (pp·dp groups), dp (pp·tp), act and grad channels (pp·tp·dp each: the
    // sender's stage and column), gradient-norm (dp replicas, or one world group under ZeRO),
    // tied-embedding (tp·dp columns).
    tp_base_ = 0;
    dp_base_ = tp_base_ + pp_ * dp_;
    act_base_ = dp_base_ + pp_ * tp_;
    grad_base_ = act_base_ + pp_ * tp_ * dp_;
    norm_base_ = grad_base_ + pp_ * tp_ * dp_;
    embd_base_ = norm_base_ + dp_;
    groups_.assign(static_cast<std::size_t>(embd_base_ + tp_ * dp_), {});
  }

  group_state& group(group_type type, int a, int b) {
    int id = 0;
    switch (type) {
      case group_type::tp: id = tp_base_ + a * dp_ + b; break;          // a = stage, b = dp index
      case group_type::dp: id = dp_base_ + a * tp_ + b; break;          // a = stage, b = tp index
      case group_type::act: id = act_base_ + a * tp_ * dp_ + b; break;  // a = sender stage, b = column
      case group_type::grad: id = grad_base_ + a * tp_ * dp_ + b; break;
      case group_type::norm: id = norm_base_ + (par_.zero_stage >= 1 ? 0 : a); break;  // a = dp index
      case group_type::embd: id = embd_base_ + a; break;                // a = column
    }
    group_state& gs = groups_[static_cast<std::size_t>(id)];
    if (!gs.ready) init_group(gs, type, a, b);
    return gs;
  }

  void init_group(group_state& gs, group_type type, int a, int b) {
    gs.ready = true;
    switch (type) {
      case group_type::tp:
        gs.type = comm_group::tp;
        gs.name = "tp." + std::to_string(a) + "." + std::to_string(b);
        for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(a, b * tp_ + t));
        gs.participants = opt_.unfold ? tp_ : 1;
        break;
      case group_type::dp:
        gs.type = comm_group::dp;
        gs.name = "dp." + std::to_string(a) + "." + std::to_string(b);
        for (int d = 0; d < dp_; ++d) gs.ranks.push_back(global_rank(a, d * tp_ + b));
        gs.participants = opt_.unfold ? dp_ : 1;
        break;
      case group_type::act:
      case group_type::grad: {
        const int to = (a + 1) % pp_;
        gs.type = comm_group::pp;
        gs.name = std::string(type == group_type::act ? "pp.fwd." : "pp.bwd.") + std::to_string(a) + "-" +
                  std::to_string(to) + "." + std::to_string(b);
        if (type == group_type::act) {
          gs.ranks = {global_rank(a, b), global_rank(to, b)};
        } else {
          gs.ranks = {global_rank(to, b), global_rank(a, b)};
        }
        gs.participants = 2;
        break;
      }
      case group_type::norm:
        gs.type = par_.zero_stage >= 1 ? comm_group::world : comm_group::model_parallel;
        if (par_.zero_stage >= 1) {
          gs.name = "world";
          for (int r = 0; r < world_; ++r) gs.ranks.push_back(r);
          gs.participants = opt_.unfold ? world_ : pp_;
        } else {
          gs.name = "mp." + std::to_string(a);
          for (int s = 0; s < pp_; ++s) {
            for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(s, a * tp_ + t));
          }
          gs.participants = opt_.unfold ? tp_ * pp_ : pp_;
        }
        break;
      case group_type::embd:
        gs.type = comm_group::embedding;
        gs.name = "embd." + std::to_string(a);
        gs.ranks = {global_rank(0, a), global_rank(pp_ - 1, a)};
        gs.participants = 2;
        break;
    }
    gs.placement = placement_of(gs.ranks, hw_);
  }

  // ================================================================================ emission

  graph::task_id add(graph::processor_id p, graph::task_kind k, time_ns d, string_id name, int rank) {
    const graph::task_id t = g_->add_task({.kind = k, .processor = p, .duration = d, .rank = rank});
    g_->name[t] = name;
    return t;
  }

  graph::processor_id stream(const simulated_rank& r, std::int64_t index, std::string_view what) {
    if (!opt_.names) return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, r.rank % hw_.gpus_per_node, index, {}});
    return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, r.rank % hw_.gpus_per_node, index,
                              "rank " + std::to_string(r.rank) + " stream " + std::to_string(index) + " (" +
                                  std::string(what) + ")"});
  }

  // A compute-stream GPU task: takes the pending start edges.
  graph::task_id on_compute(rank_state& rs, graph::task_kind k, time_ns d, string_id name) {
    const graph::task_id t = add(rs.info.compute, k, d, name, rs.info.rank);
    for (const graph::task_id from : rs.pending) g_->add_edge(from, t, 0, graph::edge_kind::dependency);
    rs.pending.clear();
    if (rs.info.pipeline_first == graph::no_task && in_pipeline_) rs.info.pipeline_first = t;
    return t;
  }

  // Launches of GPU task `gpu_task`, which stands for `kernels` kernels. At the `kernel`
  // granularity: one CPU task per GPU task, right away. At `pass`: batched, one CPU task per
  // pipeline op (see `flush_launches`). Launch edges count from the call's start, as the trace
  // builder's do: the GPU task may start once its (first) kernel's launch has run.
  void launched(rank_state& rs, graph::task_id gpu_task, time_ns cpu, time_ns lead) {
    if (opt_.detail == granularity::pass) {
      rs.launches.push_back({gpu_task, cpu, lead});
      return;
    }
    const graph::task_id l = add(rs.info.cpu, graph::task_kind::cpu, cpu, n_launch_, rs.info.rank);
    g_->add_edge(l, gpu_task, lead, graph::edge_kind::launch, graph::edge_flags::from_start);
    if (notes_) rs.cpu_tasks.push_back(l);
  }

  // ---- notes (kernel-level traces) ----

  static void note_task(std::vector<std::uint32_t>& v, graph::task_id t, std::uint32_t value) {
    if (v.size() <= t) v.resize(static_cast<std::size_t>(t) + 1, program_notes::none);
    v[t] = value;
  }

  [[nodiscard]] std::size_t span_mark(const rank_state& rs) const { return rs.cpu_tasks.size(); }

  // The CPU tasks of `rs` created since `mark` as one span.
  void span_close(const rank_state& rs, span_kind kind, int index, std::size_t mark) {
    if (!notes_ || rs.cpu_tasks.size() <= mark) return;
    out_->notes.spans.push_back({rs.info.rank, kind, index, rs.cpu_tasks[mark], rs.cpu_tasks.back()});
  }

  // One CPU task for the batched launches, as long as all of them; each GPU task's launch edge is
  // the host time before its run plus the run's lead — the timing one launch per kernel gives.
  void flush_launches(rank_state& rs) {
    if (rs.launches.empty()) return;
    time_ns total = 0;
    for (const auto& l : rs.launches) total += l.cpu;
    const graph::task_id cpu = add(rs.info.cpu, graph::task_kind::cpu, total, n_launch_, rs.info.rank);
    if (notes_) rs.cpu_tasks.push_back(cpu);
    time_ns before = 0;
    for (const auto& l : rs.launches) {
      g_->add_edge(cpu, l.gpu, before + l.lead, graph::edge_kind::launch, graph::edge_flags::from_start);
      before += l.cpu;
    }
    rs.launches.clear();
  }

  // The launching thread blocks until `gpu_task` has finished (a device-to-host read or a
  // synchronize): a zero-length CPU task with a sync edge, after the launches queued so far.
  void host_wait(rank_state& rs, graph::task_id gpu_task) {
    if (gpu_task == graph::no_task) return;
    flush_launches(rs);
    const graph::task_id w = add(rs.info.cpu, graph::task_kind::cpu, 0, n_host_sync_, rs.info.rank);
    g_->add_edge(gpu_task, w, 0, graph::edge_kind::sync);
    if (notes_) rs.cpu_tasks.push_back(w), out_->notes.host_syncs.push_back(w);
  }

  struct collective_tasks {
    graph::task_id arrive = graph::no_task;
    graph::task_id complete = graph::no_task;
  };

  // One participant's share of a collective of group `gs` (its `seq`-th), on `stream_id`.
  collective_tasks collective(rank_state& rs, graph::processor_id stream_id, group_state& gs, std::int64_t& seq,
                              std::string_view kind, std::int64_t bytes, time_ns duration, string_id name,
                              std::int32_t kernels = 1, time_ns cpu = -1, time_ns lead = -1, std::int64_t element_bytes = 2) {
    collective_tasks c;
    if (stream_id == rs.info.compute) {
      c.arrive = on_compute(rs, graph::task_kind::comm_arrive, 0, name);
    } else {
      c.arrive = add(stream_id, graph::task_kind::comm_arrive, 0, name, rs.info.rank);
    }
    // The complete right after its arrive (task ids: arrive + 1), which reports rely on.
    c.complete = add(stream_id, graph::task_kind::comm_complete, duration, name, rs.info.rank);
    if (cpu < 0) cpu = collective_cpu_ * kernels;
    launched(rs, c.arrive, cpu, lead < 0 ? cpu : lead);
    if (notes_) {
      out_->notes.comms.push_back({gs.type, element_bytes});
      const auto idx = static_cast<std::uint32_t>(out_->notes.comms.size() - 1);
      note_task(out_->notes.comm_of_task, c.arrive, idx);
      note_task(out_->notes.comm_of_task, c.complete, idx);
    }
    const auto k = static_cast<std::size_t>(seq++);
    graph::task_id join = graph::no_task;
    if (gs.participants > 1) {
      if (gs.joins.size() <= k) {
        if (gs.barrier == no_processor) {
          gs.barrier = g_->add_processor({graph::processor_kind::barrier, gs.ranks.front(),
                                          static_cast<std::int64_t>(&gs - groups_.data()), 0,
                                          opt_.names ? "group " + gs.name : std::string()});
        }
        gs.joins.push_back(add(gs.barrier, graph::task_kind::join, 0, n_join_, gs.ranks.front()));
      }
      join = gs.joins[k];
      g_->add_edge(c.arrive, join, 0, graph::edge_kind::collective);
      g_->add_edge(join, c.complete, 0, graph::edge_kind::collective);
    }
    if (opt_.record_collectives) {
      if (gs.instances.size() <= k) {
        graph::collective_instance ci;
        ci.kind = std::string(kind);
        ci.group = gs.name;
        ci.group_ranks = gs.ranks;
        ci.bytes = bytes;
        ci.sequence = static_cast<std::int64_t>(k);
        ci.join = join;
        ci.match = opt_.unfold ? "model (every rank)" : "model (folded: one rank per stage)";
        ci.arrive.reserve(static_cast<std::size_t>(gs.participants));
        ci.complete.reserve(static_cast<std::size_t>(gs.participants));
        g_->collectives.push_back(std::move(ci));
        gs.instances.push_back(static_cast<std::uint32_t>(g_->collectives.size() - 1));
      }
      auto& ci = g_->collectives[gs.instances[k]];
      ci.arrive.push_back(c.arrive);
      ci.complete.push_back(c.complete);
    }
    return c;
  }

  // ---- compute-stream items ----

  // `cpu`: host time of its dispatch; `lead`: its launch edge from the dispatch's start.
  void emit_compute(rank_state& rs, time_ns d, time_ns cpu, time_ns lead, string_id name,
                    std::uint32_t op = program_notes::none) {
    const graph::task_id t = on_compute(rs, graph::task_kind::gpu_compute, d, name);
    launched(rs, t, cpu, lead);
    rs.last_compute = t;
    if (notes_ && op != program_notes::none) note_task(out_->notes.op_of_task, t, op);
  }

  void emit_tp_collective(rank_state& rs, std::string_view kind, std::int64_t bytes, time_ns d, string_id name,
                          std::int32_t kernels, time_ns cpu, time_ns lead, std::int64_t element_bytes = 2) {
    group_state& gs = group(group_type::tp, rs.info.stage, rs.info.dp_index);
    const collective_tasks c =
        collective(rs, rs.info.compute, gs, rs.seq_tp, kind, bytes, d, name, kernels, cpu, lead, element_bytes);
    rs.last_compute = c.complete;
  }

  // `layer` >= 0: the items are transformer layer `layer` of its chunk, in a `forward` pass or
  // not (then its recomputed forward ops, if any, form a span of their own).
  void emit_items(rank_state& rs, const std::vector<item>& items, int layer = -1, bool forward = false) {
    const std::size_t mark = span_mark(rs);
    std::size_t recompute_mark = 0;
    bool in_recompute = false;
    for (const item& i : items) {
      if (layer >= 0 && !forward && i.recompute != in_recompute && !i.comm) {
        if (i.recompute) {
          recompute_mark = span_mark(rs);
        } else {
          span_close(rs, span_kind::layer_recompute, layer, recompute_mark);
        }
        in_recompute = i.recompute;
      }
      if (i.comm) {
        emit_tp_collective(rs, collective_kind_name(i.kind), i.bytes, i.duration, i.name, 1, i.cpu, i.cpu, i.element_bytes);
      } else {
        emit_compute(rs, i.duration, i.cpu, i.cpu, i.name, i.op);
      }
    }
    if (in_recompute) span_close(rs, span_kind::layer_recompute, layer, recompute_mark);
    if (layer >= 0 && forward) span_close(rs, span_kind::layer, layer, mark);
  }

  // A run of items as (at most) one compute task then one coalesced TP collective: the host time
  // goes with the first of them, whose launch edge is the run's `lead` (see `totals`); the
  // second is queued behind it on the same stream.
  void emit_totals(rank_state& rs, const totals& t, pass_kind pk) {
    const auto k = static_cast<std::size_t>(pk);
    if (t.compute_kernels > 0) {
      const std::size_t at = rs.launches.size();
      emit_compute(rs, t.compute, t.cpu, t.lead, n_pass_compute_[k]);
      if (t.comm_kernels > 0) {
        // Queued behind the compute task, its launch must not bind: the run's collectives were
        // launched among its kernels, not after the run's whole host time (which, on a host-bound
        // pass, would start them only once the host is done). Its launch record goes before the
        // compute task's, at the same lead.
        emit_tp_collective(rs, "coalesced", t.comm_bytes, t.comm, n_pass_comm_[k], t.comm_kernels, 0, t.lead);
        if (rs.launches.size() == at + 2) std::swap(rs.launches[at], rs.launches[at + 1]);
      }
    } else if (t.comm_kernels > 0) {
      emit_tp_collective(rs, "coalesced", t.comm_bytes, t.comm, n_pass_comm_[k], t.comm_kernels, t.cpu, t.lead);
    }
  }

  // The segments of a chunk pass in execution order.
  void segments_of(pass_kind pk, bool first, bool last, std::vector<segment>& out) const {
    const auto k = static_cast<std::size_t>(pk);
    out.clear();
    if (pk == pass_kind::forward) {
      if (first) out.push_back({&embed_items_[k], embed_params_});
      for (int l = 0; l < layers_per_chunk_; ++l) out.push_back({&layer_items_[k], layer_params_});
      if (last) out.push_back({&head_items_[k], head_params_});
    } else {
      if (last) out.push_back({&head_items_[k], head_params_});
      for (int l = 0; l < layers_per_chunk_; ++l) out.push_back({&layer_items_[k], layer_params_});
      if (first) out.push_back({&embed_items_[k], embed_params_});
    }
  }

  // A pass of a chunk; `buckets` (or null) lists the gradient buckets whose reduction starts
  // after one of its segments.
  void emit_pass(rank_state& rs, pass_kind pk, bool first, bool last,
                 const std::vector<std::pair<int, std::int64_t>>* buckets) {
    const auto k = static_cast<std::size_t>(pk);
    if (buckets == nullptr && opt_.detail == granularity::pass) {
      emit_totals(rs, pass_totals_[k][first][last], pk);
      ensure_task(rs);
      return;
    }
    segments_of(pk, first, last, segments_scratch_);
    std::size_t next_bucket = 0;
    // Layers of the chunk in model order (backward passes run them last first).
    int layers_seen = 0;
    for (std::size_t si = 0; si < segments_scratch_.size(); ++si) {
      const segment& seg = segments_scratch_[si];
      const graph::task_id before = rs.last_compute;
      if (opt_.detail == granularity::kernel) {
        const bool is_layer = seg.items == &layer_items_[k];
        const int layer = !is_layer ? -1 : pk == pass_kind::forward ? layers_seen : layers_per_chunk_ - 1 - layers_seen;
        layers_seen += is_layer ? 1 : 0;
        emit_items(rs, *seg.items, layer, pk == pass_kind::forward);
      } else {
        totals t;
        t.add(*seg.items);
        emit_totals(rs, t, pk);
      }
      if (buckets != nullptr) {
        while (next_bucket < buckets->size() && (*buckets)[next_bucket].first == static_cast<int>(si)) {
          // A segment without work still marks the point its gradients are final.
          if (rs.last_compute == before || !rs.pending.empty()) {
            rs.last_compute = on_compute(rs, graph::task_kind::gpu_compute, 0, n_pass_compute_[static_cast<std::size_t>(pk)]);
          }
          reduce_gradients(rs, (*buckets)[next_bucket].second, rs.last_compute);
          ++next_bucket;
        }
      }
    }
    ensure_task(rs);
  }
  std::vector<segment> segments_scratch_;

  // Guarantees the op produced at least one compute-stream task (a pass with no work still
  // needs an anchor for its edges).
  void ensure_task(rank_state& rs) {
    if (rs.last_compute == graph::no_task || !rs.pending.empty()) {
      const graph::task_id t = on_compute(rs, graph::task_kind::gpu_compute, 0, n_pass_compute_[0]);
      rs.last_compute = t;
    }
  }

  // ---- data parallelism ----

  graph::processor_id dp_stream(rank_state& rs) {
    if (rs.info.data_parallel == no_processor) rs.info.data_parallel = stream(rs.info, 13, "data-parallel");
    return rs.info.data_parallel;
  }

  // Reduction of `params` gradients that are final once `after` ends: all-reduce (no ZeRO) or
  // reduce-scatter (ZeRO ≥ 1).
  void reduce_gradients(rank_state& rs, std::int64_t params, graph::task_id after) {
    if (dp_ <= 1 || params <= 0) return;
    group_state& gs = group(group_type::dp, rs.info.stage, rs.info.tp_index);
    const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.grad_reduce_bytes);
    const model::collective kind = par_.zero_stage >= 1 ? model::collective::reduce_scatter : model::collective::all_reduce;
    const time_ns d = comm_.collective_time({kind, bytes, gs.placement}, hw_);
    const collective_tasks c = collective(rs, dp_stream(rs), gs, rs.seq_dp, collective_kind_name(kind), bytes, d,
                                          par_.zero_stage >= 1 ? n_grad_rs_ : n_grad_ar_, 1, -1, -1,
                                          static_cast<std::int64_t>(opt_.grad_reduce_bytes));
    if (after != graph::no_task) g_->add_edge(after, c.arrive, 0, graph::edge_kind::dependency);
    rs.last_dp = c.complete;
  }

  // ZeRO all-gather of `params` parameters on the data-parallel stream.
  collective_tasks gather_parameters(rank_state& rs, std::int64_t params, graph::task_id after) {
    group_state& gs = group(group_type::dp, rs.info.stage, rs.info.tp_index);
    const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.param_gather_bytes);
    const time_ns d = comm_.collective_time({model::collective::all_gather, bytes, gs.placement}, hw_);
    const collective_tasks c = collective(rs, dp_stream(rs), gs, rs.seq_dp, "allgather", bytes, d, n_param_ag_, 1, -1, -1,
                                          static_cast<std::int64_t>(opt_.param_gather_bytes));
    if (after != graph::no_task) g_->add_edge(after, c.arrive, 0, graph::edge_kind::dependency);
    rs.last_dp = c.complete;
    return c;
  }

  // ---- pipeline p2p ----

  [[nodiscard]] time_ns p2p_duration(int sender_stage, int col) const {
    return opt_.unfold ? p2p_time(sender_stage, col) : p2p_folded_[static_cast<std::size_t>(sender_stage)];
  }

  // ================================================================================= one rank

  bool in_pipeline_ = false;

  // The end of a traced iteration: the host waits for every stream of the rank (Megatron reads the
  // loss back; a profiler step ends on the host), so a faster GPU shortens the step. Zero long at
  // the device's completion: the timeline is unchanged.
  void final_device_sync(rank_state& rs, graph::task_id rank_first) {
    flush_launches(rs);
    std::vector<std::pair<graph::processor_id, graph::task_id>> last;
    for (graph::task_id t = rank_first; t < g_->task_count(); ++t) {
      const graph::processor_id p = g_->processor[t];
      if (g_->processors[p].kind != graph::processor_kind::gpu_stream || g_->rank[t] != rs.info.rank) continue;
      auto it = std::find_if(last.begin(), last.end(), [&](const auto& x) { return x.first == p; });
      if (it == last.end()) {
        last.emplace_back(p, t);
      } else {
        it->second = t;
      }
    }
    if (last.empty()) return;
    const graph::task_id w = add(rs.info.cpu, graph::task_kind::cpu, 0, n_host_sync_, rs.info.rank);
    for (const auto& [p, t] : last) g_->add_edge(t, w, 0, graph::edge_kind::sync);
    rs.cpu_tasks.push_back(w);
    out_->notes.host_syncs.push_back(w);
  }

  void emit_rank(program& out, int rank) {
    const graph::task_id rank_first = g_->task_count();
    rank_state rs;
    simulated_rank& r = rs.info;
    r.rank = rank;
    r.stage = rank / (tp_ * dp_);
    r.dp_index = (rank % (tp_ * dp_)) / tp_;
    r.tp_index = rank % tp_;
    const int s = r.stage;
    const int col = rank % (tp_ * dp_);
    // pid = tid = 10000 + rank: the main thread of a process, distinct from the device numbers
    // that GPU rows use as pid in a Kineto trace.
    r.cpu = g_->add_processor({graph::processor_kind::cpu_thread, rank, 10000 + rank, 10000 + rank,
                               opt_.names ? "rank " + std::to_string(rank) + " launch thread" : std::string()});
    r.compute = stream(r, 7, "compute");
    if (dp_ > 1 || (m_.tied_embeddings && pp_ > 1 && (s == 0 || s == pp_ - 1))) (void)dp_stream(rs);
    if (pp_ > 1) {
      r.send_next = stream(r, 21, "pipeline send to next stage");
      r.send_prev = stream(r, 22, "pipeline send to previous stage");
      r.recv_prev = stream(r, 23, "pipeline receive from previous stage");
      r.recv_next = stream(r, 24, "pipeline receive from next stage");
    }

    const auto& order = (*orders_)[static_cast<std::size_t>(s)];
    const auto& final_grad = final_grad_[static_cast<std::size_t>(s)];
    const int virtual_stages = pp_ * shape_.chunks;
    const pipeline::op_kind grad_kind = split_ ? pipeline::op_kind::weight : pipeline::op_kind::backward;

    auto pass_of = [&](const pipeline::op& o) {
      switch (o.kind) {
        case pipeline::op_kind::forward: return pass_kind::forward;
        case pipeline::op_kind::backward: return split_ ? pass_kind::input_grad : pass_kind::backward;
        case pipeline::op_kind::weight: return pass_kind::weight_grad;
      }
      return pass_kind::forward;
    };
    auto needs_params = [&](const pipeline::op& o) { return o.kind != pipeline::op_kind::weight; };
    auto chunk_role = [&](const pipeline::op& o) {
      const int vs = o.chunk * pp_ + s;
      return std::pair<bool, bool>{vs == 0, vs == virtual_stages - 1};
    };

    in_pipeline_ = true;
    collective_tasks prefetched{};  // ZeRO-3: the all-gather for the next op
    if (zero3_ && !order.empty()) {
      const auto [f, l] = chunk_role(order[0]);
      prefetched = gather_parameters(rs, chunk_params_[f][l], graph::no_task);
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      const pipeline::op& o = order[i];
      const auto [first, last] = chunk_role(o);
      // Receive the input if it comes from another stage.
      if (const auto dep = pipeline::dependency_of(shape_, s, o); dep && dep->crosses_stages(s)) {
        const bool fwd = o.kind == pipeline::op_kind::forward;
        const int sender = dep->on.stage;
        group_state& gs = group(fwd ? group_type::act : group_type::grad, fwd ? sender : s, col);
        const collective_tasks c =
            collective(rs, fwd ? r.recv_prev : r.recv_next, gs, fwd ? rs.seq_act_in : rs.seq_grad_in, "send_recv",
                       p2p_bytes_, p2p_duration(fwd ? sender : s, col), fwd ? n_recv_fwd_ : n_recv_bwd_);
        rs.pending.push_back(c.complete);
        if (opt_.p2p_host_sync) {
          // torch.cuda.synchronize(): the device drains (the previous pass, the transfer).
          host_wait(rs, c.complete);
          if (rs.last_compute != graph::no_task) host_wait(rs, rs.last_compute);
        }
      }
      if (zero3_ && needs_params(o) && prefetched.complete != graph::no_task) {
        rs.pending.push_back(prefetched.complete);
        prefetched = {};
      }
      const bool bucketed = final_grad[i] != 0 && opt_.overlap_grad_reduce && par_.zero_stage <= 1 && dp_ > 1;
      const std::size_t pass_mark = span_mark(rs);
      emit_pass(rs, pass_of(o), first, last, bucketed ? &buckets_[first][last] : nullptr);
      span_close(rs, o.kind == pipeline::op_kind::forward ? span_kind::forward : span_kind::backward, o.micro_batch, pass_mark);
      const graph::task_id done = rs.last_compute;
      // Send the output if another stage consumes it.
      const int vs = o.chunk * pp_ + s;
      if (o.kind == pipeline::op_kind::forward && vs < virtual_stages - 1) {
        group_state& gs = group(group_type::act, s, col);
        const collective_tasks c = collective(rs, r.send_next, gs, rs.seq_act_out, "send_recv", p2p_bytes_,
                                              p2p_duration(s, col), n_send_fwd_);
        g_->add_edge(done, c.arrive, 0, graph::edge_kind::dependency);
      } else if (o.kind == pipeline::op_kind::backward && vs > 0) {
        const int receiver = (s - 1 + pp_) % pp_;
        group_state& gs = group(group_type::grad, receiver, col);
        const collective_tasks c = collective(rs, r.send_prev, gs, rs.seq_grad_out, "send_recv", p2p_bytes_,
                                              p2p_duration(receiver, col), n_send_bwd_);
        g_->add_edge(done, c.arrive, 0, graph::edge_kind::dependency);
      }
      // ZeRO-3: prefetch the next op's parameters, then reduce-scatter this op's gradients.
      if (zero3_ && i + 1 < order.size() && needs_params(order[i + 1])) {
        const auto [f2, l2] = chunk_role(order[i + 1]);
        prefetched = gather_parameters(rs, chunk_params_[f2][l2], graph::no_task);
      }
      if (par_.zero_stage >= 2 && o.kind == grad_kind) reduce_gradients(rs, chunk_params_[first][last], done);
      flush_launches(rs);
    }
    in_pipeline_ = false;
    r.pipeline_last = rs.last_compute;

    // Gradient buckets that did not overlap the backward.
    if (par_.zero_stage <= 1 && dp_ > 1 && !opt_.overlap_grad_reduce) {
      graph::task_id after = r.pipeline_last;
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (final_grad[i] == 0) continue;
        const auto [first, last] = chunk_role(order[i]);
        for (const auto& b : buckets_[first][last]) {
          reduce_gradients(rs, b.second, after);
          after = graph::no_task;
        }
      }
    }
    // Tied embeddings across stages: the first and last stage add their gradients.
    if (opt_.forward_only) {
      flush_launches(rs);
      if (notes_) final_device_sync(rs, rank_first);
      out.ranks.push_back(r);
      return;
    }
    if (m_.tied_embeddings && pp_ > 1 && (s == 0 || s == pp_ - 1)) {
      group_state& gs = group(group_type::embd, col, 0);
      const auto bytes = static_cast<std::int64_t>(static_cast<double>(m_.vocab * m_.hidden / tp_) * opt_.grad_reduce_bytes);
      const time_ns d = comm_.collective_time({model::collective::all_reduce, bytes, gs.placement}, hw_);
      const collective_tasks c = collective(rs, dp_stream(rs), gs, rs.seq_embd, "allreduce", bytes, d, n_embd_ar_, 1, -1, -1,
                                            static_cast<std::int64_t>(opt_.grad_reduce_bytes));
      g_->add_edge(r.pipeline_last, c.arrive, 0, graph::edge_kind::dependency);
      rs.last_dp = c.complete;
    }
    if (rs.last_dp != graph::no_task) rs.pending.push_back(rs.last_dp);

    // Optimizer: local gradient norm, its all-reduce, the Adam step.
    const model::op_list& opt_ops = optimizer_[static_cast<std::size_t>(s)];
    graph::task_id step = graph::no_task;
    const std::size_t optimizer_mark = span_mark(rs);
    for (const model::op_cost& o : opt_ops.ops) {
      const time_ns cpu = o.cpu >= 0 ? o.cpu : launch_cost_ * o.kernels;
      emit_compute(rs, o.duration, cpu, cpu, intern(o.name), note_op(o));
      step = rs.last_compute;
      if (o.role == model::op_role::found_inf) {
        // found_inf is all-reduced over the model-parallel group, then read by the host.
        group_state& gs = group(group_type::norm, r.dp_index, 0);
        if (gs.ranks.size() > 1) {
          const time_ns d = comm_.collective_time({model::collective::all_reduce, 4, gs.placement}, hw_);
          const collective_tasks c = collective(rs, r.compute, gs, rs.seq_norm, "allreduce", 4, d, n_norm_ar_, 1, -1, -1, 4);
          rs.last_compute = c.complete;
        }
        if (opt_.loss_scale_host_sync) host_wait(rs, rs.last_compute);
      }
      if (o.role == model::op_role::grad_norm) {
        group_state& gs = group(group_type::norm, r.dp_index, 0);
        if (gs.ranks.size() > 1) {
          const time_ns d = comm_.collective_time({model::collective::all_reduce, 4, gs.placement}, hw_);
          const collective_tasks c = collective(rs, r.compute, gs, rs.seq_norm, "allreduce", 4, d, n_norm_ar_, 1, -1, -1, 4);
          rs.last_compute = c.complete;
        }
      }
    }
    ensure_task(rs);
    if (step == graph::no_task) step = rs.last_compute;
    // ZeRO-1/2: gather the updated parameter shards, bucket by bucket.
    if ((par_.zero_stage == 1 || par_.zero_stage == 2) && dp_ > 1) {
      graph::task_id after = step;
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (final_grad[i] == 0) continue;
        const auto [first, last] = chunk_role(order[i]);
        for (const auto& b : buckets_[first][last]) {
          (void)gather_parameters(rs, b.second, after);
          after = graph::no_task;
        }
      }
    }
    flush_launches(rs);
    span_close(rs, span_kind::optimizer, 0, optimizer_mark);
    if (notes_) final_device_sync(rs, rank_first);
    out.ranks.push_back(r);
  }
};

}  // namespace detail

/// Builds the execution graph of one training iteration of `j` (see the header comment for
/// what it contains). `compute` gives per-op durations (`model::ComputeModel`), `comm` the
/// transfer times (`model::CommModel`). Throws `lumos::error` with a one-line reason for an
/// invalid configuration (model shape, divisibility by tp and pp·vp, global batch, schedule
/// constraints, unsupported precision). Time and memory are linear in the tasks built:
/// per simulated rank, (schedule ops) × (ops per pass at `kernel`, about 4 at `pass`).
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
[[nodiscard]] program build_program(const job& j, const program_options& opt = {}, const Compute& compute = {},
                                    const Comm& comm = {}) {
  detail::program_builder<Compute, Comm> b(j, opt, compute, comm);
  return b.build();
}

/// `build_program` into `out`, whose graph arrays keep their capacity: in a loop over
/// configurations (a sweep workspace) the large arrays are allocated once. `out` is overwritten
/// (its string table is kept, see `program_builder::clear`). Same graph as `build_program`.
template <model::ComputeModel Compute = model::roofline, model::CommModel Comm = model::ring_alpha_beta>
void build_program_into(program& out, const job& j, const program_options& opt = {}, const Compute& compute = {},
                        const Comm& comm = {}) {
  detail::program_builder<Compute, Comm> b(j, opt, compute, comm);
  b.build(out);
}

}  // namespace lumos::synth

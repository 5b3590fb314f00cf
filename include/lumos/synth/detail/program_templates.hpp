#pragma once
// program_builder: interned names and the pass templates (the items of one layer, the embedding
// and the head per pass kind, their totals, the gradient buckets, the optimizer per stage).

#include <lumos/synth/detail/program_builder.hpp>

#include <numeric>

namespace lumos::synth::detail {

// A compiled program has no names: every id is the empty name's.
template <model::ComputeModel Compute, model::CommModel Comm>
string_id program_builder<Compute, Comm>::intern(std::string_view s) {
  return direct_ ? n_unnamed_ : g_->strings.intern(s);
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::intern_names() {
  if (direct_) {
    n_unnamed_ = n_launch_ = n_join_ = n_send_fwd_ = n_recv_fwd_ = n_send_bwd_ = n_recv_bwd_ = 0;
    n_grad_ar_ = n_grad_rs_ = n_param_ag_ = n_embd_ar_ = n_norm_ar_ = n_host_sync_ = 0;
    n_pass_compute_.fill(0);
    n_pass_comm_.fill(0);
    return;
  }
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

template <model::ComputeModel Compute, model::CommModel Comm>
bool program_builder<Compute, Comm>::in_pass(const model::op_cost& o, pass_kind pk) noexcept {
  switch (pk) {
    case pass_kind::forward: return o.phase == model::op_phase::forward;
    case pass_kind::input_grad: return o.phase == model::op_phase::backward_input;
    case pass_kind::weight_grad: return o.phase == model::op_phase::backward_weight;
    case pass_kind::backward:
      return o.phase == model::op_phase::backward_input || o.phase == model::op_phase::backward_weight;
  }
  return false;
}

template <model::ComputeModel Compute, model::CommModel Comm>
std::uint32_t program_builder<Compute, Comm>::note_op(const model::op_cost& o) {
  if (!notes_) return program_notes::none;
  out_->notes.ops.push_back(o);
  return static_cast<std::uint32_t>(out_->notes.ops.size() - 1);
}

template <model::ComputeModel Compute, model::CommModel Comm>
item program_builder<Compute, Comm>::compute_item(const model::op_cost& o) {
  if (!opt_.names) {
    item i;
    i.duration = o.duration;
    i.kernels = o.kernels;
    i.cpu = o.cpu >= 0 ? o.cpu : launch_cost_ * o.kernels;
    i.name = n_unnamed_;
    i.op = note_op(o);
    i.recompute = o.recompute;
    i.host_sync = o.host_sync;
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
  i.host_sync = o.host_sync;
  i.recompute = o.recompute;
  return i;
}

template <model::ComputeModel Compute, model::CommModel Comm>
item program_builder<Compute, Comm>::comm_item(std::string_view name, model::collective c, std::int64_t bytes,
                                               std::int64_t element_bytes, const model::group_placement* placement) {
  item i;
  i.comm = true;
  i.element_bytes = element_bytes > 0 ? element_bytes : static_cast<std::int64_t>(model::activation_bytes(par_.dtype));
  i.name = opt_.names ? intern(name) : n_unnamed_;
  i.kind = c;
  i.bytes = bytes;
  i.duration = comm_.collective_time({c, bytes, placement != nullptr ? *placement : tp_placement_}, hw_);
  i.cpu = collective_cpu_;
  return i;
}

template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::layer_hooks() const -> std::span<const hook> {
  if (tp_ <= 1) return {};
  using R = model::op_role;
  static constexpr std::array<hook, 4> all_reduce = {{{R::attn_out, hook_phase::fwd, true, "attn_out_proj_all_reduce"},
                                                      {R::mlp_out, hook_phase::fwd, true, "mlp_out_all_reduce"},
                                                      {R::mlp_in, hook_phase::dgrad, true, "mlp_in_dgrad_all_reduce"},
                                                      {R::qkv, hook_phase::dgrad, true, "qkv_dgrad_all_reduce"}}};
  if (!par_.sp) return all_reduce;
  // The input re-gather precedes the first weight-gradient GEMM of the MLP input in backward
  // order: fc1, or the up GEMM of a gated MLP (backward runs down, act, up, gate).
  // TE overlaps the re-gathers with the dgrad GEMM and the dgrad reduce-scatters with the
  // wgrad GEMM (bulk); both GEMMs of a linear layer have the same FLOPs, so the hook's own GEMM
  // stands for its partner.
  constexpr auto bulk = overlap_kind::bulk;
  auto sp_hooks = [](R first_input_wgrad) {
    return std::array<hook, 10>{{{R::qkv, hook_phase::fwd, false, "qkv_input_all_gather"},
                                 {R::attn_out, hook_phase::fwd, true, "attn_out_proj_reduce_scatter"},
                                 {R::mlp_in, hook_phase::fwd, false, "mlp_input_all_gather"},
                                 {R::mlp_out, hook_phase::fwd, true, "mlp_out_reduce_scatter"},
                                 {R::mlp_out, hook_phase::dgrad, false, "mlp_out_grad_all_gather"},
                                 {first_input_wgrad, hook_phase::wgrad, false, "mlp_input_regather", bulk},
                                 {R::mlp_in, hook_phase::dgrad, true, "mlp_in_dgrad_reduce_scatter", bulk},
                                 {R::attn_out, hook_phase::dgrad, false, "attn_out_proj_grad_all_gather"},
                                 {R::qkv, hook_phase::wgrad, false, "qkv_input_regather", bulk},
                                 {R::qkv, hook_phase::dgrad, true, "qkv_dgrad_reduce_scatter", bulk}}};
  };
  static constexpr std::array<hook, 10> gelu = sp_hooks(R::mlp_in), gated = sp_hooks(R::mlp_up);
  return m_.mlp == model::mlp_kind::gelu ? std::span<const hook>(gelu) : std::span<const hook>(gated);
}

// The part of a TP collective of `comm` ns that its GEMM of `gemm` ns does not hide. Ring:
// the tp chunks of the GEMM alternate with tp - 1 exchange steps, max(gemm, comm + gemm/tp)
// in all; bulk: max(gemm, comm). The collective's task keeps the remainder, so the kernel and
// pass granularities fold it alike. Not modelled: the GEMM slowing down beside the
// exchange's SMs and the split GEMM's lower efficiency.
template <model::ComputeModel Compute, model::CommModel Comm>
time_ns program_builder<Compute, Comm>::exposed_tp_comm(time_ns comm, time_ns gemm, overlap_kind k) const noexcept {
  const time_ns hidden = k == overlap_kind::bulk ? gemm : gemm - gemm / tp_;
  return std::max<time_ns>(0, comm - hidden);
}

template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::phase_of(const model::op_cost& o) noexcept -> hook_phase {
  if (o.phase == model::op_phase::forward || o.recompute) return hook_phase::fwd;
  return o.phase == model::op_phase::backward_weight ? hook_phase::wgrad : hook_phase::dgrad;
}

// The token-dispatch collectives of a MoE layer around its permutation and unpermutation
// (model::moe_layer_collectives lists them with their positions), timed over their own group's
// placement. They are items on the compute stream like the TP collectives: nothing in the
// layer can run while its tokens travel. The all-to-alls join over the rank's expert-parallel
// group (`expert_parallel` items), the expert-TP ones over its TP group, or its expert-TP group
// where that is smaller (`expert_tp` items), in an unfolded build
// (every rank of an EP group runs the same layer at the same point, so its peers arrive
// together); in a folded build the model's time over the group's placement is the whole of it.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_moe_collectives(const model::op_cost& o, bool after, std::vector<item>& out) {
  using H = model::moe_hook;
  const bool permute = o.role == model::op_role::moe_permute, unpermute = o.role == model::op_role::moe_unpermute;
  if (!permute && !unpermute) return;
  const hook_phase ph = phase_of(o);
  if (ph == hook_phase::wgrad) return;
  H want{};
  if (ph == hook_phase::fwd) {
    want = permute ? (after ? H::after_permute : H::before_permute) : (after ? H::after_unpermute : H::before_unpermute);
  } else {
    want = permute ? (after ? H::after_permute_grad : H::before_permute_grad)
                   : (after ? H::after_unpermute_grad : H::before_unpermute_grad);
  }
  for (const model::moe_collective& c : buf_.moe_collectives) {
    if (c.hook != want) continue;
    out.push_back(comm_item(c.name, c.kind, c.bytes, 0, &moe_placement_[static_cast<std::size_t>(c.group)]));
    out.back().expert_parallel = c.group == model::moe_group::ep;
    out.back().expert_tp = c.group == model::moe_group::tp && own_expert_tp();
  }
}

// The key/value exchange of context parallelism around the attention core (`o`, the first op
// of the attention role in a run of them; a forward or recomputed forward, or its backward),
// timed over the CP group's placement by `model::context_parallel_exchange`. The ring (p2p) is
// Transformer Engine's: NCCL send/recv of the K/V chunks (and dK/dV in backward) on a stream of
// its own beside the attention, which consumes each chunk as it arrives. One item stands for the
// ring's cp - 1 steps, `beside` the attention: launched right before it, the op after the
// attention waits for it (its bytes: what a rank sends; emit_beside places it). The all-gather
// variant goes whole before the forward attention, its reduce-scatter after the backward one,
// collectives over the CP group on the compute stream, as the MoE dispatch's over its group.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_cp_exchange(const model::op_cost& o, bool after, std::vector<item>& out) {
  if (par_.cp <= 1 || o.role != model::op_role::attention) return;
  const hook_phase ph = phase_of(o);
  if (ph == hook_phase::wgrad) return;
  const model::cp_exchange& x = cp_exchange_[ph == hook_phase::fwd ? 0 : 1];
  if (after != (!x.overlapped && ph != hook_phase::fwd)) return;
  const model::group_placement cp_group = model::context_parallel_group(par_, hw_);
  item i = comm_item(x.name, x.kind, x.bytes, 2, &cp_group);
  i.duration = x.duration;
  if (x.overlapped) {
    i.beside = true;
    i.bytes = model::context_parallel_kv_bytes(m_, par_) * (par_.cp - 1) * (ph == hook_phase::fwd ? 1 : 2);
  } else {
    i.context_parallel = true;
  }
  out.push_back(i);
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::layer_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
  const std::vector<model::tp_collective>& collectives = buf_.tp_collectives;
  const std::span<const hook> hooks = layer_hooks();
  out.clear();
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
  bool in_attention = false;  // the previous op of the pass was of the attention role
  for (const model::op_cost& o : ops.ops) {
    if (!in_pass(o, pk)) continue;
    const bool first_attention = o.role == model::op_role::attention && !in_attention;
    in_attention = o.role == model::op_role::attention;
    emit_hooks(o, false);
    emit_moe_collectives(o, false, out);
    if (first_attention) emit_cp_exchange(o, false, out);
    out.push_back(compute_item(o));
    if (first_attention) emit_cp_exchange(o, true, out);
    emit_moe_collectives(o, true, out);
    emit_hooks(o, true);
  }
}

// Embedding and head: their TP collectives (Megatron's vocabulary-parallel embedding,
// output layer and cross-entropy, and the multi-token-prediction modules').
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::embed_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
  out.clear();
  for (const model::op_cost& o : ops.ops) {
    if (!in_pass(o, pk)) continue;
    embedding_collectives(o, false, out);
    out.push_back(compute_item(o));
    embedding_collectives(o, true, out);
  }
}

// The vocabulary-parallel embedding's collectives before (`after` false) or after a lookup op:
// the all-reduce (SP: reduce-scatter) of its output, and with SP the all-gather of its output
// gradient before the scatter-add. A multi-token-prediction module looks its shifted tokens up
// in the same embedding module, so its lookup has the same collectives.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::embedding_collectives(const model::op_cost& o, bool after, std::vector<item>& out) {
  const bool mtp = o.role == model::op_role::mtp_embedding;
  if (tp_ <= 1 || (!mtp && o.role != model::op_role::word_embedding)) return;
  using C = model::collective;
  const std::int64_t B = activation_message();
  const hook_phase ph = phase_of(o);
  if (!after && par_.sp && ph == hook_phase::wgrad) {
    out.push_back(comm_item(mtp ? "mtp_embedding_grad_all_gather" : "embedding_grad_all_gather", C::all_gather, B));
  }
  if (after && ph == hook_phase::fwd) {
    out.push_back(par_.sp ? comm_item(mtp ? "mtp_embedding_reduce_scatter" : "embedding_reduce_scatter", C::reduce_scatter, B)
                          : comm_item(mtp ? "mtp_embedding_all_reduce" : "embedding_all_reduce", C::all_reduce, B));
  }
}

// The collectives around a multi-token-prediction module's projection `eh_proj` (Megatron-Core's
// MultiTokenPredictionLayer). It is a column-parallel linear 2h -> h, so it has a column-parallel
// layer's collectives on its 2h-wide input: without SP the all-reduce of the input gradient; with
// SP the all-gather of the sequence-sharded input, the reduce-scatter of the input gradient and
// the input's re-gather for the weight gradient. Its h / tp-wide output is then all-gathered over
// TP (gather_from_tensor_model_parallel_region, whose backward only splits the gradient: no
// communication) for the transformer block; with SP the gathered output is split back over the
// sequence (scatter_to_sequence_parallel_region: no communication forward, an all-gather of the
// gradient backward).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::eh_proj_collectives(const model::op_cost& o, bool after, std::vector<item>& out) {
  if (tp_ <= 1 || o.role != model::op_role::mtp_eh_proj) return;
  using C = model::collective;
  const std::int64_t B = activation_message();
  const bool sp = par_.sp;
  switch (phase_of(o)) {
    case hook_phase::fwd:
      if (!after && sp) out.push_back(comm_item("mtp_eh_proj_input_all_gather", C::all_gather, 2 * B));
      if (after) out.push_back(comm_item("mtp_eh_proj_output_all_gather", C::all_gather, B));
      break;
    case hook_phase::dgrad:
      if (!after && sp) out.push_back(comm_item("mtp_eh_proj_grad_all_gather", C::all_gather, B));
      if (after) {
        out.push_back(sp ? comm_item("mtp_eh_proj_dgrad_reduce_scatter", C::reduce_scatter, 2 * B)
                         : comm_item("mtp_eh_proj_dgrad_all_reduce", C::all_reduce, 2 * B));
      }
      break;
    case hook_phase::wgrad:
      if (!after && sp) out.push_back(comm_item("mtp_eh_proj_input_regather", C::all_gather, 2 * B));
      break;
  }
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::head_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out) {
  const std::int64_t B = activation_message();
  out.clear();
  const std::int64_t loss_bytes = par_.micro_batch * par_.local_seq(m_) * 4;
  for (const model::op_cost& o : ops.ops) {
    if (!in_pass(o, pk)) continue;
    const hook_phase ph = phase_of(o);
    if (tp_ > 1 && par_.sp && o.role == model::op_role::logits) {
      if (ph == hook_phase::fwd) out.push_back(comm_item("final_norm_all_gather", model::collective::all_gather, B));
      if (ph == hook_phase::wgrad) out.push_back(comm_item("logits_input_regather", model::collective::all_gather, B));
    }
    embedding_collectives(o, false, out);
    eh_proj_collectives(o, false, out);
    out.push_back(compute_item(o));
    embedding_collectives(o, true, out);
    eh_proj_collectives(o, true, out);
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

template <model::ComputeModel Compute, model::CommModel Comm>
std::int64_t program_builder<Compute, Comm>::activation_message() const {
  return par_.micro_batch * par_.local_seq(m_) * m_.hidden * static_cast<std::int64_t>(model::activation_bytes(par_.dtype));
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::build_templates() {
  tp_placement_ = model::tensor_parallel_group(par_, hw_);
  model::tensor_parallel_layer_collectives(m_, par_, buf_.tp_collectives);
  model::moe_layer_collectives(m_, par_, buf_.moe_collectives);
  cp_exchange_ = {model::context_parallel_exchange(m_, par_, hw_, comm_, false),
                  model::context_parallel_exchange(m_, par_, hw_, comm_, true)};
  if (m_.is_moe()) {
    for (const model::moe_group g : {model::moe_group::ep, model::moe_group::tp, model::moe_group::ep_tp}) {
      moe_placement_[static_cast<std::size_t>(g)] = model::moe_group_placement(g, par_, hw_);
    }
  }
  layer_ops(compute_, m_, par_, hw_, buf_.layer_ops);
  embedding_ops(compute_, m_, par_, hw_, buf_.embedding_ops);
  head_ops(compute_, m_, par_, hw_, buf_.head_ops);
  for (std::size_t k = 0; k < 4; ++k) {
    const auto pk = static_cast<pass_kind>(k);
    layer_template(buf_.layer_ops, pk, layer_items_[k]);
    embed_template(buf_.embedding_ops, pk, embed_items_[k]);
    head_template(buf_.head_ops, pk, head_items_[k]);
    // A host synchronisation splits a layer's totals: the host waits for the GPU between runs.
    std::vector<totals>& runs = buf_.layer_runs[k];
    runs.assign(1, totals{});
    time_ns beside = -1;
    for (const item& i : layer_items_[k]) {
      runs.back().add_one(i, beside);
      if (i.host_sync) runs.emplace_back();
    }
  }
  // A MoE layer's dense part (attention, router, shared experts) is reduced over the
  // data-parallel group, its routed experts over the expert-data-parallel group.
  layer_params_ = m_.is_moe() ? model::moe_layer_dense_parameters_per_rank(m_, tp_) : model::layer_parameters_per_rank(m_, tp_);
  expert_layer_params_ = model::moe_layer_expert_parameters_per_rank(m_, par_.expert_tp(), par_.ep);
  embed_params_ = m_.vocab * m_.hidden / tp_ + (m_.position == model::position_kind::learned ? m_.seq * m_.hidden : 0);
  head_params_ = model::norm_parameter_count(m_) + ((!m_.tied_embeddings || pp_ > 1) ? m_.vocab * m_.hidden / tp_ : 0) +
                 model::mtp_head_parameters_per_rank(m_, par_);

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
        t.add(layer_items_[k], chunk_layers(first != 0, last != 0));
        if (last && forward) t.add(head_items_[k]);
        if (first && !forward) t.add(embed_items_[k]);
        pass_totals_[k][static_cast<std::size_t>(first)][static_cast<std::size_t>(last)] = t;
      }
    }
    unit_totals_[k] = {};
    unit_totals_[k][0].add(layer_items_[k]);
    unit_totals_[k][1].add(embed_items_[k]);
    unit_totals_[k][2].add(head_items_[k]);
  }
  build_chunk_plans();
  // Buckets over the backward order of a chunk's segments: head, layers (last first), embedding.
  std::vector<std::int64_t>& segments = buf_.segments;
  for (int first = 0; first < 2; ++first) {
    for (int last = 0; last < 2; ++last) {
      segments.clear();
      if (last) segments.push_back(head_params_);
      segments.insert(segments.end(), static_cast<std::size_t>(chunk_layers(first != 0, last != 0)), layer_params_);
      if (first) segments.push_back(embed_params_);
      model::gradient_buckets(segments, bucket_params_, buckets_[static_cast<std::size_t>(first)][static_cast<std::size_t>(last)]);
      chunk_params_[static_cast<std::size_t>(first)][static_cast<std::size_t>(last)] =
          std::accumulate(segments.begin(), segments.end(), std::int64_t{0});
      // The experts' buckets over the same segments (none in the head and the embedding).
      for (std::int64_t& seg : segments) seg = 0;
      for (int l = 0; l < chunk_layers(first != 0, last != 0); ++l) segments[static_cast<std::size_t>(last + l)] = expert_layer_params_;
      model::gradient_buckets(segments, bucket_params_, expert_buckets_[static_cast<std::size_t>(first)][static_cast<std::size_t>(last)]);
    }
  }
  // One op list per stage, the lists of earlier builds kept for their capacity.
  if (buf_.optimizer_ops.size() < static_cast<std::size_t>(pp_)) buf_.optimizer_ops.resize(static_cast<std::size_t>(pp_));
  for (int s = 0; s < pp_; ++s) {
    optimizer_ops(compute_, m_, par_, hw_, s, buf_.optimizer_ops[static_cast<std::size_t>(s)]);
  }

  p2p_bytes_ = model::pipeline_p2p_bytes(m_, par_);
  p2p_folded_.assign(static_cast<std::size_t>(pp_), 0);
  for (int s = 0; s < pp_ && pp_ > 1; ++s) {
    // The slowest column's transfer. The model prices a pair by its message and whether it
    // stays in a node (a pure function of both), so each of the two kinds of pair is priced
    // once, in the order the columns first meet them.
    std::array<bool, 2> seen{};
    time_ns worst = 0;
    for (int col = 0; col < tp_ * dp_ && !(seen[0] && seen[1]); ++col) {
      const bool same = same_node(s, col);
      if (seen[same ? 1 : 0]) continue;
      seen[same ? 1 : 0] = true;
      worst = std::max(worst, comm_.p2p_time({p2p_bytes_, same}, hw_));
    }
    p2p_folded_[static_cast<std::size_t>(s)] = worst;
  }
}

// The virtual stages with their own plans (`chunk_plan`): under an explicit layout every one,
// otherwise the leading ones that hold some of a MoE model's dense first layers. A dense layer's
// template is the model without experts, its MLP `ffn` wide, its TP collectives a dense layer's.
// A plan's passes' totals and gradient buckets follow the shared templates' order (backward: the
// MoE layers last first, then the dense ones). Empty for other jobs.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::build_chunk_plans() {
  buf_.chunk_plans.clear();
  const bool dense_first = m_.is_moe() && m_.moe.first_dense_layers > 0;
  if (!dense_first && par_.layout.empty()) return;
  if (dense_first) {
    model::transformer dense = m_;
    dense.moe = {};
    dense.name += " (dense layers)";
    model::parallel_config dense_par = par_;
    dense_par.ep = 1;
    dense_par.etp = 0;
    model::tensor_parallel_layer_collectives(dense, dense_par, buf_.tp_collectives);
    layer_ops(compute_, dense, dense_par, hw_, buf_.dense_layer_ops);
    for (std::size_t k = 0; k < 4; ++k) {
      layer_template(buf_.dense_layer_ops, static_cast<pass_kind>(k), buf_.dense_layer_items[k]);
      unit_totals_[k][3] = {};
      unit_totals_[k][3].add(buf_.dense_layer_items[k]);
    }
    model::tensor_parallel_layer_collectives(m_, par_, buf_.tp_collectives);
  }
  const int virtual_stages = pp_ * shape_.chunks;
  for (int vs = 0; vs < virtual_stages && (!par_.layout.empty() || dense_layers_of(vs) > 0); ++vs) {
    const bool first = vs == 0, last = vs == virtual_stages - 1;
    chunk_plan& c = buf_.chunk_plans.emplace_back();
    c.dense = dense_layers_of(vs);
    c.layers = layers_of(vs);
    const int n = c.layers;
    for (std::size_t k = 0; k < 4; ++k) {
      const bool forward = static_cast<pass_kind>(k) == pass_kind::forward;
      totals& t = c.passes[k];
      if (first && forward) t.add(embed_items_[k]);
      if (last && !forward) t.add(head_items_[k]);
      if (forward) t.add(buf_.dense_layer_items[k], c.dense);
      t.add(layer_items_[k], n - c.dense);
      if (!forward) t.add(buf_.dense_layer_items[k], c.dense);
      if (last && forward) t.add(head_items_[k]);
      if (first && !forward) t.add(embed_items_[k]);
    }
    std::vector<std::int64_t>& segments = buf_.segments;
    segments.clear();
    if (last) segments.push_back(head_params_);
    segments.insert(segments.end(), static_cast<std::size_t>(n - c.dense), layer_params_);
    segments.insert(segments.end(), static_cast<std::size_t>(c.dense), dense_layer_params());
    if (first) segments.push_back(embed_params_);
    model::gradient_buckets(segments, bucket_params_, c.buckets);
    c.params = std::accumulate(segments.begin(), segments.end(), std::int64_t{0});
    for (std::int64_t& seg : segments) seg = 0;
    for (int l = 0; l < n - c.dense; ++l) segments[static_cast<std::size_t>((last ? 1 : 0) + l)] = expert_layer_params_;
    model::gradient_buckets(segments, bucket_params_, c.expert_buckets);
  }
}

// Layers of virtual stage `vs`: the explicit layout's, or Megatron's even split's.
template <model::ComputeModel Compute, model::CommModel Comm>
int program_builder<Compute, Comm>::layers_of(int vs) const noexcept {
  if (par_.layout.empty()) return chunk_layers(vs == 0, vs == pp_ * shape_.chunks - 1);
  return static_cast<int>(par_.virtual_stage_layers(m_, vs));
}

// Dense first layers of a MoE model in virtual stage `vs`: the layers it holds below
// first_dense_layers.
template <model::ComputeModel Compute, model::CommModel Comm>
int program_builder<Compute, Comm>::dense_layers_of(int vs) const noexcept {
  if (!m_.is_moe()) return 0;
  const std::int64_t begin = par_.first_layer(m_, vs);
  return static_cast<int>(std::clamp<std::int64_t>(m_.moe.first_dense_layers - begin, 0, layers_of(vs)));
}

template <model::ComputeModel Compute, model::CommModel Comm>
const chunk_plan* program_builder<Compute, Comm>::chunk_plan_of(int stage, const pipeline::op& o) const noexcept {
  const auto vs = static_cast<std::size_t>(o.chunk * pp_ + stage);
  return vs < buf_.chunk_plans.size() ? &buf_.chunk_plans[vs] : nullptr;
}

template <model::ComputeModel Compute, model::CommModel Comm>
int program_builder<Compute, Comm>::global_rank(int stage, int col) const noexcept { return stage * tp_ * dp_ + col; }

// Whether stage s and stage (s + 1) mod p of column `col` share a node.
template <model::ComputeModel Compute, model::CommModel Comm>
bool program_builder<Compute, Comm>::same_node(int s, int col) const noexcept {
  const int a = global_rank(s, col);
  const int b = global_rank((s + 1) % pp_, col);
  return a / hw_.nvlink_domain_size() == b / hw_.nvlink_domain_size();
}

// Transfer from stage s to stage (s + 1) mod p of column `col` (either direction: same pair).
template <model::ComputeModel Compute, model::CommModel Comm>
time_ns program_builder<Compute, Comm>::p2p_time(int s, int col) const {
  return comm_.p2p_time({p2p_bytes_, same_node(s, col)}, hw_);
}

}  // namespace lumos::synth::detail

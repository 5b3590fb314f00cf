#pragma once
// program_builder: the emission of one rank — compute-stream items and their launches, the TP,
// DP and p2p collectives, pipeline passes in schedule order, the optimizer and the final sync —
// in three steps (begin_rank, emit_op for each op of its stage's order, end_rank), so that a
// compiled build can interleave the ranks. The tasks go through program_tasks.hpp.

#include <lumos/synth/detail/program_builder.hpp>
#include <lumos/synth/detail/program_tasks.hpp>

namespace lumos::synth::detail {

// ---- compute-stream items ----

// `cpu`: host time of its dispatch; `lead`: its launch edge from the dispatch's start.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline void program_builder<Compute, Comm>::emit_compute(rank_state& rs, time_ns d, time_ns cpu, time_ns lead, string_id name,
                                                  std::uint32_t op) {
  const launch_spec launch{cpu, lead};
  const graph::task_id t = on_compute(rs, graph::task_kind::gpu_compute, d, name, &launch);
  rs.last_compute = t;
  if (notes_ && op != program_notes::none) note_task(out_->notes.op_of_task, t, op);
}

template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline void program_builder<Compute, Comm>::emit_tp_collective(rank_state& rs, std::string_view kind, std::int64_t bytes,
                                                        time_ns d, string_id name, std::int32_t kernels, time_ns cpu,
                                                        time_ns lead, std::int64_t element_bytes, bool before_last) {
  group_state& gs = cached_group(rs.tp_group, group_type::tp, rs.info.stage, rs.info.dp_index);
  const collective_tasks c = collective(rs, rs.info.compute, gs, rs.seq_tp, kind, bytes, d, name, kernels, cpu, lead,
                                        element_bytes, graph::no_task, before_last);
  rs.last_compute = c.complete;
}

// A `beside` item (context parallelism's ring exchange) as NCCL send/recv over the rank's CP
// group on its context-parallel stream, once the compute task before it ends (it makes the
// K/V chunk): its complete, which the caller makes the compute task after the next one wait for
// (a cross-stream event).
template <model::ComputeModel Compute, model::CommModel Comm>
graph::task_id program_builder<Compute, Comm>::emit_beside(rank_state& rs, const item& i) {
  if (rs.info.context_parallel == no_processor) rs.info.context_parallel = stream(rs.info, 15, "context-parallel");
  group_state& gs = cached_group(rs.cp_group, group_type::cp, rs.info.stage, (rs.info.dp_index / par_.cp) * tp_ + rs.info.tp_index);
  return collective(rs, rs.info.context_parallel, gs, rs.seq_cp, "send_recv", i.bytes, i.duration, i.name, 1, i.cpu, i.cpu,
                    i.element_bytes, rs.last_compute)
      .complete;
}

// The group of a collective item that runs over no TP group: the rank's expert-parallel,
// expert-tensor-parallel or context-parallel group.
template <model::ComputeModel Compute, model::CommModel Comm>
group_state& program_builder<Compute, Comm>::special_group(rank_state& rs, const item& i) {
  if (i.expert_tp) return cached_group(rs.etp_group, group_type::etp, rs.info.stage, rs.col / par_.expert_tp());
  if (i.expert_parallel) {
    const int stride = par_.expert_tp();
    return cached_group(rs.ep_group, group_type::ep, rs.info.stage, rs.col / (stride * par_.ep) * stride + rs.col % stride);
  }
  return cached_group(rs.cp_group, group_type::cp, rs.info.stage, (rs.info.dp_index / par_.cp) * tp_ + rs.info.tp_index);
}

// `layer` >= 0: the items are transformer layer `layer` of its chunk, in a `forward` pass or
// not (then its recomputed forward ops, if any, form a span of their own).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_items(rank_state& rs, const std::vector<item>& items, int layer,
                                                bool forward) {
  const std::size_t mark = span_mark(rs);
  std::size_t recompute_mark = 0;
  bool in_recompute = false;
  graph::task_id beside = graph::no_task;  // a `beside` item's transfer, until the item it runs with is out
  for (const item& i : items) {
    if (layer >= 0 && !forward && i.recompute != in_recompute && !i.comm) {
      if (i.recompute) {
        recompute_mark = span_mark(rs);
      } else {
        span_close(rs, span_kind::layer_recompute, layer, recompute_mark);
      }
      in_recompute = i.recompute;
    }
    if (i.beside) {
      beside = emit_beside(rs, i);
      continue;
    }
    if (i.comm && (i.expert_parallel || i.context_parallel || i.expert_tp)) {
      group_state& gs = special_group(rs, i);
      std::int64_t& seq = i.expert_parallel ? rs.seq_ep : i.expert_tp ? rs.seq_etp : rs.seq_cp;
      rs.last_compute = collective(rs, rs.info.compute, gs, seq, collective_kind_name(i.kind), i.bytes, i.duration, i.name, 1, i.cpu, i.cpu,
                                   i.element_bytes, graph::no_task, false)
                            .complete;
    } else if (i.comm) {
      emit_tp_collective(rs, collective_kind_name(i.kind), i.bytes, i.duration, i.name, 1, i.cpu, i.cpu, i.element_bytes);
    } else {
      emit_compute(rs, i.duration, i.cpu, i.cpu, i.name, i.op);
      if (i.host_sync) host_wait(rs, rs.last_compute);
    }
    if (beside != graph::no_task) {
      rs.pending.push_back(beside);
      beside = graph::no_task;
    }
  }
  if (in_recompute) span_close(rs, span_kind::layer_recompute, layer, recompute_mark);
  if (layer >= 0 && forward) span_close(rs, span_kind::layer, layer, mark);
}

// A run of items as (at most) one compute task then one coalesced TP collective: the host time
// goes with the first of them, whose launch edge is the run's `lead` (see `totals`); the
// second is queued behind it on the same stream.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_totals(rank_state& rs, const totals& t, pass_kind pk) {
  const auto k = static_cast<std::size_t>(pk);
  if (t.compute_kernels > 0) {
    emit_compute(rs, t.compute, t.cpu, t.lead, n_pass_compute_[k]);
    if (t.comm_kernels > 0) {
      // Queued behind the compute task, its launch must not bind: the run's collectives were
      // launched among its kernels, not after the run's whole host time (which, on a host-bound
      // pass, would start them only once the host is done). Its launch goes before the compute
      // task's, at the same lead.
      emit_tp_collective(rs, "coalesced", t.comm_bytes, t.comm, n_pass_comm_[k], t.comm_kernels, 0, t.lead, 2, true);
    }
  } else if (t.comm_kernels > 0) {
    emit_tp_collective(rs, "coalesced", t.comm_bytes, t.comm, n_pass_comm_[k], t.comm_kernels, t.cpu, t.lead);
  }
}

// The segments of a chunk pass in execution order; `n`: the chunk's layers, `dense`: its first
// layers that are a MoE model's dense ones.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::segments_of(pass_kind pk, bool first, bool last, std::vector<segment>& out, int n,
                                                 int dense) const {
  const auto k = static_cast<std::size_t>(pk);
  out.clear();
  const segment moe{&layer_items_[k], layer_params_};
  const segment dense_layer{&buf_.dense_layer_items[k], dense > 0 ? dense_layer_params() : 0};
  if (pk == pass_kind::forward) {
    if (first) out.push_back({&embed_items_[k], embed_params_});
    for (int l = 0; l < n; ++l) out.push_back(l < dense ? dense_layer : moe);
    if (last) out.push_back({&head_items_[k], head_params_});
  } else {
    if (last) out.push_back({&head_items_[k], head_params_});
    for (int l = n; l-- > 0;) out.push_back(l < dense ? dense_layer : moe);
    if (first) out.push_back({&embed_items_[k], embed_params_});
  }
}

// One segment of a pass (embedding, a layer or the head): its items, or their totals at the
// `pass` granularity; `layers_seen` counts the layers emitted so far in the pass.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_segment(rank_state& rs, pass_kind pk, const segment& seg, int& layers_seen, int chunk_layers) {
  const auto k = static_cast<std::size_t>(pk);
  if (opt_.detail == granularity::kernel) {
    const bool is_layer = seg.items == &layer_items_[k] || seg.items == &buf_.dense_layer_items[k];
    const int layer = !is_layer ? -1 : pk == pass_kind::forward ? layers_seen : chunk_layers - 1 - layers_seen;
    layers_seen += is_layer ? 1 : 0;
    emit_items(rs, *seg.items, layer, pk == pass_kind::forward);
  } else if (seg.items == &layer_items_[k] && buf_.layer_runs[k].size() > 1) {
    // Runs split at the layer's host synchronisations: the host waits for the GPU between them.
    const std::vector<totals>& runs = buf_.layer_runs[k];
    for (std::size_t r = 0; r < runs.size(); ++r) {
      emit_totals(rs, runs[r], pk);
      if (r + 1 < runs.size()) host_wait(rs, rs.last_compute);
    }
  } else {
    const std::size_t unit = seg.items == &layer_items_[k]              ? 0
                             : seg.items == &embed_items_[k]            ? 1
                             : seg.items == &buf_.dense_layer_items[k] ? 3
                                                                        : 2;
    emit_totals(rs, unit_totals_[k][unit], pk);
  }
}

// A pass of a chunk; `buckets` (or null) lists the gradient buckets whose reduction starts
// after one of its segments. Under FSDP each segment is a unit: its compute waits for its
// all-gather, which was issued as the unit before it started (the first unit's, after the op
// before: emit_op), and the gradient pass reduce-scatters each unit's gradients after it
// (`final_grad`: the chunk's last gradient pass, after which HSDP all-reduces them).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_pass(rank_state& rs, pass_kind pk, bool first, bool last,
                                               const std::vector<std::pair<int, std::int64_t>>* buckets, bool final_grad,
                                               const chunk_plan* plan) {
  const auto k = static_cast<std::size_t>(pk);
  const int dense_layers = plan != nullptr ? plan->dense : 0;
  const int n = plan != nullptr ? plan->layers : chunk_layers(first, last);
  // A layer with host synchronisations is emitted run by run (emit_segment).
  const bool synced = buf_.layer_runs[k].size() > 1 && n > dense_layers;
  if (buckets == nullptr && opt_.detail == granularity::pass && !fsdp_ && !synced) {
    emit_totals(rs, plan != nullptr ? plan->passes[k] : pass_totals_[k][first][last], pk);
    ensure_task(rs);
    return;
  }
  segments_of(pk, first, last, segments_scratch_, n, dense_layers);
  const bool gathers = fsdp_ && fsdp_gathers(pk);
  const bool reduces = fsdp_ && pk == (split_ ? pass_kind::weight_grad : pass_kind::backward);
  std::size_t next_bucket = 0, next_expert_bucket = 0;
  const auto* expert_buckets = buckets == nullptr ? nullptr : plan != nullptr ? &plan->expert_buckets : &expert_buckets_[first][last];
  // Layers of the chunk in model order (backward passes run them last first).
  int layers_seen = 0;
  // A segment without work still marks the point its gradients are final.
  auto anchor = [&](graph::task_id before) {
    if (rs.last_compute == before || !rs.pending.empty()) {
      rs.last_compute = on_compute(rs, graph::task_kind::gpu_compute, 0, n_pass_compute_[k]);
    }
  };
  for (std::size_t si = 0; si < segments_scratch_.size(); ++si) {
    const segment& seg = segments_scratch_[si];
    if (gathers) {
      // Two units' gathered parameters at most: the next unit's gather starts once the unit
      // before this one is done and its buffer is free.
      if (rs.prefetched.complete == graph::no_task) rs.prefetched = fsdp_gather(rs, seg.params, rs.fsdp_free);
      if (rs.prefetched.complete != graph::no_task) rs.pending.push_back(rs.prefetched.complete);
      rs.fsdp_free = rs.last_compute;
      rs.prefetched = si + 1 < segments_scratch_.size() ? fsdp_gather(rs, segments_scratch_[si + 1].params, rs.fsdp_free)
                                                        : collective_tasks{};
    }
    const graph::task_id before = rs.last_compute;
    emit_segment(rs, pk, seg, layers_seen, n);
    if (reduces) {
      anchor(before);
      fsdp_reduce(rs, seg.params, rs.last_compute, final_grad);
    }
    if (buckets != nullptr) {
      while (next_bucket < buckets->size() && (*buckets)[next_bucket].first == static_cast<int>(si)) {
        anchor(before);
        reduce_gradients(rs, (*buckets)[next_bucket].second, rs.last_compute);
        ++next_bucket;
      }
      while (next_expert_bucket < expert_buckets->size() && (*expert_buckets)[next_expert_bucket].first == static_cast<int>(si)) {
        anchor(before);
        reduce_gradients(rs, (*expert_buckets)[next_expert_bucket].second, rs.last_compute, true);
        ++next_expert_bucket;
      }
    }
  }
  ensure_task(rs);
}

// Guarantees the op produced at least one compute-stream task (a pass with no work still
// needs an anchor for its edges).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::ensure_task(rank_state& rs) {
  if (rs.last_compute == graph::no_task || !rs.pending.empty()) {
    const graph::task_id t = on_compute(rs, graph::task_kind::gpu_compute, 0, n_pass_compute_[0]);
    rs.last_compute = t;
  }
}

// ---- data parallelism ----
template <model::ComputeModel Compute, model::CommModel Comm>
graph::processor_id program_builder<Compute, Comm>::dp_stream(rank_state& rs) {
  if (rs.info.data_parallel == no_processor) rs.info.data_parallel = stream(rs.info, 13, "data-parallel");
  return rs.info.data_parallel;
}

// The expert-data-parallel group of `rs` (MoE): the ranks of its stage that hold its expert shard.
template <model::ComputeModel Compute, model::CommModel Comm>
group_state& program_builder<Compute, Comm>::expert_dp_group(rank_state& rs) {
  return cached_group(rs.edp_group, group_type::edp, rs.info.stage, rs.col % expert_grid());
}

// Reduction of `params` gradients that are final once `after` ends: all-reduce (no ZeRO) or
// reduce-scatter (ZeRO ≥ 1), over the data-parallel group, or for routed experts (`experts`)
// the expert-data-parallel group.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::reduce_gradients(rank_state& rs, std::int64_t params, graph::task_id after,
                                                      bool experts) {
  if (params <= 0 || (experts ? par_.expert_data_parallel() : dp_) <= 1) return;
  group_state& gs = experts ? expert_dp_group(rs) : cached_group(rs.dp_group, group_type::dp, rs.info.stage, rs.info.tp_index);
  const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.grad_reduce_bytes);
  const model::collective kind = par_.zero_stage >= 1 ? model::collective::reduce_scatter : model::collective::all_reduce;
  const time_ns d = comm_.collective_time({kind, bytes, gs.placement}, hw_);
  const collective_tasks c = collective(rs, dp_stream(rs), gs, experts ? rs.seq_edp : rs.seq_dp, collective_kind_name(kind), bytes, d,
                                        par_.zero_stage >= 1 ? n_grad_rs_ : n_grad_ar_, 1, -1, -1,
                                        static_cast<std::int64_t>(opt_.grad_reduce_bytes), after);
  rs.last_dp = c.complete;
}

// ZeRO all-gather of `params` parameters on the data-parallel stream (routed experts: over the
// expert-data-parallel group; nothing to gather when it has one rank).
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::gather_parameters(rank_state& rs, std::int64_t params,
                                                       graph::task_id after, bool experts) -> collective_tasks {
  if (experts && par_.expert_data_parallel() <= 1) return {};
  group_state& gs = experts ? expert_dp_group(rs) : cached_group(rs.dp_group, group_type::dp, rs.info.stage, rs.info.tp_index);
  const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.param_gather_bytes);
  const time_ns d = comm_.collective_time({model::collective::all_gather, bytes, gs.placement}, hw_);
  const collective_tasks c = collective(rs, dp_stream(rs), gs, experts ? rs.seq_edp : rs.seq_dp, "allgather", bytes, d, n_param_ag_, 1, -1, -1,
                                        static_cast<std::int64_t>(opt_.param_gather_bytes), after);
  rs.last_dp = c.complete;
  return c;
}

// ---- FSDP / ZeRO-3 ----

// The group `rs`'s parameters, gradients and optimizer states are sharded over: its dp group, or
// under HSDP its shard group.
template <model::ComputeModel Compute, model::CommModel Comm>
group_state& program_builder<Compute, Comm>::shard_group(rank_state& rs) {
  if (replicas_ == 1) return cached_group(rs.dp_group, group_type::dp, rs.info.stage, rs.info.tp_index);
  return cached_group(rs.shard_group, group_type::shard, rs.info.stage, (rs.info.dp_index / shard_) * tp_ + rs.info.tp_index);
}

// The duration of a `kind` collective of `bytes` on `gs`, priced once per (kind, size) while it
// stays among the group's last few (FSDP prices the same few unit sizes every micro-batch).
template <model::ComputeModel Compute, model::CommModel Comm>
time_ns program_builder<Compute, Comm>::priced_time(group_state& gs, model::collective kind, std::int64_t bytes) {
  const int key = static_cast<int>(kind);
  for (const group_state::priced& p : gs.prices) {
    if (p.kind == key && p.bytes == bytes) return p.duration;
  }
  const time_ns d = comm_.collective_time({kind, bytes, gs.placement}, hw_);
  gs.prices[gs.next_price] = {key, bytes, d};
  gs.next_price = static_cast<std::uint8_t>((gs.next_price + 1) % gs.prices.size());
  return d;
}

// Whether a pass of kind `pk` all-gathers its units' parameters: forward passes always, passes
// that need the weights for input gradients unless the forward's gathered parameters stay
// (reshard_after_forward off); weight-gradient passes never.
template <model::ComputeModel Compute, model::CommModel Comm>
bool program_builder<Compute, Comm>::fsdp_gathers(pass_kind pk) const noexcept {
  if (pk == pass_kind::forward) return true;
  return pk != pass_kind::weight_grad && par_.reshard_after_forward;
}

// Parameters of the first unit a pass of kind `pk` runs on a chunk with (`first`, `last`) and
// `layers` layers.
template <model::ComputeModel Compute, model::CommModel Comm>
std::int64_t program_builder<Compute, Comm>::first_unit_params(pass_kind pk, bool first, bool last, int layers) const noexcept {
  if (pk == pass_kind::forward) return first ? embed_params_ : layers > 0 ? layer_params_ : head_params_;
  return last ? head_params_ : layers > 0 ? layer_params_ : embed_params_;
}

// The all-gather of one unit's `params` parameters (bf16) over the shard group, on the
// data-parallel stream, once `after` ends; nothing when the shard group has one rank.
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::fsdp_gather(rank_state& rs, std::int64_t params, graph::task_id after) -> collective_tasks {
  if (params <= 0 || shard_ <= 1) return {};
  group_state& gs = shard_group(rs);
  const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.param_gather_bytes);
  const time_ns d = priced_time(gs, model::collective::all_gather, bytes);
  return collective(rs, dp_stream(rs), gs, rs.seq_dp, "allgather", bytes, d, n_param_ag_, 1, -1, -1,
                    static_cast<std::int64_t>(opt_.param_gather_bytes), after);
}

// The reduce-scatter of one unit's `params` gradients over the shard group once `after` ends,
// on the data-parallel stream: the shard group's collectives run in the order they were issued,
// as NCCL runs the collectives of one communicator (FSDP2's all-gather and reduce-scatter
// streams share the process group). After the chunk's last micro-batch (`final_grad`) under
// HSDP, the all-reduce of the shard over the replica group, one per unit, on a stream of its own
// (another communicator).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::fsdp_reduce(rank_state& rs, std::int64_t params, graph::task_id after, bool final_grad) {
  if (params <= 0 || (shard_ <= 1 && !final_grad)) return;
  const auto bytes = static_cast<std::int64_t>(static_cast<double>(params) * opt_.grad_reduce_bytes);
  const auto element = static_cast<std::int64_t>(opt_.grad_reduce_bytes);
  if (shard_ > 1) {
    group_state& gs = shard_group(rs);
    const time_ns d = priced_time(gs, model::collective::reduce_scatter, bytes);
    rs.last_dp = collective(rs, dp_stream(rs), gs, rs.seq_dp, collective_kind_name(model::collective::reduce_scatter), bytes, d,
                            n_grad_rs_, 1, -1, -1, element, after).complete;
    after = rs.last_dp;
  }
  if (final_grad && replicas_ > 1) {
    if (rs.fsdp_reduce == no_processor) rs.fsdp_reduce = stream(rs.info, 14, "hsdp all-reduce");
    group_state& gs = cached_group(rs.replica_group, group_type::replica, rs.info.stage,
                                   (rs.info.dp_index % shard_) * tp_ + rs.info.tp_index);
    const std::int64_t shard_bytes = bytes / shard_;
    const time_ns d = priced_time(gs, model::collective::all_reduce, shard_bytes);
    rs.last_dp = collective(rs, rs.fsdp_reduce, gs, rs.seq_replica, collective_kind_name(model::collective::all_reduce),
                            shard_bytes, d, n_grad_ar_, 1, -1, -1, element, after).complete;
  }
}

// ---- pipeline p2p ----
template <model::ComputeModel Compute, model::CommModel Comm>
time_ns program_builder<Compute, Comm>::p2p_duration(int sender_stage, int col) const {
  return opt_.unfold ? p2p_time(sender_stage, col) : p2p_folded_[static_cast<std::size_t>(sender_stage)];
}

template <model::ComputeModel Compute, model::CommModel Comm>
pass_kind program_builder<Compute, Comm>::pass_of(const pipeline::op& o) const noexcept {
  switch (o.kind) {
    case pipeline::op_kind::forward: return pass_kind::forward;
    case pipeline::op_kind::backward: return split_ ? pass_kind::input_grad : pass_kind::backward;
    case pipeline::op_kind::weight: return pass_kind::weight_grad;
  }
  return pass_kind::forward;
}

// Whether op `o` of `stage` runs the first and the last virtual stage (embedding, head).
template <model::ComputeModel Compute, model::CommModel Comm>
std::pair<bool, bool> program_builder<Compute, Comm>::chunk_role(int stage, const pipeline::op& o) const noexcept {
  const int vs = o.chunk * pp_ + stage;
  return {vs == 0, vs == pp_ * shape_.chunks - 1};
}

// Layers of the chunk op `o` of `stage` runs: its plan's, or a chunk of the even split's.
template <model::ComputeModel Compute, model::CommModel Comm>
int program_builder<Compute, Comm>::plan_layers(int stage, const pipeline::op& o) const noexcept {
  const chunk_plan* dc = chunk_plan_of(stage, o);
  return dc != nullptr ? dc->layers : layers_per_chunk_;
}

// The processors of simulated rank `index` (global rank, or stage when folded), and what its
// first op needs: under --overlap-param-gather, the all-gathers of the parameters the previous
// step updated; under ZeRO-3, the first op's parameters.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::begin_rank(rank_state& rs, int index) {
  rs.reset();
  const int rank = opt_.unfold ? index : index * tp_ * dp_;
  simulated_rank& r = rs.info;
  r.rank = rank;
  r.stage = rank / (tp_ * dp_);
  r.dp_index = (rank % (tp_ * dp_)) / tp_;
  r.tp_index = rank % tp_;
  rs.col = rank % (tp_ * dp_);
  const int s = r.stage;
  r.cpu = cpu_thread(rank);
  r.compute = stream(r, 7, "compute");
  if (dp_ > 1 || (model::embedding_copies_synced(m_, par_) && (s == 0 || s == pp_ - 1))) (void)dp_stream(rs);
  if (pp_ > 1) {
    r.send_next = stream(r, 21, "pipeline send to next stage");
    r.send_prev = stream(r, 22, "pipeline send to previous stage");
    r.recv_prev = stream(r, 23, "pipeline receive from previous stage");
    r.recv_next = stream(r, 24, "pipeline receive from next stage");
  }
  const auto& order = order_of(rs);
  rs.ops = order.size();
  const auto& final_grad = final_grad_[static_cast<std::size_t>(s)];

  // --overlap-param-gather (ZeRO-1/2): the all-gathers of the parameters the previous step
  // updated start the iteration, in the order the forward passes need them (chunk by chunk, and
  // in a chunk the buckets in layer order: they fill in backward order, the last layers first).
  // The first forward pass waits for the first bucket only and runs beside the others; the op
  // after it waits for all of them (Megatron gates each layer's forward on its bucket).
  rs.gather_early = par_.overlap_param_gather && (par_.zero_stage == 1 || par_.zero_stage == 2) && dp_ > 1;
  if (rs.gather_early) {
    std::vector<std::int32_t>& chunks = buf_.chunk_ops;  // the op where each chunk's gradients are final, by chunk
    chunks.clear();
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (final_grad[i] != 0) chunks.push_back(static_cast<std::int32_t>(i));
    }
    std::stable_sort(chunks.begin(), chunks.end(), [&](std::int32_t a, std::int32_t b) {
      return order[static_cast<std::size_t>(a)].chunk < order[static_cast<std::size_t>(b)].chunk;
    });
    for (const std::int32_t i : chunks) {
      const auto [f, l] = chunk_role(s, order[static_cast<std::size_t>(i)]);
      const chunk_plan* dc = chunk_plan_of(s, order[static_cast<std::size_t>(i)]);
      const auto& bs = dc != nullptr ? dc->buckets : buckets_[f][l];
      for (auto b = bs.rbegin(); b != bs.rend(); ++b) {
        rs.all_gathered = gather_parameters(rs, b->second, graph::no_task).complete;
        if (rs.first_gathered == graph::no_task) rs.first_gathered = rs.all_gathered;
      }
      const auto& xs = dc != nullptr ? dc->expert_buckets : expert_buckets_[f][l];
      for (auto b = xs.rbegin(); b != xs.rend(); ++b) {
        const graph::task_id t = gather_parameters(rs, b->second, graph::no_task, true).complete;
        if (t != graph::no_task) rs.all_gathered = t;
      }
    }
  }
  rs.in_pipeline = true;
  if (fsdp_ && !order.empty() && fsdp_gathers(pass_of(order[0]))) {
    const auto [f, l] = chunk_role(s, order[0]);
    rs.prefetched = fsdp_gather(rs, first_unit_params(pass_of(order[0]), f, l, plan_layers(s, order[0])), graph::no_task);
  }
}

// Where the input of op `i` of the rank's order comes from, when another stage sends it (the
// stage plan's sender): the transfer's group, its sequence counter on this rank, its stream,
// length and name.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline auto program_builder<Compute, Comm>::receive_of(rank_state& rs, std::size_t i) -> std::optional<receive> {
  const int s = rs.info.stage;
  const int sender = buf_.sender[buf_.stage_ops[static_cast<std::size_t>(s)] + i].first;
  if (sender < 0) return std::nullopt;
  if (order_of(rs)[i].kind == pipeline::op_kind::forward) {
    return receive{&cached_group(rs.act_in, group_type::act, sender, rs.col), &rs.seq_act_in, rs.info.recv_prev,
                   p2p_duration(sender, rs.col), n_recv_fwd_};
  }
  return receive{&cached_group(rs.grad_in, group_type::grad, s, rs.col), &rs.seq_grad_in, rs.info.recv_next,
                 p2p_duration(s, rs.col), n_recv_bwd_};
}

// The receive of op `i`'s input, when it comes from another stage (its arrive posted already
// when the compiled program's driver did: post_receive).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::receive_input(rank_state& rs, std::size_t i) {
  collective_tasks c;
  if (rs.posted.group != nullptr) {
    c = {rs.posted.arrive, complete(rs.posted.stream, *rs.posted.group, rs.posted.seq, rs.posted.duration)};
    rs.posted.group = nullptr;
  } else {
    const std::optional<receive> r = receive_of(rs, i);
    if (!r) return;
    c = collective(rs, r->stream, *r->group, *r->seq, "send_recv", p2p_bytes_, r->duration, r->name);
  }
  rs.pending.push_back(c.complete);
  if (opt_.p2p_host_sync) {
    // torch.cuda.synchronize(): the device drains (the previous pass, the transfer).
    host_wait(rs, c.complete);
    if (rs.last_compute != graph::no_task) host_wait(rs, rs.last_compute);
  }
}

// Compiled program: the arrive of the next op's receive, launched as `collective` launches it,
// first in the next op's batch of launches.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::post_receive(rank_state& rs) {
  if (rs.next_op >= rs.ops) return;
  const std::optional<receive> r = receive_of(rs, rs.next_op);
  if (!r) return;
  const std::size_t k = static_cast<std::size_t>((*r->seq)++);
  rs.posted = {r->group, k, arrive(rs, r->stream, *r->group, k, launch_edge(rs, launch_spec{collective_cpu_, collective_cpu_}), graph::no_task),
               r->stream, r->duration};
}

// The next op of the rank's order: "receive its input if it crosses stages
// (`pipeline::dependency_of`) → its pass → send its output if another stage consumes it".
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_op(rank_state& rs) {
  const std::size_t i = rs.next_op++;
  const auto& order = order_of(rs);
  const pipeline::op& o = order[i];
  const int s = rs.info.stage;
  const auto [first, last] = chunk_role(s, o);
  receive_input(rs, i);
  if (rs.gather_early && i == 0 && rs.first_gathered != graph::no_task) rs.pending.push_back(rs.first_gathered);
  if (rs.gather_early && i > 0 && rs.all_gathered != graph::no_task) {
    rs.pending.push_back(rs.all_gathered);
    rs.all_gathered = graph::no_task;
  }
  const bool bucketed = final_grad_[static_cast<std::size_t>(s)][i] != 0 && opt_.overlap_grad_reduce && par_.zero_stage <= 1 && dp_ > 1;
  const std::size_t pass_mark = span_mark(rs);
  const chunk_plan* dc = chunk_plan_of(s, o);
  const auto* buckets = dc != nullptr ? &dc->buckets : &buckets_[first][last];
  emit_pass(rs, pass_of(o), first, last, bucketed ? buckets : nullptr, final_grad_[static_cast<std::size_t>(s)][i] != 0, dc);
  span_close(rs, o.kind == pipeline::op_kind::forward ? span_kind::forward : span_kind::backward, o.micro_batch, pass_mark);
  const graph::task_id done = rs.last_compute;
  // Send the output if another stage consumes it.
  const int vs = o.chunk * pp_ + s;
  if (o.kind == pipeline::op_kind::forward && vs < pp_ * shape_.chunks - 1) {
    group_state& gs = cached_group(rs.act_out, group_type::act, s, rs.col);
    (void)collective(rs, rs.info.send_next, gs, rs.seq_act_out, "send_recv", p2p_bytes_, p2p_duration(s, rs.col), n_send_fwd_,
                     1, -1, -1, 2, done);
  } else if (o.kind == pipeline::op_kind::backward && vs > 0) {
    const int receiver = (s - 1 + pp_) % pp_;
    group_state& gs = cached_group(rs.grad_out, group_type::grad, receiver, rs.col);
    (void)collective(rs, rs.info.send_prev, gs, rs.seq_grad_out, "send_recv", p2p_bytes_, p2p_duration(receiver, rs.col),
                     n_send_bwd_, 1, -1, -1, 2, done);
  }
  // FSDP: prefetch the first unit of the next op (its other units: emit_pass). ZeRO-2: this
  // op's gradients reduce-scattered.
  if (fsdp_ && i + 1 < order.size() && fsdp_gathers(pass_of(order[i + 1]))) {
    const auto [f2, l2] = chunk_role(s, order[i + 1]);
    rs.prefetched = fsdp_gather(rs, first_unit_params(pass_of(order[i + 1]), f2, l2, plan_layers(s, order[i + 1])), rs.fsdp_free);
  }
  const pipeline::op_kind grad_kind = split_ ? pipeline::op_kind::weight : pipeline::op_kind::backward;
  if (par_.zero_stage >= 2 && !fsdp_ && o.kind == grad_kind) reduce_gradients(rs, dc != nullptr ? dc->params : chunk_params_[first][last], done);
  flush_launches(rs);
}

// After the rank's last op: the gradient reductions that did not overlap the backward, the
// all-reduce of the word embedding's copies, the optimizer step and the final sync.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::end_rank(rank_state& rs) {
  simulated_rank& r = rs.info;
  const int s = r.stage;
  const auto& order = order_of(rs);
  const auto& final_grad = final_grad_[static_cast<std::size_t>(s)];
  rs.in_pipeline = false;
  r.pipeline_last = rs.last_compute;

  // Gradient buckets that did not overlap the backward.
  if (par_.zero_stage <= 1 && dp_ > 1 && !opt_.overlap_grad_reduce) {
    graph::task_id after = r.pipeline_last;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (final_grad[i] == 0) continue;
      const auto [first, last] = chunk_role(s, order[i]);
      const chunk_plan* dc = chunk_plan_of(s, order[i]);
      for (const auto& b : dc != nullptr ? dc->buckets : buckets_[first][last]) {
        reduce_gradients(rs, b.second, after);
        after = graph::no_task;
      }
      for (const auto& b : dc != nullptr ? dc->expert_buckets : expert_buckets_[first][last]) {
        reduce_gradients(rs, b.second, after, true);
        after = graph::no_task;
      }
    }
  }
  if (opt_.forward_only) {
    flush_launches(rs);
    final_device_sync(rs);
    return;
  }
  // The word embedding's copies on the first and last stage (tied embeddings, or the
  // multi-token-prediction modules' lookup): the two stages add their gradients.
  if (model::embedding_copies_synced(m_, par_) && (s == 0 || s == pp_ - 1)) {
    group_state& gs = group(group_type::embd, rs.col, 0);
    const auto bytes = static_cast<std::int64_t>(static_cast<double>(m_.vocab * m_.hidden / tp_) * opt_.grad_reduce_bytes);
    const time_ns d = comm_.collective_time({model::collective::all_reduce, bytes, gs.placement}, hw_);
    const collective_tasks c = collective(rs, dp_stream(rs), gs, rs.seq_embd, "allreduce", bytes, d, n_embd_ar_, 1, -1, -1,
                                          static_cast<std::int64_t>(opt_.grad_reduce_bytes), r.pipeline_last);
    rs.last_dp = c.complete;
  }
  if (rs.last_dp != graph::no_task) rs.pending.push_back(rs.last_dp);
  optimizer_step(rs);
}

// Optimizer: local gradient norm, its all-reduce, the Adam step; then ZeRO-1/2's parameter
// all-gathers and the final sync.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::optimizer_step(rank_state& rs) {
  simulated_rank& r = rs.info;
  const int s = r.stage;
  const auto& order = order_of(rs);
  const auto& final_grad = final_grad_[static_cast<std::size_t>(s)];
  const model::op_list& opt_ops = buf_.optimizer_ops[static_cast<std::size_t>(s)];
  graph::task_id step = graph::no_task;
  const std::size_t optimizer_mark = span_mark(rs);
  // The fp32 scalar all-reduce over the model-parallel group that the gradient norm and the
  // found_inf flag each need.
  auto norm_all_reduce = [&] {
    group_state& gs = group(group_type::norm, r.dp_index, 0);
    if (gs.ranks.size() <= 1) return;
    const time_ns d = comm_.collective_time({model::collective::all_reduce, 4, gs.placement}, hw_);
    rs.last_compute = collective(rs, r.compute, gs, rs.seq_norm, "allreduce", 4, d, n_norm_ar_, 1, -1, -1, 4).complete;
  };
  for (const model::op_cost& o : opt_ops.ops) {
    const time_ns cpu = o.cpu >= 0 ? o.cpu : launch_cost_ * o.kernels;
    emit_compute(rs, o.duration, cpu, cpu, intern(o.name), note_op(o));
    step = rs.last_compute;
    if (o.role == model::op_role::found_inf) {
      // found_inf is all-reduced over the model-parallel group, then read by the host.
      norm_all_reduce();
      if (opt_.loss_scale_host_sync) host_wait(rs, rs.last_compute);
    }
    if (o.role == model::op_role::grad_norm) norm_all_reduce();
  }
  ensure_task(rs);
  if (step == graph::no_task) step = rs.last_compute;
  // ZeRO-1/2: gather the updated parameter shards, bucket by bucket (unless the next
  // iteration's forward overlaps them: begin_rank).
  if ((par_.zero_stage == 1 || par_.zero_stage == 2) && dp_ > 1 && !rs.gather_early) {
    graph::task_id after = step;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (final_grad[i] == 0) continue;
      const auto [first, last] = chunk_role(s, order[i]);
      const chunk_plan* dc = chunk_plan_of(s, order[i]);
      for (const auto& b : dc != nullptr ? dc->buckets : buckets_[first][last]) {
        (void)gather_parameters(rs, b.second, after);
        after = graph::no_task;
      }
      for (const auto& b : dc != nullptr ? dc->expert_buckets : expert_buckets_[first][last]) {
        (void)gather_parameters(rs, b.second, after, true);
        after = graph::no_task;
      }
    }
  }
  flush_launches(rs);
  span_close(rs, span_kind::optimizer, 0, optimizer_mark);
  final_device_sync(rs);
}

}  // namespace lumos::synth::detail

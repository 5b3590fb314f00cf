#pragma once
// program_builder: the emission of one rank — compute-stream items and their launches, the TP,
// DP and p2p collectives, pipeline passes in schedule order, the optimizer and the final sync.

#include <lumos/synth/detail/program_builder.hpp>

namespace lumos::synth::detail {

template <model::ComputeModel Compute, model::CommModel Comm>
graph::task_id program_builder<Compute, Comm>::add(graph::processor_id p, graph::task_kind k, time_ns d, string_id name,
                                                   int rank) {
  const graph::task_id t = g_->add_task({.kind = k, .processor = p, .duration = d, .rank = rank});
  g_->name[t] = name;
  return t;
}

template <model::ComputeModel Compute, model::CommModel Comm>
graph::processor_id program_builder<Compute, Comm>::stream(const simulated_rank& r, std::int64_t index,
                                                           std::string_view what) {
  if (!opt_.names) return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, r.rank % hw_.gpus_per_node, index, {}});
  return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, r.rank % hw_.gpus_per_node, index,
                            "rank " + std::to_string(r.rank) + " stream " + std::to_string(index) + " (" +
                                std::string(what) + ")"});
}

// A compute-stream GPU task: takes the pending start edges.
template <model::ComputeModel Compute, model::CommModel Comm>
graph::task_id program_builder<Compute, Comm>::on_compute(rank_state& rs, graph::task_kind k, time_ns d,
                                                          string_id name) {
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::launched(rank_state& rs, graph::task_id gpu_task, time_ns cpu, time_ns lead) {
  if (opt_.detail == granularity::pass) {
    rs.launches.push_back({gpu_task, cpu, lead});
    return;
  }
  const graph::task_id l = add(rs.info.cpu, graph::task_kind::cpu, cpu, n_launch_, rs.info.rank);
  g_->add_edge(l, gpu_task, lead, graph::edge_kind::launch, graph::edge_flags::from_start);
  if (notes_) rs.cpu_tasks.push_back(l);
}

// ---- notes (kernel-level traces) ----
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::note_task(std::vector<std::uint32_t>& v, graph::task_id t, std::uint32_t value) {
  if (v.size() <= t) v.resize(static_cast<std::size_t>(t) + 1, program_notes::none);
  v[t] = value;
}

template <model::ComputeModel Compute, model::CommModel Comm>
std::size_t program_builder<Compute, Comm>::span_mark(const rank_state& rs) const { return rs.cpu_tasks.size(); }

// The CPU tasks of `rs` created since `mark` as one span.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::span_close(const rank_state& rs, span_kind kind, int index, std::size_t mark) {
  if (!notes_ || rs.cpu_tasks.size() <= mark) return;
  out_->notes.spans.push_back({rs.info.rank, kind, index, rs.cpu_tasks[mark], rs.cpu_tasks.back()});
}

// One CPU task for the batched launches, as long as all of them; each GPU task's launch edge is
// the host time before its run plus the run's lead — the timing one launch per kernel gives.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::flush_launches(rank_state& rs) {
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::host_wait(rank_state& rs, graph::task_id gpu_task) {
  if (gpu_task == graph::no_task) return;
  flush_launches(rs);
  const graph::task_id w = add(rs.info.cpu, graph::task_kind::cpu, 0, n_host_sync_, rs.info.rank);
  g_->add_edge(gpu_task, w, 0, graph::edge_kind::sync);
  if (notes_) rs.cpu_tasks.push_back(w), out_->notes.host_syncs.push_back(w);
}

// One participant's share of a collective of group `gs` (its `seq`-th), on `stream_id`.
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::collective(rank_state& rs, graph::processor_id stream_id, group_state& gs,
                                                std::int64_t& seq, std::string_view kind, std::int64_t bytes,
                                                time_ns duration, string_id name, std::int32_t kernels, time_ns cpu,
                                                time_ns lead, std::int64_t element_bytes) -> collective_tasks {
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
                                        gs.id, 0,
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_compute(rank_state& rs, time_ns d, time_ns cpu, time_ns lead, string_id name,
                                                  std::uint32_t op) {
  const graph::task_id t = on_compute(rs, graph::task_kind::gpu_compute, d, name);
  launched(rs, t, cpu, lead);
  rs.last_compute = t;
  if (notes_ && op != program_notes::none) note_task(out_->notes.op_of_task, t, op);
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_tp_collective(rank_state& rs, std::string_view kind, std::int64_t bytes,
                                                        time_ns d, string_id name, std::int32_t kernels, time_ns cpu,
                                                        time_ns lead, std::int64_t element_bytes) {
  group_state& gs = group(group_type::tp, rs.info.stage, rs.info.dp_index);
  const collective_tasks c =
      collective(rs, rs.info.compute, gs, rs.seq_tp, kind, bytes, d, name, kernels, cpu, lead, element_bytes);
  rs.last_compute = c.complete;
}

// `layer` >= 0: the items are transformer layer `layer` of its chunk, in a `forward` pass or
// not (then its recomputed forward ops, if any, form a span of their own).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_items(rank_state& rs, const std::vector<item>& items, int layer,
                                                bool forward) {
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_totals(rank_state& rs, const totals& t, pass_kind pk) {
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::segments_of(pass_kind pk, bool first, bool last, std::vector<segment>& out) const {
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
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_pass(rank_state& rs, pass_kind pk, bool first, bool last,
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

// Reduction of `params` gradients that are final once `after` ends: all-reduce (no ZeRO) or
// reduce-scatter (ZeRO ≥ 1).
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::reduce_gradients(rank_state& rs, std::int64_t params, graph::task_id after) {
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
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::gather_parameters(rank_state& rs, std::int64_t params,
                                                       graph::task_id after) -> collective_tasks {
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
template <model::ComputeModel Compute, model::CommModel Comm>
time_ns program_builder<Compute, Comm>::p2p_duration(int sender_stage, int col) const {
  return opt_.unfold ? p2p_time(sender_stage, col) : p2p_folded_[static_cast<std::size_t>(sender_stage)];
}

// The end of a traced iteration: the host waits for every stream of the rank (Megatron reads the
// loss back; a profiler step ends on the host), so a faster GPU shortens the step. Zero long at
// the device's completion: the timeline is unchanged.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::final_device_sync(rank_state& rs, graph::task_id rank_first) {
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

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::emit_rank(program& out, int rank) {
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

  // --overlap-param-gather (ZeRO-1/2): the all-gathers of the parameters the previous step
  // updated start the iteration, in the order the forward passes need them (chunk by chunk, and
  // in a chunk the buckets in layer order: they fill in backward order, the last layers first).
  // The first forward pass waits for the first bucket only and runs beside the others; the op
  // after it waits for all of them (Megatron gates each layer's forward on its bucket).
  const bool gather_early = par_.overlap_param_gather && (par_.zero_stage == 1 || par_.zero_stage == 2) && dp_ > 1;
  graph::task_id first_gathered = graph::no_task, all_gathered = graph::no_task;
  if (gather_early) {
    std::vector<std::size_t> chunks;  // the op where each chunk's gradients are final, by chunk
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (final_grad[i] != 0) chunks.push_back(i);
    }
    std::stable_sort(chunks.begin(), chunks.end(), [&](std::size_t a, std::size_t b) { return order[a].chunk < order[b].chunk; });
    for (const std::size_t i : chunks) {
      const auto [f, l] = chunk_role(order[i]);
      const auto& bs = buckets_[f][l];
      for (auto b = bs.rbegin(); b != bs.rend(); ++b) {
        all_gathered = gather_parameters(rs, b->second, graph::no_task).complete;
        if (first_gathered == graph::no_task) first_gathered = all_gathered;
      }
    }
  }

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
    if (gather_early && i == 0 && first_gathered != graph::no_task) rs.pending.push_back(first_gathered);
    if (gather_early && i > 0 && all_gathered != graph::no_task) {
      rs.pending.push_back(all_gathered);
      all_gathered = graph::no_task;
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
    final_device_sync(rs, rank_first);
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
  // iteration's forward overlaps them: above).
  if ((par_.zero_stage == 1 || par_.zero_stage == 2) && dp_ > 1 && !gather_early) {
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
  final_device_sync(rs, rank_first);
  out.ranks.push_back(r);
}

}  // namespace lumos::synth::detail

#pragma once
// program_builder: the tasks themselves — processors, compute-stream tasks and their launches,
// collectives with their joins, host waits — added to the task graph (`build_program`) or
// placed into the compiled program (`build_compiled_into`). The emission above them
// (program_emission.hpp) is the same for both; only these functions know where tasks go.
//
// The two forms get the same tasks and edges. The task graph gets them in the order a trace of
// the job would list them: a batch's launching CPU task after the GPU tasks it launches, a
// collective's join after the participant's complete. A compiled program needs every task after
// its predecessors, so there a batch's launching task comes before its first GPU task (its
// length set when the batch is flushed) and each task is given all its edges when it is added.

#include <lumos/synth/detail/program_builder.hpp>

namespace lumos::synth::detail {

template <model::ComputeModel Compute, model::CommModel Comm>
graph::task_id program_builder<Compute, Comm>::add(graph::processor_id p, graph::task_kind k, time_ns d, string_id name,
                                                   int rank) {
  const graph::task_id t = g_->add_task({.kind = k, .processor = p, .duration = d, .name_id = name, .rank = rank});
  if (buf_.first_on[p] == graph::no_task) buf_.first_on[p] = t;
  buf_.last_on[p] = t;
  return t;
}

// pid = tid = 10000 + rank: the main thread of a process, distinct from the device numbers
// that GPU rows use as pid in a Kineto trace.
template <model::ComputeModel Compute, model::CommModel Comm>
graph::processor_id program_builder<Compute, Comm>::cpu_thread(int rank) {
  if (direct_) return sink_->processor(graph::processor_kind::cpu_thread, rank, 10000 + rank, 10000 + rank);
  buf_.first_on.push_back(graph::no_task);
  buf_.last_on.push_back(graph::no_task);
  return g_->add_processor({graph::processor_kind::cpu_thread, rank, 10000 + rank, 10000 + rank,
                            opt_.names ? "rank " + std::to_string(rank) + " launch thread" : std::string()});
}

template <model::ComputeModel Compute, model::CommModel Comm>
graph::processor_id program_builder<Compute, Comm>::stream(const simulated_rank& r, std::int64_t index,
                                                           std::string_view what) {
  const int device = r.rank % hw_.gpus_per_node;
  if (direct_) {
    // What replay_figures reads: the stages' representative compute streams, rank 0's GPU streams.
    const auto watched = static_cast<std::uint8_t>((index == 7 && r.tp_index == 0 && r.dp_index == 0 ? 1 : 0) | (r.rank == 0 ? 2 : 0));
    return sink_->processor(graph::processor_kind::gpu_stream, r.rank, device, index, watched);
  }
  buf_.first_on.push_back(graph::no_task);
  buf_.last_on.push_back(graph::no_task);
  if (!opt_.names) return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, device, index, {}});
  return g_->add_processor({graph::processor_kind::gpu_stream, r.rank, device, index,
                            "rank " + std::to_string(r.rank) + " stream " + std::to_string(index) + " (" +
                                std::string(what) + ")"});
}

template <model::ComputeModel Compute, model::CommModel Comm>
graph::processor_id program_builder<Compute, Comm>::barrier(const group_state& gs) {
  if (direct_) return sink_->processor(graph::processor_kind::barrier, gs.ranks.front(), gs.id, 0);
  buf_.first_on.push_back(graph::no_task);
  buf_.last_on.push_back(graph::no_task);
  return g_->add_processor({graph::processor_kind::barrier, gs.ranks.front(), gs.id, 0,
                            opt_.names ? "group " + gs.name : std::string()});
}

// A compute-stream GPU task: takes the pending start edges, and is launched as `launch` says
// (when given).
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline graph::task_id program_builder<Compute, Comm>::on_compute(rank_state& rs, graph::task_kind k, time_ns d, string_id name,
                                                          const launch_spec* launch) {
  graph::task_id t = graph::no_task;
  if (direct_) {
    if (launch != nullptr) {
      const launch_ref l = launch_edge(rs, *launch);
      t = sink_->task(rs.info.compute, k, d, rs.pending, graph::no_task, &l);
      rs.launched = {t, l.launcher, l.delay};
    } else {
      t = sink_->task(rs.info.compute, k, d, rs.pending);
    }
  } else {
    t = add(rs.info.compute, k, d, name, rs.info.rank);
    for (const graph::task_id from : rs.pending) g_->add_edge(from, t, 0, graph::edge_kind::dependency);
  }
  rs.pending.clear();
  if (rs.info.pipeline_first == graph::no_task && rs.in_pipeline) rs.info.pipeline_first = t;
  if (launch != nullptr && !direct_) launched(rs, t, *launch);
  return t;
}

// The launch edge of the GPU task about to be placed (compiled program). At the `pass`
// granularity the batch's launching CPU task is made before its first GPU task and each launch
// edge is the batch's host time before it plus its lead, the edges `flush_launches` gives in
// the task graph; at `kernel`, one CPU task per GPU task.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline launch_ref program_builder<Compute, Comm>::launch_edge(rank_state& rs, const launch_spec& l) {
  if (opt_.detail == granularity::pass) {
    if (l.before_last && l.cpu != 0) throw error("program builder: a launch queued before the last one has host time");
    if (rs.launcher == graph::no_task) rs.launcher = cpu_task(rs, 0);
    const time_ns before = l.before_last ? rs.batch_cpu - rs.last_launch_cpu : rs.batch_cpu;
    rs.batch_cpu += l.cpu;
    if (!l.before_last) rs.last_launch_cpu = l.cpu;
    return {rs.launcher, graph::clamp_delay(before + l.lead)};
  }
  return {cpu_task(rs, l.cpu), graph::clamp_delay(l.lead)};
}

// A task of the launching thread (compiled program), after the host waits folded into it.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline graph::task_id program_builder<Compute, Comm>::cpu_task(rank_state& rs, time_ns duration) {
  const graph::task_id t = sink_->task(rs.info.cpu, graph::task_kind::cpu, duration, rs.waits);
  rs.waits.clear();
  return t;
}

// Launches of GPU task `gpu_task` (task graph). At the `kernel` granularity: one CPU task per
// GPU task, right away. At `pass`: batched, one CPU task per pipeline op (see
// `flush_launches`). Launch edges count from the call's start, as the trace builder's do: the
// GPU task may start once its (first) kernel's launch has run.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::launched(rank_state& rs, graph::task_id gpu_task, const launch_spec& l) {
  if (opt_.detail == granularity::pass) {
    if (l.before_last && !rs.launches.empty()) {
      rs.launches.insert(rs.launches.end() - 1, {gpu_task, l.cpu, l.lead});
    } else {
      rs.launches.push_back({gpu_task, l.cpu, l.lead});
    }
    return;
  }
  const graph::task_id c = add(rs.info.cpu, graph::task_kind::cpu, l.cpu, n_launch_, rs.info.rank);
  g_->add_edge(c, gpu_task, l.lead, graph::edge_kind::launch, graph::edge_flags::from_start);
  if (notes_) rs.cpu_tasks.push_back(c);
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
[[gnu::always_inline]] inline void program_builder<Compute, Comm>::flush_launches(rank_state& rs) {
  if (direct_) {
    if (rs.launcher != graph::no_task) sink_->set_duration(rs.info.cpu, rs.launcher, rs.batch_cpu);
    rs.launcher = graph::no_task;
    rs.batch_cpu = rs.last_launch_cpu = 0;
    return;
  }
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
[[gnu::always_inline]] inline void program_builder<Compute, Comm>::host_wait(rank_state& rs, graph::task_id gpu_task) {
  if (gpu_task == graph::no_task) return;
  flush_launches(rs);
  if (direct_) {  // folded into the thread's next task (compiled_program)
    rs.waits.push_back(gpu_task);
    sink_->fold(1, 0);
    return;
  }
  const graph::task_id w = add(rs.info.cpu, graph::task_kind::cpu, 0, n_host_sync_, rs.info.rank);
  g_->add_edge(gpu_task, w, 0, graph::edge_kind::sync);
  if (notes_) rs.cpu_tasks.push_back(w), out_->notes.host_syncs.push_back(w);
}

// One participant's share of a collective of group `gs` (its `seq`-th), on `stream_id`,
// launched with `cpu` ns of host time (default: the collective's enqueue time per kernel) and
// a launch edge of `lead` (default: `cpu`); `after`, when given, precedes its arrive.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline auto program_builder<Compute, Comm>::collective(
    rank_state& rs, graph::processor_id stream_id, group_state& gs, std::int64_t& seq, std::string_view kind,
    std::int64_t bytes, time_ns duration, string_id name, std::int32_t kernels, time_ns cpu, time_ns lead,
    std::int64_t element_bytes, graph::task_id after, bool before_last) -> collective_tasks {
  if (cpu < 0) cpu = collective_cpu_ * kernels;
  const launch_spec launch{cpu, lead < 0 ? cpu : lead, before_last};
  const auto k = static_cast<std::size_t>(seq++);
  if (!direct_) return add_collective(rs, stream_id, gs, k, kind, bytes, duration, name, launch, element_bytes, after);
  if (gs.participants == 1) {
    const launch_ref l = launch_edge(rs, launch);
    if (launch.before_last && stream_id == rs.info.compute && rs.info.rank != 0 && after == graph::no_task &&
        rs.pending.empty() && sink_->last_on(stream_id) == rs.launched.task && l.launcher == rs.launched.launcher &&
        l.delay <= rs.launched.delay) {
      // Queued right behind the compute task of its batch, launched no later: it starts when that
      // task ends, so that task takes its time (compiled_program): no task, no launch edge.
      sink_->add_duration(stream_id, rs.launched.task, duration);
      sink_->fold(2, 1);
      return {rs.launched.task, rs.launched.task};
    }
    // The arrive folded into its complete (compiled_program): one task, the arrive's edges.
    const graph::task_id t = arrive(rs, stream_id, gs, k, l, after, graph::task_kind::comm_complete, duration);
    sink_->fold(1, 0);
    return {t, t};
  }
  return place_joined(rs, stream_id, gs, k, launch, duration, after);
}

// A collective with several participants in the compiled program: this one's arrive and
// complete, or its send queued until its receive is posted.
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::place_joined(rank_state& rs, graph::processor_id stream_id, group_state& gs,
                                                  std::size_t k, const launch_spec& launch, time_ns duration,
                                                  graph::task_id after) -> collective_tasks {
  collective_tasks c;
  if ((stream_id == rs.info.send_next || stream_id == rs.info.send_prev) && gs.participants == 2 &&
      (gs.queued_head < gs.queued.size() || gs.arrived.size() <= k || gs.arrived[k] == 0)) {
    // A pipeline send before its receive is posted: queued (see group_state::queued).
    const launch_ref l = launch_edge(rs, launch);
    gs.queued.push_back({k, stream_id, l, after, duration});
    return c;
  }
  c.arrive = arrive(rs, stream_id, gs, k, launch_edge(rs, launch), after);
  c.complete = complete(stream_id, gs, k, duration);
  return c;
}

// The collective's tasks and edges in the task graph.
template <model::ComputeModel Compute, model::CommModel Comm>
auto program_builder<Compute, Comm>::add_collective(rank_state& rs, graph::processor_id stream_id, group_state& gs,
                                                    std::size_t k, std::string_view kind, std::int64_t bytes,
                                                    time_ns duration, string_id name, const launch_spec& launch,
                                                    std::int64_t element_bytes, graph::task_id after) -> collective_tasks {
  const bool on_compute_stream = stream_id == rs.info.compute;
  collective_tasks c;
  c.arrive = on_compute_stream ? on_compute(rs, graph::task_kind::comm_arrive, 0, name)
                               : add(stream_id, graph::task_kind::comm_arrive, 0, name, rs.info.rank);
  // The complete right after its arrive (task ids: arrive + 1), which reports rely on.
  c.complete = add(stream_id, graph::task_kind::comm_complete, duration, name, rs.info.rank);
  launched(rs, c.arrive, launch);
  if (notes_) {
    out_->notes.comms.push_back({gs.type, element_bytes});
    const auto idx = static_cast<std::uint32_t>(out_->notes.comms.size() - 1);
    note_task(out_->notes.comm_of_task, c.arrive, idx);
    note_task(out_->notes.comm_of_task, c.complete, idx);
  }
  graph::task_id join = graph::no_task;
  if (gs.participants > 1) {
    if (gs.joins.size() <= k) {
      if (gs.barrier == no_processor) gs.barrier = barrier(gs);
      gs.joins.push_back(add(gs.barrier, graph::task_kind::join, 0, n_join_, gs.ranks.front()));
    }
    join = gs.joins[k];
    g_->add_edge(c.arrive, join, 0, graph::edge_kind::collective);
    g_->add_edge(join, c.complete, 0, graph::edge_kind::collective);
  }
  if (opt_.record_collectives) record_collective(gs, k, kind, bytes, join, c);
  if (after != graph::no_task) g_->add_edge(after, c.arrive, 0, graph::edge_kind::dependency);
  return c;
}

// One participant's arrive at the `k`-th collective of `gs` (compiled program): its launch,
// the pending edges when on the compute stream, `after`; and its edge into the join.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline graph::task_id program_builder<Compute, Comm>::arrive(rank_state& rs, graph::processor_id stream_id, group_state& gs,
                                                      std::size_t k, const launch_ref& l, graph::task_id after,
                                                      graph::task_kind kind, time_ns duration) {
  const bool on_compute_stream = stream_id == rs.info.compute;
  const graph::task_id a = sink_->task(stream_id, kind, duration, on_compute_stream ? std::span<const graph::task_id>(rs.pending)
                                                                                    : std::span<const graph::task_id>(),
                                       after, &l);
  if (on_compute_stream) {
    rs.pending.clear();
    if (rs.info.pipeline_first == graph::no_task && rs.in_pipeline) rs.info.pipeline_first = a;
  }
  if (gs.participants > 1) join_arrive(gs, k, a);
  return a;
}

// Arrive `a` at the `k`-th collective of `gs` (compiled program): kept for the completes; into
// the join if one was made already; and the send of this sequence goes now if it was queued.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline void program_builder<Compute, Comm>::join_arrive(group_state& gs, std::size_t k, graph::task_id a) {
  if (gs.arrived.size() <= k) [[unlikely]] more_sequences(gs, k);
  gs.arrives[k * static_cast<std::size_t>(gs.participants) + gs.arrived[k]++] = a;
  const graph::task_id join = gs.joins[k];
  if (join != graph::no_task && join != group_state::folded_join) sink_->arrive(join, a);
  if (gs.queued_head < gs.queued.size() && gs.queued[gs.queued_head].seq == k) [[unlikely]] send_queued(gs, k);
}

// Room for the arrives and joins of sequences up to `k` of `gs`, grown geometrically.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::more_sequences(group_state& gs, std::size_t k) {
  const std::size_t size = std::max({k + 1, 2 * gs.arrived.size(), std::size_t{16}});
  gs.arrived.resize(size, 0);
  gs.arrives.resize(size * static_cast<std::size_t>(gs.participants), graph::no_task);
  gs.joins.resize(size, graph::no_task);
}

// The queued send of sequence `k` of `gs`, now that its receive is posted.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::send_queued(group_state& gs, std::size_t k) {
  const group_state::queued_send q = gs.queued[gs.queued_head++];
  const graph::task_id send = sink_->task(q.stream, graph::task_kind::comm_arrive, 0, {}, q.after, &q.launch);
  join_arrive(gs, k, send);
  (void)complete(q.stream, gs, k, q.duration);
}

// The complete after a participant's arrive at the `k`-th collective of `gs` (compiled program).
// When every participant has arrived, the join is folded into it: its edges are the arrives'.
// Otherwise (a group whose last participants come later) the join is a task, waiting for them.
template <model::ComputeModel Compute, model::CommModel Comm>
[[gnu::always_inline]] inline graph::task_id program_builder<Compute, Comm>::complete(graph::processor_id stream_id, group_state& gs, std::size_t k,
                                                        time_ns duration) {
  const auto n = static_cast<std::size_t>(gs.participants);
  graph::task_id& join = gs.joins[k];
  if (join == graph::no_task && gs.arrived[k] == n) {
    join = group_state::folded_join;
    // The join's n edges in and n out become n edges into each of the n completes; its barrier
    // processor, if none is made, is counted.
    sink_->fold(1, static_cast<std::ptrdiff_t>(2 * n) - static_cast<std::ptrdiff_t>(n * n));
    if (gs.barrier == no_processor && !gs.barrier_folded) {
      gs.barrier_folded = true;
      ++folded_barriers_;
    }
  }
  if (join == group_state::folded_join) {
    return sink_->task(stream_id, graph::task_kind::comm_complete, duration, std::span(gs.arrives.data() + k * n, n));
  }
  if (join == graph::no_task) {
    if (gs.barrier == no_processor) {
      gs.barrier = barrier(gs);
      if (gs.barrier_folded) --folded_barriers_;
    }
    join = sink_->join(gs.barrier, gs.participants);
    for (std::uint32_t i = 0; i < gs.arrived[k]; ++i) sink_->arrive(join, gs.arrives[k * n + i]);
  }
  return sink_->task(stream_id, graph::task_kind::comm_complete, duration, {}, join);
}

// The collective instance of sequence `k` of `gs` (made by its first participant), with this
// participant's tasks.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::record_collective(group_state& gs, std::size_t k, std::string_view kind,
                                                       std::int64_t bytes, graph::task_id join, collective_tasks c) {
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

// The end of a traced iteration: the host waits for every stream of the rank (Megatron reads the
// loss back; a profiler step ends on the host), so a faster GPU shortens the step. Zero long at
// the device's completion: the timeline is unchanged. Its sync edges come from the last task of
// each of the rank's GPU streams, in the order of their first tasks.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::final_device_sync(rank_state& rs) {
  flush_launches(rs);
  const simulated_rank& r = rs.info;
  struct stream_end {
    graph::task_id first, last;
  };
  std::array<stream_end, 7> ends{};
  std::size_t n = 0;
  for (const graph::processor_id p :
       {r.compute, r.data_parallel, r.send_next, r.send_prev, r.recv_prev, r.recv_next, r.context_parallel}) {
    if (p == no_processor) continue;
    const graph::task_id last = direct_ ? sink_->last_on(p) : buf_.last_on[p];
    if (last == graph::no_task) continue;
    // In the order of their first tasks (insertion into the few found so far).
    const stream_end e{direct_ ? graph::no_task : buf_.first_on[p], last};
    std::size_t at = n++;
    for (; at > 0 && ends[at - 1].first > e.first; --at) ends[at] = ends[at - 1];
    ends[at] = e;
  }
  if (n == 0) return;
  if (direct_) {
    for (std::size_t i = 0; i < n; ++i) rs.waits.push_back(ends[i].last);
    (void)cpu_task(rs, 0);
    return;
  }
  const graph::task_id w = add(r.cpu, graph::task_kind::cpu, 0, n_host_sync_, r.rank);
  for (std::size_t i = 0; i < n; ++i) g_->add_edge(ends[i].last, w, 0, graph::edge_kind::sync);
  rs.cpu_tasks.push_back(w);
  out_->notes.host_syncs.push_back(w);
}

// A simulated rank of the compiled program, its pipeline phase as positions.
template <model::ComputeModel Compute, model::CommModel Comm>
compiled_rank program_builder<Compute, Comm>::compiled(const simulated_rank& r) const {
  compiled_rank c;
  c.rank = r.rank;
  c.stage = r.stage;
  c.tp_index = r.tp_index;
  c.dp_index = r.dp_index;
  c.compute = r.compute;
  if (r.pipeline_first != graph::no_task) c.pipeline_first = sink_->position(r.pipeline_first);
  if (r.pipeline_last != graph::no_task) c.pipeline_last = sink_->position(r.pipeline_last);
  return c;
}

}  // namespace lumos::synth::detail

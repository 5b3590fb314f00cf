#pragma once
// The Kineto writer's tasks (report/trace_writer.hpp): one rank's tasks in id order, trace-built
// ones through their source events at their replayed times, model-built ones (and the ones a
// what-if added to a trace) as runtime calls, kernels, operators and the sync rows PyTorch
// writes for them.

#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/detail/kineto_rank.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/trace/event.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

namespace lumos::report::detail {

// Writes the tasks of rank `r`; numbers the correlation ids of the calls and kernels that have
// none from the trace first (`number_calls`, once, before `write`).
class kineto_task_writer {
 public:
  explicit kineto_task_writer(kineto_rank& r)
      : r_(r), g_(r.g), w_(r.w), corr_of_(r.tasks), launch_corr_(r.tasks), launch_of_(r.tasks), waits_on_(r.tasks) {}

  /// Correlation ids for launches without an event, the cross-stream waits and the host waits
  /// to write, in the order their ids are taken.
  void number_calls() {
    // Trace-built jobs keep their own correlation ids; tasks a what-if added (a launch and its
    // kernel with no source event) are numbered from 2^40 up, clear of any the profiler wrote.
    next_corr_ = r_.src != nullptr ? std::int64_t{1} << 40 : 1;
    number_launches();
    find_stream_waits();
    find_host_waits();
    if (r_.job.subset && r_.job.lone_groups != nullptr) {
      for (const graph::collective_instance& ci : *r_.job.lone_groups) {
        for (const graph::task_id t : ci.complete) lone_group_[t] = &ci;
      }
    }
  }

  /// Every task of the rank, in id order (the order on each processor).
  void write() {
    for (std::size_t ti = 0; ti < r_.tasks.size(); ++ti) {
      const graph::task_id t = r_.tasks[ti];
      if (r_.src != nullptr && g_.source[t] != ~0U) {
        traced_task(ti, t);
      } else {
        model_task(t);
      }
    }
  }

 private:
  // Model-built: a dependency between two streams of this rank is written as PyTorch shows it:
  // a cudaEventRecord just inside the producer's launch call, a cudaStreamWaitEvent just before
  // the consumer's launch, and a cuda_sync "Stream Wait Event" row that pairs them exactly.
  struct stream_wait {
    graph::task_id producer, consumer;
    std::int64_t record_corr, wait_corr;
    bool record_with_wait = false;  // trace-built: the record is written just before the wait
  };
  // A host task without an event that waits for GPU ops (sync edges: one a what-if added to a
  // trace-built job, or a model-built job's host wait) is written as the synchronize call it
  // stands for, lasting the wait, with the cuda_sync row that names what it waited for: read
  // back, the wait moves with the GPU work, where an idle gap before a zero-length call would
  // be kept as it was.
  struct host_wait {
    graph::task_id on = graph::no_task;
    bool device = false;  // it waits for several streams
  };

  void number_launches() {
    for (const std::size_t i : r_.rank_edges) {
      const auto& e = g_.edges[i];
      if (e.kind == graph::edge_kind::launch && g_.rank[e.from] == r_.rank && g_.source[e.from] == ~0U && !corr_of_.find(e.from)) {
        corr_of_.set(e.from, next_corr_++);
      }
    }
    for (const std::size_t i : r_.rank_edges) {
      const auto& e = g_.edges[i];
      if (e.kind != graph::edge_kind::launch) continue;
      if (const std::int64_t* c = corr_of_.find(e.from)) launch_corr_.set(e.to, *c);
    }
    for (const std::size_t i : r_.rank_edges) {
      const auto& e = g_.edges[i];
      if (e.kind == graph::edge_kind::launch && g_.rank[e.to] == r_.rank) launch_of_.set(e.to, e.from);
    }
  }

  // A dependency edge between two GPU streams of this rank.
  [[nodiscard]] bool cross_stream(const graph::edge& e) const {
    if ((e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) || e.finish) return false;
    if (g_.rank[e.from] != r_.rank || g_.rank[e.to] != r_.rank || g_.processor[e.from] == g_.processor[e.to]) return false;
    return g_.processors[g_.processor[e.from]].kind == graph::processor_kind::gpu_stream &&
           g_.processors[g_.processor[e.to]].kind == graph::processor_kind::gpu_stream;
  }

  void find_stream_waits() {
    for (const std::size_t i : r_.rank_edges) {
      const auto& e = g_.edges[i];
      if (!cross_stream(e)) continue;
      if (r_.src == nullptr) {
        const graph::task_id* la = launch_of_.find(e.from);
        const graph::task_id* lb = launch_of_.find(e.to);
        if (la == nullptr || lb == nullptr || *la == *lb) continue;
        const stream_wait sw{e.from, e.to, next_corr_, next_corr_ + 1};
        next_corr_ += 2;
        records_after_.insert({*la, sw});
        waits_before_.insert({*lb, sw});
      } else if (g_.source[e.to] == ~0U) {
        // Trace-built: a dependency of a GPU op a what-if added (no source event) on another
        // stream of this rank, recorded and waited for just before the added op's launch; the
        // last op queued on the producer's stream by then is the producer.
        const graph::task_id* lb = launch_of_.find(e.to);
        if (lb == nullptr) continue;
        waits_before_.insert({*lb, stream_wait{e.from, e.to, next_corr_, next_corr_ + 1, true}});
        next_corr_ += 2;
      }
    }
  }

  void find_host_waits() {
    for (const std::size_t i : r_.rank_edges) {
      const auto& e = g_.edges[i];
      if (e.kind != graph::edge_kind::sync || g_.rank[e.to] != r_.rank || g_.source[e.to] != ~0U) continue;
      if (const host_wait* h = waits_on_.find(e.to)) {
        waits_on_.set(e.to, {h->on, h->device || g_.processor[h->on] != g_.processor[e.from]});
      } else {
        waits_on_.set(e.to, {e.from, false});
      }
    }
  }

  void runtime(std::string_view name, const graph::processor_info& p, time_ns at, std::int64_t corr) {
    w_.begin_object().field("ph", "X").field("cat", "cuda_runtime").field("name", name).field("pid", p.owner).field("tid", p.index);
    w_.key("ts").microseconds(r_.us(at)).key("dur").microseconds(0);
    w_.key("args").begin_object().field("correlation", corr).end_object().end_object();
  }

  [[nodiscard]] std::uint8_t weight_of(graph::task_id t) const {
    return r_.job.weight_pass != nullptr && t < r_.job.weight_pass->size() ? (*r_.job.weight_pass)[t] : std::uint8_t{0};
  }

  // Subset: a communication op's group as the graph has it (stages rename and renumber them).
  [[nodiscard]] const graph::collective_instance* group_of(graph::task_id t, graph::task_kind kind) const {
    const bool comm = kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm;
    if (!(r_.job.subset || r_.job.groups_from_graph) || !comm) return nullptr;
    if (r_.index.instance_of[t] != rank_index::none) return &g_.collectives[r_.index.instance_of[t]];
    const auto it = lone_group_.find(t);
    return it != lone_group_.end() ? it->second : nullptr;
  }

  // A task with a source event: the event at the task's times (a copy's with the copy's ids).
  void traced_task(std::size_t ti, graph::task_id t) {
    const auto kind = g_.kind[t];
    const time_ns s = r_.begin_of(t), f = r_.end_of(t);
    const std::uint32_t ev = g_.source[t];
    const trace::event& e = r_.src->events[ev];
    const bool cpu = trace::is_cpu_side(e.cat);
    const std::uint32_t k = r_.copy_k.empty() ? 0 : r_.copy_k[ti];
    if (cpu) cpu_end_[g_.processor[t]] = f;
    // The warp maps the trace's times to copy 0's; copies are moved from there.
    if (cpu && k == 0) r_.warps[e.lane].add(g_.observed_start[t], s), r_.warps[e.lane].add(g_.observed_end[t], f);
    if (kind == graph::task_kind::comm_arrive) return;  // written with its complete
    const bool comm = kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm;
    if (k > 0) {
      // A copy: its whole call (split calls: from the issue half to the wait half) or its op
      // (from its arrival), written once.
      const auto& [first, last] = r_.copy_span.at(kineto_rank::copy_key(ev, k));
      if (written_copy_[kineto_rank::copy_key(ev, k)]++ != 0) return;
      const time_ns begin = cpu || comm ? r_.begin_of(first) : s;
      const time_ns end = cpu ? r_.end_of(last) : f;
      r_.source_event(ev, begin, end, static_cast<std::int64_t>(k) * kineto_rank::copy_ids, 0, group_of(t, kind));
      if (r_.job.subset && cpu) r_.enclosed[e.lane].push_back({e.ts, e.end(), begin, end, 0, k, weight_of(t)});
      return;
    }
    time_ns begin = s;
    if (comm && r_.map->arrive_of_event[ev] != graph::no_task) {
      begin = r_.begin_of(r_.map->arrive_of_event[ev]);  // the op occupies its stream from its arrival
    }
    if (r_.written[ev]) return;  // the wait half of a split call: the issue half wrote the whole call
    time_ns end = f;
    // A split call (issue and wait halves) ends with its wait half, unless a rewrite left that out.
    if (cpu && r_.map->task_of_event[ev] != t && r_.map->task_of_event[ev] != graph::no_task) end = r_.end_of(r_.map->task_of_event[ev]);
    r_.written[ev] = 1;
    r_.source_event(ev, begin, end, 0, 0, group_of(t, kind));
    if (r_.job.subset && cpu) r_.enclosed[e.lane].push_back({e.ts, e.end(), begin, end, 0, 0, weight_of(t)});
  }

  // A collective's complete task `t`: the arrive on its stream (whose launch is the kernel's).
  [[nodiscard]] static graph::task_id arrive_of(const graph::collective_instance* ci, graph::task_id t) {
    graph::task_id launched = t;
    for (std::size_t k = 0; ci != nullptr && k < ci->complete.size(); ++k) {
      if (ci->complete[k] == t) launched = ci->arrive[k];
    }
    return launched;
  }

  // A task without a source event: model-built, or added to a trace by a what-if.
  void model_task(graph::task_id t) {
    const auto& p = g_.processors[g_.processor[t]];
    const auto kind = g_.kind[t];
    if (kind == graph::task_kind::comm_arrive) return;
    const time_ns s = r_.begin_of(t);
    time_ns begin = s;
    const graph::collective_instance* ci = nullptr;
    if (kind == graph::task_kind::comm_complete) {
      ci = r_.index.instance_of[t] != rank_index::none ? &g_.collectives[r_.index.instance_of[t]] : nullptr;
      if (ci != nullptr) begin = r_.begin_of(arrive_of(ci, t));
    }
    // Trace-built helpers without an event ("thread end") are not written; a launch that a
    // what-if added and its kernel (a collective's launch goes to its arrive) are, as a
    // model-built job's.
    if (r_.src != nullptr && corr_of_.find(t) == nullptr && launch_corr_.find(arrive_of(ci, t)) == nullptr && waits_on_.find(t) == nullptr) {
      return;
    }
    const task_decoration* deco = r_.job.decorations != nullptr ? r_.job.decorations->find(t) : nullptr;
    stream_waits_before(t, p, s);
    model_call(t, p, begin, ci, deco);
    for (auto [it, stop] = records_after_.equal_range(t); it != stop; ++it) {
      runtime("cudaEventRecord", p, std::max(s, r_.end_of(t) - 1), it->second.record_corr);
    }
  }

  // The record and wait calls and the Stream Wait Event row before launch call `t`.
  void stream_waits_before(graph::task_id t, const graph::processor_info& p, time_ns s) {
    for (auto [it, stop] = waits_before_.equal_range(t); it != stop; ++it) {
      const stream_wait& sw = it->second;
      const auto& consumer = g_.processors[g_.processor[sw.consumer]];
      const auto& producer = g_.processors[g_.processor[sw.producer]];
      if (sw.record_with_wait) runtime("cudaEventRecord", p, s - 1, sw.record_corr);
      runtime("cudaStreamWaitEvent", p, s - 1, sw.wait_corr);
      w_.begin_object().field("ph", "X").field("cat", "cuda_sync").field("name", "Stream Wait Event");
      w_.field("pid", consumer.owner).field("tid", consumer.index).key("ts").microseconds(r_.us(s - 1)).key("dur").microseconds(0);
      w_.key("args").begin_object().field("cuda_sync_kind", "Stream Wait Event").field("stream", consumer.index);
      w_.field("wait_on_stream", producer.index).field("wait_on_cuda_event_record_corr_id", sw.record_corr);
      w_.field("correlation", sw.wait_corr).field("device", consumer.owner).end_object().end_object();
    }
  }

  // The task as a kernel or a runtime call (a synchronize for a host wait, inside its operator
  // when decorated), with the Synchronize row of a host wait.
  void model_call(graph::task_id t, const graph::processor_info& p, time_ns begin, const graph::collective_instance* ci,
                  const task_decoration* deco) {
    const time_ns f = r_.end_of(t);
    const bool gpu = p.kind == graph::processor_kind::gpu_stream;
    std::string_view name = g_.task_name(t);
    if (deco != nullptr && gpu && !deco->kernel.empty()) name = deco->kernel;
    if (deco != nullptr && !gpu && deco->blocking) {
      if (const auto it = cpu_end_.find(g_.processor[t]); it != cpu_end_.end()) begin = std::min(begin, it->second);
      name = deco->runtime;
    }
    // A decoration that names the call (a kernel-level job's synchronize) is written as it says.
    const host_wait* waiting = gpu || (deco != nullptr && deco->blocking) ? nullptr : waits_on_.find(t);
    std::int64_t sync_corr = -1;
    if (waiting != nullptr) {
      // From the thread's previous task, when the call was issued, to the end of the wait.
      if (const auto it = cpu_end_.find(g_.processor[t]); it != cpu_end_.end()) begin = std::min(begin, it->second);
      name = waiting->device ? "cudaDeviceSynchronize" : "cudaStreamSynchronize";
      sync_corr = next_corr_++;
    }
    if (!gpu) cpu_end_[g_.processor[t]] = f;
    if (deco != nullptr && !gpu && !deco->cpu_op.empty()) {
      cpu_op_around(t, p, begin, *deco);
      if (deco->launch_ns >= 0) begin = std::max(begin, f - deco->launch_ns);
      name = deco->runtime;
    }
    w_.begin_object().field("ph", "X").field("cat", gpu ? "kernel" : "cuda_runtime").field("name", name);
    w_.field("pid", p.owner).field("tid", p.index);
    w_.key("ts").microseconds(r_.us(begin)).key("dur").microseconds(f - begin);
    w_.key("args").begin_object();
    if (gpu) {
      kernel_args(t, p, ci, deco);
    } else if (const std::int64_t* c = corr_of_.find(t)) {
      w_.field("correlation", *c);
      if (deco != nullptr && !deco->cpu_op.empty()) w_.field("External id", *c);
    } else if (sync_corr >= 0) {
      w_.field("correlation", sync_corr);
    }
    w_.end_object().end_object();
    if (waiting != nullptr) {
      const auto& on = g_.processors[g_.processor[waiting->on]];
      w_.begin_object().field("ph", "X").field("cat", "cuda_sync").field("name", waiting->device ? "Device Synchronize" : "Stream Synchronize");
      w_.field("pid", on.owner).field("tid", on.index).key("ts").microseconds(r_.us(f)).key("dur").microseconds(0);
      w_.key("args").begin_object().field("cuda_sync_kind", waiting->device ? "Device Synchronize" : "Stream Synchronize");
      w_.field("stream", waiting->device ? std::int64_t{-1} : on.index).field("correlation", sync_corr).field("device", on.owner);
      w_.end_object().end_object();
    }
  }

  // The operator that dispatched launch `t`, around its runtime call; the call ends the task.
  void cpu_op_around(graph::task_id t, const graph::processor_info& p, time_ns begin, const task_decoration& deco) {
    w_.begin_object().field("ph", "X").field("cat", "cpu_op").field("name", deco.cpu_op);
    w_.field("pid", p.owner).field("tid", p.index);
    w_.key("ts").microseconds(r_.us(begin)).key("dur").microseconds(r_.end_of(t) - begin);
    w_.key("args").begin_object();
    if (const std::int64_t* c = corr_of_.find(t)) w_.field("External id", *c);
    if (!deco.input_dims.empty()) w_.key("Input Dims").raw(deco.input_dims);
    if (!deco.input_type.empty()) w_.key("Input type").raw(deco.input_type);
    w_.end_object().end_object();
  }

  // A kernel's args: its stream, its launch's correlation and, for a collective, the group.
  void kernel_args(graph::task_id t, const graph::processor_info& p, const graph::collective_instance* ci, const task_decoration* deco) {
    w_.field("device", p.owner).field("stream", p.index);
    // A collective kernel is written once, for its complete; its launch went to its arrive.
    if (const std::int64_t* c = launch_corr_.find(arrive_of(ci, t))) {
      w_.field("correlation", *c);
      if (deco != nullptr) w_.field("External id", *c);  // its operator's
    }
    if (ci == nullptr) return;
    const bool named = deco != nullptr && !deco->collective.empty();
    w_.field("Collective name", named ? std::string_view(deco->collective) : std::string_view(ci->kind));
    w_.field("Process Group Name", ci->group);
    if (deco != nullptr && !deco->group_description.empty()) w_.field("Process Group Description", deco->group_description);
    if (deco != nullptr && !deco->dtype.empty()) w_.field("dtype", deco->dtype);
    const std::int64_t elements = deco != nullptr && deco->element_bytes > 0 ? ci->bytes / deco->element_bytes : ci->bytes;
    if (ci->bytes > 0) w_.field("In msg nelems", elements).field("Out msg nelems", elements);
    if (!ci->group_ranks.empty()) {
      std::string ranks = "[";
      for (std::size_t k = 0; k < ci->group_ranks.size(); ++k) ranks += (k ? ", " : "") + std::to_string(ci->group_ranks[k]);
      w_.field("Process Group Ranks", ranks + "]").field("Group size", ci->group_ranks.size());
    }
  }

  kineto_rank& r_;
  const graph::task_graph& g_;
  json_writer& w_;
  std::int64_t next_corr_ = 1;
  task_map<std::int64_t> corr_of_;       // model-built or added: launch task → correlation
  task_map<std::int64_t> launch_corr_;   // GPU task → its launch's correlation
  task_map<graph::task_id> launch_of_;   // GPU task → its launch call
  task_map<host_wait> waits_on_;
  std::multimap<graph::task_id, stream_wait> records_after_, waits_before_;  // keyed by launch call
  std::unordered_map<graph::task_id, const graph::collective_instance*> lone_group_;
  std::map<graph::processor_id, time_ns> cpu_end_;                  // end of each thread's last task written
  std::unordered_map<std::uint64_t, std::uint8_t> written_copy_;   // (event, k > 0) written
};

}  // namespace lumos::report::detail

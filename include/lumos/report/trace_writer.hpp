#pragma once
// Writes a simulated job as Kineto-style JSON, one file per rank, that Perfetto opens and that
// `lumos inspect` / `lumos replay` read back. Replaying a written trace reproduces the replay
// that wrote it (tests/graph/test_trace_roundtrip.cpp).
// Writing the files (and gzip) is report/trace_files.hpp, outside lumos::core.
//
// Tasks that came from a trace keep their original names, categories and args; CPU events that
// are not tasks (operators, annotations) are placed by a piecewise-linear map of their thread's
// time from the measured to the simulated timeline. Tasks built from a model (no source event)
// are written as runtime calls and kernels, with correlation ids from their launch edges and
// collective args from their `collective_instance`.

#include <lumos/core/error.hpp>
#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lumos::report {

/// How a model-built task is written in a kernel-level trace (`trace_decorations`).
struct task_decoration {
  std::string kernel;      ///< GPU task: the kernel name written instead of the task's name
  std::string cpu_op;      ///< CPU launch task: the operator written around its runtime call
  std::string input_dims;  ///< its `Input Dims` (raw JSON, e.g. [[4096, 2048], [2048, 6144]])
  std::string input_type;  ///< its `Input type` (raw JSON, e.g. ["c10::BFloat16", "c10::BFloat16"])
  std::string runtime = "cudaLaunchKernel";  ///< the runtime call's name
  /// CPU task that blocks (a synchronize): written from the end of the thread's previous task,
  /// when the call was issued, to its end.
  bool blocking = false;
  /// CPU launch task: length of the runtime call, which ends the task; the operator's dispatch
  /// fills the rest. Negative: the call is the whole task.
  time_ns launch_ns = -1;
  // Collectives (the complete task):
  std::string collective;         ///< `Collective name`; empty: the instance's kind
  std::string group_description;  ///< `Process Group Description`
  std::string dtype;              ///< `dtype`, e.g. "BFloat16"
  std::int64_t element_bytes = 0; ///< `In msg nelems` = bytes / this (0: the byte count)
};

/// An annotation over a span of one rank's CPU tasks (from the start of `first` to the end of
/// `last`), e.g. a pass marker or a module scope.
struct span_annotation {
  int rank = 0;
  std::string name;
  std::string category = "user_annotation";
  graph::task_id first = graph::no_task, last = graph::no_task;
};

/// What makes a model-built job's trace look like a framework's: per task, how it is written;
/// annotations over spans of CPU tasks.
struct trace_decorations {
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> of_task;  ///< task → index into `list`, or `none`
  std::vector<task_decoration> list;
  std::vector<span_annotation> spans;

  [[nodiscard]] const task_decoration* find(graph::task_id t) const {
    return t < of_task.size() && of_task[t] != none ? &list[of_task[t]] : nullptr;
  }
};

/// The data a writer needs about one simulated job.
struct simulated_job {
  const graph::task_graph* graph = nullptr;
  task_times simulated;                          ///< the replay's times
  time_ns origin = 0;                            ///< absolute ns of job time 0
  const trace::job* source = nullptr;            ///< the traces the graph came from, if any
  const std::vector<graph::rank_map>* maps = nullptr;  ///< event ↔ task maps (with `source`)
  const std::vector<iteration_plan>* plans = nullptr;  ///< iteration windows to write as ProfilerStep
  std::vector<window_result> windows;            ///< simulated window of each plan
  int world_size = 0;
  std::string device_name;                       ///< for deviceProperties of model-built jobs
  double cpu_scale = 1.0;                        ///< the replay's `cpu` scale (busy lead and tail of a step)
  const trace_decorations* decorations = nullptr;  ///< model-built jobs: kernel-level detail
};

namespace detail {

// Piecewise-linear time map of one thread: measured → simulated, through its tasks' ends.
class time_warp {
 public:
  void add(time_ns measured, time_ns simulated) { points_.push_back({measured, simulated}); }
  void finish() {
    std::stable_sort(points_.begin(), points_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  [[nodiscard]] time_ns operator()(time_ns x) const {
    if (points_.empty()) return x;
    auto it = std::upper_bound(points_.begin(), points_.end(), x, [](time_ns v, const auto& p) { return v < p.first; });
    if (it == points_.begin()) return x + (points_.front().second - points_.front().first);
    if (it == points_.end()) return x + (points_.back().second - points_.back().first);
    const auto& [m0, s0] = *(it - 1);
    const auto& [m1, s1] = *it;
    if (m1 == m0) return s0;
    const long double f = static_cast<long double>(x - m0) / static_cast<long double>(m1 - m0);
    return s0 + static_cast<time_ns>(f * static_cast<long double>(s1 - s0));
  }

 private:
  std::vector<std::pair<time_ns, time_ns>> points_;
};

inline void write_args_from_trace(json_writer& w, const trace::rank_trace& r, std::size_t i) {
  const trace::event& e = r.events[i];
  if (e.external_id >= 0) w.field("External id", e.external_id);
  if (e.correlation >= 0 && e.ph == trace::phase::complete) w.field("correlation", e.correlation);
  if (e.stream >= 0) w.field("stream", e.stream);
  if (e.device >= 0) w.field("device", static_cast<int>(e.device));
  const auto [b, en] = r.arg_range(i);
  for (std::uint32_t a = b; a < en; ++a) {
    const trace::arg_key k = r.arg_keys[a];
    w.key(trace::json_key(k));
    if (!trace::is_string_arg(k)) {
      w.value(r.arg_values[a]);
    } else if (k == trace::arg_key::input_dims || k == trace::arg_key::grid || k == trace::arg_key::block) {
      w.raw(r.str(static_cast<string_id>(r.arg_values[a])));  // stored as raw JSON
    } else {
      w.value(r.str(static_cast<string_id>(r.arg_values[a])));
    }
  }
}

}  // namespace detail

/// The simulated job of a trace replay, ready to write.
[[nodiscard]] inline simulated_job simulated_from(const replay_session& s, const trace::job& job) {
  simulated_job sj;
  sj.graph = &s.built.graph;
  sj.simulated = s.simulated_times();
  sj.origin = s.built.origin;
  sj.source = &job;
  sj.maps = &s.built.ranks;
  sj.plans = &s.plans;
  sj.cpu_scale = s.scales.cpu;
  return sj;
}

/// Every rank number of a job, in order.
[[nodiscard]] inline std::vector<int> rank_numbers(const trace::job& job) {
  std::vector<int> ranks;
  for (const auto& r : job.ranks) ranks.push_back(r.rank);
  return ranks;
}

/// Serialises rank `rank_index` (an index into the job's ranks for trace-built jobs, or a rank
/// number for model-built ones) of a simulated job as a Kineto trace.
[[nodiscard]] inline std::string kineto_json(const simulated_job& job, int rank) {
  const graph::task_graph& g = *job.graph;
  std::string out;
  out.reserve(1 << 20);
  json_writer w(out);
  const trace::rank_trace* src = nullptr;
  const graph::rank_map* map = nullptr;
  std::size_t plan_index = 0;
  if (job.source != nullptr) {
    for (std::size_t i = 0; i < job.source->ranks.size(); ++i) {
      if (job.source->ranks[i].rank == rank) {
        src = &job.source->ranks[i];
        map = &(*job.maps)[i];
        plan_index = i;
      }
    }
  } else if (job.plans != nullptr) {
    for (std::size_t i = 0; i < job.plans->size(); ++i) {
      if ((*job.plans)[i].rank == rank) plan_index = i;
    }
  }
  auto us = [&](time_ns job_time) { return job_time + job.origin; };

  w.begin_object();
  w.field("schemaVersion", 1);
  w.key("deviceProperties").begin_array();
  if (src != nullptr) {
    for (const auto& d : src->devices) {
      w.begin_object().field("id", d.id).field("name", d.name).field("totalGlobalMem", d.total_memory);
      w.field("computeMajor", d.compute_major).field("computeMinor", d.compute_minor).field("numSms", d.num_sms).end_object();
    }
  } else if (!job.device_name.empty()) {
    w.begin_object().field("id", 0).field("name", job.device_name).end_object();
  }
  w.end_array();
  w.key("distributedInfo").begin_object().field("backend", src != nullptr && !src->backend.empty() ? src->backend : "nccl");
  w.field("rank", rank);
  if (src != nullptr && src->world_size) {
    w.field("world_size", *src->world_size);
  } else if (job.world_size > 0) {
    w.field("world_size", job.world_size);
  }
  w.end_object();
  w.field("traceName", "simulated by lumos");
  w.key("traceEvents").begin_array();

  // Processor rows: process and thread names.
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> rows;
  for (const auto& p : g.processors) {
    if (p.rank != rank || p.kind == graph::processor_kind::barrier) continue;
    const std::int64_t pid = p.owner;
    const std::int64_t tid = p.index;
    rows[{pid, tid}] = p.name;
  }
  for (const auto& [key, name] : rows) {
    w.begin_object().field("name", "thread_name").field("ph", "M").field("pid", key.first).field("tid", key.second);
    w.key("args").begin_object().field("name", name).end_object().end_object();
  }

  // Tasks of this rank; trace-built ones through their source events.
  std::vector<graph::task_id> tasks;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.rank[t] == rank && g.kind[t] != graph::task_kind::join) tasks.push_back(t);
  }
  // A source event (trace-built jobs) at new times, with its category, name, row and args.
  auto write_source_event = [&](std::size_t i, time_ns begin, time_ns end) {
    const trace::event& e = src->events[i];
    const trace::lane& lane = src->lanes[e.lane];
    w.begin_object().field("ph", "X").field("cat", src->str(e.cat_name)).field("name", src->name(e));
    w.field("pid", lane.pid_text != no_string ? 0 : lane.pid).field("tid", lane.tid_text != no_string ? 0 : lane.tid);
    w.key("ts").microseconds(us(begin)).key("dur").microseconds(end - begin);
    w.key("args").begin_object();
    detail::write_args_from_trace(w, *src, i);
    w.end_object().end_object();
  };
  std::map<std::uint32_t, detail::time_warp> warps;  // by lane (trace-built)
  std::vector<std::uint8_t> written(src != nullptr ? src->events.size() : 0, 0);
  std::int64_t next_corr = 1;
  std::map<graph::task_id, std::int64_t> corr_of;  // model-built: launch task → correlation
  for (const auto& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && g.rank[e.from] == rank && !corr_of.count(e.from) && g.source[e.from] == ~0U) {
      corr_of[e.from] = next_corr++;
    }
  }
  std::map<graph::task_id, std::int64_t> launch_corr;  // GPU task → its launch's correlation
  for (const auto& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && corr_of.count(e.from)) launch_corr[e.to] = corr_of[e.from];
  }
  std::map<graph::task_id, const graph::collective_instance*> instance_of;
  for (const auto& ci : g.collectives) {
    for (const auto c : ci.complete) instance_of[c] = &ci;
  }
  // Model-built: a dependency between two streams of this rank is written as PyTorch shows it:
  // a cudaEventRecord just inside the producer's launch call, a cudaStreamWaitEvent just before
  // the consumer's launch, and a cuda_sync "Stream Wait Event" row that pairs them exactly.
  struct stream_wait {
    graph::task_id producer, consumer;
    std::int64_t record_corr, wait_corr;
  };
  std::map<graph::task_id, graph::task_id> launch_of;  // GPU task → its launch call
  for (const auto& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && g.rank[e.to] == rank) launch_of[e.to] = e.from;
  }
  std::multimap<graph::task_id, stream_wait> records_after, waits_before;  // keyed by launch call
  if (src == nullptr) {
    for (const auto& e : g.edges) {
      if ((e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) || e.finish) continue;
      if (g.rank[e.from] != rank || g.rank[e.to] != rank || g.processor[e.from] == g.processor[e.to]) continue;
      if (g.processors[g.processor[e.from]].kind != graph::processor_kind::gpu_stream ||
          g.processors[g.processor[e.to]].kind != graph::processor_kind::gpu_stream) {
        continue;
      }
      const auto la = launch_of.find(e.from), lb = launch_of.find(e.to);
      if (la == launch_of.end() || lb == launch_of.end() || la->second == lb->second) continue;
      const stream_wait sw{e.from, e.to, next_corr, next_corr + 1};
      next_corr += 2;
      records_after.insert({la->second, sw});
      waits_before.insert({lb->second, sw});
    }
  }
  auto write_runtime = [&](std::string_view name, const graph::processor_info& p, time_ns at, std::int64_t corr) {
    w.begin_object().field("ph", "X").field("cat", "cuda_runtime").field("name", name).field("pid", p.owner).field("tid", p.index);
    w.key("ts").microseconds(us(at)).key("dur").microseconds(0);
    w.key("args").begin_object().field("correlation", corr).end_object().end_object();
  };

  std::map<graph::processor_id, time_ns> cpu_end;  // model-built: end of each thread's last task
  for (const graph::task_id t : tasks) {
    const auto kind = g.kind[t];
    const time_ns s = job.simulated.begin_of(t), f = job.simulated.end_of(t);
    const std::uint32_t ev = g.source[t];
    if (src != nullptr && ev != ~0U) {
      const trace::event& e = src->events[ev];
      if (trace::is_cpu_side(e.cat)) warps[e.lane].add(g.observed_start[t], s), warps[e.lane].add(g.observed_end[t], f);
      if (kind == graph::task_kind::comm_arrive) continue;  // written with its complete
      time_ns begin = s;
      if ((kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm) && map->arrive_of_event[ev] != graph::no_task) {
        begin = job.simulated.begin_of(map->arrive_of_event[ev]);  // the op occupies its stream from its arrival
      }
      if (written[ev]) {
        continue;  // the wait half of a split call: the issue half wrote the whole call
      }
      time_ns end = f;
      if (trace::is_cpu_side(e.cat) && map->task_of_event[ev] != t) end = job.simulated.end_of(map->task_of_event[ev]);
      written[ev] = 1;
      write_source_event(ev, begin, end);
      continue;
    }
    if (src != nullptr) continue;  // trace-built helpers without an event ("thread end")
    // Model-built task.
    const auto& p = g.processors[g.processor[t]];
    if (kind == graph::task_kind::comm_arrive) continue;
    time_ns begin = s;
    const graph::collective_instance* ci = nullptr;
    if (kind == graph::task_kind::comm_complete) {
      ci = instance_of.count(t) ? instance_of[t] : nullptr;
      if (ci != nullptr) {
        for (std::size_t k = 0; k < ci->complete.size(); ++k) {
          if (ci->complete[k] == t) begin = job.simulated.begin_of(ci->arrive[k]);
        }
      }
    }
    const bool gpu = p.kind == graph::processor_kind::gpu_stream;
    const task_decoration* deco = job.decorations != nullptr ? job.decorations->find(t) : nullptr;
    for (auto [it, stop] = waits_before.equal_range(t); it != stop; ++it) {
      const stream_wait& sw = it->second;
      const auto& consumer = g.processors[g.processor[sw.consumer]];
      const auto& producer = g.processors[g.processor[sw.producer]];
      write_runtime("cudaStreamWaitEvent", p, s - 1, sw.wait_corr);
      w.begin_object().field("ph", "X").field("cat", "cuda_sync").field("name", "Stream Wait Event");
      w.field("pid", consumer.owner).field("tid", consumer.index).key("ts").microseconds(us(s - 1)).key("dur").microseconds(0);
      w.key("args").begin_object().field("cuda_sync_kind", "Stream Wait Event").field("stream", consumer.index);
      w.field("wait_on_stream", producer.index).field("wait_on_cuda_event_record_corr_id", sw.record_corr);
      w.field("correlation", sw.wait_corr).field("device", consumer.owner).end_object().end_object();
    }
    std::string_view name = g.task_name(t);
    if (deco != nullptr && gpu && !deco->kernel.empty()) name = deco->kernel;
    if (deco != nullptr && !gpu && deco->blocking) {
      if (const auto it = cpu_end.find(g.processor[t]); it != cpu_end.end()) begin = std::min(begin, it->second);
      name = deco->runtime;
    }
    if (!gpu) cpu_end[g.processor[t]] = f;
    if (deco != nullptr && !gpu && !deco->cpu_op.empty()) {
      // The operator that dispatched the launch, around its runtime call; the call ends the task.
      w.begin_object().field("ph", "X").field("cat", "cpu_op").field("name", deco->cpu_op);
      w.field("pid", p.owner).field("tid", p.index);
      w.key("ts").microseconds(us(begin)).key("dur").microseconds(f - begin);
      w.key("args").begin_object();
      if (corr_of.count(t)) w.field("External id", corr_of[t]);
      if (!deco->input_dims.empty()) w.key("Input Dims").raw(deco->input_dims);
      if (!deco->input_type.empty()) w.key("Input type").raw(deco->input_type);
      w.end_object().end_object();
      if (deco->launch_ns >= 0) begin = std::max(begin, f - deco->launch_ns);
      name = deco->runtime;
    }
    w.begin_object().field("ph", "X").field("cat", gpu ? "kernel" : "cuda_runtime").field("name", name);
    w.field("pid", p.owner).field("tid", p.index);
    w.key("ts").microseconds(us(begin)).key("dur").microseconds(f - begin);
    w.key("args").begin_object();
    if (gpu) {
      w.field("device", p.owner).field("stream", p.index);
      // A collective kernel is written once, for its complete; its launch went to its arrive.
      graph::task_id launched = t;
      if (ci != nullptr) {
        for (std::size_t k = 0; k < ci->complete.size(); ++k) {
          if (ci->complete[k] == t) launched = ci->arrive[k];
        }
      }
      if (launch_corr.count(launched)) {
        w.field("correlation", launch_corr[launched]);
        if (deco != nullptr) w.field("External id", launch_corr[launched]);  // its operator's
      }
      if (ci != nullptr) {
        const bool named = deco != nullptr && !deco->collective.empty();
        w.field("Collective name", named ? std::string_view(deco->collective) : std::string_view(ci->kind));
        w.field("Process Group Name", ci->group);
        if (deco != nullptr && !deco->group_description.empty()) w.field("Process Group Description", deco->group_description);
        if (deco != nullptr && !deco->dtype.empty()) w.field("dtype", deco->dtype);
        const std::int64_t elements = deco != nullptr && deco->element_bytes > 0 ? ci->bytes / deco->element_bytes : ci->bytes;
        if (ci->bytes > 0) w.field("In msg nelems", elements).field("Out msg nelems", elements);
        if (!ci->group_ranks.empty()) {
          std::string ranks = "[";
          for (std::size_t k = 0; k < ci->group_ranks.size(); ++k) ranks += (k ? ", " : "") + std::to_string(ci->group_ranks[k]);
          w.field("Process Group Ranks", ranks + "]").field("Group size", ci->group_ranks.size());
        }
      }
    } else if (corr_of.count(t)) {
      w.field("correlation", corr_of[t]);
      if (deco != nullptr && !deco->cpu_op.empty()) w.field("External id", corr_of[t]);
    }
    w.end_object().end_object();
    for (auto [it, stop] = records_after.equal_range(t); it != stop; ++it) {
      write_runtime("cudaEventRecord", p, std::max(s, f - 1), it->second.record_corr);
    }
  }

  // Trace-built: the CPU events that are not tasks, warped onto the simulated timeline.
  if (src != nullptr) {
    for (auto& [lane, warp] : warps) warp.finish();
    const iteration_plan* plan = job.plans != nullptr ? &(*job.plans)[plan_index] : nullptr;
    for (std::size_t i = 0; i < src->events.size(); ++i) {
      const trace::event& e = src->events[i];
      if (written[i] || e.ph != trace::phase::complete || !trace::is_cpu_side(e.cat)) continue;
      if (trace::is_gpu_op(e.cat)) continue;
      const auto it = warps.find(e.lane);
      const time_ns b0 = e.ts + map->offset, e0 = e.end() + map->offset;
      time_ns b = it != warps.end() ? it->second(b0) : b0;
      time_ns en = it != warps.end() ? it->second(e0) : e0;
      const bool step = plan != nullptr && plan->annotated && src->name(e) == plan->step && e.cat == trace::category::user_annotation;
      if (step) {  // exactly the simulated window's annotation
        b = job.simulated.begin_of(plan->first_cpu) - plan->lead_idle - scaled_part(plan->lead_busy, job.cpu_scale);
        en = job.simulated.end_of(plan->last_cpu) + plan->tail_idle + scaled_part(plan->tail_busy, job.cpu_scale);
      }
      const bool previous = plan != nullptr && plan->annotated && plan->previous && plan->previous->last_cpu != graph::no_task &&
                            src->name(e) == plan->previous->name && e.cat == trace::category::user_annotation;
      if (previous) {  // the previous step ends exactly where the window's begin saw it end
        en = job.simulated.end_of(plan->previous->last_cpu) + plan->previous->tail_idle +
             scaled_part(plan->previous->tail_busy, job.cpu_scale);
      }
      write_source_event(i, b, std::max(en, b));
    }
    // GPU-side sync records, at their runtime call's simulated start (they carry the exact
    // record/wait pairing, which a re-read needs).
    std::map<std::int64_t, graph::task_id> call_of_correlation;
    for (const graph::task_id t : tasks) {
      const std::uint32_t ev = g.source[t];
      if (ev != ~0U && (src->events[ev].cat == trace::category::cuda_runtime || src->events[ev].cat == trace::category::cuda_driver)) {
        call_of_correlation.try_emplace(src->events[ev].correlation, t);
      }
    }
    for (std::size_t i = 0; i < src->events.size(); ++i) {
      const trace::event& e = src->events[i];
      if (e.ph != trace::phase::complete || (e.cat != trace::category::cuda_sync && e.cat != trace::category::cuda_event)) continue;
      const auto call = call_of_correlation.find(e.correlation);
      const time_ns at = call != call_of_correlation.end() ? job.simulated.begin_of(call->second) : e.ts + map->offset;
      write_source_event(i, at, at + e.dur);
    }
  } else {
    // Model-built: one ProfilerStep over the rank's simulated span, on its first CPU thread.
    interval win{std::numeric_limits<time_ns>::max(), std::numeric_limits<time_ns>::min()};
    if (job.plans != nullptr && plan_index < job.windows.size()) {
      win = job.windows[plan_index].window;
    } else {
      for (const graph::task_id t : tasks) {
        win.begin = std::min(win.begin, job.simulated.begin_of(t));
        win.end = std::max(win.end, job.simulated.end_of(t));
      }
      if (tasks.empty()) win = {0, 0};
    }
    std::int64_t pid = 0, tid = 0;
    for (const auto& p : g.processors) {
      if (p.rank == rank && p.kind == graph::processor_kind::cpu_thread) {
        pid = p.owner;
        tid = p.index;
        break;
      }
    }
    w.begin_object().field("ph", "X").field("cat", "user_annotation").field("name", "ProfilerStep#1");
    w.field("pid", pid).field("tid", tid).key("ts").microseconds(us(win.begin)).key("dur").microseconds(win.length());
    w.key("args").begin_object().end_object().end_object();
    if (job.decorations != nullptr) {
      for (const span_annotation& sp : job.decorations->spans) {
        if (sp.rank != rank || sp.first == graph::no_task || sp.last == graph::no_task) continue;
        const time_ns b = job.simulated.begin_of(sp.first), en = std::max(b, job.simulated.end_of(sp.last));
        w.begin_object().field("ph", "X").field("cat", sp.category).field("name", sp.name);
        w.field("pid", pid).field("tid", tid).key("ts").microseconds(us(b)).key("dur").microseconds(en - b);
        w.key("args").begin_object().end_object().end_object();
      }
    }
  }
  w.end_array();
  w.end_object();
  out += '\n';
  return out;
}

}  // namespace lumos::report

#pragma once
// The Kineto writer's events that are no tasks (report/trace_writer.hpp). Trace-built ranks: the
// CPU events around the tasks (operators, annotations, the profiler steps), placed on the
// simulated timeline by a piecewise-linear map of their thread's time, or around the written
// tasks they enclose when a what-if kept only some of them; and the GPU-side sync records at
// their call's simulated start. Model-built ranks: one ProfilerStep and the decorations' spans.

#include <lumos/core/json_writer.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/detail/kineto_rank.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/trace/event.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

namespace lumos::report::detail {

// Writes the CPU events that are no tasks and the sync records of a trace-built rank `r`, once
// its tasks are written (they fit the warps and record what the events enclose).
class kineto_cpu_events {
 public:
  explicit kineto_cpu_events(kineto_rank& r)
      : r_(r), src_(*r.src), plan_(r.job.plans != nullptr ? &(*r.job.plans)[r.plan_index] : nullptr) {}

  void write() {
    prepare();
    for (std::size_t i = 0; i < src_.events.size(); ++i) place(i);
    write_placed();
    write_sync_records();
  }

 private:
  static constexpr std::uint32_t every_copy = ~0U;
  // Subset: an event placed around its written tasks, written once all are placed, then widened
  // to the placed events it encloses in the trace (a pass marker whose first written task is a
  // later layer's launch starts no later than that layer's scope).
  struct around {
    std::size_t event;
    time_ns begin, end;
    std::uint32_t copy = every_copy;  // the copy of a repeated run it stands around, if it is one
    bool part = false;                // one of several runs of the event (an interleaved pass's chunk)
  };

  void prepare() {
    for (auto& [lane, warp] : r_.warps) warp.finish();
    for (auto& [lane, v] : r_.enclosed) {
      std::stable_sort(v.begin(), v.end(), [](const placed_event& a, const placed_event& c) { return a.begin < c.begin; });
      for (std::size_t k = 0; k < v.size(); ++k) v[k].order = static_cast<std::uint32_t>(k);
      std::stable_sort(v.begin(), v.end(), [](const placed_event& a, const placed_event& c) { return a.ts < c.ts; });
    }
    // Subset: per lane, the runtime calls of the whole trace, by start: an event's lead and tail
    // are measured to the first and last of them inside it, written here or not (a pass marker
    // keeps its own overhead, not the time of the layers another stage took).
    if (r_.job.subset) {
      for (const trace::event& e : src_.events) {
        if (e.ph == trace::phase::complete && (e.cat == trace::category::cuda_runtime || e.cat == trace::category::cuda_driver)) {
          calls_[e.lane].emplace_back(e.ts, e.end());
        }
      }
      for (auto& [lane, v] : calls_) std::sort(v.begin(), v.end());
    }
    // Per thread: its events that are tasks, by start (only when something was repeated).
    if (!r_.copy_k.empty()) {
      for (std::uint32_t ev = 0; ev < src_.events.size(); ++ev) {
        if (r_.copies[ev] > 0 && trace::is_cpu_side(src_.events[ev].cat)) task_events_[src_.events[ev].lane].push_back({src_.events[ev].ts, ev});
      }
      for (auto& [lane, v] : task_events_) std::sort(v.begin(), v.end());
    }
  }

  // How many times to write event `e`: K when every task inside it on its thread has K > 1
  // copies (a repeated layer's operators and scope), else once (tasks a what-if removed count
  // for nothing). Sets the first and last of those tasks, whose copies place e's.
  std::uint32_t enclosed_copies(const trace::event& e) {
    const auto it = task_events_.find(e.lane);
    if (it == task_events_.end()) return 1;
    const auto& v = it->second;
    std::uint32_t n = 0;
    for (auto p = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::uint32_t{0}}); p != v.end() && p->first < e.end(); ++p) {
      if (src_.events[p->second].end() > e.end()) continue;
      // A zero-length call at the instant e opens (a synchronize before a pass, at its first
      // layer's start) is not inside e by its times: it does not decide e's copies.
      if (src_.events[p->second].dur == 0 && p->first == e.ts) continue;
      const std::uint32_t c = r_.copies[p->second];
      if (n == 0) {
        n = c, enclosed_first_ = p->second;
      } else if (c != n) {
        return 1;
      }
      enclosed_last_ = p->second;
    }
    return n > 1 ? n : 1;
  }

  // The end of the last copy of the repeated tasks inside e, each with e's measured tail after
  // that task: an event written once around copied work (a pass marker around repeated layers)
  // ends after the copies, not where the warp, fitted on copy 0, puts the traced end.
  [[nodiscard]] time_ns last_copy_end(const trace::event& e) const {
    time_ns last = std::numeric_limits<time_ns>::min();
    const auto it = task_events_.find(e.lane);
    if (it == task_events_.end()) return last;
    const auto& v = it->second;
    for (auto p = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::uint32_t{0}}); p != v.end() && p->first < e.end(); ++p) {
      const trace::event& x = src_.events[p->second];
      if (x.end() > e.end() || r_.copies[p->second] < 2) continue;
      const time_ns end = r_.end_of(r_.copy_span.at(kineto_rank::copy_key(p->second, r_.copies[p->second] - 1)).second);
      last = std::max(last, end + (e.end() - x.end()));
    }
    return last;
  }

  // CPU event `i`, when it is no task: warped, or exactly the window's step annotation (and the
  // previous step's end), around its written tasks (subset), or once per copy of a repeated run.
  void place(std::size_t i) {
    const trace::event& e = src_.events[i];
    if (r_.written[i] || e.ph != trace::phase::complete || !trace::is_cpu_side(e.cat)) return;
    if (trace::is_gpu_op(e.cat)) return;
    const auto it = r_.warps.find(e.lane);
    const time_ns b0 = e.ts + r_.map->offset, e0 = e.end() + r_.map->offset;
    time_ns b = it != r_.warps.end() ? it->second(b0) : b0;
    time_ns en = it != r_.warps.end() ? it->second(e0) : e0;
    const double cpu_scale = r_.job.cpu_scale;
    const bool step = plan_ != nullptr && plan_->annotated && src_.name(e) == plan_->step && e.cat == trace::category::user_annotation;
    if (step) {  // exactly the simulated window's annotation
      b = r_.begin_of(plan_->first_cpu) - plan_->lead_idle - scaled_part(plan_->lead_busy, cpu_scale);
      en = r_.end_of(plan_->last_cpu) + plan_->tail_idle + scaled_part(plan_->tail_busy, cpu_scale);
    }
    const bool previous = plan_ != nullptr && plan_->annotated && plan_->previous && plan_->previous->last_cpu != graph::no_task &&
                          src_.name(e) == plan_->previous->name && e.cat == trace::category::user_annotation;
    if (previous) {  // the previous step ends exactly where the window's begin saw it end
      en = r_.end_of(plan_->previous->last_cpu) + plan_->previous->tail_idle + scaled_part(plan_->previous->tail_busy, cpu_scale);
    }
    if (r_.job.subset && !step) {
      place_around_tasks(i, en, previous);
    } else {
      place_copies(i, b, en, step || previous);
    }
  }

  // The spans of the written tasks event `e` encloses, in written order: a new run where another
  // task separates two of them (the two chunks of a pass marker in an interleaved order), where
  // a B pass turns to a W pass, and (`per_copy`) at each copy of a repeated run.
  [[nodiscard]] static std::vector<std::pair<std::pair<time_ns, time_ns>, std::uint32_t>> runs_of(std::vector<const placed_event*>& inside,
                                                                                                   bool per_copy) {
    std::sort(inside.begin(), inside.end(), [](const placed_event* a, const placed_event* c) { return a->order < c->order; });
    std::vector<std::pair<std::pair<time_ns, time_ns>, std::uint32_t>> runs;  // simulated span of each run, its copy
    for (std::size_t k = 0; k < inside.size(); ++k) {
      if (k == 0 || inside[k]->order != inside[k - 1]->order + 1 || (per_copy && inside[k]->copy != inside[k - 1]->copy) ||
          inside[k]->weight != inside[k - 1]->weight) {
        runs.push_back({{inside[k]->begin, inside[k]->finish}, per_copy ? inside[k]->copy : 0});
      }
      runs.back().first.first = std::min(runs.back().first.first, inside[k]->begin);
      runs.back().first.second = std::max(runs.back().first.second, inside[k]->finish);
    }
    return runs;
  }

  // Event `e`'s measured lead before the first runtime call inside it and tail after the last.
  [[nodiscard]] std::pair<time_ns, time_ns> lead_and_tail(const trace::event& e) const {
    time_ns first_ts = e.ts, last_end = e.end();
    if (const auto c = calls_.find(e.lane); c != calls_.end()) {
      const auto& v = c->second;
      const auto from = std::lower_bound(v.begin(), v.end(), std::pair{e.ts, std::numeric_limits<time_ns>::min()});
      const auto to = std::lower_bound(from, v.end(), std::pair{e.end(), std::numeric_limits<time_ns>::min()});
      time_ns first = std::numeric_limits<time_ns>::max(), last = std::numeric_limits<time_ns>::min();
      for (auto q = from; q != to; ++q) {
        if (q->second <= e.end()) first = std::min(first, q->first), last = std::max(last, q->second);
      }
      if (first <= last) first_ts = first, last_end = last;
    }
    return {first_ts - e.ts, e.end() - last_end};
  }

  // Subset: event `i` around the written tasks it encloses, with its measured lead before the
  // first of them and tail after the last; not at all when it encloses none. `en`: its end as
  // the previous step's, when it is that (`previous`).
  void place_around_tasks(std::size_t i, time_ns en, bool previous) {
    const trace::event& e = src_.events[i];
    const auto lt = r_.enclosed.find(e.lane);
    if (lt == r_.enclosed.end()) return;
    std::vector<const placed_event*> inside;
    for (auto q = std::lower_bound(lt->second.begin(), lt->second.end(), e.ts, [](const placed_event& x, time_ns v) { return x.ts < v; });
         q != lt->second.end() && q->ts < e.end(); ++q) {
      if (q->end <= e.end()) inside.push_back(&*q);
    }
    if (inside.empty()) return;
    // Around a repeated run (a layer's scope and operators, every task inside it copied n
    // times): once per copy, with the copy's ids, as without stages.
    const bool per_copy = !r_.copy_k.empty() && enclosed_copies(e) > 1;
    auto runs = runs_of(inside, per_copy);
    if (previous) runs.resize(1);
    const time_ns lo = runs.front().first.first, hi = runs.back().first.second;
    const auto [lead, tail] = lead_and_tail(e);
    if (per_copy && !previous) {  // widened below, as one copy of the events inside it
      for (const auto& [span, copy] : runs) placed_around_.push_back({i, span.first - lead, span.second + tail, copy});
      return;
    }
    if (runs.size() > 1) {
      for (const auto& [span, copy] : runs) placed_around_.push_back({i, span.first - lead, span.second + tail, every_copy, true});
      return;
    }
    const time_ns b = lo - lead;
    if (previous) {
      r_.source_event(i, b, std::max(en, b));
    } else {
      placed_around_.push_back({i, b, std::max(hi + tail, b)});
    }
  }

  // Event `i` at [b, en), or around a repeated run: once per copy, keeping its measured lead
  // before its first task and tail after its last (the warp, fitted on copy 0, would stretch
  // copy 0 over the others). `fixed`: the window's step or the previous one, placed exactly.
  void place_copies(std::size_t i, time_ns b, time_ns en, bool fixed) {
    const trace::event& e = src_.events[i];
    const std::uint32_t n = r_.copy_k.empty() ? 1 : enclosed_copies(e);
    if (n == 1) {
      if (!r_.copy_k.empty() && !fixed) en = std::max(en, last_copy_end(e));
      r_.source_event(i, b, std::max(en, b));
      return;
    }
    const time_ns lead = src_.events[enclosed_first_].ts - e.ts, tail = e.end() - src_.events[enclosed_last_].end();
    for (std::uint32_t k = 0; k < n; ++k) {
      const time_ns bk = r_.begin_of(r_.copy_span.at(kineto_rank::copy_key(enclosed_first_, k)).first) - lead;
      const time_ns ek = r_.end_of(r_.copy_span.at(kineto_rank::copy_key(enclosed_last_, k)).second) + tail;
      r_.source_event(i, bk, std::max(ek, bk), static_cast<std::int64_t>(k) * kineto_rank::copy_ids);
    }
  }

  // Subset: the events placed around their tasks, each widened to the placed events it encloses.
  void write_placed() {
    if (placed_around_.empty()) return;
    const auto& events = src_.events;
    auto& placed = placed_around_;
    // Inner events first (shorter in the trace), so that a widened one widens what encloses it.
    std::vector<std::size_t> by_length(placed.size());
    std::iota(by_length.begin(), by_length.end(), std::size_t{0});
    std::stable_sort(by_length.begin(), by_length.end(),
                     [&](std::size_t a, std::size_t c) { return events[placed[a].event].dur < events[placed[c].event].dur; });
    std::map<std::uint32_t, std::vector<std::size_t>> on_lane;  // per lane, by start in the trace
    for (std::size_t k = 0; k < placed.size(); ++k) on_lane[events[placed[k].event].lane].push_back(k);
    for (auto& [lane, v] : on_lane) {
      std::stable_sort(v.begin(), v.end(), [&](std::size_t a, std::size_t c) { return events[placed[a].event].ts < events[placed[c].event].ts; });
    }
    for (const std::size_t k : by_length) {
      around& outer = placed[k];
      const trace::event& e = events[outer.event];
      const auto& v = on_lane[e.lane];
      auto q = std::lower_bound(v.begin(), v.end(), e.ts, [&](std::size_t x, time_ns t) { return events[placed[x].event].ts < t; });
      for (; q != v.end() && events[placed[*q].event].ts < e.end(); ++q) {
        const trace::event& inner = events[placed[*q].event];
        if (*q == k || inner.end() > e.end() || inner.dur >= e.dur) continue;
        const std::uint32_t inner_copy = placed[*q].copy;
        if (outer.copy != every_copy && inner_copy != every_copy && inner_copy != outer.copy) continue;
        // A run of several widens only to what overlaps it (the other runs' layers are not its).
        if (outer.part && (placed[*q].begin >= outer.end || placed[*q].end <= outer.begin)) continue;
        outer.begin = std::min(outer.begin, placed[*q].begin);
        outer.end = std::max(outer.end, placed[*q].end);
      }
    }
    for (const around& a : placed) {
      r_.source_event(a.event, a.begin, a.end, a.copy == every_copy ? 0 : static_cast<std::int64_t>(a.copy) * kineto_rank::copy_ids);
    }
  }

  // GPU-side sync records, at their runtime call's simulated start (they carry the exact
  // record/wait pairing, which a re-read needs).
  void write_sync_records() {
    std::map<std::int64_t, graph::task_id> call_of_correlation;
    for (const graph::task_id t : r_.tasks) {
      const std::uint32_t ev = r_.g.source[t];
      if (ev != ~0U && (src_.events[ev].cat == trace::category::cuda_runtime || src_.events[ev].cat == trace::category::cuda_driver)) {
        call_of_correlation.try_emplace(src_.events[ev].correlation, t);
      }
    }
    for (std::size_t i = 0; i < src_.events.size(); ++i) {
      const trace::event& e = src_.events[i];
      if (e.ph != trace::phase::complete || (e.cat != trace::category::cuda_sync && e.cat != trace::category::cuda_event)) continue;
      const auto call = call_of_correlation.find(e.correlation);
      if (r_.job.subset && call == call_of_correlation.end()) continue;  // its call is another stage's
      const time_ns at = call != call_of_correlation.end() ? r_.begin_of(call->second) : e.ts + r_.map->offset;
      r_.source_event(i, at, at + e.dur);
      // A repeated call's record or wait: once per copy, at the copy's call, paired with the
      // copy of the record it waits for when that was repeated too.
      if (r_.copy_k.empty() || call == call_of_correlation.end()) continue;
      const std::uint32_t call_event = r_.g.source[call->second];
      std::uint32_t record_copies = 1;
      if (const auto rc = src_.arg(i, trace::arg_key::wait_on_event_record_correlation)) {
        if (const auto r = call_of_correlation.find(*rc); r != call_of_correlation.end()) record_copies = r_.copies[r_.g.source[r->second]];
      }
      for (std::uint32_t k = 1; k < r_.copies[call_event]; ++k) {
        const time_ns ak = r_.begin_of(r_.copy_span.at(kineto_rank::copy_key(call_event, k)).first);
        const std::int64_t ids = static_cast<std::int64_t>(k) * kineto_rank::copy_ids;
        r_.source_event(i, ak, ak + e.dur, ids, k < record_copies ? ids : 0);
      }
    }
  }

  kineto_rank& r_;
  const trace::rank_trace& src_;
  const iteration_plan* plan_;
  std::map<std::uint32_t, std::vector<std::pair<time_ns, time_ns>>> calls_;            // subset: per lane, runtime calls
  std::map<std::uint32_t, std::vector<std::pair<time_ns, std::uint32_t>>> task_events_;  // per lane, events that are tasks
  std::uint32_t enclosed_first_ = 0, enclosed_last_ = 0;  // set by enclosed_copies
  std::vector<around> placed_around_;
};

// Model-built rank `r`: one ProfilerStep over its simulated span (its plan's window when it has
// one), on its first CPU thread, and the decorations' spans on that thread.
inline void write_model_step(kineto_rank& r) {
  const simulated_job& job = r.job;
  interval win{std::numeric_limits<time_ns>::max(), std::numeric_limits<time_ns>::min()};
  if (job.plans != nullptr && r.plan_index < job.windows.size()) {
    win = job.windows[r.plan_index].window;
  } else {
    for (const graph::task_id t : r.tasks) {
      win.begin = std::min(win.begin, r.begin_of(t));
      win.end = std::max(win.end, r.end_of(t));
    }
    if (r.tasks.empty()) win = {0, 0};
  }
  std::int64_t pid = 0, tid = 0;
  for (const auto& p : r.g.processors) {
    if (p.rank == r.rank && p.kind == graph::processor_kind::cpu_thread) {
      pid = p.owner;
      tid = p.index;
      break;
    }
  }
  json_writer& w = r.w;
  w.begin_object().field("ph", "X").field("cat", "user_annotation").field("name", "ProfilerStep#1");
  w.field("pid", pid).field("tid", tid).key("ts").microseconds(r.us(win.begin)).key("dur").microseconds(win.length());
  w.key("args").begin_object().end_object().end_object();
  if (job.decorations == nullptr) return;
  for (const span_annotation& sp : job.decorations->spans) {
    if (sp.rank != r.rank || sp.first == graph::no_task || sp.last == graph::no_task) continue;
    const time_ns b = r.begin_of(sp.first), en = std::max(b, r.end_of(sp.last));
    w.begin_object().field("ph", "X").field("cat", sp.category).field("name", sp.name);
    w.field("pid", pid).field("tid", tid).key("ts").microseconds(r.us(b)).key("dur").microseconds(en - b);
    w.key("args").begin_object().end_object().end_object();
  }
}

}  // namespace lumos::report::detail

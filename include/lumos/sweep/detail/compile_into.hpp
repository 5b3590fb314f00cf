#pragma once
// compile_into — graph::compile into caller-owned buffers, for a sweep workspace that compiles
// one program after another. Same algorithm and the same result, bit for bit, as
// graph::compile with default scales (tests/sweep checks it); kept here rather than in
// graph/compile.hpp because a sweep only needs the default duration model and its buffers.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lumos::sweep::detail {

/// Scratch arrays of `compile_into`; they only grow.
struct compile_scratch {
  large_vector<std::uint32_t> in_begin, fill, out_begin;
  large_vector<graph::task_id> in_from, out_to, previous_on_processor, next_on_processor, last, queue;
  large_vector<std::int32_t> in_delay;
  large_vector<std::uint8_t> in_start, finishes;
  large_vector<std::uint32_t> indegree;
};

/// Compiles `g` into `c` (overwritten; capacity kept). Throws `lumos::error` as graph::compile
/// does; a cycle is reported by calling graph::compile itself (rare: only in invalid builds).
/// O(tasks + edges); no allocation once the buffers are as large as the largest graph seen.
inline void compile_into(const graph::task_graph& g, graph::compiled_graph& c, compile_scratch& w) {
  using graph::no_task;
  using graph::task_id;
  const std::size_t n = g.task_count();
  const std::size_t m = g.edges.size();
  if (n >= (std::size_t{1} << 31)) throw error("task_graph: more than 2^31 tasks cannot be compiled");
  if (g.processors.size() >= (std::size_t{1} << graph::task_record::processor_bits)) {
    throw error("task_graph: more than 16777215 processors cannot be compiled");
  }
  for (const graph::edge& e : g.edges) {
    if (e.from >= n || e.to >= n) throw error("task_graph: an edge refers to a task that does not exist");
  }
  w.in_begin.assign(n + 1, 0);
  for (const graph::edge& e : g.edges) ++w.in_begin[e.to + 1];
  for (std::size_t i = 0; i < n; ++i) w.in_begin[i + 1] += w.in_begin[i];
  w.in_from.resize(m);
  w.in_delay.resize(m);
  w.in_start.resize(m);
  w.finishes.assign(n, 0);
  w.fill.assign(w.in_begin.begin(), w.in_begin.end() - 1);
  for (int pass = 0; pass < 2; ++pass) {  // start edges first, then finish edges
    for (const graph::edge& e : g.edges) {
      if (e.finish != (pass == 1)) continue;
      if (e.finish) {
        if (w.finishes[e.to] == 255) throw error("task_graph: more than 255 finish edges into " + g.describe(e.to));
        ++w.finishes[e.to];
      }
      const std::uint32_t at = w.fill[e.to]++;
      w.in_from[at] = e.from;
      w.in_start[at] = e.from_start ? 1 : 0;
      w.in_delay[at] = e.delay;
    }
  }
  w.previous_on_processor.assign(n, no_task);
  w.next_on_processor.assign(n, no_task);
  w.last.assign(g.processors.size(), no_task);
  for (task_id t = 0; t < n; ++t) {
    const graph::processor_id p = g.processor[t];
    if (w.last[p] != no_task) {
      w.previous_on_processor[t] = w.last[p];
      w.next_on_processor[w.last[p]] = t;
    }
    w.last[p] = t;
  }
  w.out_begin.assign(n + 1, 0);
  for (const graph::edge& e : g.edges) ++w.out_begin[e.from + 1];
  for (std::size_t i = 0; i < n; ++i) w.out_begin[i + 1] += w.out_begin[i];
  w.out_to.resize(m);
  w.fill.assign(w.out_begin.begin(), w.out_begin.end() - 1);
  for (const graph::edge& e : g.edges) w.out_to[w.fill[e.from]++] = e.to;
  w.indegree.resize(n);
  for (task_id t = 0; t < n; ++t) {
    w.indegree[t] = (w.in_begin[t + 1] - w.in_begin[t]) + (w.previous_on_processor[t] != no_task ? 1U : 0U);
  }

  c.processor_count = static_cast<std::uint32_t>(g.processors.size());
  c.task.clear();
  graph::detail::topological_order(w.indegree, w.next_on_processor, w.out_begin, w.out_to, w.queue, c.task);
  if (c.task.size() != n) {
    c = graph::compile(g);  // throws the error naming the cycle
    return;
  }
  c.positions.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) c.positions[c.task[i]] = graph::position{i};
  c.tasks.resize(n);
  c.preds.resize(m);
  const graph::scales unit{};
  const graph::scaled_durations durations{};
  std::uint32_t out = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const task_id t = c.task[i];
    const time_ns busy = graph::scale_time(g.busy_gap[t], unit.cpu);
    const std::uint32_t first_finish = w.in_begin[t + 1] - w.finishes[t];
    for (std::uint32_t e = w.in_begin[t]; e < w.in_begin[t + 1]; ++e) {
      const time_ns delay = e < first_finish ? w.in_delay[e] + busy : w.in_delay[e];
      c.preds[out++] = {2 * graph::index(c.positions[w.in_from[e]]) + (w.in_start[e] ? 0U : 1U), graph::clamp_delay(delay)};
    }
    c.tasks[i] = {g.idle_gap[t] + busy, durations.duration(g, t, unit),
                  g.processor[t] | (static_cast<std::uint32_t>(w.finishes[t]) << graph::task_record::processor_bits),
                  out};
  }
}

}  // namespace lumos::sweep::detail

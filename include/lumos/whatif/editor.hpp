#pragma once
// Structural rewrites of an execution graph: a group of tasks (one layer of one micro-batch, say:
// its CPU ops, its kernels on every stream, the joins of its collectives) repeated n times in
// place, or removed (n = 0). The rewritten graph is a new `task_graph`; every edge keeps its
// kind and delay, so the measured overheads of the group travel with each copy.

#include <lumos/core/error.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/graph_size.hpp>
#include <lumos/graph/task_graph.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// The group name (and a rank after it) of the gradient collectives a DP change from one replica
/// inserts (gradient_buckets.hpp). The pipeline split knows them by it: under a zero-bubble
/// schedule their gradients are the W passes', so they run after them.
inline constexpr std::string_view inserted_gradient_group = "dp.inserted.";

/// Whether `group` names collectives a what-if inserted (`*.inserted.R`) or folded onto one rank
/// (`*.folded.R`, `add_folded_collective`): sized for the target already, not traced.
[[nodiscard]] inline bool made_by_whatif(std::string_view group) noexcept {
  return group.find(".inserted.") != std::string_view::npos || group.find(".folded.") != std::string_view::npos;
}

namespace detail {
/// Task `t` of `g` as the spec that adds a copy of it (same kind, processor, times, name, rank
/// and source).
[[nodiscard]] inline graph::task_spec spec_of(const graph::task_graph& g, graph::task_id t) {
  return {.kind = g.kind[t], .processor = g.processor[t], .duration = g.duration[t], .idle_gap = g.idle_gap[t],
          .busy_gap = g.busy_gap[t], .name = g.task_name(t), .rank = g.rank[t], .source = g.source[t],
          .observed_start = g.observed_start[t], .observed_end = g.observed_end[t]};
}

}  // namespace detail

/// A group of tasks to repeat `count` times where it stands (0 removes it). On every processor
/// the group's tasks must be contiguous (no other task between them), so that the copies can
/// follow each other there.
struct repeat_group {
  std::vector<graph::task_id> tasks;
  std::size_t count = 1;
};

/// The rewritten graph and where each original task went.
struct edited_graph {
  graph::task_graph graph;
  /// Per original task: its copies in the new graph, in order (empty: removed).
  std::vector<std::vector<graph::task_id>> copies;
  std::size_t added = 0, removed = 0;  ///< tasks
  std::size_t edges_dropped = 0;       ///< edges into or out of removed tasks
  std::size_t edges_bridged = 0;       ///< edges out of removed tasks moved to a kept task
  /// The new tasks of `insert_after`, in the order of its insertions.
  std::vector<graph::task_id> inserted;
  [[nodiscard]] graph::task_id first(graph::task_id t) const noexcept {
    return copies[t].empty() ? graph::no_task : copies[t].front();
  }
};

/// How the edges of a rewritten group's boundary are carried over.
enum class group_edges : std::uint8_t {
  /// an edge entering a group enters its first copy
  plain,
  /// for pipeline passes that a stage split reorders next: an edge entering a group enters every
  /// copy (each copy waits for what the original waited for); the split then re-targets host
  /// synchronizations to the new order
  passes,
};

/// Rewrites `g` with `groups` (disjoint). Edges between two tasks of one group are repeated
/// in every copy; an edge leaving a group leaves its last copy (its first when the task it
/// enters stands before the groups' runs on its processor); an edge entering a group enters its
/// first copy (its last when the task it leaves stands after them); an edge out of a removed task
/// leaves the last kept task before it on its processor instead, so that what waited for a
/// removed kernel (a send, a `cudaDeviceSynchronize`, an event wait) still waits for the work its
/// stream ran before it; other edges of removed tasks are dropped (their processors still order
/// what remains); `edges` = group_edges::passes changes the entering edges (see there). Copies keep the observed times, names and sources of their originals (reports
/// count them inside the same step). O(tasks + edges). Throws `lumos::error` when groups
/// overlap or a group is not contiguous on a processor.
[[nodiscard]] inline edited_graph repeat_groups(const graph::task_graph& g, const std::vector<repeat_group>& groups,
                                                group_edges edges = group_edges::plain) {
  const std::size_t n = g.task_count();
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> group_of(n, none);
  for (std::uint32_t k = 0; k < groups.size(); ++k) {
    for (const graph::task_id t : groups[k].tasks) {
      if (t >= n) throw error("whatif: a group refers to task " + std::to_string(t) + ", which does not exist");
      if (group_of[t] != none) throw error("whatif: " + g.describe(t) + " belongs to two groups");
      group_of[t] = k;
    }
  }
  // Tasks of each processor in order; a group's run on a processor must be contiguous.
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  for (graph::task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  for (const auto& tasks : on) {
    std::vector<bool> closed(groups.size(), false);
    std::uint32_t current = none;
    for (const graph::task_id t : tasks) {
      const std::uint32_t k = group_of[t];
      if (k != current && current != none) closed[current] = true;
      if (k != none && k != current && closed[k]) {
        throw error("whatif: the tasks of a group are not contiguous on " + g.processors[g.processor[t]].name + " (at " +
                    g.describe(t) + ")");
      }
      current = k;
    }
  }

  // The size of the result before it is made: a group repeated far beyond memory is an error,
  // not a process the system kills. Edges grow at most as the tasks do.
  double tasks_after = static_cast<double>(n);
  for (const repeat_group& grp : groups) {
    tasks_after += static_cast<double>(grp.tasks.size()) * (static_cast<double>(grp.count) - 1.0);
  }
  const double growth = n > 0 ? tasks_after / static_cast<double>(n) : 1.0;
  graph::check_graph_size(tasks_after, static_cast<double>(g.edge_count()) * std::max(1.0, growth), "whatif: the rewritten graph");

  edited_graph out;
  out.copies.resize(n);
  graph::task_graph& ng = out.graph;
  ng.processors = g.processors;
  ng.collectives = {};
  auto copy_task = [&](graph::task_id t) {
    const graph::task_id id = ng.add_task(detail::spec_of(g, t));
    out.copies[t].push_back(id);
  };
  // Emit processor by processor; a group's run is emitted `count` times in a row. Task ids are
  // per-processor ordered in the new graph as in the old one, which is all `compile` needs.
  for (const auto& tasks : on) {
    for (std::size_t i = 0; i < tasks.size();) {
      const std::uint32_t k = group_of[tasks[i]];
      std::size_t j = i + 1;
      while (j < tasks.size() && k != none && group_of[tasks[j]] == k) ++j;
      if (k == none) {
        copy_task(tasks[i]);
      } else {
        for (std::size_t c = 0; c < groups[k].count; ++c) {
          for (std::size_t x = i; x < j; ++x) copy_task(tasks[x]);
        }
        if (groups[k].count == 0) out.removed += j - i;
        out.added += (j - i) * (groups[k].count > 0 ? groups[k].count - 1 : 0);
      }
      i = k == none ? i + 1 : j;
    }
  }
  // Per task, the last copy of the last kept task before it on its processor: an edge out of a
  // removed task leaves it instead (in both modes: dropped, a send that waited for the last
  // kernel of a removed layer, the last of its pass, was sent while the pass still ran).
  std::vector<graph::task_id> kept_before;
  {
    kept_before.assign(n, graph::no_task);
    for (const auto& tasks : on) {
      graph::task_id last = graph::no_task;
      for (const graph::task_id t : tasks) {
        kept_before[t] = last;
        if (!out.copies[t].empty()) last = out.copies[t].back();
      }
    }
  }
  // Per task outside the groups, where it stands on its processor against the groups' runs
  // there: before the first run (it runs before every copy) or after the last (after every
  // copy). An edge between such a task and a group binds the copy next to it: a task before the
  // runs that waited for a group task waits for its first copy, not its last (which runs after
  // the copies of whatever the task itself launched or released: a cycle); a group task that
  // waited for a task after the runs waits in its last copy.
  enum class side : std::uint8_t { between, before, after };
  std::vector<side> side_of(n, side::between);
  for (const auto& tasks : on) {
    const auto first = std::find_if(tasks.begin(), tasks.end(), [&](graph::task_id t) { return group_of[t] != none; });
    if (first == tasks.end()) continue;
    const auto last = std::find_if(tasks.rbegin(), tasks.rend(), [&](graph::task_id t) { return group_of[t] != none; }).base();
    for (auto it = tasks.begin(); it != first; ++it) side_of[*it] = side::before;
    for (auto it = last; it != tasks.end(); ++it) {
      if (group_of[*it] == none) side_of[*it] = side::after;
    }
  }
  for (const graph::edge& e : g.edges) {
    const auto& from = out.copies[e.from];
    const auto& to = out.copies[e.to];
    if (from.empty() && !to.empty() && !kept_before.empty() && kept_before[e.from] != graph::no_task) {
      ng.add_edge(kept_before[e.from], to.front(), e.delay, e.kind, e.flags());
      ++out.edges_bridged;
      continue;
    }
    if (from.empty() || to.empty()) {
      ++out.edges_dropped;
      continue;
    }
    if (group_of[e.from] != none && group_of[e.from] == group_of[e.to]) {
      for (std::size_t c = 0; c < from.size() && c < to.size(); ++c) ng.add_edge(from[c], to[c], e.delay, e.kind, e.flags());
    } else if (edges == group_edges::passes && group_of[e.to] != none) {
      for (const graph::task_id t : to) ng.add_edge(from.back(), t, e.delay, e.kind, e.flags());
    } else {
      const graph::task_id a = group_of[e.from] != none && side_of[e.to] == side::before ? from.front() : from.back();
      const graph::task_id b = group_of[e.to] != none && side_of[e.from] == side::after ? to.back() : to.front();
      ng.add_edge(a, b, e.delay, e.kind, e.flags());
    }
  }
  // Collectives: each copy of a participant's tasks is one more instance of the collective.
  for (const graph::collective_instance& ci : g.collectives) {
    // Eager point-to-point transfers have no join: count the copies of their first participant.
    const graph::task_id anchor = ci.join != graph::no_task ? ci.join : (ci.complete.empty() ? graph::no_task : ci.complete.front());
    if (anchor == graph::no_task || out.copies[anchor].empty()) continue;
    const std::size_t copies = out.copies[anchor].size();
    for (std::size_t c = 0; c < copies; ++c) {
      graph::collective_instance nc = ci;
      nc.join = ci.join != graph::no_task ? out.copies[ci.join][c] : graph::no_task;
      nc.arrive.clear();
      nc.complete.clear();
      for (std::size_t m = 0; m < ci.arrive.size(); ++m) {
        const auto& a = out.copies[ci.arrive[m]];
        const auto& x = out.copies[ci.complete[m]];
        if (c < a.size() && c < x.size()) {
          nc.arrive.push_back(a[c]);
          nc.complete.push_back(x[c]);
        }
      }
      ng.collectives.push_back(std::move(nc));
    }
  }
  return out;
}

/// A task to add right after task `after` of the graph on after's processor (`spec.processor`
/// is ignored); several after one task follow each other in the order given.
struct insertion {
  graph::task_id after = graph::no_task;
  graph::task_spec spec;
  std::string name;  ///< owned: `spec.name` is not read
};

/// Rewrites `g` with `ins` inserted: every original task kept once (`copies`), the new ones in
/// `inserted`, every edge and collective of `g` kept. The caller adds the edges of the new tasks
/// to `graph` (edges may come in any order). O(tasks + edges). Throws `lumos::error` for an
/// insertion after a task that does not exist.
[[nodiscard]] inline edited_graph insert_after(const graph::task_graph& g, const std::vector<insertion>& ins) {
  const std::size_t n = g.task_count();
  std::vector<std::vector<std::uint32_t>> after(n);  // insertions, by the task they follow
  for (std::uint32_t i = 0; i < ins.size(); ++i) {
    if (ins[i].after >= n) throw error("whatif: an insertion follows task " + std::to_string(ins[i].after) + ", which does not exist");
    after[ins[i].after].push_back(i);
  }
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  for (graph::task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  edited_graph out;
  out.copies.resize(n);
  out.inserted.assign(ins.size(), graph::no_task);
  graph::task_graph& ng = out.graph;
  ng.processors = g.processors;
  ng.collectives = g.collectives;
  ng.reserve(n + ins.size(), g.edge_count());
  for (const auto& tasks : on) {
    for (const graph::task_id t : tasks) {
      out.copies[t].push_back(ng.add_task(detail::spec_of(g, t)));
      for (const std::uint32_t i : after[t]) {
        graph::task_spec s = ins[i].spec;
        s.processor = g.processor[t];
        s.name = ins[i].name;
        out.inserted[i] = ng.add_task(s);
      }
    }
  }
  out.added = ins.size();
  for (const graph::edge& e : g.edges) ng.add_edge(out.copies[e.from].front(), out.copies[e.to].front(), e.delay, e.kind, e.flags());
  for (auto& ci : ng.collectives) {
    if (ci.join != graph::no_task) ci.join = out.copies[ci.join].front();
    for (auto& t : ci.arrive) t = out.copies[t].front();
    for (auto& t : ci.complete) t = out.copies[t].front();
  }
  return out;
}

/// Applies `edited` to a built job: the graph is replaced and every map follows its tasks.
/// Returns where each task of the graph before went (`edited_graph::copies`).
inline std::vector<std::vector<graph::task_id>> adopt(graph::built_job& b, edited_graph&& edited) {
  for (auto& r : b.ranks) {
    for (auto& t : r.task_of_event) t = t == graph::no_task ? t : edited.first(t);
    for (auto& t : r.arrive_of_event) t = t == graph::no_task ? t : edited.first(t);
  }
  std::vector<graph::kept_delay> kept;
  for (const auto& k : b.kept) {
    for (const graph::task_id c : edited.copies[k.task]) kept.push_back({c, k.kind, k.amount, k.at});
  }
  b.kept = std::move(kept);
  b.graph = std::move(edited.graph);
  return std::move(edited.copies);
}

/// Adds to `g` an inserted collective of one participant (`arrive`, `complete`): its group of
/// `members` folded onto the rank that holds it, the others standing for ranks the job does not
/// hold. `elements`: its message as a traced instance counts it (In msg nelems), so that a what-if
/// of the written job resizes it as it resizes a traced one (0: unknown).
inline void add_folded_collective(graph::task_graph& g, std::string_view kind, std::string group, std::vector<int> members,
                                  std::int64_t elements, std::int64_t sequence, graph::task_id arrive, graph::task_id complete,
                                  std::string_view match) {
  g.collectives.push_back({.kind = std::string(kind), .group = std::move(group), .group_ranks = std::move(members), .bytes = elements,
                           .element_bytes = 0, .sequence = sequence, .arrive = {arrive}, .complete = {complete},
                           .join = graph::no_task, .match = std::string(match)});
}

}  // namespace lumos::whatif

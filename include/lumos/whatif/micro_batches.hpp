#pragma once
// The micro-batch count what-if without pipeline parallelism (`lumos whatif --dp N`,
// `--global-batch N` or `--micro-batch N` when the count of micro-batches per replica changes and
// the job has one stage): gradient accumulation runs the micro-batches one after the other, each
// a forward and a backward pass, so a count change repeats or removes whole micro-batches in
// place. One micro-batch's period, on every processor its layers use, runs from its first task
// there to the first task of the next micro-batch (so its embedding, loss, head and the host work
// between passes travel with it); the copies keep the period's measured kernels, launches and
// overheads. The first micro-batch (which can carry first-step work such as a parameter
// all-gather) and the last (which carries the gradient reduction of Megatron's overlapped DP) are
// kept whenever the count allows.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace lumos::whatif {

/// The repeat group for a micro-batch count change, and a sentence saying what it does.
struct micro_batch_rewrite {
  std::vector<repeat_group> groups;
  std::string change;
  int from = 0, to = 0;    ///< micro-batches per replica before and after
  int first = 0, end = 0;  ///< micro-batches [first, end) repeated (end = first + 1) or removed
};

namespace detail {

/// The traces' micro-batches per replica, for a change to `micro_batches`: throws when the target
/// is not positive or the traces' count is not known.
[[nodiscard]] inline int traced_micro_batches(const parallel_layout& par, int micro_batches) {
  if (micro_batches <= 0) throw error("whatif: the count of micro-batches must be positive (got " + std::to_string(micro_batches) + ")");
  if (!par.micro_batches.known()) {
    throw error("whatif: the traces' micro-batches per iteration are not known (" + par.micro_batches.source + ")");
  }
  return *par.micro_batches.value;
}

/// Which micro-batches a change from m (at least 2) to `to` repeats or removes, into `out`:
/// micro-batch 1 (0 when the traces ran two) repeated to − m + 1 times, or micro-batches 1.. (0..
/// when only one is left) removed, so that the first and the last stay whenever the count allows.
/// Returns the count of each group (0: removed).
inline std::size_t choose_micro_batches(int m, int to, micro_batch_rewrite& out) {
  if (to > m) {
    out.first = m >= 3 ? 1 : 0, out.end = out.first + 1;
    return static_cast<std::size_t>(to - m + 1);
  }
  const int remove = m - to;
  out.first = remove <= m - 2 ? 1 : 0, out.end = out.first + remove;
  return 0;
}

}  // namespace detail

/// Builds the group (see the header comment) on `g`: from m traced micro-batches to
/// `micro_batches`, micro-batch 1 (0 when the trace has two) is repeated, or micro-batches 1..
/// (0.. when only one is left) removed, on every rank together. `st` is the structure of the
/// traces' graph; when `g` was edited since (layer copies), `copies` gives where each of its tasks
/// went (`edited_graph::copies`). Throws `lumos::error` when the traces have pipeline stages (the
/// pipeline model takes the count there), their micro-batches or layers are unknown, or they ran
/// fewer than two micro-batches (no period to copy).
[[nodiscard]] inline micro_batch_rewrite micro_batches_to(const graph::task_graph& g, const job_structure& st, int micro_batches,
                                                          const std::vector<std::vector<graph::task_id>>* copies = nullptr) {
  const auto& par = st.parallel;
  if (par.pp.value.value_or(1) > 1) throw error("whatif: a micro-batch count change with pipeline stages is stage_micro_batches_to's");
  const int m = detail::traced_micro_batches(par, micro_batches);
  if (st.layer_groups.empty()) {
    throw error("whatif: the traces' transformer layers were not found (" + st.model.layers.source +
                "), so no micro-batch can be told from the next; `lumos inspect --structure` shows what was found");
  }
  micro_batch_rewrite out;
  out.from = m, out.to = micro_batches;
  if (micro_batches == m) {
    out.change = "micro-batches per replica: " + std::to_string(m) + " as traced";
    return out;
  }
  if (m < 2) {
    throw error("whatif: the traces ran one micro-batch per iteration, so the period of one micro-batch (up to the next) "
                "cannot be told; a count change needs traces of at least two");
  }
  const std::size_t n = g.task_count();
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  for (graph::task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  std::map<graph::task_id, const graph::collective_instance*> collective_of;
  for (const auto& ci : g.collectives) {
    for (const graph::task_id c : ci.complete) collective_of[c] = &ci;
  }
  // Per micro-batch and processor, its first and last marked task: the layers' tasks and the
  // arrive before a communication op (joins are added with the period, below).
  constexpr graph::task_id none = graph::no_task;
  std::vector<std::vector<graph::task_id>> first(static_cast<std::size_t>(m), std::vector<graph::task_id>(on.size(), none));
  std::vector<std::vector<graph::task_id>> last = first;
  auto mark = [&](int i, graph::task_id t) {
    const auto p = g.processor[t];
    auto& f = first[static_cast<std::size_t>(i)][p];
    auto& l = last[static_cast<std::size_t>(i)][p];
    f = f == none ? t : std::min(f, t);
    l = l == none ? t : std::max(l, t);
  };
  auto mark_with_comm = [&](int i, graph::task_id t) {
    mark(i, t);
    if (t > 0 && g.kind[t - 1] == graph::task_kind::comm_arrive && g.processor[t - 1] == g.processor[t]) mark(i, t - 1);
  };
  for (const auto& lg : st.layer_groups) {
    const int i = lg.op.micro_batch;
    if (i < 0 || i >= m) continue;
    for (const graph::task_id t : lg.tasks) {
      if (copies == nullptr) {
        mark_with_comm(i, t);
      } else if (t < copies->size()) {
        for (const graph::task_id c : (*copies)[t]) mark_with_comm(i, c);
      }
    }
  }
  // Micro-batches [a, e) on processor p: from the first of them that has a task there to the
  // next later micro-batch's first task (or their last task when none follows).
  auto span = [&](int a, int e, graph::processor_id p, std::vector<graph::task_id>& into) {
    graph::task_id lo = none, hi = none;
    for (int i = a; i < e; ++i) {
      const graph::task_id f = first[static_cast<std::size_t>(i)][p];
      if (f == none) continue;
      lo = lo == none ? f : std::min(lo, f);
      hi = hi == none ? last[static_cast<std::size_t>(i)][p] : std::max(hi, last[static_cast<std::size_t>(i)][p]);
    }
    if (lo == none) return;
    graph::task_id end = none;  // exclusive
    for (int j = e; j < m && end == none; ++j) end = first[static_cast<std::size_t>(j)][p];
    const auto& list = on[p];
    for (auto it = std::lower_bound(list.begin(), list.end(), lo); it != list.end(); ++it) {
      if (end != none ? *it >= end : *it > hi) break;
      into.push_back(*it);
    }
  };
  repeat_group rg;
  rg.count = detail::choose_micro_batches(m, micro_batches, out);
  const int a = out.first, e = out.end;
  for (graph::processor_id p = 0; p < on.size(); ++p) span(a, e, p, rg.tasks);
  // The joins of every collective in the period (the loss's all-reduces, say, outside the layers),
  // each on a processor of its own: a join left out would be entered by a copy and left by
  // another, a cycle.
  std::vector<bool> in(n, false);
  for (const graph::task_id t : rg.tasks) in[t] = true;
  for (std::size_t k = 0, size = rg.tasks.size(); k < size; ++k) {
    if (const auto it = collective_of.find(rg.tasks[k]); it != collective_of.end()) {
      const graph::task_id j = it->second->join;
      if (j != none && !in[j]) in[j] = true, rg.tasks.push_back(j);
    }
  }
  out.groups.push_back(std::move(rg));
  char line[512];
  if (micro_batches > m) {
    std::snprintf(line, sizeof line,
                  "micro-batches per replica %d -> %d (no pipeline stages: gradient accumulation in sequence): micro-batch %d's period "
                  "(%zu tasks over all ranks, from its first task to the next micro-batch's on each processor) repeated %d times in "
                  "place, keeping its measured kernels, launches and overheads",
                  m, micro_batches, a, out.groups.front().tasks.size(), micro_batches - m + 1);
  } else {
    std::snprintf(line, sizeof line,
                  "micro-batches per replica %d -> %d (no pipeline stages: gradient accumulation in sequence): micro-batches %d to %d "
                  "removed (%zu tasks over all ranks)",
                  m, micro_batches, a, e - 1, out.groups.front().tasks.size());
  }
  out.change = line;
  return out;
}

}  // namespace lumos::whatif

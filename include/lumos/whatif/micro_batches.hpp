#pragma once
// The micro-batch count what-if without pipeline parallelism (`lumos whatif --dp N`,
// `--global-batch N` or `--micro-batch N` when the count of micro-batches per replica changes and
// the job has one stage): gradient accumulation runs the micro-batches one after the other, each
// a forward and a backward pass, so a count change repeats or removes whole micro-batches in
// place. One micro-batch's period, on every processor its passes use, runs from its first task
// there (a GPU op of one of its passes, or that op's launch) to the first task of the next
// micro-batch (so its embedding, loss, head and the host work between passes travel with it); the
// copies keep the period's measured kernels, launches and overheads. Each processor's period is
// bounded by the passes' own tasks, not by their first layer, because a thread may run only part
// of a micro-batch: PyTorch's autograd thread launches a backward pass's loss and head gradients
// before its first layer, and a period that started at that layer would hold the kernels of
// those launches on the stream but not the launches. The first micro-batch (which can carry
// first-step work such as a parameter all-gather) and the last (which carries the gradient
// reduction of Megatron's overlapped DP) are kept whenever the count allows. Traces of one micro-batch have no next micro-batch to end the
// period at: there it runs up to the first task of the work after the passes (the optimizer's),
// so the host time between the backward and that work travels with it too.
//
// With pipeline stages (`stage_micro_batches_to`) the passes of a micro-batch are repeated or
// removed in place on every stage, each task labelled with its pass as the stage split labels it
// (whatif/pass_labels.hpp); the split (whatif/stage_plan.hpp) then orders the new count.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

/// The repeat group for a micro-batch count change, and a sentence saying what it does.
struct micro_batch_rewrite {
  std::vector<repeat_group> groups;
  std::string change;
  int from = 0, to = 0;    ///< micro-batches per replica before and after
  int first = 0, end = 0;  ///< micro-batches [first, end) repeated (end = first + 1) or removed
  /// The data-parallel gradient collectives in the period of a lone micro-batch: Megatron reduces
  /// the gradients once, in the last micro-batch's backward, so only the last copy keeps their
  /// time (`keep_in_last_copy`): their transfers (comm_complete tasks) and their launches with
  /// the host time before them (the collective's enqueue).
  std::vector<graph::task_id> last_copy_only, last_copy_only_host;
};

/// Zeroes the transfers and launches of `mr.last_copy_only` in every copy but the last (`copies`:
/// where the repeat put each task). Returns how many transfers it zeroed.
inline std::size_t keep_in_last_copy(graph::task_graph& g, const micro_batch_rewrite& mr,
                                     const std::vector<std::vector<graph::task_id>>& copies) {
  std::size_t zeroed = 0;
  auto zero = [&](const std::vector<graph::task_id>& tasks, bool host) {
    for (const graph::task_id t : tasks) {
      if (t >= copies.size() || copies[t].size() < 2) continue;
      for (std::size_t k = 0; k + 1 < copies[t].size(); ++k) {
        const graph::task_id c = copies[t][k];
        g.duration[c] = 0;
        if (host) g.busy_gap[c] = 0;
        zeroed += host ? 0 : 1;
      }
    }
  };
  zero(mr.last_copy_only, false);
  zero(mr.last_copy_only_host, true);
  return zeroed;
}

namespace detail {

/// A change from the traces' micro-batches per replica to `micro_batches`, before any is
/// repeated or removed (its `change` said already when they are the same count): throws when
/// the target is not positive or the traces' count is not known.
[[nodiscard]] inline micro_batch_rewrite micro_batch_change(const parallel_layout& par, int micro_batches) {
  if (micro_batches <= 0) throw error("whatif: the count of micro-batches must be positive (got " + std::to_string(micro_batches) + ")");
  if (!par.micro_batches.known()) {
    throw error("whatif: the traces' micro-batches per iteration are not known (" + par.micro_batches.source + ")");
  }
  micro_batch_rewrite out;
  out.from = *par.micro_batches.value, out.to = micro_batches;
  if (out.from == out.to) out.change = "micro-batches per replica: " + std::to_string(out.from) + " as traced";
  return out;
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

/// Marks (`mark(i, task)`) every GPU op of micro-batch i's passes and its launch, and (`mark(m,
/// task)`) those of the work after the passes, whose first task on a processor ends the period of
/// the last micro-batch there. Without `forward_heads`, a forward pass's ops before its first
/// layer (the embedding) are left to the layers' bounds: a period then starts at the forward's
/// first layer, so that removing micro-batch 0 keeps the step's first tasks, which anchor its
/// window (report::plan_iterations), and the kept micro-batch runs one embedding. `launcher`: per
/// task, the task that launched it (or none). Throws when no op of a pass is found.
template <class Mark>
void mark_pass_ops(const graph::built_job& b, const job_structure& st, int m, bool forward_heads,
                   const std::vector<graph::task_id>& launcher, Mark&& mark) {
  auto micro_batch = [&](const gpu_op_context& c) {
    const auto& passes = st.ranks[c.rank].passes;
    if (c.pass < 0 || static_cast<std::size_t>(c.pass) >= passes.size()) return -1;
    const int i = passes[static_cast<std::size_t>(c.pass)].op.micro_batch;
    return i >= 0 && i < m ? i : -1;
  };
  // Per rank, the last op of its passes: ops outside the passes before it (between a forward and
  // a backward, or before the first pass) are not the work after them.
  std::vector<std::size_t> last_in_pass(b.ranks.size(), st.gpu_ops.size());
  for (std::size_t x = 0; x < st.gpu_ops.size(); ++x) {
    const gpu_op_context& c = st.gpu_ops[x];
    if (c.rank < b.ranks.size() && c.rank < st.ranks.size() && micro_batch(c) >= 0) last_in_pass[c.rank] = x;
  }
  bool any = false;
  std::vector<int> layer_seen_in(b.ranks.size(), -1);  // per rank, the last pass a layer op was seen in
  for (std::size_t x = 0; x < st.gpu_ops.size(); ++x) {
    const gpu_op_context& c = st.gpu_ops[x];
    if (c.rank >= b.ranks.size() || c.rank >= st.ranks.size() || last_in_pass[c.rank] == st.gpu_ops.size()) continue;
    const int i = micro_batch(c);
    if (i < 0 && x < last_in_pass[c.rank]) continue;
    if (i >= 0 && c.layer >= 0) layer_seen_in[c.rank] = c.pass;
    if (i >= 0 && !forward_heads && layer_seen_in[c.rank] != c.pass &&
        st.ranks[c.rank].passes[static_cast<std::size_t>(c.pass)].op.kind == pipeline::op_kind::forward) {
      continue;
    }
    const int row = i >= 0 ? i : m;
    const auto& map = b.ranks[c.rank];
    for (const auto* of : {&map.task_of_event, &map.arrive_of_event}) {
      if (c.op >= of->size() || (*of)[c.op] == graph::no_task) continue;
      const graph::task_id t = (*of)[c.op];
      mark(row, t), any = any || i >= 0;
      if (launcher[t] != graph::no_task) mark(row, launcher[t]);
    }
  }
  if (!any) {
    throw error("whatif: the traces' forward and backward passes were not found (`lumos inspect --structure`), so no "
                "micro-batch's period can be told");
  }
}

}  // namespace detail

/// Builds the group (see the header comment) on `b.graph`: from m traced micro-batches to
/// `micro_batches`, micro-batch 1 (0 when the trace has two) is repeated, or micro-batches 1..
/// (0.. when only one is left) removed, on every rank together. `st` is the structure of the
/// traces' graph; when `g` was edited since (layer copies), `copies` gives where each of its tasks
/// went (`edited_graph::copies`; `b.ranks` then maps events to the first copies, as `adopt`
/// leaves them). Throws `lumos::error` when the traces have pipeline stages (the pipeline model
/// takes the count there), or their micro-batches or passes are unknown.
[[nodiscard]] inline micro_batch_rewrite micro_batches_to(const graph::built_job& b, const job_structure& st, int micro_batches,
                                                          const std::vector<std::vector<graph::task_id>>* copies = nullptr,
                                                          const std::vector<lone_collective>& lone = {}) {
  const graph::task_graph& g = b.graph;
  const auto& par = st.parallel;
  if (par.pp.value.value_or(1) > 1) throw error("whatif: a micro-batch count change with pipeline stages is stage_micro_batches_to's");
  micro_batch_rewrite out = detail::micro_batch_change(par, micro_batches);
  if (out.from == out.to) return out;
  const int m = out.from;
  const std::size_t n = g.task_count();
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  for (graph::task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  std::map<graph::task_id, const graph::collective_instance*> collective_of;
  for (const auto& ci : g.collectives) {
    for (const graph::task_id c : ci.complete) collective_of[c] = &ci;
  }
  // Per micro-batch and processor, its first and last marked task: the layers' tasks and the
  // arrive before a communication op (joins are added with the period, below). Row m: the first
  // task of the work after the passes, which ends the period of a lone micro-batch.
  constexpr graph::task_id none = graph::no_task;
  std::vector<std::vector<graph::task_id>> first(static_cast<std::size_t>(m) + 1, std::vector<graph::task_id>(on.size(), none));
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
  std::vector<graph::task_id> launcher(n, none);
  for (const graph::edge& ed : g.edges) {
    if (ed.kind == graph::edge_kind::launch) launcher[ed.to] = ed.from;
  }
  detail::mark_pass_ops(b, st, m, m == 1 || st.layer_groups.empty(), launcher, mark);
  // Micro-batches [a, e) on processor p: from the first of them that has a task there to the
  // next later micro-batch's first task (or their last task when none follows).
  auto iteration_end = [&](graph::processor_id p) {
    for (const auto& r : st.ranks) {
      if (r.rank == g.processors[p].rank) return r.iteration_end;
    }
    return time_ns{0};
  };
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
    for (int j = e; j <= m && end == none; ++j) end = first[static_cast<std::size_t>(j)][p];
    const auto& list = on[p];
    for (auto it = std::lower_bound(list.begin(), list.end(), lo); it != list.end(); ++it) {
      // The last micro-batch where nothing follows on the processor (a lone micro-batch's autograd
      // thread): up to the end of the iteration, so its thread end, which the launching thread
      // waits for, is in.
      if (end != none ? *it >= end : (e < m ? *it > hi : g.observed_start[*it] >= iteration_end(p))) break;
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
  if (m == 1 && micro_batches > m) {
    const std::set<std::string> dp_groups = groups_with_role(st, group_role::dp);
    auto gradient = [&](const std::string& group, std::string_view kind) {
      const auto k = collective_of_kind(kind);
      return dp_groups.count(group) && k &&
             (*k == model::collective::all_reduce || *k == model::collective::reduce_scatter || *k == model::collective::all_gather);
    };
    auto host_of = [&](graph::task_id c) {
      if (c != none && in[c] && launcher[c] != none && in[launcher[c]]) out.last_copy_only_host.push_back(launcher[c]);
    };
    for (const auto& ci : g.collectives) {
      if (!gradient(ci.group, ci.kind)) continue;
      for (const graph::task_id c : ci.complete) {
        if (in[c]) out.last_copy_only.push_back(c);
      }
      for (const auto* side : {&ci.arrive, &ci.complete}) {
        for (const graph::task_id c : *side) host_of(c);
      }
    }
    // The same collectives of ranks written one per class (their peers absent from the job):
    // each is its own op, its transfer and its peer wait in one task.
    for (const lone_collective& c : lone) {
      if (!gradient(c.group, c.kind) || c.task >= n || !in[c.task]) continue;
      out.last_copy_only.push_back(c.task);
      host_of(c.arrive), host_of(c.task);
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

/// The micro-batch count change on traces with pipeline stages (`--dp`, `--global-batch` or
/// `--micro-batch` when the micro-batches per replica change), made on the graph before
/// `split_stages` orders the new count by the schedule: a micro-batch's forward pass and its
/// backward pass, on every stage, each with its launches, host work, kernels, traced transfers
/// (a send goes with the pass it drains, a receive with the pass it feeds) and the joins of its
/// collectives, are repeated in place, or removed. As without stages (micro_batches_to), the
/// micro-batch repeated is 1 (0 when the traces ran two), and the ones removed are 1.., so the
/// first and the last micro-batch, which carry work of their own, stay (a change to one
/// micro-batch is not made here: stage_split_unsupported). One group per pass code and count: a pass's tasks are contiguous
/// on each processor, passes never are. `st` is the structure of `b`'s graph, not edited since;
/// its ranks must run one forward and one backward pass per micro-batch, and with a zero-bubble
/// schedule one W pass, which is repeated or removed with them (stage_split_unsupported).
[[nodiscard]] inline micro_batch_rewrite stage_micro_batches_to(const graph::built_job& b, const trace::job& job, const job_structure& st,
                                                                int micro_batches,
                                                                const std::vector<std::vector<graph::task_id>>* layer_copies = nullptr) {
  using graph::task_id;
  const auto& par = st.parallel;
  const int P = par.pp.value.value_or(1);
  if (P < 2) throw error("whatif: stage_micro_batches_to needs traces with pipeline stages");
  micro_batch_rewrite out = detail::micro_batch_change(par, micro_batches);
  if (out.from == out.to) return out;
  const int m = out.from;
  if (m < 2) throw error("whatif: the traces ran one micro-batch per iteration, so no pass of a middle micro-batch can be copied");
  const graph::task_graph& g = b.graph;
  const std::size_t n = g.task_count(), R = job.ranks.size();
  // After a layer change (`layer_copies`), an event's task stands for all its copies.
  std::vector<task_id> inverse;
  if (layer_copies != nullptr) {
    inverse.assign(n, graph::no_task);
    for (task_id t = 0; t < layer_copies->size(); ++t) {
      if (!(*layer_copies)[t].empty() && (*layer_copies)[t].front() < n) inverse[(*layer_copies)[t].front()] = t;
    }
  }
  detail::pass_labels labels = detail::explicit_pass_labels(
      b, job, st, P,
      [&](task_id t) {
        return layer_copies != nullptr && t < n && inverse[t] != graph::no_task ? (*layer_copies)[inverse[t]] : std::vector<task_id>{t};
      },
      [&](std::size_t i, int pass, std::size_t, std::size_t, task_id) -> std::int32_t {
        const pipeline::op& o = st.ranks[i].passes[static_cast<std::size_t>(pass)].op;
        return detail::pass_code_of(o, m, o.micro_batch);
      });
  std::vector<std::vector<task_id>> on(g.processors.size());
  for (task_id t = 0; t < n; ++t) on[g.processor[t]].push_back(t);
  std::unordered_map<int, std::size_t> index_of_rank;
  for (std::size_t i = 0; i < R; ++i) index_of_rank[job.ranks[i].rank] = i;
  const auto order = detail::traced_pass_positions(st, R, m, nullptr);
  const int codes = (detail::weight_passes(st) > 0 ? 3 : 2) * m;  // with the traces' W passes
  detail::fill_pass_labels(g, labels, on, [&](std::int32_t c, int rank) -> std::int64_t {
    if (c == detail::label_pre) return -1;
    if (c == detail::label_post) return std::numeric_limits<std::int64_t>::max();
    const auto it = index_of_rank.find(rank);
    return it == index_of_rank.end() || c < 0 || c >= codes ? 0 : order[it->second][static_cast<std::size_t>(c)];
  });
  // A join goes with its collective's first participant (each join is alone on its processor).
  for (const auto& ci : g.collectives) {
    if (ci.join != graph::no_task && !ci.complete.empty()) labels.code[ci.join] = labels.code[ci.complete.front()];
  }
  const std::size_t count = detail::choose_micro_batches(m, micro_batches, out);
  const int a = out.first, e = out.end;
  // Groups: forward of micro-batch a.., then backward of a.. (codes mb and m + mb), and W (2m + mb).
  std::vector<std::int32_t> group_of_code(static_cast<std::size_t>(codes), -1);
  for (int mb = a; mb < e; ++mb) {
    for (int kind_offset = 0; kind_offset < codes; kind_offset += m) {
      group_of_code[static_cast<std::size_t>(kind_offset + mb)] = static_cast<std::int32_t>(out.groups.size());
      out.groups.push_back({{}, count});
    }
  }
  std::size_t tasks = 0;
  for (task_id t = 0; t < n; ++t) {
    const std::int32_t c = labels.code[t];
    if (c < 0 || c >= codes || group_of_code[static_cast<std::size_t>(c)] < 0) continue;
    out.groups[static_cast<std::size_t>(group_of_code[static_cast<std::size_t>(c)])].tasks.push_back(t);
    ++tasks;
  }
  char line[512];
  if (micro_batches > m) {
    std::snprintf(line, sizeof line,
                  "micro-batches per replica %d -> %d with the traced %d stages: micro-batch %d's forward and backward passes on every "
                  "stage (%zu tasks: launches, kernels, host work and the traced transfers they feed or drain) repeated %zu times in "
                  "place, keeping their measured kernels, launches and overheads; the schedule then orders the new count",
                  m, micro_batches, P, a, tasks, count);
  } else {
    std::snprintf(line, sizeof line,
                  "micro-batches per replica %d -> %d with the traced %d stages: the forward and backward passes of micro-batches %d to "
                  "%d removed on every stage (%zu tasks, with the traced transfers they feed or drain); the schedule then orders the "
                  "new count",
                  m, micro_batches, P, a, e - 1, tasks);
  }
  out.change = line;
  return out;
}

/// Pass: the micro-batches per replica that the passes before it changed (`ctx.micro_batches`),
/// made in the graph when `stage_plan_pass` says so: without stages whole micro-batch periods are
/// repeated or removed (`micro_batches_to`: gradient accumulation runs them in sequence); with
/// traced stages, a micro-batch's forward and backward passes on every stage
/// (`stage_micro_batches_to`), which the split then orders. Copies of the layer pass are followed.
/// Sets `ctx.period_copies`.
struct micro_batch_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept { return ctx.split.accumulate; }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const job_structure& st = ctx.structure(b);
    if (ctx.fsdp_inserted) {
      // The inserted collectives are not in the passes' periods, which would be copied without them.
      throw error("whatif --fsdp on from traces without FSDP: changing the micro-batches per replica (to " + std::to_string(*ctx.micro_batches) +
                  ") is not built yet; keep them with --global-batch (the traces' micro-batches x the target's --dp x the micro-batch size)");
    }
    const bool staged = ctx.split.staged;
    const auto* copies = ctx.layer_copies ? &*ctx.layer_copies : nullptr;
    const micro_batch_rewrite mr = staged ? stage_micro_batches_to(b, ctx.job, st, *ctx.micro_batches, copies)
                                          : micro_batches_to(b, st, *ctx.micro_batches, copies, lone_collectives(ctx.job, b));
    change_list out;
    out.push_back(changed("micro-batches", "micro-batches per replica", std::to_string(mr.from), std::to_string(mr.to), mr.change));
    // With stages the passes are reordered next (group_edges::passes).
    edited_graph e = repeat_groups(b.graph, mr.groups, staged ? group_edges::passes : group_edges::plain);
    const std::size_t bridged = e.edges_bridged, dropped = e.edges_dropped;
    micro_batch_copies pc{adopt(b, std::move(e)), mr.from, mr.to, mr.first, mr.end};
    if (bridged > 0) {
      out.push_back(note("micro-batches", "edges",
                         std::to_string(bridged) + " edges out of removed tasks moved to the last kept task before them on their processor"));
    }
    if (const std::size_t zeroed = keep_in_last_copy(b.graph, mr, pc.copies); zeroed > 0) {
      out.push_back(note("micro-batches", "gradient collectives",
                         std::to_string(mr.last_copy_only.size()) +
                             " data-parallel gradient collectives in the traced micro-batch's backward kept in its last copy only "
                             "(gradients are reduced once, after the last micro-batch): " +
                             std::to_string(zeroed) + " copies take no transfer time"));
    }
    if (dropped > 0) {
      out.push_back(note("micro-batches", "edges",
                         std::to_string(dropped) + " edges of removed tasks dropped (their processors still order the rest)"));
    }
    ctx.period_copies = std::move(pc);
    return out;
  }
};
static_assert(Rewrite<micro_batch_pass>);

}  // namespace lumos::whatif

#pragma once
// Pass labels of a traced graph, shared by the stage split (whatif/stage_plan.hpp) and the
// micro-batch change on traces with stages (whatif/micro_batches.hpp). Each task is labelled with
// the pass it belongs to: a GPU op by structure discovery's pass of its launch, a launch call by
// the op it launched, every other task by the last labelled task before it on its processor (work
// before the first pass and after the last — the optimizer, say — is outside the passes). With
// traced stages a traced transfer belongs to the pass it feeds (a receive) or drains (a send),
// told by its nccl:recv / nccl:send operator.

#include <lumos/core/error.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lumos::whatif {

/// A change of the micro-batches per replica made in the graph before the split (repeated or
/// removed micro-batch periods, whatif/micro_batches.hpp): where each task of the graph before
/// went, and which micro-batches it repeated or removed.
struct micro_batch_remap {
  const std::vector<std::vector<graph::task_id>>* copies = nullptr;  ///< per task before: its copies, in order
  int from = 0, to = 0;    ///< micro-batches per replica before and after
  int first = 0, end = 0;  ///< micro-batches [first, end) repeated (end = first + 1) or removed
  /// The micro-batch that copy k (of `copies`) of a task of micro-batch `mb` belongs to. A period
  /// runs from a micro-batch's first layer task to the next one's, so it also holds the work of
  /// the next micro-batch before its layers (its embedding): a copy of that is the next copy's.
  [[nodiscard]] int micro_batch(int mb, std::size_t k, std::size_t copies_of_task) const noexcept {
    if (to > from) {
      if (copies_of_task > 1) return mb + static_cast<int>(k);  // in the repeated period
      return mb <= first ? mb : mb + (to - from);
    }
    // Removed: what is left of micro-batches [first, end) is the first's work before its layers.
    return mb < end ? mb : mb - (end - first);
  }
};

namespace detail {
// The W passes of a rank (traces that ran a zero-bubble schedule: one per micro-batch).
[[nodiscard]] inline std::size_t weight_passes(const rank_structure& r) {
  return static_cast<std::size_t>(std::count_if(r.passes.begin(), r.passes.end(), [](const auto& p) { return p.op.kind == pipeline::op_kind::weight; }));
}
// Those of the first rank: whether the traces ran a zero-bubble schedule.
[[nodiscard]] inline std::size_t weight_passes(const job_structure& st) { return st.ranks.empty() ? 0 : weight_passes(st.ranks.front()); }
// A pass's code: forward micro-batch, m + backward's, 2m + W's (see pass_labels).
[[nodiscard]] inline std::int32_t pass_code_of(const pipeline::op& o, int m, int micro_batch) noexcept {
  return (o.kind == pipeline::op_kind::forward ? 0 : o.kind == pipeline::op_kind::weight ? 2 * m : m) + micro_batch;
}
}  // namespace detail

namespace detail {

inline constexpr std::int32_t label_unknown = std::numeric_limits<std::int32_t>::min();
inline constexpr std::int32_t label_pre = -1;
inline constexpr std::int32_t label_post = std::numeric_limits<std::int32_t>::max();

// Each task's pass (see the header comment): `code[t]` is kind·m + micro-batch of its pass
// (forward 0, backward m; zero bubble adds W at 2m), label_pre / label_post outside the passes.
struct pass_labels {
  std::vector<std::int32_t> code;
  std::vector<std::uint8_t> explicit_label;  // labelled by its own op, not by the task before it
  std::vector<std::uint8_t> p2p_where;       // 0: a traced receive, 2: a traced send, 1: neither
};

// The labels tasks get from their own op: a GPU op (and its arrive) from structure discovery's pass,
// and, with traced stages (P > 1), a traced transfer from the pass it feeds (a receive: the next
// pass its rank launches) or drains (a send: the pass before it), told apart by the CPU operator
// that posted it (c10d's `nccl:recv` / `nccl:send`). `copies(t)`: the tasks that the task an event
// maps to stands for (itself on a graph not edited since discovery); `code_of(rank index, pass
// index, copy, copies, task)`: the code of that copy, which is `task`.
template <class Copies, class CodeOf>
[[nodiscard]] pass_labels explicit_pass_labels(const graph::built_job& b, const trace::job& job, const job_structure& st, int P,
                                               Copies&& copies, CodeOf&& code_of) {
  const std::size_t n = b.graph.task_count(), R = job.ranks.size();
  pass_labels l{std::vector<std::int32_t>(n, label_unknown), std::vector<std::uint8_t>(n, 0), std::vector<std::uint8_t>(n, 1)};
  auto label = [&](const gpu_op_context& c, int pass, std::uint8_t where) {
    const auto& map = b.ranks[c.rank];
    for (const auto* of : {&map.task_of_event, &map.arrive_of_event}) {
      if (c.op >= of->size() || (*of)[c.op] == graph::no_task) continue;
      const std::vector<graph::task_id> all = copies((*of)[c.op]);
      for (std::size_t k = 0; k < all.size(); ++k) {
        l.code[all[k]] = code_of(c.rank, pass, k, all.size(), all[k]), l.explicit_label[all[k]] = 1, l.p2p_where[all[k]] = where;
      }
    }
  };
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.pass >= 0 && c.rank < R && c.rank < b.ranks.size()) label(c, c.pass, 1);
  }
  if (P > 1) {
    const auto& ops = st.gpu_ops;
    // A transfer feeds or drains a forward or backward pass, never a W (which sends nothing): a
    // W launched between a receive and its pass is looked past.
    auto feeds = [&](const gpu_op_context& c) {
      return c.pass >= 0 && !c.p2p && c.rank < st.ranks.size() &&
             st.ranks[c.rank].passes[static_cast<std::size_t>(c.pass)].op.kind != pipeline::op_kind::weight;
    };
    std::vector<int> before_pass(ops.size(), -1), after_pass(ops.size(), -1);
    for (std::size_t x = 0; x < ops.size(); ++x) {
      const bool same = x > 0 && ops[x - 1].rank == ops[x].rank;
      before_pass[x] = same ? (feeds(ops[x - 1]) ? ops[x - 1].pass : before_pass[x - 1]) : -1;
    }
    for (std::size_t x = ops.size(); x-- > 0;) {
      const bool same = x + 1 < ops.size() && ops[x + 1].rank == ops[x].rank;
      after_pass[x] = same ? (feeds(ops[x + 1]) ? ops[x + 1].pass : after_pass[x + 1]) : -1;
    }
    for (std::size_t x = 0; x < ops.size(); ++x) {
      const gpu_op_context& c = ops[x];
      if (!c.p2p || c.rank >= R || c.rank >= b.ranks.size()) continue;
      const int side = transfer_side(job.ranks[c.rank], c.cpu_op);  // never 0: stage_split_unsupported checked
      const int pass = side < 0 ? after_pass[x] : before_pass[x];
      if (side != 0 && pass >= 0) label(c, pass, side < 0 ? 0 : 2);  // else outside the passes
    }
  }
  return l;
}

// The labels of the other tasks: a launch call takes its op's; any other task that of the last
// labelled task before it on its processor (label_pre before the first, label_post after the last;
// barriers are left to the caller). `position(code, rank)` orders a rank's codes: a processor whose
// labels go back in that order is an error. `on`: each processor's tasks, in order.
template <class Position>
void fill_pass_labels(const graph::task_graph& g, pass_labels& l, const std::vector<std::vector<graph::task_id>>& on, Position&& position) {
  auto& code = l.code;
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && code[e.from] == label_unknown && l.explicit_label[e.to]) {
      code[e.from] = code[e.to], l.explicit_label[e.from] = 1;
      l.p2p_where[e.from] = l.p2p_where[e.to];
    }
  }
  std::vector<graph::task_id> launched_by(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launched_by[e.to] = e.from;
  }
  // Threads first: a stream none of whose ops is in a pass (the tied embedding's all-reduce, a
  // data-parallel stream's collectives) takes the labels of its ops' launches, in its order. It
  // was all "before the passes", so the launch from after them and the wait for the last
  // backward's kernel went back in the order and were dropped: the op ran at time 0.
  std::vector<graph::processor_id> order;
  for (const bool streams : {false, true}) {
    for (graph::processor_id p = 0; p < g.processors.size(); ++p) {
      if ((g.processors[p].kind == graph::processor_kind::gpu_stream) == streams) order.push_back(p);
    }
  }
  for (const graph::processor_id p : order) {
    if (g.processors[p].kind == graph::processor_kind::barrier) continue;
    const int rank = g.processors[p].rank;
    const auto& list = on[p];
    std::size_t last_explicit = list.size();
    for (std::size_t x = 0; x < list.size(); ++x) {
      if (l.explicit_label[list[x]]) last_explicit = x;
    }
    std::int32_t cur = label_pre;
    for (std::size_t x = 0; x < list.size(); ++x) {
      const graph::task_id t = list[x];
      if (last_explicit == list.size() && g.processors[p].kind == graph::processor_kind::gpu_stream) {
        const graph::task_id by = launched_by[t];
        if (by != graph::no_task && code[by] != label_unknown && position(code[by], rank) >= position(cur, rank)) cur = code[by];
        code[t] = cur;
        continue;
      }
      if (last_explicit == list.size() || x > last_explicit) {
        code[t] = last_explicit == list.size() ? label_pre : label_post;
        continue;
      }
      if (l.explicit_label[t]) {
        if (position(code[t], rank) < position(cur, rank)) {
          throw error("whatif --pp: the passes on " + g.processors[p].name + " are not in pass order (at " + g.describe(t) + ")");
        }
        cur = code[t];
      } else {
        code[t] = cur;
      }
    }
  }
}

// Per rank index, the position of each code (forward: micro-batch; backward: m + micro-batch; W of
// traces that ran a zero-bubble schedule: 2m + micro-batch) in
// the rank's traced passes: its schedule's order. With `remap` (a micro-batch change made on the
// graph, its passes repeated or removed in place), of the new codes, m being the new count.
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> traced_pass_positions(const job_structure& st, std::size_t R, int m,
                                                                                  const micro_batch_remap* remap) {
  std::vector<std::vector<std::int64_t>> order(R, std::vector<std::int64_t>(static_cast<std::size_t>(3 * m), 0));
  for (std::size_t i = 0; i < R && i < st.ranks.size(); ++i) {
    std::int64_t at = 0;
    for (const auto& pass : st.ranks[i].passes) {
      const auto& o = pass.op;
      std::size_t copies = 1;
      if (remap != nullptr && remap->to > remap->from && o.micro_batch == remap->first) {
        copies = static_cast<std::size_t>(remap->to - remap->from + 1);
      } else if (remap != nullptr && remap->to < remap->from && o.micro_batch >= remap->first && o.micro_batch < remap->end) {
        copies = 0;
      }
      for (std::size_t k = 0; k < copies; ++k) {
        const int mb = remap != nullptr ? remap->micro_batch(o.micro_batch, k, copies) : o.micro_batch;
        order[i][static_cast<std::size_t>(pass_code_of(o, m, mb))] = at++;
      }
    }
  }
  return order;
}

}  // namespace detail

}  // namespace lumos::whatif

#pragma once
// What the facets of structure discovery read: the job, its graph, the options, and the launch
// context of every GPU op of each rank's iteration, found once by a sweep over the CPU threads.
// The facets (whatif/structure/*.hpp) each fill their part of a `job_structure`; the few
// findings one facet makes for later ones (the pass and layer of each launch, the pipelines
// walked from the point-to-point partners, the gradient collectives) are kept here, each with
// the facet that writes it.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/trace/comm.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/summary.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// One GPU op of a rank, in launch order, with what its launching CPU context says.
struct launch_rec {
  std::uint32_t op = no_event;
  std::uint32_t call = no_event;   ///< runtime call, when recorded
  time_ns enqueue = 0;             ///< trace time of the call (or of the op)
  phase_kind phase = phase_kind::other;
  bool marked = false;             ///< phase from an enclosing marker (else the default)
  bool comm = false, p2p = false;
  std::int64_t scope = -1;         ///< outermost enclosing layer-scope event
  std::uint32_t shape_op = no_event;  ///< innermost enclosing GEMM / attention operator
  std::uint32_t cpu_op = no_event;    ///< outermost enclosing CPU operator
  std::uint32_t inner_op = no_event;  ///< innermost enclosing CPU operator
  std::uint32_t pass_marker = no_event;  ///< outermost enclosing user annotation that marks a phase
  int pass = -1, layer = -1;       ///< set by `discover_passes` and `discover_layers`
  int instance = -1;               ///< graph collective instance
};

/// One rank's share of the discovery.
struct rank_work {
  /// The GPU ops launched in the iteration window, in enqueue order (the sweep's).
  std::vector<launch_rec> launches;
  std::map<phase_kind, std::set<std::string>> markers;  ///< phase → marker names that set it (whole trace)
  std::vector<std::vector<std::size_t>> pass_launches;  ///< per pass: indices into launches (`discover_passes`)
  fact<std::string> iteration;                          ///< the step annotation the window is, or why none
  time_ns iteration_start = 0, iteration_end = 0;       ///< job time
};

/// The pipelines read from the point-to-point partners (`discover_stages`).
struct pipeline_topology {
  std::map<int, std::set<int>> partners;   ///< rank → the ranks it sends to / receives from
  std::set<int> unmatched_p2p;             ///< ranks with send/recv ops whose peers are absent
  std::vector<std::vector<int>> pipelines;  ///< each walked pipeline: its ranks in stage order
  bool ring = false, chain = false;        ///< some pipeline is a ring / a chain
};

/// A collective of the backward or optimizer phase that may reduce gradients (`discover_groups`).
struct gradient_op {
  std::string kind;
  std::int64_t elements;
  std::string group;  ///< the group's key
};

}  // namespace detail

/// The context every facet of `discover_structure` reads, built once by `make_discovery_inputs`.
/// `job` and `built` are referenced, not copied: they must outlive it.
struct discovery_inputs {
  const trace::job& job;
  const graph::built_job& built;
  structure_options options;
  std::map<int, std::size_t> index_of_rank;  ///< rank number → index into job.ranks
  /// Graph collective instance of each (rank index, op event), for participants and p2p pairs.
  std::map<std::pair<std::size_t, std::uint32_t>, int> instance_of;
  std::optional<int> step;               ///< the ProfilerStep#N every rank's window is, if any
  std::vector<detail::rank_work> ranks;  ///< same order as job.ranks
  detail::pipeline_topology topology;    ///< written by `discover_stages`
  /// Rank → its gradient reductions, once the DP groups are known (written by `discover_groups`).
  std::map<int, std::vector<detail::gradient_op>> gradient_ops;
  bool unmatched_comm = false;  ///< communication whose peers are absent (written by `discover_groups`)

  [[nodiscard]] std::size_t rank_count() const noexcept { return job.ranks.size(); }

  /// The index into job.ranks of rank number `rank` (a rank of the graph). Throws
  /// `lumos::error` for a rank the job lacks: a graph of another job.
  [[nodiscard]] std::size_t rank_index(int rank) const {
    const auto it = index_of_rank.find(rank);
    if (it == index_of_rank.end()) throw error("discover_structure: rank " + std::to_string(rank) + " of the graph is not in the job");
    return it->second;
  }

  /// The ranks that joined graph collective `c`, sorted.
  [[nodiscard]] std::vector<int> participants(int c) const {
    std::vector<int> out;
    for (const graph::task_id t : built.graph.collectives[static_cast<std::size_t>(c)].arrive) out.push_back(built.graph.rank[t]);
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Whether graph collective `c` is a point-to-point transfer between two ranks of a pipeline
  /// (not over a group described as context-parallel: see detail::context_parallel_description).
  [[nodiscard]] bool is_p2p(int c) const {
    const auto& ci = built.graph.collectives[static_cast<std::size_t>(c)];
    if ((ci.kind != "sendrecv" && ci.kind != "send" && ci.kind != "recv") || ci.arrive.size() != 2) return false;
    if (ci.complete.empty()) return true;
    // The group's description: on the op, else in the trace's process group list.
    const graph::task_id t = ci.complete.front();
    const trace::rank_trace& r = job.ranks[rank_index(built.graph.rank[t])];
    const std::uint32_t op = built.graph.source[t];
    std::string_view description = op < r.events.size() ? r.arg_text(op, trace::arg_key::process_group_desc) : std::string_view{};
    for (const trace::process_group_info& pg : r.process_groups) {
      if (description.empty() && pg.name == ci.group) description = pg.description;
    }
    return !detail::context_parallel_description(description);
  }
};

namespace detail {

/// The ProfilerStep#N the iteration is: the user's, else the largest number every rank has.
[[nodiscard]] inline std::optional<int> chosen_step(const trace::job& job, std::optional<int> step) {
  if (step) return step;
  for (const auto& r : job.ranks) {
    const auto steps = trace::profiler_steps(r);
    if (steps.empty()) continue;
    int best = std::numeric_limits<int>::min();
    for (const auto& s : steps) best = std::max(best, s.number);
    step = step ? std::min(*step, best) : best;
  }
  return step;
}

/// Every GPU op of `t` with the context of the runtime call that launched it: a sweep over each
/// CPU thread with a stack of the events enclosing the call. Ops launched before the recording
/// window come last, with no call and no context. Records in `markers` the name of each event
/// that set a launch's phase.
[[nodiscard]] inline std::vector<launch_rec> launch_contexts(const trace::rank_trace& t, const std::vector<std::string>& layer_scopes,
                                                             std::map<phase_kind, std::set<std::string>>& markers) {
  std::unordered_map<std::int64_t, std::vector<std::uint32_t>> ops_by_corr;
  std::map<std::uint32_t, std::vector<std::uint32_t>> lanes;
  for (std::uint32_t i = 0; i < t.events.size(); ++i) {
    const trace::event& e = t.events[i];
    if (e.ph != trace::phase::complete) continue;
    if (trace::is_gpu_op(e.cat)) {
      if (e.correlation >= 0) ops_by_corr[e.correlation].push_back(i);
    } else if (trace::is_cpu_side(e.cat)) {
      lanes[e.lane].push_back(i);
    }
  }
  struct open_event {
    time_ns end;
    std::uint32_t index;
    std::optional<phase_kind> marker;
    bool scope, shape;
  };
  std::vector<launch_rec> launches;
  std::vector<std::uint8_t> launched(t.events.size(), 0);
  for (auto& [lane, evs] : lanes) {
    std::sort(evs.begin(), evs.end(), [&](std::uint32_t a, std::uint32_t b) {
      const auto& x = t.events[a];
      const auto& y = t.events[b];
      if (x.ts != y.ts) return x.ts < y.ts;
      if (x.dur != y.dur) return x.dur > y.dur;
      return a < b;
    });
    std::vector<open_event> stack;
    for (const std::uint32_t i : evs) {
      const trace::event& e = t.events[i];
      while (!stack.empty() && stack.back().end <= e.ts) stack.pop_back();
      const bool runtime = e.cat == trace::category::cuda_runtime || e.cat == trace::category::cuda_driver;
      if (runtime) {
        const auto it = ops_by_corr.find(e.correlation);
        if (it == ops_by_corr.end() || e.correlation < 0) continue;
        launch_rec base;
        base.call = i;
        base.enqueue = e.ts;
        for (auto s = stack.rbegin(); s != stack.rend(); ++s) {
          if (s->marker && !base.marked) {
            base.phase = *s->marker, base.marked = true;
            markers[*s->marker].insert(std::string(t.name(t.events[s->index])));
          }
          if (s->marker && t.events[s->index].cat == trace::category::user_annotation) base.pass_marker = s->index;
          if (s->shape && base.shape_op == no_event) base.shape_op = s->index;
          if (t.events[s->index].cat == trace::category::cpu_op) {
            base.cpu_op = s->index;  // the last is the outermost
            if (base.inner_op == no_event) base.inner_op = s->index;
          }
        }
        for (const auto& s : stack) {
          if (s.scope) {
            base.scope = s.index;
            break;
          }
        }
        for (const std::uint32_t o : it->second) {
          launch_rec l = base;
          l.op = o;
          launched[o] = 1;
          launches.push_back(l);
        }
        continue;
      }
      const std::string_view name = t.name(e);
      bool scope = false;
      for (const auto& pat : layer_scopes) scope = scope || (!pat.empty() && name.find(pat) != std::string_view::npos);
      stack.push_back({e.end(), i, phase_marker(name), scope, is_shape_op(name)});
    }
  }
  for (std::uint32_t i = 0; i < t.events.size(); ++i) {
    const trace::event& e = t.events[i];
    if (e.ph == trace::phase::complete && trace::is_gpu_op(e.cat) && !launched[i]) {
      launch_rec l;
      l.op = i;
      l.enqueue = e.ts;
      launches.push_back(l);
    }
  }
  return launches;
}

/// Rank `ri`'s share of the inputs: its iteration window (the chosen step's annotation, else
/// the whole trace) and the GPU ops launched in it, in enqueue order, with their phase, whether
/// they communicate and the graph collective they joined. Throws `lumos::error` when the rank
/// has step annotations but not the chosen one.
inline void sweep_rank(discovery_inputs& in, std::size_t ri) {
  const trace::rank_trace& t = in.job.ranks[ri];
  const time_ns offset = in.built.ranks[ri].offset;
  rank_work& w = in.ranks[ri];
  const auto steps = trace::profiler_steps(t);
  time_ns win_begin = std::numeric_limits<time_ns>::min(), win_end = std::numeric_limits<time_ns>::max();
  if (!steps.empty()) {
    const auto it = std::find_if(steps.begin(), steps.end(), [&](const auto& s) { return in.step && s.number == *in.step; });
    if (it == steps.end()) {
      throw error(t.file + ": no ProfilerStep#" + std::to_string(in.step.value_or(-1)) + " (the trace has " + steps.front().name +
                  " to " + steps.back().name + ")");
    }
    win_begin = it->start, win_end = it->start + it->dur;
    w.iteration.value = it->name;
    w.iteration.source = "ProfilerStep annotation" + std::string(in.options.step ? " (--step)" : " (the last one every rank has)");
  } else {
    w.iteration.value = "whole trace window";
    w.iteration.source = "no ProfilerStep#N annotation in the trace";
  }
  w.iteration.flag = "--step";

  std::vector<launch_rec> launches = launch_contexts(t, in.options.layer_scopes, w.markers);
  std::erase_if(launches, [&](const launch_rec& l) { return l.enqueue < win_begin || l.enqueue >= win_end; });
  std::sort(launches.begin(), launches.end(), [&](const auto& a, const auto& b) {
    return a.enqueue != b.enqueue ? a.enqueue < b.enqueue : a.op < b.op;
  });
  const bool any_forward_marker = std::any_of(launches.begin(), launches.end(),
                                              [](const auto& l) { return l.marked && l.phase == phase_kind::forward; });
  const trace::default_comm_classifier is_comm;
  for (auto& l : launches) {
    // Unmarked launches are forward when nothing marks the forward pass (Megatron, inference);
    // with explicit forward markers they are outside the passes (data loading, zero_grad).
    if (!l.marked) l.phase = any_forward_marker ? phase_kind::other : phase_kind::forward;
    l.comm = is_comm(t, l.op);
    if (const auto it = in.instance_of.find({ri, l.op}); it != in.instance_of.end()) {
      l.instance = it->second;
      l.p2p = in.is_p2p(it->second);
    }
  }
  if (!launches.empty()) {
    w.iteration_start = launches.front().enqueue + offset;
    w.iteration_end = w.iteration_start;
  }
  if (!steps.empty()) w.iteration_start = win_begin + offset, w.iteration_end = win_end + offset;
  w.launches = std::move(launches);
}

}  // namespace detail

/// The inputs of every facet of `discover_structure` for `job` and its graph `built` (which
/// must come from `graph::build_graph(job)`), with each rank's launches swept. Throws
/// `lumos::error` for a graph of another job, or a step (`options.step`, else the largest every
/// rank has) that a rank with step annotations lacks. Linear in events (a sort per CPU thread).
[[nodiscard]] inline discovery_inputs make_discovery_inputs(const trace::job& job, const graph::built_job& built,
                                                            const structure_options& options = {}) {
  if (built.ranks.size() != job.ranks.size()) throw error("discover_structure: the graph was built from another job");
  discovery_inputs in{job, built, options, {}, {}, {}, {}, {}, {}, false};
  const graph::task_graph& g = built.graph;
  const std::size_t nr = job.ranks.size();
  for (std::size_t i = 0; i < nr; ++i) in.index_of_rank[job.ranks[i].rank] = i;
  for (std::size_t c = 0; c < g.collectives.size(); ++c) {
    for (const graph::task_id t : g.collectives[c].complete) {
      const auto it = in.index_of_rank.find(g.rank[t]);
      if (it != in.index_of_rank.end()) in.instance_of[{it->second, g.source[t]}] = static_cast<int>(c);
    }
  }
  in.step = detail::chosen_step(job, options.step);
  in.ranks.resize(nr);
  for (std::size_t ri = 0; ri < nr; ++ri) detail::sweep_rank(in, ri);
  return in;
}

}  // namespace lumos::whatif

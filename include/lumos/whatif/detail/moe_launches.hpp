#pragma once
// Per-expert launches of a MoE what-if (whatif/moe.hpp): when the experts a rank holds change
// (another EP degree or expert count), the launches that run once per local expert change in
// number. Two shapes of them: a grouped GEMM operator that launches one GEMM per local expert
// (Transformer Engine's GroupedLinear loops over its experts in C++: one framework op, one launch
// each), and a Python loop over the experts (one GEMM operator per expert, with the work between
// them). Both become runs of units, one unit per expert (its kernels on the stream and the host
// work that launched them); a run of n units becomes n x target / traced units by repeating or
// removing whole units with the editor (whatif/editor.hpp), so each copy keeps its measured launch
// calls, gaps and kernel times. A grouped operator whose one kernel is launched after host work
// of at least one launch call per expert (the launch call's time x (experts - 1) before it: the
// per-expert launches folded into the operator's host time, as `lumos synth` writes
// GroupedLinear) keeps its kernel; its host time before the launch changes by one launch call's
// time per expert added or removed. A grouped kernel with no more host time than the launches
// before it (torch._grouped_mm) is left as traced.

#include <lumos/graph/task_graph.hpp>
#include <lumos/whatif/editor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace lumos::whatif::detail {

/// One per-expert launch seen in the traces: its GPU task, its rank, the operator that launched
/// it and where it sits (pass, layer, phase), and whether it is a GEMM of a per-expert loop (a
/// GPU op of a grouped operator otherwise).
struct expert_launch {
  graph::task_id task = graph::no_task;
  std::size_t rank = 0;
  std::uint32_t owner = ~std::uint32_t{0};  ///< the launching operator's event (grouped: all its launches share it)
  int pass = -1, layer = -1, phase = -1;
  bool loop = false;
  std::int64_t experts = 0;  ///< grouped: the experts of its `Input Dims` (0: unknown)
};

/// A run of per-expert units: `units[j]` the GPU tasks of expert j in stream order.
struct expert_run {
  std::vector<std::vector<graph::task_id>> units;
  bool loop = false;
  std::int64_t folded = 0;  ///< one grouped kernel: its operator's experts (0: a run of units)
};

/// The runs of `launches` (in launch order): a grouped operator whose launches number its
/// experts (more than one) is a run of one-kernel units; the loop GEMMs of one rank, pass,
/// layer and phase are a run of `local[rank]` units of equal GEMM counts (skipped when they do
/// not divide). A loop's unit spans the stream from its expert's first GEMM to the next expert's
/// (the last one's to its last GEMM).
[[nodiscard]] inline std::vector<expert_run> expert_runs(const graph::task_graph& g, const std::vector<expert_launch>& launches,
                                                        const std::vector<std::int64_t>& local) {
  std::vector<expert_run> out;
  using key = std::tuple<std::size_t, int, int, int, std::uint32_t>;
  std::map<key, std::vector<graph::task_id>> grouped, loops;
  std::map<key, std::int64_t> experts_of;
  for (const expert_launch& l : launches) {
    if (l.loop) {
      loops[{l.rank, l.pass, l.layer, l.phase, 0}].push_back(l.task);
    } else if (l.experts > 1) {
      grouped[{l.rank, l.pass, l.layer, l.phase, l.owner}].push_back(l.task);
      experts_of[{l.rank, l.pass, l.layer, l.phase, l.owner}] = l.experts;
    }
  }
  for (auto& [k, tasks] : grouped) {
    if (tasks.size() == 1) {
      out.push_back({.units = {tasks}, .loop = false, .folded = experts_of[k]});
      continue;
    }
    if (static_cast<std::int64_t>(tasks.size()) != experts_of[k]) continue;  // unclear
    expert_run r;
    for (const graph::task_id t : tasks) r.units.push_back({t});
    out.push_back(std::move(r));
  }
  // Per processor, each task's position: a loop unit is a span of the stream.
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  std::vector<std::size_t> at(g.task_count(), 0);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    at[t] = on[g.processor[t]].size();
    on[g.processor[t]].push_back(t);
  }
  for (auto& [k, gemms] : loops) {
    const std::size_t rank = std::get<0>(k);
    const std::int64_t n = rank < local.size() ? local[rank] : 0;
    if (n <= 1 || gemms.size() % static_cast<std::size_t>(n) != 0) continue;
    const std::size_t per = gemms.size() / static_cast<std::size_t>(n);
    const auto& stream = on[g.processor[gemms.front()]];
    std::sort(gemms.begin(), gemms.end(), [&](graph::task_id a, graph::task_id b) { return at[a] < at[b]; });
    const auto first_processor = g.processor[gemms.front()];
    if (std::any_of(gemms.begin(), gemms.end(), [&](graph::task_id t) { return g.processor[t] != first_processor; })) continue;
    expert_run r{.units = {}, .loop = true};
    for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j) {
      const std::size_t begin = at[gemms[j * per]];
      // The last expert's unit ends with its last GEMM: what follows it cannot be told from what
      // follows the loop.
      const std::size_t end = j + 1 < static_cast<std::size_t>(n) ? at[gemms[(j + 1) * per]] : at[gemms[j * per + per - 1]] + 1;
      if (end <= begin || end < at[gemms[j * per + per - 1]] + 1) {
        r.units.clear();
        break;
      }
      r.units.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(begin), stream.begin() + static_cast<std::ptrdiff_t>(end));
    }
    if (!r.units.empty()) out.push_back(std::move(r));
  }
  return out;
}

/// How many copies of each of `n` units make `n2`: the first `n2` kept once when fewer, else
/// the first unit once and the others repeated evenly (the later ones once more where it does
/// not divide). The first unit's launch carries the host work before the run (the operator's
/// own setup, the loop's preamble), which the run has once whatever its length.
[[nodiscard]] inline std::vector<std::size_t> unit_counts(std::size_t n, std::size_t n2) {
  std::vector<std::size_t> out(n, 0);
  if (n2 <= n || n == 1) {
    for (std::size_t j = 0; j < n; ++j) out[j] = n == 1 ? n2 : (j < n2 ? 1 : 0);
    return out;
  }
  out[0] = 1;
  const std::size_t rest = n2 - 1, others = n - 1;
  for (std::size_t j = 1; j < n; ++j) out[j] = rest / others + (j - 1 >= others - rest % others ? 1 : 0);
  return out;
}

/// What `expert_launch_groups` plans.
struct expert_launch_plan {
  std::vector<repeat_group> groups;
  std::size_t runs = 0, units_from = 0, units_to = 0;
  std::size_t kernels_removed = 0, kernels_added = 0;  ///< GPU tasks
  std::size_t folded = 0;          ///< grouped operators whose folded launches' host time changed
  time_ns host_before = 0, host_after = 0;  ///< their host time before the launch
};

/// The host time before an ordinary launch where launch call `call` runs: the median of those
/// before the ordinary launch calls (`is_call`) that precede it on its thread (`on`, `at`: each
/// processor's tasks and each task's position there), at most `window` of them.
[[nodiscard]] inline time_ns usual_launch_gap(const graph::task_graph& g, graph::task_id call, const std::vector<std::uint8_t>& is_call,
                                              const std::vector<std::vector<graph::task_id>>& on, const std::vector<std::size_t>& at,
                                              std::size_t window = 8) {
  const auto& thread = on[g.processor[call]];
  std::vector<time_ns> gaps;
  for (std::size_t i = at[call]; i > 0 && gaps.size() < window && at[call] - i < 16 * window; --i) {
    if (is_call[thread[i - 1]]) gaps.push_back(g.busy_gap[thread[i - 1]]);
  }
  if (gaps.empty()) return 0;
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  return gaps[gaps.size() / 2];
}

/// The folded launches of run `r` (`expert_run::folded`) taken from `from` to `to` local experts:
/// the host time before its launch call `call` changed by the call's time per expert. Returns
/// whether the run holds folded launches: the host time before the call exceeds an ordinary
/// launch's (`usual`) by at least half a call per expert beyond the first. An operator's host
/// time alone cannot tell: with 2 local experts one launch call's worth is less than the
/// framework's own time before a launch, which a grouped kernel that launches once (torch's
/// `_grouped_mm`) has too.
inline bool retime_folded_launches(graph::task_graph& g, const expert_run& r, graph::task_id call, time_ns usual, std::int64_t from,
                                   std::int64_t to, expert_launch_plan& plan) {
  if (r.folded <= 1 || call == graph::no_task) return false;
  const time_ns per = g.duration[call];
  if (per <= 0 || 2 * (g.busy_gap[call] - usual) < per * (r.folded - 1)) return false;
  const std::int64_t experts = r.folded * to / from;
  plan.host_before += g.busy_gap[call];
  g.busy_gap[call] = std::max<time_ns>(0, g.busy_gap[call] + per * (experts - r.folded));
  plan.host_after += g.busy_gap[call];
  ++plan.folded;
  return true;
}

/// The editor groups that take each run of `runs` from its units to units x `to` / `from`
/// (local experts per rank, traced and target): each unit with the host tasks that launched it
/// (the span of its launch calls on their thread, up to the next unit's first call; the last
/// unit's to its last call). A unit whose host span cannot be told (launches on
/// several threads, spans that overlap) leaves its run as traced. The kernels of a grouped run
/// share the operator's time: each kept one is scaled by n / n2 so that the operator's total
/// stays what the rescale made it; a loop's kernels are each one expert's and keep their time.
/// Runs that do not change are left out. O(tasks + edges).
[[nodiscard]] inline expert_launch_plan expert_launch_groups(graph::task_graph& g, const std::vector<expert_run>& runs, std::int64_t from,
                                                             std::int64_t to) {
  expert_launch_plan plan;
  if (from <= 0 || to <= 0 || from == to) return plan;
  std::vector<graph::task_id> launcher(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && g.kind[e.from] == graph::task_kind::cpu) launcher[e.to] = e.from;
  }
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  std::vector<std::size_t> at(g.task_count(), 0);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    at[t] = on[g.processor[t]].size();
    on[g.processor[t]].push_back(t);
  }
  std::vector<std::uint8_t> used(g.task_count(), 0), is_call(g.task_count(), 0);
  for (const graph::task_id c : launcher) {
    if (c != graph::no_task) is_call[c] = 1;
  }
  // The grouped operators' own calls are not ordinary: in backward they follow one another.
  for (const expert_run& r : runs) {
    if (r.folded > 0 && launcher[r.units.front().front()] != graph::no_task) is_call[launcher[r.units.front().front()]] = 0;
  }
  for (const expert_run& r : runs) {
    if (r.folded > 0) {
      const graph::task_id call = launcher[r.units.front().front()];
      if (r.folded * to % from == 0 && call != graph::no_task) {
        (void)retime_folded_launches(g, r, call, usual_launch_gap(g, call, is_call, on, at), from, to, plan);
      }
      continue;
    }
    const std::size_t n = r.units.size();
    if (n == 0 || (static_cast<std::int64_t>(n) * to) % from != 0) continue;
    const std::size_t n2 = static_cast<std::size_t>(static_cast<std::int64_t>(n) * to / from);
    // Each unit's first and last launch call on one host thread.
    std::vector<std::pair<std::size_t, std::size_t>> calls;
    graph::processor_id thread = 0;
    bool ok = true;
    for (const auto& unit : r.units) {
      std::size_t lo = ~std::size_t{0}, hi = 0;
      for (const graph::task_id t : unit) {
        const graph::task_id c = launcher[t];
        if (c == graph::no_task) continue;
        if (lo == ~std::size_t{0} && calls.empty()) thread = g.processor[c];
        if (g.processor[c] != thread) ok = false;
        lo = std::min(lo, at[c]), hi = std::max(hi, at[c]);
      }
      if (lo == ~std::size_t{0} || (!calls.empty() && lo <= calls.back().second)) ok = false;
      calls.emplace_back(lo, hi);
      if (!ok) break;
    }
    if (!ok) continue;
    std::vector<repeat_group> groups;
    const std::vector<std::size_t> counts = unit_counts(n, n2);
    for (std::size_t j = 0; j < n && ok; ++j) {
      const std::size_t end = j + 1 < n ? calls[j + 1].first : calls[j].second + 1;
      repeat_group grp{.tasks = r.units[j], .count = counts[j]};
      for (std::size_t p = calls[j].first; p < std::min(end, on[thread].size()); ++p) grp.tasks.push_back(on[thread][p]);
      if (std::max(end, calls[j].second + 1) > on[thread].size() || end <= calls[j].second) ok = false;
      for (const graph::task_id t : grp.tasks) ok = ok && !used[t];
      groups.push_back(std::move(grp));
    }
    if (!ok) continue;
    for (const repeat_group& grp : groups) {
      for (const graph::task_id t : grp.tasks) used[t] = 1;
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (!r.loop) {
        for (const graph::task_id t : r.units[j]) {
          g.duration[t] = static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * static_cast<double>(n) / static_cast<double>(n2)));
        }
      }
      if (counts[j] == 0) plan.kernels_removed += r.units[j].size();
      if (counts[j] > 1) plan.kernels_added += r.units[j].size() * (counts[j] - 1);
    }
    ++plan.runs, plan.units_from += n, plan.units_to += n2;
    for (repeat_group& grp : groups) plan.groups.push_back(std::move(grp));
  }
  return plan;
}

}  // namespace lumos::whatif::detail

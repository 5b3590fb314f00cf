#pragma once
// Why a what-if moved the step, or did not: what the baseline's critical path is made of, what
// the change did to the GPU's compute and communication time, and, when the step moved much
// less than the GPU work did, the sentence that says what bounds the job and what would move it.

#include <lumos/report/critical_path.hpp>
#include <lumos/report/replay_report.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace lumos::whatif {

/// A critical path in four parts, as fractions of its length: host work (CPU and launch
/// latency), GPU compute, communication (transfers and waits for peers), other waits (syncs,
/// idle).
struct path_shares {
  double cpu = 0;
  double gpu_compute = 0;
  double communication = 0;
  double waits = 0;

  friend bool operator==(const path_shares&, const path_shares&) = default;
};

/// The names of `path_shares`'s parts, in order (the JSON keys).
inline constexpr std::array<std::string_view, 4> path_share_names = {"cpu", "gpu_compute", "communication", "waits"};

/// Why the what-if moved the step as much as it did.
struct attribution {
  path_shares baseline;                  ///< of the baseline's slowest rank
  std::optional<path_shares> predicted;  ///< of the prediction's slowest rank (unset for a pass-level pipeline model)
  /// What the baseline's critical path is mostly made of: "host", "compute", "communication" or
  /// "waits" (the largest share).
  std::string bound_by;
  /// GPU busy time of the slowest rank, computing and in communication kernels (their waits for
  /// peers included; with the overlap), in the baseline and the prediction. After a pipeline
  /// change predicted by the pass-level model, the "after" figures are those of the replay the
  /// model is anchored on (the traces' stages with the other changes), not of the target pipeline.
  time_ns compute_before = 0, compute_after = 0, comm_before = 0, comm_after = 0;
  /// The explanation; names what would move the step when the step moved little.
  std::string text;
};

namespace detail {

[[nodiscard]] inline std::size_t slowest_rank(const report::replay_session& s) {
  std::size_t slowest = 0;
  for (std::size_t i = 1; i < s.ranks.size(); ++i) {
    if (s.ranks[i].simulated_ns > s.ranks[slowest].simulated_ns) slowest = i;
  }
  return slowest;
}

[[nodiscard]] inline path_shares shares_of(const report::critical_path& p) {
  using report::path_category;
  auto total = [&](path_category c) { return static_cast<double>(p.total[static_cast<std::size_t>(c)]); };
  const double cpu = total(path_category::cpu) + total(path_category::launch);
  const double compute = total(path_category::gpu_compute);
  const double comm = total(path_category::gpu_comm) + total(path_category::peer_wait);
  const double waits = total(path_category::sync_wait) + total(path_category::idle);
  const double all = cpu + compute + comm + waits;
  if (all <= 0) return {};
  return {cpu / all, compute / all, comm / all, waits / all};
}

[[nodiscard]] inline path_shares critical_path_shares(const report::replay_session& s) {
  if (s.ranks.empty()) return {};
  const std::size_t i = slowest_rank(s);
  return shares_of(report::iteration_critical_path(s.built.graph, s.compiled, s.timeline, s.plans[i], s.ranks[i].simulated));
}

[[nodiscard]] inline double ratio(time_ns after, time_ns before) {
  return before > 0 ? static_cast<double>(after) / static_cast<double>(before) : 1.0;
}

}  // namespace detail

/// The attribution of a what-if from its baseline replay and its prediction; `predicted_graph`
/// false when the prediction's ranks are not the predicted step's (a pass-level pipeline model).
[[nodiscard]] inline attribution attribute(const report::replay_session& baseline, const report::replay_session& predicted,
                                           time_ns predicted_ns, bool predicted_graph) {
  attribution a;
  a.baseline = detail::critical_path_shares(baseline);
  if (predicted_graph) a.predicted = detail::critical_path_shares(predicted);
  const std::array<double, 4> shares = {a.baseline.cpu, a.baseline.gpu_compute, a.baseline.communication, a.baseline.waits};
  constexpr std::array<std::string_view, 4> bound = {"host", "compute", "communication", "waits"};
  std::size_t top = 0;
  for (std::size_t k = 1; k < shares.size(); ++k) {
    if (shares[k] > shares[top]) top = k;
  }
  a.bound_by = bound[top];
  auto busy = [](const report::replay_session& s, bool comm) -> time_ns {
    if (s.ranks.empty()) return 0;
    const auto& split = s.ranks[detail::slowest_rank(s)].simulated.split;
    return (comm ? split.exposed_comm : split.exposed_compute) + split.overlapped;
  };
  a.compute_before = busy(baseline, false);
  a.compute_after = busy(predicted, false);
  a.comm_before = busy(baseline, true);
  a.comm_after = busy(predicted, true);

  char line[512];
  std::snprintf(line, sizeof line,
                "the baseline's critical path is %.0f %% host (CPU) work, %.0f %% GPU compute, %.0f %% communication and "
                "%.0f %% waits; the change scales the GPU's compute time x%.3g and its time in communication kernels x%.3g",
                100 * a.baseline.cpu, 100 * a.baseline.gpu_compute, 100 * a.baseline.communication, 100 * a.baseline.waits,
                detail::ratio(a.compute_after, a.compute_before), detail::ratio(a.comm_after, a.comm_before));
  a.text = line;
  // The step moved much less than the GPU work did: say what holds it.
  const double step = std::abs(detail::ratio(predicted_ns, baseline.simulated_ns) - 1);
  const double gpu = std::max(std::abs(detail::ratio(a.compute_after, a.compute_before) - 1),
                              std::abs(detail::ratio(a.comm_after, a.comm_before) - 1));
  if (gpu > 0.1 && step < gpu / 3) {
    if (a.bound_by == "host") {
      a.text += "; the step is host-bound, so it moves little: a faster host would move it "
                "(`lumos replay --scale cpu=0.5` on the traces shows how much)";
    } else if (a.bound_by == "communication") {
      a.text += "; the step is communication-bound, so it moves little: faster links would move it "
                "(`lumos replay --scale comm=0.5` on the traces shows how much)";
    } else if (a.bound_by == "waits") {
      a.text += "; the step is bound by waits (synchronisations, idle GPU), so it moves little";
    }
  }
  return a;
}

}  // namespace lumos::whatif

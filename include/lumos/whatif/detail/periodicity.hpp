#pragma once
// The repeating block of a sequence (the kernels of one transformer layer within a forward pass).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

namespace lumos::whatif::detail {

/// A run of `repetitions` consecutive copies of a block of `period` symbols starting at `start`.
struct periodic_run {
  std::size_t period = 0;
  std::size_t start = 0;
  std::size_t repetitions = 0;
  /// Symbols the matching stretch has beyond the copies: every start in [start, start + slack]
  /// gives as many (`align_by_duration` chooses among them).
  std::size_t slack = 0;

  [[nodiscard]] constexpr std::size_t covered() const noexcept { return period * repetitions; }
  [[nodiscard]] constexpr bool found() const noexcept { return repetitions >= 2; }
};

/// The block that, repeated back to back, covers the most of `seq`: for each period P in
/// [min_period, max_period], the longest stretch where seq[i] == seq[i + P] gives
/// ⌊(stretch + P) / P⌋ whole copies; the P covering most symbols wins, the smallest on ties (a
/// multiple of the true period covers as much, never more). `required_repetitions`, when not 0,
/// keeps only periods with exactly that many copies (the backward pass of a model whose forward
/// showed L layers). O(n · max_period) comparisons of integers.
[[nodiscard]] constexpr periodic_run find_period(std::span<const std::uint32_t> seq, std::size_t min_period,
                                                 std::size_t max_period, std::size_t required_repetitions = 0) {
  periodic_run best;
  const std::size_t n = seq.size();
  if (min_period == 0) min_period = 1;
  for (std::size_t p = min_period; p <= max_period && 2 * p <= n; ++p) {
    std::size_t run = 0, best_run = 0, best_start = 0;
    for (std::size_t i = 0; i + p < n; ++i) {
      if (seq[i] == seq[i + p]) {
        if (++run > best_run) best_run = run, best_start = i + 1 - run;
      } else {
        run = 0;
      }
    }
    if (best_run < p) continue;  // not even two whole copies
    const std::size_t reps = (best_run + p) / p;
    if (required_repetitions != 0 && reps != required_repetitions) continue;
    if (reps * p > best.covered()) best = {p, best_start, reps, best_run + p - reps * p};
  }
  return best;
}

/// The start, among those `run` allows, whose first and last copies look most like the copies
/// next to them: the least sum over their positions of |log(duration / duration one period
/// inward)|; the latest on ties. Names alone cannot tell where a run of identical layers begins
/// when the ops before them end like a layer: the backward pass of a last pipeline stage starts
/// with the output layer's input and weight gradient GEMMs, named as a layer's, and the earliest
/// start took them into the last layer (removing layers removed the output layer's backward).
/// `duration(i)` is the time of symbol i (> 0). O(slack · period).
template <class Duration>
[[nodiscard]] std::size_t align_by_duration(const periodic_run& run, const Duration& duration) {
  if (!run.found() || run.slack == 0) return run.start;
  auto log_ratio = [&](std::size_t a, std::size_t b) {
    const double x = static_cast<double>(duration(a)), y = static_cast<double>(duration(b));
    if (x <= 0 || y <= 0) return x == y ? 0.0 : 1.0;
    return std::fabs(std::log(x / y));
  };
  std::size_t best = run.start;
  double best_cost = 0;
  for (std::size_t s = run.start; s <= run.start + run.slack; ++s) {
    double cost = 0;
    const std::size_t last = s + (run.repetitions - 1) * run.period;
    for (std::size_t k = 0; k < run.period; ++k) cost += log_ratio(s + k, s + run.period + k) + log_ratio(last + k, last - run.period + k);
    if (s == run.start || cost <= best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace lumos::whatif::detail

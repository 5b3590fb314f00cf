#pragma once
// Structure facet: the forward and backward passes of each rank, one per micro-batch (and model
// chunk), in execution order.

#include <lumos/pipeline/schedule.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// Passes of one rank from its launches in enqueue order: runs of forward or backward launches,
/// a new pass at each change of kind and after a point-to-point transfer that followed compute;
/// with `by_marker` also where the outermost user annotation that marks the phase changes. Sets
/// each launch's `pass` (−1: in none) and, per pass, its launches and its span (`offset`: the
/// rank's clock offset); micro-batches in order (the k-th forward, the k-th backward).
inline void form_passes(std::vector<launch_rec>& launches, const trace::rank_trace& t, time_ns offset, bool by_marker,
                        std::vector<pass_info>& passes, std::vector<std::vector<std::size_t>>& pass_launches) {
  passes.clear(), pass_launches.clear();
  int cur = -1;
  bool split = false, has_compute = false;
  std::uint32_t cur_marker = no_event;
  for (std::size_t li = 0; li < launches.size(); ++li) {
    auto& l = launches[li];
    l.pass = -1;
    if (l.p2p) {
      if (cur >= 0 && has_compute) split = true;
      continue;
    }
    if (l.phase == phase_kind::optimizer) {
      cur = -1;
      continue;
    }
    if (l.phase != phase_kind::forward && l.phase != phase_kind::backward) continue;
    const auto kind = l.phase == phase_kind::forward ? pipeline::op_kind::forward : pipeline::op_kind::backward;
    const bool new_marker = by_marker && l.pass_marker != no_event && cur_marker != no_event && l.pass_marker != cur_marker;
    if (l.pass_marker != no_event) cur_marker = l.pass_marker;
    if (cur < 0 || split || new_marker || passes[static_cast<std::size_t>(cur)].op.kind != kind) {
      pass_info p;
      p.op.kind = kind;
      p.start = l.enqueue + offset;
      passes.push_back(p);
      pass_launches.emplace_back();
      cur = static_cast<int>(passes.size()) - 1;
      split = false;
      has_compute = false;
    }
    has_compute = has_compute || !l.comm;
    l.pass = cur;
    pass_launches[static_cast<std::size_t>(cur)].push_back(li);
    auto& p = passes[static_cast<std::size_t>(cur)];
    ++p.gpu_ops;
    p.end = std::max(p.end, t.events[l.op].end() + offset);
  }
  int nf = 0, nb = 0;
  for (auto& p : passes) p.op.micro_batch = p.op.kind == pipeline::op_kind::forward ? nf++ : nb++;
}

/// The number of forward and of backward passes in `passes`.
[[nodiscard]] inline std::pair<std::size_t, std::size_t> pass_counts(const std::vector<pass_info>& passes) {
  std::pair<std::size_t, std::size_t> fb{0, 0};
  for (const auto& p : passes) (p.op.kind == pipeline::op_kind::forward ? fb.first : fb.second) += 1;
  return fb;
}

}  // namespace detail

/// Fills each rank's `passes` and assigns each launch of `in` its pass: runs of forward or
/// backward launches, split at point-to-point transfers that follow compute. A zero-bubble
/// schedule's B and the W right after it (no transfer between them on stage 0) are one run of
/// backward launches: when that leaves the ranks with different numbers of passes, and a script
/// marked each pass (as `lumos synth` does), the passes split where the marking annotation
/// changes are taken if every rank then runs two backward passes per forward one (with a note).
/// Not by default: a job written by a what-if keeps the traced markers at their traced times,
/// which need not bracket its passes. Runs after `discover_iteration`. Linear in launches.
inline void discover_passes(discovery_inputs& in, job_structure& out) {
  const std::size_t nr = in.rank_count();
  // Per rank: its passes split also where the annotation that marks their phase changes.
  struct marked_split {
    std::vector<pass_info> passes;
    std::vector<std::vector<std::size_t>> pass_launches;
    std::vector<int> pass_of;  // per launch
  };
  std::vector<marked_split> marked(nr);
  for (std::size_t ri = 0; ri < nr; ++ri) {
    const trace::rank_trace& t = in.job.ranks[ri];
    const time_ns offset = in.built.ranks[ri].offset;
    detail::rank_work& w = in.ranks[ri];
    auto& launches = w.launches;
    detail::form_passes(launches, t, offset, false, out.ranks[ri].passes, w.pass_launches);
    detail::form_passes(launches, t, offset, true, marked[ri].passes, marked[ri].pass_launches);
    marked[ri].pass_of.resize(launches.size());
    for (std::size_t li = 0; li < launches.size(); ++li) marked[ri].pass_of[li] = launches[li].pass;
    for (std::size_t k = 0; k < w.pass_launches.size(); ++k) {
      for (const std::size_t li : w.pass_launches[k]) launches[li].pass = static_cast<int>(k);
    }
  }
  bool coarse_alike = true, marked_zero_bubble = nr > 0;
  for (std::size_t ri = 0; ri < nr; ++ri) {
    coarse_alike = coarse_alike && detail::pass_counts(out.ranks[ri].passes) == detail::pass_counts(out.ranks[0].passes);
    const auto fb = detail::pass_counts(marked[ri].passes);
    marked_zero_bubble =
        marked_zero_bubble && fb == detail::pass_counts(marked[0].passes) && fb.first > 0 && fb.second == 2 * fb.first;
  }
  if (coarse_alike || !marked_zero_bubble) return;
  for (std::size_t ri = 0; ri < nr; ++ri) {
    out.ranks[ri].passes = std::move(marked[ri].passes);
    in.ranks[ri].pass_launches = std::move(marked[ri].pass_launches);
    for (std::size_t li = 0; li < in.ranks[ri].launches.size(); ++li) in.ranks[ri].launches[li].pass = marked[ri].pass_of[li];
  }
  out.notes.push_back("passes split where the annotation that marks their phase changes: every rank then runs two backward "
                      "passes (B and W) per forward pass");
}

}  // namespace lumos::whatif

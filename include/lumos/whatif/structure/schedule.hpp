#pragma once
// Structure facet: the pipeline schedule, micro-batches and model chunks — the order of forward
// and backward passes each stage ran, compared op for op with the order of every shipped
// schedule policy (synth::schedule_types) on every shape the pass counts allow.

#include <lumos/core/error.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// A schedule whose order every stage of every pipeline ran.
struct schedule_candidate {
  synth::schedule_policy schedule;
  pipeline::schedule_shape shape;
  std::vector<std::vector<std::vector<pipeline::op>>> orders;  ///< per pipeline, per stage
};

/// What the traced orders are matched by.
struct schedule_search {
  std::vector<std::vector<std::size_t>> stage_ranks;  ///< per pipeline: the rank index of each stage
  std::vector<std::string> letters;                   ///< per rank index: its passes as F and B
  std::int32_t stages = 1;                            ///< p
  std::int32_t forwards = 1;                          ///< forward passes per stage
  bool split_backward = false;                        ///< two backward passes per forward one
  bool ring = false, chain = false;                   ///< some pipeline's partners form a ring / a chain
  std::optional<bool> receives_activations;           ///< two stages: stage 0 receives before a forward pass
};

/// Whether some shipped schedule splits the backward as `splits` and has model chunks as `chunked`.
[[nodiscard]] inline bool ships_schedule(bool splits, bool chunked) {
  bool any = false;
  synth::for_each_schedule([&](auto t) {
    using S = typename decltype(t)::type;
    any = any || (S::splits_backward == splits && S::supports_chunks == chunked);
  });
  return any;
}

/// Adds `S` on `shape` to `found` when every stage ran its order (W read as a backward pass).
template <pipeline::PipelineSchedule S>
void match_schedule(const schedule_search& s, const pipeline::schedule_shape& shape, std::vector<schedule_candidate>& found) {
  try {
    S::validate(shape);
  } catch (const error&) {
    return;
  }
  schedule_candidate c{synth::policy_of<S>(), shape, {}};
  for (const auto& pl : s.stage_ranks) {
    std::vector<std::vector<pipeline::op>> per_stage;
    for (std::size_t st = 0; st < pl.size(); ++st) {
      auto ops = S::stage_ops(shape, static_cast<std::int32_t>(st));
      std::string want;
      for (const auto& o : ops) want += pipeline::op_letter(o.kind == pipeline::op_kind::weight ? pipeline::op_kind::backward : o.kind);
      if (want != s.letters[pl[st]]) return;
      per_stage.push_back(std::move(ops));
    }
    c.orders.push_back(std::move(per_stage));
  }
  found.push_back(std::move(c));
}

/// Tries `S` on each shape the traces allow: p stages, and m = forwards with one chunk, or
/// m = forwards / v with v ≥ 2 chunks for a policy with chunks. A ring of more than two stages
/// is a chunked schedule's, a chain of more than two an unchunked one's. With two stages the
/// partners cannot tell a chain from a ring; the receives of stage 0 can, and decide where
/// schedules of both kinds (of the same backward split) could match.
template <pipeline::PipelineSchedule S>
void try_schedule(const schedule_search& s, std::vector<schedule_candidate>& found) {
  if (S::splits_backward != s.split_backward) return;
  const std::int32_t p = s.stages, n = s.forwards;
  if constexpr (S::supports_chunks) {
    if ((s.chain && p > 2) || (s.receives_activations == false && ships_schedule(S::splits_backward, false))) return;
    for (std::int32_t v = 2; v <= n; ++v) {
      if (n % v == 0 && p > 1) match_schedule<S>(s, {p, n / v, v}, found);
    }
  } else {
    if ((s.ring && p > 2) || (s.receives_activations == true && ships_schedule(S::splits_backward, true))) return;
    match_schedule<S>(s, {p, n, 1}, found);
  }
}

/// Every shipped schedule and shape whose order the traces show, in the order of
/// `synth::schedule_types` (then by chunks).
[[nodiscard]] inline std::vector<schedule_candidate> matching_schedules(const schedule_search& s) {
  std::vector<schedule_candidate> found;
  synth::for_each_schedule([&](auto t) { try_schedule<typename decltype(t)::type>(s, found); });
  return found;
}

/// "GPipe, 1F1B or interleaved 1F1B": the shipped schedules that split the backward as `splits`.
[[nodiscard]] inline std::string schedule_titles(bool splits) {
  std::vector<std::string_view> titles;
  synth::for_each_schedule([&](auto t) {
    using S = typename decltype(t)::type;
    if (S::splits_backward == splits) titles.push_back(S::title);
  });
  std::string out;
  for (std::size_t i = 0; i < titles.size(); ++i) {
    out += i == 0 ? "" : i + 1 == titles.size() ? " or " : ", ";
    out += titles[i];
  }
  return out;
}

/// Per pipeline, the rank index of each stage: the pipelines walked, else every rank as a
/// pipeline of one stage when PP is 1; empty when stages are unknown.
[[nodiscard]] inline std::vector<std::vector<std::size_t>> stage_ranks_of(const discovery_inputs& in, const job_structure& out) {
  std::vector<std::vector<std::size_t>> stage_ranks;
  if (!in.topology.pipelines.empty()) {
    for (const auto& p : in.topology.pipelines) {
      std::vector<std::size_t> v;
      for (const int r : p) v.push_back(in.rank_index(r));
      stage_ranks.push_back(v);
    }
  } else if (out.parallel.pp.value == 1) {
    for (std::size_t ri = 0; ri < in.rank_count(); ++ri) stage_ranks.push_back({ri});
  }
  return stage_ranks;
}

/// Whether rank `ri` receives (by the CPU operator that posted it: c10d's nccl:recv) before a
/// forward pass at least once: only activations come before a forward. Unknown when no receive
/// says.
[[nodiscard]] inline std::optional<bool> receives_activations(const discovery_inputs& in, const job_structure& out, std::size_t ri) {
  std::optional<bool> result;
  const auto& ls = in.ranks[ri].launches;
  for (std::size_t k = 0; k < ls.size(); ++k) {
    if (!ls[k].p2p || transfer_side(in.job.ranks[ri], ls[k].cpu_op) != -1) continue;
    for (std::size_t j = k + 1; j < ls.size(); ++j) {
      if (ls[j].pass < 0 || ls[j].p2p) continue;
      const bool forward = out.ranks[ri].passes[static_cast<std::size_t>(ls[j].pass)].op.kind == pipeline::op_kind::forward;
      result = result.value_or(false) || forward;
      break;
    }
  }
  return result;
}

/// Whether no phase of any rank of `stage_ranks` was marked by an annotation or op.
[[nodiscard]] inline bool nothing_marked(const job_structure& out, const std::vector<std::vector<std::size_t>>& stage_ranks) {
  return std::none_of(stage_ranks.begin(), stage_ranks.end(), [&](const auto& p) {
    return std::any_of(p.begin(), p.end(), [&](std::size_t ri) {
      const auto& phases = out.ranks[ri].phases;
      return std::any_of(phases.begin(), phases.end(), [](const phase_span& ph) { return ph.marked; });
    });
  });
}

/// Reports the outcome of the search: the one schedule found (its shape, and each pass's op in
/// its order), none, or several (their common shape, if any, and a note).
inline void report_schedule(const discovery_inputs& in, const schedule_search& s, const std::vector<schedule_candidate>& found,
                            job_structure& out) {
  auto& par = out.parallel;
  const std::int32_t p = s.stages;
  const std::size_t forwards = static_cast<std::size_t>(s.forwards);
  const std::string observed = "stage 0 ran " + s.letters[s.stage_ranks.front().front()];
  const bool narrowed = in.options.schedule || in.options.chunks;
  if (found.size() == 1) {
    const auto& c = found.front();
    par.schedule.value = c.schedule;
    par.schedule.source = observed + ", op for op the order of the " + std::string(c.schedule.title) + " policy with p " +
                          std::to_string(c.shape.stages) + ", m " + std::to_string(c.shape.micro_batches) + ", v " +
                          std::to_string(c.shape.chunks) + " on every stage" +
                          (s.ring ? " (partners form a ring: chunks wrap from the last stage to the first)" : "") +
                          (narrowed ? " (among candidates kept by --schedule/--vp)" : "");
    par.chunks.value = c.shape.chunks;
    par.chunks.source = "the recognised schedule";
    par.micro_batches.value = c.shape.micro_batches;
    par.micro_batches.source = std::to_string(forwards) + " forward passes per stage / " + std::to_string(c.shape.chunks) + " chunk(s)";
    for (std::size_t pl = 0; pl < s.stage_ranks.size(); ++pl) {
      for (std::size_t st = 0; st < s.stage_ranks[pl].size(); ++st) {
        auto& passes = out.ranks[s.stage_ranks[pl][st]].passes;
        for (std::size_t k = 0; k < passes.size(); ++k) passes[k].op = c.orders[pl][st][k];
      }
    }
  } else if (found.empty()) {
    const std::string titles = schedule_titles(s.split_backward);
    par.schedule.source = s.split_backward ? observed + ": two backward passes per forward pass, but matches no " + titles + " order of p " +
                                                 std::to_string(p) + " with " + std::to_string(forwards) + " micro-batches"
                                           : observed + ": matches no " + titles + " order of p " + std::to_string(p) + " with " +
                                                 std::to_string(forwards) +
                                                 " forward passes per stage (a zero-bubble schedule's W passes are told from its B "
                                                 "passes only when an annotation marks each pass)";
  } else {
    // Candidates that agree on the shape still give the micro-batches and chunks.
    const bool same_shape = std::all_of(found.begin(), found.end(), [&](const auto& c) { return c.shape == found.front().shape; });
    if (same_shape) {
      par.chunks.value = found.front().shape.chunks;
      par.chunks.source = "every schedule that matches the order has " + std::to_string(found.front().shape.chunks) + " chunk(s)";
      par.micro_batches.value = found.front().shape.micro_batches;
      par.micro_batches.source =
          std::to_string(forwards) + " forward passes per stage / " + std::to_string(found.front().shape.chunks) + " chunk(s)";
    }
    std::string names;
    for (const auto& c : found) {
      names += (names.empty() ? "" : ", ") + std::string(c.schedule.name) + " (v " + std::to_string(c.shape.chunks) + ")";
    }
    par.schedule.source = observed + ": ambiguous, the same order as " + names;
    if (!(p == 1 && forwards == 1)) out.notes.push_back("schedule ambiguous between " + names + ": pass --schedule (and --vp)");
  }
}

}  // namespace detail

/// Fills `out.parallel.schedule`, `chunks` and `micro_batches`, and, when one schedule matches,
/// the op (micro-batch, chunk, kind) of every pass from its order. Every shipped schedule is
/// tried (a policy listed in `synth::schedule_types` is recognised with no change here) on the
/// shapes the pass counts allow; zero-bubble schedules only when every rank runs two backward
/// passes (B and W) per forward one. `options.schedule` (by name) and `options.chunks` narrow
/// the candidates; several left are reported as ambiguous, with a
/// note. Runs after `discover_layout`. O(ranks × passes × divisors of the forward count).
inline void discover_schedule(const discovery_inputs& in, job_structure& out) {
  auto& par = out.parallel;
  par.schedule.flag = "--schedule", par.chunks.flag = "--vp";
  detail::schedule_search s;
  s.stage_ranks = detail::stage_ranks_of(in, out);
  std::size_t forwards = 0, backwards = 0;
  bool consistent = !s.stage_ranks.empty();
  for (const auto& p : s.stage_ranks) {
    for (const std::size_t ri : p) {
      std::size_t f = 0, b = 0;
      for (const auto& pass : out.ranks[ri].passes) (pass.op.kind == pipeline::op_kind::forward ? f : b) += 1;
      if (forwards == 0 && backwards == 0) forwards = f, backwards = b;
      consistent = consistent && f == forwards && b == backwards;
    }
  }
  if (!consistent) {
    par.schedule.source = s.stage_ranks.empty() ? "pipeline stages unknown" : "ranks run different numbers of passes";
  } else if (forwards == 0) {
    par.schedule.source = "no forward pass in the iteration";
  } else if (backwards == 0 && detail::nothing_marked(out, s.stage_ranks)) {
    // Nothing marks a pass: the whole step reads as one forward pass, which says neither that
    // it is forward only nor over how many micro-batches it runs (a training step of a trace
    // with kernels and launches only reads the same).
    par.schedule.source = "no forward/backward annotation or op marks the passes (the step reads as one forward pass)";
    par.micro_batches.source = par.schedule.source;
    par.chunks.source = par.schedule.source;
  } else if (backwards == 0) {
    par.schedule.source = "forward only (no backward pass): no training schedule";
    par.micro_batches.value = static_cast<int>(forwards);
    par.micro_batches.source = std::to_string(forwards) + " forward pass(es) per rank";
    par.chunks.value = 1;
    par.chunks.source = "forward only";
  } else if (backwards != forwards && backwards != 2 * forwards) {
    par.schedule.source = std::to_string(forwards) + " forward and " + std::to_string(backwards) +
                          " backward passes per rank: passes are not delimited one per micro-batch";
  } else {
    // Twice as many backward passes as forward: a zero-bubble schedule, each backward split in
    // B and W (its weight gradients), which the traces tell apart only as two passes (each
    // marked on its own); its order is compared with W read as a backward pass.
    s.split_backward = backwards == 2 * forwards;
    s.stages = static_cast<std::int32_t>(s.stage_ranks.front().size());
    s.forwards = static_cast<std::int32_t>(forwards);
    s.ring = in.topology.ring, s.chain = in.topology.chain;
    for (const auto& rs : out.ranks) {
      std::string l;
      for (const auto& p : rs.passes) l += pipeline::op_letter(p.op.kind);
      s.letters.push_back(std::move(l));
    }
    if (s.stages == 2) s.receives_activations = detail::receives_activations(in, out, s.stage_ranks.front().front());
    std::vector<detail::schedule_candidate> found = detail::matching_schedules(s);
    if (in.options.schedule) std::erase_if(found, [&](const auto& c) { return c.schedule.name != in.options.schedule->name; });
    if (in.options.chunks) std::erase_if(found, [&](const auto& c) { return c.shape.chunks != *in.options.chunks; });
    detail::report_schedule(in, s, found, out);
  }
}

}  // namespace lumos::whatif

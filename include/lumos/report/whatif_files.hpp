#pragma once
// The files a what-if writes: its prediction as Kineto traces (`lumos whatif --trace-out`) and
// its HTML page (`--report`), the prediction with the baseline beside it and its changes first.
// `lumos whatif` and the Python package's `lumos.whatif` write them here. Writes files (zlib):
// part of lumos::lumos.

#include <lumos/report/html.hpp>
#include <lumos/report/json/whatif.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/stage_split.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lumos::report {

namespace detail {

// `--trace-out` after a split in the graph: every rank of every stage, the added stages' ranks
// written from the traced rank each copies, their transfers under c10d's operators.
inline void stage_ranks_out(const whatif::stage_split& st, const replay_session& predicted, simulated_job& sj,
                            std::vector<int>& ranks, trace_decorations& transfers) {
  sj.subset = true;
  if (!st.weight_pass.empty()) sj.weight_pass = &st.weight_pass;
  sj.lone_groups = &st.lone_groups;
  sj.world_size = st.world * st.stages;
  // Merged stages: the ranks of the stages dropped are not written; the kept ones keep their
  // traced numbers, so the world reaches past the last of them.
  std::vector<int> kept;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i >= st.dropped.size() || !st.dropped[i]) kept.push_back(ranks[i]);
  }
  ranks = std::move(kept);
  for (const int k : ranks) sj.world_size = std::max(sj.world_size, k + 1);
  // The added ranks' plans follow the traced ranks' kept in the prediction.
  const std::size_t traced_plans = predicted.plans.size() - st.maps.size();
  for (std::size_t k = 0; k < st.maps.size(); ++k) {
    const int rank = st.maps[k].rank;
    sj.aliases.push_back({rank, st.traced_index[k], &st.maps[k], traced_plans + k});
    ranks.push_back(rank);
  }
  // The added transfers under c10d's operators; their kernels carry the operator's id.
  transfers.list.resize(3);
  transfers.list[0].cpu_op = "nccl:send";
  transfers.list[1].cpu_op = "nccl:recv";
  transfers.of_task.assign(predicted.built.graph.task_count(), trace_decorations::none);
  for (const auto& t : st.transfer_launches) {
    transfers.of_task[t.launch] = t.send ? 0 : 1;
    transfers.of_task[t.kernel] = 2;
  }
  sj.decorations = &transfers;
}

// A folded TP or DP change (or HSDP's shard groups resized): the traced ranks stand for the
// target's, written with the target's group sizes and world, so that the written job reads back
// as the target. Returns the note.
inline std::string folded_ranks_out(const whatif::whatif_options& o, const whatif::job_structure& structure, const trace::job& job,
                                    std::vector<int>& ranks, simulated_job& sj) {
  const auto& par = structure.parallel;
  const int tp_from = par.tp.value.value_or(1), dp_from = par.dp.value.value_or(1);
  const int world = par.world.value.value_or(static_cast<int>(job.ranks.size()));
  const int target = tp_from > 0 && dp_from > 0 ? world / tp_from * o.shape.tp.value_or(tp_from) / dp_from * o.dp.value_or(dp_from) : 0;
  int written_ranks = 0;
  for (const int k : ranks) written_ranks = std::max(written_ranks, k + 1);
  if (par.tp.known() && par.dp.known() && target >= written_ranks) {
    sj.groups_from_graph = true;
    sj.world_size = target;
    if (target > static_cast<int>(ranks.size())) {
      return "the written job has " + std::to_string(ranks.size()) + " of its " + std::to_string(target) +
             " ranks (folded: tensor- and data-parallel ranks are symmetric, the traced ones stand for the rest; "
             "their collectives name the target's groups)";
    }
  } else if (target > 0 && target < written_ranks && par.tp.known() && par.dp.known() && par.pp.value.value_or(1) == 1 &&
             o.shape.tp.value_or(tp_from) == tp_from) {
    // Fewer replicas, no stages, TP kept: the target's ranks are the traced ones numbered below
    // it (DP outermost), written; the rest are replicas of them.
    std::erase_if(ranks, [&](int k) { return k >= target; });
    sj.groups_from_graph = true;
    sj.world_size = target;
    return "the target has " + std::to_string(target) + " ranks, fewer than the " + std::to_string(written_ranks) +
           " traced ones: ranks 0-" + std::to_string(target - 1) + " are written (data-parallel replicas are symmetric), their "
           "collectives naming the target's groups";
  } else if (target > 0 && target < written_ranks) {
    return "the target has " + std::to_string(target) + " ranks, fewer than the " + std::to_string(written_ranks) +
           " traced ones written: each keeps its traced number, world size and collective groups";
  }
  return {};
}

}  // namespace detail

/// Writes the prediction of what-if `r` (options `o`) of `job` as Kineto traces under `dir`, one
/// file per rank (`.json.gz` when `gzip`), as `lumos whatif --trace-out` does: after a pipeline
/// split in the graph every rank of every stage, after a folded TP, DP or HSDP change the traced
/// ranks (those of the target's world, when DP shrinks) with the target's groups and world (the
/// note says how they stand for the rest). `lumos replay` reads the files back and replays them to
/// the same prediction. Preconditions: `job` holds
/// every traced rank (not folded), `r` has no pass-level pipeline model
/// (`cli::require_writable`).
inline written_traces write_whatif_traces(const whatif::whatif_options& o, const whatif::whatif_result& r, const trace::job& job,
                                          const std::filesystem::path& dir, bool gzip = false) {
  written_traces out;
  trace_decorations transfers;
  simulated_job sj = simulated_from(r.predicted, job);
  std::vector<int> ranks = rank_numbers(job);
  if (r.stages) {
    detail::stage_ranks_out(*r.stages, r.predicted, sj, ranks, transfers);
  } else if ((o.dp || o.shape.tp || o.hsdp) && r.structure) {
    out.folded_note = detail::folded_ranks_out(o, *r.structure, job, ranks, sj);
  }
  if (!r.written_args.empty()) sj.edits = &r.written_args;
  out.files = write_kineto(sj, ranks, dir, gzip);
  return out;
}

/// The HTML page of what-if `r` of `job` (`lumos whatif --report`): the prediction, the
/// baseline beside it, the changes first (each its headline and sentence). `inputs`: the paths
/// the page names.
[[nodiscard]] inline std::string whatif_html(const trace::job& job, const whatif::whatif_result& r, const std::vector<std::string>& inputs,
                                             std::string title = "lumos whatif") {
  html_options ho;
  ho.title = std::move(title);
  ho.inputs = inputs;
  for (const auto& c : r.changes) ho.changes.emplace_back(c.headline(), c.text);
  ho.why = r.why.text;
  return html_report(job, r.predicted, ho, &r.baseline);
}

}  // namespace lumos::report

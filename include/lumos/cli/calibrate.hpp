#pragma once
// `lumos calibrate`'s inputs (lumos/cli/args.hpp): the trace files or directories of one run and
// `--rank N`, loaded and fitted into a cost profile. `lumos calibrate` and the Python package's
// `lumos.calibrate` read them here. Loads traces: an I/O header (lumos::lumos).

#include <lumos/cli/args.hpp>
#include <lumos/core/error.hpp>
#include <lumos/model/calibrate.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/model_fit.hpp>

#include <charconv>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace lumos::cli {

/// Loads `inputs` (all ranks, or only rank `only`, the text of `--rank`) and fits the cost
/// profile, as `lumos calibrate` does: the per-kernel fit from the chosen rank, the host and
/// optimizer times from the model of the traced configuration.
inline model::calibration calibrate_inputs(const std::vector<std::string>& inputs, const std::optional<std::string>& only) {
  if (inputs.empty()) throw usage_error("calibrate needs at least one trace directory or file");
  std::vector<std::filesystem::path> paths(inputs.begin(), inputs.end());
  trace::job job = trace::load_job(paths);
  std::string source;
  for (const auto& p : inputs) source += (source.empty() ? "" : " ") + std::filesystem::path(p).filename().string();
  // The per-kernel fit reads the chosen rank alone; the configuration (TP, stages) needs them all.
  std::vector<trace::rank_trace> kept;
  std::size_t index = 0;
  if (only) {
    int r = -1;
    const auto [end, ec] = std::from_chars(only->data(), only->data() + only->size(), r);
    if (ec != std::errc{} || end != only->data() + only->size() || r < 0) {
      throw lumos::error("--rank must be a non-negative integer, got '" + *only + "'");
    }
    for (std::size_t i = 0; i < job.ranks.size(); ++i) {
      if (job.ranks[i].rank == r && kept.empty()) kept.push_back(job.ranks[i]), index = i;
    }
    if (kept.empty()) throw lumos::error("--rank " + *only + ": no such rank in the traces");
    source += " rank " + *only;
  }
  model::calibration c = model::calibrate(only ? kept : job.ranks, source);
  const whatif::model_fit fit = whatif::fit_to_traced_configuration(c, job, source, index);
  c.notes.insert(c.notes.end(), fit.notes.begin(), fit.notes.end());
  return c;
}

}  // namespace lumos::cli

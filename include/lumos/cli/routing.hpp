#pragma once
// `lumos predict --routing {balanced,measured} --routing-from PATH`: the routing of a MoE
// prediction. Balanced (the default) gives every expert the same share of the token copies;
// measured reads the per-expert token counts of a MoE trace (structure discovery's
// `moe.expert_tokens`), maps them onto the target's experts and EP ranks
// (`model::expert_load_imbalance`), and lets the busiest EP rank set the pace
// (`model::moe_spec::load_imbalance`). Shared by the CLI and the Python module.

#include <lumos/cli/args.hpp>
#include <lumos/cli/predict.hpp>
#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lumos::cli {

/// Where a measured routing came from, for the report: the trace, what structure discovery read
/// the counts from, the counts, and the busiest EP rank's load over the mean it gives.
struct measured_routing {
  std::string path;
  std::string source;
  std::vector<std::int64_t> expert_tokens;
  double load_imbalance = 1;
};

/// The per-expert token counts of the MoE traces at `path` (a file or a directory of rank
/// files) and the imbalance they give the MoE model `m` under `par`. Throws `lumos::error` when
/// the traces have no MoE layer, record no per-expert counts (only the split sizes one rank
/// received from each EP peer, which do not give the other ranks' loads), or the counts do not
/// map onto m's experts (`model::expert_load_imbalance`).
[[nodiscard]] inline measured_routing read_measured_routing(const std::string& path, const model::transformer& m,
                                                            const model::parallel_config& par) {
  const trace::job job = trace::load_job({std::filesystem::path(path)});
  const graph::built_job built = graph::build_graph(job);
  const whatif::job_structure st = whatif::discover_structure(job, built, {});
  const auto& tokens = st.moe.expert_tokens;
  if (!st.moe.found()) throw error("--routing-from " + path + ": no MoE layer in the traces (" + st.moe.layers.source + ")");
  if (!tokens.known()) throw error("--routing-from " + path + ": no per-expert token counts (" + tokens.source + ")");
  if (st.moe.expert_tokens_per != "expert") {
    throw error("--routing-from " + path + ": the traces record only the tokens one rank received from each EP peer (" + tokens.source +
                "), not each expert's load");
  }
  measured_routing r{.path = path, .source = tokens.source, .expert_tokens = *tokens.value};
  r.load_imbalance = model::expert_load_imbalance(r.expert_tokens, m.moe.experts, par.ep);
  return r;
}

/// Reads `--routing {balanced,measured}` and `--routing-from PATH` into `req` (measured sets
/// `req.job.model.moe.load_imbalance`). Returns the measured routing, or an empty path when
/// routing is balanced. Throws `lumos::error` for a bad value, measured without a path or a path
/// without measured, measured routing of a dense model, and the errors of
/// `read_measured_routing`.
inline measured_routing parse_routing(args& a, predict_request& req) {
  const auto routing = a.option("--routing");
  const auto from = a.option("--routing-from");
  if (routing && *routing != "balanced" && *routing != "measured") {
    throw error("--routing must be balanced or measured, got '" + *routing + "'");
  }
  const bool measured = routing && *routing == "measured";
  if (measured && !from) throw error("--routing measured needs --routing-from PATH (a MoE trace: a file or a directory of rank files)");
  if (!measured && from) throw error("--routing-from needs --routing measured");
  if (!measured) return {};
  model::transformer& m = req.job.model;
  if (!m.is_moe()) throw error("--routing measured needs a mixture-of-experts model");
  measured_routing r = read_measured_routing(*from, m, req.job.parallel);
  m.moe.load_imbalance = r.load_imbalance;
  return r;
}

}  // namespace lumos::cli

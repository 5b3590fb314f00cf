#pragma once
// Structure discovery: what a job's traces say about its iteration, phases, micro-batches,
// pipeline stages and schedule, transformer layers, process groups and model shape — each fact
// with what it was inferred from, or unknown with the flag that supplies it. The rules are in
// docs/whatif.md, section "Structure discovery"; each facet is a header of whatif/structure/.

#include <lumos/graph/build_options.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/context_parallel.hpp>
#include <lumos/whatif/structure/fsdp.hpp>
#include <lumos/whatif/structure/gradients.hpp>
#include <lumos/whatif/structure/groups.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/iteration.hpp>
#include <lumos/whatif/structure/layers.hpp>
#include <lumos/whatif/structure/layout.hpp>
#include <lumos/whatif/structure/memory_recipe.hpp>
#include <lumos/whatif/structure/model_shape.hpp>
#include <lumos/whatif/structure/moe.hpp>
#include <lumos/whatif/structure/overrides.hpp>
#include <lumos/whatif/structure/passes.hpp>
#include <lumos/whatif/structure/phases.hpp>
#include <lumos/whatif/structure/schedule.hpp>
#include <lumos/whatif/structure/stages.hpp>
#include <lumos/whatif/structure/tasks.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>

namespace lumos::whatif {

/// Discovers the structure of `job` from its traces and the graph built from them (`built`
/// must come from `graph::build_graph(job)`: task ids in the result index its graph).
/// Throws `lumos::error` only for inconsistent input (a graph of another job, a step a rank
/// lacks); everything the traces do not say is reported as unknown with its flag. Linear in
/// events, plus O(ops per pass × max_period) for periodicity.
///
/// The facets run in this order, each reading what the ones before it found: the launches of
/// each rank's iteration (built once), iteration, phases, passes, layers, stages, layout (world
/// and PP), schedule, process groups, context parallelism, FSDP, TP/DP/EP, gradient reduction, model
/// shape, memory recipe, layer task groups, GPU op contexts, all-to-alls, MoE layers; the user's
/// facts last.
[[nodiscard]] inline job_structure discover_structure(const trace::job& job, const graph::built_job& built,
                                                      const structure_options& options = {}) {
  discovery_inputs in = make_discovery_inputs(job, built, options);
  job_structure out;
  discover_iteration(in, out);
  discover_phases(in, out);
  discover_passes(in, out);
  discover_layers(in, out);
  discover_stages(in, out);
  discover_layout(in, out);
  discover_schedule(in, out);
  discover_groups(in, out);
  discover_context_parallel(in, out);
  discover_fsdp(in, out);  // labels the shard group DP before the degrees are read off the roles
  discover_parallel_degrees(in, out);
  discover_gradients(in, out);
  discover_model_shape(in, out);
  discover_memory_recipe(in, out);
  discover_layer_tasks(in, out);
  discover_gpu_ops(in, out);
  discover_all_to_alls(in, out);
  discover_moe(in, out);
  apply_overrides(options, out);
  const bool world_recorded = std::any_of(job.ranks.begin(), job.ranks.end(), [](const trace::rank_trace& r) { return r.world_size.has_value(); });
  check_given_degrees(options, out, world_recorded);
  return out;
}

}  // namespace lumos::whatif

#pragma once
// Declarations of lumos's main public types, for headers that only name them (pointers,
// references, function declarations). Include the defining header (or lumos/lumos.hpp) to use one.
// Aliases and class templates with default arguments (sim::replay, graph::trace_graph_builder)
// cannot be declared twice with their defaults, so they are not here.

namespace lumos {

class error;

namespace trace {
struct event;
struct rank_trace;
struct job;            // trace/data.hpp
struct read_options;   // trace/reader.hpp
struct load_options;   // trace/job.hpp
class reader_workspace;
}  // namespace trace

namespace graph {
struct task_graph;
struct collective_instance;
struct compiled_graph;
struct build_options;  // graph/build_options.hpp
struct build_stats;
struct rank_map;
struct built_job;
}  // namespace graph

namespace report {
struct task_times;
struct iteration_plan;
struct breakdown;
struct replay_options;  // report/replay_report.hpp
struct replay_session;
struct simulated_job;   // report/trace_writer.hpp
struct html_options;    // report/html.hpp
}  // namespace report

namespace model {
struct hardware;
struct transformer;
struct parallel_config;
}  // namespace model

namespace synth {
struct job;      // synth/job.hpp
struct program;
}  // namespace synth

namespace whatif {
struct whatif_options;      // whatif/options.hpp
struct whatif_result;       // whatif/result.hpp
struct job_structure;       // whatif/structure/types.hpp
struct structure_options;
struct discovery_inputs;    // whatif/structure/inputs.hpp
struct change;              // whatif/change.hpp
class context;              // whatif/context.hpp
struct stage_split_target;  // whatif/stage_geometry.hpp
struct stage_geometry;
struct stage_plan;          // whatif/stage_plan.hpp
struct stage_split;         // whatif/stage_split.hpp
}  // namespace whatif

}  // namespace lumos

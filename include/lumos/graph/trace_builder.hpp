#pragma once
// Builds the execution graph of a whole job from its Kineto traces: tasks on CPU threads and
// GPU streams, every dependency kind of docs/replay.md ("The graph"), and collectives joined across
// ranks. The rules are documented in docs/replay.md; the numbers that tune them are in
// `build_options`.
//
// The options and results are in graph/build_options.hpp, the builder's class in
// graph/detail/builder.hpp, and its passes in graph/detail/, one dependency kind per header.

#include <lumos/graph/build_options.hpp>
#include <lumos/graph/detail/builder.hpp>
#include <lumos/graph/detail/indexing.hpp>
#include <lumos/graph/detail/collectives.hpp>
#include <lumos/graph/detail/rank.hpp>
#include <lumos/graph/detail/sync.hpp>
#include <lumos/graph/detail/thread.hpp>
#include <lumos/graph/detail/cross_stream.hpp>
#include <lumos/graph/detail/stream.hpp>
#include <lumos/graph/detail/handoff.hpp>
#include <lumos/trace/data.hpp>

namespace lumos::graph {

/// Builds the execution graph of `job` with the default communication classifier.
[[nodiscard]] inline built_job build_graph(const trace::job& job, const build_options& options = {}) {
  return trace_graph_builder<>(job, options).build();
}

}  // namespace lumos::graph

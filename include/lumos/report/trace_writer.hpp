#pragma once
// Writes a simulated job as Kineto-style JSON, one file per rank, that Perfetto opens and that
// `lumos inspect` / `lumos replay` read back. Replaying a written trace reproduces the replay
// that wrote it (tests/graph/test_trace_roundtrip.cpp).
// Writing the files (and gzip) is report/trace_files.hpp, outside lumos::core.
//
// Tasks that came from a trace keep their original names, categories and args; CPU events that
// are not tasks (operators, annotations) are placed by a piecewise-linear map of their thread's
// time from the measured to the simulated timeline. Tasks built from a model (no source event)
// are written as runtime calls and kernels, with correlation ids from their launch edges and
// collective args from their `collective_instance`. The ranks a pipeline what-if added are
// written from the traced rank each copies (`simulated_job::aliases`), each rank with only the
// events its stage kept (`simulated_job::subset`).

#include <lumos/report/detail/kineto_events.hpp>
#include <lumos/report/detail/kineto_rank.hpp>
#include <lumos/report/detail/kineto_tasks.hpp>
#include <lumos/report/simulated_job.hpp>

#include <string>

namespace lumos::report {

/// Serialises rank `rank` (a rank number) of a simulated job as a Kineto trace into `out`
/// (cleared first: a writer of many ranks reuses one buffer); `index` holds the rank (see
/// `index_ranks`). O(the rank's tasks, edges and events · log).
inline void kineto_json(std::string& out, const simulated_job& job, int rank, const rank_index& index) {
  detail::kineto_rank r(out, job, rank, index);
  r.header();
  detail::kineto_task_writer tasks(r);
  tasks.number_calls();
  tasks.write();
  if (r.src != nullptr) {
    detail::kineto_cpu_events(r).write();
  } else {
    detail::write_model_step(r);
  }
  r.w.end_array();
  r.w.end_object();
  out += '\n';
}

/// The same, returned.
[[nodiscard]] inline std::string kineto_json(const simulated_job& job, int rank, const rank_index& index) {
  std::string out;
  kineto_json(out, job, rank, index);
  return out;
}

/// Serialises one rank (indexes the graph for it: to write many ranks, index them once with
/// `index_ranks` and use the overload above).
[[nodiscard]] inline std::string kineto_json(const simulated_job& job, int rank) {
  return kineto_json(job, rank, index_ranks(*job.graph, {rank}));
}

}  // namespace lumos::report

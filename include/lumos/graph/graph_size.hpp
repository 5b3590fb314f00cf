#pragma once
// The size of a graph before it is built: whether a task id numbers its tasks and this machine's
// memory holds it and its replay. What-if rewrites (whatif/editor.hpp) and the program builder
// (synth/) check it, so that an absurd request is an error instead of a process the system kills.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>

#include <cstdio>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace lumos::graph {

/// Memory a graph of `tasks` tasks and `edges` edges takes at its peak: its columns (57 bytes a
/// task, 16 an edge; up to twice that while they grow), the compiled graph (32 and 8; 40 and 8
/// when the bound was measured), the replay's times and the reports' copies of them. Measured:
/// `/usr/bin/time lumos whatif A --layers 3200` (configuration A of docs/whatif.md; a graph of
/// 7.79 million tasks and 4.41 million edges) peaks at 1.22 GB, 157 bytes a task; this bound
/// takes 192 and 32 an edge.
[[nodiscard]] constexpr double graph_replay_bytes(double tasks, double edges) noexcept {
  return tasks * 192.0 + edges * 32.0;
}

/// Physical memory of this machine in bytes (0 when unknown).
[[nodiscard]] inline double physical_memory_bytes() noexcept {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
#else
  return 0.0;
#endif
}

/// Throws `lumos::error` when a graph of `tasks` tasks and `edges` edges (`what` names it:
/// "whatif: the rewritten graph") cannot be built: more tasks than a task id numbers, or more
/// memory than this machine has (a `--layers 100000000` what-if, or synth of 65536 layers, would
/// otherwise grow until the system kills it).
inline void check_graph_size(double tasks, double edges, const std::string& what) {
  const double limit = static_cast<double>(no_task) - 1.0;
  if (tasks > limit) {
    char line[160];
    std::snprintf(line, sizeof line, " would hold %.3g tasks, more than a graph numbers (%.0f)", tasks, limit);
    throw error(what + line);
  }
  const double need = graph_replay_bytes(tasks, edges), have = physical_memory_bytes();
  if (have > 0 && need > have) {
    char line[256];
    std::snprintf(line, sizeof line,
                  " would hold %.3g tasks and %.3g edges, about %.1f GiB to build and replay, more than "
                  "this machine's %.1f GiB of memory",
                  tasks, edges, need / 1073741824.0, have / 1073741824.0);
    throw error(what + line);
  }
}
}  // namespace lumos::graph

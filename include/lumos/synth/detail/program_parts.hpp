#pragma once
// The program builder's parts that are not the builder: a pass's items and their totals (what
// the `pass` granularity folds), gradient segments, group placement and per-group state.

#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/synth/job.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::synth {

namespace detail {

/// Which pass of a chunk an emission stands for: forward, split input gradient, split weight
/// gradient, or the whole backward of schedules that do not split it.
enum class pass_kind : std::uint8_t { forward, input_grad, weight_grad, backward };

[[nodiscard]] constexpr std::string_view collective_kind_name(model::collective c) noexcept {
  switch (c) {
    case model::collective::all_reduce: return "allreduce";
    case model::collective::all_gather: return "allgather";
    case model::collective::reduce_scatter: return "reduce_scatter";
    case model::collective::all_to_all: return "alltoall";
    case model::collective::broadcast: return "broadcast";
  }
  return "?";
}

/// One step of a pass on the compute stream: a compute op or a TP collective.
struct item {
  bool comm = false;
  time_ns duration = 0;
  time_ns cpu = 0;  ///< host time before it is queued (dispatch + launch)
  string_id name = 0;
  std::int32_t kernels = 1;
  model::collective kind = model::collective::all_reduce;
  std::int64_t bytes = 0;
  std::int64_t element_bytes = 2;  ///< collectives: bytes per element
  std::uint32_t op = program_notes::none;  ///< compute: index into `program_notes::ops`
  bool recompute = false;
};

/// A span of a pass after which weight gradients of `params` parameters are final (a layer,
/// the head, the embedding).
struct segment {
  const std::vector<item>* items = nullptr;
  std::int64_t params = 0;
};

/// Totals of a run of items, for the `pass` granularity.
/// `cpu` and `lead` make a run of items exact as one task when the launching thread starts the
/// run at time c and the stream is free at g: item i is queued at c + C_i (C_i: host time up to
/// and including item i) and the kernel-level stream finishes at
///   max(g + G, c + max_i (C_i + G_i..n)) = max(g + G, c + lead + G),  lead = max_i (C_i - G_<i),
/// with G the run's GPU time and G_<i the GPU time before item i (max-plus algebra: per-item
/// launch edges and a FIFO stream). So the folded task gets a launch edge of `lead`.
struct totals {
  time_ns compute = 0;
  std::int32_t compute_kernels = 0;
  time_ns comm = 0;
  std::int32_t comm_kernels = 0;
  std::int64_t comm_bytes = 0;
  time_ns cpu = 0;
  time_ns lead = std::numeric_limits<time_ns>::min();

  void add(const std::vector<item>& items, std::int64_t times = 1) {
    for (std::int64_t r = 0; r < times; ++r) {
      for (const item& i : items) {
        cpu += i.cpu;
        lead = std::max(lead, cpu - compute - comm);
        if (i.comm) {
          comm += i.duration;
          comm_kernels += i.kernels;
          comm_bytes += i.bytes;
        } else {
          compute += i.duration;
          compute_kernels += i.kernels;
        }
      }
    }
  }
};

using model::placement_of;

/// A process group of the job, created when first used.
struct group_state {
  bool ready = false;
  std::int64_t id = 0;  ///< dense id (program_builder::group): the owner of its barrier
  comm_group type = comm_group::tp;
  std::string name;
  std::vector<int> ranks;  ///< global ranks of all members
  int participants = 1;    ///< members present in the graph
  model::group_placement placement;
  graph::processor_id barrier = no_processor;
  std::vector<graph::task_id> joins;       ///< by sequence (participants > 1)
  std::vector<std::uint32_t> instances;    ///< by sequence (when recording)
};

}  // namespace detail

}  // namespace lumos::synth

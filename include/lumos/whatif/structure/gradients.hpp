#pragma once
// Structure facet: how data-parallel gradients are reduced — the method, the buckets and their
// sizes, from the gradient reductions the groups facet kept.

#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lumos::whatif {

/// Fills `out.gradients` from the gradient reductions of the lowest rank that has any: the
/// method (all-reduce, reduce-scatter, with all-gather), the buckets (collectives per
/// iteration, all-gathers not counted) and their sizes in elements when every one is recorded.
/// Runs after `discover_groups`. Linear in that rank's reductions.
inline void discover_gradients(const discovery_inputs& in, job_structure& out) {
  auto& gr = out.gradients;
  gr.method.flag = gr.buckets.flag = gr.bucket_elements.flag = "";
  if (in.gradient_ops.empty()) {
    gr.method.source = gr.buckets.source = gr.bucket_elements.source = "no all-reduce or reduce-scatter in the backward/optimizer phase";
    return;
  }
  const auto& [r, ops] = *in.gradient_ops.begin();
  bool ar = false, rsc = false, ag = false;
  for (const auto& o : ops) ar |= o.kind == "allreduce", rsc |= o.kind == "reducescatter", ag |= o.kind == "allgather";
  gr.method.value = rsc ? (ag ? "reduce-scatter + all-gather" : "reduce-scatter") : "all-reduce";
  if (ar && rsc) gr.method.value = "all-reduce and reduce-scatter";
  gr.method.source = "collectives in the backward/optimizer phase of rank " + std::to_string(r);
  int n = 0;
  std::vector<std::int64_t> sizes;
  bool all_sizes = true;
  for (const auto& o : ops) {
    if (o.kind == "allgather") continue;
    ++n;
    sizes.push_back(o.elements);
    all_sizes = all_sizes && o.elements > 0;
  }
  gr.buckets.value = n;
  gr.buckets.source = gr.method.source;
  if (all_sizes) {
    gr.bucket_elements.value = sizes;
    gr.bucket_elements.source = "In msg nelems / Input Dims of the collectives";
  } else {
    gr.bucket_elements.source = "the trace records no message size for these collectives";
  }
}

}  // namespace lumos::whatif

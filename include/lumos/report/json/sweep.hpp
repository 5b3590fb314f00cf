#pragma once
// A finished sweep as JSON: the object `lumos sweep --json` prints and the Python package's
// `lumos.sweep(...).to_dict()` holds. Depends only on the problem and the ordered results, so
// it is the same for any thread count and any number of MPI processes.

#include <lumos/core/json_writer.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/sweep/evaluate.hpp>
#include <lumos/sweep/sweep.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::report {

/// One configuration of a sweep (`index` in the results) with its prediction or rejection.
inline void sweep_result_json(json_writer& w, std::size_t index, const sweep::result& r) {
  const sweep::configuration& c = r.config;
  w.begin_object();
  w.field("index", static_cast<std::int64_t>(index));
  w.field("tp", c.tp).field("pp", c.pp).field("dp", c.dp).field("vp", c.vp);
  if (c.ep != 1) w.field("ep", c.ep);  // expert parallelism (MoE); absent: 1
  if (c.cp != 1) w.field("cp", c.cp);  // context parallelism; absent: 1
  w.field("micro_batch", c.micro_batch).field("schedule", std::string(c.schedule.name));
  w.field("recompute", std::string(model::to_string(c.recompute))).field("sp", c.sp).field("fsdp", c.fsdp);
  w.field("precision", model::to_string(c.dtype));
  w.field("status", r.ok() ? "ok" : "rejected").field("reason", std::string(sweep::to_string(r.reason)));
  if (!r.ok()) w.field("message", std::string(r.why()));
  if (r.micro_batches > 0) w.field("micro_batches", r.micro_batches);
  if (r.memory_bytes > 0) w.field("memory_bytes_per_gpu", r.memory_bytes).field("memory_stage", r.memory_stage);
  if (r.predicted) {
    w.field("iteration_ns", r.m.iteration_ns).field("mfu", r.m.mfu).field("hfu", r.m.hfu);
    w.field("tokens_per_s", r.m.tokens_per_s).field("tflops_per_gpu", r.m.model_tflops_per_gpu);
    w.field("bubble_fraction", r.m.bubble_fraction).field("pipeline_ns", r.m.pipeline_ns);
    w.key("breakdown").begin_object();
    w.field("window_ns", r.m.breakdown_window_ns).field("exposed_compute_ns", r.m.breakdown.exposed_compute);
    w.field("overlapped_ns", r.m.breakdown.overlapped).field("exposed_comm_ns", r.m.breakdown.exposed_comm);
    w.field("other_ns", r.m.breakdown.other);
    w.end_object();
  }
  w.end_object();
}

/// The sweep of problem `p` as one JSON object: the problem (`profile_name`: its cost model's;
/// `precision`: the results' precisions, comma-separated as `--precision` lists them),
/// the counts of configurations, accepted and rejected per reason, the indices of the `top`
/// fastest, and every result in order. O(results).
inline void sweep_json(json_writer& w, const sweep::problem& p, std::string_view profile_name, const std::vector<sweep::result>& rs,
                       std::size_t top) {
  const auto counts = sweep::count_reasons(rs);
  const auto best = sweep::top(rs, top);
  w.begin_object();
  w.key("problem").begin_object();
  w.field("model", p.model.name).field("layers", p.model.layers).field("hidden", p.model.hidden);
  w.field("heads", p.model.heads).field("seq", p.model.seq).field("vocab", p.model.vocab);
  w.field("gpu", p.hardware.name).field("gpus", p.gpus).field("precision", sweep::precision_names(sweep::precisions(rs), ","));
  w.field("global_batch", p.global_batch).field("memory_margin", p.memory_margin).field("profile", profile_name);
  w.field("hbm_bytes", static_cast<std::int64_t>(p.hardware.gpu.hbm_capacity));
  w.field("tp_comm_overlap", p.tp_comm_overlap).field("overlap_param_gather", p.overlap_param_gather);
  w.field("zero_stage", p.zero_stage);  // of the configurations without FSDP
  w.field("hsdp", p.hsdp).field("reshard_after_forward", p.reshard_after_forward);
  w.end_object();
  w.field("configurations", static_cast<std::int64_t>(rs.size()));
  w.field("accepted", static_cast<std::int64_t>(counts[0]));
  w.key("rejected").begin_object();
  for (std::size_t k = 1; k < counts.size(); ++k) {
    w.field(sweep::to_string(sweep::all_rejections[k]), static_cast<std::int64_t>(counts[k]));
  }
  w.end_object();
  w.key("top").begin_array();
  for (const std::size_t i : best) w.value(static_cast<std::int64_t>(i));
  w.end_array();
  w.key("results").begin_array();
  for (std::size_t i = 0; i < rs.size(); ++i) sweep_result_json(w, i, rs[i]);
  w.end_array();
  w.end_object();
}

/// The same, appended to `out` as one line (ending in a newline).
inline void sweep_json(const sweep::problem& p, std::string_view profile_name, const std::vector<sweep::result>& rs, std::size_t top,
                       std::string& out) {
  json_writer w(out);
  sweep_json(w, p, profile_name, rs, top);
  out += '\n';
}

}  // namespace lumos::report

#pragma once
// What `lumos inspect --json` prints (and the Python package's `Job.inspect()` holds): per rank
// its file, event counts, streams, threads, device, world size and profiler steps; and, with
// `--structure`, the job's structure as discovered (whatif/structure.hpp), each fact with its
// source. `lumos whatif --json` embeds the structure too.

#include <lumos/core/json_writer.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/summary.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lumos::report {

/// Every rank of `job` summarised (trace::summarize), as one JSON object.
inline void inspect_json(json_writer& w, const trace::job& job) {
  w.begin_object().key("ranks").begin_array();
  for (const auto& r : job.ranks) {
    const auto s = trace::summarize(r);
    w.begin_object();
    w.field("rank", r.rank).field("file", r.file).field("events", r.entries);
    w.key("by_category").begin_object();
    for (const auto& [cat, n] : s.by_category) w.field(cat, n);
    w.end_object();
    w.field("gpu_ops", s.gpu_ops).field("comm_ops", s.comm_ops).field("streams", s.streams);
    w.field("threads", s.threads).field("device", s.device);
    w.key("world_size");
    if (r.world_size) {
      w.value(*r.world_size);
    } else {
      w.null();
    }
    w.field("rank_from", trace::to_string(r.origin));
    w.field("base_time_ns", r.base_ns);
    w.key("steps").begin_array();
    for (const auto& st : s.steps) {
      w.begin_object().field("name", st.name).field("start_ns", r.base_ns + st.start).field("dur_ns", st.dur).end_object();
    }
    w.end_array();
    if (s.memory) {
      // The profiler's memory events (profile_memory=True): the measured peak and when it was reached.
      w.key("measured_memory").begin_object().field("peak_allocated_bytes", s.memory->allocated)
          .field("peak_reserved_bytes", s.memory->reserved).field("peak_at_ns", r.base_ns + s.memory->at)
          .field("device", s.memory->device).field("events", s.memory->events).end_object();
    }
    w.field("unknown_phase_entries", r.skipped_entries);
    w.end_object();
  }
  w.end_array().end_object();
}

/// The same, appended to `out` as one line (ending in a newline).
inline void inspect_json(const trace::job& job, std::string& out) {
  json_writer w(out);
  inspect_json(w, job);
  out += '\n';
}

/// One discovered fact: `{"value": V or null, "source": TEXT}`, with the flag that supplies it
/// when it is unknown.
template <class T>
void structure_fact_json(json_writer& w, std::string_view name, const whatif::fact<T>& f) {
  w.key(name).begin_object().key("value");
  if (!f.value) {
    w.null();
  } else if constexpr (std::is_same_v<T, synth::schedule_policy>) {
    w.value(f.value->name);
  } else if constexpr (std::is_same_v<T, whatif::group_role>) {
    w.value(whatif::to_string(*f.value));
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    w.begin_array();
    for (const auto v : *f.value) w.value(v);
    w.end_array();
  } else {
    w.value(*f.value);
  }
  w.field("source", f.source);
  if (!f.value && !f.flag.empty()) w.field("flag", f.flag);
  w.end_object();
}

/// How a structure's passes and layer groups name their op: "F3", or "F3.1" with chunks.
[[nodiscard]] inline bool structure_shows_chunks(const whatif::job_structure& st) { return st.parallel.chunks.value.value_or(1) > 1; }

namespace detail {

inline void structure_parallel_json(json_writer& w, const whatif::job_structure& st) {
  w.key("parallel").begin_object();
  structure_fact_json(w, "world", st.parallel.world);
  structure_fact_json(w, "tp", st.parallel.tp);
  structure_fact_json(w, "pp", st.parallel.pp);
  structure_fact_json(w, "dp", st.parallel.dp);
  structure_fact_json(w, "ep", st.parallel.ep);
  structure_fact_json(w, "schedule", st.parallel.schedule);
  structure_fact_json(w, "chunks", st.parallel.chunks);
  structure_fact_json(w, "micro_batches", st.parallel.micro_batches);
  w.end_object();
  w.key("model").begin_object();
  structure_fact_json(w, "layers", st.model.layers);
  structure_fact_json(w, "hidden", st.model.hidden);
  structure_fact_json(w, "ffn", st.model.ffn);
  structure_fact_json(w, "mlp", st.model.mlp);
  structure_fact_json(w, "dropout", st.model.dropout);
  structure_fact_json(w, "heads", st.model.heads);
  structure_fact_json(w, "kv_heads", st.model.kv_heads);
  structure_fact_json(w, "head_dim", st.model.head_dim);
  structure_fact_json(w, "seq", st.model.seq);
  structure_fact_json(w, "micro_batch_size", st.model.micro_batch_size);
  structure_fact_json(w, "dtype", st.model.dtype);
  w.end_object();
  structure_fact_json(w, "layers_method", st.layers_method);
  w.key("gradient_reduction").begin_object();
  structure_fact_json(w, "method", st.gradients.method);
  structure_fact_json(w, "buckets", st.gradients.buckets);
  structure_fact_json(w, "bucket_elements", st.gradients.bucket_elements);
  w.end_object();
  w.key("memory_recipe").begin_object();
  structure_fact_json(w, "optimizer", st.memory.optimizer);
  structure_fact_json(w, "states", st.memory.states);
  structure_fact_json(w, "residual", st.memory.residual);
  structure_fact_json(w, "loss", st.memory.loss);
  structure_fact_json(w, "embeddings", st.memory.embeddings);
  w.end_object();
}

inline void structure_groups_json(json_writer& w, const whatif::job_structure& st) {
  w.key("groups").begin_array();
  for (const auto& g : st.groups) {
    w.begin_object().field("name", g.name).field("description", g.description);
    w.key("ranks").begin_array();
    for (const int r : g.ranks) w.value(r);
    w.end_array();
    structure_fact_json(w, "size", g.size);
    w.key("collectives").begin_object();
    for (const auto& [k, n] : g.collectives) w.field(k, n);
    w.end_object();
    w.key("roles").begin_array();
    for (const auto& r : g.roles) w.begin_object().field("role", whatif::to_string(*r.value)).field("source", r.source).end_object();
    w.end_array().end_object();
  }
  w.end_array();
}

inline void structure_ranks_json(json_writer& w, const whatif::job_structure& st) {
  const bool chunks = structure_shows_chunks(st);
  w.key("ranks").begin_array();
  for (const auto& r : st.ranks) {
    w.begin_object().field("rank", r.rank);
    structure_fact_json(w, "iteration", r.iteration);
    w.field("iteration_start_ns", r.iteration_start).field("iteration_end_ns", r.iteration_end);
    w.key("phases").begin_array();
    for (const auto& p : r.phases) {
      w.begin_object().field("phase", whatif::to_string(p.kind)).field("start_ns", p.start).field("end_ns", p.end);
      w.field("gpu_ops", p.gpu_ops).field("source", p.source).end_object();
    }
    w.end_array();
    structure_fact_json(w, "stage", r.stage);
    w.key("p2p_partners").begin_array();
    for (const int p : r.p2p_partners) w.value(p);
    w.end_array();
    structure_fact_json(w, "layers_per_pass", r.layers_per_pass);
    w.key("passes").begin_array();
    for (const auto& p : r.passes) {
      w.begin_object().field("op", pipeline::format_op(p.op, chunks)).field("start_ns", p.start).field("end_ns", p.end);
      w.field("gpu_ops", p.gpu_ops);
      w.key("layers");
      if (p.layers.value) w.value(*p.layers.value); else w.null();
      w.end_object();
    }
    w.end_array().end_object();
  }
  w.end_array();
}

inline void int_list_json(json_writer& w, std::string_view name, const std::vector<std::int64_t>& v) {
  w.key(name).begin_array();
  for (const auto x : v) w.value(x);
  w.end_array();
}

/// `"cp"` (only when a group has the CP role): size, ring exchanges per layer, comm, each a fact
/// with its source, and the CP groups' names.
inline void structure_cp_json(json_writer& w, const whatif::job_structure& st) {
  if (!st.cp.found()) return;
  w.key("cp").begin_object();
  structure_fact_json(w, "size", st.cp.size);
  structure_fact_json(w, "exchanges_per_layer", st.cp.exchanges_per_layer);
  structure_fact_json(w, "comm", st.cp.comm);
  w.key("groups").begin_array();
  for (const auto& g : st.cp.groups) w.value(g);
  w.end_array().end_object();
}

/// `"moe"` (only when a router was found) and `"all_to_alls"` (only when the iteration has any):
/// absent from the structure of a dense model without all-to-alls.
inline void structure_moe_json(json_writer& w, const whatif::job_structure& st) {
  if (st.moe.found()) {
    w.key("moe").begin_object();
    structure_fact_json(w, "layers", st.moe.layers);
    structure_fact_json(w, "experts", st.moe.experts);
    structure_fact_json(w, "experts_per_rank", st.moe.experts_per_rank);
    structure_fact_json(w, "top_k", st.moe.top_k);
    structure_fact_json(w, "ep", st.moe.ep);
    structure_fact_json(w, "expert_tp", st.moe.expert_tp);
    structure_fact_json(w, "expert_tokens", st.moe.expert_tokens);
    w.field("expert_tokens_per", st.moe.expert_tokens_per);
    w.end_object();
  }
  if (st.all_to_alls.empty()) return;
  w.key("all_to_alls").begin_array();
  for (const auto& a : st.all_to_alls) {
    w.begin_object().field("group", a.group).field("phase", whatif::to_string(a.phase));
    w.key("ranks").begin_array();
    for (const int r : a.ranks) w.value(r);
    w.end_array();
    int_list_json(w, "in_elements", a.in_elements);
    int_list_json(w, "out_elements", a.out_elements);
    int_list_json(w, "in_splits", a.in_splits);
    int_list_json(w, "out_splits", a.out_splits);
    w.field("source", a.source).end_object();
  }
  w.end_array();
}

/// `"fsdp"`: sharded data parallelism (FSDP2, ZeRO-3), absent when no group shards parameters.
inline void structure_fsdp_json(json_writer& w, const whatif::job_structure& st) {
  const auto& f = st.fsdp;
  if (!f.found()) return;
  w.key("fsdp").begin_object();
  structure_fact_json(w, "units", f.units);
  structure_fact_json(w, "all_gathers", f.all_gathers);
  structure_fact_json(w, "reduce_scatters", f.reduce_scatters);
  structure_fact_json(w, "shard", f.shard);
  structure_fact_json(w, "hsdp_replicas", f.replicas);
  structure_fact_json(w, "reshard_after_forward", f.reshard_after_forward);
  w.field("group", f.group).field("replica_group", f.replica_group).field("source", f.source);
  w.end_object();
}

}  // namespace detail

/// Whether `structure_json` lists the per-layer task groups (`inspect --structure --groups`).
enum class layer_groups : std::uint8_t { count_only, listed };

/// The discovered structure of a job as one JSON object: parallelism, model shape, gradient
/// reduction, process groups, MoE layers and all-to-alls (when found), per rank its iteration, phases, stage and passes, and notes.
inline void structure_json(json_writer& w, const whatif::job_structure& st, layer_groups groups = layer_groups::count_only) {
  w.begin_object();
  detail::structure_parallel_json(w, st);
  detail::structure_groups_json(w, st);
  detail::structure_moe_json(w, st);
  detail::structure_cp_json(w, st);
  detail::structure_fsdp_json(w, st);
  detail::structure_ranks_json(w, st);
  w.field("layer_task_groups", st.layer_groups.size());
  if (groups == layer_groups::listed) {
    const bool chunks = structure_shows_chunks(st);
    w.key("layer_groups").begin_array();
    for (const auto& lg : st.layer_groups) {
      w.begin_object().field("rank", lg.rank).field("op", pipeline::format_op(lg.op, chunks)).field("layer", lg.layer);
      w.key("tasks").begin_array();
      for (const auto t : lg.tasks) w.value(t);
      w.end_array().end_object();
    }
    w.end_array();
  }
  w.key("notes").begin_array();
  for (const auto& n : st.notes) w.value(n);
  w.end_array();
  w.end_object();
}

/// The same, appended to `out` as one line (ending in a newline).
inline void structure_json(const whatif::job_structure& st, layer_groups groups, std::string& out) {
  json_writer w(out);
  structure_json(w, st, groups);
  out += '\n';
}

}  // namespace lumos::report

#pragma once
// A what-if as JSON: the object `lumos whatif --json` prints — the baseline replay and the
// prediction (iteration, slowest rank's breakdown, bubble, memory, a row per rank), the changes
// as sentences and as records, the model shape, the pipeline, the folding of identical ranks and
// the discovered structure — and its parts.

#include <lumos/core/json_writer.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/json/inspect.hpp>
#include <lumos/report/json/replay.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/whatif_rows.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/whatif/result.hpp>

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::report {

/// One replay of a what-if (`baseline` or `predicted`): the job's iteration and the breakdown
/// of its slowest rank (the one that sets the iteration), the bubble and where it comes from,
/// the memory per GPU when the model shape is known (`figures`), then one row per rank (`rows`,
/// `whatif_rank_rows`).
inline void whatif_session_json(json_writer& w, const replay_session& s, const whatif::shape_figures* figures,
                                const std::optional<double>& bubble, std::string_view bubble_source,
                                const std::vector<std::pair<int, const rank_replay*>>& rows) {
  w.begin_object().field("iteration_ns", s.simulated_ns).field("measured_ns", s.measured_ns).field("unprofiled_ns", s.unprofiled_ns);
  const rank_replay* slowest = nullptr;
  for (const auto& r : s.ranks) {
    if (slowest == nullptr || r.simulated_ns > slowest->simulated_ns) slowest = &r;
  }
  if (slowest != nullptr) {
    w.field("slowest_rank", slowest->rank).key("breakdown");
    breakdown_json(w, slowest->simulated.split);
  }
  if (bubble) {
    w.field("bubble_fraction", *bubble);
  } else {
    w.key("bubble_fraction").null();
  }
  w.field("bubble_source", bubble_source);
  if (figures != nullptr) {
    w.field("memory_bytes_per_gpu", figures->memory_bytes_per_gpu);
  } else {
    w.key("memory_bytes_per_gpu").null();
  }
  w.key("ranks").begin_array();
  for (const auto& [rank, row] : rows) {
    const rank_replay& r = *row;
    w.begin_object().field("rank", rank).field("step", r.step).field("iteration_ns", r.simulated_ns);
    w.key("breakdown");
    breakdown_json(w, r.simulated.split);
    w.field("sm_utilization", r.simulated.sm.mean).end_object();
  }
  w.end_array().end_object();
}

/// The changes as records (whatif/change.hpp): pass, subject, from -> to, figures and the
/// sentence, under `change_records`.
inline void change_records_json(json_writer& w, const std::vector<whatif::change>& changes) {
  w.key("change_records").begin_array();
  for (const auto& c : changes) {
    w.begin_object().field("pass", c.pass).field("subject", c.subject).field("from", c.from).field("to", c.to);
    w.key("figures").begin_array();
    for (const auto& f : c.figures) {
      w.begin_object().field("name", f.name).field("before", f.before).field("after", f.after).field("unit", f.unit).end_object();
    }
    w.end_array().field("text", c.text).end_object();
  }
  w.end_array();
}

/// Why the step moved as it did (whatif/attribution.hpp): `bound_by`, the critical path's
/// `critical_path_shares` of the baseline and the prediction, the GPU's busy times before and
/// after, and the sentence, under `attribution`.
inline void attribution_json(json_writer& w, const whatif::attribution& a) {
  auto shares = [&](const whatif::path_shares& s) {
    const std::array<double, 4> v = {s.cpu, s.gpu_compute, s.communication, s.waits};
    w.begin_object();
    for (std::size_t k = 0; k < v.size(); ++k) w.field(whatif::path_share_names[k], v[k]);
    w.end_object();
  };
  w.field("bound_by", a.bound_by);
  w.key("critical_path_shares").begin_object().key("baseline");
  shares(a.baseline);
  w.key("predicted");
  if (a.predicted) {
    shares(*a.predicted);
  } else {
    w.null();
  }
  w.end_object();
  w.key("attribution").begin_object();
  w.field("gpu_compute_ns_before", a.compute_before).field("gpu_compute_ns_after", a.compute_after);
  w.field("communication_ns_before", a.comm_before).field("communication_ns_after", a.comm_after);
  w.field("text", a.text).end_object();
}

/// The host the prediction assumes: `host_speed` (relative to the traced host), and
/// `host_sensitivity`, the predicted step at other host speeds (null unless the predicted step
/// is mostly host work).
inline void host_json(json_writer& w, const whatif::whatif_result& r) {
  w.field("host_speed", r.host_speed);
  w.key("host_sensitivity");
  if (r.host_sensitivity.empty()) {
    w.null();
    return;
  }
  w.begin_array();
  for (const auto& p : r.host_sensitivity) w.begin_object().field("host_speed", p.host_speed).field("iteration_ns", p.iteration_ns).end_object();
  w.end_array();
}

namespace detail {

/// A MoE configuration's fields (whatif/moe.hpp).
inline void moe_config_fields(json_writer& w, const whatif::moe_config& m) {
  w.field("ep", m.ep).field("experts", m.experts);
  if (m.top_k_known) {
    w.field("top_k", m.top_k);
  } else {
    w.key("top_k").null();  // the traces do not tell it
  }
  w.field("expert_ffn", m.expert_ffn);
}

/// `with_cp`: the context-parallel size too (only where the traces or the target have CP); `moe`:
/// the MoE fields (with a MoE change).
inline void shape_config_json(json_writer& w, const char* key, const whatif::shape_config& c, const whatif::shape_figures& f, double mfu,
                              bool with_cp, const whatif::moe_config* moe = nullptr) {
  w.key(key).begin_object();
  w.field("hidden", c.hidden).field("ffn", c.ffn).field("heads", c.heads).field("head_dim", c.head_dim).field("seq", c.seq);
  w.field("micro_batch_size", c.micro_batch).field("tp", c.tp);
  if (with_cp) w.field("cp", c.cp).field("cp_comm", model::to_string(c.cp_comm));
  w.field("world", f.world);
  if (moe) moe_config_fields(w, *moe);
  w.field("memory_bytes_per_gpu", f.memory_bytes_per_gpu).field("model_flops_per_rank", f.model_flops_per_rank).field("mfu", mfu);
  w.field("vocab_known", f.vocab_known).end_object();
}

inline void pipeline_simulation_json(json_writer& w, const whatif::pipeline_simulation& s) {
  w.begin_object().field("schedule", std::string(s.schedule.name)).field("stages", s.shape.stages);
  w.field("micro_batches", s.shape.micro_batches).field("chunks", s.shape.chunks).field("layers_per_chunk", s.layers_per_chunk);
  w.field("makespan_ns", s.makespan).field("bubble_fraction", s.bubble_fraction).field("p2p_transfers", s.p2p_transfers);
  w.key("stage_busy_ns").begin_array();
  for (const auto& st : s.stages) w.value(st.busy);
  w.end_array().end_object();
}

}  // namespace detail

/// The model shape of the traces and of the target, with memory per GPU, FLOPs and MFU, under
/// `shape` (with `cp` where either has context parallelism); with a MoE change (`moe`) the EP
/// degree, experts, top-k and expert FFN of each.
inline void whatif_shape_json(json_writer& w, const whatif::shape_summary& s, const whatif::moe_summary* moe = nullptr) {
  w.key("shape").begin_object();
  const bool cp = s.from.cp > 1 || s.to.cp > 1;
  detail::shape_config_json(w, "baseline", s.from, s.baseline, s.mfu_baseline, cp, moe ? &moe->from : nullptr);
  detail::shape_config_json(w, "predicted", s.to, s.predicted, s.mfu_predicted, cp, moe ? &moe->to : nullptr);
  w.end_object();
}

/// A MoE change (whatif/moe.hpp) under `moe`: the traced and the target configuration and the routing.
inline void whatif_moe_json(json_writer& w, const whatif::moe_summary& m) {
  w.key("moe").begin_object().key("baseline").begin_object();
  detail::moe_config_fields(w, m.from);
  w.end_object().key("predicted").begin_object();
  detail::moe_config_fields(w, m.to);
  w.end_object().field("routing", m.routing == whatif::moe_routing::balanced ? "balanced" : "measured").end_object();
}

/// A pipeline change predicted by the pass-level model (whatif/pipeline.hpp), under `pipeline`.
inline void whatif_pipeline_json(json_writer& w, const whatif::pipeline_prediction& p) {
  w.key("pipeline").begin_object().field("model", "pass-level").field("iteration_ns", p.iteration_ns);
  w.field("bubble_fraction", p.predicted.bubble_fraction);
  w.key("baseline");
  detail::pipeline_simulation_json(w, p.baseline);
  w.key("predicted");
  detail::pipeline_simulation_json(w, p.predicted);
  w.end_object();
}

/// A pipeline change made in the graph (whatif/pipeline_graph.hpp), under `pipeline`.
inline void stage_split_json(json_writer& w, const whatif::stage_split& s, time_ns iteration, const std::optional<double>& bubble) {
  w.key("pipeline").begin_object().field("model", "graph").field("iteration_ns", iteration);
  if (bubble) {
    w.field("bubble_fraction", *bubble);
  } else {
    w.key("bubble_fraction").null();
  }
  w.field("schedule", std::string(s.schedule.name)).field("stages", s.stages).field("chunks", s.chunks);
  w.field("micro_batches", s.micro_batches).field("ranks_per_stage", s.world).field("p2p_transfers", s.p2p);
  w.field("edges_dropped", s.edges_dropped).field("tasks_before", s.tasks_before).field("tasks_after", s.tasks_after);
  w.end_object();
}

/// Which traced ranks each replayed rank stands for, under `folded`; nothing when no ranks were
/// folded.
inline void folding_json(json_writer& w, const trace::rank_folding& folding) {
  if (!folding.folded()) return;
  w.key("folded").begin_object().field("traced_ranks", folding.traced).field("replayed_ranks", folding.stands_for.size());
  w.key("stands_for").begin_array();
  for (const auto& ranks : folding.stands_for) {
    w.begin_array();
    for (const int r : ranks) w.value(r);
    w.end_array();
  }
  w.end_array().end_object();
}

/// The files a what-if wrote (its traces, its report) and a note on how the written ranks
/// stand for the target's.
struct written_traces {
  std::vector<std::filesystem::path> files;
  std::string folded_note;
};

/// What-if `r` of `job` (replayed with `folding`) as one line of JSON (ending in a newline).
/// `trace_out`: the files written with `--trace-out`, listed under `trace_out`; null when none
/// were asked for.
[[nodiscard]] inline std::string whatif_json(const whatif::whatif_result& r, const trace::job& job, const trace::rank_folding& folding,
                                             const written_traces* trace_out = nullptr) {
  std::string out;
  json_writer w(out);
  w.begin_object();
  folding_json(w, folding);
  w.key("baseline");
  const std::optional<double> base_bubble = r.pipeline ? std::optional<double>(r.pipeline->baseline.bubble_fraction) : std::nullopt;
  whatif_session_json(w, r.baseline, r.shape ? &r.shape->baseline : nullptr, base_bubble,
                      r.pipeline ? "pass-level pipeline model of the traces' configuration" : "see predicted",
                      whatif_rank_rows(r.baseline, folding, job, nullptr));
  w.key("predicted");
  whatif_session_json(w, r.predicted, r.shape ? &r.shape->predicted : nullptr, r.bubble_fraction, r.bubble_source,
                      whatif_rank_rows(r.predicted, folding, job, r.stages ? &*r.stages : nullptr));
  w.field("speedup", r.predicted.simulated_ns > 0 ? static_cast<double>(r.baseline.simulated_ns) / static_cast<double>(r.predicted.simulated_ns) : 0.0);
  w.key("changes").begin_array();
  for (const auto& c : r.changes) w.value(c.text);
  w.end_array();
  change_records_json(w, r.changes);
  attribution_json(w, r.why);
  host_json(w, r);
  if (r.shape) whatif_shape_json(w, *r.shape, r.moe ? &*r.moe : nullptr);
  if (r.moe) whatif_moe_json(w, *r.moe);
  if (r.pipeline) whatif_pipeline_json(w, *r.pipeline);
  if (r.stages) stage_split_json(w, *r.stages, r.predicted.simulated_ns, r.bubble_fraction);
  if (r.structure) {
    std::string st;
    structure_json(*r.structure, layer_groups::count_only, st);
    w.key("structure").raw(st);
  } else {
    w.key("structure").null();
  }
  if (trace_out != nullptr) {
    w.key("trace_out").begin_array();
    for (const auto& f : trace_out->files) w.value(f.string());
    w.end_array();
    if (!trace_out->folded_note.empty()) w.field("trace_out_note", trace_out->folded_note);
  }
  w.end_object();
  out += '\n';
  return out;
}

}  // namespace lumos::report

#pragma once
// lumos inspect PATH... [--json] [--structure [overrides]]

#include "cli.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/summary.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdio>
#include <string>
#include <type_traits>

namespace lumos::cli {

inline constexpr std::string_view inspect_usage =
    "usage: lumos inspect PATH... [--json] [--structure [--step N] [--layers N] [--hidden N] [--ffn N]\n"
    "                     [--heads N] [--seq N] [--micro-batch N] [--tp N] [--pp N] [--dp N] [--vp N]\n"
    "                     [--schedule NAME] [--groups]]\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n"
    "  --structure: iteration, phases, micro-batches, pipeline stages and schedule, layers, process\n"
    "    groups and model shape, each with what it was inferred from; the options supply what the\n"
    "    traces do not say (or override them, with a note). --groups lists the per-layer task groups.\n";

inline void inspect_json(const trace::job& job, std::string& out) {
  json_writer w(out);
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
    w.field("unknown_phase_entries", r.skipped_entries);
    w.end_object();
  }
  w.end_array().end_object();
  out += '\n';
}

inline void inspect_text(const trace::job& job, std::string& out) {
  char line[512];
  for (const auto& r : job.ranks) {
    const auto s = trace::summarize(r);
    std::snprintf(line, sizeof line, "rank %d  %s  (rank from %s)\n", r.rank, r.file.c_str(),
                  std::string(trace::to_string(r.origin)).c_str());
    out += line;
    std::snprintf(line, sizeof line, "  device: %s   world size: %s\n", s.device.empty() ? "-" : s.device.c_str(),
                  r.world_size ? std::to_string(*r.world_size).c_str() : "-");
    out += line;
    std::snprintf(line, sizeof line, "  %llu traceEvents entries; GPU ops %llu (communication %llu) on %llu streams; %llu CPU threads\n",
                  static_cast<unsigned long long>(r.entries), static_cast<unsigned long long>(s.gpu_ops),
                  static_cast<unsigned long long>(s.comm_ops), static_cast<unsigned long long>(s.streams),
                  static_cast<unsigned long long>(s.threads));
    out += line;
    out += "  by category:";
    for (const auto& [cat, n] : s.by_category) {
      out += ' ';
      out += cat;
      out += '=';
      out += std::to_string(n);
    }
    out += '\n';
    if (s.steps.empty()) out += "  no ProfilerStep annotations (the iteration is the whole trace window)\n";
    for (const auto& st : s.steps) {
      std::snprintf(line, sizeof line, "  %-18s start %lld ns  duration %lld ns (%.3f ms)\n", st.name.c_str(),
                    static_cast<long long>(r.base_ns + st.start), static_cast<long long>(st.dur),
                    static_cast<double>(st.dur) / 1e6);
      out += line;
    }
  }
}

template <class T>
void structure_fact_json(json_writer& w, std::string_view name, const whatif::fact<T>& f) {
  w.key(name).begin_object().key("value");
  if (!f.value) {
    w.null();
  } else if constexpr (std::is_same_v<T, pipeline::schedule_kind>) {
    w.value(pipeline::schedule_name(*f.value));
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

inline std::string op_text(const pipeline::op& o, bool chunk) {
  std::string s;
  pipeline::detail::append_op_text(s, o, chunk);
  return s;
}

inline void structure_json(const whatif::job_structure& st, bool with_groups, std::string& out) {
  json_writer w(out);
  w.begin_object();
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
  const bool chunks = st.parallel.chunks.value.value_or(1) > 1;
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
      w.begin_object().field("op", op_text(p.op, chunks)).field("start_ns", p.start).field("end_ns", p.end);
      w.field("gpu_ops", p.gpu_ops);
      w.key("layers");
      if (p.layers.value) w.value(*p.layers.value); else w.null();
      w.end_object();
    }
    w.end_array().end_object();
  }
  w.end_array();
  w.field("layer_task_groups", st.layer_groups.size());
  if (with_groups) {
    w.key("layer_groups").begin_array();
    for (const auto& lg : st.layer_groups) {
      w.begin_object().field("rank", lg.rank).field("op", op_text(lg.op, chunks)).field("layer", lg.layer);
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
  out += '\n';
}

template <class T>
void structure_fact_text(std::string& out, std::string_view name, const whatif::fact<T>& f) {
  out += "  ";
  out += name;
  out += ": ";
  if (!f.value) {
    out += "unknown";
    if (!f.flag.empty()) out += " (supply with " + f.flag + ")";
  } else if constexpr (std::is_same_v<T, pipeline::schedule_kind>) {
    out += pipeline::schedule_title(*f.value);
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    for (std::size_t i = 0; i < f.value->size(); ++i) out += (i ? ", " : "") + std::to_string((*f.value)[i]);
  } else if constexpr (std::is_same_v<T, std::string>) {
    out += *f.value;
  } else {
    out += std::to_string(*f.value);
  }
  out += "    [" + f.source + "]\n";
}

inline void structure_text(const whatif::job_structure& st, bool with_groups, std::string& out) {
  out += "parallelism\n";
  structure_fact_text(out, "world", st.parallel.world);
  structure_fact_text(out, "TP", st.parallel.tp);
  structure_fact_text(out, "PP", st.parallel.pp);
  structure_fact_text(out, "DP", st.parallel.dp);
  structure_fact_text(out, "EP", st.parallel.ep);
  structure_fact_text(out, "schedule", st.parallel.schedule);
  structure_fact_text(out, "chunks per stage", st.parallel.chunks);
  structure_fact_text(out, "micro-batches", st.parallel.micro_batches);
  out += "model\n";
  structure_fact_text(out, "layers", st.model.layers);
  structure_fact_text(out, "layers found by", st.layers_method);
  structure_fact_text(out, "hidden", st.model.hidden);
  structure_fact_text(out, "FFN", st.model.ffn);
  structure_fact_text(out, "MLP", st.model.mlp);
  structure_fact_text(out, "dropout", st.model.dropout);
  structure_fact_text(out, "heads", st.model.heads);
  structure_fact_text(out, "KV heads", st.model.kv_heads);
  structure_fact_text(out, "head dim", st.model.head_dim);
  structure_fact_text(out, "sequence", st.model.seq);
  structure_fact_text(out, "micro-batch size", st.model.micro_batch_size);
  structure_fact_text(out, "dtype", st.model.dtype);
  out += "data-parallel gradient reduction\n";
  structure_fact_text(out, "method", st.gradients.method);
  structure_fact_text(out, "buckets", st.gradients.buckets);
  structure_fact_text(out, "bucket elements", st.gradients.bucket_elements);
  out += "process groups\n";
  for (const auto& g : st.groups) {
    out += "  '" + g.name + "'";
    if (!g.description.empty()) out += " (" + g.description + ")";
    out += " ranks [" + whatif::detail::join_ints(g.ranks) + "] size ";
    out += g.size.value ? std::to_string(*g.size.value) : std::string("unknown");
    out += " [" + g.size.source + "]\n   ";
    for (const auto& [k, n] : g.collectives) out += " " + k + " ×" + std::to_string(n) + ";";
    out += "\n";
    if (g.roles.empty()) out += "    role: unknown\n";
    for (const auto& r : g.roles) out += "    role " + std::string(whatif::to_string(*r.value)) + "    [" + r.source + "]\n";
  }
  const bool chunks = st.parallel.chunks.value.value_or(1) > 1;
  out += "ranks\n";
  for (const auto& r : st.ranks) {
    char line[256];
    std::snprintf(line, sizeof line, "  rank %d: %s  %.3f ms", r.rank, r.iteration.value ? r.iteration.value->c_str() : "-",
                  static_cast<double>(r.iteration_end - r.iteration_start) / 1e6);
    out += line;
    out += "    [" + r.iteration.source + "]\n";
    for (const auto& p : r.phases) {
      std::snprintf(line, sizeof line, "    %-9s %.3f ms, %zu GPU ops", std::string(whatif::to_string(p.kind)).c_str(),
                    static_cast<double>(p.end - p.start) / 1e6, p.gpu_ops);
      out += line;
      out += "    [" + p.source + "]\n";
    }
    out += "  ";
    structure_fact_text(out, "stage", r.stage);
    if (!r.p2p_partners.empty()) out += "    p2p partners: " + whatif::detail::join_ints(r.p2p_partners) + "\n";
    out += "  ";
    structure_fact_text(out, "layers per pass", r.layers_per_pass);
    out += "    passes:";
    for (const auto& p : r.passes) {
      out += " " + op_text(p.op, chunks);
      if (p.layers.value) out += "(" + std::to_string(*p.layers.value) + "L)";
    }
    out += "\n";
  }
  out += "layer task groups: " + std::to_string(st.layer_groups.size()) + "\n";
  if (with_groups) {
    for (const auto& lg : st.layer_groups) {
      out += "  rank " + std::to_string(lg.rank) + " " + op_text(lg.op, chunks) + " layer " + std::to_string(lg.layer) + ": " +
             std::to_string(lg.tasks.size()) + " tasks\n";
    }
  }
  for (const auto& n : st.notes) out += "note: " + n + "\n";
}

inline int run_inspect(args& a) {
  const bool json = a.flag("--json");
  const bool structure = a.flag("--structure");
  const bool with_groups = a.flag("--groups");
  whatif::structure_options so;
  auto num = [&](std::string_view flag, auto& target) {
    if (const auto v = a.option(flag)) {
      if (!structure) throw usage_error(std::string(flag) + " needs --structure");
      using T = typename std::remove_reference_t<decltype(target)>::value_type;
      target = parse_number<T>(*v, flag);
      if (*target <= 0 && flag != "--step") throw usage_error(std::string(flag) + " must be positive");
    }
  };
  num("--step", so.step);
  num("--layers", so.layers);
  num("--hidden", so.hidden);
  num("--ffn", so.ffn);
  num("--heads", so.heads);
  num("--seq", so.seq);
  num("--micro-batch", so.micro_batch_size);
  num("--tp", so.tp);
  num("--pp", so.pp);
  num("--dp", so.dp);
  num("--vp", so.chunks);
  if (const auto s = a.option("--schedule")) {
    if (!structure) throw usage_error("--schedule needs --structure");
    try {
      so.schedule = pipeline::parse_schedule_kind(*s);
    } catch (const lumos::error& e) {
      throw usage_error(e.what());
    }
  }
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("inspect needs at least one PATH");
  trace::load_options opt;
  if (stderr_is_terminal()) {
    opt.on_loaded = [](const trace::rank_trace& r, std::size_t done, std::size_t total) {
      if (total > 1) std::fprintf(stderr, "\rlumos: read %zu/%zu files (%s)\x1b[K", done, total, r.file.c_str());
      if (total > 1 && done == total) std::fprintf(stderr, "\n");
    };
  }
  const trace::job job = trace::load_job(paths(inputs), opt);
  std::string out;
  if (structure) {
    const graph::built_job built = graph::build_graph(job);
    const whatif::job_structure st = whatif::discover_structure(job, built, so);
    if (json) {
      structure_json(st, with_groups, out);
    } else {
      structure_text(st, with_groups, out);
    }
  } else if (json) {
    inspect_json(job, out);
  } else {
    inspect_text(job, out);
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

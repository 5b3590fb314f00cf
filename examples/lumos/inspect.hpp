#pragma once
// lumos inspect PATH... [--json] [--structure [overrides]]

#include "cli.hpp"

#include <lumos/pipeline/format.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/report/json/inspect.hpp>
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
    if (s.memory) {
      std::string in_step;
      for (const auto& st : s.steps) {
        if (s.memory->at >= st.start && s.memory->at < st.start + st.dur) in_step = " (in " + st.name + ")";
      }
      std::snprintf(line, sizeof line, "  memory events: %llu on GPU %d; peak allocated %.3f GiB at %lld ns%s, peak reserved %.3f GiB\n",
                    static_cast<unsigned long long>(s.memory->events), s.memory->device, static_cast<double>(s.memory->allocated) / 1073741824.0,
                    static_cast<long long>(r.base_ns + s.memory->at), in_step.c_str(), static_cast<double>(s.memory->reserved) / 1073741824.0);
      out += line;
    }
  }
}

template <class T>
void structure_fact_text(std::string& out, std::string_view name, const whatif::fact<T>& f) {
  out += "  ";
  out += name;
  out += ": ";
  if (!f.value) {
    out += "unknown";
    if (!f.flag.empty()) out += " (supply with " + f.flag + ")";
  } else if constexpr (std::is_same_v<T, synth::schedule_policy>) {
    out += f.value->title;
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    for (std::size_t i = 0; i < f.value->size(); ++i) out += (i ? ", " : "") + std::to_string((*f.value)[i]);
  } else if constexpr (std::is_same_v<T, std::string>) {
    out += *f.value;
  } else {
    out += std::to_string(*f.value);
  }
  out += "    [" + f.source + "]\n";
}

// The MoE layers (when a router was found) and the all-to-alls (the first few; --json lists all).
inline void structure_moe_text(const whatif::job_structure& st, std::string& out) {
  if (st.moe.found()) {
    out += "mixture of experts\n";
    structure_fact_text(out, "MoE layers per pass", st.moe.layers);
    structure_fact_text(out, "experts", st.moe.experts);
    structure_fact_text(out, "experts per rank", st.moe.experts_per_rank);
    structure_fact_text(out, "top-k", st.moe.top_k);
    structure_fact_text(out, "EP", st.moe.ep);
    structure_fact_text(out, "expert TP", st.moe.expert_tp);
    structure_fact_text(out, st.moe.expert_tokens_per == "ep_peer" ? "tokens per EP peer" : "tokens per expert", st.moe.expert_tokens);
  }
  if (st.all_to_alls.empty()) return;
  out += "all-to-alls: " + std::to_string(st.all_to_alls.size()) + " in the iteration\n";
  constexpr std::size_t shown = 8;
  auto ints = [](const std::vector<std::int64_t>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  for (std::size_t i = 0; i < st.all_to_alls.size() && i < shown; ++i) {
    const auto& a = st.all_to_alls[i];
    out += "  '" + a.group + "' in " + std::string(whatif::to_string(a.phase)) + ": ranks [" + whatif::detail::join_ints(a.ranks) +
           "] sent [" + ints(a.in_elements) + "] received [" + ints(a.out_elements) + "]";
    if (!a.in_splits.empty() || !a.out_splits.empty()) out += " splits in [" + ints(a.in_splits) + "] out [" + ints(a.out_splits) + "]";
    out += "    [" + a.source + "]\n";
  }
  if (st.all_to_alls.size() > shown) out += "  ... " + std::to_string(st.all_to_alls.size() - shown) + " more (--json lists them all)\n";
}

// Context parallelism, when a group has the CP role.
inline void structure_cp_text(const whatif::job_structure& st, std::string& out) {
  if (!st.cp.found()) return;
  out += "context parallelism\n";
  structure_fact_text(out, "CP", st.cp.size);
  structure_fact_text(out, "exchanges per layer", st.cp.exchanges_per_layer);
  structure_fact_text(out, "exchange", st.cp.comm);
}

// Sharded data parallelism (FSDP2, ZeRO-3), when found.
inline void structure_fsdp_text(const whatif::job_structure& st, std::string& out) {
  const auto& f = st.fsdp;
  if (!f.found()) return;
  out += "fully sharded data parallelism    [" + f.source + "]\n";
  structure_fact_text(out, "units", f.units);
  structure_fact_text(out, "all-gathers per iteration", f.all_gathers);
  structure_fact_text(out, "reduce-scatters per iteration", f.reduce_scatters);
  structure_fact_text(out, "shard group", f.shard);
  structure_fact_text(out, "HSDP replicas", f.replicas);
  structure_fact_text(out, "reshard after forward", f.reshard_after_forward);
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
  structure_moe_text(st, out);
  structure_cp_text(st, out);
  structure_fsdp_text(st, out);
  const bool chunks = report::structure_shows_chunks(st);
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
      out += " " + pipeline::format_op(p.op, chunks);
      if (p.layers.value) out += "(" + std::to_string(*p.layers.value) + "L)";
    }
    out += "\n";
  }
  if (st.memory.optimizer.known()) {  // a torch.optim step: what its memory model reads
    out += "memory recipe\n";
    structure_fact_text(out, "optimizer", st.memory.optimizer);
    structure_fact_text(out, "states", st.memory.states);
    structure_fact_text(out, "residual", st.memory.residual);
    structure_fact_text(out, "loss", st.memory.loss);
    structure_fact_text(out, "embeddings", st.memory.embeddings);
  }
  out += "layer task groups: " + std::to_string(st.layer_groups.size()) + "\n";
  if (with_groups) {
    for (const auto& lg : st.layer_groups) {
      out += "  rank " + std::to_string(lg.rank) + " " + pipeline::format_op(lg.op, chunks) + " layer " + std::to_string(lg.layer) + ": " +
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
      so.schedule = synth::parse_schedule(*s);
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
      report::structure_json(st, with_groups ? report::layer_groups::listed : report::layer_groups::count_only, out);
    } else {
      structure_text(st, with_groups, out);
    }
  } else if (json) {
    report::inspect_json(job, out);
  } else {
    inspect_text(job, out);
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

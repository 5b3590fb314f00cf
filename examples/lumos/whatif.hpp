#pragma once
// lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--layers N] [--dp N] [--global-batch N]
//              [--pp N] [--vp N] [--schedule NAME] [--hidden N] [--ffn N] [--heads N] [--seq N]
//              [--micro-batch N] [--tp N] [--sp on|off] [--step N] [--scale ...]... [--json] [--trace-out DIR]

#include "cli.hpp"
#include "predict.hpp"
#include "replay.hpp"

#include <lumos/cli/whatif.hpp>
#include <lumos/report/json/whatif.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/whatif_files.hpp>
#include <lumos/report/whatif_rows.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <cstdio>
#include <algorithm>
#include <map>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view whatif_usage =
    "usage: lumos whatif PATH... [--gpu PRESET] [--from-gpu PRESET] [--layers N] [--dp N] [--global-batch N]\n"
    "                    [--pp N] [--vp N] [--schedule NAME] [--hidden N] [--ffn N] [--heads N] [--seq N]\n"
    "                    [--micro-batch N] [--tp N] [--sp on|off] [--precision fp8] [--profile FILE] [--host-speed F|PROFILE]\n"
    "                    [--ep N] [--experts N] [--top-k K] [--expert-ffn N] [--routing balanced|measured]\n"
    "                    [--fsdp on|off] [--hsdp N] [--reshard-after-forward on|off] [--step N[,N...]]\n"
    "                    [--scale KIND=F]... [--scale op:TEXT=F]... [--no-fold] [--json] [--trace-out DIR] [--report FILE]\n"
    "  Rewrites the execution graph built from a job's traces for another configuration and replays\n"
    "  it: what the trace measured and the change does not touch stays; waits are recomputed.\n"
    "  PATH: trace files (.json/.json.gz) or directories of them, one file per rank\n"
    "  --gpu PRESET        another GPU (a100-sxm-80gb, h100-sxm, h200-sxm, b200, gb200, mi300x): each\n"
    "                      kernel at the rate the GPUs' cost profiles give its kind (GEMMs and\n"
    "                      attention: tensor-core peak x efficiency; others: HBM bandwidth x their\n"
    "                      class's fraction; transfers: NCCL bus bandwidth); the kernels\n"
    "                      (FlashAttention or not), CPU time and launch overheads stay\n"
    "  --from-gpu PRESET   the traces' GPU, when their deviceProperties name none of the presets\n"
    "  --precision fp8     fp8 training (Transformer Engine) from bf16/fp16 traces: the layers' linear GEMMs\n"
    "                      rescaled by the kernel model's fp8/bf16 ratio on the target GPU, their cast kernels\n"
    "                      inserted before them; attention, logits, norms and optimizer as traced. The\n"
    "                      traces' own precision changes nothing; from fp8 traces it is refused\n"
    "  --ep N, --experts N, --top-k K, --expert-ffn N\n"
    "                      a mixture-of-experts target (`lumos inspect --structure` finds the MoE layers):\n"
    "                      --ep regroups the experts per rank (experts / N each); EP must divide DP x CP of\n"
    "                      the target (the world stays). The grouped expert GEMMs are rescaled by the kernel\n"
    "                      model of the token copies each rank computes and the expert FFN width, the router,\n"
    "                      top-k and permutations by the experts and top-k, each all-to-all re-timed through the\n"
    "                      NCCL model over the new EP group (removed at EP 1); launches and CPU work stay.\n"
    "                      From EP 1 (no all-to-all traced) --ep is refused\n"
    "  --routing balanced|measured\n"
    "                      the experts' loads: as the traces measured them (default; the slowest EP rank's\n"
    "                      experts set the pace), or even over the experts\n"
    "  --host-speed F      the target host's CPU speed relative to the traced host's (default 1: the traced\n"
    "                      host is kept, also under --gpu): the prediction's CPU times / F. When the\n"
    "                      predicted step is mostly host work, the output gives it at host speed x0.8 and\n"
    "                      x1.25 too\n"
    "  --host-speed PROFILE the target host as a profile with a host entry (`lumos calibrate` of a trace\n"
    "                      recorded on the target machine): F is the median ratio of the cheap ATen ops'\n"
    "                      durations, the traces' over the profile's\n"
    "  --layers N          N transformer layers: each layer's launches and kernels (found by\n"
    "                      `lumos inspect --structure`) repeated or removed in place, with its collectives\n"
    "  --hidden N, --ffn N, --heads N, --seq N, --micro-batch N\n"
    "                      another model shape: each GPU op rescaled by its modelled time in the new\n"
    "                      shape over the traced one (GEMMs from their Input Dims, attention by\n"
    "                      b·heads·s²·d, other kernels by activation bytes, collectives through the\n"
    "                      NCCL model); needs the shape in the traces (`lumos inspect --structure`).\n"
    "                      --hidden keeps the FFN, or its 4x when the traced FFN is 4x hidden (as\n"
    "                      predict does), unless --ffn is given\n"
    "  --tp N              another tensor-parallel size: per-rank GEMMs and heads divided by N, TP\n"
    "                      collectives over N ranks; the traced ranks stand for the new TP group. From\n"
    "                      TP 1 Megatron's TP collectives are inserted: all-reduces, or with --sp on\n"
    "                      (sequence parallelism) reduce-scatters and all-gathers, with the norms,\n"
    "                      residuals and dropout on 1/N of the tokens. A TP > 1 trace keeps its own SP\n"
    "  --cp N              another context-parallel size (with or without --seq, the whole sequence):\n"
    "                      each rank holds seq/N tokens, its attention 1/N of the causal attention by\n"
    "                      the kernel model; ring attention's K/V exchanges re-timed by the NCCL model,\n"
    "                      inserted from CP 1 beside the attention, emptied to CP 1; gradients over\n"
    "                      DP x CP (with --dp N: N replicas x CP; micro-batches follow the replicas).\n"
    "                      With --pp/--vp/--schedule when the graph makes the pipeline change\n"
    "  --cp-comm C         the target's K/V exchange: p2p (ring attention) or allgather (K, V\n"
    "                      all-gathered before the attention, dK, dV reduce-scattered after it);\n"
    "                      the traced one emptied and the target's inserted (default: the traces')\n"
    "  --dp N              N data-parallel replicas: the gradient collectives resized with a latency +\n"
    "                      bandwidth model fitted on the trace's own collectives (ring factor, inter-node\n"
    "                      bandwidth beyond 8 GPUs per node); the traced ranks stand for every replica.\n"
    "                      From DP 1 (no gradient collectives traced) Megatron's distributed optimizer is\n"
    "                      inserted as synth builds it: bucketed reduce-scatters in the last backward,\n"
    "                      all-gathers after the step, the optimizer on 1/N of the parameters\n"
    "                      On FSDP traces (`lumos inspect --structure` shows fsdp) N is the sharding degree:\n"
    "                      each unit's all-gathers and reduce-scatters keep their count, resized for a shard\n"
    "                      group of N by the NCCL model (a unit's shard 1/N), the optimizer on 1/N; on HSDP\n"
    "                      traces the traced shard group stays and N / hsdp groups replicate it (see --hsdp)\n"
    "  --fsdp on|off       off, from FSDP traces: the target runs the distributed optimizer (ZeRO-1, predict's\n"
    "                      default): the units' all-gathers and reduce-scatters removed, Megatron's gradient\n"
    "                      buckets inserted (reduce-scatters in the last backward, all-gathers after the\n"
    "                      step). on, from DDP or distributed-optimizer traces: their gradient collectives\n"
    "                      removed, each unit's (embedding, layer, head) all-gathers before its passes and\n"
    "                      reduce-scatter after its backward inserted as synth --fsdp on builds them, over\n"
    "                      the target's DP ranks (keep the micro-batches per replica with --global-batch)\n"
    "  --reshard-after-forward on|off\n"
    "                      off, from FSDP traces whose backward passes gather again: those all-gathers\n"
    "                      removed (the forward's parameters kept)\n"
    "  --hsdp N            from FSDP or HSDP traces: shard groups of N ranks (re-timed by the NCCL model, the\n"
    "                      optimizer on 1/N), each unit's shard all-reduced over its dp / N replicas after\n"
    "                      the final backward as synth --fsdp on --hsdp builds it (N = dp: plain FSDP)\n"
    "  --global-batch N    global batch in sequences, as for predict (default: kept when it divides over --dp,\n"
    "                      else the per-replica batch is kept); the micro-batches per replica change: with PP\n"
    "                      in the pipeline model, without it by repeating or removing whole micro-batches\n"
    "  --pp N, --vp N      pipeline stages and model chunks per stage (layers must divide over them). From\n"
    "                      traces without stages to GPipe, 1F1B, interleaved, ZB-H1 or ZB-H2 the graph is cut\n"
    "                      into N stages (each rank of each stage with its layers' launches and kernels,\n"
    "                      Megatron's send/recv kernels and host sync, zero bubble's W passes; a row per\n"
    "                      rank); from traces with stages likewise to a multiple of their stages or another\n"
    "                      schedule (GPipe, 1F1B, ZB-H1, ZB-H2), each traced stage cut into its block, or to a\n"
    "                      divisor of them (at least 2), each merged stage made from one traced stage with\n"
    "                      its layers repeated, the other stages' ranks dropped; otherwise:\n"
    "  --schedule NAME     gpipe, 1f1b, interleaved, zb-h1 or zb-h2: a pass-level model of the new pipeline (each\n"
    "                      pass one task per stage, its replayed layer costs, the trace's own p2p latency)\n"
    "                      added as a difference to the replay; prints the stages and the bubble.\n"
    "                      interleaved without --vp: 2 model chunks per stage\n"
    "  --profile FILE      the cluster's cost profile (`lumos calibrate -o FILE`) for the shape, TP and DP\n"
    "                      rewrites' kernel and NCCL models (default: the preset of the traced GPU)\n"
    "  --step N, --scale, --profiler-cost  as for `lumos replay`, applied to the baseline and the prediction;\n"
    "                      --step N,M,...: the what-if of each step in turn from one reading of the traces\n"
    "                      (--json: an array of the steps' documents; not with --trace-out or --report)\n"
    "  --no-fold           replay every traced rank: by default ranks whose traces are identical (the\n"
    "                      ranks of a job `lumos synth --unfold` writes) are folded onto one of each\n"
    "                      class, which stands for the rest (\"folded\" in --json; rows show those kept);\n"
    "                      not with --trace-out, which writes every rank\n"
    "  --json              {\"baseline\":{...},\"predicted\":{\"iteration_ns\",\"unprofiled_ns\",\"breakdown\",\"bubble_fraction\",\n"
    "                      \"memory_bytes_per_gpu\",\"ranks\":[...]},\"changes\":[...],\"shape\":{...},\"structure\":{...}}\n"
    "                      and \"pipeline\":{\"model\":\"pass-level\" or \"graph\",...} after a pipeline change\n"
    "  --trace-out DIR     write the predicted job as Kineto traces (one file per rank; with --pp in\n"
    "                      the graph every rank of every stage), which `lumos replay` reads back and\n"
    "                      replays to the same prediction; not after a pass-level pipeline model\n"
    "  --report FILE       the HTML report of the prediction, with the baseline beside it\n";

inline std::string shape_text(const whatif::shape_summary& s) {
  std::string out;
  char line[512];
  // CP only where either side has it, so that the line of a job without CP reads as it did.
  const bool cp = s.from.cp > 1 || s.to.cp > 1;
  auto row = [&](const char* what, const whatif::shape_config& c, const whatif::shape_figures& f, double mfu) {
    // The all-gather exchange is named (the ring is the default, as for predict).
    const std::string comm = c.cp > 1 && c.cp_comm == model::cp_comm_kind::allgather ? " (allgather)" : "";
    const std::string tp = cp ? std::to_string(c.tp) + ", CP " + std::to_string(c.cp) + comm : std::to_string(c.tp);
    std::snprintf(line, sizeof line, "  %-9s hidden %lld, FFN %lld, %lld heads of %lld, seq %lld, micro-batch %lld, TP %s, %lld ranks: %.2f GiB per GPU, MFU %.1f %%\n",
                  what, static_cast<long long>(c.hidden), static_cast<long long>(c.ffn), static_cast<long long>(c.heads),
                  static_cast<long long>(c.head_dim), static_cast<long long>(c.seq), static_cast<long long>(c.micro_batch), tp.c_str(),
                  static_cast<long long>(f.world), f.memory_bytes_per_gpu / 1073741824.0, 100.0 * mfu);
    out += line;
  };
  out += "\nmodel shape (memory per GPU: model/memory.hpp; MFU: model FLOPs per rank of the layers" +
         std::string(s.baseline.vocab_known ? " and the logits" : " (the vocabulary is not in the traces)") + ")\n";
  row("baseline", s.from, s.baseline, s.mfu_baseline);
  row("predicted", s.to, s.predicted, s.mfu_predicted);
  return out;
}

inline std::string pipeline_text(const whatif::pipeline_prediction& p) {
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line, "\npipeline (pass-level model): %s, %d stages, %d micro-batches, %d chunk(s): iteration %s, bubble %.1f%%\n",
                std::string(p.predicted.schedule.title).c_str(), p.predicted.shape.stages, p.predicted.shape.micro_batches,
                p.predicted.shape.chunks, ms(p.iteration_ns).c_str(), 100 * p.predicted.bubble_fraction);
  out += line;
  for (const auto& s : p.predicted.stages) {
    std::snprintf(line, sizeof line, "  stage %3d  busy %12s  last pass ends %12s after the first starts\n", s.stage, ms(s.busy).c_str(), ms(s.end).c_str());
    out += line;
  }
  out += "  (the per-rank rows above are the replay the prediction is anchored on)\n";
  return out;
}

inline std::string folding_text(const trace::rank_folding& folding) {
  if (!folding.folded()) return {};
  std::string out = "note: " + std::to_string(folding.traced) + " traced ranks folded onto " + std::to_string(folding.stands_for.size()) +
                    " (ranks with identical traces replay as one):";
  for (const auto& ranks : folding.stands_for) {
    out += " rank " + std::to_string(ranks.front()) + " stands for " + std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank;" : " ranks;");
  }
  out.back() = '\n';
  return out;
}

// The host the prediction assumes, said when it matters: a GPU change keeps the traced host, and
// a step that follows the host is given at other host speeds.
inline std::string host_text(const whatif::whatif_result& r) {
  std::string out;
  char line[256];
  if (!r.host_profile.empty()) {
    std::snprintf(line, sizeof line, "host: %.3gx the traced host's CPU speed (--host-speed: the host entry of profile '%s', median over %zu ATen ops)\n",
                  r.host_speed, r.host_profile.c_str(), r.host_ops);
    out += line;
  } else if (r.host_speed != 1.0) {
    std::snprintf(line, sizeof line, "host: %.3gx the traced host's CPU speed (--host-speed)\n", r.host_speed);
    out += line;
  } else if (!r.host_sensitivity.empty() || std::any_of(r.changes.begin(), r.changes.end(), [](const whatif::change& c) { return c.pass == "gpu"; })) {
    out += "host: the traced host's CPU speed is kept (--host-speed F changes it)\n";
  }
  if (!r.host_sensitivity.empty()) {
    out += "host sensitivity: the predicted step is mostly host work:";
    for (const auto& p : r.host_sensitivity) {
      std::snprintf(line, sizeof line, " %.3f ms at host speed x%g%s", static_cast<double>(p.iteration_ns) / 1e6, p.host_speed,
                    &p == &r.host_sensitivity.back() ? "\n" : ",");
      out += line;
    }
  }
  return out;
}

inline std::string whatif_text(const whatif::whatif_result& r, const trace::job& job, const report::written_traces& written,
                               const trace::rank_folding& folding) {
  std::string out;
  char line[512];
  const std::size_t traced = folding.folded() ? folding.traced : job.ranks.size();
  std::snprintf(line, sizeof line, "lumos whatif: %zu rank%s\n", traced, traced == 1 ? "" : "s");
  out += line;
  for (const auto& c : r.changes) out += "change: " + c.text + "\n";
  out += "why: " + r.why.text + "\n";
  out += host_text(r);
  out += "\n rank  step              baseline    predicted   speedup  | predicted: exposed-compute  overlapped  exposed-comm   other\n";
  // The traced ranks the prediction kept compare with their baseline (all of them unless stages
  // were merged); the ranks of added pipeline stages with the traced rank they copy.
  const std::size_t traced_kept = r.predicted.ranks.size() - (r.stages ? r.stages->traced_index.size() : 0);
  std::map<int, const report::rank_replay*> baseline_of;
  for (const auto& [rank, row] : report::whatif_rank_rows(r.baseline, folding, job, nullptr)) baseline_of.emplace(rank, row);
  for (const auto& [rank, row] : report::whatif_rank_rows(r.predicted, folding, job, r.stages ? &*r.stages : nullptr)) {
    const auto i = static_cast<std::size_t>(row - r.predicted.ranks.data());
    const auto found = baseline_of.find(rank);
    const auto& b = i >= traced_kept ? r.baseline.ranks[r.stages->traced_index[i - traced_kept]]
                    : found != baseline_of.end() ? *found->second
                                                 : r.baseline.ranks.back();
    const auto& p = *row;
    const auto& s = p.simulated.split;
    std::snprintf(line, sizeof line, " %4d  %-16s %12s %12s %7.3fx  |  %10s %10s %10s %10s\n", rank, p.step.c_str(),
                  ms(b.simulated_ns).c_str(), ms(p.simulated_ns).c_str(),
                  p.simulated_ns > 0 ? static_cast<double>(b.simulated_ns) / static_cast<double>(p.simulated_ns) : 0.0,
                  ms(s.exposed_compute).c_str(), ms(s.overlapped).c_str(), ms(s.exposed_comm).c_str(), ms(s.other).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  job  %-16s %12s %12s %7.3fx\n", "", ms(r.baseline.simulated_ns).c_str(),
                ms(r.predicted.simulated_ns).c_str(),
                r.predicted.simulated_ns > 0 ? static_cast<double>(r.baseline.simulated_ns) / static_cast<double>(r.predicted.simulated_ns) : 0.0);
  out += line;
  std::snprintf(line, sizeof line, "step without profiler: baseline %s, predicted %s (estimate: the profiler's host time per recorded event removed)\n",
                ms(r.baseline.unprofiled_ns).c_str(), ms(r.predicted.unprofiled_ns).c_str());
  out += line;
  if (r.shape) out += shape_text(*r.shape);
  if (r.pipeline) out += pipeline_text(*r.pipeline);
  if (r.stages) {
    std::snprintf(line, sizeof line, "\npipeline (in the graph): %s, %d stages, %d micro-batches, %d chunk(s): iteration %s, bubble %.1f%%\n",
                  std::string(r.stages->schedule.title).c_str(), r.stages->stages, r.stages->micro_batches,
                  r.stages->chunks, ms(r.predicted.simulated_ns).c_str(), 100 * r.bubble_fraction.value_or(0.0));
    out += line;
  }
  for (const auto& f : written.files) out += "wrote " + f.string() + "\n";
  return out;
}

inline int run_whatif(args& a) {
  const whatif_request req = parse_whatif_change(a);
  const whatif::whatif_options& o = req.options;
  const bool json = a.flag("--json");
  const bool no_fold = a.flag("--no-fold");
  const auto trace_out = a.option("--trace-out");
  // A written job keeps every traced rank: folded, it would hold one of each class.
  const bool fold = !no_fold && !trace_out;
  const auto html = a.option("--report");
  const auto inputs = a.positionals();
  if (inputs.empty()) throw usage_error("whatif needs at least one PATH");
  require_change(req);
  trace::job job = trace::load_job(paths(inputs));
  // Every shipped rewrite changes identical ranks alike: one of each class stands for the rest.
  const trace::rank_folding folding = fold ? trace::fold_identical_ranks(job) : trace::rank_folding{};
  if (!req.steps.empty()) {
    if (trace_out || html) throw usage_error("--trace-out and --report write one step: give --step one step");
    write_diagnostics(folding_text(folding));
    write_stdout(join_step_documents(req.steps.size(), json, [&](std::size_t i) {
      whatif::whatif_options step_options = o;
      step_options.replay.step = req.steps[i];
      const whatif::whatif_result r = whatif::run_whatif(job, step_options);
      return json ? report::whatif_json(r, job, folding, nullptr) : whatif_text(r, job, {}, folding);
    }));
    return 0;
  }
  const whatif::whatif_result r = whatif::run_whatif(job, o);
  if (trace_out) require_writable(r);
  report::written_traces written;
  if (trace_out) written = report::write_whatif_traces(o, r, job, *trace_out);
  if (html) {
    report::detail::write_file(*html, report::whatif_html(job, r, inputs));
    written.files.emplace_back(*html);
  }
  if (json) {
    write_stdout(report::whatif_json(r, job, folding, trace_out ? &written : nullptr));
  } else {
    write_diagnostics(folding_text(folding) + (written.folded_note.empty() ? "" : "note: " + written.folded_note + "\n"));
    write_stdout(whatif_text(r, job, written, folding));
  }
  return 0;
}

}  // namespace lumos::cli

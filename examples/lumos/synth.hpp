#pragma once
// lumos synth [predict flags] --out DIR [--detail {op,kernel}] [--gzip] [--unfold]

#include "cli.hpp"
#include "predict.hpp"

#include <lumos/graph/compile.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>

#include <cstdio>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view synth_usage =
    "usage: lumos synth [--model PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
    "                   [--kv-heads N] [--seq N] [--vocab N] [--experts N] [--top-k K]\n"
    "                   [--expert-ffn N] [--shared-experts N] [--moe-dispatcher {alltoall,allgather}]\n"
    "                   [--mtp-layers N] [--capacity-factor {F,dropless}] [--tp N] [--pp N] [--dp N] [--vp N] [--ep N]\n"
    "                   [--expert-tp N] [--cp N] [--cp-comm {p2p,allgather}]\n"
    "                   [--sp {on,off}] [--tp-comm-overlap {on,off}] [--overlap-param-gather {on,off}]\n"
    "                   [--distributed-optimizer {on,off}] [--fsdp {on,off}] [--hsdp N]\n"
    "                   [--reshard-after-forward {on,off}] [--micro-batch N] [--global-batch N] [--schedule NAME]\n"
    "                   [--pipeline-layout STR | --decoder-first-pipeline-num-layers N\n"
    "                    --decoder-last-pipeline-num-layers N]\n"
    "                   [--recompute {none,selective,full}] [--gpu PRESET]\n"
    "                   [--precision {bf16,fp16,fp8}] [--profile FILE] [--attention {flash,unfused}]\n"
    "                   [--cost-model {kernel,roofline}] [--forward-only]\n"
    "                   --out DIR [--detail {op,kernel}] [--gzip] [--unfold] [--json]\n"
    "  The model flags are those of 'lumos predict' (lumos help predict); world = TP x PP x CP x DP,\n"
    "  EP x expert TP divides TP x CP x DP (expert TP defaults to TP: then EP divides DP x CP).\n"
    "  Builds one training iteration from the model description (as 'lumos predict' does, one task\n"
    "  per kernel), simulates it, and writes it as Kineto traces: DIR/rank{R}.json (.json.gz with\n"
    "  --gzip), one per distinct rank (one per pipeline stage; every rank with --unfold), with the\n"
    "  rank in distributedInfo. 'lumos inspect' and 'lumos replay' read them; Perfetto opens them.\n"
    "  Replaying them reproduces the prediction.\n"
    "  --detail op      (default) each kernel named after the model's op (qkv_proj, mlp_fc1, ...),\n"
    "                   launched by a bare cudaLaunchKernel\n"
    "  --detail kernel  what a Megatron-LM / PyTorch eager trace shows: cuBLAS / FlashAttention /\n"
    "                   ATen / NCCL kernel names, each launch inside the CPU operator that dispatched\n"
    "                   it (aten::mm, ... with Input Dims), ParallelTransformerLayer scopes,\n"
    "                   ## forward ## / ## backward ## / Optimizer.step markers, collectives with\n"
    "                   their process-group args; 'lumos inspect --structure' recovers the\n"
    "                   configuration from them\n";

inline int run_synth(args& a) {
  const auto out_dir = a.option("--out");
  const bool gzip = a.flag("--gzip");
  const bool json = a.flag("--json");
  const std::string detail = a.option("--detail").value_or("op");
  if (detail != "op" && detail != "kernel") throw lumos::error("--detail must be op or kernel, got '" + detail + "'");
  predict_request req = parse_predict(a);
  a.no_positionals();
  if (!out_dir) throw usage_error("synth needs --out DIR");
  const synth_output so = write_synth(req, *out_dir, gzip, detail == "kernel");
  const auto& files = so.files;
  const auto& ranks = so.ranks;
  const time_ns makespan = so.makespan;

  std::string out;
  if (json) {
    json_writer w(out);
    w.begin_object().field("iteration_ns", makespan).field("ranks", ranks.size()).field("tasks", so.tasks);
    w.key("files").begin_array();
    for (const auto& f : files) w.value(f.string());
    w.end_array().end_object();
    out += '\n';
  } else {
    char line[256];
    std::snprintf(line, sizeof line, "lumos synth: %zu rank%s (%s), %zu tasks, simulated iteration %.3f ms\n", ranks.size(),
                  ranks.size() == 1 ? "" : "s", req.unfold ? "every rank" : "one per pipeline stage, identical ranks folded",
                  so.tasks, static_cast<double>(makespan) / 1e6);
    out += line;
    for (const auto& f : files) out += "wrote " + f.string() + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

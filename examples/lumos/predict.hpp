#pragma once
// lumos predict [--model PRESET] [shape and parallelism flags] [--json] [--unfold]

#include "cli.hpp"

#include <lumos/cli/predict.hpp>
#include <lumos/cli/routing.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/json/predict.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/trace/job.hpp>

#include "calibrate.hpp"  // so that main.cpp registers `calibrate` with one line of its table

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace lumos::cli {

inline constexpr std::string_view predict_usage =
    "usage: lumos predict [--model PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
    "                     [--kv-heads N] [--seq N] [--vocab N] [--experts N] [--top-k K]\n"
    "                     [--expert-ffn N] [--shared-experts N] [--moe-dispatcher {alltoall,allgather}]\n"
    "                     [--mtp-layers N] [--capacity-factor {F,dropless}] [--tp N] [--pp N] [--dp N] [--vp N] [--ep N]\n"
    "                     [--expert-tp N] [--cp N] [--cp-comm {p2p,allgather}]\n"
    "                     [--routing {balanced,measured}] [--routing-from PATH]\n"
    "                     [--sp {on,off}] [--tp-comm-overlap {on,off}] [--overlap-param-gather {on,off}]\n"
    "                     [--distributed-optimizer {on,off}] [--fsdp {on,off}] [--hsdp N]\n"
    "                     [--reshard-after-forward {on,off}] [--micro-batch N] [--global-batch N] [--schedule NAME]\n"
    "                     [--pipeline-layout STR | --decoder-first-pipeline-num-layers N\n"
    "                      --decoder-last-pipeline-num-layers N]\n"
    "                     [--recompute {none,selective,full}] [--gpu PRESET]\n"
    "                     [--precision {bf16,fp16,fp8}] [--profile FILE] [--attention {flash,unfused}]\n"
    "                     [--cost-model {kernel,roofline}] [--forward-only] [--json] [--unfold]\n"
    "                     [--report FILE]\n"
    "  Builds one training iteration from the model description and simulates it with the replay\n"
    "  engine; prints iteration time, throughput, TFLOP/s and MFU/HFU, pipeline bubble, the 4-way\n"
    "  breakdown of rank 0 and per-GPU memory.\n"
    "  --model     gpt3-15b, gpt3-44b, gpt3-117b, gpt3-175b (default), llama3-8b, llama3-70b,\n"
    "              llama3-405b (also as llama3.1-405b), and the mixture-of-experts qwen3-30b-a3b,\n"
    "              qwen3-235b-a22b,\n"
    "              gpt-oss-120b, mixtral-8x7b, deepseek-v3 (multi-head latent attention, 3 dense\n"
    "              layers first); the shape flags override it (--heads also sets --kv-heads for\n"
    "              multi-head models, --hidden also sets --ffn to 4x for models whose ffn is 4h,\n"
    "              unless given)\n"
    "  --experts/--top-k/--expert-ffn/--shared-experts  mixture of experts: routed experts per\n"
    "              layer, experts each token visits, one expert's FFN width (default --ffn), shared\n"
    "              experts (default 0); --experts makes a dense preset a MoE model\n"
    "  --moe-dispatcher  alltoall (default: all-to-all over the EP group) or allgather (all-gather\n"
    "              and reduce-scatter over the EP x TP group)\n"
    "  --capacity-factor  tokens each expert computes as a multiple of its balanced share (drops\n"
    "              or pads), or dropless (default)\n"
    "  --routing   balanced (default: every expert the same share) or measured: the per-expert\n"
    "              token counts of the MoE trace(s) at --routing-from PATH, dealt to the EP ranks;\n"
    "              the busiest rank's experts and the all-to-alls waiting on it set the pace\n"
    "  --mtp-layers  multi-token-prediction modules (deepseek-v3: 1, others 0), each a block, a 2h->h\n"
    "              projection and an output head on the last pipeline stage, counted as a layer\n"
    "              of its last virtual stage\n"
    "  --tp/--pp/--dp/--vp  parallel sizes (default 1); --sp sequence parallelism (default off)\n"
    "  --pipeline-layout  the layers of each virtual stage, in the syntax of Megatron's pipeline\n"
    "              model parallel layout: E embedding, t layer, m MTP block, L loss,\n"
    "              | between virtual stages (in virtual-stage order), x*n and (...)*n repeat;\n"
    "              e.g. 'Et*4|(t*4|)*14tL' (61 layers, pp x vp = 16). Default: the layers split\n"
    "              evenly, or with the embedding and the loss counted as layers when that divides\n"
    "  --decoder-first-pipeline-num-layers/--decoder-last-pipeline-num-layers  layers of the first\n"
    "              / last pipeline stage, the others split evenly over the stages between (and\n"
    "              each stage's over its vp chunks)\n"
    "  --cp        context-parallel size (default 1): each sequence is split over cp ranks (2*cp\n"
    "              load-balanced chunks, so 2*cp divides --seq, and with --sp on TP x CP divides it);\n"
    "              world = TP x PP x CP x DP; gradients and the distributed optimizer span DP x CP\n"
    "  --cp-comm   how CP ranks exchange keys and values: p2p (default: ring attention, overlapped\n"
    "              with the attention) or allgather (all-gather of K and V before the attention);\n"
    "              allgather needs --cp > 1\n"
    "  --ep        expert-parallel size (default 1); EP divides the experts, and EP x expert TP\n"
    "              divides TP x CP x DP (Megatron's MoE parallel folding: the expert layers lay\n"
    "              EP x ETP x EDP over a stage's TP x CP x DP ranks; with expert TP = TP, EP divides\n"
    "              DP x CP); MoE with tp > 1 needs --sp on\n"
    "  --expert-tp expert-tensor-parallel size (default: --tp, Megatron's default); each expert's\n"
    "              width is split over it, its gradients reduced over TP x CP x DP / (EP x ETP) ranks\n"
    "  --tp-comm-overlap  Megatron's --tp-comm-overlap (Transformer Engine): each sequence-parallel\n"
    "              collective of a layer overlaps its GEMM (default off; needs --sp on when tp > 1)\n"
    "  --overlap-param-gather  Megatron's --overlap-param-gather: the distributed optimizer's\n"
    "              parameter all-gathers overlap the next iteration's first forward pass instead\n"
    "              of ending the step (steady state; default off; needs the distributed optimizer)\n"
    "  --distributed-optimizer  Megatron's distributed optimizer (ZeRO-1; default on): gradients\n"
    "              reduce-scattered, optimizer states sharded over DP x CP (the experts' over their\n"
    "              expert-data-parallel group), parameters all-gathered after the step; off: DDP,\n"
    "              gradients all-reduced, every DP rank holds and steps all its stage's optimizer\n"
    "              states (more memory per GPU); not with --fsdp on or --overlap-param-gather on\n"
    "  --fsdp      fully sharded data parallelism (FSDP2 / ZeRO-3; default off: the distributed\n"
    "              optimizer, or DDP): --dp ranks shard parameters, gradients and optimizer states;\n"
    "              each layer is all-gathered before its forward and backward (the next one\n"
    "              prefetched) and its gradients reduce-scattered every micro-batch\n"
    "  --hsdp      hybrid sharding: shard over groups of N ranks (N divides --dp), replicate across\n"
    "              the dp / N groups, which all-reduce their gradient shards (needs --fsdp on)\n"
    "  --reshard-after-forward  free each layer's gathered parameters after its forward and gather\n"
    "              them again for its backward (default on); off keeps them: no backward gathers,\n"
    "              more memory (needs --fsdp on)\n"
    "  --micro-batch  sequences per micro-batch (default 1)\n"
    "  --global-batch sequences per iteration (default micro-batch x dp x 4pp with pp > 1,\n"
    "              micro-batch x dp otherwise)\n"
    "  --schedule  gpipe, 1f1b, interleaved, zb-h1, zb-h2 (default interleaved when vp > 1, else 1f1b)\n"
    "  --recompute activation recomputation (default none)\n"
    "  --gpu       a100-sxm-80gb, h100-sxm (default), h200-sxm, b200, gb200 (72-GPU NVLink domain),\n"
    "              mi300x; --precision default bf16\n"
    "  --profile   cost profile JSON (lumos calibrate -o FILE); default: the preset of --gpu (its\n"
    "              'hardware' field picks the GPU when --gpu is not given)\n"
    "  --attention override the profile's attention path (flash, or Megatron's unfused softmax)\n"
    "  --cost-model kernel (default: per-kernel GPU times, CPU dispatch, NCCL protocols from the\n"
    "              profile) or roofline (pass-level roofline with one efficiency per op class)\n"
    "  --forward-only  forward passes only (no backward, gradient reduction or optimizer), e.g. to\n"
    "              compare with a forward-only profiling step\n"
    "  --unfold    simulate every rank (default: one rank per pipeline stage, identical ranks folded)\n"
    "  --report    also write the HTML report of the modelled iteration (its traces, as `lumos synth`\n"
    "              writes them, replayed)\n"
    "  Fixed: fp32 main gradients, gradient reduction in buckets overlapped with the backward,\n"
    "  FlashAttention.\n";

namespace detail {

inline std::string bytes_text(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

inline std::string ms_text(time_ns t) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(t) / 1e6);
  return buf;
}

inline std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * f);
  return buf;
}

}  // namespace detail

/// `profile`: the kernel-level model's profile, or null for the roofline model;
/// `measured_routing`: the routing was read from traces (`--routing measured`).
inline void predict_text(const synth::job& j, const synth::prediction& r, double wall_ms, std::string& out,
                         const model::cost_profile* profile, bool measured_routing) {
  const auto& m = j.model;
  const auto& p = j.parallel;
  char line[768];
  auto put = [&](const char* fmt, auto... xs) {
    std::snprintf(line, sizeof line, fmt, xs...);
    out += line;
  };
  put("lumos predict: %s on %lld x %s, %s\n", m.name.c_str(), static_cast<long long>(r.gpus), j.hardware.name.c_str(),
      std::string(model::to_string(p.dtype)).c_str());
  // Multi-token prediction only when used, so that other models' line reads as before.
  const std::string mtp = m.mtp_layers > 0 ? " + " + std::to_string(m.mtp_layers) + " multi-token prediction" : "";
  put("  model         %lld layers%s, hidden %lld, ffn %lld, %lld heads (%lld kv), seq %lld, vocab %lld\n",
      static_cast<long long>(m.layers), mtp.c_str(), static_cast<long long>(m.hidden), static_cast<long long>(m.ffn),
      static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads), static_cast<long long>(m.seq),
      static_cast<long long>(m.vocab));
  if (m.is_moe()) {
    const model::moe_spec& x = m.moe;
    char cf[64] = "dropless";
    if (x.capacity_factor > 0) std::snprintf(cf, sizeof cf, "capacity factor %g", x.capacity_factor);
    char routing[96] = "balanced routing";
    if (measured_routing || x.load_imbalance != 1.0) {
      std::snprintf(routing, sizeof routing, "measured routing (busiest EP rank %.3fx the mean load)", x.load_imbalance);
    }
    put("  experts       %lld routed (top-%lld) of FFN %lld, %lld shared, EP %d x expert TP %d (expert-data-parallel %d),\n"
        "                %s dispatcher, %s, %s\n",
        static_cast<long long>(x.experts), static_cast<long long>(x.top_k), static_cast<long long>(x.expert_ffn),
        static_cast<long long>(x.shared_experts), p.ep, p.expert_tp(), p.expert_data_parallel(),
        std::string(model::to_string(x.dispatcher)).c_str(), cf, routing);
  }
  std::string sched(r.schedule.name);
  if (r.shape.chunks > 1) sched += " (v = " + std::to_string(r.shape.chunks) + ")";
  // CP only when used, so that the line of a job without it reads as before.
  const std::string cp = p.cp > 1 ? " x CP " + std::to_string(p.cp) + " (" + std::string(model::to_string(p.cp_comm)) + ")" : "";
  std::string sharding = p.zero_stage == 0 ? "DDP (no distributed optimizer: gradients all-reduced" : "ZeRO-1 (distributed optimizer";
  if (p.fsdp && p.hsdp > 0) {
    sharding = "HSDP (shard groups of " + std::to_string(p.hsdp) + ", " + std::to_string(p.dp / p.hsdp) + " replicas";
  } else if (p.fsdp) {
    sharding = "FSDP (ZeRO-3";
  }
  if (p.fsdp && !p.reshard_after_forward) sharding += ", parameters kept after the forward";
  put("  parallelism   TP %d x PP %d%s x DP %d, %s, sp %s%s, recompute %s, %s%s)\n", p.tp, p.pp, cp.c_str(), p.dp, sched.c_str(),
      p.sp ? "on" : "off", p.tp_comm_overlap ? " (TP comm overlapped)" : "", std::string(model::to_string(p.recompute)).c_str(),
      sharding.c_str(), p.overlap_param_gather && p.gradient_ranks() > 1 ? ", parameter all-gather overlapped with the first forward" : "");
  put("  batch         %lld sequences of %lld tokens, micro-batch %lld, %d micro-batches per pipeline\n",
      static_cast<long long>(p.global_batch), static_cast<long long>(m.seq), static_cast<long long>(p.micro_batch),
      r.shape.micro_batches);
  if (profile == nullptr) {
    out += "  costs         roofline model\n";
  } else if (profile->at_scale != 1.0) {
    // Said where it applies: a user comparing with one GPU's run should know why it is slower.
    put("  costs         kernel-level model, profile %s; GEMMs and attention at %.2f of its efficiencies\n"
        "                (its at-scale fraction for jobs of many GPUs: docs/model.md)\n",
        profile->name.c_str(), profile->at_scale);
  } else {
    put("  costs         kernel-level model, profile %s\n", profile->name.c_str());
  }
  put("  iteration     %.3f s (%lld ns)\n", static_cast<double>(r.iteration_ns) / 1e9,
      static_cast<long long>(r.iteration_ns));
  put("  throughput    %.0f tokens/s\n", r.tokens_per_s);
  if (m.is_moe()) {
    put("  model FLOPs   %.1f TFLOP/s per GPU, MFU %s   (%s x 2 x tokens x active GEMM weights + attention per %siteration;\n",
        r.model_tflops_per_gpu, detail::pct(r.mfu).c_str(), r.forward_only ? "1" : "3", r.forward_only ? "forward-only " : "");
  } else {
    put("  model FLOPs   %.1f TFLOP/s per GPU, MFU %s   (Megatron: %s*B*s*l*h^2*(1 + s/6h + V/12lh) per %siteration;\n",
        r.model_tflops_per_gpu, detail::pct(r.mfu).c_str(), r.forward_only ? "24" : "72", r.forward_only ? "forward-only " : "");
  }
  put("                peak %.1f TFLOP/s dense %s)\n", r.peak_flops_per_gpu / 1e12,
      std::string(model::to_string(p.dtype)).c_str());
  put("  hardware FLOPs %.1f TFLOP/s per GPU, HFU %s   (adds the forward work recomputation reruns)\n",
      r.hardware_tflops_per_gpu, detail::pct(r.hfu).c_str());
  put("  pipeline bubble %s   (1 - mean stage busy time / pipeline phase of %s; the phase ends with the last\n",
      detail::pct(r.bubble_fraction).c_str(), detail::ms_text(r.pipeline_ns).c_str());
  out += "                forward/backward op; busy = passes and TP collectives on the compute stream)\n";
  const auto window = static_cast<double>(r.breakdown_window_ns > 0 ? r.breakdown_window_ns : 1);
  put("  breakdown     rank %d (stage 0, tp 0, dp 0), window %s: exposed compute %s (%s), overlapped %s (%s),\n",
      r.breakdown_rank, detail::ms_text(r.breakdown_window_ns).c_str(), detail::ms_text(r.breakdown.exposed_compute).c_str(),
      detail::pct(static_cast<double>(r.breakdown.exposed_compute) / window).c_str(),
      detail::ms_text(r.breakdown.overlapped).c_str(),
      detail::pct(static_cast<double>(r.breakdown.overlapped) / window).c_str());
  put("                exposed communication %s (%s), other %s (%s); SM utilisation %s\n",
      detail::ms_text(r.breakdown.exposed_comm).c_str(),
      detail::pct(static_cast<double>(r.breakdown.exposed_comm) / window).c_str(),
      detail::ms_text(r.breakdown.other).c_str(), detail::pct(static_cast<double>(r.breakdown.other) / window).c_str(),
      detail::pct(r.sm_utilization).c_str());
  const auto& mem = r.memory;
  put("  memory/GPU    %s on stage %d (the largest; %s of HBM %s): parameters %s, gradients %s,\n",
      detail::bytes_text(mem.total()).c_str(), r.memory_stage,
      detail::bytes_text(static_cast<double>(j.hardware.gpu.hbm_capacity)).c_str(),
      mem.fits(j.hardware) ? "fits" : "DOES NOT FIT", detail::bytes_text(mem.parameters).c_str(),
      detail::bytes_text(mem.gradients).c_str());
  put("                optimizer %s, activations %s (%.2f micro-batches in flight)\n",
      detail::bytes_text(mem.optimizer_states).c_str(),
      detail::bytes_text(mem.activations + mem.io_activations + mem.recompute_working).c_str(),
      r.in_flight_microbatches);
  if (j.parallel.fsdp) {
    put("                FSDP buffers %s (gathered units and one unit's unsharded gradients)\n",
        detail::bytes_text(mem.fsdp_buffers).c_str());
  }
  if (j.parallel.dtype == model::precision::fp8) {
    put("                fp8 weight copies %s (weight and transpose, 1 B each), fp8 scaling state %s;\n"
        "                fp8 GEMM inputs saved for backward at 1 B\n",
        detail::bytes_text(mem.fp8_weights).c_str(), detail::bytes_text(mem.fp8_scaling_state).c_str());
  }
  out += p.zero_stage == 0 ? "                (bf16 weights 2 B, fp32 main gradients 4 B, Adam 12 B per parameter, not sharded;\n"
         : p.cp > 1        ? "                (bf16 weights 2 B, fp32 main gradients 4 B, Adam 12 B per parameter sharded over DP x CP;\n"
                           : "                (bf16 weights 2 B, fp32 main gradients 4 B, Adam 12 B per parameter sharded over DP;\n";
  out += "                activations per Korthikanti et al. with FlashAttention)\n";
  put("  simulated     %zu ranks%s, %zu tasks, %zu edges, in %.1f ms\n", r.simulated_ranks,
      r.unfolded ? " (every rank)" : " (one per stage; identical ranks folded)", r.tasks, r.edges, wall_ms);
}

/// What `write_synth` wrote.
struct synth_output {
  std::vector<std::filesystem::path> files;
  std::vector<int> ranks;
  std::size_t tasks = 0;
  time_ns makespan = 0;
};

/// Builds the iteration of `req` one task per kernel, simulates it and writes it as Kineto traces
/// into `dir` (what `lumos synth` does; `predict --report` reports on such traces). `kernel_detail`:
/// the traces of `lumos synth --detail kernel` (synth/kernel_trace.hpp).
inline synth_output write_synth(const predict_request& req, const std::filesystem::path& dir, bool gzip,
                                bool kernel_detail = false) {
  synth::program_options opt;
  opt.unfold = req.unfold;
  opt.detail = synth::granularity::kernel;
  opt.record_collectives = true;
  opt.notes = kernel_detail;
  apply_profile(req, opt);
  const synth::program prog = req.roofline ? synth::build_program(req.job, opt)
                                           : synth::build_program(req.job, opt, model::kernel_level{req.profile},
                                                                  model::nccl_model{req.profile});
  const graph::compiled_graph compiled = graph::compile(prog.graph);
  sim::replay_engine engine;
  sim::record_timeline timeline;
  const time_ns makespan = engine.run(compiled, timeline);

  report::simulated_job sj;
  sj.graph = &prog.graph;
  sj.simulated = report::simulated_times(timeline, compiled);
  sj.world_size = static_cast<int>(prog.world_size);
  sj.device_name = req.job.hardware.name;
  report::trace_decorations decorations;
  if (kernel_detail) {
    decorations = synth::kernel_trace_decorations(prog, req.job, req.roofline ? time_ns{-1} : static_cast<time_ns>(req.profile.cpu_launch_ns));
    sj.decorations = &decorations;
  }
  std::vector<int> ranks;
  for (const auto& r : prog.ranks) ranks.push_back(r.rank);
  synth_output o;
  o.files = report::write_kineto(sj, ranks, dir, gzip);
  o.ranks = std::move(ranks);
  o.tasks = prog.graph.task_count();
  o.makespan = makespan;
  return o;
}

/// `predict --report FILE`: the modelled iteration written as traces (as `lumos synth`) into a
/// temporary directory, replayed, and reported as HTML; the directory is removed.
inline void predict_report(const predict_request& req, const std::string& file) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lumos-predict-report-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  struct cleanup {
    fs::path d;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } guard{dir};
  (void)write_synth(req, dir, false);
  const trace::job job = trace::load_job({dir});
  const report::replay_session s = report::replay_job(job);
  report::html_options ho;
  ho.title = "lumos predict: " + req.job.model.name;
  ho.inputs = {"lumos predict (modelled, one trace per pipeline stage)"};
  report::detail::write_file(file, report::html_report(job, s, ho));
}

inline int run_predict(args& a) {
  const bool json = a.flag("--json");
  const auto html = a.option("--report");
  predict_request req = parse_predict(a);
  const measured_routing routing = parse_routing(a, req);
  a.no_positionals();
  synth::predict_options opt;
  opt.program.unfold = req.unfold;
  const auto t0 = std::chrono::steady_clock::now();
  const synth::prediction r = run_model(req, opt);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string out;
  if (json) {
    report::predict_json(req.job, r, wall_ms, out, req.profile_name(), !routing.path.empty());
  } else {
    predict_text(req.job, r, wall_ms, out, req.roofline ? nullptr : &req.profile, !routing.path.empty());
    if (!routing.path.empty()) out += "  routing from  " + routing.path + ": " + routing.source + "\n";
  }
  if (html) {
    predict_report(req, *html);
    if (!json) out += "wrote " + *html + "\n";
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

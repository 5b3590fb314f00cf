#pragma once
// lumos sweep [model and GPU flags of predict] --gpus N [--tp LIST] ... — every configuration of
// a space, predicted on all cores (and across MPI ranks when started by mpirun or srun).
//
// stdout depends only on the arguments (no thread count, no timing): the same bytes for any
// --threads and any number of MPI processes. Timing and the progress bar go to stderr.

#include "cli.hpp"
#include "predict.hpp"

#include <lumos/cli/sweep.hpp>
#include <lumos/report/json/sweep.hpp>
#include <lumos/report/sweep_html.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>

#ifdef LUMOS_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace lumos::cli {

inline constexpr std::string_view sweep_usage =
    "usage: lumos sweep --gpus N [--model PRESET] [--layers N] [--hidden N] [--ffn N] [--heads N]\n"
    "                   [--kv-heads N] [--seq N] [--vocab N] [--experts N] [--top-k K]\n"
    "                   [--expert-ffn N] [--shared-experts N] [--moe-dispatcher {alltoall,allgather}]\n"
    "                   [--mtp-layers N] [--capacity-factor {F,dropless}] [--gpu PRESET] [--precision LIST]\n"
    "                   [--profile FILE] [--cost-model {kernel,roofline}] [--attention {flash,unfused}]\n"
    "                   [--tp LIST] [--pp LIST] [--cp LIST] [--cp-comm {p2p,allgather}] [--dp LIST]\n"
    "                   [--vp LIST] [--ep LIST] [--micro-batch LIST] [--pipeline-layout STR]\n"
    "                   [--schedule LIST] [--recompute LIST] [--sp LIST] [--tp-comm-overlap {on,off}]\n"
    "                   [--overlap-param-gather {on,off}] [--distributed-optimizer {on,off}]\n"
    "                   [--fsdp LIST] [--hsdp N] [--reshard-after-forward {on,off}] [--global-batch N]\n"
    "                   [--memory-margin F] [--top K] [--threads T] [--csv FILE] [--report FILE] [--json]\n"
    "  Enumerates every configuration of the lists whose sizes multiply to N GPUs, rejects those\n"
    "  that cannot run (divisibility of heads/vocab/ffn/seq by tp, layers by pp*vp, the global batch\n"
    "  by micro-batch*dp, schedule constraints, memory above HBM less the margin), predicts the\n"
    "  others as `lumos predict` does, and prints the K fastest with MFU, memory per GPU and bubble,\n"
    "  and the rejections counted per reason. LIST is comma-separated (e.g. --tp 1,2,4,8).\n"
    "  --gpus        the GPU count N (required)\n"
    "  --tp          default: powers of two up to min(N, GPUs per node)\n"
    "  --pp          default: powers of two up to min(N, layers)\n"
    "  --dp          default: N / (tp*pp*cp)\n"
    "  --vp          default 1;  --micro-batch default 1,2,4\n"
    "  --pipeline-layout  as for 'lumos predict': the configurations whose pp x vp is its count of\n"
    "                virtual stages take it, the others split the layers evenly\n"
    "  --decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers  refused (exit 2):\n"
    "                a sweep's stage counts vary, give a fixed --pipeline-layout instead\n"
    "  --cp          context-parallel sizes (default 1): each sequence is split over cp ranks\n"
    "                (world = TP x PP x CP x DP); a cp whose 2*cp chunks do not divide --seq is rejected\n"
    "  --cp-comm     p2p (default: ring attention) or allgather (all-gather of K and V), for every cp > 1\n"
    "  --ep          expert-parallel sizes of a MoE model (default 1); EP x expert TP divides\n"
    "                TP x CP x DP (--expert-tp, default each configuration's tp: then EP divides\n"
    "                DP x CP), and a value that does not is skipped\n"
    "  --schedule    gpipe, 1f1b, interleaved, zb-h1, zb-h2 (default 1f1b, and interleaved when a vp > 1)\n"
    "  --recompute   none, selective, full (default all three);  --sp off, on (default both)\n"
    "  --tp-comm-overlap  on: configurations with sp overlap their TP collectives with GEMMs, as\n"
    "                `lumos predict --tp-comm-overlap on` (default off)\n"
    "  --overlap-param-gather  on: the parameter all-gathers overlap the next iteration's first\n"
    "                forward pass, as `lumos predict --overlap-param-gather on` (default off)\n"
    "  --distributed-optimizer  on (default): the configurations without FSDP run Megatron's\n"
    "                distributed optimizer (ZeRO-1); off: DDP (gradients all-reduced, optimizer states\n"
    "                not sharded), as `lumos predict --distributed-optimizer off` (errors with --fsdp on\n"
    "                alone or --overlap-param-gather on)\n"
    "  --fsdp        off, on: fully sharded data parallelism (ZeRO-3) or not (the distributed optimizer,\n"
    "                or DDP; default off); --hsdp and --reshard-after-forward as for 'lumos predict', for\n"
    "                the configurations with FSDP (errors when --fsdp lists no on; a configuration\n"
    "                whose dp an --hsdp does not divide is rejected)\n"
    "  --precision   bf16, fp16, fp8: the training precisions searched (default bf16), ranked\n"
    "                together; a precision the GPU has no tensor cores for (fp8 on A100) is\n"
    "                rejected per configuration (reason precision) when another listed one runs,\n"
    "                and is an error (exit 2) when none does\n"
    "  --global-batch sequences per iteration (default 1536, GPT-3's)\n"
    "  --memory-margin fraction of HBM kept free for what the memory model leaves out (default 0.10)\n"
    "  --top K       rows of the ranking (default 10)\n"
    "  --threads T   worker threads (default: all cores; under MPI, the cores / processes per node)\n"
    "  --csv FILE    every configuration with its result or rejection reason;  --json  the whole\n"
    "                sweep as JSON on stdout instead of the table\n"
    "  --report FILE a self-contained HTML page: every predicted configuration plotted against its\n"
    "                memory per GPU, the Pareto front of time against memory, the K fastest with\n"
    "                their breakdowns, the rejections per reason\n"
    "  --model and the shape flags as for 'lumos predict'; its --unfold and --forward-only are\n"
    "  refused here (a sweep ranks whole training steps of folded programs)\n"
    "  MPI: built with LUMOS_WITH_MPI, `mpirun -np P lumos sweep ...` (or srun) splits the space in\n"
    "  blocks over the processes and gathers to rank 0, which alone writes; the output is the same\n"
    "  bytes as one process's.\n";

namespace detail {

inline std::string fixed(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// `text` as the whole content of file `path` (rank 0's outputs: CSV and HTML).
inline void write_text(const std::string& path, const std::string& text) { report::detail::write_plain(path, text); }

// An fsdp column only when the sweep has FSDP configurations (the others keep their columns).
inline void sweep_csv(const std::vector<sweep::result>& rs, std::string& out) {
  const bool fsdp_column = std::any_of(rs.begin(), rs.end(), [](const sweep::result& r) { return r.config.fsdp; });
  // Likewise a precision column only when the sweep has several precisions.
  const bool precision_column = sweep::precisions(rs).size() > 1;
  out += fsdp_column ? "index,tp,pp,dp,vp,micro_batch,schedule,recompute,sp,fsdp," : "index,tp,pp,dp,vp,micro_batch,schedule,recompute,sp,";
  if (precision_column) out += "precision,";
  out += "status,reason,micro_batches,iteration_ns,mfu,hfu,tokens_per_s,tflops_per_gpu,memory_bytes,memory_stage,bubble_fraction,message\n";
  char line[512];
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const sweep::result& r = rs[i];
    const sweep::configuration& c = r.config;
    std::string msg(r.why());
    for (char& ch : msg) {
      if (ch == '"') ch = '\'';
    }
    std::snprintf(line, sizeof line, "%zu,%d,%d,%d,%d,%lld,%s,%s,%s%s%s,%s,%s,%lld,", i, c.tp, c.pp, c.dp, c.vp,
                  static_cast<long long>(c.micro_batch), std::string(c.schedule.name).c_str(),
                  std::string(model::to_string(c.recompute)).c_str(), c.sp ? "on" : "off",
                  !fsdp_column ? "" : c.fsdp ? ",on" : ",off",
                  precision_column ? ("," + std::string(model::to_string(c.dtype))).c_str() : "", r.ok() ? "ok" : "rejected",
                  std::string(sweep::to_string(r.reason)).c_str(), static_cast<long long>(r.micro_batches));
    out += line;
    if (r.predicted) {
      std::snprintf(line, sizeof line, "%lld,%.9g,%.9g,%.9g,%.9g,", static_cast<long long>(r.m.iteration_ns), r.m.mfu,
                    r.m.hfu, r.m.tokens_per_s, r.m.model_tflops_per_gpu);
    } else {
      std::snprintf(line, sizeof line, ",,,,,");
    }
    out += line;
    if (r.memory_bytes > 0) {
      std::snprintf(line, sizeof line, "%.0f,%d,", r.memory_bytes, r.memory_stage);
    } else {
      std::snprintf(line, sizeof line, ",,");
    }
    out += line;
    out += r.predicted ? fixed("%.9g", r.m.bubble_fraction) : std::string();
    out += ",\"" + msg + "\"\n";
  }
}

}  // namespace detail

/// The table of a finished sweep, from the full, ordered results.
inline void sweep_text(const sweep_request& req, const std::vector<sweep::result>& rs, std::string& out) {
  const auto& j = req.base.job;
  const auto counts = sweep::count_reasons(rs);
  const auto best = sweep::top(rs, req.top);
  const std::string profile = req.base.profile_name();
  char line[512];
  auto put = [&](const char* fmt, auto... xs) {
    std::snprintf(line, sizeof line, fmt, xs...);
    out += line;
  };
  const std::vector<model::precision> precisions = sweep::precisions(rs);
  put("lumos sweep: %s on %lld x %s, %s, global batch %lld, profile %s\n", j.model.name.c_str(),
      static_cast<long long>(req.gpus), j.hardware.name.c_str(), sweep::precision_names(precisions, "/").c_str(),
      static_cast<long long>(req.global_batch), profile.c_str());
  put("  %zu configurations: %zu predicted, %zu rejected\n", rs.size(), counts[0], rs.size() - counts[0]);
  if (rs.size() > counts[0]) {
    out += "  rejected by reason:";
    for (std::size_t k = 1; k < counts.size(); ++k) {
      if (counts[k] > 0) put(" %s %zu,", std::string(sweep::to_string(sweep::all_rejections[k])).c_str(), counts[k]);
    }
    out.back() = '\n';
    put("  (memory: the largest per-GPU total above %.0f%% of %s HBM)\n", 100.0 * (1.0 - req.memory_margin),
        detail::bytes_text(static_cast<double>(j.hardware.gpu.hbm_capacity)).c_str());
  }
  if (best.empty()) {
    out += "  no configuration fits\n";
    return;
  }
  put("  top %zu by iteration time:\n", best.size());
  // An ep column only when the sweep varies expert parallelism (a dense model's table keeps its columns).
  const bool ep_column = std::any_of(best.begin(), best.end(), [&](std::size_t i) { return rs[i].config.ep != 1; });
  // Likewise a cp column only when the sweep varies context parallelism, and an fsdp column only
  // when the sweep has FSDP configurations.
  const bool cp_column = std::any_of(best.begin(), best.end(), [&](std::size_t i) { return rs[i].config.cp != 1; });
  const bool fsdp_column = std::any_of(rs.begin(), rs.end(), [](const sweep::result& r) { return r.config.fsdp; });
  const bool precision_column = precisions.size() > 1;
  auto narrow = [](int v) { return std::string(v < 10 ? "   " : v < 100 ? "  " : " ") + std::to_string(v); };
  put("  %4s %4s %4s%s %5s %3s%s %4s %-17s %-9s %-3s%s%s %12s %7s %11s %7s\n", "#", "tp", "pp", cp_column ? "   cp" : "", "dp", "vp",
      ep_column ? "  ep" : "", "mb", "schedule", "recompute", "sp", fsdp_column ? " fsdp" : "", precision_column ? " prec" : "",
      "iteration", "MFU", "memory/GPU", "bubble");
  for (std::size_t k = 0; k < best.size(); ++k) {
    const sweep::result& r = rs[best[k]];
    const sweep::configuration& c = r.config;
    std::string prec;
    if (precision_column) {
      prec = " " + std::string(model::to_string(c.dtype));
      prec.resize(5, ' ');
    }
    put("  %4zu %4d %4d%s %5d %3d%s %4lld %-17s %-9s %-3s%s%s %10.3f s %7s %11s %7s\n", k + 1, c.tp, c.pp,
        cp_column ? (" " + narrow(c.cp)).c_str() : "", c.dp, c.vp, ep_column ? narrow(c.ep).c_str() : "",
        static_cast<long long>(c.micro_batch), std::string(c.schedule.name).c_str(),
        std::string(model::to_string(c.recompute)).c_str(), c.sp ? "on" : "off", !fsdp_column ? "" : c.fsdp ? " on  " : " off ",
        prec.c_str(),
        static_cast<double>(r.m.iteration_ns) / 1e9, detail::pct(r.m.mfu).c_str(), detail::bytes_text(r.memory_bytes).c_str(),
        detail::pct(r.m.bubble_fraction).c_str());
  }
}

namespace detail {

// A progress bar on stderr (only when it is a terminal): done/total, rate and ETA.
struct progress_bar {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void operator()(std::size_t done, std::size_t total) const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
    constexpr int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * static_cast<double>(done) / static_cast<double>(total)) : width;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, ' ');
    std::fprintf(stderr, "\r  [%s] %zu/%zu  %.0f configs/s  ETA %.0f s   ", bar.c_str(), done, total, rate, eta);
    if (done == total) std::fputs("\n", stderr);
    std::fflush(stderr);
  }
};

// The MPI world this process belongs to (1 process when not built with MPI or not launched by
// mpirun/srun: a plain `lumos sweep` never initialises MPI).
struct mpi_world {
  int rank = 0;
  int size = 1;
  int local_size = 1;
  bool active = false;

  static bool launched() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
      if (std::getenv(v) != nullptr) return true;
    }
    return false;
  }
  mpi_world() {
#ifdef LUMOS_HAVE_MPI
    if (!launched()) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    active = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
#endif
  }
  mpi_world(const mpi_world&) = delete;
  mpi_world& operator=(const mpi_world&) = delete;
  ~mpi_world() {
#ifdef LUMOS_HAVE_MPI
    if (active) MPI_Finalize();
#endif
  }

  // Rank 0 receives every rank's results (in `owned_indices` order) and puts them at their
  // indices; the configurations are rank 0's own (results travel as bytes, and a schedule
  // policy's function pointers are only meaningful in the process that made them).
  std::vector<sweep::result> gather(std::vector<sweep::result> mine, const std::vector<sweep::configuration>& configs,
                                    std::size_t block) const {
    if (size == 1) return mine;
#ifdef LUMOS_HAVE_MPI
    std::vector<int> counts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(size));
    long long total = 0;
    for (int r = 0; r < size; ++r) {
      owned[static_cast<std::size_t>(r)] = sweep::owned_indices(configs.size(), r, size, block);
      const long long bytes = static_cast<long long>(owned[static_cast<std::size_t>(r)].size() * sizeof(sweep::result));
      if (total + bytes > 2147483647LL) throw lumos::error("sweep: the results exceed what one MPI gather carries (2 GiB)");
      counts[static_cast<std::size_t>(r)] = static_cast<int>(bytes);
      displs[static_cast<std::size_t>(r)] = static_cast<int>(total);
      total += bytes;
    }
    std::vector<sweep::result> all(rank == 0 ? configs.size() : 0);
    std::vector<sweep::result> packed(rank == 0 ? configs.size() : 0);
    MPI_Gatherv(mine.data(), static_cast<int>(mine.size() * sizeof(sweep::result)), MPI_BYTE, packed.data(),
                counts.data(), displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank != 0) return {};
    std::size_t at = 0;
    for (int r = 0; r < size; ++r) {
      for (const std::size_t i : owned[static_cast<std::size_t>(r)]) {
        all[i] = packed[at++];
        all[i].config = configs[i];
      }
    }
    return all;
#else
    (void)configs;
    (void)block;
    return mine;
#endif
  }
};

template <class Evaluator>
std::vector<sweep::result> run_sweep_with(const Evaluator& ev, const std::vector<sweep::configuration>& configs,
                                          const sweep_request& req, const mpi_world& world) {
  sweep::run_options o;
  o.rank = world.rank;
  o.ranks = world.size;
  o.threads = req.threads;
  if (o.threads == 0) {
    o.threads = std::max(1U, std::thread::hardware_concurrency() / static_cast<unsigned>(std::max(1, world.local_size)));
  }
  if (world.rank == 0 && stderr_is_terminal()) o.progress = progress_bar{};
  std::vector<sweep::result> mine = sweep::run(ev, configs, o);
  return world.gather(std::move(mine), configs, o.block);
}

}  // namespace detail

inline int run_sweep(args& a) {
  sweep_request req = parse_sweep(a);
  a.no_positionals();
  const sweep::problem p = sweep_problem(req);
  const std::vector<sweep::configuration> configs = sweep_configurations(req);

  detail::mpi_world world;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<sweep::result> results =
      with_sweep_evaluator(req, p, [&](const auto& ev) { return detail::run_sweep_with(ev, configs, req, world); });
  if (world.rank != 0) return 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string out;
  if (req.json) {
    report::sweep_json(p, req.base.profile_name(), results, req.top, out);
  } else {
    sweep_text(req, results, out);
  }
  write_stdout(out);
  if (!req.csv.empty()) {
    std::string csv;
    detail::sweep_csv(results, csv);
    detail::write_text(req.csv, csv);
  }
  if (!req.report.empty()) {
    report::sweep_html_options ho;
    ho.profile = req.base.profile_name();
    ho.top = req.top;
    detail::write_text(req.report, report::sweep_html(p, results, ho));
  }
  std::fprintf(stderr, "lumos sweep: %zu configurations in %.2f s (%.0f per second, %d process%s)\n", results.size(),
               wall, static_cast<double>(results.size()) / std::max(wall, 1e-9), world.size, world.size == 1 ? "" : "es");
  return 0;
}

}  // namespace lumos::cli

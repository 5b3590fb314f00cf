#pragma once
// lumos sweep [model and GPU flags of predict] --gpus N [--tp LIST] ... — every configuration of
// a space, predicted on all cores (and across MPI ranks when started by mpirun or srun).
//
// stdout depends only on the arguments (no thread count, no timing): the same bytes for any
// --threads and any number of MPI processes. Timing and the progress bar go to stderr.

#include "cli.hpp"
#include "predict.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>

#ifdef LUMOS_HAVE_MPI
#include <mpi.h>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace lumos::cli {

inline constexpr std::string_view sweep_usage =
    "usage: lumos sweep --gpus N [--model PRESET] [shape flags of predict] [--gpu PRESET] [--precision P]\n"
    "                   [--profile FILE] [--cost-model {kernel,roofline}] [--attention {flash,unfused}]\n"
    "                   [--tp LIST] [--pp LIST] [--dp LIST] [--vp LIST] [--micro-batch LIST]\n"
    "                   [--schedule LIST] [--recompute LIST] [--sp LIST] [--tp-comm-overlap {on,off}]\n"
    "                   [--overlap-param-gather {on,off}] [--global-batch N]\n"
    "                   [--memory-margin F] [--top K] [--threads T] [--csv FILE] [--json]\n"
    "  Enumerates every configuration of the lists whose sizes multiply to N GPUs, rejects those\n"
    "  that cannot run (divisibility of heads/vocab/ffn/seq by tp, layers by pp*vp, the global batch\n"
    "  by micro-batch*dp, schedule constraints, memory above HBM less the margin), predicts the\n"
    "  others as `lumos predict` does, and prints the K fastest with MFU, memory per GPU and bubble,\n"
    "  and the rejections counted per reason. LIST is comma-separated (e.g. --tp 1,2,4,8).\n"
    "  --gpus        the GPU count N (required)\n"
    "  --tp          default: powers of two up to min(N, GPUs per node)\n"
    "  --pp          default: powers of two up to min(N, layers)\n"
    "  --dp          default: N / (tp*pp)\n"
    "  --vp          default 1;  --micro-batch default 1,2,4\n"
    "  --schedule    gpipe, 1f1b, interleaved, zb-h1, zb-h2 (default 1f1b, and interleaved when a vp > 1)\n"
    "  --recompute   none, selective, full (default all three);  --sp off, on (default both)\n"
    "  --tp-comm-overlap  on: configurations with sp overlap their TP collectives with GEMMs, as\n"
    "                `lumos predict --tp-comm-overlap on` (default off)\n"
    "  --overlap-param-gather  on: the parameter all-gathers overlap the next iteration's first\n"
    "                forward pass, as `lumos predict --overlap-param-gather on` (default off)\n"
    "  --global-batch sequences per iteration (default 1536, GPT-3's)\n"
    "  --memory-margin fraction of HBM kept free for what the memory model leaves out (default 0.10)\n"
    "  --top K       rows of the ranking (default 10)\n"
    "  --threads T   worker threads (default: all cores; under MPI, the cores / processes per node)\n"
    "  --csv FILE    every configuration with its result or rejection reason;  --json  the whole\n"
    "                sweep as JSON on stdout instead of the table\n"
    "  MPI: built with LUMOS_WITH_MPI, `mpirun -np P lumos sweep ...` (or srun) splits the space in\n"
    "  blocks over the processes and gathers to rank 0, which alone writes; the output is the same\n"
    "  bytes as one process's.\n";

namespace detail {

inline std::vector<std::string> split_list(const std::string& text, std::string_view flag) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) throw usage_error(std::string(flag) + " has an empty item in '" + text + "'");
    out.push_back(std::move(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

inline std::string fixed(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace detail

/// Everything `lumos sweep` parsed.
struct sweep_request {
  predict_request base;  ///< model, hardware, precision, profile, cost model
  std::int64_t gpus = 0;
  sweep::space space;
  std::int64_t global_batch = 1536;
  double memory_margin = 0.10;
  std::size_t top = 10;
  unsigned threads = 0;
  std::string csv;
  bool json = false;
};

inline sweep_request parse_sweep(args& a) {
  sweep_request req;
  const auto gpus = a.option("--gpus");
  if (!gpus) throw usage_error("--gpus N is required");
  req.gpus = parse_number<std::int64_t>(*gpus, "--gpus");
  if (req.gpus < 1 || req.gpus > (std::int64_t{1} << 24)) throw usage_error("--gpus must be in [1, 2^24], got " + *gpus);
  if (a.flag("--unfold") || a.flag("--forward-only")) throw usage_error("--unfold and --forward-only are predict's only");
  sweep::space& s = req.space;
  // The list flags first: predict's parser would read them as single numbers.
  const auto tp = a.option("--tp");
  const auto pp = a.option("--pp");
  const auto dp = a.option("--dp");
  const auto vp = a.option("--vp");
  const auto mb = a.option("--micro-batch");
  const auto sched = a.option("--schedule");
  const auto rec = a.option("--recompute");
  const auto sp = a.option("--sp");
  const auto gb = a.option("--global-batch");
  const auto margin = a.option("--memory-margin");
  const auto top = a.option("--top");
  const auto threads = a.option("--threads");
  if (const auto f = a.option("--csv")) req.csv = *f;
  req.json = a.flag("--json");
  req.base = parse_predict(a);  // model, GPU, precision, profile, cost model flags

  auto numbers = [&](const std::optional<std::string>& v, std::string_view flag, std::vector<int> fallback) {
    if (!v) return fallback;
    std::vector<int> out;
    for (const std::string& item : detail::split_list(*v, flag)) {
      const int x = parse_number<int>(item, flag);
      if (x < 1 || x > (1 << 24)) throw usage_error(std::string(flag) + " values must be in [1, 2^24], got " + item);
      out.push_back(x);
    }
    return out;
  };
  const model::transformer& m = req.base.job.model;
  s.tp = numbers(tp, "--tp", sweep::powers_of_two(std::min<std::int64_t>(req.gpus, req.base.job.hardware.gpus_per_node)));
  s.pp = numbers(pp, "--pp", sweep::powers_of_two(std::min<std::int64_t>(req.gpus, m.layers)));
  s.dp = numbers(dp, "--dp", {});
  s.vp = numbers(vp, "--vp", {1});
  s.micro_batch.clear();
  for (const int x : numbers(mb, "--micro-batch", {1, 2, 4})) s.micro_batch.push_back(x);
  s.schedules.clear();
  if (sched) {
    for (const std::string& name : detail::split_list(*sched, "--schedule")) {
      s.schedules.push_back(synth::policy_of(synth::parse_schedule_name(name)));
    }
  } else {
    s.schedules.push_back(synth::policy_of(pipeline::schedule_kind::one_f_one_b));
    if (std::any_of(s.vp.begin(), s.vp.end(), [](int v) { return v > 1; })) {
      s.schedules.push_back(synth::policy_of(pipeline::schedule_kind::interleaved_one_f_one_b));
    }
  }
  s.recompute.clear();
  for (const std::string& r : detail::split_list(rec.value_or("none,selective,full"), "--recompute")) {
    if (r == "none") {
      s.recompute.push_back(model::recompute_kind::none);
    } else if (r == "selective") {
      s.recompute.push_back(model::recompute_kind::selective);
    } else if (r == "full") {
      s.recompute.push_back(model::recompute_kind::full);
    } else {
      throw usage_error("--recompute values must be none, selective or full, got '" + r + "'");
    }
  }
  s.sp.clear();
  for (const std::string& v : detail::split_list(sp.value_or("off,on"), "--sp")) {
    if (v != "on" && v != "off") throw usage_error("--sp values must be on or off, got '" + v + "'");
    s.sp.push_back(v == "on");
  }
  if (gb) {
    req.global_batch = parse_number<std::int64_t>(*gb, "--global-batch");
    if (req.global_batch < 1) throw usage_error("--global-batch must be positive, got " + *gb);
  }
  if (margin) {
    req.memory_margin = parse_number<double>(*margin, "--memory-margin");
    if (!(req.memory_margin >= 0 && req.memory_margin < 1)) throw usage_error("--memory-margin must be in [0, 1), got " + *margin);
  }
  if (top) {
    const auto k = parse_number<std::int64_t>(*top, "--top");
    if (k < 0) throw usage_error("--top must be non-negative, got " + *top);
    req.top = static_cast<std::size_t>(k);
  }
  if (threads) {
    const auto t = parse_number<std::int64_t>(*threads, "--threads");
    if (t < 1 || t > 4096) throw usage_error("--threads must be in [1, 4096], got " + *threads);
    req.threads = static_cast<unsigned>(t);
  }
  return req;
}

namespace detail {

inline void sweep_csv(const std::vector<sweep::result>& rs, std::string& out) {
  out += "index,tp,pp,dp,vp,micro_batch,schedule,recompute,sp,status,reason,micro_batches,iteration_ns,mfu,hfu,"
         "tokens_per_s,tflops_per_gpu,memory_bytes,memory_stage,bubble_fraction,message\n";
  char line[512];
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const sweep::result& r = rs[i];
    const sweep::configuration& c = r.config;
    std::string msg(r.why());
    for (char& ch : msg) {
      if (ch == '"') ch = '\'';
    }
    std::snprintf(line, sizeof line, "%zu,%d,%d,%d,%d,%lld,%s,%s,%s,%s,%s,%lld,", i, c.tp, c.pp, c.dp, c.vp,
                  static_cast<long long>(c.micro_batch), std::string(c.schedule.name).c_str(),
                  std::string(model::to_string(c.recompute)).c_str(), c.sp ? "on" : "off", r.ok() ? "ok" : "rejected",
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

inline void result_json(json_writer& w, std::size_t index, const sweep::result& r) {
  const sweep::configuration& c = r.config;
  w.begin_object();
  w.field("index", static_cast<std::int64_t>(index));
  w.field("tp", c.tp).field("pp", c.pp).field("dp", c.dp).field("vp", c.vp);
  w.field("micro_batch", c.micro_batch).field("schedule", std::string(c.schedule.name));
  w.field("recompute", std::string(model::to_string(c.recompute))).field("sp", c.sp);
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

}  // namespace detail

/// The report of a finished sweep (text or JSON), from the full, ordered results.
inline void sweep_report(const sweep_request& req, const std::vector<sweep::result>& rs, std::string& out) {
  const auto& j = req.base.job;
  const auto counts = sweep::count_reasons(rs);
  const auto best = sweep::top(rs, req.top);
  const std::string profile = req.base.roofline ? std::string("roofline") : req.base.profile.name;
  if (req.json) {
    json_writer w(out);
    w.begin_object();
    w.key("problem").begin_object();
    w.field("model", j.model.name).field("layers", j.model.layers).field("hidden", j.model.hidden);
    w.field("heads", j.model.heads).field("seq", j.model.seq).field("vocab", j.model.vocab);
    w.field("gpu", j.hardware.name).field("gpus", req.gpus).field("precision", model::to_string(j.parallel.dtype));
    w.field("global_batch", req.global_batch).field("memory_margin", req.memory_margin).field("profile", profile);
    w.field("hbm_bytes", static_cast<std::int64_t>(j.hardware.gpu.hbm_capacity));
    w.field("tp_comm_overlap", j.parallel.tp_comm_overlap).field("overlap_param_gather", j.parallel.overlap_param_gather);
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
    for (std::size_t i = 0; i < rs.size(); ++i) detail::result_json(w, i, rs[i]);
    w.end_array();
    w.end_object();
    out += '\n';
    return;
  }
  char line[512];
  auto put = [&](const char* fmt, auto... xs) {
    std::snprintf(line, sizeof line, fmt, xs...);
    out += line;
  };
  put("lumos sweep: %s on %lld x %s, %s, global batch %lld, profile %s\n", j.model.name.c_str(),
      static_cast<long long>(req.gpus), j.hardware.name.c_str(), std::string(model::to_string(j.parallel.dtype)).c_str(),
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
  put("  %4s %4s %4s %5s %3s %4s %-17s %-9s %-3s %12s %7s %11s %7s\n", "#", "tp", "pp", "dp", "vp", "mb", "schedule",
      "recompute", "sp", "iteration", "MFU", "memory/GPU", "bubble");
  for (std::size_t k = 0; k < best.size(); ++k) {
    const sweep::result& r = rs[best[k]];
    const sweep::configuration& c = r.config;
    put("  %4zu %4d %4d %5d %3d %4lld %-17s %-9s %-3s %10.3f s %7s %11s %7s\n", k + 1, c.tp, c.pp, c.dp, c.vp,
        static_cast<long long>(c.micro_batch), std::string(c.schedule.name).c_str(),
        std::string(model::to_string(c.recompute)).c_str(), c.sp ? "on" : "off",
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

/// The search problem of a request (model, machine, batch, memory margin).
inline sweep::problem sweep_problem(sweep_request& req) {
  sweep::problem p;
  p.model = req.base.job.model;
  p.hardware = req.base.job.hardware;
  p.dtype = req.base.job.parallel.dtype;
  p.tp_comm_overlap = req.base.job.parallel.tp_comm_overlap;
  p.overlap_param_gather = req.base.job.parallel.overlap_param_gather;
  p.gpus = req.gpus;
  p.global_batch = req.global_batch;
  p.memory_margin = req.memory_margin;
  if (!req.base.roofline) apply_profile(req.base, p.options.program);
  return p;
}

/// The configurations of the request's lists that multiply to its GPU count.
inline std::vector<sweep::configuration> sweep_configurations(const sweep_request& req) {
  std::vector<sweep::configuration> configs = sweep::enumerate(req.space, req.gpus);
  if (configs.empty()) throw usage_error("no configuration of the lists multiplies to " + std::to_string(req.gpus) + " GPUs");
  return configs;
}

/// Calls `run(evaluator)` with the evaluator of the request's cost model (`--cost-model`), so
/// that the CLI, MPI and the Python binding evaluate with the same models.
template <class Run>
auto with_sweep_evaluator(const sweep_request& req, const sweep::problem& p, Run&& run) {
  if (req.base.roofline) return run(sweep::evaluator<model::roofline, model::ring_alpha_beta>(p));
  return run(sweep::evaluator<>(p, model::kernel_level{req.base.profile}, model::nccl_model{req.base.profile}));
}

inline int run_sweep(args& a) {
  sweep_request req = parse_sweep(a);
  if (const auto rest = a.positionals(); !rest.empty()) throw usage_error("unexpected argument '" + rest.front() + "'");
  const sweep::problem p = sweep_problem(req);
  const std::vector<sweep::configuration> configs = sweep_configurations(req);

  detail::mpi_world world;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<sweep::result> results =
      with_sweep_evaluator(req, p, [&](const auto& ev) { return detail::run_sweep_with(ev, configs, req, world); });
  if (world.rank != 0) return 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string out;
  sweep_report(req, results, out);
  write_stdout(out);
  if (!req.csv.empty()) {
    std::string csv;
    detail::sweep_csv(results, csv);
    std::ofstream f(req.csv, std::ios::binary);
    if (!f || !f.write(csv.data(), static_cast<std::streamsize>(csv.size()))) {
      throw lumos::error("cannot write '" + req.csv + "'");
    }
  }
  std::fprintf(stderr, "lumos sweep: %zu configurations in %.2f s (%.0f per second, %d process%s)\n", results.size(),
               wall, static_cast<double>(results.size()) / std::max(wall, 1e-9), world.size, world.size == 1 ? "" : "es");
  return 0;
}

}  // namespace lumos::cli

#pragma once
// The sweep API: one configuration of a fixed problem (model, GPU, global batch) checked without
// simulation (`validate`) or predicted (`evaluate`), never throwing, with a per-thread
// `workspace` that keeps every large buffer between evaluations.
//
// Thread-safety (taskflow's split between a shared description and a per-thread executor): an
// `evaluator` is immutable after construction (model, hardware, cost models, options) and may be
// shared by any number of threads; a `workspace` belongs to one thread at a time. `evaluate(c, w)`
// is const on the evaluator and touches only `w`. The cost models are called through const
// references and keep no state (model/*: no mutable members, no statics).
//
// What one evaluation does: `validate` (constant-time divisibility rules, then the schedule's
// shape check and the memory of every stage from the schedule's stage orders), then the folded
// `pass`-granularity program of synth::predict emitted in compiled form into the workspace
// (synth::build_compiled_into: no task graph, no compile; the replay's timeline computed as the
// tasks are placed, and kept alone: compiled_parts::timeline), and the figures of synth::predict derived from that timeline by the
// function predict's replay_figures uses (synth::emitted_figures). With a warm workspace an
// evaluation allocates nothing.

#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/sim/replay.hpp>
#include <lumos/synth/compiled_program.hpp>
#include <lumos/synth/figures.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <new>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::sweep {

/// What a sweep varies: the parallel layout, the micro-batch, the pipeline schedule (any
/// `pipeline::PipelineSchedule`, as `synth::policy_of<S>()`), recomputation, sequence
/// parallelism, sharding and the training precision. Plain data.
struct configuration {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int vp = 1;
  int ep = 1;  ///< expert-parallel size (MoE models)
  int cp = 1;  ///< context-parallel size (ranks sharing each sequence)
  std::int64_t micro_batch = 1;
  synth::schedule_policy schedule = synth::policy_of<pipeline::one_f_one_b>();
  model::recompute_kind recompute = model::recompute_kind::none;
  bool sp = false;
  /// Fully sharded data parallelism over dp (`parallel_config::fsdp`, ZeRO stage 3) instead of
  /// the problem's ZeRO stage; its shard group and resharding are the problem's.
  bool fsdp = false;
  /// Training precision (`parallel_config::dtype`): bf16, fp16, or fp8 GEMMs in the layers. A
  /// precision the problem's GPU has no tensor cores for is rejected (`rejection::precision`).
  model::precision dtype = model::precision::bf16;

  [[nodiscard]] constexpr std::int64_t gpus() const noexcept { return std::int64_t{tp} * pp * cp * dp; }
  friend bool operator==(const configuration&, const configuration&) = default;
};

/// What a sweep keeps fixed. `memory_margin` is the fraction of HBM kept free for what the
/// memory model leaves out (CUDA context and library workspaces, NCCL buffers, allocator
/// fragmentation: see model::memory_breakdown): a configuration fits when its largest per-GPU
/// total is at most (1 − margin) × the GPU's HBM. 0.10 by default, about 8 GB on an 80 GB GPU.
struct problem {
  model::transformer model = model::gpt3_175b();
  model::hardware hardware = model::h100_sxm();
  std::int64_t global_batch = 1536;
  std::int64_t gpus = 0;  ///< 0: any; otherwise tp·pp·dp must equal it
  /// Of the configurations without FSDP: 1, Megatron's distributed optimizer (`lumos predict`'s
  /// default), or 0, DDP (`--distributed-optimizer off`: gradients all-reduced, states replicated).
  int zero_stage = 1;
  /// Overlap TP collectives with GEMMs (`parallel_config::tp_comm_overlap`) in the
  /// configurations with sequence parallelism; the others cannot.
  bool tp_comm_overlap = false;
  /// The distributed optimizer's parameter all-gathers overlap the next iteration's first
  /// forward pass (`parallel_config::overlap_param_gather`).
  bool overlap_param_gather = false;
  /// How the CP ranks exchange keys and values (`parallel_config::cp_comm`).
  model::cp_comm_kind cp_comm = model::cp_comm_kind::p2p;
  /// Expert-tensor-parallel size of every configuration (`parallel_config::etp`; 0 = its tp).
  int expert_tp = 0;
  /// For the configurations with FSDP: the shard group (`parallel_config::hsdp`, 0 = dp) and
  /// whether parameters are gathered again for the backward (`reshard_after_forward`).
  int hsdp = 0;
  bool reshard_after_forward = true;
  double memory_margin = 0.10;
  /// An explicit split of the layers (`parallel_config::layout`), taken by the configurations
  /// whose pp * vp is its virtual-stage count; the others split the layers evenly. Empty: none.
  model::pipeline_layout layout;
  /// The prediction's options. The sweep forces the folded `pass` program without collective
  /// records or names (what synth::predict uses by default, minus the names).
  /// `program.loss_scale_host_sync` takes effect in the fp16 configurations only: the host
  /// waits after the found-inf reduction, which only fp16 training runs.
  synth::predict_options options{};
};

/// Why a configuration was rejected. `none`: accepted (and predicted).
enum class rejection : std::uint8_t {
  none,
  gpu_count,      ///< tp·pp·dp differs from the GPU count
  sizes,          ///< a size below 1
  precision,      ///< the GPU has no tensor cores for the configuration's precision (fp8 on A100)
  tp_divisibility,     ///< heads, KV heads, ffn, vocabulary (or seq under sp) not divisible by tp
  layer_divisibility,  ///< layers not divisible by pp·vp
  batch_divisibility,  ///< global batch not divisible by micro-batch·dp
  schedule,       ///< the schedule cannot run the shape (chunks without interleaving, m vs p, ...)
  memory,         ///< the largest per-GPU memory exceeds HBM less the margin
  error,          ///< anything else the builder or the models refused (message says what)
};

inline constexpr std::array<rejection, 10> all_rejections = {
    rejection::none, rejection::gpu_count, rejection::sizes, rejection::precision, rejection::tp_divisibility, rejection::layer_divisibility,
    rejection::batch_divisibility, rejection::schedule, rejection::memory, rejection::error};

/// Machine name of a reason ("ok", "gpu-count", ...), as CSV and JSON write it.
[[nodiscard]] constexpr std::string_view to_string(rejection r) noexcept {
  switch (r) {
    case rejection::none: return "ok";
    case rejection::gpu_count: return "gpu-count";
    case rejection::sizes: return "sizes";
    case rejection::precision: return "precision";
    case rejection::tp_divisibility: return "tp-divisibility";
    case rejection::layer_divisibility: return "layer-divisibility";
    case rejection::batch_divisibility: return "batch-divisibility";
    case rejection::schedule: return "schedule";
    case rejection::memory: return "memory";
    case rejection::error: return "error";
  }
  return "?";
}

/// The figures of one predicted configuration (those of synth::prediction a sweep ranks by).
struct metrics {
  time_ns iteration_ns = 0;
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;
  double mfu = 0;
  double hfu = 0;
  double bubble_fraction = 0;
  time_ns pipeline_ns = 0;
  report::breakdown breakdown;  ///< rank 0, transfers as communication (synth::prediction::breakdown)
  time_ns breakdown_window_ns = 0;
  std::int64_t tasks = 0;
};

/// The outcome of `validate` or `evaluate`: accepted or the reason, a one-line message, the
/// memory of the largest GPU (known for every configuration that reaches the memory check) and,
/// after `evaluate`, the prediction. Trivially copyable, fixed size: no allocation to return it.
struct result {
  configuration config;
  rejection reason = rejection::none;
  std::array<char, 200> message{};  ///< NUL-terminated; empty when accepted
  std::int64_t micro_batches = 0;   ///< per pipeline per iteration (0 before the batch check)
  double memory_bytes = 0;          ///< the largest per-GPU total (0 before the memory check)
  int memory_stage = 0;
  double in_flight_microbatches = 0;
  bool predicted = false;  ///< `evaluate` ran the simulation
  metrics m;

  [[nodiscard]] bool ok() const noexcept { return reason == rejection::none; }
  [[nodiscard]] std::string_view why() const noexcept { return std::string_view(message.data()); }
};
static_assert(std::is_trivially_copyable_v<result>, "results travel between MPI ranks as bytes");

namespace detail {

/// The stage orders of schedules per shape, with each stage's activation peak
/// (synth::in_flight_microbatches), for the configurations that share them (every
/// recomputation, sp setting and micro-batch count of a layout). A schedule gives its orders
/// as new vectors (PipelineSchedule::stage_ops); a warm cache gives them without allocating.
/// Holds at most `max_ops` ops (12 bytes each), then starts over.
class order_cache {
 public:
  struct entry {
    std::vector<std::vector<pipeline::op>> orders;  ///< per stage
    std::vector<double> in_flight;                  ///< per stage
  };
  static constexpr std::size_t max_ops = std::size_t{1} << 22;

  /// The orders of `policy` on `shape` (validated by the caller).
  const entry& get(const synth::schedule_policy& policy, const pipeline::schedule_shape& shape) {
    const key k{policy.orders, shape};
    if (const auto it = index_.find(k); it != index_.end()) return entries_[it->second];
    entry e;
    e.orders = policy.orders(shape);
    std::size_t ops = 0;
    for (const auto& o : e.orders) {
      e.in_flight.push_back(synth::in_flight_microbatches(o, shape.chunks, policy.splits_backward));
      ops += o.size();
    }
    if (ops_ + ops > max_ops) {
      index_.clear();
      entries_.clear();
      ops_ = 0;
    }
    ops_ += ops;
    entries_.push_back(std::move(e));
    index_.emplace(k, entries_.size() - 1);
    return entries_.back();
  }

 private:
  using orders_fn = std::vector<std::vector<pipeline::op>> (*)(const pipeline::schedule_shape&);
  struct key {
    orders_fn orders;
    pipeline::schedule_shape shape;
    friend bool operator==(const key&, const key&) = default;
  };
  struct hash {
    std::size_t operator()(const key& k) const noexcept {
      const auto mix = [](std::size_t h, std::int32_t v) { return h * 1000003U ^ std::hash<std::int32_t>{}(v); };
      return mix(mix(mix(0, k.shape.stages), k.shape.micro_batches), k.shape.chunks);
    }
  };
  std::unordered_map<key, std::size_t, hash> index_;
  std::deque<entry> entries_;  // references stay valid as entries are added
  std::size_t ops_ = 0;
};

}  // namespace detail

/// Buffers of one thread's evaluations: the stage orders per shape, the job, the compiled
/// program's timeline and the builder's working memory, the figures' intervals, and a replay
/// engine for callers that replay programs of their own (`evaluate` does not need one).
/// Reused: after the first evaluations of the largest configuration, nothing is allocated.
/// Not thread-safe: one per thread. Default-constructible, movable.
struct workspace {
  detail::order_cache orders;
  synth::job job;
  synth::compiled_program program;
  synth::program_buffers buffers;
  sim::replay_engine engine;
  synth::figure_buffers figures;
};

namespace detail {

// printf into the fixed message buffer (truncates; never allocates).
[[gnu::format(printf, 2, 3)]] inline void say(result& r, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(r.message.data(), r.message.size(), fmt, ap);
  va_end(ap);
}

inline void say_what(result& r, rejection why, const char* what) {
  r.reason = why;
  say(r, "%s", what);
}

}  // namespace detail

/// Predicts configurations of one `problem` with the compute model `Compute` and the
/// communication model `Comm` (the kernel-level model and NCCL by default, as `lumos predict`).
/// Construction validates the fixed part (model shape, ZeRO stage, batch, margin) and throws
/// `lumos::error` if it is invalid; after that nothing throws (a configuration in a precision
/// the GPU lacks is a rejection). Thread-safety: see the
/// header comment (share the evaluator, one workspace per thread).
template <model::ComputeModel Compute = model::kernel_level, model::CommModel Comm = model::nccl_model>
class evaluator {
 public:
  evaluator(problem p, Compute compute = {}, Comm comm = {})
      : problem_(std::move(p)), compute_(std::move(compute)), comm_(std::move(comm)) {
    problem_.model.validate();
    if (problem_.zero_stage < 0 || problem_.zero_stage > 3) throw error("zero_stage must be 0, 1, 2 or 3");
    if (problem_.global_batch < 1) throw error("the global batch must be positive");
    if (!(problem_.memory_margin >= 0 && problem_.memory_margin < 1)) throw error("the memory margin must be in [0, 1)");
    problem_.options.program.unfold = false;
    problem_.options.program.detail = synth::granularity::pass;
    problem_.options.program.record_collectives = false;
    problem_.options.program.names = false;
  }

  [[nodiscard]] const problem& fixed() const noexcept { return problem_; }
  [[nodiscard]] const Compute& compute_model() const noexcept { return compute_; }
  [[nodiscard]] const Comm& comm_model() const noexcept { return comm_; }

  /// The job `c` stands for (model, hardware, parallel configuration, schedule).
  [[nodiscard]] synth::job job_of(const configuration& c) const {
    synth::job j;
    job_into(c, j);
    return j;
  }
  /// `job_of` into `j`, whose strings keep their capacity.
  void job_into(const configuration& c, synth::job& j) const {
    j.model = problem_.model;
    j.hardware = problem_.hardware;
    j.parallel = parallel_of(c);
    j.schedule = c.schedule;
  }

  /// The divisibility rules, constant time, no allocation: the checks of
  /// model::parallel_config::validate and of the program builder, as reasons instead of throws.
  [[nodiscard]] result check_shape(const configuration& c) const noexcept {
    result r;
    r.config = c;
    const model::transformer& m = problem_.model;
    if (!problem_.hardware.supports(c.dtype)) {
      r.reason = rejection::precision;
      const std::string_view name = model::to_string(c.dtype);
      detail::say(r, "the %s has no %.*s tensor cores", problem_.hardware.name.c_str(), static_cast<int>(name.size()), name.data());
      return r;
    }
    if (c.tp < 1 || c.pp < 1 || c.dp < 1 || c.vp < 1 || c.cp < 1 || c.micro_batch < 1) {
      detail::say(r, "sizes must be at least 1 (tp %d, pp %d, dp %d, vp %d, micro-batch %lld)", c.tp, c.pp, c.dp, c.vp,
                  static_cast<long long>(c.micro_batch));
      r.reason = rejection::sizes;
      return r;
    }
    if (problem_.gpus > 0 && c.gpus() != problem_.gpus) {
      r.reason = rejection::gpu_count;
      detail::say(r, c.cp > 1 ? "tp*pp*cp*dp = %lld, not the %lld GPUs" : "tp*pp*dp = %lld, not the %lld GPUs",
                  static_cast<long long>(c.gpus()), static_cast<long long>(problem_.gpus));
      return r;
    }
    if (c.gpus() > (std::int64_t{1} << 24)) {
      r.reason = rejection::sizes;
      detail::say(r, "world size %lld is beyond what lumos models (2^24 ranks)", static_cast<long long>(c.gpus()));
      return r;
    }
    const auto not_divisible = [&](std::int64_t v, const char* field) {
      r.reason = rejection::tp_divisibility;
      detail::say(r, "%s (%lld) is not divisible by tp (%d)", field, static_cast<long long>(v), c.tp);
      return r;
    };
    if (m.heads % c.tp != 0) return not_divisible(m.heads, "heads");
    if (m.kv_heads % c.tp != 0) return not_divisible(m.kv_heads, "kv_heads");
    if (m.ffn % c.tp != 0) return not_divisible(m.ffn, "ffn");
    if (m.vocab % c.tp != 0) return not_divisible(m.vocab, "vocab");
    if (c.sp && c.tp > 1 && m.seq % c.tp != 0) return not_divisible(m.seq, "seq (sequence parallelism)");
    if (c.cp > 1 && m.seq % (2 * std::int64_t{c.cp}) != 0) {
      r.reason = rejection::sizes;
      detail::say(r, "seq (%lld) is not divisible by 2*cp (%lld): causal load balancing splits each sequence into 2*cp chunks",
                  static_cast<long long>(m.seq), 2 * static_cast<long long>(c.cp));
      return r;
    }
    if (c.ep != 1 || m.is_moe()) {
      // The expert-parallel rules (parallel_config::validate_experts), as a reason.
      try {
        parallel_of(c).validate_experts(m);
      } catch (const std::exception& e) {
        r.reason = rejection::sizes;
        detail::say(r, "%s", e.what());
        return r;
      }
    }
    if (c.vp > 1 && c.pp == 1) {
      r.reason = rejection::schedule;
      detail::say(r, "vp = %d virtual chunks need pipeline parallelism (pp > 1)", c.vp);
      return r;
    }
    const std::int64_t chunks = std::int64_t{c.pp} * c.vp;
    if (takes_layout(c)) {
      try {
        parallel_of(c).validate_layout(m);
      } catch (const std::exception& e) {
        r.reason = rejection::layer_divisibility;
        detail::say(r, "%s", e.what());
        return r;
      }
    } else if (m.blocks() % chunks != 0 && (chunks == 1 || (m.blocks() + 2) % chunks != 0)) {
      // Megatron's split with the embedding and the loss counted as layers (parallel_config::embedding_loss_in_split).
      r.reason = rejection::layer_divisibility;
      detail::say(r, m.mtp_layers > 0 ? "layers (%lld with the multi-token-prediction blocks) are not divisible by pp*vp (%lld)"
                                      : "layers (%lld) are not divisible by pp*vp (%lld)",
                  static_cast<long long>(m.blocks()), static_cast<long long>(chunks));
      return r;
    }
    const std::int64_t per_step = c.micro_batch * c.dp;
    if (problem_.global_batch % per_step != 0) {
      r.reason = rejection::batch_divisibility;
      detail::say(r, "global batch (%lld) is not divisible by micro-batch*dp (%lld)",
                  static_cast<long long>(problem_.global_batch), static_cast<long long>(per_step));
      return r;
    }
    r.micro_batches = problem_.global_batch / per_step;
    if (r.micro_batches > model::max_micro_batches) {
      r.reason = rejection::batch_divisibility;
      detail::say(r, "too many micro-batches per pipeline (%lld, more than the %lld lumos builds an iteration of)",
                  static_cast<long long>(r.micro_batches), static_cast<long long>(model::max_micro_batches));
      return r;
    }
    if (c.vp > 1 && !c.schedule.supports_chunks) {
      r.reason = rejection::schedule;
      detail::say(r, "vp = %d model chunks need the interleaved schedule, not %.*s", c.vp,
                  static_cast<int>(c.schedule.name.size()), c.schedule.name.data());
      return r;
    }
    return r;
  }

  /// Checks `c` without simulating it: the divisibility rules, the schedule's shape check and
  /// the memory of every stage (activations held at the schedule's peak, from its stage orders)
  /// against HBM less the margin. Never throws (out of memory is reported as a rejection).
  /// Allocates the stage orders; `validate(c, w)` reuses a workspace's.
  [[nodiscard]] result validate(const configuration& c) const noexcept {
    workspace w;
    return validate(c, w);
  }
  [[nodiscard]] result validate(const configuration& c, workspace& w) const noexcept {
    result r = check_shape(c);
    if (!r.ok()) return r;
    try {
      (void)check_schedule_and_memory(r, w);
    } catch (const std::exception& e) {
      detail::say_what(r, rejection::error, e.what());
    }
    return r;
  }

  /// Validates, then predicts `c` with `w`'s buffers. Never throws: a configuration the models
  /// or the builder refuse, or an out-of-memory, comes back as a rejection with its message.
  [[nodiscard]] result evaluate(const configuration& c, workspace& w) const noexcept {
    result r = check_shape(c);
    if (!r.ok()) return r;
    try {
      const detail::order_cache::entry* orders = check_schedule_and_memory(r, w);
      if (!r.ok()) return r;
      simulate(r, w, *orders);
    } catch (const std::exception& e) {
      detail::say_what(r, rejection::error, e.what());
      r.predicted = false;
    }
    return r;
  }

  /// `evaluate` with a fresh workspace (allocates: use the overload in loops).
  [[nodiscard]] result evaluate(const configuration& c) const noexcept {
    try {
      workspace w;
      return evaluate(c, w);
    } catch (const std::bad_alloc&) {
      result r;
      r.config = c;
      detail::say_what(r, rejection::error, "out of memory");
      return r;
    }
  }

 private:
  problem problem_;
  Compute compute_;
  Comm comm_;

  [[nodiscard]] bool takes_layout(const configuration& c) const noexcept {
    return !problem_.layout.empty() && std::int64_t{c.pp} * c.vp == problem_.layout.virtual_stages();
  }

  [[nodiscard]] model::parallel_config parallel_of(const configuration& c) const {
    model::parallel_config p;
    if (takes_layout(c)) p.layout = problem_.layout;
    p.tp = c.tp;
    p.pp = c.pp;
    p.dp = c.dp;
    p.cp = c.cp;
    p.cp_comm = problem_.cp_comm;
    p.vp = c.vp;
    p.ep = c.ep;
    p.etp = problem_.expert_tp;
    p.sp = c.sp;
    p.tp_comm_overlap = problem_.tp_comm_overlap && c.sp;
    p.overlap_param_gather = problem_.overlap_param_gather;
    p.micro_batch = c.micro_batch;
    p.global_batch = problem_.global_batch;
    p.recompute = c.recompute;
    p.dtype = c.dtype;
    p.zero_stage = c.fsdp ? 3 : problem_.zero_stage;
    p.fsdp = c.fsdp;
    p.hsdp = c.fsdp ? problem_.hsdp : 0;
    p.reshard_after_forward = problem_.reshard_after_forward;
    return p;
  }

  // The schedule's own check (it throws: caught here as a reason), its stage orders from the
  // workspace, and the largest per-GPU memory as synth::predict computes it. Returns the
  // orders, or null for a schedule that refuses the shape.
  const detail::order_cache::entry* check_schedule_and_memory(result& r, workspace& w) const {
    const configuration& c = r.config;
    const pipeline::schedule_shape shape{c.pp, static_cast<std::int32_t>(r.micro_batches), c.vp};
    try {
      c.schedule.validate(shape);
    } catch (const error& e) {
      detail::say_what(r, rejection::schedule, e.what());
      return nullptr;
    }
    const detail::order_cache::entry& orders = w.orders.get(c.schedule, shape);
    const model::parallel_config par = parallel_of(c);
    model::memory_options mo;
    mo.flash_attention = problem_.options.flash_attention;
    mo.per_param = problem_.options.state;
    double worst = -1;
    for (int s = 0; s < c.pp; ++s) {
      mo.in_flight_microbatches = orders.in_flight[static_cast<std::size_t>(s)];
      const double total = model::memory_per_gpu(problem_.model, par, s, mo).total();
      if (total > worst) {  // the first stage of the largest, as synth::predict picks it
        worst = total;
        r.memory_stage = s;
        r.in_flight_microbatches = mo.in_flight_microbatches;
      }
    }
    r.memory_bytes = worst;
    const double usable = (1.0 - problem_.memory_margin) * static_cast<double>(problem_.hardware.gpu.hbm_capacity);
    if (worst > usable) {
      r.reason = rejection::memory;
      detail::say(r, "%.1f GiB per GPU (stage %d) exceeds %.1f GiB (HBM less %.0f%% margin)", worst / 1073741824.0,
                  r.memory_stage, usable / 1073741824.0, 100.0 * problem_.memory_margin);
    }
    return &orders;
  }

  void simulate(result& r, workspace& w, const detail::order_cache::entry& orders) const {
    const configuration& c = r.config;
    job_into(c, w.job);
    synth::build_compiled_into(w.program, w.buffers, w.job, problem_.options.program, compute_, comm_, &orders.orders,
                               synth::compiled_parts::timeline);
    const synth::timeline_figures f = synth::emitted_figures(w.program, w.figures);
    const time_ns makespan = f.iteration_ns;

    const model::transformer& m = problem_.model;
    const std::int64_t gpus = c.gpus();
    metrics& x = r.m;
    x.iteration_ns = makespan;
    x.tokens_per_s = model::tokens_per_second(m, problem_.global_batch, makespan);
    const double model_flops = model::model_flops(m, problem_.global_batch);
    const double hardware_flops = model::hardware_flops(m, problem_.global_batch, c.recompute);
    const double peak = problem_.hardware.peak_flops(c.dtype);
    x.model_tflops_per_gpu = model::tflops_per_gpu(model_flops, makespan, gpus);
    x.mfu = model::utilisation(model_flops, makespan, gpus, peak);
    x.hfu = model::utilisation(hardware_flops, makespan, gpus, peak);
    x.pipeline_ns = f.pipeline_ns;
    x.bubble_fraction = f.bubble_fraction;
    x.breakdown = f.breakdown;
    x.breakdown_window_ns = f.breakdown_window_ns;
    x.tasks = static_cast<std::int64_t>(w.program.task_count());
    r.predicted = true;
  }
};

/// The evaluator `lumos predict` corresponds to: kernel-level compute model and NCCL from one
/// cost profile (with the profile's host-side options applied to the program, as the CLI does;
/// the loss-scale host sync for the fp16 configurations).
[[nodiscard]] inline evaluator<> make_evaluator(problem p, const model::cost_profile& profile) {
  synth::program_options& o = p.options.program;
  o.collective_cpu = static_cast<time_ns>(profile.cpu_collective_ns);
  o.launch_cost = static_cast<time_ns>(profile.cpu_launch_ns);
  o.p2p_host_sync = profile.cpu_p2p_sync > 0;
  o.loss_scale_host_sync = profile.cpu_loss_scale_sync > 0;
  return evaluator<>(std::move(p), model::kernel_level{profile}, model::nccl_model{profile});
}

}  // namespace lumos::sweep

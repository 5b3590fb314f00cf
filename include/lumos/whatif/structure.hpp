#pragma once
// Structure discovery: what a job's traces say about its iteration, phases, micro-batches,
// pipeline stages and schedule, transformer layers, process groups and model shape — each fact
// with what it was inferred from, or unknown with the flag that supplies it. The rules are in
// docs/whatif.md, section "Structure discovery".

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/zero_bubble.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/summary.hpp>
#include <lumos/whatif/detail/periodicity.hpp>
#include <lumos/whatif/detail/shapes.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// One discovered fact: its value, or none; `source` says what it was inferred from (or, when
/// unknown, why); `flag` names the command-line option that supplies it. Discovery never fills
/// a value it did not read from the traces or from the user.
template <class T>
struct fact {
  std::optional<T> value;
  std::string source;
  std::string flag;

  [[nodiscard]] bool known() const noexcept { return value.has_value(); }
};

/// Phase of a launch within an iteration.
enum class phase_kind : std::uint8_t { forward, backward, optimizer, other };

[[nodiscard]] constexpr std::string_view to_string(phase_kind p) noexcept {
  switch (p) {
    case phase_kind::forward: return "forward";
    case phase_kind::backward: return "backward";
    case phase_kind::optimizer: return "optimizer";
    case phase_kind::other: return "other";
  }
  return "?";
}

/// What a process group is used for.
enum class group_role : std::uint8_t { world, tp, dp, pp, ep };

[[nodiscard]] constexpr std::string_view to_string(group_role r) noexcept {
  switch (r) {
    case group_role::world: return "world";
    case group_role::tp: return "TP";
    case group_role::dp: return "DP";
    case group_role::pp: return "PP";
    case group_role::ep: return "EP";
  }
  return "?";
}

/// The GPU work of one phase of a rank's iteration (job time, ns).
struct phase_span {
  phase_kind kind = phase_kind::forward;
  time_ns start = 0, end = 0;  ///< first launch call → last GPU op end
  std::size_t gpu_ops = 0;
  std::string source;  ///< the annotations / op names that marked it
  bool marked = false;  ///< annotations or ops marked it (else: launches under no marker, taken as forward)
};

/// One forward or backward pass over one micro-batch (and model chunk) on one rank.
struct pass_info {
  pipeline::op op;             ///< kind, micro-batch, chunk (from the recognised schedule, else in order)
  time_ns start = 0, end = 0;  ///< job time
  std::size_t gpu_ops = 0;
  fact<int> layers;            ///< transformer layers seen in this pass
};

/// Everything discovered about one rank.
struct rank_structure {
  int rank = 0;
  fact<std::string> iteration;  ///< "ProfilerStep#3", or the whole trace window
  time_ns iteration_start = 0, iteration_end = 0;  ///< job time
  std::vector<phase_span> phases;
  std::vector<pass_info> passes;  ///< in execution order
  fact<int> stage;                ///< pipeline stage
  std::vector<int> p2p_partners;  ///< ranks it sends to / receives from
  fact<int> layers_per_pass;      ///< layers in one forward pass (one chunk)
};

/// A process group as seen from its collectives.
struct process_group {
  std::string name;         ///< Process Group Name, or "world" when matched by order without args
  std::string description;  ///< Process Group Description, when recorded
  std::vector<int> ranks;   ///< from Process Group Ranks, else the participants seen
  fact<int> size;
  std::vector<std::pair<std::string, std::size_t>> collectives;  ///< "allreduce in forward" → count per iteration (max over ranks)
  std::vector<fact<group_role>> roles;  ///< each role with why
};

/// How data-parallel gradients are reduced.
struct gradient_reduction {
  fact<std::string> method;  ///< "all-reduce" or "reduce-scatter + all-gather"
  fact<int> buckets;         ///< collectives per iteration on one rank
  fact<std::vector<std::int64_t>> bucket_elements;  ///< message size of each, in elements
};

/// The parallel layout of the job.
struct parallel_layout {
  fact<int> world, tp, pp, dp, ep;
  fact<pipeline::schedule_kind> schedule;
  fact<int> chunks;         ///< model chunks per stage (interleaved 1F1B), 1 otherwise
  fact<int> micro_batches;  ///< per iteration per pipeline
};

/// The transformer's shape (full model, TP division undone where TP is known).
struct model_shape {
  fact<int> layers;
  fact<std::int64_t> hidden, ffn, heads, head_dim, seq, micro_batch_size;
  /// Key/value heads (fewer than the heads under grouped-query attention): from the width the
  /// QKV GEMMs write beyond the queries.
  fact<std::int64_t> kv_heads;
  fact<std::string> dtype;
  bool gated_mlp = false;  ///< FC1 writes twice the FFN width (gate and up: SwiGLU, Llama's layer)
  /// `gated_mlp` as shown: "gated (gate and up projections)" or "not gated", with where it was read.
  fact<std::string> mlp;
  /// A GPU op of the first forward pass is named dropout (GPT-style training; Llama's has none):
  /// the masks of the layers' dropout count in the activation memory. Known when the pass's
  /// launches were read.
  bool has_dropout = false;
  fact<std::string> dropout;  ///< `has_dropout` as shown, with the op it was read from
};

/// The graph tasks of layer `layer` in one pass on one rank: the CPU launch calls and the GPU
/// tasks (kernels, copies; arrive + complete of communication) they launched. The what-if
/// rewrites duplicate, remove or rescale these groups. CPU operators are not tasks of the graph
/// (their time is the busy gap of the next launch), so they travel with their launch calls.
struct layer_task_group {
  int rank = 0;
  int layer = 0;  ///< index in the model's order within the chunk (backward: same numbering)
  pipeline::op op;
  std::vector<graph::task_id> tasks;
};

/// The launch context of one GPU op of the iteration, as the sweep over the CPU threads saw it:
/// what the model-shape rewrites (shape.hpp) read to rescale each op.
struct gpu_op_context {
  std::size_t rank = 0;                  ///< index into job.ranks
  std::uint32_t op = ~std::uint32_t{0};  ///< event index of the GPU op
  std::uint32_t shape_op = ~std::uint32_t{0};  ///< innermost enclosing GEMM/attention operator (event index), or none
  /// Outermost enclosing CPU operator (event index), or none: in backward the autograd node
  /// ("autograd::engine::evaluate_function: EmbeddingBackward0"), whatever ATen op launched it.
  std::uint32_t cpu_op = ~std::uint32_t{0};
  phase_kind phase = phase_kind::other;
  int pass = -1, layer = -1;  ///< index into the rank's passes, layer within it (-1: outside both)
  bool comm = false, p2p = false;
};

/// What `discover_structure` found.
struct job_structure {
  parallel_layout parallel;
  model_shape model;
  gradient_reduction gradients;
  std::vector<rank_structure> ranks;  ///< same order as job.ranks
  std::vector<process_group> groups;
  std::vector<layer_task_group> layer_groups;
  std::vector<gpu_op_context> gpu_ops;  ///< every GPU op launched in the iteration, per rank in launch order
  fact<std::string> layers_method;  ///< "module annotations" / "kernel periodicity"
  std::vector<std::string> notes;   ///< ambiguities, conflicts, overrides
};

/// The stage of a `pp_new`-stage pipeline that traced stage `s` of `pp_old` stands for when the
/// depth changes: the first stays first and the last stays last (they hold the embedding, the
/// head and the tied embedding's all-reduce, which end the iteration), a middle stage keeps its
/// relative position (rounded, and never onto an end it was not).
[[nodiscard]] constexpr int traced_stage_to(int s, int pp_old, int pp_new) noexcept {
  if (pp_old == pp_new) return s;
  if (s <= 0 || pp_new <= 1) return 0;
  if (s >= pp_old - 1) return pp_new - 1;
  const int m = (2 * s * (pp_new - 1) + (pp_old - 1)) / (2 * (pp_old - 1));
  return pp_new > 2 ? std::clamp(m, 1, pp_new - 2) : m;
}

/// User-supplied facts (each overrides what the trace says, with a note when they differ) and
/// tunables of the discovery.
struct structure_options {
  std::optional<int> step;  ///< ProfilerStep#N (default: the largest number on every rank)
  std::optional<int> layers, tp, pp, dp, chunks;
  std::optional<std::int64_t> hidden, ffn, heads, seq, micro_batch_size;
  std::optional<pipeline::schedule_kind> schedule;
  /// Names of CPU annotations / module scopes that delimit one transformer layer (substrings).
  std::vector<std::string> layer_scopes = {"TransformerLayer", "DecoderLayer", "EncoderLayer", "TransformerBlock"};
  std::size_t min_period = 4;     ///< fewest GPU ops in a layer found by periodicity
  std::size_t max_period = 1024;  ///< most GPU ops in a layer found by periodicity
};

namespace detail {

/// A Group size arg as a group size: 1 to 2^24 ranks; anything else (a corrupt or hostile trace:
/// negative, or 2^40, which as an int is 0) is no size at all.
[[nodiscard]] inline std::optional<int> group_size_of(std::int64_t arg) noexcept {
  if (arg < 1 || arg > (std::int64_t{1} << 24)) return std::nullopt;
  return static_cast<int>(arg);
}

inline constexpr std::uint32_t no_event = ~std::uint32_t{0};

/// What a traced point-to-point op is, by the CPU operator that posted it (`cpu_op`, an event
/// index; c10d names it `nccl:send` / `nccl:recv`): 1 a send, -1 a receive, 0 neither (or both: a
/// batched transfer).
[[nodiscard]] inline int transfer_side(const trace::rank_trace& tr, std::uint32_t cpu_op) {
  if (cpu_op == no_event) return 0;
  const std::string op = lower_ascii(tr.name(tr.events[cpu_op]));
  const bool recv = op.find("recv") != std::string::npos, send = op.find("send") != std::string::npos;
  return send == recv ? 0 : send ? 1 : -1;
}

[[nodiscard]] inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// The phase an enclosing CPU event marks, if any (see docs/whatif.md).
[[nodiscard]] inline std::optional<phase_kind> phase_marker(std::string_view name) {
  if (name.starts_with("ProfilerStep#")) return std::nullopt;
  const std::string l = lower(name);
  if (l.find("backward") != std::string::npos || l.starts_with("autograd::engine::evaluate_function")) return phase_kind::backward;
  if (l.find("zero_grad") != std::string::npos) return phase_kind::other;
  if (name.starts_with("Optimizer.step") || l.find("## optimizer ##") != std::string::npos) return phase_kind::optimizer;
  if (l.find("forward") != std::string::npos) return phase_kind::forward;
  return std::nullopt;
}

/// Where the args of a rank's communication kernels are: on the kernel itself (newer PyTorch
/// writes `Collective name`, `Process Group Name`... there) or on the `record_param_comms`
/// operator that launched it, found by its External id. `of(op)` is the event to read them from.
class comm_args_source {
 public:
  explicit comm_args_source(const trace::rank_trace& t) : t_(t) {
    for (std::uint32_t i = 0; i < t.events.size(); ++i) {
      const trace::event& e = t.events[i];
      if (e.cat == trace::category::cpu_op && e.external_id >= 0 && has_args(i)) by_external_.try_emplace(e.external_id, i);
    }
  }
  [[nodiscard]] std::uint32_t of(std::uint32_t op) const {
    if (has_args(op)) return op;
    const auto it = by_external_.find(t_.events[op].external_id);
    return it != by_external_.end() ? it->second : op;
  }

 private:
  [[nodiscard]] bool has_args(std::uint32_t i) const {
    return t_.arg(i, trace::arg_key::collective_name) || t_.arg(i, trace::arg_key::process_group_name);
  }
  const trace::rank_trace& t_;
  std::unordered_map<std::int64_t, std::uint32_t> by_external_;  // the first operator per External id
};

/// Collective kind of a communication op from its `Collective name` arg or its kernel name.
[[nodiscard]] inline std::string comm_kind(std::string_view kernel, std::string_view arg) {
  std::string s = lower(arg);
  std::erase(s, '_');
  if (s == "alltoall" || s == "alltoallbase" || s == "alltoallv") return "alltoall";
  if (s == "send" || s == "recv" || s == "sendrecv" || s == "coalesced") return "sendrecv";
  if (!s.empty()) return s;
  const std::string k = lower(kernel);
  for (std::string_view kind : {"allreduce", "allgather", "reducescatter", "sendrecv", "broadcast", "alltoall", "reduce"}) {
    std::string pat = std::string(kind);
    if (k.find(pat) != std::string::npos) return pat;
  }
  if (k.find("all_reduce") != std::string::npos) return "allreduce";
  if (k.find("all_gather") != std::string::npos) return "allgather";
  return "comm";
}

[[nodiscard]] inline std::string dtype_of_kernel(std::string_view name) {
  const std::string l = lower(name);
  if (l.find("bf16") != std::string::npos || l.find("bfloat16") != std::string::npos) return "bf16";
  if (l.find("e4m3") != std::string::npos || l.find("e5m2") != std::string::npos || l.find("fp8") != std::string::npos) return "fp8";
  // cuBLAS writes fp16 as "f16" (sm90_xmma_gemm_f16f16_…) or "fp16" (ampere_fp16_s16816gemm_fp16_…).
  if (l.find("f16") != std::string::npos || l.find("fp16") != std::string::npos || l.find("half") != std::string::npos ||
      l.find("h1688") != std::string::npos) {
    return "fp16";
  }
  if (l.find("tf32") != std::string::npos) return "tf32";
  if (l.find("f32") != std::string::npos || l.find("sgemm") != std::string::npos || l.find("float") != std::string::npos) return "fp32";
  return {};
}

[[nodiscard]] inline bool is_gemm_kernel(std::string_view name) {
  const std::string l = lower(name);
  return l.find("gemm") != std::string::npos || l.find("xmma") != std::string::npos || l.find("nvjet") != std::string::npos ||
         l.find("cutlass") != std::string::npos;
}

[[nodiscard]] inline bool is_attention_kernel(std::string_view name) {
  const std::string l = lower(name);
  return l.find("softmax") != std::string::npos || l.find("flash") != std::string::npos || l.find("fmha") != std::string::npos ||
         l.find("attention") != std::string::npos || l.find("attn") != std::string::npos;
}

[[nodiscard]] inline std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// One GPU op of a rank, in launch order, with what its launching CPU context says.
struct launch_rec {
  std::uint32_t op = no_event;
  std::uint32_t call = no_event;   // runtime call, when recorded
  time_ns enqueue = 0;             // trace time of the call (or of the op)
  phase_kind phase = phase_kind::other;
  bool marked = false;             // phase from an enclosing marker (else the default)
  bool comm = false, p2p = false;
  std::int64_t scope = -1;         // outermost enclosing layer-scope event
  std::uint32_t shape_op = no_event;  // innermost enclosing GEMM / attention operator
  std::uint32_t cpu_op = no_event;    // outermost enclosing CPU operator
  std::uint32_t pass_marker = no_event;  // outermost enclosing user annotation that marks a phase
  int pass = -1, layer = -1;
  int instance = -1;               // graph collective instance
};

struct rank_work {
  std::vector<launch_rec> launches;
  std::map<phase_kind, std::set<std::string>> markers;  // phase → marker names that set it
  std::vector<std::vector<std::size_t>> pass_launches;  // per pass: indices into launches
};

// Passes of one rank from its launches in enqueue order: runs of forward or backward launches,
// a new pass at each change of kind and after a point-to-point transfer that followed compute;
// with `by_marker` also where the outermost user annotation that marks the phase changes. Sets
// each launch's `pass` (−1: in none) and, per pass, its launches and its span (`offset`: the
// rank's clock offset); micro-batches in order (the k-th forward, the k-th backward).
inline void form_passes(std::vector<launch_rec>& launches, const trace::rank_trace& t, time_ns offset, bool by_marker,
                        std::vector<pass_info>& passes, std::vector<std::vector<std::size_t>>& pass_launches) {
  passes.clear(), pass_launches.clear();
  int cur = -1;
  bool split = false, has_compute = false;
  std::uint32_t cur_marker = no_event;
  for (std::size_t li = 0; li < launches.size(); ++li) {
    auto& l = launches[li];
    l.pass = -1;
    if (l.p2p) {
      if (cur >= 0 && has_compute) split = true;
      continue;
    }
    if (l.phase == phase_kind::optimizer) {
      cur = -1;
      continue;
    }
    if (l.phase != phase_kind::forward && l.phase != phase_kind::backward) continue;
    const auto kind = l.phase == phase_kind::forward ? pipeline::op_kind::forward : pipeline::op_kind::backward;
    const bool new_marker = by_marker && l.pass_marker != no_event && cur_marker != no_event && l.pass_marker != cur_marker;
    if (l.pass_marker != no_event) cur_marker = l.pass_marker;
    if (cur < 0 || split || new_marker || passes[static_cast<std::size_t>(cur)].op.kind != kind) {
      pass_info p;
      p.op.kind = kind;
      p.start = l.enqueue + offset;
      passes.push_back(p);
      pass_launches.emplace_back();
      cur = static_cast<int>(passes.size()) - 1;
      split = false;
      has_compute = false;
    }
    has_compute = has_compute || !l.comm;
    l.pass = cur;
    pass_launches[static_cast<std::size_t>(cur)].push_back(li);
    auto& p = passes[static_cast<std::size_t>(cur)];
    ++p.gpu_ops;
    p.end = std::max(p.end, t.events[l.op].end() + offset);
  }
  int nf = 0, nb = 0;
  for (auto& p : passes) p.op.micro_batch = p.op.kind == pipeline::op_kind::forward ? nf++ : nb++;
}

}  // namespace detail

/// Discovers the structure of `job` from its traces and the graph built from them (`built`
/// must come from `graph::build_graph(job)`: task ids in the result index its graph).
/// Throws `lumos::error` only for inconsistent input (a graph of another job); everything the
/// traces do not say is reported as unknown with its flag. Linear in events, plus
/// O(ops per pass × max_period) for periodicity.
[[nodiscard]] inline job_structure discover_structure(const trace::job& job, const graph::built_job& built,
                                                      const structure_options& options = {}) {
  using detail::no_event;
  if (built.ranks.size() != job.ranks.size()) throw error("discover_structure: the graph was built from another job");
  const graph::task_graph& g = built.graph;
  job_structure out;
  const std::size_t nr = job.ranks.size();
  out.ranks.resize(nr);
  std::vector<detail::rank_work> work(nr);

  // Graph collective of each (rank index, op event), for participants and p2p pairs.
  std::map<int, std::size_t> index_of_rank;
  for (std::size_t i = 0; i < nr; ++i) index_of_rank[job.ranks[i].rank] = i;
  std::map<std::pair<std::size_t, std::uint32_t>, int> instance_of;
  for (std::size_t c = 0; c < g.collectives.size(); ++c) {
    for (const graph::task_id t : g.collectives[c].complete) {
      const auto it = index_of_rank.find(g.rank[t]);
      if (it != index_of_rank.end()) instance_of[{it->second, g.source[t]}] = static_cast<int>(c);
    }
  }
  auto participants = [&](int c) {
    std::vector<int> ranks;
    for (const graph::task_id t : g.collectives[static_cast<std::size_t>(c)].arrive) ranks.push_back(g.rank[t]);
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  };
  auto is_p2p = [&](int c) {
    const auto& ci = g.collectives[static_cast<std::size_t>(c)];
    return (ci.kind == "sendrecv" || ci.kind == "send" || ci.kind == "recv") && ci.arrive.size() == 2;
  };

  // ---- iteration window -------------------------------------------------------------------
  std::optional<int> chosen = options.step;
  if (!chosen) {
    for (const auto& r : job.ranks) {
      const auto steps = trace::profiler_steps(r);
      if (steps.empty()) continue;
      int best = std::numeric_limits<int>::min();
      for (const auto& s : steps) best = std::max(best, s.number);
      chosen = chosen ? std::min(*chosen, best) : best;
    }
  }

  // Per rank: its passes split also where the annotation that marks their phase changes.
  struct marked_split {
    std::vector<pass_info> passes;
    std::vector<std::vector<std::size_t>> pass_launches;
    std::vector<int> pass_of;  // per launch
  };
  std::vector<marked_split> marked_passes(nr);
  for (std::size_t ri = 0; ri < nr; ++ri) {
    const trace::rank_trace& t = job.ranks[ri];
    const graph::rank_map& map = built.ranks[ri];
    rank_structure& rs = out.ranks[ri];
    detail::rank_work& w = work[ri];
    rs.rank = t.rank;
    const auto steps = trace::profiler_steps(t);
    time_ns win_begin = std::numeric_limits<time_ns>::min(), win_end = std::numeric_limits<time_ns>::max();
    if (!steps.empty()) {
      const auto it = std::find_if(steps.begin(), steps.end(), [&](const auto& s) { return chosen && s.number == *chosen; });
      if (it == steps.end()) {
        throw error(t.file + ": no ProfilerStep#" + std::to_string(chosen.value_or(-1)) + " (the trace has " + steps.front().name +
                    " to " + steps.back().name + ")");
      }
      win_begin = it->start, win_end = it->start + it->dur;
      rs.iteration.value = it->name;
      rs.iteration.source = "ProfilerStep annotation" + std::string(options.step ? " (--step)" : " (the last one every rank has)");
    } else {
      rs.iteration.value = "whole trace window";
      rs.iteration.source = "no ProfilerStep#N annotation in the trace";
    }
    rs.iteration.flag = "--step";

    // ---- launch contexts: a sweep over each CPU thread with a stack of enclosing events ----
    std::unordered_map<std::int64_t, std::vector<std::uint32_t>> ops_by_corr;
    std::map<std::uint32_t, std::vector<std::uint32_t>> lanes;
    for (std::uint32_t i = 0; i < t.events.size(); ++i) {
      const trace::event& e = t.events[i];
      if (e.ph != trace::phase::complete) continue;
      if (trace::is_gpu_op(e.cat)) {
        if (e.correlation >= 0) ops_by_corr[e.correlation].push_back(i);
      } else if (trace::is_cpu_side(e.cat)) {
        lanes[e.lane].push_back(i);
      }
    }
    struct open_event {
      time_ns end;
      std::uint32_t index;
      std::optional<phase_kind> marker;
      bool scope, shape;
    };
    std::vector<detail::launch_rec> launches;
    std::vector<std::uint8_t> launched(t.events.size(), 0);
    for (auto& [lane, evs] : lanes) {
      std::sort(evs.begin(), evs.end(), [&](std::uint32_t a, std::uint32_t b) {
        const auto& x = t.events[a];
        const auto& y = t.events[b];
        if (x.ts != y.ts) return x.ts < y.ts;
        if (x.dur != y.dur) return x.dur > y.dur;
        return a < b;
      });
      std::vector<open_event> stack;
      for (const std::uint32_t i : evs) {
        const trace::event& e = t.events[i];
        while (!stack.empty() && stack.back().end <= e.ts) stack.pop_back();
        const bool runtime = e.cat == trace::category::cuda_runtime || e.cat == trace::category::cuda_driver;
        if (runtime) {
          const auto it = ops_by_corr.find(e.correlation);
          if (it == ops_by_corr.end() || e.correlation < 0) continue;
          detail::launch_rec base;
          base.call = i;
          base.enqueue = e.ts;
          for (auto s = stack.rbegin(); s != stack.rend(); ++s) {
            if (s->marker && !base.marked) {
              base.phase = *s->marker, base.marked = true;
              w.markers[*s->marker].insert(std::string(t.name(t.events[s->index])));
            }
            if (s->marker && t.events[s->index].cat == trace::category::user_annotation) base.pass_marker = s->index;
            if (s->shape && base.shape_op == no_event) base.shape_op = s->index;
            if (t.events[s->index].cat == trace::category::cpu_op) base.cpu_op = s->index;  // the last is the outermost
          }
          for (const auto& s : stack) {
            if (s.scope) {
              base.scope = s.index;
              break;
            }
          }
          for (const std::uint32_t o : it->second) {
            detail::launch_rec l = base;
            l.op = o;
            launched[o] = 1;
            launches.push_back(l);
          }
          continue;
        }
        const std::string_view name = t.name(e);
        bool scope = false;
        for (const auto& pat : options.layer_scopes) scope = scope || (!pat.empty() && name.find(pat) != std::string_view::npos);
        stack.push_back({e.end(), i, detail::phase_marker(name), scope, detail::is_shape_op(name)});
      }
    }
    // GPU ops launched before the recording window: no call, no context.
    for (std::uint32_t i = 0; i < t.events.size(); ++i) {
      const trace::event& e = t.events[i];
      if (e.ph == trace::phase::complete && trace::is_gpu_op(e.cat) && !launched[i]) {
        detail::launch_rec l;
        l.op = i;
        l.enqueue = e.ts;
        launches.push_back(l);
      }
    }
    std::erase_if(launches, [&](const detail::launch_rec& l) { return l.enqueue < win_begin || l.enqueue >= win_end; });
    std::sort(launches.begin(), launches.end(), [&](const auto& a, const auto& b) {
      return a.enqueue != b.enqueue ? a.enqueue < b.enqueue : a.op < b.op;
    });
    const bool any_forward_marker = std::any_of(launches.begin(), launches.end(),
                                                [](const auto& l) { return l.marked && l.phase == phase_kind::forward; });
    const trace::default_comm_classifier is_comm;
    for (auto& l : launches) {
      // Unmarked launches are forward when nothing marks the forward pass (Megatron, inference);
      // with explicit forward markers they are outside the passes (data loading, zero_grad).
      if (!l.marked) l.phase = any_forward_marker ? phase_kind::other : phase_kind::forward;
      l.comm = is_comm(t, l.op);
      if (const auto it = instance_of.find({ri, l.op}); it != instance_of.end()) {
        l.instance = it->second;
        l.p2p = is_p2p(it->second);
      }
    }
    if (!launches.empty()) {
      rs.iteration_start = launches.front().enqueue + map.offset;
      rs.iteration_end = rs.iteration_start;
    }
    if (!steps.empty()) rs.iteration_start = win_begin + map.offset, rs.iteration_end = win_end + map.offset;

    // ---- phases -------------------------------------------------------------------------
    for (const phase_kind k : {phase_kind::forward, phase_kind::backward, phase_kind::optimizer}) {
      phase_span span;
      span.kind = k;
      span.start = std::numeric_limits<time_ns>::max();
      span.end = std::numeric_limits<time_ns>::min();
      for (const auto& l : launches) {
        if (l.phase != k) continue;
        ++span.gpu_ops;
        span.start = std::min(span.start, l.enqueue + map.offset);
        span.end = std::max(span.end, t.events[l.op].end() + map.offset);
      }
      if (span.gpu_ops == 0) continue;
      const auto& names = w.markers[k];
      span.marked = !names.empty();
      if (names.empty()) {
        span.source = "launches under no forward/backward/optimizer annotation or op";
      } else {
        span.source = "launches under ";
        std::size_t n = 0;
        for (const auto& nm : names) {
          if (n++ == 3) {
            span.source += ", ... (" + std::to_string(names.size()) + " names)";
            break;
          }
          span.source += (n > 1 ? ", '" : "'") + nm.substr(0, 60) + "'";
        }
      }
      rs.phases.push_back(std::move(span));
    }

    // ---- passes: runs of forward or backward launches, split at point-to-point transfers ----
    // (and, the alternative below, where the annotation that marks their phase changes)
    detail::form_passes(launches, t, map.offset, false, rs.passes, w.pass_launches);
    detail::form_passes(launches, t, map.offset, true, marked_passes[ri].passes, marked_passes[ri].pass_launches);
    marked_passes[ri].pass_of.resize(launches.size());
    for (std::size_t li = 0; li < launches.size(); ++li) marked_passes[ri].pass_of[li] = launches[li].pass;
    for (std::size_t k = 0; k < w.pass_launches.size(); ++k) {
      for (const std::size_t li : w.pass_launches[k]) launches[li].pass = static_cast<int>(k);
    }
    w.launches = std::move(launches);
  }
  // A zero-bubble schedule's B and the W right after it (no transfer between them on stage 0)
  // are one run of backward launches: when that leaves the ranks with different numbers of
  // passes, and a script marked each pass (as `lumos synth` does), the passes split where the
  // marking annotation changes are taken if every rank then runs two backward passes per
  // forward one. Not by default: a job written by a what-if keeps the traced markers at their
  // traced times, which need not bracket its passes.
  {
    auto counts = [](const std::vector<pass_info>& passes) {
      std::pair<std::size_t, std::size_t> fb{0, 0};
      for (const auto& p : passes) (p.op.kind == pipeline::op_kind::forward ? fb.first : fb.second) += 1;
      return fb;
    };
    bool coarse_alike = true, marked_zero_bubble = nr > 0;
    for (std::size_t ri = 0; ri < nr; ++ri) {
      coarse_alike = coarse_alike && counts(out.ranks[ri].passes) == counts(out.ranks[0].passes);
      const auto fb = counts(marked_passes[ri].passes);
      marked_zero_bubble = marked_zero_bubble && fb == counts(marked_passes[0].passes) && fb.first > 0 && fb.second == 2 * fb.first;
    }
    if (!coarse_alike && marked_zero_bubble) {
      for (std::size_t ri = 0; ri < nr; ++ri) {
        out.ranks[ri].passes = std::move(marked_passes[ri].passes);
        work[ri].pass_launches = std::move(marked_passes[ri].pass_launches);
        for (std::size_t li = 0; li < work[ri].launches.size(); ++li) work[ri].launches[li].pass = marked_passes[ri].pass_of[li];
      }
      out.notes.push_back("passes split where the annotation that marks their phase changes: every rank then runs two backward "
                          "passes (B and W) per forward pass");
    }
  }

  // ---- transformer layers per pass --------------------------------------------------------
  bool by_annotation = false, by_period = false;
  std::string period_example;
  for (std::size_t ri = 0; ri < nr; ++ri) {
    const trace::rank_trace& t = job.ranks[ri];
    auto& rs = out.ranks[ri];
    auto& w = work[ri];
    // The launches of a pass that can repeat per layer: communication on another stream than the
    // pass's compute (data-parallel gradient buckets launched between layers, ZeRO prefetches)
    // is left out, or it would break the period of the layers it sits between.
    auto periodic = [&](const std::vector<std::size_t>& idx) {
      std::map<std::int64_t, std::size_t> compute_streams;
      for (const std::size_t li : idx) {
        if (!w.launches[li].comm) ++compute_streams[t.events[w.launches[li].op].stream];
      }
      std::int64_t main_stream = -1;
      std::size_t most = 0;
      for (const auto& [st, n] : compute_streams) {
        if (n > most) most = n, main_stream = st;
      }
      std::vector<std::size_t> kept;
      kept.reserve(idx.size());
      for (const std::size_t li : idx) {
        if (w.launches[li].comm && most > 0 && t.events[w.launches[li].op].stream != main_stream) continue;
        kept.push_back(li);
      }
      return kept;
    };
    // The block of `ids`' kernel names repeated back to back (`times` times when given).
    auto period_of = [&](const std::vector<std::size_t>& ids, std::size_t times) {
      std::vector<std::uint32_t> seq;
      seq.reserve(ids.size());
      for (const std::size_t li : ids) seq.push_back(t.events[w.launches[li].op].name);
      return detail::find_period(seq, options.min_period, std::min(options.max_period, seq.size() / 2), times);
    };
    auto has_attention = [&](const std::vector<std::size_t>& ids, const detail::periodic_run& run) {
      bool attention = false;
      for (std::size_t k = run.start; run.found() && k < run.start + run.period; ++k) {
        const auto& l = w.launches[ids[k]];
        attention = attention || detail::is_attention_kernel(t.name(t.events[l.op]));
        if (l.shape_op != no_event) {
          const auto gs = detail::gemm_of(t.name(t.events[l.shape_op]),
                                          detail::parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)));
          attention = attention || (gs && (gs->kind == detail::gemm_shape::role::attention ||
                                           (gs->kind == detail::gemm_shape::role::batched && gs->m == gs->n)));
        }
      }
      return attention;
    };
    std::optional<int> forward_layers;
    for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
      auto& p = rs.passes[pi];
      auto& idx = w.pass_launches[pi];
      if (p.op.kind != pipeline::op_kind::forward) continue;
      std::vector<std::int64_t> scopes;
      for (const std::size_t li : idx) {
        const auto s = w.launches[li].scope;
        if (s >= 0 && std::find(scopes.begin(), scopes.end(), s) == scopes.end()) scopes.push_back(s);
      }
      if (!scopes.empty()) {
        for (const std::size_t li : idx) {
          auto& l = w.launches[li];
          if (l.scope >= 0) l.layer = static_cast<int>(std::find(scopes.begin(), scopes.end(), l.scope) - scopes.begin());
        }
        p.layers.value = static_cast<int>(scopes.size());
        p.layers.source = "'" + std::string(t.name(t.events[static_cast<std::size_t>(scopes.front())])).substr(0, 60) +
                          "' scopes enclosing the launches";
        by_annotation = true;
      } else {
        // Every launch first; then without the communication on other streams, which can break
        // the period (gradient buckets) but is per-layer in some traces (a TP all-reduce stream).
        std::vector<std::size_t> kept = idx;
        auto run = period_of(kept, 0);
        bool attention = has_attention(kept, run);
        if (!(run.found() && attention)) {
          std::vector<std::size_t> alt = periodic(idx);
          const auto alt_run = alt.size() != kept.size() ? period_of(alt, 0) : detail::periodic_run{};
          if (alt_run.found() && has_attention(alt, alt_run)) kept = std::move(alt), run = alt_run, attention = true;
        }
        const std::size_t seq_size = kept.size();
        if (run.found() && attention) {
          for (std::size_t k = run.start; k < run.start + run.covered(); ++k) {
            w.launches[kept[k]].layer = static_cast<int>((k - run.start) / run.period);
          }
          p.layers.value = static_cast<int>(run.repetitions);
          p.layers.source = "a block of " + std::to_string(run.period) + " GPU ops (with attention) repeated " +
                            std::to_string(run.repetitions) + " times from op " + std::to_string(run.start) + " of " +
                            std::to_string(seq_size) + " in the pass";
          by_period = true;
          if (period_example.empty()) period_example = "rank " + std::to_string(rs.rank) + ": " + p.layers.source;
        } else if (run.found()) {
          p.layers.value = 0;
          p.layers.source = "no layer annotations; the longest repeating block (" + std::to_string(run.period) + " ops × " +
                            std::to_string(run.repetitions) + ") has no attention op or kernel: no transformer layers";
        } else {
          p.layers.value = 0;
          p.layers.source = "no layer annotations and no repeating block of at least " + std::to_string(options.min_period) +
                            " GPU ops: no transformer layers";
        }
      }
      p.layers.flag = "--layers";
      if (forward_layers && p.layers.value && *forward_layers != *p.layers.value) {
        out.notes.push_back("rank " + std::to_string(rs.rank) + ": forward passes disagree on the layer count (" +
                            std::to_string(*forward_layers) + " and " + std::to_string(*p.layers.value) + ")");
      }
      if (!forward_layers) forward_layers = p.layers.value;
    }
    if (forward_layers) {
      rs.layers_per_pass.value = *forward_layers;
      rs.layers_per_pass.source = rs.passes.empty() ? "" : std::find_if(rs.passes.begin(), rs.passes.end(), [](const auto& p) {
                                                             return p.op.kind == pipeline::op_kind::forward;
                                                           })->layers.source;
    } else {
      rs.layers_per_pass.source = "no forward pass found in the iteration";
    }
    rs.layers_per_pass.flag = "--layers";
    // Backward passes: the same number of blocks, in reverse layer order.
    if (forward_layers && *forward_layers > 0) {
      const auto L = static_cast<std::size_t>(*forward_layers);
      for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
        auto& p = rs.passes[pi];
        if (p.op.kind != pipeline::op_kind::backward) continue;
        std::vector<std::size_t> idx = w.pass_launches[pi];
        auto run = period_of(idx, L);
        if (!run.found()) {
          std::vector<std::size_t> alt = periodic(idx);
          const auto alt_run = alt.size() != idx.size() ? period_of(alt, L) : detail::periodic_run{};
          if (alt_run.found()) idx = std::move(alt), run = alt_run;
        }
        p.layers.flag = "--layers";
        if (!run.found()) {
          p.layers.source = "no block repeated " + std::to_string(L) + " times in the backward pass: its layers are not delimited";
          continue;
        }
        run.start = detail::align_by_duration(run, [&](std::size_t k) { return t.events[w.launches[idx[k]].op].dur; });
        for (std::size_t k = run.start; k < run.start + run.covered(); ++k) {
          w.launches[idx[k]].layer = static_cast<int>(L - 1 - (k - run.start) / run.period);
        }
        p.layers.value = static_cast<int>(L);
        p.layers.source = "a block of " + std::to_string(run.period) + " GPU ops repeated " + std::to_string(L) + " times (reverse order)";
      }
    }
  }
  out.layers_method.flag = "--layers";
  if (by_annotation) {
    out.layers_method.value = "module annotations";
    out.layers_method.source = "record_function / nn.Module scopes matching";
    for (const auto& s : options.layer_scopes) out.layers_method.source += " '" + s + "'";
  } else if (by_period) {
    out.layers_method.value = "kernel periodicity";
    out.layers_method.source = period_example;
  } else {
    out.layers_method.source = "no layer annotations and no repeating block with attention in any forward pass";
  }

  // ---- pipeline stages from point-to-point partners ----------------------------------------
  std::map<int, std::set<int>> partners;
  for (std::size_t c = 0; c < g.collectives.size(); ++c) {
    if (!is_p2p(static_cast<int>(c))) continue;
    const auto ranks = participants(static_cast<int>(c));
    partners[ranks[0]].insert(ranks[1]);
    partners[ranks[1]].insert(ranks[0]);
  }
  // Unmatched point-to-point ops (peers absent) leave the pipeline undetermined.
  std::set<int> unmatched_p2p;
  for (std::size_t ri = 0; ri < nr; ++ri) {
    for (const auto& l : work[ri].launches) {
      if (l.comm && l.instance < 0 &&
          detail::comm_kind(job.ranks[ri].name(job.ranks[ri].events[l.op]),
                            job.ranks[ri].arg_text(l.op, trace::arg_key::collective_name)) == "sendrecv") {
        unmatched_p2p.insert(job.ranks[ri].rank);
      }
    }
  }
  for (std::size_t ri = 0; ri < nr; ++ri) {
    auto& rs = out.ranks[ri];
    if (const auto it = partners.find(rs.rank); it != partners.end()) rs.p2p_partners.assign(it->second.begin(), it->second.end());
    rs.stage.flag = "--pp";
  }
  // Components of the partner graph: each is one pipeline (a TP slice of one DP replica).
  std::set<int> seen;
  std::vector<std::vector<int>> pipelines;  // ranks in stage order
  bool topology_ring = false, topology_chain = false;
  auto first_p2p_after_forward = [&](std::size_t ri) {
    // Stage 0 computes its first forward before any transfer; every other stage receives first.
    for (const auto& l : work[ri].launches) {
      if (l.p2p) return false;
      if (l.pass >= 0 && out.ranks[ri].passes[static_cast<std::size_t>(l.pass)].op.kind == pipeline::op_kind::forward && !l.comm)
        return true;
    }
    return false;
  };
  auto first_partner = [&](std::size_t ri) -> int {
    for (const auto& l : work[ri].launches) {
      if (!l.p2p) continue;
      for (const int r : participants(l.instance)) {
        if (r != job.ranks[ri].rank) return r;
      }
    }
    return -1;
  };
  for (const auto& [r0, nbrs] : partners) {
    if (seen.count(r0)) continue;
    std::vector<int> comp;
    std::vector<int> todo = {r0};
    seen.insert(r0);
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      comp.push_back(r);
      for (const int n : partners[r]) {
        if (seen.insert(n).second) todo.push_back(n);
      }
    }
    std::sort(comp.begin(), comp.end());
    std::string members = "ranks " + detail::join_ints(comp);
    std::size_t ends = 0;
    bool shaped = true;
    for (const int r : comp) {
      const auto d = partners[r].size();
      ends += d == 1 ? 1 : 0;
      shaped = shaped && d <= 2;
    }
    const bool ring = shaped && ends == 0 && comp.size() > 2;
    if (!shaped || (!ring && ends != 2)) {
      out.notes.push_back("point-to-point partners of " + members + " form neither a chain nor a ring: pipeline stages unknown");
      continue;
    }
    std::vector<int> starts;
    for (const int r : comp) {
      const auto it = index_of_rank.find(r);
      if ((ring || partners[r].size() == 1) && it != index_of_rank.end() && first_p2p_after_forward(it->second)) starts.push_back(r);
    }
    if (starts.size() != 1) {
      out.notes.push_back("pipeline of " + members + ": " + std::to_string(starts.size()) +
                          " ranks compute a forward pass before their first transfer (stage 0 must be the only one): stages unknown");
      continue;
    }
    std::vector<int> order = {starts[0]};
    int prev = -1, at = starts[0];
    if (ring) {
      const int next = first_partner(index_of_rank[at]);
      prev = at;
      at = next;
      if (at >= 0) order.push_back(at);
    }
    while (order.size() < comp.size() && at >= 0) {
      int next = -1;
      for (const int n : partners[at]) {
        if (n != prev && std::find(order.begin(), order.end(), n) == order.end()) next = n;
      }
      if (next < 0) break;
      prev = at, at = next;
      order.push_back(at);
    }
    if (order.size() != comp.size()) {
      out.notes.push_back("pipeline of " + members + ": could not walk the stages from stage 0");
      continue;
    }
    (ring ? topology_ring : topology_chain) = true;
    pipelines.push_back(order);
  }
  for (std::size_t pi = 0; pi < pipelines.size(); ++pi) {
    const auto& order = pipelines[pi];
    for (std::size_t s = 0; s < order.size(); ++s) {
      auto& rs = out.ranks[index_of_rank[order[s]]];
      rs.stage.value = static_cast<int>(s);
      rs.stage.source = "position in the chain of point-to-point partners " + detail::join_ints(order) +
                        (order.size() > 2 && partners[order.front()].count(order.back()) ? " (a ring)" : "") +
                        " (stage 0 computes a forward before its first transfer)";
    }
  }
  for (auto& rs : out.ranks) {
    if (rs.stage.known()) continue;
    if (partners.count(rs.rank) == 0 && unmatched_p2p.count(rs.rank) == 0) {
      rs.stage.value = 0;
      rs.stage.source = "no point-to-point transfers on this rank";
    } else if (rs.stage.source.empty()) {
      rs.stage.source = unmatched_p2p.count(rs.rank) ? "send/recv ops whose peers are absent from the job" : "see notes";
    }
  }

  // ---- parallel layout --------------------------------------------------------------------
  auto& par = out.parallel;
  // Flags name options `lumos inspect --structure` (and `lumos whatif`) accept; facts no option
  // supplies (world, EP, micro-batch count) have none.
  par.tp.flag = "--tp", par.pp.flag = "--pp", par.dp.flag = "--dp";
  for (const auto& r : job.ranks) {
    if (r.world_size && !par.world.known()) {
      par.world.value = *r.world_size;
      par.world.source = "distributedInfo.world_size";
    }
  }
  if (!par.world.known()) {
    par.world.value = static_cast<int>(nr);
    par.world.source = "number of trace files (no distributedInfo.world_size)";
  }
  const bool all_ranks = static_cast<int>(nr) == *par.world.value;

  if (!pipelines.empty()) {
    std::set<std::size_t> lengths;
    for (const auto& p : pipelines) lengths.insert(p.size());
    if (lengths.size() == 1) {
      par.pp.value = static_cast<int>(*lengths.begin());
      par.pp.source = std::to_string(pipelines.size()) + (topology_ring ? " ring(s)" : " chain(s)") +
                      " of point-to-point partners of " + std::to_string(*lengths.begin()) + " ranks";
    } else {
      par.pp.source = "chains of point-to-point partners have different lengths";
    }
  } else if (unmatched_p2p.empty() && partners.empty()) {
    par.pp.value = 1;
    par.pp.source = "no point-to-point transfers between ranks";
  } else {
    par.pp.source = unmatched_p2p.empty() ? "see notes" : "send/recv ops whose peers are absent from the job";
  }

  // ---- schedule: per-stage order of forward/backward passes against the policies -----------
  par.schedule.flag = "--schedule", par.chunks.flag = "--vp";
  {
    // Reference rank per stage (the first pipeline; other pipelines are checked too).
    std::vector<std::vector<std::size_t>> stage_ranks;
    if (!pipelines.empty()) {
      for (const auto& p : pipelines) {
        std::vector<std::size_t> v;
        for (const int r : p) v.push_back(index_of_rank[r]);
        stage_ranks.push_back(v);
      }
    } else if (par.pp.value == 1) {
      for (std::size_t ri = 0; ri < nr; ++ri) stage_ranks.push_back({ri});
    }
    std::size_t forwards = 0, backwards = 0;
    bool consistent = !stage_ranks.empty();
    for (const auto& p : stage_ranks) {
      for (const std::size_t ri : p) {
        std::size_t f = 0, b = 0;
        for (const auto& pass : out.ranks[ri].passes) (pass.op.kind == pipeline::op_kind::forward ? f : b) += 1;
        if (forwards == 0 && backwards == 0) forwards = f, backwards = b;
        consistent = consistent && f == forwards && b == backwards;
      }
    }
    auto letters = [&](std::size_t ri) {
      std::string s;
      for (const auto& p : out.ranks[ri].passes) s += pipeline::op_letter(p.op.kind);
      return s;
    };
    if (!consistent) {
      par.schedule.source = stage_ranks.empty() ? "pipeline stages unknown" : "ranks run different numbers of passes";
    } else if (forwards == 0) {
      par.schedule.source = "no forward pass in the iteration";
    } else if (backwards == 0 && std::none_of(stage_ranks.begin(), stage_ranks.end(), [&](const auto& p) {
                 return std::any_of(p.begin(), p.end(), [&](std::size_t ri) {
                   const auto& phases = out.ranks[ri].phases;
                   return std::any_of(phases.begin(), phases.end(), [](const phase_span& ph) { return ph.marked; });
                 });
               })) {
      // Nothing marks a pass: the whole step reads as one forward pass, which says neither that
      // it is forward only nor over how many micro-batches it runs (a training step of a trace
      // with kernels and launches only reads the same).
      par.schedule.source = "no forward/backward annotation or op marks the passes (the step reads as one forward pass)";
      par.micro_batches.source = par.schedule.source;
      par.chunks.source = par.schedule.source;
    } else if (backwards == 0) {
      par.schedule.source = "forward only (no backward pass): no training schedule";
      par.micro_batches.value = static_cast<int>(forwards);
      par.micro_batches.source = std::to_string(forwards) + " forward pass(es) per rank";
      par.chunks.value = 1;
      par.chunks.source = "forward only";
    } else if (backwards != forwards && backwards != 2 * forwards) {
      par.schedule.source = std::to_string(forwards) + " forward and " + std::to_string(backwards) +
                            " backward passes per rank: passes are not delimited one per micro-batch";
    } else {
      // Twice as many backward passes as forward: a zero-bubble schedule, each backward split in
      // B and W (its weight gradients), which the traces tell apart only as two passes (each
      // marked on its own); its order is compared with W read as a backward pass.
      const bool split_backward = backwards == 2 * forwards;
      struct candidate {
        pipeline::schedule_kind kind;
        pipeline::schedule_shape shape;
        std::vector<std::vector<std::vector<pipeline::op>>> orders;  // per pipeline, per stage
      };
      std::vector<candidate> found;
      const auto p = static_cast<std::int32_t>(stage_ranks.front().size());
      const auto n = static_cast<std::int32_t>(forwards);
      auto try_kind = [&]<class S>(S, pipeline::schedule_shape shape) {
        try {
          S::validate(shape);
        } catch (const error&) {
          return;
        }
        candidate c{S::kind, shape, {}};
        for (const auto& pl : stage_ranks) {
          std::vector<std::vector<pipeline::op>> per_stage;
          for (std::size_t s = 0; s < pl.size(); ++s) {
            auto ops = S::stage_ops(shape, static_cast<std::int32_t>(s));
            std::string want;
            for (const auto& o : ops) want += pipeline::op_letter(o.kind == pipeline::op_kind::weight ? pipeline::op_kind::backward : o.kind);
            if (want != letters(pl[s])) return;
            per_stage.push_back(std::move(ops));
          }
          c.orders.push_back(std::move(per_stage));
        }
        found.push_back(std::move(c));
      };
      // With two stages the partners cannot tell a chain from a ring; the receives of stage 0
      // can: in a chain it receives only gradients (before a backward pass), in a ring (model
      // chunks) also the last stage's activations (before a forward pass). A receive is told by
      // the CPU operator that posted it (c10d's nccl:recv); unknown when none says.
      std::optional<bool> receives_activations;
      if (p == 2) {
        const std::size_t ri = stage_ranks.front().front();
        const auto& ls = work[ri].launches;
        for (std::size_t k = 0; k < ls.size(); ++k) {
          if (!ls[k].p2p || detail::transfer_side(job.ranks[ri], ls[k].cpu_op) != -1) continue;
          for (std::size_t j = k + 1; j < ls.size(); ++j) {
            if (ls[j].pass < 0 || ls[j].p2p) continue;
            const bool forward = out.ranks[ri].passes[static_cast<std::size_t>(ls[j].pass)].op.kind == pipeline::op_kind::forward;
            receives_activations = receives_activations.value_or(false) || forward;
            break;
          }
        }
      }
      if (split_backward) {
        if (!topology_ring || p <= 2) {
          try_kind(pipeline::zero_bubble_h1{}, {p, n, 1});
          try_kind(pipeline::zero_bubble_h2{}, {p, n, 1});
        }
      } else if ((!topology_ring || p <= 2) && receives_activations != true) {
        try_kind(pipeline::gpipe{}, {p, n, 1});
        try_kind(pipeline::one_f_one_b{}, {p, n, 1});
      }
      if (!split_backward && (!topology_chain || p <= 2) && receives_activations != false) {
        for (std::int32_t v = 2; v <= n; ++v) {
          if (n % v == 0 && p > 1) try_kind(pipeline::interleaved_one_f_one_b{}, {p, n / v, v});
        }
      }
      if (options.schedule) {
        std::erase_if(found, [&](const candidate& c) { return c.kind != *options.schedule; });
      }
      if (options.chunks) {
        std::erase_if(found, [&](const candidate& c) { return c.shape.chunks != *options.chunks; });
      }
      std::string observed = "stage 0 ran " + letters(stage_ranks.front().front());
      if (found.size() == 1) {
        const auto& c = found.front();
        par.schedule.value = c.kind;
        par.schedule.source = observed + ", op for op the order of the " + std::string(pipeline::schedule_title(c.kind)) +
                              " policy with p " + std::to_string(c.shape.stages) + ", m " + std::to_string(c.shape.micro_batches) +
                              ", v " + std::to_string(c.shape.chunks) + " on every stage" +
                              (topology_ring ? " (partners form a ring: chunks wrap from the last stage to the first)" : "") +
                              (options.schedule || options.chunks ? " (among candidates kept by --schedule/--vp)" : "");
        par.chunks.value = c.shape.chunks;
        par.chunks.source = "the recognised schedule";
        par.micro_batches.value = c.shape.micro_batches;
        par.micro_batches.source = std::to_string(forwards) + " forward passes per stage / " + std::to_string(c.shape.chunks) +
                                   " chunk(s)";
        for (std::size_t pl = 0; pl < stage_ranks.size(); ++pl) {
          for (std::size_t s = 0; s < stage_ranks[pl].size(); ++s) {
            auto& passes = out.ranks[stage_ranks[pl][s]].passes;
            for (std::size_t k = 0; k < passes.size(); ++k) passes[k].op = c.orders[pl][s][k];
          }
        }
      } else if (found.empty()) {
        par.schedule.source = split_backward
                                  ? observed + ": two backward passes per forward pass, but matches no ZB-H1 or ZB-H2 order of p " +
                                        std::to_string(p) + " with " + std::to_string(n) + " micro-batches"
                                  : observed + ": matches no GPipe, 1F1B or interleaved 1F1B order of p " + std::to_string(p) + " with " +
                                        std::to_string(n) +
                                        " forward passes per stage (a zero-bubble schedule's W passes are told from its B passes "
                                        "only when an annotation marks each pass)";
      } else {
        // Candidates that agree on the shape still give the micro-batches and chunks.
        const bool same_shape = std::all_of(found.begin(), found.end(), [&](const candidate& c) { return c.shape == found.front().shape; });
        if (same_shape) {
          par.chunks.value = found.front().shape.chunks;
          par.chunks.source = "every schedule that matches the order has " + std::to_string(found.front().shape.chunks) + " chunk(s)";
          par.micro_batches.value = found.front().shape.micro_batches;
          par.micro_batches.source = std::to_string(forwards) + " forward passes per stage / " +
                                     std::to_string(found.front().shape.chunks) + " chunk(s)";
        }
        std::string names;
        for (const auto& c : found) {
          names += (names.empty() ? "" : ", ") + std::string(pipeline::schedule_name(c.kind)) + " (v " +
                   std::to_string(c.shape.chunks) + ")";
        }
        par.schedule.source = observed + ": ambiguous, the same order as " + names;
        if (!(p == 1 && forwards == 1)) out.notes.push_back("schedule ambiguous between " + names + ": pass --schedule (and --vp)");
      }
    }
  }

  // ---- process groups --------------------------------------------------------------------
  struct group_acc {
    process_group g;
    std::map<std::string, std::map<int, std::size_t>> counts;  // "kind in phase" → rank → count
    std::set<std::string> kinds_phase;
    // Backward/optimizer all-reduces and reduce-scatters: the largest recorded message
    // (elements) and whether any has none recorded.
    std::int64_t grad_elements = 0;
    bool grad_size_unknown = false;
    std::string bad_size;  // a Group size arg out of range, noted once
  };
  std::map<std::string, group_acc> groups;
  struct dp_op {
    std::string kind;
    std::int64_t elements;
    std::string group;  // key into `groups`
  };
  std::map<int, std::vector<dp_op>> grad_ops;  // rank → DP collectives in backward/optimizer
  for (std::size_t ri = 0; ri < nr; ++ri) {
    const trace::rank_trace& t = job.ranks[ri];
    const detail::comm_args_source args_of(t);
    for (const auto& l : work[ri].launches) {
      if (!l.comm) continue;
      const std::size_t src = args_of.of(l.op);
      std::string kind = detail::comm_kind(t.name(t.events[l.op]), t.arg_text(src, trace::arg_key::collective_name));
      std::vector<int> ranks = graph::detail::parse_rank_list(t.arg_text(src, trace::arg_key::process_group_ranks));
      std::string name(t.arg_text(src, trace::arg_key::process_group_name));
      std::vector<int> seen_ranks = l.instance >= 0 ? participants(l.instance) : std::vector<int>{};
      if (kind == "sendrecv" && (seen_ranks.size() > 2 || ranks.size() > 2) && !l.p2p) kind = "alltoall";
      std::string key;
      if (!name.empty()) {
        key = "name " + name;
      } else if (l.instance >= 0) {
        name = "world";
        key = "ranks " + detail::join_ints(seen_ranks);
      } else {
        name = "(unmatched, peers absent)";
        key = "unmatched";
      }
      if (l.p2p) {
        // p2p pairs are reported as one PP group per pipeline, below.
        continue;
      }
      auto& acc = groups[key];
      if (acc.g.name.empty()) {
        acc.g.name = name;
        acc.g.description = std::string(t.arg_text(src, trace::arg_key::process_group_desc));
      }
      std::set<int> rs(acc.g.ranks.begin(), acc.g.ranks.end());
      rs.insert(ranks.begin(), ranks.end());
      rs.insert(seen_ranks.begin(), seen_ranks.end());
      acc.g.ranks.assign(rs.begin(), rs.end());
      if (const auto gs = t.arg(src, trace::arg_key::group_size); gs && !acc.g.size.known()) {
        if (const auto size = detail::group_size_of(*gs)) {
          acc.g.size.value = *size;
          acc.g.size.source = "Group size arg";
        } else if (acc.bad_size.empty()) {
          acc.bad_size = "group '" + name + "': Group size " + std::to_string(*gs) + " (" + t.file +
                         ") is not a group size; taken from the ranks seen instead";
          out.notes.push_back(acc.bad_size);
        }
      }
      const std::string kp = kind + " in " + std::string(to_string(l.phase));
      ++acc.counts[kp][t.rank];
      acc.kinds_phase.insert(kp);
      if ((kind == "allreduce" || kind == "reducescatter" || kind == "allgather") &&
          (l.phase == phase_kind::backward || l.phase == phase_kind::optimizer)) {
        std::int64_t el = 0;
        if (const auto v = t.arg(src, trace::arg_key::in_msg_nelems)) el = *v;
        else if (l.instance >= 0) el = g.collectives[static_cast<std::size_t>(l.instance)].bytes;
        grad_ops[t.rank].push_back({kind, el, key});
        if (kind != "allgather") {
          acc.grad_elements = std::max(acc.grad_elements, el);
          acc.grad_size_unknown = acc.grad_size_unknown || el <= 0;
        }
      }
    }
  }
  for (std::size_t pi = 0; pi < pipelines.size(); ++pi) {
    process_group pg;
    pg.name = "p2p pipeline " + std::to_string(pi);
    pg.ranks = pipelines[pi];
    pg.size.value = static_cast<int>(pg.ranks.size());
    pg.size.source = "ranks of the chain of point-to-point partners";
    pg.roles.push_back({group_role::pp, "send/recv between neighbouring stages", ""});
    out.groups.push_back(std::move(pg));
  }
  for (auto& key_acc : groups) {
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    const auto& key = key_acc.first;
    auto& acc = key_acc.second;
    auto& pg = acc.g;
    if (!pg.size.known() && key != "unmatched") {
      pg.size.value = static_cast<int>(pg.ranks.size());
      pg.size.source = "ranks that joined its collectives";
    } else if (!pg.size.known()) {
      pg.size.source = "no group args and the peers are absent from the job";
      pg.size.flag = "--tp/--dp";
    }
    for (const auto& [kp, per_rank] : acc.counts) {
      std::size_t most = 0;
      for (const auto& [r, c] : per_rank) most = std::max(most, c);
      pg.collectives.emplace_back(kp, most);
    }
    auto has = [&](std::string_view kind, phase_kind ph) { return acc.kinds_phase.count(std::string(kind) + " in " + std::string(to_string(ph))) > 0; };
    const std::string d = detail::lower(pg.description);
    auto word = [&](std::string_view wd) {
      for (std::size_t at = d.find(wd); at != std::string::npos; at = d.find(wd, at + 1)) {
        const bool left = at == 0 || !std::isalnum(static_cast<unsigned char>(d[at - 1]));
        const bool right = at + wd.size() >= d.size() || !std::isalnum(static_cast<unsigned char>(d[at + wd.size()]));
        if (left && right) return true;
      }
      return false;
    };
    const std::string desc_src = "Process Group Description '" + pg.description + "'";
    if (word("tp") || word("tensor")) pg.roles.push_back({group_role::tp, desc_src, ""});
    if (word("dp") || word("data")) pg.roles.push_back({group_role::dp, desc_src, ""});
    if (word("pp") || word("pipeline")) pg.roles.push_back({group_role::pp, desc_src, ""});
    if (word("ep") || word("expert") || word("moe")) pg.roles.push_back({group_role::ep, desc_src, ""});
    auto add_role = [&](group_role r, std::string why) {
      for (const auto& x : pg.roles) {
        if (x.value == r) return;
      }
      pg.roles.push_back({r, std::move(why), ""});
    };
    if (key == "unmatched") continue;
    // A recorded description says what the group is (Megatron names every group: a gradient-norm
    // all-reduce over MODEL_PARALLEL_GROUP or a TP all-reduce in backward is no DP reduction);
    // roles are inferred from where its collectives run only when it has none (PyTorch writes
    // "undefined" for groups created without one).
    if (!d.empty() && d != "undefined" && d != "default_pg") {
      if (pg.size.value && *pg.size.value == *par.world.value && *par.world.value > 1) add_role(group_role::world, "spans every rank of the world");
      continue;
    }
    for (const char* k : {"allreduce", "allgather", "reducescatter"}) {
      if (has(k, phase_kind::forward)) add_role(group_role::tp, std::string(k) + " inside forward passes (activations)");
    }
    // Gradients are buckets of parameters; an all-reduce of a few scalars after the backward (a
    // gradient norm, a loss, a found-inf flag) is not a gradient reduction.
    const bool gradient_sized = acc.grad_size_unknown || acc.grad_elements > 1024;
    for (const char* k : {"allreduce", "reducescatter"}) {
      if ((has(k, phase_kind::backward) || has(k, phase_kind::optimizer)) && gradient_sized) {
        add_role(group_role::dp, std::string(k) + " in the backward/optimizer phase (gradients)");
      }
    }
    for (const phase_kind ph : {phase_kind::forward, phase_kind::backward, phase_kind::other, phase_kind::optimizer}) {
      if (has("alltoall", ph)) add_role(group_role::ep, "all-to-all (experts in MoE; embedding shards in recommender models)");
    }
    if (pg.size.value && *pg.size.value == *par.world.value && *par.world.value > 1) add_role(group_role::world, "spans every rank of the world");
  }
  // Gradient reductions are the backward/optimizer collectives of DP groups (all of them when
  // no group is known to be DP, e.g. unmatched ops).
  {
    std::set<std::string> dp_groups;
    for (const auto& [key, acc] : groups) {
      for (const auto& role : acc.g.roles) {
        if (role.value == group_role::dp) dp_groups.insert(key);
      }
    }
    if (!dp_groups.empty()) {
      for (auto& [r, ops] : grad_ops) std::erase_if(ops, [&](const dp_op& o) { return dp_groups.count(o.group) == 0; });
      std::erase_if(grad_ops, [](const auto& kv) { return kv.second.empty(); });
    } else {
      // No DP group: collectives of groups whose description names another role are no
      // gradient reductions either.
      for (auto& [r, ops] : grad_ops) {
        std::erase_if(ops, [&](const dp_op& o) {
          const auto it = groups.find(o.group);
          return it != groups.end() && !it->second.g.description.empty() && it->second.g.description != "undefined";
        });
      }
      std::erase_if(grad_ops, [](const auto& kv) { return kv.second.empty(); });
    }
  }
  for (auto& [key, acc] : groups) out.groups.push_back(std::move(acc.g));

  auto role_size = [&](group_role r, fact<int>& f) {
    for (const auto& pg : out.groups) {
      for (const auto& role : pg.roles) {
        if (role.value != r || !pg.size.known() || (r == group_role::pp)) continue;
        if (f.known() && *f.value != *pg.size.value) {
          out.notes.push_back(std::string(to_string(r)) + " groups of different sizes (" + std::to_string(*f.value) + " and " +
                              std::to_string(*pg.size.value) + ")");
          continue;
        }
        f.value = *pg.size.value;
        f.source = "size of group '" + pg.name + "': " + role.source;
      }
    }
  };
  role_size(group_role::tp, par.tp);
  role_size(group_role::dp, par.dp);
  role_size(group_role::ep, par.ep);
  const bool unmatched_comm = groups.count("unmatched") > 0;
  if (!par.tp.known()) {
    if (!unmatched_comm) {
      par.tp.value = 1;
      par.tp.source = "no collective inside forward passes";
    } else {
      par.tp.source = "communication whose peers are absent from the job";
    }
  }
  if (!par.ep.known() && !unmatched_comm) {
    par.ep.value = 1;
    par.ep.source = "no all-to-all";
  } else if (!par.ep.known()) {
    par.ep.source = "communication whose peers are absent from the job";
  }
  if (!par.dp.known() && par.tp.known() && par.pp.known() && (all_ranks || !unmatched_comm)) {
    const int denom = *par.tp.value * *par.pp.value;
    if (denom > 0 && *par.world.value % denom == 0) {
      par.dp.value = *par.world.value / denom;
      par.dp.source = "world " + std::to_string(*par.world.value) + " / (TP " + std::to_string(*par.tp.value) + " × PP " +
                      std::to_string(*par.pp.value) + "); no gradient reduction in the trace";
    }
  }
  if (!par.dp.known() && par.dp.source.empty()) {
    par.dp.source = grad_ops.empty() ? "no gradient reduction, and world / (TP × PP) is not known"
                                     : "gradients are reduced, but the group's size is not recorded and its peers are absent";
  }

  // ---- gradient reduction ----------------------------------------------------------------
  {
    auto& gr = out.gradients;
    gr.method.flag = gr.buckets.flag = gr.bucket_elements.flag = "";
    if (grad_ops.empty()) {
      gr.method.source = gr.buckets.source = gr.bucket_elements.source = "no all-reduce or reduce-scatter in the backward/optimizer phase";
    } else {
      const auto& [r, ops] = *grad_ops.begin();
      bool ar = false, rsc = false, ag = false;
      for (const auto& o : ops) ar |= o.kind == "allreduce", rsc |= o.kind == "reducescatter", ag |= o.kind == "allgather";
      gr.method.value = rsc ? (ag ? "reduce-scatter + all-gather" : "reduce-scatter") : "all-reduce";
      if (ar && rsc) gr.method.value = "all-reduce and reduce-scatter";
      gr.method.source = "collectives in the backward/optimizer phase of rank " + std::to_string(r);
      int n = 0;
      std::vector<std::int64_t> sizes;
      bool all_sizes = true;
      for (const auto& o : ops) {
        if (o.kind == "allgather") continue;
        ++n;
        sizes.push_back(o.elements);
        all_sizes = all_sizes && o.elements > 0;
      }
      gr.buckets.value = n;
      gr.buckets.source = gr.method.source;
      if (all_sizes) {
        gr.bucket_elements.value = sizes;
        gr.bucket_elements.source = "In msg nelems / Input Dims of the collectives";
      } else {
        gr.bucket_elements.source = "the trace records no message size for these collectives";
      }
    }
  }

  // ---- model shape -------------------------------------------------------------------------
  auto& md = out.model;
  md.layers.flag = "--layers", md.hidden.flag = "--hidden", md.ffn.flag = "--ffn", md.heads.flag = "--heads";
  md.head_dim.flag = "--heads", md.seq.flag = "--seq", md.micro_batch_size.flag = "--micro-batch", md.dtype.flag = "";
  {
    // Layers: the sum over the stages of one pipeline of layers per pass × chunks.
    std::vector<std::size_t> one;
    if (!pipelines.empty()) {
      for (const int r : pipelines.front()) one.push_back(index_of_rank[r]);
    } else if (nr > 0) {
      one.push_back(0);
    }
    int total = 0;
    bool ok = !one.empty();
    const int v = par.chunks.value.value_or(1);
    for (const std::size_t ri : one) {
      const auto& f = out.ranks[ri].layers_per_pass;
      ok = ok && f.known() && *f.value > 0;
      if (ok) total += *f.value * v;
    }
    if (ok) {
      md.layers.value = total;
      md.layers.source = one.size() > 1 ? "sum over the " + std::to_string(one.size()) + " stages of layers per pass × " +
                                              std::to_string(v) + " chunk(s); " + out.layers_method.source
                                        : out.ranks[one.front()].layers_per_pass.source;
    } else {
      md.layers.source = nr > 0 && !one.empty() ? out.ranks[one.front()].layers_per_pass.source : "no ranks";
    }
  }
  // Shapes: the GEMMs of the middle layer of the first forward pass of the first rank with layers.
  std::size_t ref = nr;
  for (std::size_t ri = 0; ri < nr && ref == nr; ++ri) {
    if (out.ranks[ri].layers_per_pass.value.value_or(0) > 0) ref = ri;
  }
  const std::string unknown_no_layers = "no transformer layer found to read shapes from";
  if (ref == nr) {
    md.hidden.source = md.ffn.source = md.heads.source = md.head_dim.source = md.seq.source = md.micro_batch_size.source =
        md.dtype.source = md.kv_heads.source = md.dropout.source = unknown_no_layers;
  } else {
    const trace::rank_trace& t = job.ranks[ref];
    const auto& rs = out.ranks[ref];
    const int L = *rs.layers_per_pass.value;
    const int mid = L / 2;
    int fwd = -1;
    for (std::size_t pi = 0; pi < rs.passes.size() && fwd < 0; ++pi) {
      if (rs.passes[pi].op.kind == pipeline::op_kind::forward) fwd = static_cast<int>(pi);
    }
    std::vector<detail::gemm_shape> gemms;
    std::uint32_t last_shape = no_event;
    std::string dtype_src, dropout_op;
    bool pass_read = false;
    for (const std::size_t li : work[ref].pass_launches[static_cast<std::size_t>(fwd)]) {
      const auto& l = work[ref].launches[li];
      // Dropout anywhere in the pass: Megatron fuses the layers' into bias-dropout-add kernels
      // whose names do not say it, but not the embedding's.
      if (dropout_op.empty() && detail::lower(t.name(t.events[l.op])).find("dropout") != std::string::npos) {
        dropout_op = t.name(t.events[l.op]).substr(0, 60);
      }
      pass_read = true;
      if (l.layer != mid) continue;
      const std::string_view kname = t.name(t.events[l.op]);
      if (dtype_src.empty() && detail::is_gemm_kernel(kname) && !detail::dtype_of_kernel(kname).empty()) {
        md.dtype.value = detail::dtype_of_kernel(kname);
        dtype_src = "GEMM kernel name '" + std::string(kname.substr(0, 60)) + "'";
      }
      if (l.shape_op == no_event || l.shape_op == last_shape) continue;
      last_shape = l.shape_op;
      if (auto gs = detail::gemm_of(t.name(t.events[l.shape_op]), detail::parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)))) {
        gemms.push_back(*gs);
      }
    }
    md.dtype.source = dtype_src.empty() ? "no GEMM kernel name in the layer names a data type" : dtype_src;
    const std::string where = " (layer " + std::to_string(mid) + " of the first forward pass on rank " + std::to_string(rs.rank) + ")";
    const auto ls = detail::read_layer(gemms);
    const std::optional<int> tp = par.tp.value;
    const std::string tp_txt = tp ? " × TP " + std::to_string(*tp) : "";
    if (ls.hidden) {
      md.hidden.value = ls.hidden;
      md.hidden.source = ls.hidden_from + where + "; not divided by TP (the residual stream is replicated)";
    } else {
      md.hidden.source = (gemms.empty() ? std::string("no GEMM with recorded Input Dims in the layer") : ls.why_hidden) + where;
    }
    const std::string pass_where = " (the first forward pass on rank " + std::to_string(rs.rank) + ")";
    if (pass_read) {
      md.has_dropout = !dropout_op.empty();
      md.dropout.value = md.has_dropout ? "present (its masks are kept for backward)" : "none";
      md.dropout.source = (md.has_dropout ? "GPU op '" + dropout_op + "'" : std::string("no GPU op named dropout")) + pass_where;
    } else {
      md.dropout.source = "no launch" + pass_where;
    }
    md.gated_mlp = ls.gated;
    if (ls.ffn_local) {
      md.mlp.value = ls.gated ? "gated (gate and up projections: SwiGLU, Llama-style; untied embeddings, RMSNorm and no biases assumed)" : "not gated";
      md.mlp.source = ls.ffn_from + where;
    } else {
      md.mlp.source = ls.why_ffn + where;
    }
    if (ls.ffn_local && tp) {
      md.ffn.value = ls.ffn_local * *tp;
      md.ffn.source = ls.ffn_from + tp_txt + where;
    } else {
      md.ffn.source = ls.ffn_local ? "per-rank FFN " + std::to_string(ls.ffn_local) + " × TP (unknown)" : ls.why_ffn + where;
    }
    if (ls.seq) {
      md.seq.value = ls.seq;
      md.seq.source = ls.attention_from + where;
      md.head_dim.value = ls.head_dim;
      md.head_dim.source = ls.attention_from;
    } else {
      md.seq.source = md.head_dim.source = ls.why_attention + where;
    }
    if (ls.micro_batch) {
      md.micro_batch_size.value = ls.micro_batch;
      md.micro_batch_size.source = "tokens per GEMM (" + std::to_string(ls.tokens) + ") / sequence (" + std::to_string(ls.seq) + ")";
    } else {
      md.micro_batch_size.source = ls.seq ? "tokens per GEMM not a multiple of the sequence" : ls.why_attention;
    }
    if (ls.heads_local && tp) {
      md.heads.value = ls.heads_local * *tp;
      md.heads.source = "heads per rank " + std::to_string(ls.heads_local) + " (" + ls.attention_from + ")" + tp_txt;
      if (ls.attn_local && ls.attn_local != ls.heads_local * ls.head_dim) {
        out.notes.push_back("attention output GEMM reads " + std::to_string(ls.attn_local) + " per rank but heads × head dim = " +
                            std::to_string(ls.heads_local * ls.head_dim));
      }
      // The QKV GEMMs write the queries (heads × head dim) and a key and a value per KV head.
      const std::int64_t q_local = ls.heads_local * ls.head_dim;
      const std::int64_t kv_width = ls.qkv_local > q_local ? (ls.qkv_local - q_local) / 2 : 0;
      if (ls.head_dim > 0 && kv_width > 0 && kv_width % ls.head_dim == 0 && ls.qkv_local == q_local + 2 * kv_width &&
          kv_width <= q_local) {
        md.kv_heads.value = kv_width / ls.head_dim * *tp;
        md.kv_heads.source = "QKV GEMM(s) write " + std::to_string(ls.qkv_local) + " per rank: queries " + std::to_string(q_local) +
                             " + 2 × " + std::to_string(kv_width) + " (keys and values of " + std::to_string(kv_width / ls.head_dim) +
                             " heads of " + std::to_string(ls.head_dim) + ")" + tp_txt + where;
      } else {
        md.kv_heads.source = ls.qkv_local ? "QKV GEMM(s) write " + std::to_string(ls.qkv_local) + " per rank, not queries " +
                                                std::to_string(q_local) + " + keys and values of whole heads" + where
                                          : "no QKV GEMM before the attention output projection" + where;
        if (ls.qkv_local) {
          out.notes.push_back("QKV GEMM writes " + std::to_string(ls.qkv_local) + " per rank, not heads × head dim (" +
                              std::to_string(q_local) + ") plus keys and values of whole heads");
        }
      }
    } else {
      md.heads.source = ls.heads_local  ? "heads per rank " + std::to_string(ls.heads_local) + " × TP (unknown)"
                        : ls.seq == 0   ? ls.why_attention
                        : ls.micro_batch ? ls.attention_from + ": its batch is not a multiple of the micro-batch size " + std::to_string(ls.micro_batch)
                                         : ls.attention_from + ", with the micro-batch size unknown (" + md.micro_batch_size.source + ")";
      md.kv_heads.source = "the heads are not known (" + md.heads.source + ")";
    }
    if (tp && ls.hidden && ls.attn_local && ls.attn_local * *tp != ls.hidden) {
      out.notes.push_back("attention width per rank " + std::to_string(ls.attn_local) + tp_txt + " ≠ hidden " + std::to_string(ls.hidden));
    }
  }

  // ---- layer task groups -----------------------------------------------------------------
  for (std::size_t ri = 0; ri < nr; ++ri) {
    const auto& map = built.ranks[ri];
    const auto& rs = out.ranks[ri];
    for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
      std::map<int, std::vector<graph::task_id>> by_layer;
      for (const std::size_t li : work[ri].pass_launches[pi]) {
        const auto& l = work[ri].launches[li];
        if (l.layer < 0) continue;
        auto& v = by_layer[l.layer];
        auto add = [&](const std::vector<graph::task_id>& m, std::uint32_t e) {
          if (e != no_event && e < m.size() && m[e] != graph::no_task) v.push_back(m[e]);
        };
        add(map.task_of_event, l.call);
        add(map.arrive_of_event, l.op);
        add(map.task_of_event, l.op);
      }
      for (auto& [layer, tasks] : by_layer) {
        std::sort(tasks.begin(), tasks.end());  // a call that launched several ops appears once
        tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
        out.layer_groups.push_back({rs.rank, layer, rs.passes[pi].op, std::move(tasks)});
      }
    }
  }

  for (std::size_t ri = 0; ri < nr; ++ri) {
    for (const auto& l : work[ri].launches) out.gpu_ops.push_back({ri, l.op, l.shape_op, l.cpu_op, l.phase, l.pass, l.layer, l.comm, l.p2p});
  }

  // ---- user overrides ----------------------------------------------------------------------
  auto apply = [&]<class T, class U>(fact<T>& f, const std::optional<U>& user, std::string_view flag) {
    if (!user) return;
    if (f.known() && static_cast<std::int64_t>(*f.value) != static_cast<std::int64_t>(*user)) {
      out.notes.push_back(std::string(flag) + " " + std::to_string(*user) + " overrides the trace's " + std::to_string(*f.value) +
                          " (" + f.source + ")");
    }
    f.value = static_cast<T>(*user);
    f.source = "given (" + std::string(flag) + ")";
  };
  apply(md.layers, options.layers, "--layers");
  apply(md.hidden, options.hidden, "--hidden");
  apply(md.ffn, options.ffn, "--ffn");
  apply(md.heads, options.heads, "--heads");
  apply(md.seq, options.seq, "--seq");
  apply(md.micro_batch_size, options.micro_batch_size, "--micro-batch");
  apply(par.tp, options.tp, "--tp");
  apply(par.pp, options.pp, "--pp");
  apply(par.dp, options.dp, "--dp");
  if (options.chunks && !par.chunks.known()) apply(par.chunks, options.chunks, "--vp");
  if (options.schedule && !par.schedule.known()) {
    par.schedule.value = *options.schedule;
    par.schedule.source = "given (--schedule); the trace did not determine it: " + par.schedule.source;
  }
  if (options.layers && out.layer_groups.empty()) {
    out.notes.push_back("--layers given but no layer boundaries were found in the trace: no per-layer task groups");
  }
  return out;
}

}  // namespace lumos::whatif

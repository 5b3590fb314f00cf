#pragma once
// Model-shape what-ifs (`lumos whatif --hidden/--ffn/--heads/--seq/--micro-batch/--tp`): every
// GPU op of the iteration is rescaled by the ratio of its modelled time in the new shape to its
// modelled time in the traced shape, times its measured time, with the kernel-level cost model's
// formulas (model/kernel_costs.hpp) so that a synthetic job rewritten from shape A agrees with
// one generated in shape B. CPU time, launches and kept overheads stay (the op count does not
// change). The rules, per GPU op (docs/whatif.md, "Model shape and TP"):
//  - under a GEMM operator (aten::mm/addmm/bmm/baddbmm with Input Dims): its dims mapped to the
//    new shape — of a linear GEMM one dim is the tokens (b·s), one the hidden width and one an
//    inner width (QKV 3·heads·d/TP, or (heads + 2·kv heads)·d/TP with grouped-query attention,
//    attention heads·d/TP, FFN/TP, gated FC1 2·FFN/TP), or outside
//    the layers the vocabulary shard V/TP; of a batched GEMM the batch is b·heads/TP and the dims
//    s and head dim — timed by the GEMM model (shape-dependent efficiency, HBM bound, minimum
//    kernel time);
//  - under an attention operator (scaled_dot_product*, flash_attn*): b·heads·s²·d through the
//    FlashAttention model;
//  - any other kernel, copy or set inside forward/backward passes: memory-bound on the activation
//    it works on, which is the output of the last GEMM or attention op launched before it on the
//    rank whose output carries the tokens (tokens × hidden before any; after FC1 tokens × FFN/TP,
//    after the score GEMM b·heads·s², after the logits GEMM tokens × V/TP);
//  - optimizer-phase kernels: memory-bound on the parameters per rank;
//  - communication: the NCCL model on its bytes (args `In msg nelems` × dtype, else the size its
//    measured time implies): point-to-point and tensor-parallel collectives carry activations
//    (tokens × hidden) and TP collectives run over the new TP size; data-parallel collectives
//    (a process group with the DP role, else collectives of the optimizer, or of backward outside
//    the layers) carry gradients (parameters per rank);
//  - everything else (outside the passes, host copies, GEMM/attention kernels with no recorded
//    shape or whose dims do not map) unchanged and counted.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/shape_groups.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/shape_mapping.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/tensor_parallel.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// Modelled times (ns) of the kernel-level model (kernel_costs.hpp) at a shape.
namespace detail {

[[nodiscard]] inline double gemm_model_ns(const shape_costs& c, double batch, double M, double N, double K) {
  const auto& p = c.profile;
  const double flops = 2.0 * M * N * K * batch;
  const double cmp = flops / (c.hw.peak_flops(c.dtype) * model::gemm_efficiency(p, M, N, K)) * 1e9;
  const double bytes = ((M * K + K * N) * c.element_bytes + M * N * c.element_bytes) * batch;
  const double mem = bytes / (c.hw.gpu.hbm_bandwidth * p.elementwise_bw) * 1e9;
  return std::max({cmp, mem, p.min_kernel_ns});
}

/// FlashAttention of `s` queries per sequence against `s * cp` keys (context parallelism: a
/// rank's 1/cp of the causal attention, with causal load balancing).
[[nodiscard]] inline double attention_model_ns(const shape_costs& c, double b, double heads, double s, double d, double cp = 1) {
  const double flops = 4.0 * b * s * s * cp * heads * d * 0.5; // causal: half the dense FLOPs
  return std::max(flops / (c.hw.peak_flops(c.dtype) * c.profile.flash_forward * c.profile.at_scale) * 1e9, c.profile.min_kernel_ns);
}

/// A memory-bound kernel measured at `measured` ns whose bytes change by `ratio`: its time is
/// max(bytes / bandwidth, minimum kernel time), with bytes / bandwidth taken as the measured time.
[[nodiscard]] inline double memory_scaled_ns(double measured, double ratio, double min_ns) {
  if (measured <= 0) return measured;
  return measured * std::max(measured * ratio, min_ns) / std::max(measured, min_ns);
}

/// An embedding lookup's forward kernel, by its lowercased name `l`: what `aten::embedding`
/// launches (ATen's `indexSelect*`; `vectorized_gather_kernel` in PyTorch 2.x, through
/// index_select) or a kernel named after an embedding that is not its backward.
[[nodiscard]] inline bool embedding_lookup(std::string_view l) {
  return l.find("indexselect") != std::string::npos || l.find("gather_kernel") != std::string::npos ||
         (l.find("embedding") != std::string::npos && l.find("backward") == std::string::npos &&
          l.find("bwd") == std::string::npos);
}

} // namespace detail

/// What a shape rewrite did.
struct shape_stats {
  std::size_t gemm = 0, attention = 0, memory = 0, optimizer = 0, communication = 0;
  std::size_t gradient_communication = 0;  ///< of `communication`: gradient (and tied-embedding) collectives
  std::size_t unchanged_outside = 0; ///< outside the passes and the optimizer, or host copies
  std::size_t unattributed = 0;      ///< compute ops in the passes whose shape did not map: unchanged
  time_ns before = 0, after = 0;     ///< summed GPU op time
  std::int64_t vocab_local = 0;      ///< V/TP from a logits GEMM, when one was seen
  bool sequence_parallel = false;    ///< reduce-scatters in the forward passes: activations between GEMMs are 1/TP
  double parameter_ratio = 1.0;      ///< parameters per rank of rank 0, target / traces
  /// From TP 1 to more: where Megatron's tensor-parallel collectives run, in launch order per
  /// rank (`tensor_parallel.hpp` inserts them): see `tp_hook`.
  std::vector<tp_hook> tp_collectives;
};

/// V/TP from the first linear GEMM outside the layers (the logits); 0 when there is none.
[[nodiscard]] inline std::int64_t traced_vocab_local(const trace::job& job, const job_structure& st,
                                                     const shape_config& from) {
  std::int64_t vocab_local = 0;
  // A stage of one layer may leave its backward's layer undelimited: its router GEMMs (hidden to
  // the experts) are then outside the layers, and no vocabulary.
  const std::int64_t router_width = st.moe.experts.value.value_or(0);
  for (const auto& c : st.gpu_ops) {
    if (c.layer >= 0 || c.shape_op == detail::no_event || vocab_local) continue;
    const auto& tr = job.ranks[c.rank];
    if (const auto gs = detail::gemm_of(tr.name(tr.events[c.shape_op]),
                                        detail::parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)))) {
      (void)map_gemm(*gs, from, from, true, &vocab_local);
      if (router_width > 0 && vocab_local == router_width) vocab_local = 0;
      // A vocabulary shard of twice the FFN reads as a gated MLP's FC1 width: without a gated MLP
      // that width can only be the logits.
      if (!vocab_local && !st.model.gated_mlp && gs->kind == detail::gemm_shape::role::linear &&
          logits_width(*gs, from) == 2 * from.ffn_local()) {
        vocab_local = 2 * from.ffn_local();
      }
    }
  }
  return vocab_local;
}

/// The transformer whose parameters a what-if counts: a GPT-style one with this shape, or with
/// `gated` a Llama-style one, `layers` layers (0: the traces'), `vocab` 0 when unknown.
[[nodiscard]] inline model::transformer counted_transformer(const shape_config& c, const job_structure& st, std::int64_t vocab,
                                                            bool gated, int layers = 0) {
  model::transformer m;
  m.layers = std::max<std::int64_t>(layers > 0 ? layers : st.model.layers.value.value_or(1), 1);
  m.hidden = c.hidden, m.ffn = c.ffn, m.heads = c.heads, m.kv_heads = c.heads, m.seq = c.seq;
  // Grouped-query attention: as many query heads per KV head as traced.
  const auto& kv = st.model.kv_heads.value;
  const auto& heads = st.model.heads.value;
  if (kv && heads && *kv > 0 && *heads % *kv == 0 && c.heads % (*heads / *kv) == 0) m.kv_heads = c.heads / (*heads / *kv);
  m.vocab = vocab > 0 ? vocab : 0;
  m.mlp = gated ? model::mlp_kind::swiglu : model::mlp_kind::gelu;
  // A gated MLP is Llama's layer, whose model has rotary positions, untied embeddings, RMSNorm
  // and no biases.
  if (gated) {
    m.position = model::position_kind::rotary, m.tied_embeddings = false;
    m.norm = model::norm_kind::rmsnorm, m.linear_bias = false;
  }
  // Dropout as the layer's ops show it; unread, as the model family has it (GPT's, not Llama's).
  m.dropout = st.model.dropout.known() ? st.model.has_dropout : !gated;
  return m;
}

/// Parameters one rank of `stage` holds (model::stage_parameters_per_rank of
/// `counted_transformer`) with `pp` stages (0: the traces').
[[nodiscard]] inline double parameters_per_rank(const shape_config& c, const job_structure& st, int stage,
                                                std::int64_t vocab, bool gated, int layers = 0, int pp = 0) {
  model::transformer m = counted_transformer(c, st, vocab, gated, layers);
  model::parallel_config par;
  par.tp = c.tp;
  par.pp = std::max(pp > 0 ? pp : st.parallel.pp.value.value_or(1), 1);
  if (m.layers < par.pp) m.layers = par.pp;
  return static_cast<double>(model::stage_parameters_per_rank(m, par, std::clamp(stage, 0, par.pp - 1)));
}

namespace detail {

/// Per rank of `job`: the parameters per rank of its stage, in the target (`to`, `layers_to`
/// layers and `pp_to` stages, 0: the traces') over the traces (`from`), by flops.hpp's count:
/// the layers, and the embedding on the first and last stage with the vocabulary when a logits
/// GEMM names it.
[[nodiscard]] inline std::vector<double> parameter_ratios(const trace::job& job, const job_structure& st, const shape_config& from,
                                                          const shape_config& to, bool gated, int layers_to, int pp_to) {
  const std::int64_t vocab_local = traced_vocab_local(job, st, from);
  std::vector<double> out(job.ranks.size(), 1.0);
  for (std::size_t ri = 0; ri < job.ranks.size(); ++ri) {
    const int stage = ri < st.ranks.size() ? st.ranks[ri].stage.value.value_or(0) : 0;
    const int pp_from = std::max(st.parallel.pp.value.value_or(1), 1);
    const int stage_to = traced_stage_to(stage, pp_from, pp_to > 0 ? pp_to : pp_from);
    out[ri] = parameters_per_rank(to, st, stage_to, vocab_local * from.tp, gated, layers_to, pp_to) /
              parameters_per_rank(from, st, stage, vocab_local * from.tp, gated);
  }
  return out;
}

/// One rank's state while `shape_rescaler` walks its GPU ops in launch order.
struct shape_rank_state {
  static constexpr std::size_t npos = ~std::size_t{0};
  double act_old = 0, act_new = 0;  ///< the activation the next memory-bound op works on, traced and new
  int pass = -1;
  /// The traced dims of the last backward GEMM read as a dgrad (tokens out), while its weight
  /// gradient has not been seen (`shape_rescaler::writes_tokens`).
  std::optional<std::array<std::int64_t, 3>> open_dgrad;
  /// From TP 1: the tokens-out linear GEMMs of the layers in the pass, counted, the count at the
  /// start of the layer being counted, and that layer. Forward runs QKV, attention output, FC1,
  /// FC2; backward (after the recomputed forward's four, when recomputing) the input gradients of
  /// FC2, FC1, attention output, QKV: in either direction the all-reduce (or reduce-scatter)
  /// follows every second one, and with sequence parallelism an all-gather precedes the others.
  /// A gated MLP (SwiGLU: Llama) with separate gate and up GEMMs runs FC1 as two GEMMs of the
  /// same dims, one right after the other: the second is not counted (forward: it reads the
  /// input the first gathered; backward: the two input gradients sum into one, so the reduce
  /// that followed the first follows the second).
  std::size_t layer_gemms = 0, layer_begin = 0;
  int layer = -1;
  /// The dims, layer and pass of the last tokens-out GEMM of a layer, and the index in
  /// `tp_collectives` of the reduce that followed it (npos: none), for the second half of FC1.
  std::optional<std::array<std::int64_t, 5>> fc1_first;
  std::size_t last_reduce = npos;
  /// Sequence parallelism: the GEMM seen last was an input gradient followed by a
  /// reduce-scatter, whose weight gradient (next) gathers its input again.
  bool regather = false;
  std::pair<std::uint32_t, std::size_t> last_gemm{no_event, npos};  ///< the GEMM operator seen last, the first hook after it
  bool embedded = false;  ///< the current forward pass has had its embedding lookup
};

/// The rescaling of one graph (`rescale_shape`): its setup resolved once, each rank's state, and
/// one member function per kind of GPU op.
class shape_rescaler {
 public:
  shape_rescaler(graph::built_job& b, const trace::job& job, const job_structure& st, const shape_config& from, const shape_config& to,
                 const shape_costs& cost_context, bool gated, int layers_to, int pp_to)
      : b_(b), g_(b.graph), job_(job), st_(st), from_(from), to_(to), costs_(cost_context), tied_embedding_(job, st), rank_(job.ranks.size()) {
    min_ns_ = cost_context.profile.min_kernel_ns;
    act_from_ = static_cast<double>(from.tokens()) * static_cast<double>(from.hidden);
    act_to_ = static_cast<double>(to.tokens()) * static_cast<double>(to.hidden);
    param_ratio_ = parameter_ratios(job, st, from, to, gated, layers_to, pp_to);
    if (!param_ratio_.empty()) out_.parameter_ratio = param_ratio_.front();
    gradient_group_ = gradient_groups(st);
    cp_groups_.insert(st.cp.groups.begin(), st.cp.groups.end());
    instance_ = collectives_by_complete(g_);
    buckets_in_layers_ = buckets_in_layers(job, st, gradient_group_);
    embedding_ratio_ = static_cast<double>(from.tp) / static_cast<double>(to.tp) * static_cast<double>(to.hidden) /
                       static_cast<double>(from.hidden);
    // Sequence parallelism: between the layers' GEMMs each rank holds its 1/TP of the tokens, so
    // norms, residuals and dropout work on tokens × hidden / TP. From TP 1 the tensor-parallel
    // collectives are inserted (all-reduces, or with sequence parallelism reduce-scatters and
    // all-gathers): see `tp_hook`.
    sp_ = forward_reduce_scatter(job, st);
    insert_tp_ = from.tp == 1 && to.tp > 1;
    insert_sp_ = insert_tp_ && to.sp;
    check_sequence_split(from, to, sp_ || insert_sp_);
    base_from_ = act_from_ / (sp_ ? from.tp : 1), base_to_ = act_to_ / (sp_ || insert_sp_ ? to.tp : 1);
    if (sp_ || insert_sp_) out_.sequence_parallel = true;
    for (shape_rank_state& s : rank_) s.act_old = base_from_, s.act_new = base_to_;
    if (insert_sp_) {
      prev_task_.assign(g_.task_count(), graph::no_task);
      std::vector<graph::task_id> last(g_.processors.size(), graph::no_task);
      for (graph::task_id t = 0; t < g_.task_count(); ++t) prev_task_[t] = std::exchange(last[g_.processor[t]], t);
    }
  }

  /// Rescales every GPU op of the iteration; what it did.
  shape_stats run() {
    for (const gpu_op_context& c : st_.gpu_ops) {
      if (c.pass >= 0 && c.pass != rank_[c.rank].pass) start_pass(c);
      const auto& map = b_.ranks[c.rank];
      if (c.op >= map.task_of_event.size()) continue;
      const graph::task_id t = map.task_of_event[c.op];
      if (t == graph::no_task) continue;
      const auto kind = g_.kind[t];
      if (kind != graph::task_kind::gpu_compute && kind != graph::task_kind::gpu_comm && kind != graph::task_kind::comm_complete) continue;
      const bool in_pass = c.phase == phase_kind::forward || c.phase == phase_kind::backward;
      if (c.comm || kind != graph::task_kind::gpu_compute) {
        communication(c, t, in_pass);
        continue;
      }
      const trace::rank_trace& tr = job_.ranks[c.rank];
      const std::string_view name = tr.name(tr.events[c.op]);
      if (classify(kind, name) == op_bound::host_copy || (!in_pass && c.phase != phase_kind::optimizer)) {
        ++out_.unchanged_outside;
      } else if (c.phase == phase_kind::optimizer) {
        ++out_.optimizer;
        set(t, memory_scaled_ns(static_cast<double>(g_.duration[t]), param_ratio_[c.rank], min_ns_));
      } else if (c.shape_op != no_event) {
        shaped(c, t);
      } else if (classify(kind, name) == op_bound::compute) {
        ++out_.unattributed;  // a GEMM/attention kernel with no recorded shape: its dims are unknown
      } else {
        memory_bound(c, t, name);
      }
    }
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) check_layer_gemms(r);
    return std::move(out_);
  }

 private:
  static constexpr std::size_t npos = shape_rank_state::npos;

  /// The model's time ratio of a mapped GEMM or attention op, and the size of its output,
  /// traced and new.
  struct modelled {
    double ratio = 1.0, out_old = 0, out_new = 0;
  };

  /// A new pass of `c`'s rank. A forward pass starts from tokens × hidden (the embedding, or
  /// the activation received from the previous stage); a backward pass goes on from its
  /// forward's last output (the logits for the loss gradient on the last stage).
  void start_pass(const gpu_op_context& c) {
    check_layer_gemms(c.rank);
    shape_rank_state& s = rank_[c.rank];
    s.layer_gemms = 0, s.layer_begin = 0, s.layer = -1;
    s.fc1_first.reset();
    s.last_reduce = npos;
    s.embedded = false, s.regather = false;
    s.pass = c.pass;
    s.open_dgrad.reset();
    const auto& passes = st_.ranks[c.rank].passes;
    if (static_cast<std::size_t>(c.pass) < passes.size() && passes[static_cast<std::size_t>(c.pass)].op.kind == pipeline::op_kind::forward) {
      s.act_old = base_from_, s.act_new = base_to_;
      // Inserted sequence parallelism: the embedding lookup's output is whole until its
      // reduce-scatter (a later stage starts from its scattered input, which only the norm reads).
      if (insert_sp_) s.act_new = act_to_;
    }
  }

  /// Ends the layer counted on `rank`: checked per layer, since a count that is wrong in every
  /// layer can still add up to a multiple of 4.
  void check_layer_gemms(std::size_t rank) {
    shape_rank_state& s = rank_[rank];
    const std::size_t n = s.layer_gemms - s.layer_begin;
    s.layer_begin = s.layer_gemms;
    if (!insert_tp_ || n % 4 == 0) return;
    throw error("whatif --tp " + std::to_string(to_.tp) + ": layer " + std::to_string(s.layer) + " in pass " + std::to_string(s.pass) +
                " of rank " + std::to_string(job_.ranks[rank].rank) + " runs " + std::to_string(n) +
                " activation GEMMs, not a multiple of 4 (QKV, attention output, FC1, FC2), so the "
                "tensor-parallel all-reduces cannot be placed (GEMMs without recorded shapes, or a layer of "
                "another kind)");
  }

  /// The group size of communication op `c`: its matched collective's (`inst`), else its Group size arg, else 2.
  [[nodiscard]] std::int64_t group_size(const gpu_op_context& c,
                                        std::map<graph::task_id, const graph::collective_instance*>::const_iterator inst) const {
    if (inst != instance_.end()) {
      return static_cast<std::int64_t>(inst->second->group_ranks.empty() ? inst->second->arrive.size() : inst->second->group_ranks.size());
    }
    if (const auto gs = job_.ranks[c.rank].arg(c.op, trace::arg_key::group_size)) return group_size_of(*gs).value_or(2);
    return 2;
  }

  /// A communication op, through the NCCL model on its bytes scaled by what it carries.
  void communication(const gpu_op_context& c, graph::task_id t, bool in_pass) {
    const double d = static_cast<double>(g_.duration[t]);
    const trace::rank_trace& tr = job_.ranks[c.rank];
    // Context parallelism's key/value exchange follows the CP change (context_parallel.hpp).
    if (!cp_groups_.empty() && cp_groups_.count(std::string(tr.arg_text(c.op, trace::arg_key::process_group_name)))) return;
    const auto inst = instance_.find(t);
    const bool embedding = !c.p2p && inst != instance_.end() && tied_embedding_(g_, *inst->second);
    // Point-to-point transfers carry a pass's activation or its gradient but are launched
    // between the passes (the receive before, the send after): rescaled wherever they sit.
    // (Left as traced, --hidden 4096 on gpt3-15b TP 2 PP 4 DP 2 was +1.68 %, and +10.3 % with
    // --tp 4, whose new placement then re-timed them x7.)
    if (!in_pass && !c.p2p && c.phase != phase_kind::optimizer && !embedding) {
      ++out_.unchanged_outside;
      return;
    }
    const std::string kname = comm_kind(tr.name(tr.events[c.op]), tr.arg_text(c.op, trace::arg_key::collective_name));
    const std::string pg(tr.arg_text(c.op, trace::arg_key::process_group_name));
    const auto known = gradient_group_.find(pg);
    const bool gradients = !c.p2p && (known != gradient_group_.end() && !pg.empty()
                                          ? known->second
                                          : c.phase == phase_kind::optimizer || (c.phase == phase_kind::backward && c.layer < 0));
    // Gradient buckets reduced during the backward (overlap_grad_reduce: each launched inside the
    // layer whose gradients complete it) travel with their layers: copies of the layers
    // (--layers, a merge of stages) or a stage split already change how many buckets a rank
    // reduces, so at an unchanged shape each keeps its size, the last (after the layers) too.
    // Reduced after the backward or in the optimizer step, they follow the parameters per rank.
    // (llama3-8b TP 2 PP 1 DP 2 --pp 2 --dp 4 counted the change twice: +2.9 %.)
    const bool in_layer_bucket = gradients && c.phase == phase_kind::backward && buckets_in_layers_[c.rank] && from_ == to_;
    // A p2p transfer is one activation, 1/TP of it under sequence parallelism (Megatron's
    // scatter-gather of pipeline tensors; model::pipeline_p2p_bytes).
    const double ratio = embedding ? embedding_ratio_ : gradients ? (in_layer_bucket ? 1.0 : param_ratio_[c.rank])
                                                    : c.p2p      ? base_to_ / base_from_
                                                                 : act_to_ / act_from_;
    const auto coll = modelled_collective(kname);
    const std::int64_t n = group_size(c, inst);
    const std::int64_t n_to = !c.p2p && !gradients && !embedding && n == from_.tp ? to_.tp : n;
    const auto& link = n > costs_.hw.nvlink_domain_size() ? costs_.profile.inter : costs_.profile.intra;
    double bytes = 0;
    if (const auto ne = tr.arg(c.op, trace::arg_key::in_msg_nelems); ne && *ne > 0) {
      const std::int64_t traced = trace::dtype_bytes(tr.arg_text(c.op, trace::arg_key::dtype));
      bytes = static_cast<double>(*ne) * (traced > 0 ? static_cast<double>(traced) : costs_.element_bytes);
    } else {
      bytes = c.p2p ? 0.0 : bytes_for_time(coll, d, n, link);
    }
    double ns = d;
    if (c.p2p) {
      if (bytes <= 0) bytes = act_from_ * costs_.element_bytes;
      const double old_ns = link.simple_base_ns + bytes / link.busbw * 1e9;
      const double new_ns = link.simple_base_ns + bytes * ratio / link.busbw * 1e9;
      ns = d * new_ns / old_ns;
    } else {
      ns = d * collective_ns(coll, bytes * ratio, n_to, link) / collective_ns(coll, bytes, n, link);
    }
    if (sp_ && !gradients && coll == model::collective::reduce_scatter) rank_[c.rank].act_old = base_from_, rank_[c.rank].act_new = base_to_;
    ++out_.communication;
    if (gradients || embedding) ++out_.gradient_communication;
    set(t, ns);
  }

  /// A GEMM or attention kernel under an operator with a recorded shape: by the model's time
  /// ratio of its dims mapped to the new shape; its output becomes the activation when it
  /// carries the tokens; from TP 1, the tensor-parallel collectives around it.
  void shaped(const gpu_op_context& c, graph::task_id t) {
    const double d = static_cast<double>(g_.duration[t]);
    const trace::rank_trace& tr = job_.ranks[c.rank];
    shape_rank_state& s = rank_[c.rank];
    const auto gs = gemm_of(tr.name(tr.events[c.shape_op]), parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)));
    const double input_width = s.act_new / static_cast<double>(std::max<std::int64_t>(1, to_.tokens()));
    const auto m = gs ? map_gemm(*gs, from_, to_, c.layer < 0, &out_.vocab_local, input_width) : std::nullopt;
    if (!m) {
      ++out_.unattributed;
      return;
    }
    const modelled r = model_ratio(*m);
    const bool tokens_out = writes_tokens(c, *m);
    if (tokens_out) s.act_old = r.out_old, s.act_new = r.out_new;
    const bool linear = m->from.kind == gemm_shape::role::linear;
    if (insert_sp_ && linear && !tokens_out && c.shape_op != s.last_gemm.first &&
        (c.layer >= 0 ? s.regather : out_.vocab_local > 0 && (m->from.m == out_.vocab_local || m->from.n == out_.vocab_local))) {
      // The weight gradient of a column-parallel GEMM (FC1, QKV, the logits) reads the
      // whole input, which sequence parallelism kept scattered: gathered again before it. In
      // the layers it follows its input gradient (linear layers' autograd order); the logits'
      // may come first (ATen's MmBackward), so it is known by its vocabulary dim.
      add_before(t, tp_message::gather);
    }
    if (insert_sp_ && linear && c.shape_op != s.last_gemm.first) s.regather = false;
    if (insert_tp_ && tokens_out && linear) {
      place_tp_hooks(c, t, m->from);
    } else if (linear && c.shape_op != s.last_gemm.first) {
      s.last_gemm = {c.shape_op, npos};
    }
    set(t, d * r.ratio);
  }

  /// The model's ratio for `m`, counted as a GEMM or an attention op.
  [[nodiscard]] modelled model_ratio(const mapped_gemm& m) {
    const auto& x = m.from;
    const auto& y = m.to;
    auto dd = [](std::int64_t v) { return static_cast<double>(v); };
    if (x.kind == gemm_shape::role::attention) {
      ++out_.attention;
      return {attention_model_ns(costs_, dd(y.b), dd(y.heads), dd(y.seq), dd(y.head_dim), to_.cp) /
                  attention_model_ns(costs_, dd(x.b), dd(x.heads), dd(x.seq), dd(x.head_dim), from_.cp),
              static_cast<double>(x.b * x.heads * x.seq * x.head_dim), static_cast<double>(y.b * y.heads * y.seq * y.head_dim)};
    }
    ++out_.gemm;
    return {gemm_model_ns(costs_, dd(y.batch), dd(y.m), dd(y.n), dd(y.k)) / gemm_model_ns(costs_, dd(x.batch), dd(x.m), dd(x.n), dd(x.k)),
            dd(x.batch) * dd(x.m) * dd(x.n), dd(y.batch) * dd(y.m) * dd(y.n)};
  }

  /// Whether mapped op `m` of `c` writes the tokens. When the tokens equal a width (tokens =
  /// hidden = FFN/TP, say), the dims do not say whether a backward GEMM is a dgrad (tokens out)
  /// or a weight gradient (tokens in K). Autograd runs a linear layer's dgrad, then right away
  /// its weight gradient: the GEMM right after a dgrad of the same dims (no other kernel but a
  /// reduction between: see `memory_bound`) is that weight gradient, and leaves the activation alone.
  [[nodiscard]] bool writes_tokens(const gpu_op_context& c, const mapped_gemm& m) {
    bool tokens_out = m.tokens_out;
    if (m.from.kind != gemm_shape::role::linear || c.phase != phase_kind::backward) return tokens_out;
    const auto& x = m.from;
    // A weight gradient's dims are its dgrad's in another order ([in, tokens] x [tokens, out]
    // against [tokens, out] x [out, in]): compared as a multiset.
    std::array<std::int64_t, 3> dims{x.m, x.k, x.n};
    std::sort(dims.begin(), dims.end());
    const bool ambiguous = x.k == from_.tokens() && (x.m == from_.tokens() || x.n == from_.tokens());
    auto& open = rank_[c.rank].open_dgrad;
    if (tokens_out && ambiguous && open && *open == dims) {
      tokens_out = false;
      open.reset();
    } else {
      open = tokens_out ? std::optional(dims) : std::nullopt;
    }
    return tokens_out;
  }

  /// From TP 1: the tensor-parallel collectives around tokens-out linear GEMM `t` of `c`, with
  /// traced dims `x` (see `shape_rank_state::layer_gemms` and `tp_hook`).
  void place_tp_hooks(const gpu_op_context& c, graph::task_id t, const gemm_shape& x) {
    shape_rank_state& s = rank_[c.rank];
    // One operator may launch several kernels (split-K and its reduction): it counts once,
    // the collectives before it precede its first kernel and those after it follow its last.
    if (c.shape_op == s.last_gemm.first) {
      if (s.last_gemm.second != npos) {
        for (std::size_t h = s.last_gemm.second; h < out_.tp_collectives.size(); ++h) out_.tp_collectives[h].after = t;
      }
      return;
    }
    s.last_gemm = {c.shape_op, npos};
    const std::int64_t width = x.m == from_.tokens() ? x.n : x.m;
    if (c.layer >= 0 && c.layer != s.layer) {
      check_layer_gemms(c.rank);
      s.layer = c.layer;
    }
    const std::array<std::int64_t, 5> key{x.m, x.n, x.k, c.layer, c.pass};
    const bool ffn_dim = x.m == from_.ffn_local() || x.n == from_.ffn_local() || x.k == from_.ffn_local();
    const bool fc1_second = c.layer >= 0 && ffn_dim && from_.ffn_local() != from_.hidden && s.fc1_first == key;
    if (c.layer >= 0) s.fc1_first = fc1_second ? std::nullopt : std::optional(key);
    if (fc1_second) {
      if (c.phase == phase_kind::backward && s.last_reduce != npos) {
        // The reduce moves to after this GEMM: last in the rank's launch order again.
        const tp_message what = out_.tp_collectives[s.last_reduce].message;
        out_.tp_collectives.erase(out_.tp_collectives.begin() + static_cast<std::ptrdiff_t>(s.last_reduce));
        s.last_reduce = npos;
        add_after(c.rank, t, what);
      }
    } else if (c.layer >= 0) {
      if (s.layer_gemms++ % 2 == 1) {
        s.last_reduce = out_.tp_collectives.size();
        reduce_after(c, t);
      } else if (insert_sp_) {
        add_before(t, tp_message::gather);  // QKV and FC1 forward, FC2 and attention-output input gradients
      }
    } else if (c.phase == phase_kind::backward && width == from_.hidden && x.k != from_.hidden) {
      reduce_after(c, t);  // the logits' input gradient: tokens x hidden out of tokens x V/TP
    } else if (c.phase == phase_kind::forward && x.k == from_.hidden && width != from_.hidden && width == out_.vocab_local) {
      // The logits (of the gathered final norm's output): the vocabulary-parallel
      // cross-entropy that follows reduces over TP.
      if (insert_sp_) add_before(t, tp_message::gather);
      add_after(c.rank, t, tp_message::loss_max), add_after(c.rank, t, tp_message::loss_sum), add_after(c.rank, t, tp_message::loss_sum);
    }
  }

  /// A row-parallel forward or column-parallel input gradient `t` of `c`: summed over TP, or
  /// reduce-scattered over the tokens (the activation after it is 1/TP of them).
  void reduce_after(const gpu_op_context& c, graph::task_id t) {
    if (!insert_sp_) return add_after(c.rank, t, tp_message::activation);
    add_after(c.rank, t, tp_message::scatter);
    shape_rank_state& s = rank_[c.rank];
    s.act_old = base_from_, s.act_new = base_to_;
    s.regather = c.phase == phase_kind::backward;
  }

  /// A memory-bound kernel (or copy, or set) in a pass: by the bytes of the activation it works on.
  void memory_bound(const gpu_op_context& c, graph::task_id t, std::string_view name) {
    ++out_.memory;
    shape_rank_state& s = rank_[c.rank];
    // A recomputed FC2 forward and the FC2 dgrad after it have the same dims when tokens =
    // hidden: only the kernels between them (the rest of the recomputed forward and the
    // backward up to the dgrad) tell that the dgrad is not its weight gradient.
    const std::string lname = lower_ascii(name);
    if (lname.find("reduce") == std::string::npos) s.open_dgrad.reset();
    bool scattered = false;
    if (insert_tp_ && c.phase == phase_kind::forward && c.layer < 0 && s.layer_gemms == 0 && !s.embedded && embedding_lookup(lname)) {
      // The vocabulary-parallel embedding sums its partial lookups over TP, or reduce-scatters
      // them over the tokens (the word embedding comes first, before the layers; a position
      // embedding after it is not parallel).
      s.embedded = true;
      out_.tp_collectives.push_back({t, insert_sp_ ? tp_message::scatter : tp_message::activation});
      scattered = insert_sp_;
    }
    if (insert_sp_ && c.phase == phase_kind::backward && c.layer < 0 && s.layer_gemms > 0 && !s.embedded && c.cpu_op != no_event) {
      // After the layers, the embedding's backward (its autograd node, EmbeddingBackward0, or
      // ATen's embedding_dense_backward) reads the whole gradient: gathered before it.
      const trace::rank_trace& tr = job_.ranks[c.rank];
      const std::string op = lower_ascii(tr.name(tr.events[c.cpu_op]));
      if (op.find("embedding") != std::string::npos && op.find("backward") != std::string::npos) {
        s.embedded = true;
        add_before(t, tp_message::gather);
        s.act_old = act_from_, s.act_new = act_to_;
      }
    }
    // Norms work on the residual stream (tokens x hidden, 1/TP of the tokens under SP) wherever
    // they sit: after a row-parallel GEMM's all-reduce, or in backward after a weight gradient.
    const bool norm = lname.find("layer_norm") != std::string::npos || lname.find("layernorm") != std::string::npos ||
                      lname.find("rms_norm") != std::string::npos || lname.find("rmsnorm") != std::string::npos ||
                      lname.find("gammabeta") != std::string::npos;
    const std::optional<double> params = parameter_operands(c);
    const double ratio = params ? *params : norm ? base_to_ / base_from_ : s.act_new / s.act_old;
    set(t, memory_scaled_ns(static_cast<double>(g_.duration[t]), ratio, min_ns_));
    if (scattered) s.act_old = base_from_, s.act_new = base_to_;
  }

  /// The ratio of `parameter_tensor_ratio` when every tensor the innermost operator around `c`
  /// reads (its recorded Input Dims) is parameter-shaped, the same for all; else nullopt.
  [[nodiscard]] std::optional<double> parameter_operands(const gpu_op_context& c) const {
    if (c.inner_op == no_event) return std::nullopt;
    const trace::rank_trace& tr = job_.ranks[c.rank];
    std::optional<double> out;
    for (const auto& d : parse_dims(tr.arg_text(c.inner_op, trace::arg_key::input_dims))) {
      if (d.empty()) continue;  // a scalar
      const auto r = parameter_tensor_ratio(d, from_, to_);
      if (!r || (out && *out != *r)) return std::nullopt;
      out = r;
    }
    return out;
  }

  /// A hook after `t` on `rank`, the first after the rank's current GEMM operator or not.
  void add_after(std::size_t rank, graph::task_id t, tp_message what) {
    std::size_t& hook = rank_[rank].last_gemm.second;
    if (hook == npos) hook = out_.tp_collectives.size();
    out_.tp_collectives.push_back({t, what});
  }

  /// A hook right before `t`: after the task before it on its processor.
  void add_before(graph::task_id t, tp_message what) {
    out_.tp_collectives.push_back({prev_task_[t] != graph::no_task ? prev_task_[t] : t, what});
  }

  /// Sets `t`'s duration to `ns`, rounded, counting the GPU time before and after.
  void set(graph::task_id t, double ns) {
    out_.before += g_.duration[t];
    g_.duration[t] = static_cast<time_ns>(std::llround(ns));
    out_.after += g_.duration[t];
  }

  graph::built_job& b_;
  graph::task_graph& g_;
  const trace::job& job_;
  const job_structure& st_;
  const shape_config& from_;
  const shape_config& to_;
  const shape_costs& costs_;
  tied_embedding_test tied_embedding_;
  std::vector<shape_rank_state> rank_;
  double min_ns_ = 0, act_from_ = 0, act_to_ = 0;  ///< tokens x hidden, traced and new
  std::vector<double> param_ratio_;                ///< per rank: `parameter_ratios`
  std::map<std::string, bool> gradient_group_;     ///< `gradient_groups`
  std::set<std::string> cp_groups_;               ///< the CP groups: their exchanges are the CP pass's
  std::map<graph::task_id, const graph::collective_instance*> instance_;
  std::vector<std::uint8_t> buckets_in_layers_;
  double embedding_ratio_ = 1.0;                   ///< the tied embedding's gradients: V/TP x hidden, new over traced
  bool sp_ = false, insert_tp_ = false, insert_sp_ = false;
  double base_from_ = 0, base_to_ = 0;             ///< the activation between the GEMMs (1/TP of it under SP)
  std::vector<graph::task_id> prev_task_;          ///< the task before each on its processor (inserted SP)
  shape_stats out_;
};

}  // namespace detail

/// Rescales every GPU op of the iteration in `b` from shape `from` to `to` (see the header
/// comment). `st` must be `discover_structure(job, b)` of the unedited graph. `layers_to` (0: the
/// traces' layers) and `pp_to` (0: the traces' stages) the target's layer and stage counts for the
/// parameter-proportional work (optimizer, gradient collectives): the layer what-if copies the
/// layers' own work but not this, and the pipeline model replaces the passes but not this. A
/// traced stage stands for `traced_stage_to` of the target. With `from == to` only that work
/// changes. Deterministic; O(GPU ops).
inline shape_stats rescale_shape(graph::built_job& b, const trace::job& job, const job_structure& st,
                                 const shape_config& from, const shape_config& to, const shape_costs& costs,
                                 bool gated = false, int layers_to = 0, int pp_to = 0) {
  return detail::shape_rescaler(b, job, st, from, to, costs, gated, layers_to, pp_to).run();
}

/// A distributed optimizer (Megatron's `--use-distributed-optimizer`, ZeRO-1: gradients
/// reduce-scattered and parameters all-gathered over DP, which `st.gradients.method` tells) steps
/// only its rank's 1/DP of the parameters: with DP `dp_from` -> `dp_to` the optimizer phase's
/// kernels work on dp_from/dp_to of their bytes (memory-bound, down to `min_ns`). Any other
/// gradient reduction (all-reduce: every rank steps every parameter) leaves them as they are;
/// `optimizer` in the result is 0 then. The collectives are the DP rewrite's. `inserted`: the
/// traces had one replica and the DP rewrite inserted a distributed optimizer's collectives.
inline shape_stats shard_optimizer(graph::built_job& b, const job_structure& st, int dp_from, int dp_to, double min_ns,
                                   bool inserted = false) {
  shape_stats out;
  const bool distributed = inserted || st.gradients.method.value == std::string("reduce-scatter + all-gather");
  if (dp_from == dp_to || dp_from <= 0 || dp_to <= 0 || !distributed) return out;
  const double ratio = static_cast<double>(dp_from) / static_cast<double>(dp_to);
  graph::task_graph& g = b.graph;
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.comm || c.phase != phase_kind::optimizer) continue;
    const auto& map = b.ranks[c.rank];
    if (c.op >= map.task_of_event.size()) continue;
    const graph::task_id t = map.task_of_event[c.op];
    if (t == graph::no_task || g.kind[t] != graph::task_kind::gpu_compute) continue;
    out.before += g.duration[t];
    g.duration[t] = static_cast<time_ns>(std::llround(detail::memory_scaled_ns(static_cast<double>(g.duration[t]), ratio, min_ns)));
    out.after += g.duration[t];
    ++out.optimizer;
  }
  out.parameter_ratio = ratio;
  return out;
}

/// Calls `field(name, traced, target)` for each field a shape change can change, in the order
/// its sentence and its record name them.
template <class Field>
void for_each_shape_field(const shape_config& a, const shape_config& b, Field&& field) {
  field("hidden", a.hidden, b.hidden);
  field("FFN", a.ffn, b.ffn);
  field("heads", a.heads, b.heads);
  field("head dim", a.head_dim, b.head_dim);
  field("sequence", a.seq, b.seq);
  field("micro-batch", a.micro_batch, b.micro_batch);
  field("TP", a.tp, b.tp);
  field("CP", a.cp, b.cp);
}

/// One sentence per shape rewrite for `changes`.
[[nodiscard]] inline std::string describe(const shape_config& a, const shape_config& b, const shape_stats& s) {
  std::string what;
  auto field = [&](const char* name, std::int64_t x, std::int64_t y) {
    if (x != y)
      what += (what.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(x) + " -> " + std::to_string(y);
  };
  for_each_shape_field(a, b, field);
  if (what.empty()) what = "the traces' own shape";
  if (s.sequence_parallel) what += " (sequence parallel: activations between the GEMMs are 1/TP of the tokens)";
  char line[768];
  std::snprintf(line, sizeof line,
                "shape %s: %zu GEMM and %zu attention ops rescaled through the kernel-level GEMM/attention model, %zu "
                "memory-bound ops by "
                "their activation bytes, %zu optimizer ops by parameters per rank, %zu communication ops through the "
                "NCCL model; %zu "
                "ops outside the passes and host copies and %zu compute ops whose shape did not map unchanged: %.3f -> "
                "%.3f ms of GPU time",
                what.c_str(), s.gemm, s.attention, s.memory, s.optimizer, s.communication, s.unchanged_outside,
                s.unattributed, static_cast<double>(s.before) / 1e6, static_cast<double>(s.after) / 1e6);
  return line;
}

/// The shape change as a record: the fields that changed (their traced and target values) and
/// what the rescaling did.
[[nodiscard]] inline change shape_change(const shape_config& a, const shape_config& b, const shape_stats& s) {
  std::string from, to;
  auto field = [&](const char* name, std::int64_t x, std::int64_t y) {
    if (x == y) return;
    from += (from.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(x);
    to += (to.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(y);
  };
  for_each_shape_field(a, b, field);
  return changed("shape", "shape", from, to, describe(a, b, s),
                 {time_figure("GPU op time", s.before, s.after), count_figure("GEMM ops rescaled", s.gemm),
                  count_figure("attention ops rescaled", s.attention), count_figure("memory-bound ops rescaled", s.memory),
                  count_figure("optimizer ops rescaled", s.optimizer), count_figure("communication ops rescaled", s.communication)});
}

/// Pass: the model-shape rewrite (`--hidden/--ffn/--heads/--seq/--micro-batch/--tp`), and the
/// work that follows the parameter count (optimizer kernels, gradient collectives) for a layer or
/// stage change, whose layer copies (or pipeline model) repeat each layer's own work only. It runs
/// first, so that the later passes start from the rescaled durations. Sets `ctx.shape_from`,
/// `ctx.shape_to` and, from TP 1, `ctx.tp_hooks`.
struct shape_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept {
    return ctx.options.shape.any() || ctx.options.layers || ctx.options.pp;
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const whatif_options& o = ctx.options;
    const job_structure& st = ctx.structure(b);
    change_list out;
    const int layer_params = o.layers.value_or(0);
    const int pp_params = o.pp && *o.pp != ctx.traced_pp() ? *o.pp : 0;
    std::optional<shape_config> layers_shape;
    if (const auto mixed = pp_params ? mixed_layers(st) : std::nullopt) {
      throw error("whatif --pp " + std::to_string(pp_params) + ": the traces mix dense and MoE layers (" + std::to_string(mixed->first) +
                  " MoE of " + std::to_string(mixed->second) + " layers per pass on rank 0): the parameters of each target stage, "
                  "which its optimizer steps and its gradients reduce, are counted on dense or on MoE layers, not on both");
    }
    if ((layer_params || pp_params) && !o.shape.any()) {
      try {
        layers_shape = traced_shape(st);
      } catch (const error& e) {
        // A layer or stage change on MoE layers: the MoE pass counts their parameters (whatif/moe.hpp).
        if (!st.moe.found()) {
          out.push_back(note("shape", "optimizer and gradient work", std::string("optimizer and gradient work kept as traced: ") + e.what()));
        }
      }
    }
    if (!o.shape.any() && !layers_shape) return out;
    ctx.shape_from = layers_shape ? *layers_shape : traced_shape(st, true);
    if (ctx.shape_from->ffn == 0) refuse_moe_weight_changes(o.shape, layer_params || pp_params);
    // Dense layers beside MoE ones (DeepSeek's first layers): the rewrite would take the experts'
    // GEMMs for the dense MLP's, while the experts keep their own TP and grid.
    if (o.shape.tp && *o.shape.tp != ctx.shape_from->tp && st.moe.found()) {
      throw error("whatif --tp " + std::to_string(*o.shape.tp) + ": the traces' layers include MoE layers (" + std::to_string(*st.moe.layers.value) +
                  " per pass, expert TP " + std::to_string(traced_expert_tp(st)) +
                  "); a TP change is not modelled on them (their experts, expert-TP collectives and expert grid would have to follow)");
    }
    ctx.shape_to = layers_shape ? *layers_shape : target_shape(*ctx.shape_from, o.shape);
    const shape_config& from = *ctx.shape_from;
    const shape_config& to = *ctx.shape_to;
    const shape_costs& costs = ctx.costs(b);
    if (!ctx.costs_note().empty()) out.push_back(note("shape", "cost profile", ctx.costs_note()));
    // The exchange of the CP ranks is the CP pass's: it leaves every kernel's shape as it is.
    shape_config dims = to;
    dims.cp_comm = from.cp_comm;
    if (dims == from && !layer_params && !pp_params) {
      out.push_back(note("shape", "shape", "shape: the traces' own (nothing rescaled)"));
      return out;
    }
    const shape_stats ss = rescale_shape(b, ctx.job, st, from, to, costs, st.model.gated_mlp, layer_params, pp_params);
    if (dims == from) {
      out.push_back(parameter_change(ss, layer_params && pp_params ? "layers and stages" : pp_params ? "stages" : "layers"));
    } else {
      out.push_back(shape_change(from, to, ss));
      ctx.tp_hooks = ss.tp_collectives;
    }
    return out;
  }

  /// The work that follows the parameters, rescaled with `what` (the layers, the stages or both).
  [[nodiscard]] static change parameter_change(const shape_stats& ss, const char* what) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "parameters per rank x%.3f (rank 0) with the %s: %zu optimizer ops and %zu gradient collectives rescaled, %.3f -> "
                  "%.3f ms of GPU time",
                  ss.parameter_ratio, what, ss.optimizer, ss.gradient_communication, static_cast<double>(ss.before) / 1e6,
                  static_cast<double>(ss.after) / 1e6);
    return changed("shape", "parameters per rank", "x1", "x" + decimal(ss.parameter_ratio, 3), line,
                   {time_figure("GPU op time", ss.before, ss.after), count_figure("optimizer ops rescaled", ss.optimizer),
                    count_figure("gradient collectives rescaled", ss.gradient_communication)});
  }
};
static_assert(Rewrite<shape_pass>);

} // namespace lumos::whatif

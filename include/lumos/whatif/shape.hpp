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
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/gpu_change.hpp>
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

[[nodiscard]] inline double attention_model_ns(const shape_costs& c, double b, double heads, double s, double d) {
  const double flops = 4.0 * b * s * s * heads * d * 0.5; // causal: half the dense FLOPs
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

struct mapped_gemm {
  detail::gemm_shape from, to;
  bool tokens_out = true; ///< the output carries the tokens (else a weight gradient)
};

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

/// The key/value heads of a grouped-query QKV GEMM of width `w` per rank (q + 2·kv_heads·d/TP),
/// when `w` reads as one.
[[nodiscard]] inline std::optional<std::int64_t> gqa_kv_heads(std::int64_t w, const shape_config& a) {
  const std::int64_t kv2 = w - a.q_local();
  if (a.head_dim <= 0 || kv2 <= 0 || kv2 >= 2 * a.q_local() || kv2 % (2 * a.head_dim) != 0) return std::nullopt;
  return kv2 / (2 * a.head_dim) * a.tp;
}

/// Maps one GEMM or attention operator's shape from `a` to `b`; nullopt when its dims are not
/// the ones a transformer layer (or, `outside` the layers, the logits head) has.
[[nodiscard]] inline std::optional<detail::mapped_gemm> map_gemm(const detail::gemm_shape& g, const shape_config& a,
                                                                 const shape_config& b, bool outside,
                                                                 std::int64_t* vocab_local = nullptr,
                                                                 double input_width = 0) {
  detail::mapped_gemm r;
  r.from = r.to = g;
  using role = detail::gemm_shape::role;
  if (g.kind == role::attention) {
    if (g.heads != a.heads_local() || g.seq != a.seq || g.head_dim != a.head_dim || g.b != a.micro_batch)
      return std::nullopt;
    r.to.b = b.micro_batch, r.to.heads = b.heads_local(), r.to.seq = b.seq, r.to.head_dim = b.head_dim;
    return r;
  }
  if (g.kind == role::batched) {
    if (g.batch != a.micro_batch * a.heads_local()) return std::nullopt;
    r.to.batch = b.micro_batch * b.heads_local();
    for (std::int64_t* d : {&r.to.m, &r.to.n, &r.to.k}) {
      if (*d == a.seq) {
        *d = b.seq;
      } else if (*d == a.head_dim) {
        *d = b.head_dim;
      } else {
        return std::nullopt;
      }
    }
    return r;
  }
  // Linear: one dim is the tokens (M forward and dgrad, K for a weight gradient), one the hidden
  // width, one an inner width. When values coincide (tokens = hidden) either choice gives the same
  // multiset of new dims, and the GEMM model is symmetric in M, N, K.
  std::int64_t* dims[3] = {&r.to.m, &r.to.k, &r.to.n};
  int tok = -1;
  for (int i = 0; i < 3 && tok < 0; ++i) {
    if (*dims[i] == a.tokens()) tok = i;
  }
  if (tok < 0) return std::nullopt;
  r.tokens_out = tok != 1;
  std::int64_t* w[2];
  for (int i = 0, j = 0; i < 3; ++i) {
    if (i != tok) w[j++] = dims[i];
  }
  const std::int64_t inner_from[4] = {3 * a.q_local(), a.q_local(), a.ffn_local(), 2 * a.ffn_local()};
  const std::int64_t inner_to[4] = {3 * b.q_local(), b.q_local(), b.ffn_local(), 2 * b.ffn_local()};
  auto inner = [&](std::int64_t v) -> std::optional<std::int64_t> {
    for (int i = 0; i < 4; ++i) {
      if (v == inner_from[i]) return inner_to[i];
    }
    return std::nullopt;
  };
  int hid = *w[0] == a.hidden ? 0 : *w[1] == a.hidden ? 1 : -1;
  if (hid < 0) return std::nullopt;
  std::int64_t* other = w[1 - hid];
  const std::int64_t old_other = *other;
  *w[hid] = b.hidden;
  if (const auto v = inner(old_other)) {
    *other = *v;
  } else if (old_other == a.hidden) {
    *other = b.hidden;
  } else if (const auto kv = gqa_kv_heads(old_other, a); kv && *kv % b.tp == 0) {
    // Grouped-query attention: QKV writes q + 2·kv_heads·d per rank; the KV heads stay.
    *other = b.q_local() + 2 * (*kv / b.tp) * b.head_dim;
  } else if (kv && !outside) {
    // Megatron shards whole key/value groups: no such TP exists (synth and predict refuse it too).
    throw error("whatif --tp " + std::to_string(b.tp) + ": the traced QKV GEMMs hold " + std::to_string(*kv) +
                " key/value heads (grouped-query attention), which do not divide over " + std::to_string(b.tp) +
                " tensor-parallel ranks");
  } else if (outside) {
    // The logits GEMM: the vocabulary shard, V/TP.
    if (vocab_local) *vocab_local = old_other;
    if ((old_other * a.tp) % b.tp != 0) return std::nullopt;
    *other = old_other * a.tp / b.tp;
  } else {
    return std::nullopt;
  }
  *dims[tok] = b.tokens();
  // K and the output width had the same size in the traces (hidden = FFN/TP, say) and map to
  // different ones: K is the width of the activation the GEMM reads (`input_width`, in the new
  // shape; 0 when unknown). FC1 and FC2 of such a model differ only in this.
  if (r.tokens_out && input_width > 0) {
    std::int64_t& out_to = tok == 0 ? r.to.n : r.to.m;
    const std::int64_t out_from = tok == 0 ? r.from.n : r.from.m;
    if (r.from.k == out_from && r.to.k != out_to &&
        std::abs(static_cast<double>(out_to) - input_width) < std::abs(static_cast<double>(r.to.k) - input_width)) {
      std::swap(r.to.k, out_to);
    }
  }
  return r;
}

/// V/TP from the first GEMM outside the layers whose third width is neither hidden nor a layer
/// width (the logits); 0 when there is none.
[[nodiscard]] inline std::int64_t traced_vocab_local(const trace::job& job, const job_structure& st,
                                                     const shape_config& from) {
  std::int64_t vocab_local = 0;
  for (const auto& c : st.gpu_ops) {
    if (c.layer >= 0 || c.shape_op == detail::no_event || vocab_local) continue;
    const auto& tr = job.ranks[c.rank];
    if (const auto gs = detail::gemm_of(tr.name(tr.events[c.shape_op]),
                                        detail::parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)))) {
      (void)map_gemm(*gs, from, from, true, &vocab_local);
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
  shape_stats out;
  graph::task_graph& g = b.graph;
  const double min_ns = costs.profile.min_kernel_ns;
  const double act_from = static_cast<double>(from.tokens()) * static_cast<double>(from.hidden);
  const double act_to = static_cast<double>(to.tokens()) * static_cast<double>(to.hidden);
  // Parameters per rank of each rank's stage (flops.hpp's count: layers, and the embedding on the
  // first and last stage with the vocabulary when a logits GEMM names it).
  const std::int64_t vocab_local = traced_vocab_local(job, st, from);
  std::vector<double> param_ratio(job.ranks.size(), 1.0);
  for (std::size_t ri = 0; ri < job.ranks.size(); ++ri) {
    const int stage = ri < st.ranks.size() ? st.ranks[ri].stage.value.value_or(0) : 0;
    const int pp_from = std::max(st.parallel.pp.value.value_or(1), 1);
    const int stage_to = traced_stage_to(stage, pp_from, pp_to > 0 ? pp_to : pp_from);
    param_ratio[ri] = parameters_per_rank(to, st, stage_to, vocab_local * from.tp, gated, layers_to, pp_to) /
                      parameters_per_rank(from, st, stage, vocab_local * from.tp, gated);
  }
  if (!param_ratio.empty()) out.parameter_ratio = param_ratio.front();
  std::map<std::string, bool> dp_group; // process group name → has the DP role and not TP
  for (const auto& pg : st.groups) {
    bool dp = false, tp = false;
    for (const auto& r : pg.roles) {
      dp = dp || (r.value && *r.value == group_role::dp);
      tp = tp || (r.value && *r.value == group_role::tp);
    }
    dp_group[pg.name] = dp && !tp;
  }
  std::map<graph::task_id, const graph::collective_instance*> instance;
  for (const auto& ci : g.collectives) {
    for (const graph::task_id c : ci.complete) instance[c] = &ci;
  }
  // Per rank: whether its gradient buckets are reduced inside the backward's layers (Megatron's
  // overlap_grad_reduce), where they travel with their layers (see `in_layer_bucket` below).
  std::vector<std::uint8_t> buckets_in_layers(job.ranks.size(), 0);
  for (const gpu_op_context& c : st.gpu_ops) {
    if (!c.comm || c.p2p || c.phase != phase_kind::backward || c.layer < 0) continue;
    const auto known = dp_group.find(std::string(job.ranks[c.rank].arg_text(c.op, trace::arg_key::process_group_name)));
    if (known != dp_group.end() && known->second) buckets_in_layers[c.rank] = 1;
  }
  // The tied embedding's gradient all-reduce (Megatron's EMBEDDING_GROUP): a collective of a
  // group with no TP, DP or world role whose members sit on more than one pipeline stage. It runs
  // after the backward and carries the embedding's gradients, V/TP × hidden per rank; its group
  // size is no TP size even when the two coincide.
  std::set<std::string> has_role;
  for (const auto& pg : st.groups) {
    for (const auto& r : pg.roles) {
      if (r.value && (*r.value == group_role::tp || *r.value == group_role::dp || *r.value == group_role::world)) {
        has_role.insert(pg.name);
      }
    }
  }
  std::map<int, int> stage_of_rank;
  for (std::size_t ri = 0; ri < job.ranks.size() && ri < st.ranks.size(); ++ri) {
    if (st.ranks[ri].stage.value) stage_of_rank[job.ranks[ri].rank] = *st.ranks[ri].stage.value;
  }
  auto tied_embedding = [&](const graph::collective_instance& ci) {
    if (has_role.count(ci.group) || ci.kind == "sendrecv" || ci.kind == "send_recv") return false;
    std::set<int> stages;
    for (const graph::task_id c : ci.complete) {
      if (const auto it = stage_of_rank.find(g.rank[c]); it != stage_of_rank.end()) stages.insert(it->second);
    }
    return stages.size() > 1;
  };
  const double embedding_ratio = static_cast<double>(from.tp) / static_cast<double>(to.tp) *
                                 static_cast<double>(to.hidden) / static_cast<double>(from.hidden);
  // Sequence parallelism (a reduce-scatter inside the forward passes): between the layers'
  // GEMMs each rank holds its 1/TP of the tokens, so norms, residuals and dropout work on
  // tokens × hidden / TP.
  bool sp = false;
  for (const auto& c : st.gpu_ops) {
    const auto& tr = job.ranks[c.rank];
    sp = sp || (c.comm && !c.p2p && c.phase == phase_kind::forward &&
                detail::comm_kind(tr.name(tr.events[c.op]), tr.arg_text(c.op, trace::arg_key::collective_name)) ==
                    "reducescatter");
  }
  // From TP 1 the tensor-parallel collectives are inserted (all-reduces, or with sequence
  // parallelism reduce-scatters and all-gathers): see `tp_hook`.
  const bool insert_tp = from.tp == 1 && to.tp > 1;
  const bool insert_sp = insert_tp && to.sp;
  const double base_from = act_from / (sp ? from.tp : 1), base_to = act_to / (sp || insert_sp ? to.tp : 1);
  if (sp || insert_sp) out.sequence_parallel = true;
  std::vector<double> act_old(job.ranks.size(), base_from), act_new(job.ranks.size(), base_to);
  std::vector<int> pass_of(job.ranks.size(), -1);
  // Per rank, the traced dims of the last backward GEMM read as a dgrad (tokens out), while its
  // weight gradient has not been seen: see `weight_gradient` below.
  std::vector<std::optional<std::array<std::int64_t, 3>>> open_dgrad(job.ranks.size());
  // From TP 1: the tokens-out linear GEMMs of the layers in each pass, counted per rank. Forward
  // runs QKV, attention output, FC1, FC2; backward (after the recomputed forward's four, when
  // recomputing) the input gradients of FC2, FC1, attention output, QKV: in either direction the
  // all-reduce (or reduce-scatter) follows every second one, and with sequence parallelism an
  // all-gather precedes the others. A gated MLP (SwiGLU: Llama) with separate gate and up GEMMs
  // runs FC1 as two GEMMs of the same dims, one right after the other: the second is not counted
  // (forward: it reads the input the first gathered; backward: the two input gradients sum into
  // one, so the reduce that followed the first follows the second).
  std::vector<std::size_t> layer_gemms(job.ranks.size(), 0);
  // Per rank: the layer being counted and the count at its start (each layer runs a multiple of 4).
  std::vector<int> layer_of(job.ranks.size(), -1);
  std::vector<std::size_t> layer_begin(job.ranks.size(), 0);
  // Per rank: the dims, layer and pass of the last tokens-out GEMM of a layer, and the index in
  // `tp_collectives` of the reduce that followed it (npos: none), for the second half of FC1.
  std::vector<std::optional<std::array<std::int64_t, 5>>> fc1_first(job.ranks.size());
  std::vector<std::size_t> last_reduce(job.ranks.size(), ~std::size_t{0});
  // Sequence parallelism: per rank, whether the GEMM seen last was an input gradient followed by
  // a reduce-scatter, whose weight gradient (next) gathers its input again.
  std::vector<bool> regather(job.ranks.size(), false);
  // The task before each on its processor: an all-gather goes right before the GEMM it feeds.
  std::vector<graph::task_id> prev_task;
  if (insert_sp) {
    prev_task.assign(g.task_count(), graph::no_task);
    std::vector<graph::task_id> last(g.processors.size(), graph::no_task);
    for (graph::task_id t = 0; t < g.task_count(); ++t) prev_task[t] = std::exchange(last[g.processor[t]], t);
  }
  auto add_before = [&](graph::task_id t, tp_message what) {
    out.tp_collectives.push_back({prev_task[t] != graph::no_task ? prev_task[t] : t, what});
  };
  constexpr std::size_t npos = ~std::size_t{0};
  // Per rank: the GEMM operator seen last and the first of the hooks that follow it.
  std::vector<std::pair<std::uint32_t, std::size_t>> last_gemm(job.ranks.size(), {detail::no_event, npos});
  // Per rank: whether the current forward pass has had its embedding lookup.
  std::vector<bool> embedded(job.ranks.size(), false);
  // Checked per layer: a count that is wrong in every layer can still add up to a multiple of 4.
  auto check_layer_gemms = [&](std::size_t rank) {
    const std::size_t n = layer_gemms[rank] - layer_begin[rank];
    layer_begin[rank] = layer_gemms[rank];
    if (!insert_tp || n % 4 == 0) return;
    throw error("whatif --tp " + std::to_string(to.tp) + ": layer " + std::to_string(layer_of[rank]) + " in pass " +
                std::to_string(pass_of[rank]) + " of rank " + std::to_string(job.ranks[rank].rank) + " runs " +
                std::to_string(n) +
                " activation GEMMs, not a multiple of 4 (QKV, attention output, FC1, FC2), so the "
                "tensor-parallel all-reduces cannot be placed (GEMMs without recorded shapes, or a layer of "
                "another kind)");
  };
  auto set = [&](graph::task_id t, double ns) {
    out.before += g.duration[t];
    g.duration[t] = static_cast<time_ns>(std::llround(ns));
    out.after += g.duration[t];
  };
  for (const gpu_op_context& c : st.gpu_ops) {
    // A forward pass starts from tokens × hidden (the embedding, or the activation received from
    // the previous stage); a backward pass goes on from its forward's last output (the logits
    // for the loss gradient on the last stage).
    if (c.pass >= 0 && c.pass != pass_of[c.rank]) {
      check_layer_gemms(c.rank);
      layer_gemms[c.rank] = 0;
      layer_begin[c.rank] = 0;
      layer_of[c.rank] = -1;
      fc1_first[c.rank].reset();
      last_reduce[c.rank] = npos;
      embedded[c.rank] = false;
      regather[c.rank] = false;
      pass_of[c.rank] = c.pass;
      open_dgrad[c.rank].reset();
      const auto& passes = st.ranks[c.rank].passes;
      if (static_cast<std::size_t>(c.pass) < passes.size() &&
          passes[static_cast<std::size_t>(c.pass)].op.kind == pipeline::op_kind::forward) {
        act_old[c.rank] = base_from, act_new[c.rank] = base_to;
        // Inserted sequence parallelism: the embedding lookup's output is whole until its
        // reduce-scatter (a later stage starts from its scattered input, which only the norm reads).
        if (insert_sp) act_new[c.rank] = act_to;
      }
    }
    const trace::rank_trace& tr = job.ranks[c.rank];
    const auto& map = b.ranks[c.rank];
    if (c.op >= map.task_of_event.size()) continue;
    const graph::task_id t = map.task_of_event[c.op];
    if (t == graph::no_task) continue;
    const auto kind = g.kind[t];
    if (kind != graph::task_kind::gpu_compute && kind != graph::task_kind::gpu_comm &&
        kind != graph::task_kind::comm_complete)
      continue;
    const double d = static_cast<double>(g.duration[t]);
    const bool in_pass = c.phase == phase_kind::forward || c.phase == phase_kind::backward;
    if (c.comm || kind != graph::task_kind::gpu_compute) {
      const auto inst = instance.find(t);
      const bool embedding = !c.p2p && inst != instance.end() && tied_embedding(*inst->second);
      // Point-to-point transfers carry a pass's activation or its gradient but are launched
      // between the passes (the receive before, the send after): rescaled wherever they sit.
      // (Left as traced, --hidden 4096 on gpt3-15b TP 2 PP 4 DP 2 was +1.68 %, and +10.3 % with
      // --tp 4, whose new placement then re-timed them x7.)
      if (!in_pass && !c.p2p && c.phase != phase_kind::optimizer && !embedding) {
        ++out.unchanged_outside;
        continue;
      }
      const std::string kname =
          detail::comm_kind(tr.name(tr.events[c.op]), tr.arg_text(c.op, trace::arg_key::collective_name));
      const std::string pg(tr.arg_text(c.op, trace::arg_key::process_group_name));
      const auto known = dp_group.find(pg);
      const bool gradients =
          !c.p2p && (known != dp_group.end() && !pg.empty()
                         ? known->second
                         : c.phase == phase_kind::optimizer || (c.phase == phase_kind::backward && c.layer < 0));
      // Gradient buckets reduced during the backward (overlap_grad_reduce: each launched inside the
      // layer whose gradients complete it) travel with their layers: copies of the layers
      // (--layers, a merge of stages) or a stage split already change how many buckets a rank
      // reduces, so at an unchanged shape each keeps its size, the last (after the layers) too.
      // Reduced after the backward or in the optimizer step, they follow the parameters per rank.
      // (llama3-8b TP 2 PP 1 DP 2 --pp 2 --dp 4 counted the change twice: +2.9 %.)
      const bool in_layer_bucket = gradients && c.phase == phase_kind::backward && buckets_in_layers[c.rank] && from == to;
      // A p2p transfer is one activation, 1/TP of it under sequence parallelism (Megatron's
      // scatter-gather of pipeline tensors; model::pipeline_p2p_bytes).
      const double ratio = embedding ? embedding_ratio : gradients ? (in_layer_bucket ? 1.0 : param_ratio[c.rank])
                                                     : c.p2p      ? base_to / base_from
                                                                  : act_to / act_from;
      const auto coll = modelled_collective(kname);
      std::int64_t n = 2;
      if (inst != instance.end()) {
        n = static_cast<std::int64_t>(inst->second->group_ranks.empty() ? inst->second->arrive.size()
                                                                        : inst->second->group_ranks.size());
      } else if (const auto gs = tr.arg(c.op, trace::arg_key::group_size)) {
        n = detail::group_size_of(*gs).value_or(2);
      }
      const std::int64_t n_to = !c.p2p && !gradients && !embedding && n == from.tp ? to.tp : n;
      const bool cross_node = n > costs.hw.gpus_per_node;
      const auto& link = cross_node ? costs.profile.inter : costs.profile.intra;
      double bytes = 0;
      if (const auto ne = tr.arg(c.op, trace::arg_key::in_msg_nelems); ne && *ne > 0) {
        bytes = static_cast<double>(*ne) * costs.element_bytes;
      } else {
        bytes = c.p2p ? 0.0 : bytes_for_time(coll, d, n, link);
      }
      double ns = d;
      if (c.p2p) {
        if (bytes <= 0) bytes = act_from * costs.element_bytes;
        const double old_ns = link.simple_base_ns + bytes / link.busbw * 1e9;
        const double new_ns = link.simple_base_ns + bytes * ratio / link.busbw * 1e9;
        ns = d * new_ns / old_ns;
      } else {
        ns = d * collective_ns(coll, bytes * ratio, n_to, link) / collective_ns(coll, bytes, n, link);
      }
      if (sp && !gradients && coll == model::collective::reduce_scatter)
        act_old[c.rank] = base_from, act_new[c.rank] = base_to;
      ++out.communication;
      if (gradients || embedding) ++out.gradient_communication;
      set(t, ns);
      continue;
    }
    const std::string_view name = tr.name(tr.events[c.op]);
    if (classify(kind, name) == op_bound::host_copy) {
      ++out.unchanged_outside;
      continue;
    }
    if (c.phase == phase_kind::optimizer) {
      ++out.optimizer;
      set(t, detail::memory_scaled_ns(d, param_ratio[c.rank], min_ns));
      continue;
    }
    if (!in_pass) {
      ++out.unchanged_outside;
      continue;
    }
    if (c.shape_op != detail::no_event) {
      const auto gs = detail::gemm_of(tr.name(tr.events[c.shape_op]),
                                      detail::parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)));
      const double input_width = act_new[c.rank] / static_cast<double>(std::max<std::int64_t>(1, to.tokens()));
      const auto m = gs ? map_gemm(*gs, from, to, c.layer < 0, &out.vocab_local, input_width) : std::nullopt;
      if (!m) {
        ++out.unattributed;
        continue;
      }
      double ratio = 1.0;
      double out_old = 0, out_new = 0;
      if (m->from.kind == detail::gemm_shape::role::attention) {
        ++out.attention;
        const auto& x = m->from;
        const auto& y = m->to;
        ratio = detail::attention_model_ns(costs, static_cast<double>(y.b), static_cast<double>(y.heads),
                                           static_cast<double>(y.seq), static_cast<double>(y.head_dim)) /
                detail::attention_model_ns(costs, static_cast<double>(x.b), static_cast<double>(x.heads),
                                           static_cast<double>(x.seq), static_cast<double>(x.head_dim));
        out_old = static_cast<double>(x.b * x.heads * x.seq * x.head_dim);
        out_new = static_cast<double>(y.b * y.heads * y.seq * y.head_dim);
      } else {
        ++out.gemm;
        const auto& x = m->from;
        const auto& y = m->to;
        auto dd = [](std::int64_t v) { return static_cast<double>(v); };
        ratio = detail::gemm_model_ns(costs, dd(y.batch), dd(y.m), dd(y.n), dd(y.k)) /
                detail::gemm_model_ns(costs, dd(x.batch), dd(x.m), dd(x.n), dd(x.k));
        out_old = dd(x.batch) * dd(x.m) * dd(x.n);
        out_new = dd(y.batch) * dd(y.m) * dd(y.n);
      }
      // When the tokens equal a width (tokens = hidden = FFN/TP, say), the dims do not say
      // whether a backward GEMM is a dgrad (tokens out) or a weight gradient (tokens in K).
      // Autograd runs a linear layer's dgrad, then right away its weight gradient: the GEMM
      // right after a dgrad of the same dims (no other kernel but a reduction between: see the
      // memory-bound ops below) is that weight gradient, and leaves the activation alone.
      bool tokens_out = m->tokens_out;
      if (m->from.kind == detail::gemm_shape::role::linear && c.phase == phase_kind::backward) {
        const auto& x = m->from;
        // A weight gradient's dims are its dgrad's in another order ([in, tokens] x [tokens, out]
        // against [tokens, out] x [out, in]): compared as a multiset.
        std::array<std::int64_t, 3> dims{x.m, x.k, x.n};
        std::sort(dims.begin(), dims.end());
        const bool ambiguous = x.k == from.tokens() && (x.m == from.tokens() || x.n == from.tokens());
        auto& open = open_dgrad[c.rank];
        if (tokens_out && ambiguous && open && *open == dims) {
          tokens_out = false;
          open.reset();
        } else {
          open = tokens_out ? std::optional(dims) : std::nullopt;
        }
      }
      if (tokens_out) act_old[c.rank] = out_old, act_new[c.rank] = out_new;
      const bool linear = m->from.kind == detail::gemm_shape::role::linear;
      if (insert_sp && linear && !tokens_out && c.shape_op != last_gemm[c.rank].first &&
          (c.layer >= 0 ? bool(regather[c.rank])
                        : out.vocab_local > 0 && (m->from.m == out.vocab_local || m->from.n == out.vocab_local))) {
        // The weight gradient of a column-parallel GEMM (FC1, QKV, the logits) reads the
        // whole input, which sequence parallelism kept scattered: gathered again before it. In
        // the layers it follows its input gradient (linear layers' autograd order); the logits'
        // may come first (ATen's MmBackward), so it is known by its vocabulary dim.
        add_before(t, tp_message::gather);
      }
      if (insert_sp && linear && c.shape_op != last_gemm[c.rank].first) regather[c.rank] = false;
      if (insert_tp && tokens_out && linear) {
        // One operator may launch several kernels (split-K and its reduction): it counts once,
        // the collectives before it precede its first kernel and those after it follow its last.
        // Plain references: clang 14 cannot capture structured bindings in lambdas.
        std::uint32_t& op = last_gemm[c.rank].first;
        std::size_t& hook = last_gemm[c.rank].second;
        if (c.shape_op == op) {
          if (hook != npos) {
            for (std::size_t h = hook; h < out.tp_collectives.size(); ++h) out.tp_collectives[h].after = t;
          }
        } else {
          op = c.shape_op, hook = npos;
          const auto& x = m->from;
          const std::int64_t width = x.m == from.tokens() ? x.n : x.m;
          auto add = [&](tp_message what) {
            if (hook == npos) hook = out.tp_collectives.size();
            out.tp_collectives.push_back({t, what});
          };
          // A row-parallel forward or column-parallel input gradient: summed over TP, or
          // reduce-scattered over the tokens (the activation after it is 1/TP of them).
          auto reduce = [&] {
            if (!insert_sp) return add(tp_message::activation);
            add(tp_message::scatter);
            act_old[c.rank] = base_from, act_new[c.rank] = base_to;
            regather[c.rank] = c.phase == phase_kind::backward;
          };
          if (c.layer >= 0 && c.layer != layer_of[c.rank]) {
            check_layer_gemms(c.rank);
            layer_of[c.rank] = c.layer;
          }
          const std::array<std::int64_t, 5> key{x.m, x.n, x.k, c.layer, c.pass};
          const bool ffn_dim = x.m == from.ffn_local() || x.n == from.ffn_local() || x.k == from.ffn_local();
          const bool fc1_second = c.layer >= 0 && ffn_dim && from.ffn_local() != from.hidden && fc1_first[c.rank] == key;
          if (c.layer >= 0) fc1_first[c.rank] = fc1_second ? std::nullopt : std::optional(key);
          if (fc1_second) {
            if (c.phase == phase_kind::backward && last_reduce[c.rank] != npos) {
              // The reduce moves to after this GEMM: last in the rank's launch order again.
              const tp_message what = out.tp_collectives[last_reduce[c.rank]].message;
              out.tp_collectives.erase(out.tp_collectives.begin() + static_cast<std::ptrdiff_t>(last_reduce[c.rank]));
              last_reduce[c.rank] = npos;
              add(what);
            }
          } else if (c.layer >= 0) {
            if (layer_gemms[c.rank]++ % 2 == 1) {
              last_reduce[c.rank] = out.tp_collectives.size();
              reduce();
            } else if (insert_sp) {
              add_before(t, tp_message::gather);  // QKV and FC1 forward, FC2 and attention-output input gradients
            }
          } else if (c.phase == phase_kind::backward && width == from.hidden && x.k != from.hidden) {
            reduce();  // the logits' input gradient: tokens x hidden out of tokens x V/TP
          } else if (c.phase == phase_kind::forward && x.k == from.hidden && width != from.hidden &&
                     width == out.vocab_local) {
            // The logits (of the gathered final norm's output): the vocabulary-parallel
            // cross-entropy that follows reduces over TP.
            if (insert_sp) add_before(t, tp_message::gather);
            add(tp_message::loss_max), add(tp_message::loss_sum), add(tp_message::loss_sum);
          }
        }
      } else if (linear && c.shape_op != last_gemm[c.rank].first) {
        last_gemm[c.rank] = {c.shape_op, npos};
      }
      set(t, d * ratio);
      continue;
    }
    if (classify(kind, name) == op_bound::compute) {
      ++out.unattributed; // a GEMM/attention kernel with no recorded shape: its dims are unknown
      continue;
    }
    ++out.memory;
    // A recomputed FC2 forward and the FC2 dgrad after it have the same dims when tokens =
    // hidden: only the kernels between them (the rest of the recomputed forward and the
    // backward up to the dgrad) tell that the dgrad is not its weight gradient.
    const std::string lname = detail::lower_ascii(name);
    if (lname.find("reduce") == std::string::npos) open_dgrad[c.rank].reset();
    bool scattered = false;
    if (insert_tp && c.phase == phase_kind::forward && c.layer < 0 && layer_gemms[c.rank] == 0 && !embedded[c.rank] &&
        detail::embedding_lookup(lname)) {
      // The vocabulary-parallel embedding sums its partial lookups over TP, or reduce-scatters
      // them over the tokens (the word embedding comes first, before the layers; a position
      // embedding after it is not parallel).
      embedded[c.rank] = true;
      out.tp_collectives.push_back({t, insert_sp ? tp_message::scatter : tp_message::activation});
      scattered = insert_sp;
    }
    if (insert_sp && c.phase == phase_kind::backward && c.layer < 0 && layer_gemms[c.rank] > 0 && !embedded[c.rank] &&
        c.cpu_op != detail::no_event) {
      // After the layers, the embedding's backward (its autograd node, EmbeddingBackward0, or
      // ATen's embedding_dense_backward) reads the whole gradient: gathered before it.
      const std::string op = detail::lower_ascii(tr.name(tr.events[c.cpu_op]));
      if (op.find("embedding") != std::string::npos && op.find("backward") != std::string::npos) {
        embedded[c.rank] = true;
        add_before(t, tp_message::gather);
        act_old[c.rank] = act_from, act_new[c.rank] = act_to;
      }
    }
    // Norms work on the residual stream (tokens x hidden, 1/TP of the tokens under SP) wherever
    // they sit: after a row-parallel GEMM's all-reduce, or in backward after a weight gradient.
    const bool norm = lname.find("layer_norm") != std::string::npos || lname.find("layernorm") != std::string::npos ||
                      lname.find("rms_norm") != std::string::npos || lname.find("rmsnorm") != std::string::npos ||
                      lname.find("gammabeta") != std::string::npos;
    set(t, detail::memory_scaled_ns(d, norm ? base_to / base_from : act_new[c.rank] / act_old[c.rank], min_ns));
    if (scattered) act_old[c.rank] = base_from, act_new[c.rank] = base_to;
  }
  for (std::size_t r = 0; r < job.ranks.size(); ++r) check_layer_gemms(r);
  return out;
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

/// One sentence per shape rewrite for `changes`.
[[nodiscard]] inline std::string describe(const shape_config& a, const shape_config& b, const shape_stats& s) {
  std::string what;
  auto field = [&](const char* name, std::int64_t x, std::int64_t y) {
    if (x != y)
      what += (what.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(x) + " -> " + std::to_string(y);
  };
  field("hidden", a.hidden, b.hidden);
  field("FFN", a.ffn, b.ffn);
  field("heads", a.heads, b.heads);
  field("head dim", a.head_dim, b.head_dim);
  field("sequence", a.seq, b.seq);
  field("micro-batch", a.micro_batch, b.micro_batch);
  field("TP", a.tp, b.tp);
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
  field("hidden", a.hidden, b.hidden);
  field("FFN", a.ffn, b.ffn);
  field("heads", a.heads, b.heads);
  field("head dim", a.head_dim, b.head_dim);
  field("sequence", a.seq, b.seq);
  field("micro-batch", a.micro_batch, b.micro_batch);
  field("TP", a.tp, b.tp);
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
    if ((layer_params || pp_params) && !o.shape.any()) {
      try {
        layers_shape = traced_shape(st);
      } catch (const error& e) {
        out.push_back(note("shape", "optimizer and gradient work", std::string("optimizer and gradient work kept as traced: ") + e.what()));
      }
    }
    if (!o.shape.any() && !layers_shape) return out;
    ctx.shape_from = layers_shape ? *layers_shape : traced_shape(st);
    ctx.shape_to = layers_shape ? *layers_shape : target_shape(*ctx.shape_from, o.shape);
    const shape_config& from = *ctx.shape_from;
    const shape_config& to = *ctx.shape_to;
    const shape_costs& costs = ctx.costs(b);
    if (!ctx.costs_note().empty()) out.push_back(note("shape", "cost profile", ctx.costs_note()));
    if (from == to && !layer_params && !pp_params) {
      out.push_back(note("shape", "shape", "shape: the traces' own (nothing rescaled)"));
      return out;
    }
    const shape_stats ss = rescale_shape(b, ctx.job, st, from, to, costs, st.model.gated_mlp, layer_params, pp_params);
    if (from == to) {
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

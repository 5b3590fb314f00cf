#pragma once
// Structure facet: the transformer's shape — layers from the layers per pass of one pipeline;
// hidden, FFN, heads, sequence, micro-batch size and data type from the GEMMs of one layer;
// dropout from the ops of one forward pass.

#include <lumos/pipeline/schedule.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/layers.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// `md.layers`: the sum over the stages of one pipeline of the layers of each of their chunks
/// (`chunk_layers`; layers per pass × chunks where a chunk's forward pass is not told apart). A
/// stage or chunk may hold none (a pipeline layout's embedding alone) as long as some holds one.
/// Notes the ranks whose forward passes of one chunk disagree.
inline void model_layers(const discovery_inputs& in, job_structure& out) {
  auto& md = out.model;
  const std::size_t nr = in.rank_count();
  const int v = out.parallel.chunks.value.value_or(1);
  std::vector<std::vector<int>> chunks(nr);
  for (std::size_t ri = 0; ri < nr; ++ri) chunks[ri] = chunk_layers(out.ranks[ri], v, out.notes);
  std::vector<std::size_t> one;
  if (!in.topology.pipelines.empty()) {
    for (const int r : in.topology.pipelines.front()) one.push_back(in.rank_index(r));
  } else if (nr > 0) {
    one.push_back(0);
  }
  int total = 0;
  bool ok = !one.empty(), uneven = false;
  for (const std::size_t ri : one) {
    const auto& f = out.ranks[ri].layers_per_pass;
    ok = ok && f.known();
    if (!ok) break;
    const auto& c = chunks[ri];
    total += c.empty() ? *f.value * v : std::accumulate(c.begin(), c.end(), 0);
    uneven = uneven || std::any_of(c.begin(), c.end(), [&](int n) { return n != *f.value; });
  }
  ok = ok && total > 0;
  if (ok) {
    md.layers.value = total;
    const std::string per = uneven ? "the layers of each chunk (the first forward pass of each)" : "layers per pass × " + std::to_string(v) + " chunk(s)";
    md.layers.source = one.size() > 1 || uneven ? "sum over the " + std::to_string(one.size()) + (one.size() > 1 ? " stages of " : " stage of ") + per + "; " + out.layers_method.source
                                                : out.ranks[one.front()].layers_per_pass.source;
  } else {
    md.layers.source = nr > 0 && !one.empty() ? out.ranks[one.front()].layers_per_pass.source : "no ranks";
  }
}

/// What the middle layer of a rank's first forward pass (and the whole pass) says.
struct reference_layer {
  std::vector<gemm_shape> gemms;  ///< the layer's GEMM operators with recorded shapes, in launch order
  std::string dtype, dtype_src;   ///< the first GEMM kernel's data type, and the kernel
  std::string dropout_op;         ///< the first op of the pass named dropout
  bool pass_read = false;         ///< the pass had a launch
  std::string where;              ///< " (layer M of the first forward pass on rank R)"
  std::string pass_where;         ///< " (the first forward pass on rank R)"
};

/// Reads the middle layer of the first forward pass of rank `ref` (which has layers).
[[nodiscard]] inline reference_layer read_reference_layer(const discovery_inputs& in, const job_structure& out, std::size_t ref) {
  const trace::rank_trace& t = in.job.ranks[ref];
  const auto& rs = out.ranks[ref];
  const int mid = *rs.layers_per_pass.value / 2;
  int fwd = -1;
  for (std::size_t pi = 0; pi < rs.passes.size() && fwd < 0; ++pi) {
    if (rs.passes[pi].op.kind == pipeline::op_kind::forward) fwd = static_cast<int>(pi);
  }
  reference_layer r;
  std::uint32_t last_shape = no_event;
  for (const std::size_t li : in.ranks[ref].pass_launches[static_cast<std::size_t>(fwd)]) {
    const auto& l = in.ranks[ref].launches[li];
    // Dropout anywhere in the pass: Megatron fuses the layers' into bias-dropout-add kernels
    // whose names do not say it, but not the embedding's.
    if (r.dropout_op.empty() && lower(t.name(t.events[l.op])).find("dropout") != std::string::npos) {
      r.dropout_op = t.name(t.events[l.op]).substr(0, 60);
    }
    r.pass_read = true;
    if (l.layer != mid) continue;
    const std::string_view kname = t.name(t.events[l.op]);
    if (r.dtype_src.empty() && is_gemm_kernel(kname) && !dtype_of_kernel(kname).empty()) {
      r.dtype = dtype_of_kernel(kname);
      r.dtype_src = "GEMM kernel name '" + std::string(kname.substr(0, 60)) + "'";
    }
    if (l.shape_op == no_event || l.shape_op == last_shape) continue;
    last_shape = l.shape_op;
    if (auto gs = gemm_of(t.name(t.events[l.shape_op]), parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)))) {
      r.gemms.push_back(*gs);
    }
  }
  r.where = " (layer " + std::to_string(mid) + " of the first forward pass on rank " + std::to_string(rs.rank) + ")";
  r.pass_where = " (the first forward pass on rank " + std::to_string(rs.rank) + ")";
  return r;
}

/// `md.heads` and `md.kv_heads` from the layer's shapes `ls` (TP `tp`), with notes on widths
/// that do not add up.
inline void model_heads(const layer_shapes& ls, const reference_layer& r, std::optional<int> tp, job_structure& out) {
  auto& md = out.model;
  const std::string tp_txt = tp ? " × TP " + std::to_string(*tp) : "";
  if (!(ls.heads_local && tp)) {
    md.heads.source = ls.heads_local    ? "heads per rank " + std::to_string(ls.heads_local) + " × TP (unknown)"
                      : ls.seq == 0     ? ls.why_attention
                      : ls.micro_batch ? ls.attention_from + ": its batch is not a multiple of the micro-batch size " + std::to_string(ls.micro_batch)
                                       : ls.attention_from + ", with the micro-batch size unknown (" + md.micro_batch_size.source + ")";
    md.kv_heads.source = "the heads are not known (" + md.heads.source + ")";
    return;
  }
  md.heads.value = ls.heads_local * *tp;
  md.heads.source = "heads per rank " + std::to_string(ls.heads_local) + " (" + ls.attention_from + ")" + tp_txt;
  if (ls.attn_local && ls.attn_local != ls.heads_local * ls.head_dim) {
    out.notes.push_back("attention output GEMM reads " + std::to_string(ls.attn_local) + " per rank but heads × head dim = " +
                        std::to_string(ls.heads_local * ls.head_dim));
  }
  // The QKV GEMMs write the queries (heads × head dim) and a key and a value per KV head.
  const std::int64_t q_local = ls.heads_local * ls.head_dim;
  const std::int64_t kv_width = ls.qkv_local > q_local ? (ls.qkv_local - q_local) / 2 : 0;
  if (ls.head_dim > 0 && kv_width > 0 && kv_width % ls.head_dim == 0 && ls.qkv_local == q_local + 2 * kv_width && kv_width <= q_local) {
    md.kv_heads.value = kv_width / ls.head_dim * *tp;
    md.kv_heads.source = "QKV GEMM(s) write " + std::to_string(ls.qkv_local) + " per rank: queries " + std::to_string(q_local) + " + 2 × " +
                         std::to_string(kv_width) + " (keys and values of " + std::to_string(kv_width / ls.head_dim) + " heads of " +
                         std::to_string(ls.head_dim) + ")" + tp_txt + r.where;
    return;
  }
  md.kv_heads.source = ls.qkv_local ? "QKV GEMM(s) write " + std::to_string(ls.qkv_local) + " per rank, not queries " +
                                          std::to_string(q_local) + " + keys and values of whole heads" + r.where
                                    : "no QKV GEMM before the attention output projection" + r.where;
  if (ls.qkv_local) {
    out.notes.push_back("QKV GEMM writes " + std::to_string(ls.qkv_local) + " per rank, not heads × head dim (" + std::to_string(q_local) +
                        ") plus keys and values of whole heads");
  }
}

/// The shape facts of `out.model` other than the layers, from the reference layer `r` (TP `tp`).
inline void model_widths(const reference_layer& r, std::optional<int> tp, job_structure& out) {
  auto& md = out.model;
  if (!r.dtype.empty()) md.dtype.value = r.dtype;
  md.dtype.source = r.dtype_src.empty() ? "no GEMM kernel name in the layer names a data type" : r.dtype_src;
  const auto ls = read_layer(r.gemms);
  const std::string tp_txt = tp ? " × TP " + std::to_string(*tp) : "";
  if (ls.hidden) {
    md.hidden.value = ls.hidden;
    md.hidden.source = ls.hidden_from + r.where + "; not divided by TP (the residual stream is replicated)";
  } else {
    md.hidden.source = (r.gemms.empty() ? std::string("no GEMM with recorded Input Dims in the layer") : ls.why_hidden) + r.where;
  }
  if (r.pass_read) {
    md.has_dropout = !r.dropout_op.empty();
    md.dropout.value = md.has_dropout ? "present (its masks are kept for backward)" : "none";
    md.dropout.source = (md.has_dropout ? "GPU op '" + r.dropout_op + "'" : std::string("no GPU op named dropout")) + r.pass_where;
  } else {
    md.dropout.source = "no launch" + r.pass_where;
  }
  md.gated_mlp = ls.gated;
  if (ls.ffn_local) {
    md.mlp.value = ls.gated ? "gated (gate and up projections: SwiGLU, Llama-style; untied embeddings, RMSNorm and no biases assumed)" : "not gated";
    md.mlp.source = ls.ffn_from + r.where;
  } else {
    md.mlp.source = ls.why_ffn + r.where;
  }
  if (ls.ffn_local && tp) {
    md.ffn.value = ls.ffn_local * *tp;
    md.ffn.source = ls.ffn_from + tp_txt + r.where;
  } else {
    md.ffn.source = ls.ffn_local ? "per-rank FFN " + std::to_string(ls.ffn_local) + " × TP (unknown)" : ls.why_ffn + r.where;
  }
  if (ls.seq) {
    md.seq.value = ls.seq;
    md.seq.source = ls.attention_from + r.where;
    md.head_dim.value = ls.head_dim;
    md.head_dim.source = ls.attention_from;
  } else {
    md.seq.source = md.head_dim.source = ls.why_attention + r.where;
  }
  if (ls.micro_batch) {
    md.micro_batch_size.value = ls.micro_batch;
    md.micro_batch_size.source = "tokens per GEMM (" + std::to_string(ls.tokens) + ") / sequence (" + std::to_string(ls.seq) + ")";
  } else {
    md.micro_batch_size.source = ls.seq ? "tokens per GEMM not a multiple of the sequence" : ls.why_attention;
  }
  model_heads(ls, r, tp, out);
  if (tp && ls.hidden && ls.attn_local && ls.attn_local * *tp != ls.hidden) {
    out.notes.push_back("attention width per rank " + std::to_string(ls.attn_local) + tp_txt + " ≠ hidden " + std::to_string(ls.hidden));
  }
}

}  // namespace detail

/// Fills `out.model`: the layers (summed over the stages of the first pipeline, × chunks), and
/// the widths, heads, sequence, micro-batch size, data type, gated MLP and dropout read from
/// the GEMMs of the middle layer of the first forward pass of the first rank with layers (TP
/// division undone where TP is known), with notes on widths that do not add up. Runs after
/// `discover_layers`, `discover_schedule` (chunks) and `discover_parallel_degrees` (TP).
/// Linear in that pass's launches.
inline void discover_model_shape(const discovery_inputs& in, job_structure& out) {
  auto& md = out.model;
  md.layers.flag = "--layers", md.hidden.flag = "--hidden", md.ffn.flag = "--ffn", md.heads.flag = "--heads";
  md.head_dim.flag = "--heads", md.seq.flag = "--seq", md.micro_batch_size.flag = "--micro-batch", md.dtype.flag = "";
  detail::model_layers(in, out);
  const std::size_t nr = in.rank_count();
  std::size_t ref = nr;
  for (std::size_t ri = 0; ri < nr && ref == nr; ++ri) {
    if (out.ranks[ri].layers_per_pass.value.value_or(0) > 0) ref = ri;
  }
  if (ref == nr) {
    md.hidden.source = md.ffn.source = md.heads.source = md.head_dim.source = md.seq.source = md.micro_batch_size.source = md.dtype.source =
        md.kv_heads.source = md.dropout.source = md.mlp.source = "no transformer layer found to read shapes from";
    return;
  }
  detail::model_widths(detail::read_reference_layer(in, out, ref), out.parallel.tp.value, out);
}

}  // namespace lumos::whatif

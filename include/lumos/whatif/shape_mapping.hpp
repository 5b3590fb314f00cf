#pragma once
// How one GEMM or attention operator's dims, and a parameter-shaped tensor's, map from the traced
// model shape to a what-if's (`lumos whatif --hidden/--ffn/--heads/--seq/--micro-batch/--tp`): the
// rules of docs/whatif.md, "Model shape and TP", that `shape.hpp` and `precision.hpp` apply.

#include <lumos/core/error.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/detail/shapes.hpp>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

struct mapped_gemm {
  detail::gemm_shape from, to;
  bool tokens_out = true; ///< the output carries the tokens (else a weight gradient)
};

}  // namespace detail

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
    if (g.heads != a.heads_local() || g.seq != a.local_seq() || g.head_dim != a.head_dim || g.b != a.micro_batch)
      return std::nullopt;
    r.to.b = b.micro_batch, r.to.heads = b.heads_local(), r.to.seq = b.local_seq(), r.to.head_dim = b.head_dim;
    return r;
  }
  if (g.kind == role::batched) {
    if (g.batch != a.micro_batch * a.heads_local()) return std::nullopt;
    r.to.batch = b.micro_batch * b.heads_local();
    // Under context parallelism the rank's queries (seq / cp) against every key (seq).
    for (std::int64_t* d : {&r.to.m, &r.to.n, &r.to.k}) {
      if (*d == a.local_seq()) {
        *d = b.local_seq();
      } else if (*d == a.seq) {
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
  } else if (const auto kv = gqa_kv_heads(old_other, a); kv && !outside && b.heads % *kv != 0) {
    // Each key/value head serves a whole group of query heads (synth and predict refuse others too).
    throw error("whatif --heads " + std::to_string(b.heads) + ": the traced QKV GEMMs hold " + std::to_string(*kv) +
                " key/value heads (grouped-query attention), and the heads must be a multiple of them");
  } else if (kv && *kv % b.tp == 0) {
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

/// The elements of a parameter-shaped tensor in the new shape `b` over the traced one `a`, when
/// `dims` reads as one: one or two dims, each a width of the layers (hidden, an inner width) or of
/// the head (the vocabulary shard), none the tokens or the sequence (so a tensor whose dims are
/// ambiguous is not one). Autocast's casts of the fp32 weights before each GEMM and the gradients'
/// casts and accumulation work on such tensors: their bytes follow the parameters per rank, not the
/// activations.
[[nodiscard]] inline std::optional<double> parameter_tensor_ratio(const std::vector<std::int64_t>& dims, const shape_config& a,
                                                                  const shape_config& b) {
  if (dims.empty() || dims.size() > 2) return std::nullopt;
  for (const std::int64_t v : dims) {
    if (v <= 0 || v == a.tokens() || v == a.seq || v == a.local_seq()) return std::nullopt;
  }
  // As the weight of a linear GEMM of the tokens: [out, in], or a vector of `out` beside the hidden width.
  detail::gemm_shape g;
  g.m = a.tokens(), g.k = dims.size() == 2 ? dims[1] : a.hidden, g.n = dims[0];
  const auto m = map_gemm(g, a, b, true);
  if (!m) return std::nullopt;
  const double from = static_cast<double>(m->from.n) * static_cast<double>(dims.size() == 2 ? m->from.k : 1);
  const double to = static_cast<double>(m->to.n) * static_cast<double>(dims.size() == 2 ? m->to.k : 1);
  return to / from;
}

/// The width other than the tokens and the hidden size of a linear GEMM outside the layers (the
/// logits head's vocabulary shard), or 0 when its dims are not tokens x hidden x something.
[[nodiscard]] inline std::int64_t logits_width(const detail::gemm_shape& g, const shape_config& a) {
  const std::int64_t d[3] = {g.m, g.n, g.k};
  int tok = -1, hid = -1;
  for (int i = 0; i < 3; ++i) {
    if (tok < 0 && d[i] == a.tokens()) {
      tok = i;
    } else if (hid < 0 && d[i] == a.hidden) {
      hid = i;
    }
  }
  return tok < 0 || hid < 0 ? 0 : d[3 - tok - hid];
}

}  // namespace lumos::whatif

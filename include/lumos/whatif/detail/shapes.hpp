#pragma once
// GEMM and attention shapes from the `Input Dims` a profiler with record_shapes writes.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif::detail {

/// `[[8192, 4096], [4096, 1536], []]` → {{8192, 4096}, {4096, 1536}, {}}: one entry per argument
/// (empty for scalars). Only GEMM and attention ops are read, whose arguments are plain tensors;
/// a TensorList argument (`[[[4, 2048, 4096]]]`) comes out as its tensors plus an empty entry.
/// Text that is not a list of lists of integers yields what could be read up to that point.
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> parse_dims(std::string_view text) {
  std::vector<std::vector<std::int64_t>> out;
  int depth = 0;
  std::vector<std::int64_t> cur;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '[') {
      ++depth;
      cur.clear();
      ++i;
    } else if (c == ']') {
      if (depth >= 2) out.push_back(cur);
      cur.clear();
      --depth;
      ++i;
    } else if ((c >= '0' && c <= '9') || c == '-') {
      std::int64_t v = 0;
      const auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
      if (ec != std::errc{}) return out;
      cur.push_back(v);
      i = static_cast<std::size_t>(p - text.data());
    } else {
      ++i;
    }
  }
  return out;
}

/// The attention or GEMM an operator ran, as (batch) × [M × K] · [K × N].
struct gemm_shape {
  enum class role : std::uint8_t { linear, batched, attention } kind = role::linear;
  std::int64_t batch = 1, m = 0, k = 0, n = 0;
  // attention ops (sdpa, flash-attention): q = [b, heads, s, d]
  std::int64_t b = 0, heads = 0, seq = 0, head_dim = 0;
};

/// True for the operator names whose `Input Dims` `gemm_of` reads.
[[nodiscard]] inline bool is_shape_op(std::string_view name) noexcept {
  return name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm" || name == "aten::baddbmm" ||
         name.find("scaled_dot_product") != std::string_view::npos || name.find("flash_attn") != std::string_view::npos;
}

/// The shape of operator `name` with `Input Dims` `dims`, when it is a GEMM or an attention op
/// whose dims have the expected ranks.
[[nodiscard]] inline std::optional<gemm_shape> gemm_of(std::string_view name,
                                                       const std::vector<std::vector<std::int64_t>>& dims) {
  auto rank_is = [&](std::size_t i, std::size_t r) { return i < dims.size() && dims[i].size() == r; };
  gemm_shape g;
  if (name == "aten::mm" && rank_is(0, 2) && rank_is(1, 2) && dims[0][1] == dims[1][0]) {
    g.m = dims[0][0], g.k = dims[0][1], g.n = dims[1][1];
    return g;
  }
  if (name == "aten::addmm" && rank_is(1, 2) && rank_is(2, 2) && dims[1][1] == dims[2][0]) {
    g.m = dims[1][0], g.k = dims[1][1], g.n = dims[2][1];
    return g;
  }
  const std::size_t first = name == "aten::baddbmm" ? 1 : 0;
  if ((name == "aten::bmm" || name == "aten::baddbmm") && rank_is(first, 3) && rank_is(first + 1, 3) &&
      dims[first][2] == dims[first + 1][1]) {
    g.kind = gemm_shape::role::batched;
    g.batch = dims[first][0], g.m = dims[first][1], g.k = dims[first][2], g.n = dims[first + 1][2];
    return g;
  }
  if (rank_is(0, 4) && (name.find("scaled_dot_product") != std::string_view::npos)) {
    g.kind = gemm_shape::role::attention;  // q: [b, heads, s, d]
    g.b = dims[0][0], g.heads = dims[0][1], g.seq = dims[0][2], g.head_dim = dims[0][3];
    return g;
  }
  if (rank_is(0, 4) && name.find("flash_attn") != std::string_view::npos) {
    g.kind = gemm_shape::role::attention;  // flash-attn's q: [b, s, heads, d]
    g.b = dims[0][0], g.seq = dims[0][1], g.heads = dims[0][2], g.head_dim = dims[0][3];
    return g;
  }
  return std::nullopt;
}

/// What the GEMMs of one transformer layer (on one rank) say, before tensor parallelism is
/// taken into account. 0 = not determined; `why` says why for each unknown.
struct layer_shapes {
  std::int64_t tokens = 0;       ///< M of the linear GEMMs: sequence × micro-batch
  std::int64_t hidden = 0;
  std::int64_t ffn_local = 0;    ///< FFN width on this rank
  bool gated = false;            ///< FC1 is gate + up (SwiGLU-style)
  std::int64_t attn_local = 0;   ///< heads × head_dim on this rank (K of the attention output GEMM)
  std::int64_t qkv_local = 0;    ///< N of the QKV GEMM(s) on this rank
  std::int64_t seq = 0, head_dim = 0, heads_local = 0, micro_batch = 0;
  std::string hidden_from, ffn_from, attention_from, seq_from;
  std::string why_hidden, why_ffn, why_attention;
};

/// Reads a layer's shapes from its GEMMs in launch order (see docs/whatif.md for the rules).
[[nodiscard]] inline layer_shapes read_layer(const std::vector<gemm_shape>& gemms) {
  layer_shapes s;
  std::vector<const gemm_shape*> linear;
  std::size_t linear_before_attention = 0;  // linear GEMMs launched before the attention core
  bool attention_seen = false;
  for (const auto& g : gemms) {
    if (g.kind == gemm_shape::role::linear) linear.push_back(&g);
    const bool core = g.kind == gemm_shape::role::attention || (g.kind == gemm_shape::role::batched && g.m == g.n);
    if (core && !attention_seen) attention_seen = true, linear_before_attention = linear.size();
  }
  if (linear.empty()) {
    s.why_hidden = s.why_ffn = "no aten::mm/addmm with recorded shapes in the layer";
  } else {
    std::map<std::int64_t, int> m_count;
    for (const auto* g : linear) ++m_count[g->m];
    s.tokens = std::max_element(m_count.begin(), m_count.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    // Hidden: the width that linear GEMMs both read (QKV, FC1) and write (output projection,
    // FC2) — the residual stream.
    std::map<std::int64_t, std::pair<int, int>> roles;  // width → (as K, as N)
    for (const auto* g : linear) {
      if (g->m != s.tokens) continue;
      ++roles[g->k].first;
      ++roles[g->n].second;
    }
    int best = 0;
    for (const auto& [w, c] : roles) {
      if (c.first > 0 && c.second > 0 && c.first + c.second > best) best = c.first + c.second, s.hidden = w;
    }
    if (s.hidden == 0) {
      s.why_hidden = "no width is both read and written by the layer's GEMMs";
    } else {
      s.hidden_from = "K of the GEMMs that read the residual stream and N of those that write it (" +
                      std::to_string(roles[s.hidden].first) + " + " + std::to_string(roles[s.hidden].second) + " GEMMs, M = " +
                      std::to_string(s.tokens) + ")";
    }
  }
  if (s.hidden != 0) {
    // Writers of the residual stream in order: the attention output projection, then FC2.
    std::vector<std::size_t> writers;
    for (std::size_t i = 0; i < linear.size(); ++i) {
      if (linear[i]->n == s.hidden && linear[i]->m == s.tokens) writers.push_back(i);
    }
    // The output projection is the first writer after the attention core: FC1 writes the hidden
    // width too when FFN / TP = hidden (4h with TP 4), so "the writer before FC2" would be FC1.
    std::size_t proj_at = writers.size() >= 2 ? writers.size() - 2 : 0;
    if (attention_seen) {
      for (std::size_t w = 0; w + 1 < writers.size(); ++w) {
        if (writers[w] >= linear_before_attention) {
          proj_at = w;
          break;
        }
      }
    }
    if (writers.size() >= 2) {
      const std::size_t proj = writers[proj_at], fc2 = writers.back();
      s.attn_local = linear[proj]->k;
      s.ffn_local = linear[fc2]->k;
      std::int64_t fc1 = 0;
      int fc1_count = 0;
      for (std::size_t i = proj + 1; i < fc2; ++i) {
        if (linear[i]->k == s.hidden) fc1 += linear[i]->n, ++fc1_count;
      }
      for (std::size_t i = 0; i < proj; ++i) {
        if (linear[i]->k == s.hidden) s.qkv_local += linear[i]->n;
      }
      if (fc1 == s.ffn_local) {
        s.ffn_from = "K of FC2 (" + std::to_string(s.ffn_local) + ") = N of FC1";
      } else if (fc1 == 2 * s.ffn_local) {
        s.gated = true;
        s.ffn_from = "K of FC2 (" + std::to_string(s.ffn_local) + "); FC1 writes twice that (" +
                     std::to_string(fc1_count) + " GEMM(s)): a gated MLP";
      } else {
        s.ffn_from = "K of FC2 (" + std::to_string(s.ffn_local) + "); FC1 writes " + std::to_string(fc1) + ", which does not match";
      }
    } else {
      s.why_ffn = "fewer than two GEMMs write the hidden width: no attention projection + FC2 pair";
    }
  }
  // Attention: a fused op gives everything; else the score GEMM Q·Kᵀ, batched over b·heads,
  // square in the sequence, with the head dimension as its K.
  for (const auto& g : gemms) {
    if (g.kind == gemm_shape::role::attention) {
      s.seq = g.seq, s.head_dim = g.head_dim, s.heads_local = g.heads, s.micro_batch = g.b;
      s.attention_from = "q of the attention op: b " + std::to_string(g.b) + ", heads " + std::to_string(g.heads) + ", s " +
                         std::to_string(g.seq) + ", d " + std::to_string(g.head_dim);
      break;
    }
    if (g.kind == gemm_shape::role::batched && g.m == g.n && g.k < g.m) {
      s.seq = g.m, s.head_dim = g.k;
      if (s.tokens > 0 && s.tokens % s.seq == 0) {
        s.micro_batch = s.tokens / s.seq;
        if (g.batch % s.micro_batch == 0) s.heads_local = g.batch / s.micro_batch;
      }
      s.attention_from = "score GEMM Q·Kᵀ [" + std::to_string(g.batch) + " × " + std::to_string(g.m) + " × " +
                         std::to_string(g.k) + "]·[" + std::to_string(g.k) + " × " + std::to_string(g.n) +
                         "]: batch = micro-batch × heads, square in the sequence, K = head dim";
      break;
    }
  }
  if (s.seq == 0) s.why_attention = "no attention op and no square batched score GEMM with recorded shapes";
  return s;
}

}  // namespace lumos::whatif::detail

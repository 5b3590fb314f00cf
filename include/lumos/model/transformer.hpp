#pragma once
// Decoder-only transformer description and the GPT-3 / Llama-3 presets.

#include <lumos/core/error.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace lumos::model {

/// Feed-forward block: GELU (two GEMMs h->ffn->h) or SwiGLU (gate and up h->ffn, down ffn->h).
enum class mlp_kind : std::uint8_t { gelu, swiglu };
/// LayerNorm (scale and shift, 2h parameters) or RMSNorm (scale only, h parameters).
enum class norm_kind : std::uint8_t { layernorm, rmsnorm };
/// Learned absolute position embeddings (s*h parameters) or rotary (no parameters).
enum class position_kind : std::uint8_t { learned, rotary };

/// A decoder-only, pre-norm transformer. All sizes are counts (not bytes). Every layer is
/// identical: norm -> attention (QKV, core, output projection) -> residual -> norm -> MLP ->
/// residual; then a final norm and the logits projection.
/// Invariants checked by `validate()`: all sizes positive, hidden % heads == 0,
/// heads % kv_heads == 0.
struct transformer {
  static constexpr std::int64_t max_layers = std::int64_t{1} << 16;  ///< `validate()`'s bound on layers
  static constexpr std::int64_t max_size = std::int64_t{1} << 24;    ///< and on every width, count and length

  std::string name;
  std::int64_t layers = 0;    ///< l
  std::int64_t hidden = 0;    ///< h (model width)
  std::int64_t ffn = 0;       ///< MLP inner width
  std::int64_t heads = 0;     ///< a, query heads
  std::int64_t kv_heads = 0;  ///< key/value heads (== heads: multi-head; fewer: GQA)
  std::int64_t seq = 0;       ///< s, training sequence length
  std::int64_t vocab = 0;     ///< V, padded vocabulary size
  mlp_kind mlp = mlp_kind::gelu;
  norm_kind norm = norm_kind::layernorm;
  position_kind position = position_kind::learned;
  bool tied_embeddings = true;  ///< logits projection shares the input embedding matrix
  bool linear_bias = true;      ///< QKV, output projection and MLP GEMMs have biases
  bool dropout = true;          ///< hidden/attention dropout layers are present (p > 0)

  [[nodiscard]] constexpr std::int64_t head_dim() const noexcept { return hidden / heads; }
  /// Width of the query projection (heads * head_dim; == hidden for the presets).
  [[nodiscard]] constexpr std::int64_t q_width() const noexcept { return heads * head_dim(); }
  /// Width of each of the key and value projections (kv_heads * head_dim).
  [[nodiscard]] constexpr std::int64_t kv_width() const noexcept { return kv_heads * head_dim(); }

  /// Throws `lumos::error` naming the first inconsistent field.
  void validate() const {
    auto positive = [&](std::int64_t v, const char* field) {
      if (v <= 0) {
        throw error("model '" + name + "': " + field + " must be positive, got " +
                    std::to_string(v));
      }
    };
    positive(layers, "layers");
    positive(hidden, "hidden");
    positive(ffn, "ffn");
    positive(heads, "heads");
    positive(kv_heads, "kv_heads");
    positive(seq, "seq");
    positive(vocab, "vocab");
    // Far beyond any model trained, and small enough that products of sizes (FLOPs, bytes)
    // stay exact in 64 bits and a prediction stays quick.
    auto at_most = [&](std::int64_t v, std::int64_t limit, const char* field) {
      if (v > limit) {
        throw error("model '" + name + "': " + field + " " + std::to_string(v) + " is more than the supported " +
                    std::to_string(limit));
      }
    };
    at_most(layers, max_layers, "layers");
    for (const auto& [v, field] : {std::pair{hidden, "hidden"}, std::pair{ffn, "ffn"}, std::pair{heads, "heads"},
                                   std::pair{kv_heads, "kv_heads"}, std::pair{seq, "seq"}, std::pair{vocab, "vocab"}}) {
      at_most(v, max_size, field);
    }
    if (hidden % heads != 0) {
      throw error("model '" + name + "': hidden (" + std::to_string(hidden) +
                  ") must be divisible by heads (" + std::to_string(heads) + ")");
    }
    if (heads % kv_heads != 0) {
      throw error("model '" + name + "': heads (" + std::to_string(heads) +
                  ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
    }
  }
};

// GPT-3 family as used by the Lumos paper (Liang et al., MLSys 2025: GPT-3 15B, 44B, 117B,
// 175B on H100). The paper does not print the shapes. We take the GPT-3 175B width from
// Brown et al. 2020, Table 2.1 (d_model 12288, 96 heads of 128, n_ctx 2048, d_ff = 4 d_model)
// and vary the depth: 96, 64, 24 and 8 layers give 174.6e9, 116.6e9, 44.1e9 and 15.2e9
// parameters by Narayanan et al. 2021's count, matching the four names. (INFERRED: the paper's
// smaller models could instead be narrower; none of Narayanan et al.'s Table 1 rows has these
// sizes.) Vocabulary: GPT-2 BPE, 50257 tokens, padded by Megatron to a multiple of 128 * tp
// (51200 for tp up to 8). Megatron's GPT: LayerNorm, GELU, learned positions, biases, dropout
// 0.1, tied input/output embeddings.

/// GPT-3-shaped model with `layers` layers of the 175B width (see the comment above).
[[nodiscard]] inline transformer gpt3_with_layers(std::string name, std::int64_t layers) {
  transformer m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = 12288;
  m.ffn = 4 * 12288;
  m.heads = 96;
  m.kv_heads = 96;
  m.seq = 2048;
  m.vocab = 51200;
  m.mlp = mlp_kind::gelu;
  m.norm = norm_kind::layernorm;
  m.position = position_kind::learned;
  m.tied_embeddings = true;
  m.linear_bias = true;
  m.dropout = true;
  return m;
}

/// "GPT-3 15B": 8 layers of the 175B width (15.15e9 parameters by Narayanan et al.'s count).
[[nodiscard]] inline transformer gpt3_15b() { return gpt3_with_layers("gpt3-15b", 8); }
/// "GPT-3 44B": 24 layers (44.14e9 parameters).
[[nodiscard]] inline transformer gpt3_44b() { return gpt3_with_layers("gpt3-44b", 24); }
/// "GPT-3 117B": 64 layers (116.63e9 parameters).
[[nodiscard]] inline transformer gpt3_117b() { return gpt3_with_layers("gpt3-117b", 64); }
/// GPT-3 175B (Brown et al. 2020): 96 layers (174.62e9 parameters).
[[nodiscard]] inline transformer gpt3_175b() { return gpt3_with_layers("gpt3-175b", 96); }

// Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): GQA with 8 KV heads,
// SwiGLU, RMSNorm, rotary positions, no biases, no dropout, untied embeddings, vocabulary
// 128256 (128K tokenizer; divisible by 8 so no padding up to tp 8), pre-training sequence 8192.

namespace detail {
[[nodiscard]] inline transformer llama3(std::string name, std::int64_t layers,
                                        std::int64_t hidden, std::int64_t ffn,
                                        std::int64_t heads) {
  transformer m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.ffn = ffn;
  m.heads = heads;
  m.kv_heads = 8;
  m.seq = 8192;
  m.vocab = 128256;
  m.mlp = mlp_kind::swiglu;
  m.norm = norm_kind::rmsnorm;
  m.position = position_kind::rotary;
  m.tied_embeddings = false;
  m.linear_bias = false;
  m.dropout = false;
  return m;
}
}  // namespace detail

/// Llama 3 8B: 32 layers, hidden 4096, FFN 14336, 32 heads (8.03e9 parameters).
[[nodiscard]] inline transformer llama3_8b() {
  return detail::llama3("llama3-8b", 32, 4096, 14336, 32);
}
/// Llama 3 70B: 80 layers, hidden 8192, FFN 28672, 64 heads (70.6e9 parameters).
[[nodiscard]] inline transformer llama3_70b() {
  return detail::llama3("llama3-70b", 80, 8192, 28672, 64);
}
/// Llama 3 405B: 126 layers, hidden 16384, FFN 53248, 128 heads (405.9e9 parameters).
[[nodiscard]] inline transformer llama3_405b() {
  return detail::llama3("llama3-405b", 126, 16384, 53248, 128);
}

/// Names accepted by `model_preset`.
inline constexpr std::array<std::string_view, 7> model_preset_names = {
    "gpt3-15b", "gpt3-44b", "gpt3-117b", "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b"};

/// The preset called `name` (see `model_preset_names`). Throws `lumos::error` listing the
/// valid names when there is none.
[[nodiscard]] inline transformer model_preset(std::string_view name) {
  if (name == "gpt3-15b") return gpt3_15b();
  if (name == "gpt3-44b") return gpt3_44b();
  if (name == "gpt3-117b") return gpt3_117b();
  if (name == "gpt3-175b") return gpt3_175b();
  if (name == "llama3-8b") return llama3_8b();
  if (name == "llama3-70b") return llama3_70b();
  if (name == "llama3-405b") return llama3_405b();
  std::string msg = "unknown model preset '" + std::string(name) + "'; valid names:";
  for (auto n : model_preset_names) {
    msg += ' ';
    msg += n;
  }
  throw error(msg);
}

}  // namespace lumos::model

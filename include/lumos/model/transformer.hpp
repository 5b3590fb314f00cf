#pragma once
// Decoder-only transformer description (dense or mixture-of-experts) and the GPT-3, Llama-3,
// Qwen3-MoE, GPT-OSS, Mixtral and DeepSeek-V3 presets.

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

/// How a mixture-of-experts layer moves tokens to the ranks that hold their experts (Megatron's
/// `--moe-token-dispatcher-type`): `alltoall` sends each token copy to its expert's rank over the
/// expert-parallel group (an all-to-all before the experts, one after); `allgather` all-gathers
/// every token over the EP x TP group, each rank keeps what its experts take, and a
/// reduce-scatter returns the outputs.
enum class moe_dispatcher : std::uint8_t { alltoall, allgather };

/// Lower-case name of `d` ("alltoall", "allgather").
[[nodiscard]] constexpr std::string_view to_string(moe_dispatcher d) noexcept {
  return d == moe_dispatcher::alltoall ? "alltoall" : "allgather";
}

/// The mixture-of-experts part of a transformer. `experts == 0` is a dense model (every other
/// field is then ignored). A MoE layer replaces the dense MLP by a router (a GEMM h -> experts,
/// softmax and top-k), `experts` routed expert MLPs of width `expert_ffn` of which each token
/// visits `top_k`, and `shared_experts` expert MLPs every token visits. Expert MLPs have the
/// model's `mlp` kind (SwiGLU: gate, up, down). The first `first_dense_layers` layers keep the
/// dense MLP of width `transformer::ffn`.
struct moe_spec {
  std::int64_t experts = 0;             ///< routed experts per MoE layer (0: dense model)
  std::int64_t shared_experts = 0;      ///< shared experts per MoE layer
  std::int64_t top_k = 0;               ///< routed experts each token visits
  std::int64_t expert_ffn = 0;          ///< one expert MLP's inner width
  std::int64_t first_dense_layers = 0;  ///< dense layers before the first MoE layer
  /// Tokens each expert computes, as a multiple of its balanced share (tokens x top_k /
  /// experts): below 1 the excess is dropped, above 1 the expert input is padded to that
  /// capacity (Megatron's `--moe-expert-capacity-factor` with `--moe-pad-expert-input-to-capacity`).
  /// 0 = dropless: each expert computes exactly the tokens it received.
  double capacity_factor = 0;
  moe_dispatcher dispatcher = moe_dispatcher::alltoall;
  bool router_bias = false;  ///< the router GEMM has a bias (GPT-OSS)
  /// Token copies the busiest expert-parallel rank's experts compute over the mean of the EP
  /// ranks (1: balanced routing, what the published benchmarks force). The busiest rank sets the
  /// pace: its grouped GEMMs run on this many times the balanced rows, and the dispatch and
  /// combine all-to-alls, which finish when their largest receiver does, move this many times the
  /// balanced bytes (`moe_shape`, `moe_layer_collectives`; `expert_load_imbalance` derives it from
  /// measured per-expert loads).
  double load_imbalance = 1;

  [[nodiscard]] constexpr bool enabled() const noexcept { return experts > 0; }
};

/// Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's `MLASelfAttention`): queries
/// and keys/values pass through low-rank latents. Per token: the query down projection
/// h -> q_lora_rank, its RMSNorm and the up projection q_lora_rank -> heads x (nope + rope); the
/// key/value down projection h -> kv_lora_rank + rope (the rope part is one key shared by all
/// heads), its RMSNorm on the kv_lora_rank part and the up projection kv_lora_rank -> heads x
/// (nope + v); attention with query/key heads of nope + rope and value heads of v; the output
/// projection heads x v -> h. Megatron keeps the down projections and their norms whole on every
/// tensor-parallel rank (duplicated linear layers) and shards the up and output projections by
/// heads. `kv_lora_rank == 0`: ordinary attention.
struct mla_spec {
  std::int64_t q_lora_rank = 0;   ///< query latent; 0 = queries projected directly h -> heads x (nope + rope)
  std::int64_t kv_lora_rank = 0;  ///< key/value latent (0: no MLA)
  std::int64_t qk_nope_dim = 0;   ///< per-head query/key dimensions without rotary positions
  std::int64_t qk_rope_dim = 0;   ///< per-head query/key dimensions with rotary positions
  std::int64_t v_dim = 0;         ///< per-head value dimensions

  [[nodiscard]] constexpr bool enabled() const noexcept { return kv_lora_rank > 0; }
};

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
  /// Width of one attention head; 0 = hidden / heads. Set when the query projection is not
  /// `hidden` wide (Qwen3-MoE: 32 heads of 128 on a hidden of 2048; GPT-OSS: 64 of 64 on 2880).
  std::int64_t head_size = 0;
  moe_spec moe;  ///< mixture-of-experts layers (dense model when `moe.experts == 0`)
  mla_spec mla;  ///< multi-head latent attention (ordinary attention when `mla.kv_lora_rank == 0`)
  /// Multi-token-prediction modules trained with the model (DeepSeek-V3; Megatron's
  /// `--mtp-num-layers`). Module k predicts token i + k + 1: it normalises the previous depth's
  /// hidden states and the (shared) embedding of token i + k, concatenates them, projects 2h -> h
  /// (`eh_proj`), runs one transformer block like the model's last (MoE in a MoE model), and
  /// applies its own final norm, the shared output head and a cross-entropy loss (weighted into
  /// the main loss). Megatron places the modules on the last pipeline stage, after the decoder.
  std::int64_t mtp_layers = 0;

  [[nodiscard]] constexpr std::int64_t head_dim() const noexcept { return head_size > 0 ? head_size : hidden / heads; }
  /// Whether the model has mixture-of-experts layers.
  [[nodiscard]] constexpr bool is_moe() const noexcept { return moe.enabled(); }
  /// Transformer blocks the pipeline holds: the decoder's layers, then one per multi-token
  /// prediction module (`mtp_layers`), which the last virtual stage holds.
  [[nodiscard]] constexpr std::int64_t blocks() const noexcept { return layers + mtp_layers; }
  /// Blocks whose MLP is a mixture of experts, the multi-token-prediction blocks included (0 for
  /// a dense model).
  [[nodiscard]] constexpr std::int64_t moe_layers() const noexcept {
    return is_moe() ? blocks() - moe.first_dense_layers : 0;
  }
  /// Width of the query projection (heads * head_dim; == hidden unless `head_size` says otherwise).
  [[nodiscard]] constexpr std::int64_t q_width() const noexcept { return heads * head_dim(); }
  /// Width of each of the key and value projections (kv_heads * head_dim).
  [[nodiscard]] constexpr std::int64_t kv_width() const noexcept { return kv_heads * head_dim(); }
  /// Whether attention is multi-head latent attention.
  [[nodiscard]] constexpr bool is_mla() const noexcept { return mla.enabled(); }
  /// Per-head dimensions of queries and keys: nope + rope under MLA, else head_dim.
  [[nodiscard]] constexpr std::int64_t qk_head_dim() const noexcept {
    return is_mla() ? mla.qk_nope_dim + mla.qk_rope_dim : head_dim();
  }
  /// Per-head dimensions of values (and of the attention output): v_dim under MLA, else head_dim.
  [[nodiscard]] constexpr std::int64_t v_head_dim() const noexcept { return is_mla() ? mla.v_dim : head_dim(); }
  /// The width w of the attention core's FLOPs, 4 s^2 w per sequence (QK^T: 2 s^2 heads qk_head_dim,
  /// PV: 2 s^2 heads v_head_dim): q_width, or heads (qk_head_dim + v_head_dim) / 2 under MLA.
  [[nodiscard]] constexpr double attention_flops_width() const noexcept {
    return is_mla() ? static_cast<double>(heads * (qk_head_dim() + v_head_dim())) / 2.0 : static_cast<double>(q_width());
  }

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
    if (mtp_layers < 0 || mtp_layers > max_layers) {
      throw error("model '" + name + "': mtp_layers must be in [0, " + std::to_string(max_layers) + "], got " +
                  std::to_string(mtp_layers));
    }
    for (const auto& [v, field] : {std::pair{hidden, "hidden"}, std::pair{ffn, "ffn"}, std::pair{heads, "heads"},
                                   std::pair{kv_heads, "kv_heads"}, std::pair{seq, "seq"}, std::pair{vocab, "vocab"}}) {
      at_most(v, max_size, field);
    }
    if (head_size < 0 || head_size > max_size) {
      throw error("model '" + name + "': head_size must be in [0, " + std::to_string(max_size) + "], got " +
                  std::to_string(head_size));
    }
    validate_moe();
    validate_mla();
    if (head_size == 0 && hidden % heads != 0) {
      throw error("model '" + name + "': hidden (" + std::to_string(hidden) +
                  ") must be divisible by heads (" + std::to_string(heads) + ")");
    }
    if (heads % kv_heads != 0) {
      throw error("model '" + name + "': heads (" + std::to_string(heads) +
                  ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
    }
  }

  /// The `mla` part of `validate()`: nothing for ordinary attention; else q_lora_rank >= 0 and
  /// positive per-head dimensions, each at most `max_size`, and no linear biases (MLA's
  /// projections have none in DeepSeek's models; the model does not cost them).
  void validate_mla() const {
    if (mla.kv_lora_rank < 0) throw error("model '" + name + "': kv_lora_rank must be >= 0, got " + std::to_string(mla.kv_lora_rank));
    if (!is_mla()) return;
    const std::string m = "model '" + name + "': ";
    for (const auto& [v, field] : {std::pair{mla.kv_lora_rank, "kv_lora_rank"}, std::pair{mla.qk_nope_dim, "qk_nope_dim"},
                                   std::pair{mla.qk_rope_dim, "qk_rope_dim"}, std::pair{mla.v_dim, "v_dim"}}) {
      if (v < 1 || v > max_size) throw error(m + field + " must be in [1, " + std::to_string(max_size) + "], got " + std::to_string(v));
    }
    if (mla.q_lora_rank < 0 || mla.q_lora_rank > max_size) {
      throw error(m + "q_lora_rank must be in [0, " + std::to_string(max_size) + "], got " + std::to_string(mla.q_lora_rank));
    }
    if (linear_bias) throw error(m + "multi-head latent attention is modelled without linear biases: set linear_bias false");
  }

  /// The `moe` part of `validate()`: nothing to check for a dense model; else top_k in
  /// [1, experts], a positive expert_ffn, shared_experts >= 0, first_dense_layers in
  /// [0, layers), capacity_factor 0 (dropless) or positive, load_imbalance in [1, experts].
  void validate_moe() const {
    if (moe.experts < 0) throw error("model '" + name + "': experts must be >= 0, got " + std::to_string(moe.experts));
    if (!is_moe()) return;
    const std::string m = "model '" + name + "': ";
    if (moe.experts > max_size) throw error(m + "experts " + std::to_string(moe.experts) + " is more than the supported " + std::to_string(max_size));
    if (moe.top_k < 1 || moe.top_k > moe.experts) {
      throw error(m + "top_k (" + std::to_string(moe.top_k) + ") must be in [1, experts = " + std::to_string(moe.experts) +
                  "]: each token visits at least one and at most every routed expert");
    }
    if (moe.expert_ffn < 1 || moe.expert_ffn > max_size) {
      throw error(m + "expert_ffn must be in [1, " + std::to_string(max_size) + "], got " + std::to_string(moe.expert_ffn));
    }
    if (moe.shared_experts < 0 || moe.shared_experts > max_size) {
      throw error(m + "shared_experts must be in [0, " + std::to_string(max_size) + "], got " + std::to_string(moe.shared_experts));
    }
    if (moe.first_dense_layers < 0 || moe.first_dense_layers >= layers) {
      throw error(m + "first_dense_layers (" + std::to_string(moe.first_dense_layers) + ") must be in [0, layers = " +
                  std::to_string(layers) + "): a MoE model needs at least one MoE layer");
    }
    if (!(moe.capacity_factor >= 0) || moe.capacity_factor > 1e6) {
      throw error(m + "capacity_factor must be 0 (dropless) or positive, got " + std::to_string(moe.capacity_factor));
    }
    if (!(moe.load_imbalance >= 1) || moe.load_imbalance > static_cast<double>(moe.experts)) {
      throw error(m + "load_imbalance must be in [1, experts = " + std::to_string(moe.experts) +
                  "] (the busiest EP rank's token copies over the mean), got " + std::to_string(moe.load_imbalance));
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
/// Llama 3.1 405B: the shape of `llama3_405b` (the 3.1 release kept the architecture and the
/// pre-training sequence of 8192; its 128K context came from a later long-context stage).
[[nodiscard]] inline transformer llama3_1_405b() {
  transformer m = llama3_405b();
  m.name = "llama3.1-405b";
  return m;
}

// Mixture-of-experts presets, from each model's public `config.json` on its Hugging Face hub
// page (PUBLISHED.md section 8 lists the same shapes). All: RMSNorm, rotary positions, SwiGLU
// experts, untied embeddings, no dropout, every layer MoE (`mlp_only_layers` empty,
// `decoder_sparse_step` 1), dropless routing with the all-to-all dispatcher (what the
// Megatron-Bridge benchmarks run), sequence 4096 (their pre-training recipes). `ffn` is the
// config's dense `intermediate_size`, unused while no layer is dense. Not modelled: Qwen3's
// per-head QK RMSNorm, GPT-OSS's attention sinks, its 128-token sliding window on every other
// layer (attention is costed as full causal attention on every layer) and its clamped SwiGLU.

namespace detail {
[[nodiscard]] inline transformer moe_base(std::string name, std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                                          std::int64_t kv_heads, std::int64_t head_size, std::int64_t vocab) {
  transformer m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_size = head_size;
  m.seq = 4096;
  m.vocab = vocab;
  m.mlp = mlp_kind::swiglu;
  m.norm = norm_kind::rmsnorm;
  m.position = position_kind::rotary;
  m.tied_embeddings = false;
  m.linear_bias = false;
  m.dropout = false;
  return m;
}
}  // namespace detail

/// Qwen3-30B-A3B (`Qwen/Qwen3-30B-A3B` config.json): 48 layers, hidden 2048, 32 query heads of
/// 128 and 4 KV heads, 128 experts of width 768, top-8, vocabulary 151936 (30.5e9 parameters,
/// 3.3e9 active).
[[nodiscard]] inline transformer qwen3_30b_a3b() {
  transformer m = detail::moe_base("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 151936);
  m.ffn = 6144;
  m.moe = {.experts = 128, .shared_experts = 0, .top_k = 8, .expert_ffn = 768};
  return m;
}
/// Qwen3-235B-A22B (`Qwen/Qwen3-235B-A22B` config.json): 94 layers, hidden 4096, 64 query heads
/// of 128 and 4 KV heads, 128 experts of width 1536, top-8, vocabulary 151936 (235e9
/// parameters, 22e9 active).
[[nodiscard]] inline transformer qwen3_235b_a22b() {
  transformer m = detail::moe_base("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 151936);
  m.ffn = 12288;
  m.moe = {.experts = 128, .shared_experts = 0, .top_k = 8, .expert_ffn = 1536};
  return m;
}
/// GPT-OSS-120B (`openai/gpt-oss-120b` config.json): 36 layers, hidden 2880, 64 query heads of
/// 64 and 8 KV heads, 128 experts of width 2880, top-4, vocabulary 201088; attention, expert and
/// router GEMMs have biases (116.8e9 parameters; 5.1e9 active by OpenAI's count, which leaves
/// out the input embedding).
[[nodiscard]] inline transformer gpt_oss_120b() {
  transformer m = detail::moe_base("gpt-oss-120b", 36, 2880, 64, 8, 64, 201088);
  m.ffn = 2880;
  m.linear_bias = true;
  m.moe = {.experts = 128, .shared_experts = 0, .top_k = 4, .expert_ffn = 2880, .router_bias = true};
  return m;
}
/// Mixtral 8x7B (`mistralai/Mixtral-8x7B-v0.1` config.json): 32 layers, hidden 4096, 32 query
/// heads and 8 KV heads, 8 experts of width 14336, top-2, vocabulary 32000 (46.7e9 parameters,
/// 12.9e9 active, as Mistral AI's announcement gives them).
[[nodiscard]] inline transformer mixtral_8x7b() {
  transformer m = detail::moe_base("mixtral-8x7b", 32, 4096, 32, 8, 0, 32000);
  m.ffn = 14336;
  m.moe = {.experts = 8, .shared_experts = 0, .top_k = 2, .expert_ffn = 14336};
  return m;
}

/// DeepSeek-V3 (`deepseek-ai/DeepSeek-V3` config.json): 61 layers, hidden 7168, 128 heads of
/// multi-head latent attention (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
/// qk_rope_head_dim 64, v_head_dim 128), the first 3 layers dense with an MLP of 18432
/// (`first_k_dense_replace`, `intermediate_size`), then 256 routed experts of width 2048
/// (`moe_intermediate_size`), 1 shared expert, top-8, vocabulary 129280, untied embeddings
/// (671e9 parameters, 37e9 active), and one multi-token-prediction module
/// (`num_nextn_predict_layers` 1: one more MoE block, its 2h -> h projection and norms, about
/// 11.5e9 more parameters, and a second logits head and loss in training; the DeepSeek-V3 report,
/// section 2.2, and Megatron-Bridge's recipe train with it: `--mtp-layers 0` leaves it out). Not
/// modelled: the sigmoid router's score-correction bias and its group-limited top-k (costed as a
/// plain top-k).
[[nodiscard]] inline transformer deepseek_v3() {
  transformer m = detail::moe_base("deepseek-v3", 61, 7168, 128, 128, 0, 129280);
  m.ffn = 18432;
  m.mla = {.q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64, .v_dim = 128};
  m.moe = {.experts = 256, .shared_experts = 1, .top_k = 8, .expert_ffn = 2048, .first_dense_layers = 3};
  m.mtp_layers = 1;
  return m;
}

/// Names accepted by `model_preset`.
inline constexpr std::array<std::string_view, 13> model_preset_names = {
    "gpt3-15b",   "gpt3-44b",   "gpt3-117b",     "gpt3-175b",       "llama3-8b",    "llama3-70b",
    "llama3-405b", "llama3.1-405b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b",
    "deepseek-v3"};

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
  if (name == "llama3.1-405b") return llama3_1_405b();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b();
  if (name == "qwen3-235b-a22b") return qwen3_235b_a22b();
  if (name == "gpt-oss-120b") return gpt_oss_120b();
  if (name == "mixtral-8x7b") return mixtral_8x7b();
  if (name == "deepseek-v3") return deepseek_v3();
  std::string msg = "unknown model preset '" + std::string(name) + "'; valid names:";
  for (auto n : model_preset_names) {
    msg += ' ';
    msg += n;
  }
  throw error(msg);
}

}  // namespace lumos::model

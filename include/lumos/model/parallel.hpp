#pragma once
// Parallel and training configuration: how one iteration is split over GPUs.

#include <lumos/core/error.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/pipeline_layout.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>

namespace lumos::model {

/// Activation recomputation (Korthikanti et al. 2022): none; selective = the attention core
/// (softmax/score work) is recomputed in backward; full = each layer's forward is rerun in
/// backward from its stored input.
enum class recompute_kind : std::uint8_t { none, selective, full };

/// Lower-case name of `r` ("none", "selective", "full").
[[nodiscard]] constexpr std::string_view to_string(recompute_kind r) noexcept {
  switch (r) {
    case recompute_kind::none: return "none";
    case recompute_kind::selective: return "selective";
    case recompute_kind::full: return "full";
  }
  return "?";
}

/// How the CP ranks of a layer exchange keys and values (see `parallel_config::cp`): p2p — ring
/// attention, cp - 1 send/receive steps overlapped with the attention of the chunk in hand
/// (Megatron-Core / Transformer Engine); allgather — one all-gather of K and V before the
/// attention and a reduce-scatter of their gradients after its backward (Llama 3, §3.3.2).
enum class cp_comm_kind : std::uint8_t { p2p, allgather };

/// Lower-case name of `c` ("p2p", "allgather").
[[nodiscard]] constexpr std::string_view to_string(cp_comm_kind c) noexcept {
  return c == cp_comm_kind::p2p ? "p2p" : "allgather";
}

/// The most micro-batches per pipeline (per data-parallel replica) of an iteration whose graph
/// lumos builds (predict, synth, sweep, whatif). The graph, and the traces synth writes, grow
/// with every micro-batch: twice this bound took 2 s to predict a 16-stage DeepSeek-V3, 22 s and
/// 2 GiB for a what-if of the traced 8-layer tests/data/gpu/h100-base, and 68 s and 7 GiB for synth
/// of Llama-3 8B at TP 8 (2.5 GB of traces); a million micro-batches ran for minutes or out of
/// memory. Real jobs run tens to a few hundred per pipeline (Megatron-Bridge's tables).
inline constexpr std::int64_t max_micro_batches = std::int64_t{1} << 12;

/// Throws `lumos::error` when `count` micro-batches per pipeline are more than
/// `max_micro_batches`; `what` says where the count came from and `change` what lowers it.
inline void check_micro_batch_count(std::int64_t count, const std::string& what, const std::string& change) {
  if (count <= max_micro_batches) return;
  throw error(what + ": " + std::to_string(count) + " micro-batches per pipeline, more than the " + std::to_string(max_micro_batches) +
              " lumos builds an iteration of: " + change);
}

/// Megatron-style 3D parallelism, expert parallelism, and the training options the cost models need.
/// Rank layout as Megatron's default order (tp-cp-ep-dp-pp): tp innermost (consecutive ranks,
/// inside a node), then cp, then dp, then pp — the placement helpers of comm.hpp take this as
/// the default. `world_size() == tp * pp * cp * dp`.
/// Context parallelism splits every sequence over the `cp` ranks of a CP group (cp consecutive
/// ranks at stride tp): each holds seq / cp tokens of every micro-batch (2 chunks of seq / (2 cp)
/// for causal load balancing), so the CP ranks share a micro-batch and gradients and the
/// distributed optimizer are reduced and sharded over the dp * cp ranks of a stage.
/// Expert parallelism (MoE models) does not add to the world. Megatron's MoE parallel folding
/// (Liu et al. 2025, "MoE Parallel Folding"; `--expert-tensor-parallel-size`): the expert layers
/// lay their own grid ETP x EP x EDP over the same tp * cp * dp ranks of a pipeline stage as the
/// attention's TP x CP x DP, etp innermost: an expert-tensor-parallel group is `etp` consecutive
/// ranks (each holding 1 / etp of its experts' width), an expert-parallel group `ep` ranks at
/// stride etp (each holding experts / ep of every MoE layer's experts), and the
/// expert-data-parallel group, over which the experts' gradients are reduced and their optimizer
/// sharded, the tp * cp * dp / (ep * etp) ranks at stride ep * etp. EP x ETP divides TP x CP x DP.
/// `etp = 0` means etp = tp (Megatron's default when the size is not set); then the rule is
/// Megatron's older one, EP divides DP x CP, and the EP group is ep ranks of the DP x CP group.
/// Each iteration runs `micro_batches()` micro-batches of `micro_batch` sequences on every
/// pipeline; `global_batch` counts sequences over all data-parallel replicas.
/// The pipeline schedule is not interpreted here: `schedule` is an opaque name for pipeline/.
struct parallel_config {
  int tp = 1;  ///< tensor-parallel size
  int pp = 1;  ///< pipeline-parallel size (stages)
  int dp = 1;  ///< data-parallel size
  int cp = 1;  ///< context-parallel size (ranks sharing each sequence); 1 = none
  cp_comm_kind cp_comm = cp_comm_kind::p2p;  ///< how CP ranks exchange keys and values
  int vp = 1;  ///< virtual pipeline chunks per stage (interleaved schedule); 1 = none
  int ep = 1;  ///< expert-parallel size (MoE models; ep * expert_tp() divides tp * cp * dp); 1 = every rank holds every expert
  int etp = 0;  ///< expert-tensor-parallel size (MoE models); 0 = tp (see `expert_tp`)
  bool sp = false;  ///< sequence parallelism (Korthikanti et al.); no effect when tp == 1
  /// Megatron's `--tp-comm-overlap` (Transformer Engine userbuffers): each sequence-parallel
  /// collective of a layer overlaps the GEMM beside it. Needs sp when tp > 1.
  bool tp_comm_overlap = false;
  /// Megatron's `--overlap-param-gather` (distributed optimizer, ZeRO-1/2): the parameter
  /// all-gathers after a step overlap the next iteration's first forward pass instead of ending
  /// the step. The iteration is then modelled in steady state: the all-gathers start it.
  bool overlap_param_gather = false;
  std::int64_t micro_batch = 1;   ///< sequences per micro-batch (b)
  std::int64_t global_batch = 1;  ///< sequences per iteration over all replicas (B)
  recompute_kind recompute = recompute_kind::none;
  precision dtype = precision::bf16;
  int zero_stage = 0;    ///< 0: none, 1: optimizer states, 2: + gradients, 3: + parameters
  /// Fully sharded data parallelism (PyTorch FSDP2 `fully_shard`, Megatron FSDP, ZeRO-3):
  /// parameters, gradients and optimizer states sharded over the shard group, each layer's
  /// parameters all-gathered before its forward (and backward) and its gradients
  /// reduce-scattered after its backward, every micro-batch. Needs zero_stage = 3.
  bool fsdp = false;
  /// Hybrid sharding (HSDP): the shard group's size; the dp / hsdp shard groups replicate each
  /// other and all-reduce their gradient shards. 0 = one shard group of all dp ranks.
  int hsdp = 0;
  /// FSDP frees each layer's gathered parameters after its forward and gathers them again for
  /// its backward; off keeps them from the forward to the backward (no backward gathers).
  bool reshard_after_forward = true;
  std::string schedule;  ///< opaque, for pipeline/ (e.g. "1f1b"); empty = caller's default
  /// Explicit layers per virtual stage (Megatron's --pipeline-model-parallel-layout); empty =
  /// the even split, or Megatron's split with the embedding and the loss counted as layers.
  pipeline_layout layout;

  [[nodiscard]] constexpr std::int64_t world_size() const noexcept {
    return std::int64_t{tp} * pp * cp * dp;
  }
  /// Ranks of a stage that reduce each gradient and shard the distributed optimizer: dp * cp
  /// (Megatron's DP x CP group).
  [[nodiscard]] constexpr int gradient_ranks() const noexcept { return dp * cp; }
  /// Tokens of each sequence one rank holds: seq / cp.
  [[nodiscard]] constexpr std::int64_t local_seq(const transformer& m) const noexcept {
    return cp > 1 ? m.seq / cp : m.seq;
  }
  /// Expert-tensor-parallel size: `etp`, or tp when etp is 0.
  [[nodiscard]] constexpr int expert_tp() const noexcept { return etp > 0 ? etp : tp; }
  /// Ranks of an expert-data-parallel group (the replicas of one expert shard):
  /// tp * cp * dp / (ep * expert_tp()), which is dp * cp / ep when etp = tp.
  [[nodiscard]] constexpr int expert_data_parallel() const noexcept {
    if (ep <= 0) return gradient_ranks();
    if (expert_tp() == tp) return gradient_ranks() / ep;
    return static_cast<int>(std::int64_t{tp} * gradient_ranks() / (std::int64_t{ep} * expert_tp()));
  }
  /// Whether parameters are sharded over data parallelism (FSDP, or ZeRO stage 3).
  [[nodiscard]] constexpr bool sharded_parameters() const noexcept { return fsdp || zero_stage >= 3; }
  /// Ranks that share one copy of the sharded states: the DP x CP group, or under hybrid sharding
  /// hsdp of its data-parallel ranks (times cp).
  [[nodiscard]] constexpr int shard_size() const noexcept { return (fsdp && hsdp > 0 ? hsdp : dp) * cp; }
  /// Whether sequence parallelism actually shards anything (sp with tp > 1).
  [[nodiscard]] constexpr bool sequence_parallel() const noexcept { return sp && tp > 1; }

  /// Micro-batches per iteration per pipeline: global_batch / (micro_batch * dp). Throws
  /// `lumos::error` when that is not a positive integer.
  [[nodiscard]] std::int64_t micro_batches() const {
    if (micro_batch <= 0 || dp <= 0 || global_batch <= 0) {
      throw error("micro_batch (" + std::to_string(micro_batch) + "), dp (" +
                  std::to_string(dp) + ") and global_batch (" + std::to_string(global_batch) +
                  ") must be positive");
    }
    const std::int64_t per_step = micro_batch * dp;
    if (global_batch % per_step != 0) {
      throw error("global_batch (" + std::to_string(global_batch) +
                  ") must be divisible by micro_batch * dp (" + std::to_string(micro_batch) +
                  " * " + std::to_string(dp) + " = " + std::to_string(per_step) +
                  "): set global_batch to a multiple of " + std::to_string(per_step) +
                  " or change micro_batch or dp");
    }
    return global_batch / per_step;
  }

  /// Whether the layers are split as Megatron's --account-for-embedding-in-pipeline-split and
  /// --account-for-loss-in-pipeline-split split them: pp * vp (> 1) does not divide the layers
  /// but divides layers + 2, so the embedding counts as a layer of the first virtual stage and
  /// the loss as one of the last, each of which holds one transformer layer fewer than the
  /// others (Llama 3.1 405B: 126 + 2 = 128 over pp 8 x vp 8, Megatron-Bridge's recipe).
  /// Multi-token-prediction blocks count as layers of the last virtual stage (`transformer::blocks`;
  /// DeepSeek-V3: 61 + 1 + 2 = 64 over pp 16, Megatron-Bridge's layout "embedding, decoder x 61,
  /// mtp, loss" cut into equal virtual stages). "Layers" below are such blocks. False under an
  /// explicit `layout`.
  [[nodiscard]] constexpr bool embedding_loss_in_split(const transformer& m) const noexcept {
    const std::int64_t chunks = std::int64_t{pp} * vp;
    return layout.empty() && chunks > 1 && m.blocks() % chunks != 0 && (m.blocks() + 2) % chunks == 0;
  }
  /// Transformer layers held by a pipeline stage other than the first and the last (all its
  /// virtual chunks together); under an explicit `layout`, the most any stage holds.
  /// `stage_layers` has every stage's.
  [[nodiscard]] constexpr std::int64_t layers_per_stage(const transformer& m) const noexcept {
    if (!layout.empty()) {
      std::int64_t most = 0;
      for (int s = 0; s < pp; ++s) most = std::max(most, stage_layers(m, s));
      return most;
    }
    return layers_per_chunk(m) * vp;
  }
  /// Transformer layers in one virtual chunk (== layers_per_stage when vp == 1); under
  /// `embedding_loss_in_split` the first and the last virtual stage hold one fewer; under an
  /// explicit `layout`, the most any virtual stage holds.
  [[nodiscard]] constexpr std::int64_t layers_per_chunk(const transformer& m) const noexcept {
    if (!layout.empty()) return *std::max_element(layout.blocks.begin(), layout.blocks.end());
    return (m.blocks() + (embedding_loss_in_split(m) ? 2 : 0)) / (std::int64_t{pp} * vp);
  }
  /// Transformer layers of virtual stage `v` (chunk v / pp of stage v % pp), 0 <= v < pp * vp.
  [[nodiscard]] constexpr std::int64_t virtual_stage_layers(const transformer& m, int v) const noexcept {
    if (!layout.empty()) return layout.blocks[static_cast<std::size_t>(v)];
    const bool split = embedding_loss_in_split(m);
    return layers_per_chunk(m) - (split && v == 0 ? 1 : 0) - (split && v == pp * vp - 1 ? 1 : 0);
  }
  /// Index of the first layer of virtual stage `v` in model order (the layers before it).
  [[nodiscard]] constexpr std::int64_t first_layer(const transformer& m, int v) const noexcept {
    if (!layout.empty()) {
      return std::accumulate(layout.blocks.begin(), layout.blocks.begin() + v, std::int64_t{0});
    }
    return std::int64_t{v} * layers_per_chunk(m) - (embedding_loss_in_split(m) && v > 0 ? 1 : 0);
  }
  /// Transformer layers of virtual chunk `chunk` (0 <= chunk < vp) of stage `stage`.
  [[nodiscard]] constexpr std::int64_t chunk_layers(const transformer& m, int stage, int chunk) const noexcept {
    return virtual_stage_layers(m, chunk * pp + stage);
  }
  /// Transformer layers held by stage `stage` (all its virtual chunks together).
  [[nodiscard]] constexpr std::int64_t stage_layers(const transformer& m, int stage) const noexcept {
    if (!layout.empty()) {
      std::int64_t n = 0;
      for (int c = 0; c < vp; ++c) n += chunk_layers(m, stage, c);
      return n;
    }
    const bool split = embedding_loss_in_split(m);
    return layers_per_stage(m) - (split && stage == 0 ? 1 : 0) - (split && stage == pp - 1 ? 1 : 0);
  }

  /// Checks the configuration against the model. Throws `lumos::error` whose message names
  /// the failing rule and what to change. Does not check the hardware (see the overload).
  void validate(const transformer& m) const {
    m.validate();
    auto at_least_one = [](int v, const char* field) {
      if (v < 1) {
        throw error(std::string(field) + " must be at least 1, got " + std::to_string(v));
      }
    };
    at_least_one(tp, "tp");
    at_least_one(pp, "pp");
    at_least_one(dp, "dp");
    at_least_one(cp, "cp");
    at_least_one(vp, "vp");
    at_least_one(ep, "ep");
    (void)micro_batches();
    if (cp > 1 && m.seq % (2 * std::int64_t{cp}) != 0) {
      throw error("model '" + m.name + "': seq (" + std::to_string(m.seq) + ") must be divisible by 2 * cp (2 * " +
                  std::to_string(cp) + " = " + std::to_string(2 * std::int64_t{cp}) +
                  "): causal load balancing splits each sequence into 2 * cp chunks; change seq or cp");
    }
    validate_experts(m);
    if (zero_stage < 0 || zero_stage > 3) {
      throw error("zero_stage must be 0, 1, 2 or 3, got " + std::to_string(zero_stage));
    }
    validate_fsdp();
    const std::string t = std::to_string(tp);
    auto divisible_by_tp = [&](std::int64_t v, const char* field, const char* advice) {
      if (v % tp != 0) {
        throw error("model '" + m.name + "': " + field + " (" + std::to_string(v) +
                    ") is not divisible by tp (" + t + "): " + advice);
      }
    };
    divisible_by_tp(m.heads, "heads", "choose tp that divides the number of attention heads");
    // Megatron shards whole query groups: each TP rank needs its own KV heads.
    divisible_by_tp(m.kv_heads, "kv_heads",
                    "Megatron shards whole KV groups, so tp must divide kv_heads (use tp <= "
                    "kv_heads)");
    divisible_by_tp(m.ffn, "ffn", "choose tp that divides the MLP width");
    divisible_by_tp(m.vocab, "vocab",
                    "pad the vocabulary to a multiple of tp (Megatron pads to 128 * tp)");
    // Each CP rank's seq / cp tokens are what sequence parallelism splits over the TP ranks.
    if (sequence_parallel() && m.seq % (std::int64_t{tp} * cp) != 0) {
      const std::string by = cp > 1 ? "tp * cp (" + t + " * " + std::to_string(cp) + " = " + std::to_string(std::int64_t{tp} * cp) + ")"
                                    : "tp (" + t + ")";
      throw error("model '" + m.name + "': seq (" + std::to_string(m.seq) + ") is not divisible by " + by +
                  " as sequence parallelism requires: change seq or tp, or turn sp off");
    }
    if (tp_comm_overlap && tp > 1 && !sp) {
      throw error("tp_comm_overlap overlaps the sequence-parallel all-gathers and reduce-scatters "
                  "with GEMMs (Megatron requires sequence parallelism for it): turn sp on or the "
                  "overlap off");
    }
    if (vp > 1 && pp == 1) {
      throw error("vp = " + std::to_string(vp) +
                  " virtual chunks need pipeline parallelism: set pp > 1 or vp = 1");
    }
    const std::int64_t chunks = std::int64_t{pp} * vp;
    if (!layout.empty()) {
      validate_layout(m);
    } else if (m.blocks() % chunks != 0 && !embedding_loss_in_split(m)) {
      const std::string mtp = m.mtp_layers > 0 ? " + " + std::to_string(m.mtp_layers) + " multi-token-prediction" : "";
      throw error("model '" + m.name + "': layers (" + std::to_string(m.layers) + mtp +
                  ") must be divisible by pp * vp (" + std::to_string(pp) + " * " +
                  std::to_string(vp) + " = " + std::to_string(chunks) +
                  "), or layers + 2 with the embedding and the loss counted as layers: choose pp "
                  "and vp whose product divides the layer count");
    }
  }

  /// The rules of `validate` for an explicit `layout`: one entry per virtual stage (pp * vp), its
  /// transformer layers the model's, its MTP blocks the model's.
  void validate_layout(const transformer& m) const {
    const std::string text = "pipeline layout '" + layout.to_string() + "'";
    if (std::int64_t{layout.virtual_stages()} != std::int64_t{pp} * vp) {
      throw error(text + " has " + std::to_string(layout.virtual_stages()) + " virtual stages, pp * vp is " +
                  std::to_string(pp) + " * " + std::to_string(vp) + " = " + std::to_string(std::int64_t{pp} * vp) +
                  ": give one '|'-separated group per virtual stage");
    }
    if (layout.layers() != m.layers) {
      throw error(text + " places " + std::to_string(layout.layers()) + " transformer layers, model '" + m.name + "' has " +
                  std::to_string(m.layers));
    }
    if (layout.mtp != m.mtp_layers) {
      throw error(text + " places " + std::to_string(layout.mtp) + " multi-token-prediction blocks (m), model '" + m.name +
                  "' has " + std::to_string(m.mtp_layers));
    }
  }

  /// The FSDP rules of `validate`: fsdp is ZeRO stage 3 (zero_stage must say 3); hsdp needs fsdp,
  /// is not negative and divides dp. FSDP with pipeline parallelism is allowed.
  void validate_fsdp() const {
    if (fsdp && zero_stage != 3) {
      throw error("fsdp shards parameters, gradients and optimizer states (ZeRO stage 3): zero_stage " +
                  std::to_string(zero_stage) + " contradicts it (set zero_stage 3 or turn fsdp off)");
    }
    if (hsdp < 0) throw error("hsdp must be 0 (shard over all dp ranks) or positive, got " + std::to_string(hsdp));
    if (hsdp > 0 && !fsdp) {
      throw error("hsdp = " + std::to_string(hsdp) + " is a shard group size of FSDP: turn fsdp on or set hsdp 0");
    }
    if (hsdp > 0 && dp % hsdp != 0) {
      throw error("hsdp (" + std::to_string(hsdp) + ") must divide dp (" + std::to_string(dp) +
                  "): dp / hsdp shard groups replicate each other");
    }
  }

  /// The expert-parallel rules of `validate`: ep > 1 or etp > 0 needs a MoE model; etp >= 0;
  /// ep * expert_tp() divides tp * cp * dp (the expert grid folds over the stage's ranks) and ep
  /// the routed experts; expert_tp() divides the expert FFN; with tp > 1 sequence parallelism is
  /// on (Megatron requires it for MoE with tensor parallelism: the router sees each rank's
  /// sequence shard).
  void validate_experts(const transformer& m) const {
    const std::string e = std::to_string(ep);
    if (!m.is_moe()) {
      if (ep > 1 || etp > 0) {
        throw error((ep > 1 ? "ep = " + e : "expert tp = " + std::to_string(etp)) + " needs a mixture-of-experts model: model '" +
                    m.name + "' has no experts (set experts, or ep = 1 and no expert tp)");
      }
      return;
    }
    if (etp < 0) throw error("expert tp must be at least 1 (or 0: the same as tp), got " + std::to_string(etp));
    const std::int64_t stage_ranks = std::int64_t{tp} * cp * dp, expert_grid = std::int64_t{ep} * expert_tp();
    if (stage_ranks % expert_grid != 0) {
      throw error("ep * expert tp (" + e + " * " + std::to_string(expert_tp()) + " = " + std::to_string(expert_grid) +
                  ") must divide tp * cp * dp (" + std::to_string(tp) + " * " + std::to_string(cp) + " * " + std::to_string(dp) +
                  " = " + std::to_string(stage_ranks) +
                  "): the expert layers fold EP x expert-TP x expert-DP over a pipeline stage's TP x CP x DP ranks"
                  " (expert tp defaults to tp; set it, e.g. 1, or change ep)");
    }
    if (m.moe.experts % ep != 0) {
      throw error("model '" + m.name + "': experts (" + std::to_string(m.moe.experts) + ") must be divisible by ep (" + e +
                  "): each expert-parallel rank holds the same number of experts");
    }
    if (m.moe.expert_ffn % expert_tp() != 0) {
      throw error("model '" + m.name + "': expert_ffn (" + std::to_string(m.moe.expert_ffn) +
                  ") is not divisible by expert tp (" + std::to_string(expert_tp()) +
                  "): each expert-tensor-parallel rank holds the same slice of every local expert's width");
    }
    if (tp > 1) {
      if (!sp) {
        throw error("a mixture-of-experts model with tp > 1 needs sequence parallelism (Megatron requires it): turn sp on");
      }
    }
  }

  /// As `validate(m)`, and also that the hardware supports `dtype` (fp8 needs Hopper).
  void validate(const transformer& m, const hardware& hw) const {
    validate(m);
    (void)hw.peak_flops(dtype);
  }
};

}  // namespace lumos::model

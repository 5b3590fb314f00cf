#pragma once
// The facts structure discovery reports (each with what it was read from, or why it is unknown,
// and the flag that supplies it) and the options that steer it. The facets under
// whatif/structure/ fill them; whatif/structure.hpp runs the facets in order.

#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/eager_memory.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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
enum class group_role : std::uint8_t { world, tp, dp, pp, ep, cp };

[[nodiscard]] constexpr std::string_view to_string(group_role r) noexcept {
  switch (r) {
    case group_role::world: return "world";
    case group_role::tp: return "TP";
    case group_role::dp: return "DP";
    case group_role::pp: return "PP";
    case group_role::ep: return "EP";
    case group_role::cp: return "CP";
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
  fact<synth::schedule_policy> schedule;  ///< a shipped schedule whose order every stage ran
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
  std::uint32_t inner_op = ~std::uint32_t{0};  ///< innermost enclosing CPU operator (event index), or none
};

/// How the traced step keeps its memory (whatif/structure/memory_recipe.hpp): a PyTorch eager
/// step with a `torch.optim` Adam optimizer is modelled by model/eager_memory.hpp from the data
/// types read here; anything else (`recipe` unset) by Megatron's model (model/memory.hpp).
struct memory_recipe_facts {
  fact<std::string> optimizer, states, residual, loss, embeddings;
  std::optional<model::eager_recipe> recipe;
  bool tied_embeddings = false;
};

/// One all-to-all of the iteration, joined across the ranks that ran it (one entry per graph
/// collective instance; one per launch when its peers are absent from the job).
struct all_to_all_info {
  std::string group;  ///< its process group's name ("world" when matched by order without args)
  phase_kind phase = phase_kind::other;  ///< on the first rank that ran it
  std::vector<int> ranks;                ///< the ranks that ran it, in job order
  /// Per entry of `ranks`: elements it sent and received (`In`/`Out msg nelems`, else the
  /// tensors of the c10d all-to-all operator's `Input Dims`); -1 where neither is recorded.
  std::vector<std::int64_t> in_elements, out_elements;
  /// `In split size` / `Out split size` of the first rank that recorded them: rows sent to and
  /// received from each peer of the group; empty when not recorded (an even split).
  std::vector<std::int64_t> in_splits, out_splits;
  std::string source;  ///< what the sizes were read from
};

/// The mixture-of-experts layers of the job, read from the first forward pass of each rank: a
/// router (a GEMM to as many outputs as experts followed by a top-k operator), then the rank's
/// experts as a grouped GEMM or a loop of per-expert GEMMs. Every fact unknown (with why) when
/// no router is found.
struct moe_structure {
  fact<int> layers;            ///< MoE layers in one forward pass (routers found)
  fact<int> experts;           ///< routed experts per MoE layer (the whole model's)
  fact<int> experts_per_rank;  ///< routed experts whose GEMMs one rank runs
  fact<int> top_k;             ///< experts each token visits
  fact<int> ep;                ///< expert-parallel degree: experts / experts per rank
  /// Expert-tensor-parallel degree: the ranks that compute each token copy (each holds 1 / it of
  /// every local expert's width); the TP size or 1 in Megatron's recipes.
  fact<int> expert_tp;
  /// Tokens of the first MoE layer of the first forward pass: per expert of the rank
  /// (`expert_tokens_per` "expert"), or per EP peer the dispatch all-to-all received from
  /// ("ep_peer") when only its split sizes say it.
  fact<std::vector<std::int64_t>> expert_tokens;
  std::string expert_tokens_per;

  [[nodiscard]] bool found() const noexcept { return layers.known(); }
};

/// The context parallelism of the job (whatif/structure/context_parallel.hpp): the group whose
/// description names it, or whose send/recv run inside the layers' attention. Every fact unknown
/// when no such group is found.
struct cp_structure {
  fact<int> size;                 ///< ranks that share each sequence
  fact<int> exchanges_per_layer;  ///< key/value exchange kernels per layer of a forward pass, on one rank
  fact<std::string> comm;         ///< "p2p" (ring send/recv) or "allgather"
  std::vector<std::string> groups;  ///< names of the CP groups

  [[nodiscard]] bool found() const noexcept { return size.known(); }
};

/// Fully sharded data parallelism (FSDP2, ZeRO-3) as the traces show it
/// (whatif/structure/fsdp.hpp). Every fact unknown when no group shards parameters.
struct fsdp_structure {
  fact<int> units;            ///< FSDP units: reduce-scatters per backward pass
  fact<int> all_gathers;      ///< parameter all-gathers per iteration on one rank
  fact<int> reduce_scatters;  ///< gradient reduce-scatters per iteration on one rank
  fact<int> shard;            ///< ranks of the shard group
  fact<int> replicas;         ///< HSDP: ranks of the replica group (1: no hybrid sharding)
  fact<std::string> reshard_after_forward;  ///< "on": backward passes gather again; "off": they do not
  std::string group, replica_group;          ///< the groups' names
  std::string source;                        ///< what FSDP was recognised by

  [[nodiscard]] bool found() const noexcept { return all_gathers.known(); }
};

/// What `discover_structure` found.
struct job_structure {
  parallel_layout parallel;
  model_shape model;
  gradient_reduction gradients;
  memory_recipe_facts memory;
  std::vector<rank_structure> ranks;  ///< same order as job.ranks
  std::vector<process_group> groups;
  std::vector<layer_task_group> layer_groups;
  std::vector<gpu_op_context> gpu_ops;  ///< every GPU op launched in the iteration, per rank in launch order
  moe_structure moe;
  cp_structure cp;
  fsdp_structure fsdp;  ///< sharded parameters (FSDP2, ZeRO-3), when found
  std::vector<all_to_all_info> all_to_alls;  ///< every all-to-all of the iteration (expert dispatch, embedding shards)
  fact<std::string> layers_method;  ///< "module annotations" / "kernel periodicity"
  std::vector<std::string> notes;   ///< ambiguities, conflicts, overrides
};

/// A copy of `st` in which only the groups `keep(name)` holds stay data-parallel groups (the
/// others lose that role): the view a pass resizes when some DP groups are another pass's
/// (re-timed already, or HSDP's replica groups).
template <class Keep>
[[nodiscard]] job_structure with_dp_groups(const job_structure& st, Keep&& keep) {
  job_structure out = st;
  for (process_group& pg : out.groups) {
    if (!keep(std::as_const(pg.name))) std::erase_if(pg.roles, [](const fact<group_role>& r) { return r.value == group_role::dp; });
  }
  return out;
}

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
  /// Keeps only the candidates of this name (`schedule_policy::name`); the schedule itself when
  /// the traces do not determine one.
  std::optional<synth::schedule_policy> schedule;
  /// Names of CPU annotations / module scopes that delimit one transformer layer (substrings).
  std::vector<std::string> layer_scopes = {"TransformerLayer", "DecoderLayer", "EncoderLayer", "TransformerBlock"};
  std::size_t min_period = 4;     ///< fewest GPU ops in a layer found by periodicity
  std::size_t max_period = 1024;  ///< most GPU ops in a layer found by periodicity
};

}  // namespace lumos::whatif


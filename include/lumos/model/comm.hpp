#pragma once
// Communication cost models: alpha-beta ring and tree collectives, hierarchical groups that
// span nodes, point-to-point transfers; rank placement of Megatron's TP/DP/PP groups.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::model {

/// Collective operations. Byte convention (as nccl-tests reports "size"): all-reduce and
/// broadcast — the buffer size; all-gather — the gathered output (n times each rank's part);
/// reduce-scatter — the input (n times each rank's result); all-to-all — each rank's send
/// buffer (n chunks, one per peer).
enum class collective : std::uint8_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  all_to_all,
  broadcast
};

/// snake_case name of `c`, e.g. "all_reduce".
[[nodiscard]] constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::all_gather: return "all_gather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_to_all: return "all_to_all";
    case collective::broadcast: return "broadcast";
  }
  return "?";
}

/// nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): the fraction of `bytes` that crosses
/// each rank's link, so that time = factor * bytes / link bandwidth for a bandwidth-optimal
/// algorithm. all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
/// broadcast 1. A group of one moves nothing (0).
[[nodiscard]] constexpr double bus_factor(collective c, std::int64_t n) noexcept {
  if (n <= 1) return 0.0;
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  switch (c) {
    case collective::all_reduce: return 2.0 * frac;
    case collective::all_gather:
    case collective::reduce_scatter:
    case collective::all_to_all: return frac;
    case collective::broadcast: return 1.0;
  }
  return 0.0;
}

/// Latency steps of the ring algorithm: all-reduce 2(n-1) (reduce-scatter then all-gather),
/// every other collective n-1 (broadcast: a pipelined chain).
[[nodiscard]] constexpr std::int64_t ring_steps(collective c, std::int64_t n) noexcept {
  if (n <= 1) return 0;
  return c == collective::all_reduce ? 2 * (n - 1) : n - 1;
}

/// ceil(log2 n) for n >= 1.
[[nodiscard]] constexpr std::int64_t ceil_log2(std::int64_t n) noexcept {
  std::int64_t k = 0;
  while ((std::int64_t{1} << k) < n) ++k;
  return k;
}

/// Latency steps of the tree algorithm: all-reduce 2 ceil(log2 n) (reduce up, broadcast
/// down), broadcast ceil(log2 n). NCCL has no tree all-gather, reduce-scatter or all-to-all;
/// those fall back to the ring's steps.
[[nodiscard]] constexpr std::int64_t tree_steps(collective c, std::int64_t n) noexcept {
  if (n <= 1) return 0;
  switch (c) {
    case collective::all_reduce: return 2 * ceil_log2(n);
    case collective::broadcast: return ceil_log2(n);
    default: return ring_steps(c, n);
  }
}

/// Collective algorithm of an alpha-beta model.
enum class algorithm : std::uint8_t { ring, tree };

/// Flat alpha-beta time in nanoseconds (not rounded) of a collective over `n` ranks that all
/// talk over `link`: alpha * steps + bus_factor * bytes / (bandwidth * efficiency).
/// The tree keeps the ring's bandwidth term: NCCL's double binary tree splits the data over
/// two trees so each rank sends and receives about the same volume as in a ring; only the
/// latency term changes. O(log n).
[[nodiscard]] constexpr double alpha_beta_ns(collective c, double bytes, std::int64_t n,
                                             const link_spec& link, algorithm a) noexcept {
  if (n <= 1 || bytes <= 0) return 0.0;
  const std::int64_t steps = a == algorithm::ring ? ring_steps(c, n) : tree_steps(c, n);
  return static_cast<double>(link.latency) * static_cast<double>(steps) +
         bus_factor(c, n) * bytes / link.effective_bandwidth() * 1e9;
}

/// Where the members of a communicator sit: `size` ranks, `ranks_per_node` of them on each of
/// `size / ranks_per_node` nodes (uniform placement; `from_nodes` builds it from an explicit
/// list and rejects uneven ones). A node here is an NVLink domain: the GPUs that reach each other
/// over `hardware::intra_node` (`hardware::nvlink_domain_size`).
struct group_placement {
  std::int64_t size = 1;
  std::int64_t ranks_per_node = 1;

  [[nodiscard]] constexpr std::int64_t nodes() const noexcept { return size / ranks_per_node; }

  /// Throws `lumos::error` unless 1 <= ranks_per_node <= size, ranks_per_node divides size,
  /// and ranks_per_node fits in an NVLink domain of `hw` (`hardware::nvlink_domain_size`).
  void validate(const hardware& hw) const {
    if (size < 1 || ranks_per_node < 1 || ranks_per_node > size || size % ranks_per_node != 0) {
      throw error("group placement: size (" + std::to_string(size) +
                  ") must be a positive multiple of ranks_per_node (" +
                  std::to_string(ranks_per_node) + ")");
    }
    if (ranks_per_node > hw.nvlink_domain_size()) {
      throw error("group placement: ranks_per_node (" + std::to_string(ranks_per_node) +
                  ") exceeds the GPUs per NVLink domain (" + std::to_string(hw.nvlink_domain_size()) + ") of '" +
                  hw.name + "'");
    }
  }

  /// Placement from the node id of every member. Throws `lumos::error` when nodes hold
  /// different numbers of members (the hierarchical model assumes symmetry). O(n log n).
  [[nodiscard]] static group_placement from_nodes(std::span<const std::int64_t> node_of_member) {
    std::vector<std::int64_t> sorted(node_of_member.begin(), node_of_member.end());
    std::sort(sorted.begin(), sorted.end());
    return from_sorted_nodes(static_cast<std::int64_t>(sorted.size()),
                             [&](std::int64_t i) { return sorted[static_cast<std::size_t>(i)]; });
  }

  /// `from_nodes` for members whose nodes `node_of(i)`, i < n, come in ascending order: O(n),
  /// no allocation.
  template <class NodeOf>
  [[nodiscard]] static group_placement from_sorted_nodes(std::int64_t n, NodeOf node_of) {
    if (n <= 0) throw error("group placement: empty group");
    const std::int64_t first = node_of(0);
    std::int64_t per = 0;
    for (std::int64_t i = 0; i < n;) {
      const std::int64_t node = node_of(i);
      std::int64_t j = i + 1;
      while (j < n && node_of(j) == node) ++j;
      const std::int64_t c = j - i;
      if (i == 0) per = c;
      if (c != per) {
        throw error("group placement: node " + std::to_string(node) + " holds " + std::to_string(c) + " members but node " +
                    std::to_string(first) + " holds " + std::to_string(per) + "; uneven groups are not modelled");
      }
      i = j;
    }
    return {n, per};
  }
};

/// Group placement from member ranks; groups whose nodes hold unequal numbers of members (which
/// the hierarchical model does not describe) are priced as if every member were on its own node.
/// `nodes` is working memory: with it kept between calls, no allocation.
[[nodiscard]] inline group_placement placement_of(const std::vector<int>& ranks, const hardware& hw,
                                                  std::vector<std::int64_t>& nodes) {
  nodes.clear();
  const int domain = hw.nvlink_domain_size();
  for (const int r : ranks) nodes.push_back(r / domain);
  // Groups list their ranks in ascending order as a rule (a world group of 10^6 ranks is
  // then a linear pass, not a sort).
  if (!std::is_sorted(nodes.begin(), nodes.end())) std::sort(nodes.begin(), nodes.end());
  std::int64_t per = 0;
  bool even = true;
  for (std::size_t i = 0; i < nodes.size();) {
    std::size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    const auto count = static_cast<std::int64_t>(j - i);
    if (per == 0) per = count;
    even = even && count == per;
    i = j;
  }
  if (!even || per < 1 || per > domain) per = 1;
  return {static_cast<std::int64_t>(ranks.size()), per};
}
[[nodiscard]] inline group_placement placement_of(const std::vector<int>& ranks, const hardware& hw) {
  std::vector<std::int64_t> nodes;
  return placement_of(ranks, hw, nodes);
}

/// Parameters per data-parallel gradient bucket in Megatron-LM: max(40e6, 1e6 x dp).
[[nodiscard]] constexpr std::int64_t megatron_bucket_params(int dp) noexcept {
  return std::max<std::int64_t>(40'000'000, 1'000'000LL * dp);
}

/// Megatron's gradient buckets over a model chunk's parameter segments, given in the order the
/// backward computes their gradients (the head, the layers last first, the embedding): a bucket
/// closes once it holds `bucket_params`, the rest closes with the last segment. Each bucket as
/// (index of the segment that closes it, its parameters), into `out` (overwritten).
inline void gradient_buckets(std::span<const std::int64_t> segments, std::int64_t bucket_params,
                             std::vector<std::pair<int, std::int64_t>>& out) {
  out.clear();
  std::int64_t acc = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    acc += segments[i];
    if (acc >= bucket_params) {
      out.emplace_back(static_cast<int>(i), acc);
      acc = 0;
    }
  }
  if (acc > 0) out.emplace_back(static_cast<int>(segments.size()) - 1, acc);
}
[[nodiscard]] inline std::vector<std::pair<int, std::int64_t>> gradient_buckets(std::span<const std::int64_t> segments,
                                                                                std::int64_t bucket_params) {
  std::vector<std::pair<int, std::int64_t>> out;
  gradient_buckets(segments, bucket_params, out);
  return out;
}

/// One collective call: kind, bytes (see `collective` for the convention) and group.
struct collective_op {
  collective kind = collective::all_reduce;
  std::int64_t bytes = 0;
  group_placement group;
};

/// One point-to-point transfer (send and its matching recv), e.g. pipeline activations.
struct p2p_op {
  std::int64_t bytes = 0;
  bool same_node = true;
};

/// A communication cost model prices collectives and point-to-point transfers on a machine.
/// Both calls return whole nanoseconds >= 0, are pure (same inputs, same result) and throw
/// `lumos::error` for placements the machine cannot hold.
template <class Model>
concept CommModel = requires(const Model& m, const collective_op& c, const p2p_op& p,
                             const hardware& hw) {
  { m.collective_time(c, hw) } -> std::same_as<time_ns>;
  { m.p2p_time(p, hw) } -> std::same_as<time_ns>;
};

namespace detail {
/// Hierarchical alpha-beta time (ns, unrounded). With r ranks per node on N nodes (n = r N):
///  - all-reduce:     reduce-scatter inside each node (r ranks, B bytes), all-reduce across
///                    nodes by the r rank-sets in parallel, each over its own NIC (N ranks,
///                    B/r bytes), all-gather inside each node (r ranks, B bytes);
///  - reduce-scatter: inside the node (r, B) then across nodes (N, B/r);
///  - all-gather:     across nodes (N, B/r) then inside the node (r, B);
///  - broadcast:      across nodes (N, B) then inside the node (r, B), phases not overlapped
///                    (an upper bound: NCCL pipelines the chain);
///  - all-to-all:     the intra-node share (r-1 peers, NVLink) and the inter-node share (n-r
///                    peers, NIC) proceed concurrently; the slower one decides.
/// With N == 1 every case is the flat formula over NVLink; with r == 1 over the NIC.
[[nodiscard]] constexpr double hierarchical_ns(collective c, double B, group_placement g,
                                               const hardware& hw, algorithm a) noexcept {
  const std::int64_t n = g.size, r = g.ranks_per_node, N = g.nodes();
  const link_spec& in = hw.intra_node;
  const link_spec& out = hw.inter_node;
  if (n <= 1 || B <= 0) return 0.0;
  if (N == 1) return alpha_beta_ns(c, B, n, in, a);
  if (r == 1) return alpha_beta_ns(c, B, n, out, a);
  const double per_rank = B / static_cast<double>(r);
  switch (c) {
    case collective::all_reduce:
      return alpha_beta_ns(collective::reduce_scatter, B, r, in, algorithm::ring) +
             alpha_beta_ns(collective::all_reduce, per_rank, N, out, a) +
             alpha_beta_ns(collective::all_gather, B, r, in, algorithm::ring);
    case collective::reduce_scatter:
      return alpha_beta_ns(collective::reduce_scatter, B, r, in, algorithm::ring) +
             alpha_beta_ns(collective::reduce_scatter, per_rank, N, out, algorithm::ring);
    case collective::all_gather:
      return alpha_beta_ns(collective::all_gather, per_rank, N, out, algorithm::ring) +
             alpha_beta_ns(collective::all_gather, B, r, in, algorithm::ring);
    case collective::broadcast:
      return alpha_beta_ns(collective::broadcast, B, N, out, a) +
             alpha_beta_ns(collective::broadcast, B, r, in, a);
    case collective::all_to_all: {
      const double chunk = B / static_cast<double>(n);
      const double intra = static_cast<double>(in.latency) * static_cast<double>(r - 1) +
                           chunk * static_cast<double>(r - 1) / in.effective_bandwidth() * 1e9;
      const double inter = static_cast<double>(out.latency) * static_cast<double>(n - r) +
                           chunk * static_cast<double>(n - r) / out.effective_bandwidth() * 1e9;
      return std::max(intra, inter);
    }
  }
  return 0.0;
}

inline void require_link(const link_spec& l, const char* which, const hardware& hw) {
  if (!(l.effective_bandwidth() > 0) || l.latency < 0) {
    throw error("hardware '" + hw.name + "': " + which +
                " link needs bandwidth > 0, efficiency > 0 and latency >= 0");
  }
}

template <algorithm A>
struct alpha_beta_base {
  /// Time of one collective; see `detail::hierarchical_ns` for the decomposition.
  /// Throws `lumos::error` for a negative size or an invalid placement. O(log n).
  [[nodiscard]] time_ns collective_time(const collective_op& op, const hardware& hw) const {
    if (op.bytes < 0) throw error("collective size must be non-negative");
    op.group.validate(hw);
    if (op.group.ranks_per_node > 1) require_link(hw.intra_node, "intra_node", hw);
    if (op.group.nodes() > 1) require_link(hw.inter_node, "inter_node", hw);
    return round_ns(hierarchical_ns(op.kind, static_cast<double>(op.bytes), op.group, hw, A));
  }
  /// alpha + bytes / (bandwidth * efficiency) of the NVLink or the NIC. O(1).
  [[nodiscard]] time_ns p2p_time(const p2p_op& op, const hardware& hw) const {
    if (op.bytes < 0) throw error("p2p size must be non-negative");
    if (op.bytes == 0) return 0;
    const link_spec& link = op.same_node ? hw.intra_node : hw.inter_node;
    require_link(link, op.same_node ? "intra_node" : "inter_node", hw);
    return round_ns(static_cast<double>(link.latency) +
                    static_cast<double>(op.bytes) / link.effective_bandwidth() * 1e9);
  }
};
}  // namespace detail

/// Default communication model: ring collectives, alpha-beta costs per link class,
/// hierarchical (NVLink inside a node, one NIC per GPU across nodes). No contention between
/// concurrent collectives, no SHARP/NVLS in-network reduction, no protocol switching
/// (LL/LL128/Simple): alpha is one number per link class.
struct ring_alpha_beta : detail::alpha_beta_base<algorithm::ring> {};
static_assert(CommModel<ring_alpha_beta>);

/// As `ring_alpha_beta` but all-reduce and broadcast use a tree (2 ceil(log2 n) and
/// ceil(log2 n) latency steps; across nodes for hierarchical groups). Other collectives are
/// rings, as in NCCL.
struct tree_alpha_beta : detail::alpha_beta_base<algorithm::tree> {};
static_assert(CommModel<tree_alpha_beta>);

// ---------------------------------------------------------------------------------------------
// Megatron group placement and message sizes
// ---------------------------------------------------------------------------------------------
// Rank order: tp fastest, then cp, then dp, then pp (Megatron's default "tp-cp-ep-dp-pp" order); node of rank
// k = k / hw.nvlink_domain_size() (a "node" of the placement is an NVLink domain). Groups are built for their first member (rank 0's groups); with the
// uniform layouts accepted here every group of a kind has the same placement.

namespace detail {
// Ranks first + i·stride, in ascending order, as their nodes are.
[[nodiscard]] inline group_placement place(std::int64_t first, std::int64_t stride,
                                           std::int64_t count, const hardware& hw) {
  const std::int64_t domain = hw.nvlink_domain_size();
  return group_placement::from_sorted_nodes(count, [&](std::int64_t i) { return (first + i * stride) / domain; });
}
}  // namespace detail

/// Placement of a tensor-parallel group (tp consecutive ranks). O(tp log tp).
[[nodiscard]] inline group_placement tensor_parallel_group(const parallel_config& par,
                                                           const hardware& hw) {
  return detail::place(0, 1, par.tp, hw);
}

/// Placement of the group that reduces gradients: the dp * cp ranks of the DP x CP group,
/// stride tp (the data-parallel group when cp == 1). O(dp cp log(dp cp)).
[[nodiscard]] inline group_placement data_parallel_group(const parallel_config& par,
                                                         const hardware& hw) {
  return detail::place(0, par.tp, par.gradient_ranks(), hw);
}

/// Placement of a context-parallel group (cp consecutive ranks at stride tp): inside an NVLink
/// domain when tp * cp fits in it, across the network otherwise. O(cp log cp).
[[nodiscard]] inline group_placement context_parallel_group(const parallel_config& par,
                                                            const hardware& hw) {
  return detail::place(0, par.tp, par.cp, hw);
}

/// Whether the pipeline send from stage `stage` to `stage + 1` of the ranks with index
/// `rank_in_stage` (0 <= rank_in_stage < tp * cp * dp) stays inside an NVLink domain.
[[nodiscard]] inline bool pipeline_p2p_same_node(const parallel_config& par, const hardware& hw,
                                                 int stage, std::int64_t rank_in_stage = 0) {
  const std::int64_t stride = std::int64_t{par.tp} * par.cp * par.dp;
  const std::int64_t from = stage * stride + rank_in_stage;
  const std::int64_t domain = hw.nvlink_domain_size();
  return from / domain == (from + stride) / domain;
}

/// Bytes one rank sends to the next pipeline stage per micro-batch: the hidden state
/// b * s/cp * h activation elements (2 bytes; the rank's tokens under context parallelism),
/// divided by tp under sequence parallelism (each rank holds a sequence shard). Without sp
/// Megatron sends the full tensor from every TP rank.
[[nodiscard]] constexpr std::int64_t pipeline_p2p_bytes(const transformer& m,
                                                        const parallel_config& par) noexcept {
  const std::int64_t full =
      par.micro_batch * par.local_seq(m) * m.hidden * static_cast<std::int64_t>(activation_bytes(par.dtype));
  return par.sequence_parallel() ? full / par.tp : full;
}

/// One tensor-parallel collective of a transformer layer, per micro-batch.
struct tp_collective {
  std::string_view name;  ///< what it belongs to, e.g. "attn_out_proj_all_reduce"
  collective kind;
  std::int64_t bytes;  ///< nccl-tests convention: b * s/cp * h * 2 in every case
  bool backward;       ///< false: forward pass; true: backward pass
};

/// The TP collectives of one layer in execution order (Megatron, Shoeybi et al. 2019;
/// Korthikanti et al. 2022). Without sp: forward all-reduce after the attention output
/// projection and after the last MLP GEMM; backward all-reduce of the input gradients of the
/// QKV and first MLP GEMMs. With sp: every all-reduce becomes reduce-scatter + all-gather at
/// the sequence/tensor boundaries; backward also all-gathers the output gradient of each
/// row-parallel GEMM and re-gathers the sequence-sharded input of each column-parallel GEMM
/// for its weight gradient (Megatron keeps only the shard). Empty when tp == 1. Full
/// recomputation repeats the forward collectives in backward; callers add them.
/// Into `out` (overwritten).
inline void tensor_parallel_layer_collectives(const transformer& m, const parallel_config& par,
                                              std::vector<tp_collective>& out) {
  out.clear();
  if (par.tp <= 1) return;
  const std::int64_t B =
      par.micro_batch * par.local_seq(m) * m.hidden * static_cast<std::int64_t>(activation_bytes(par.dtype));
  if (!par.sp) {
    out.push_back({"attn_out_proj_all_reduce", collective::all_reduce, B, false});
    out.push_back({"mlp_out_all_reduce", collective::all_reduce, B, false});
    out.push_back({"mlp_in_dgrad_all_reduce", collective::all_reduce, B, true});
    out.push_back({"qkv_dgrad_all_reduce", collective::all_reduce, B, true});
    return;
  }
  out.push_back({"qkv_input_all_gather", collective::all_gather, B, false});
  out.push_back({"attn_out_proj_reduce_scatter", collective::reduce_scatter, B, false});
  out.push_back({"mlp_input_all_gather", collective::all_gather, B, false});
  out.push_back({"mlp_out_reduce_scatter", collective::reduce_scatter, B, false});
  out.push_back({"mlp_out_grad_all_gather", collective::all_gather, B, true});
  out.push_back({"mlp_input_regather", collective::all_gather, B, true});
  out.push_back({"mlp_in_dgrad_reduce_scatter", collective::reduce_scatter, B, true});
  out.push_back({"attn_out_proj_grad_all_gather", collective::all_gather, B, true});
  out.push_back({"qkv_input_regather", collective::all_gather, B, true});
  out.push_back({"qkv_dgrad_reduce_scatter", collective::reduce_scatter, B, true});
}
[[nodiscard]] inline std::vector<tp_collective> tensor_parallel_layer_collectives(const transformer& m,
                                                                                 const parallel_config& par) {
  std::vector<tp_collective> out;
  tensor_parallel_layer_collectives(m, par, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Context parallelism: the key/value exchange of a layer's attention
// ---------------------------------------------------------------------------------------------

/// Bytes of the keys and values of one rank's chunk of a micro-batch: 2 (K, V) x b x s/cp x
/// kv_heads/tp x head_dim x 2 bytes (attention runs in 16 bits, fp8 training included). The
/// ring passes this much per step in forward and twice as much (K, V and their gradients) in
/// backward.
[[nodiscard]] constexpr std::int64_t context_parallel_kv_bytes(const transformer& m,
                                                               const parallel_config& par) noexcept {
  return 2 * par.micro_batch * par.local_seq(m) * (m.kv_width() / par.tp) * 2;
}

/// One layer's key/value exchange over its CP group (`cp_comm`), per micro-batch.
struct cp_exchange {
  std::string_view name;  ///< "cp_ring_kv" (p2p) or "cp_kv_all_gather" / "cp_dkv_reduce_scatter"
  collective kind;        ///< all_gather (forward) or reduce_scatter (backward), the data movement it amounts to
  std::int64_t bytes;     ///< nccl-tests convention: the whole gathered K and V (cp x the chunk)
  time_ns duration;       ///< the exchange alone, before any overlap with the attention
  bool overlapped;        ///< p2p: runs beside the attention kernel, which cannot end before it
};

/// The exchange of one layer's attention with `cp` > 1 (nothing to exchange with cp == 1, a
/// zero exchange then), forward or backward. p2p (ring attention, Megatron-Core / Transformer
/// Engine): cp - 1 steps, each a send of the chunk in hand to the next CP rank and a receive
/// from the previous one, priced as `comm.p2p_time` over an NVLink when the CP group stays in
/// an NVLink domain and over the network otherwise; backward passes K, V and dK, dV (twice the
/// bytes per step). allgather (Llama 3): one all-gather of K and V over the CP group before the
/// attention, one reduce-scatter of dK, dV after its backward, priced by `comm.collective_time`;
/// not overlapped. O(log cp).
template <CommModel Comm>
[[nodiscard]] cp_exchange context_parallel_exchange(const transformer& m, const parallel_config& par,
                                                    const hardware& hw, const Comm& comm, bool backward) {
  const std::int64_t chunk = context_parallel_kv_bytes(m, par);
  const group_placement group = context_parallel_group(par, hw);
  cp_exchange x{};
  x.kind = backward ? collective::reduce_scatter : collective::all_gather;
  x.bytes = chunk * par.cp;
  if (par.cp <= 1) return x;
  if (par.cp_comm == cp_comm_kind::p2p) {
    x.name = "cp_ring_kv";
    x.overlapped = true;
    const time_ns step = comm.p2p_time({backward ? 2 * chunk : chunk, group.nodes() == 1}, hw);
    x.duration = step * (par.cp - 1);
    if (backward) x.bytes *= 2;
    return x;
  }
  x.name = backward ? "cp_dkv_reduce_scatter" : "cp_kv_all_gather";
  x.duration = comm.collective_time({x.kind, x.bytes, group}, hw);
  return x;
}

}  // namespace lumos::model

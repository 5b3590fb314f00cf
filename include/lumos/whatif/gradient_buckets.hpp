#pragma once
// Data parallelism from traces of one replica (`lumos whatif --dp N` on DP 1 traces). Such traces
// reduce no gradients, so there is nothing to resize: Megatron's reduction is inserted as
// `lumos synth` and `lumos predict` build it (synth/program.hpp, "DP": the distributed optimizer,
// ZeRO-1, with `overlap_grad_reduce`). Each model chunk's gradients form buckets of
// max(40e6, 1e6 x N) parameters in the order the backward computes them (the head, the layers
// last first, the embedding; `model::gradient_buckets`). A bucket's reduce-scatter of fp32
// gradients starts once the chunk's final backward pass has computed the segment that closes it:
// the host launches it as it launches that segment's last kernel (just before, so that the launch
// is inside the layer), and it runs on a data-parallel stream of the rank's own, after that kernel
// (a cross-stream wait). Traces without stages that a pipeline split will cut into stages get
// the buckets of each target chunk's layers (`bucket_target`); the split then puts each on the
// stage of the layer that closes it. The first GPU
// op after the rank's final backward pass (the optimizer's), and any collective launched between
// the two (the tied embedding's all-reduce), waits for the last bucket; after the
// optimizer's last kernel each bucket's updated bf16 parameters are all-gathered on that stream,
// and the host's wait for the device at the end of the step (when the trace has one) waits for
// them too. Transfers are the NCCL model's for N ranks placed at their Megatron ranks
// (`model::placement_of`), host time the profile's per collective. A DP group is folded onto its
// traced rank (replicas are symmetric): each instance has that one participant. The optimizer's
// own kernels, which then step 1/N of the parameters, are `shard_optimizer`'s.

#include <lumos/core/error.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/whatif/weight_gradients.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// What `insert_gradient_buckets` did.
struct bucket_insertion {
  std::size_t buckets = 0;        ///< buckets (a reduce-scatter and an all-gather each), over every traced rank
  std::size_t ranks = 0;          ///< traced ranks that got them
  std::int64_t bucket_params = 0; ///< Megatron's bucket size for the target DP
  std::int64_t params_first = 0;  ///< parameters reduced by the first rank that got buckets
  time_ns scatter_first = 0;      ///< their reduce-scatters' summed transfer time
  time_ns gather_first = 0;       ///< their all-gathers'
  std::size_t buckets_first = 0;  ///< their count
  std::vector<std::string> skipped;  ///< chunks without a final backward pass, and why
  bool all_reduce = false;           ///< DDP's reduction (`bucket_target::all_reduce`)
  /// Each reduce-scatter as the tasks a layer change must copy with the layer that closes its
  /// bucket: the GPU op it follows, its launch call (or no_task), its arrive and complete.
  std::vector<std::array<graph::task_id, 4>> in_layers;
};

/// Adds each reduce-scatter of an insertion to the layer task group that holds the op it follows (the
/// layer that closes its bucket), so that a layer change repeats or removes it with the layer and
/// a pipeline split puts it on that layer's stage. `st` is the structure discovered after the
/// insertion; `in_layers` as `bucket_insertion::in_layers`.
inline void attach_to_layers(job_structure& st, const std::vector<std::array<graph::task_id, 4>>& in_layers) {
  std::unordered_map<graph::task_id, std::size_t> group_of;
  for (std::size_t i = 0; i < st.layer_groups.size(); ++i) {
    for (const graph::task_id t : st.layer_groups[i].tasks) group_of.emplace(t, i);
  }
  for (const auto& [hook, call, arrive, complete] : in_layers) {
    const auto it = group_of.find(hook);
    if (it == group_of.end()) continue;
    auto& tasks = st.layer_groups[it->second].tasks;
    if (call != graph::no_task) tasks.push_back(call);
    tasks.push_back(arrive);
    tasks.push_back(complete);
  }
}

/// The layout the buckets are formed for when it is not the traces' own.
struct bucket_target {
  /// Stages and chunks of the target when a pipeline change is asked (0: the traces'). From
  /// traces without stages the buckets are then those of each target chunk, over its layers,
  /// each placed in the traced layer that closes it, which the split puts on that chunk's stage.
  /// The all-gathers after the step are those of the target's stage.
  int pp = 0, vp = 1;
  int layers = 0;  ///< the target's layer count (0: the traces'), for the all-gathers
  /// One layer's parameters per rank where the shape does not give them (0: the shape's): a MoE
  /// layer's apart from its routed experts (attention, router, norms), whose FFN the traces lack.
  std::int64_t layer_params = 0;
  /// A zero-bubble target split in the graph: per task of the graph, 1 for a weight gradient
  /// (`weight_gradient_tasks`). Each bucket then waits for its segment's last weight gradient,
  /// which the split puts in the W pass, instead of the segment's last kernel (in B).
  const std::vector<std::uint8_t>* weight_gradients = nullptr;
  /// DDP's reduction (no distributed optimizer): each bucket all-reduced, nothing gathered.
  bool all_reduce = false;
};

namespace detail {

/// A bucket to insert: the GPU op that completes its gradients, its parameters, its
/// reduce-scatter's transfer and, with a split, its stage of the target.
struct gradient_bucket {
  graph::task_id after = graph::no_task;
  std::int64_t params = 0;
  time_ns scatter = 0;
  int stage = 0;
};

/// What is inserted for one traced rank.
struct rank_buckets {
  std::vector<gradient_bucket> buckets;
  graph::task_id gate = graph::no_task;       ///< first GPU op after the final backward
  graph::task_id step = graph::no_task;       ///< the optimizer's last GPU op
  graph::task_id host_wait = graph::no_task;  ///< the host's wait for the device that ends the step
  std::uint32_t host_wait_edge = 0;           ///< its sync edge from the step's stream (its tail, its flags)
  std::vector<graph::task_id> after_sync;     ///< collectives that follow the gradient sync
  std::vector<time_ns> gathers;               ///< the all-gathers' transfers, in order
  std::vector<std::int64_t> gathered;         ///< and their parameters
  std::vector<int> members;                   ///< the DP group, at its Megatron ranks
  graph::processor_id stream = 0;             ///< the data-parallel stream inserted for it
};

/// A chunk whose buckets are formed: the backward pass that computes its gradients, whether it
/// is the first or last virtual stage, its layers [from, to) in the pass's numbering, and its
/// stage of the target.
struct bucket_chunk {
  int pass = -1;
  bool first = false, last = false;
  std::int64_t from = 0, to = 0;
  int stage = 0;
};

/// The parameters per rank of a model's chunks, in the segments buckets are formed over.
struct chunk_parameters {
  model::transformer m;
  std::int64_t tp = 1;
  std::int64_t layer = 0;      ///< one layer's
  std::int64_t embedding = 0;  ///< the embedding's (word and learned positions)
  bool experts = false;        ///< a MoE layer's routed experts only: the head holds none of them

  /// The head's: the final norm and, untied or with `stages` > 1 (the last stage then holds its
  /// own copy of a tied embedding), the logits.
  [[nodiscard]] std::int64_t head(int stages) const {
    if (experts) return 0;
    return model::norm_parameter_count(m) + ((!m.tied_embeddings || stages > 1) ? m.vocab * m.hidden / tp : 0);
  }

  /// The segments of one chunk of `layers` layers in backward order: the head's (on the last
  /// virtual stage), the layers' (last first), the embedding's (on the first).
  [[nodiscard]] std::vector<std::int64_t> segments(bool first, bool last, std::int64_t layers, int stages) const {
    std::vector<std::int64_t> params;
    if (last) params.push_back(head(stages));
    params.insert(params.end(), static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)), layer);
    if (first) params.push_back(embedding);
    return params;
  }
};

/// The `dp` ranks of the data-parallel group of traced rank `rank` (of a job with `tp_traced`
/// TP ranks) on stage `s` of a target with TP `tp`, where Megatron numbers them (TP innermost,
/// then DP, then PP): the stage's, in the rank's TP column.
[[nodiscard]] inline std::vector<int> dp_group_members(int rank, int s, int tp, int tp_traced, int dp) {
  const std::int64_t first_member = static_cast<std::int64_t>(s) * tp * dp + (rank % tp_traced) % std::max(1, tp);
  std::vector<int> members;
  for (int i = 0; i < dp; ++i) members.push_back(static_cast<int>(first_member + static_cast<std::int64_t>(i) * tp));
  return members;
}

/// The launch edge into each task of a graph, if any.
struct launch_edges {
  std::vector<std::uint32_t> of;
  explicit launch_edges(const graph::task_graph& g) : of(g.task_count(), ~std::uint32_t{0}) {
    for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
      if (g.edges[i].kind == graph::edge_kind::launch) of[g.edges[i].to] = i;
    }
  }
  /// Whether a launch call launched `t`.
  [[nodiscard]] bool launched(graph::task_id t) const noexcept { return of[t] != ~std::uint32_t{0}; }
};

/// Plans the buckets of each traced rank (see `insert_gradient_buckets`): the traced and target
/// layouts resolved once, and one member function per part of a rank's plan.
struct bucket_planner {
  const graph::built_job& b;
  const job_structure& st;
  const shape_config& shape;
  int dp;
  const model::nccl_model& nccl;
  const model::hardware& hw;
  const bucket_target& target;
  bucket_insertion& out;  ///< its bucket size; chunks without buckets go to its `skipped`
  int pp = 1, chunks = 1, tp_traced = 1;
  chunk_parameters params;
  std::int64_t per_chunk = 0;  ///< layers per traced chunk
  bool split = false;          ///< traces without stages split into target.pp stages of target.vp chunks: buckets per target chunk
  int pp_to = 1, virtual_to = 1;
  // The all-gathers after the step follow the target's layout and layers (the reduce-scatters
  // sit in the traced layers, which a layer change repeats or removes with them).
  int gather_pp = 1, gather_chunks = 1;
  std::int64_t gather_layers = 0;
  std::vector<std::vector<std::size_t>> ops_of;  ///< each rank's GPU ops in launch order (indices into st.gpu_ops)

  bucket_planner(const graph::built_job& b_, const job_structure& st_, const shape_config& shape_, std::int64_t vocab, bool gated,
                 int dp_, const model::nccl_model& nccl_, const model::hardware& hw_, const bucket_target& target_, bucket_insertion& out_)
      : b(b_), st(st_), shape(shape_), dp(dp_), nccl(nccl_), hw(hw_), target(target_), out(out_) {
    pp = std::max(1, st.parallel.pp.value.value_or(1));
    chunks = std::max(1, st.parallel.chunks.value.value_or(1));
    tp_traced = std::max(1, st.parallel.tp.value.value_or(1));
    const model::transformer m = counted_transformer(shape, st, vocab, gated);
    per_chunk = m.layers / (static_cast<std::int64_t>(pp) * chunks);
    split = pp == 1 && chunks == 1 && target.pp > 1;
    pp_to = split ? target.pp : pp;
    virtual_to = split ? target.pp * std::max(1, target.vp) : pp * chunks;
    params = {m, shape.tp, target.layer_params > 0 ? target.layer_params : model::layer_parameters_per_rank(m, shape.tp),
              m.vocab * m.hidden / shape.tp + (m.position == model::position_kind::learned ? m.seq * m.hidden : 0), false};
    gather_pp = target.pp > 0 ? target.pp : pp;
    gather_chunks = target.pp > 0 ? std::max(1, target.vp) : chunks;
    gather_layers = (target.layers > 0 ? target.layers : m.layers) / (static_cast<std::int64_t>(gather_pp) * gather_chunks);
    ops_of.resize(b.ranks.size());
    for (std::size_t i = 0; i < st.gpu_ops.size(); ++i) {
      if (st.gpu_ops[i].rank < ops_of.size() && !st.gpu_ops[i].comm) ops_of[st.gpu_ops[i].rank].push_back(i);
    }
  }

  /// The task of GPU op `gi` (an index into st.gpu_ops) of rank `ri`, or no_task.
  [[nodiscard]] graph::task_id task_of(std::size_t ri, std::size_t gi) const {
    const std::uint32_t ev = st.gpu_ops[gi].op;
    const auto& map = b.ranks[ri].task_of_event;
    return ev < map.size() ? map[ev] : graph::no_task;
  }

  /// The plan of traced rank `ri`; nullopt when it has no bucket.
  [[nodiscard]] std::optional<rank_buckets> plan_rank(std::size_t ri) {
    rank_buckets plan;
    int last_grad_pass = -1;
    for (const bucket_chunk& tc : chunks_of(ri)) add_chunk_buckets(ri, tc, plan, last_grad_pass);
    if (plan.buckets.empty()) return std::nullopt;
    find_optimizer(ri, last_grad_pass, plan);
    find_host_wait(plan);
    time_transfers(ri, plan);
    return plan;
  }

  /// The chunks whose buckets rank `ri` forms: the traced ones (each from its final backward
  /// pass), or with a split every target chunk (its share of the lone backward pass's layers).
  [[nodiscard]] std::vector<bucket_chunk> chunks_of(std::size_t ri) {
    const rank_structure& rs = st.ranks[ri];
    const bool split_backward =
        std::any_of(rs.passes.begin(), rs.passes.end(), [](const pass_info& p) { return p.op.kind == pipeline::op_kind::weight; });
    const pipeline::op_kind grad_kind = split_backward ? pipeline::op_kind::weight : pipeline::op_kind::backward;
    const int stage = rs.stage.value.value_or(0);
    std::vector<bucket_chunk> targets;
    for (int c = 0; c < (split ? 1 : chunks); ++c) {
      int pass = -1;
      for (std::size_t p = 0; p < rs.passes.size(); ++p) {
        if (rs.passes[p].op.kind == grad_kind && rs.passes[p].op.chunk == c) pass = static_cast<int>(p);
      }
      if (pass < 0) {
        out.skipped.push_back("rank " + std::to_string(b.ranks[ri].rank) + " chunk " + std::to_string(c) + ": no backward pass found");
        continue;
      }
      if (!split) {
        const int vs = c * pp + stage;
        targets.push_back({pass, vs == 0, vs == virtual_to - 1, 0, per_chunk, stage});
        continue;
      }
      for (int vs = 0; vs < virtual_to; ++vs) {
        targets.push_back({pass, vs == 0, vs == virtual_to - 1, per_chunk * vs / virtual_to, per_chunk * (vs + 1) / virtual_to, vs % pp_to});
      }
    }
    return targets;
  }

  /// Adds the buckets of chunk `tc` of rank `ri` to `plan`, each after the op that ends the
  /// segment closing it; `last_grad_pass` becomes the latest pass that formed any.
  void add_chunk_buckets(std::size_t ri, const bucket_chunk& tc, rank_buckets& plan, int& last_grad_pass) {
    std::vector<std::size_t> ops;
    for (const std::size_t gi : ops_of[ri]) {
      if (st.gpu_ops[gi].pass == tc.pass) ops.push_back(gi);
    }
    if (ops.empty()) {
      out.skipped.push_back("rank " + std::to_string(b.ranks[ri].rank) + ": no GPU ops in its final backward pass");
      return;
    }
    last_grad_pass = std::max(last_grad_pass, tc.pass);
    const std::vector<std::size_t> end_of = segment_ends(ri, ops, tc);
    const std::vector<std::int64_t> segments = params.segments(tc.first, tc.last, tc.to - tc.from, pp_to);
    for (const auto& [segment, count] : model::gradient_buckets(segments, out.bucket_params)) {
      const graph::task_id t = task_of(ri, ops[end_of[static_cast<std::size_t>(segment)]]);
      if (t != graph::no_task) plan.buckets.push_back({t, count, 0, tc.stage});
    }
  }

  /// The op (an index into `ops`, chunk `tc`'s ops of rank `ri`) that ends each of its segments,
  /// in backward order: the head (before the first layer op), the layers last first, the
  /// embedding (after the last layer op). An empty segment ends where the one before it did.
  [[nodiscard]] std::vector<std::size_t> segment_ends(std::size_t ri, const std::vector<std::size_t>& ops, const bucket_chunk& tc) const {
    std::size_t first_layer = ops.size(), last_layer = ops.size();
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (st.gpu_ops[ops[k]].layer >= 0) {
        if (first_layer == ops.size()) first_layer = k;
        last_layer = k;
      }
    }
    std::vector<std::size_t> end_of;
    std::size_t reached = 0;
    auto ends = [&](std::size_t k) { return reached = std::max(reached, k); };
    // With weight gradients marked (a zero-bubble target), a segment ends at its last one.
    auto weight = [&](std::size_t k) {
      const graph::task_id t = task_of(ri, ops[k]);
      return target.weight_gradients == nullptr || (t < target.weight_gradients->size() && (*target.weight_gradients)[t] != 0);
    };
    // The last op of [from, to) that ends a segment: its last weight gradient, else its last op.
    auto last_in = [&](std::size_t from, std::size_t to) {
      std::size_t any = ops.size(), grad = ops.size();
      for (std::size_t k = from; k < to; ++k) {
        any = k;
        if (weight(k)) grad = k;
      }
      return grad != ops.size() ? grad : any;
    };
    if (tc.last) {
      const std::size_t head_end = first_layer == ops.size() || first_layer == 0 ? 1 : first_layer;
      end_of.push_back(ends(last_in(0, head_end)));
    }
    for (std::int64_t l = tc.to - 1; l >= tc.from; --l) {
      std::size_t e = ops.size(), grad = ops.size();
      for (std::size_t k = 0; k < ops.size(); ++k) {
        if (st.gpu_ops[ops[k]].layer != l) continue;
        e = k;
        if (weight(k)) grad = k;
      }
      if (grad != ops.size()) e = grad;
      end_of.push_back(ends(e == ops.size() ? reached : e));
    }
    if (tc.first) {
      end_of.push_back(ends(last_in(last_layer == ops.size() ? 0 : last_layer, ops.size())));
    } else if (!end_of.empty() && !split) {
      end_of.back() = ends(last_layer == ops.size() ? ops.size() - 1 : last_in(0, last_layer + 1));
    }
    return end_of;
  }

  /// The optimizer of rank `ri`: the GPU ops launched after its final backward pass, the first
  /// of which waits for the gradients and the last of which the parameters' all-gathers
  /// follow; and the collectives launched between the two (the tied embedding's all-reduce),
  /// which Megatron's finalize_model_grads runs after the gradient sync.
  void find_optimizer(std::size_t ri, int last_grad_pass, rank_buckets& plan) const {
    bool after = false;
    for (const std::size_t gi : ops_of[ri]) {
      if (st.gpu_ops[gi].pass == last_grad_pass) {
        after = true;
      } else if (after && (st.gpu_ops[gi].pass < 0 || st.gpu_ops[gi].pass > last_grad_pass)) {
        if (const graph::task_id t = task_of(ri, gi); t != graph::no_task) {
          if (plan.gate == graph::no_task) plan.gate = t;
          plan.step = t;
        }
      }
    }
    after = false;
    for (std::size_t gi = 0; gi < st.gpu_ops.size(); ++gi) {
      const gpu_op_context& c = st.gpu_ops[gi];
      if (c.rank != ri) continue;
      if (c.pass == last_grad_pass) {
        after = true;
        continue;
      }
      const graph::task_id t = task_of(ri, gi);
      if (!after || t == graph::no_task || c.pass > last_grad_pass) continue;
      if (t == plan.gate) break;
      if (!c.comm || c.p2p) continue;
      const auto& arrive = b.ranks[ri].arrive_of_event;
      plan.after_sync.push_back(c.op < arrive.size() && arrive[c.op] != graph::no_task ? arrive[c.op] : t);
    }
  }

  /// The host's last wait for the step's stream (a device synchronize ends a Megatron step).
  void find_host_wait(rank_buckets& plan) const {
    if (plan.step == graph::no_task) return;
    const graph::task_graph& g = b.graph;
    const graph::processor_id p = g.processor[plan.step];
    for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
      const graph::edge& e = g.edges[i];
      if (e.kind == graph::edge_kind::sync && g.processor[e.from] == p && e.from >= plan.step &&
          (plan.host_wait == graph::no_task || g.observed_start[e.to] > g.observed_start[plan.host_wait])) {
        plan.host_wait = e.to;
        plan.host_wait_edge = i;
      }
    }
  }

  /// The group and transfers of rank `ri`'s plan: each reduce-scatter over the group of its
  /// stage (the bucket's, with a split), the buckets in the order they run, the all-gathers.
  void time_transfers(std::size_t ri, rank_buckets& plan) const {
    const int rank = b.ranks[ri].rank;
    const int stage = st.ranks[ri].stage.value.value_or(0);
    plan.members = dp_group_members(rank, stage, shape.tp, tp_traced, dp);
    const model::collective reduce = target.all_reduce ? model::collective::all_reduce : model::collective::reduce_scatter;
    for (gradient_bucket& k : plan.buckets) {
      const model::group_placement placement = model::placement_of(dp_group_members(rank, split ? k.stage : stage, shape.tp, tp_traced, dp), hw);
      k.scatter = nccl.collective_time({reduce, k.params * 4, placement}, hw);
    }
    // In the order they run: by when the op each follows ended in the trace.
    std::stable_sort(plan.buckets.begin(), plan.buckets.end(), [&](const gradient_bucket& x, const gradient_bucket& y) {
      return b.graph.observed_end[x.after] < b.graph.observed_end[y.after];
    });
    if (target.all_reduce) return;
    const model::group_placement home = model::placement_of(plan.members, hw);
    for (const std::int64_t gathered : gathered_params(stage)) {
      plan.gathers.push_back(nccl.collective_time({model::collective::all_gather, gathered * 2, home}, hw));
      plan.gathered.push_back(gathered);
    }
  }

  /// The parameters of each all-gather after the optimizer of a traced `stage`: the target
  /// stage's buckets. A pipeline change keeps the work after the passes whole on every stage of
  /// a traced one: each then gathers the buckets of the stage with the most parameters.
  [[nodiscard]] std::vector<std::int64_t> gathered_params(int stage) const {
    std::vector<std::int64_t> gathered = stage_gathers(gather_pp == pp ? stage : 0);
    if (gather_pp != pp) {
      auto total = [](const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); };
      for (int s2 = 1; s2 < gather_pp; ++s2) {
        std::vector<std::int64_t> other = stage_gathers(s2);
        if (total(other) > total(gathered)) gathered = std::move(other);
      }
    }
    return gathered;
  }

  /// The parameters of the buckets of target stage `s`, chunk by chunk.
  [[nodiscard]] std::vector<std::int64_t> stage_gathers(int s) const {
    std::vector<std::int64_t> out_params;
    for (int c = 0; c < gather_chunks; ++c) {
      const int vs = c * gather_pp + s;
      const auto seg = params.segments(vs == 0, vs == gather_pp * gather_chunks - 1, gather_layers, gather_pp);
      for (const auto& [segment, count] : model::gradient_buckets(seg, out.bucket_params)) out_params.push_back(count);
    }
    return out_params;
  }
};

/// Adds a stream to `b` on the device that runs task `on`, numbered after that rank's streams and
/// named "(WHAT, inserted)".
inline graph::processor_id add_inserted_stream(graph::built_job& b, graph::task_id on, std::string_view what) {
  const graph::processor_info at = b.graph.processors[b.graph.processor[on]];
  std::int64_t stream = 0;
  for (const auto& q : b.graph.processors) {
    if (q.kind == graph::processor_kind::gpu_stream && q.rank == at.rank) stream = std::max(stream, q.index);
  }
  return b.graph.add_processor({graph::processor_kind::gpu_stream, at.rank, at.owner, stream + 1,
                                "rank " + std::to_string(at.rank) + " stream " + std::to_string(stream + 1) + " (" +
                                    std::string(what) + ", inserted)"});
}

/// Adds a data-parallel stream per plan to `b`, on the device of the op its first bucket follows.
inline void add_dp_streams(graph::built_job& b, std::vector<rank_buckets>& plans) {
  for (rank_buckets& p : plans) p.stream = add_inserted_stream(b, p.buckets.front().after, "data-parallel");
}

/// The host launches of the collectives of `plans`, as insertions into `g`: each reduce-scatter
/// just before the launch of the op it follows (so that it sits inside that op's layer, whose
/// stage a pipeline split gives it), the all-gathers just before the optimizer's last launch,
/// inside its step as Megatron's distributed optimizer runs them (their kernels still follow its
/// last kernel), so that a written job reads them back in the optimizer phase (after it, a DP
/// change of the written job did not shard the optimizer).
[[nodiscard]] inline std::vector<insertion> bucket_launches(const graph::task_graph& g, const std::vector<rank_buckets>& plans,
                                                            const launch_edges& launches, time_ns launch_ns, time_ns host_ns) {
  std::vector<graph::task_id> before(g.task_count(), graph::no_task);  // the task before each on its processor
  {
    std::vector<graph::task_id> last(g.processors.size(), graph::no_task);
    for (graph::task_id t = 0; t < g.task_count(); ++t) {
      before[t] = last[g.processor[t]];
      last[g.processor[t]] = t;
    }
  }
  std::vector<insertion> ins;
  auto call_after = [&](graph::task_id op, bool inside) {
    graph::task_id call = g.edges[launches.of[op]].from;
    if (inside && before[call] != graph::no_task) call = before[call];
    ins.push_back({.after = call,
                   .spec = {.kind = graph::task_kind::cpu, .duration = launch_ns, .busy_gap = host_ns, .rank = g.rank[call],
                            .observed_start = g.observed_end[call], .observed_end = g.observed_end[call]},
                   .name = "cudaLaunchKernel"});
  };
  for (const rank_buckets& p : plans) {
    for (const gradient_bucket& k : p.buckets) {
      if (launches.launched(k.after)) call_after(k.after, true);
    }
    if (p.step != graph::no_task && launches.launched(p.step)) {
      for (std::size_t i = 0; i < p.gathers.size(); ++i) call_after(p.step, true);
    }
  }
  return ins;
}

/// Writes one rank's collectives onto its data-parallel stream of `e` (the graph `g` with the
/// launches of `bucket_launches` inserted, taken in order from `next_call`).
struct dp_stream_writer {
  const graph::task_graph& g;
  edited_graph& e;
  const launch_edges& launches;
  const rank_buckets& p;
  std::size_t& next_call;
  int rank = 0;
  std::int64_t sequence = 0;
  graph::task_id previous = graph::no_task;  ///< the complete of the collective written last
  std::string_view group = inserted_gradient_group;  ///< the name of the collectives' group, before the rank
  std::string_view match = "inserted by a DP change from 1 (the group folded onto its traced rank)";
  const char* reduce_kind = "reducescatter";  ///< each bucket's reduction (DDP's expert buckets: "allreduce")
  std::string_view reduce_kernel = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL";

  /// One collective after `op` (launched with it when `op` was); returns its arrive, whose
  /// complete is the next task.
  graph::task_id collective(graph::task_id op, const char* kind, const std::string& kernel, time_ns transfer, std::int64_t elements) {
    graph::task_graph& ng = e.graph;
    const time_ns at = g.observed_end[op];
    const graph::task_id arrive = ng.add_task({.kind = graph::task_kind::comm_arrive, .processor = p.stream, .name = kernel,
                                               .rank = rank, .observed_start = at, .observed_end = at});
    const graph::task_id complete = ng.add_task({.kind = graph::task_kind::comm_complete, .processor = p.stream, .duration = transfer,
                                                 .name = kernel, .rank = rank, .observed_start = at, .observed_end = at});
    if (launches.launched(op)) {
      const graph::edge& l = g.edges[launches.of[op]];
      ng.add_edge(e.inserted[next_call++], arrive, l.delay, graph::edge_kind::launch, l.flags());
    }
    add_folded_collective(ng, kind, std::string(group) + std::to_string(rank), p.members, elements, sequence++, arrive, complete, match);
    previous = complete;
    return arrive;
  }

  /// The rank's reduce-scatters, each after the op it follows (recorded in `out.in_layers`), the
  /// waits for the last of them, the all-gathers after the step and the host's wait for them.
  void write(bucket_insertion& out) {
    graph::task_graph& ng = e.graph;  // the tasks appended here are on the new streams only
    for (const gradient_bucket& k : p.buckets) {
      const graph::task_id call = launches.launched(k.after) ? e.inserted[next_call] : graph::no_task;
      const graph::task_id a = collective(k.after, reduce_kind, std::string(reduce_kernel), k.scatter, k.params);
      ng.add_edge(e.first(k.after), a, 0, graph::edge_kind::cross_stream);
      out.in_layers.push_back({e.first(k.after), call, a, a + 1});
    }
    if (p.gate != graph::no_task) ng.add_edge(previous, e.first(p.gate), 0, graph::edge_kind::cross_stream);
    for (const graph::task_id t : p.after_sync) ng.add_edge(previous, e.first(t), 0, graph::edge_kind::cross_stream);
    if (p.step == graph::no_task) return;
    for (std::size_t i = 0; i < p.gathers.size(); ++i) {
      const graph::task_id a = collective(p.step, "allgather", "ncclDevKernel_AllGather_RING_LL", p.gathers[i], p.gathered[i]);
      if (i == 0) ng.add_edge(e.first(p.step), a, 0, graph::edge_kind::cross_stream);
    }
    if (p.host_wait != graph::no_task) {
      // As the call waits for its other streams: it returns (its finish, not its start) its
      // own measured tail after the last all-gather.
      const graph::edge& w = g.edges[p.host_wait_edge];
      ng.add_edge(previous, e.first(p.host_wait), w.delay, graph::edge_kind::sync, w.flags());
    }
  }
};

}  // namespace detail

/// Inserts the gradient reduction of `dp` data-parallel replicas into `b`, whose traces reduce
/// none (see the header comment). `st` must be `discover_structure` of `b` as it is; `shape` is
/// the target's shape (its TP places the group), `vocab` the full vocabulary (0: unknown, the
/// embedding and logits then count no parameters), `gated` a Llama-style layer. Task ids of `b`
/// change (`adopt`); the caller discovers the structure again. Returns what was inserted.
[[nodiscard]] inline bucket_insertion insert_gradient_buckets(graph::built_job& b, const job_structure& st, const shape_config& shape,
                                                              std::int64_t vocab, bool gated, int dp, const model::nccl_model& nccl,
                                                              const model::hardware& hw, const model::cost_profile& profile,
                                                              const bucket_target& target = {}) {
  bucket_insertion out;
  out.bucket_params = model::megatron_bucket_params(dp);
  out.all_reduce = target.all_reduce;
  detail::bucket_planner planner(b, st, shape, vocab, gated, dp, nccl, hw, target, out);
  std::vector<detail::rank_buckets> plans;
  for (std::size_t ri = 0; ri < b.ranks.size() && ri < st.ranks.size(); ++ri) {
    if (auto plan = planner.plan_rank(ri)) plans.push_back(std::move(*plan));
  }
  if (plans.empty()) return out;
  const detail::launch_edges launches(b.graph);
  detail::add_dp_streams(b, plans);
  const auto launch_ns = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host_ns = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch_ns);
  edited_graph e = insert_after(b.graph, detail::bucket_launches(b.graph, plans, launches, launch_ns, host_ns));
  std::size_t next_call = 0;
  for (const detail::rank_buckets& p : plans) {
    detail::dp_stream_writer w{b.graph, e, launches, p, next_call, b.graph.rank[p.buckets.front().after]};
    if (target.all_reduce) w.reduce_kind = "allreduce", w.reduce_kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
    w.write(out);
    out.buckets += p.buckets.size();
    ++out.ranks;
  }
  const detail::rank_buckets& p0 = plans.front();
  out.buckets_first = p0.buckets.size();
  for (const detail::gradient_bucket& k : p0.buckets) out.params_first += k.params, out.scatter_first += k.scatter;
  for (const time_ns t : p0.gathers) out.gather_first += t;
  (void)adopt(b, std::move(e));  // task ids change: every map of `b` follows
  return out;
}

namespace detail {

/// The collectives of the groups `names` that `pick(kind, elements)` selects, matched or not
/// (`lone_collectives`), each as a group of `b`'s tasks to remove with `repeat_groups` (count 0):
/// its GPU tasks, their launch calls and its join (each alone or adjacent on its processor).
template <class Pick>
[[nodiscard]] std::vector<repeat_group> collectives_to_remove(const graph::built_job& b, const trace::job& job,
                                                              const std::set<std::string>& names, Pick&& pick) {
  const graph::task_graph& g = b.graph;
  std::vector<graph::task_id> launch_of(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launch_of[e.to] = e.from;
  }
  std::vector<repeat_group> groups;
  auto drop = [&](std::vector<graph::task_id> tasks) {
    const std::size_t gpu = tasks.size();
    for (std::size_t k = 0; k < gpu; ++k) {
      if (tasks[k] != graph::no_task && launch_of[tasks[k]] != graph::no_task) tasks.push_back(launch_of[tasks[k]]);
    }
    std::erase(tasks, graph::no_task);
    std::sort(tasks.begin(), tasks.end());
    tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
    if (!tasks.empty()) groups.push_back({std::move(tasks), 0});
  };
  for (const graph::collective_instance& ci : g.collectives) {
    if (!names.contains(ci.group) || !pick(ci.kind, ci.bytes)) continue;
    std::vector<graph::task_id> tasks = ci.arrive;
    tasks.insert(tasks.end(), ci.complete.begin(), ci.complete.end());
    tasks.push_back(ci.join);
    drop(std::move(tasks));
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (names.contains(c.group) && pick(c.kind, c.elements)) drop({c.arrive, c.task});
  }
  return groups;
}

}  // namespace detail

/// Removes the collectives of `groups` that `pick(kind, elements)` selects, each with its launch
/// call and join, matched across ranks or not (`detail::collectives_to_remove`). Returns how many:
/// 0, with `b` unchanged, when none of them reduces (a reduce-scatter or an all-reduce). `before`,
/// when given, sees the graph and the collectives' tasks before they go. Task ids of `b` change
/// (`adopt`); the caller discovers the structure again.
template <class Pick>
inline std::size_t strip_collectives(graph::built_job& b, const trace::job& job, const std::set<std::string>& groups, Pick pick,
                                     const std::function<void(graph::task_graph&, const std::vector<repeat_group>&)>& before = {}) {
  if (groups.empty()) return 0;
  bool reduces = false;
  const std::vector<repeat_group> removed = detail::collectives_to_remove(b, job, groups, [&](std::string_view kind, std::int64_t elements) {
    if (!pick(kind, elements)) return false;
    const auto k = collective_of_kind(kind);
    reduces = reduces || k == model::collective::reduce_scatter || k == model::collective::all_reduce;
    return true;
  });
  if (!reduces || removed.empty()) return 0;
  if (before) before(b.graph, removed);
  const std::size_t count = removed.size();
  (void)adopt(b, repeat_groups(b.graph, removed));
  return count;
}

/// Removes the traces' gradient reduction when it is the distributed optimizer's: the
/// reduce-scatters and all-gathers of the data-parallel groups (`strip_collectives`), so that
/// `insert_gradient_buckets` can form the buckets of another layout (a pipeline split: Megatron
/// forms each stage's buckets from its own parameters, where the traced buckets span the whole
/// model). Other collectives of those groups (an all-reduce of the gradient norm) stay. Returns
/// the collectives removed: 0, with `b` unchanged, when the groups reduce no gradient by
/// reduce-scatter (all-reduce buckets, or no DP). `all_reduces`: DDP's all-reduce buckets (or
/// HSDP's replica all-reduces) go too (those of more than 1024 elements or of an unknown size: a
/// gradient norm or a loss is a few scalars), and they count as a reduction. Task ids of `b`
/// change (`adopt`); the caller discovers the structure again.
inline std::size_t strip_gradient_collectives(graph::built_job& b, const trace::job& job, const job_structure& st,
                                              bool all_reduces = false) {
  return strip_collectives(b, job, groups_with_role(st, group_role::dp), [all_reduces](std::string_view kind, std::int64_t elements) {
    const auto k = collective_of_kind(kind);
    if (k && all_reduces && *k == model::collective::all_reduce) return elements <= 0 || elements > 1024;
    return k && (*k == model::collective::reduce_scatter || *k == model::collective::all_gather);
  });
}

/// The `changes` line of an insertion to `dp` replicas, timed by the NCCL model of `profile`;
/// `layers` when a layer change follows (the buckets are those of the traced layers). `why`
/// says what the insertion stands for; by default a DP change from one replica.
[[nodiscard]] inline std::string describe_buckets(const bucket_insertion& bi, int dp, const std::string& profile, bool layers,
                                                  std::string why = {}) {
  if (why.empty()) {
    why = "DP 1 -> " + std::to_string(dp) + ": the traces reduce no gradients (one replica), so Megatron's reduction is inserted";
  }
  if (bi.buckets == 0) {
    return why + ", but none was (" + (bi.skipped.empty() ? std::string("no backward pass found") : bi.skipped.front()) + ")";
  }
  char line[1024];
  if (bi.all_reduce) {
    std::snprintf(line, sizeof line,
                  " as lumos synth builds it without the distributed optimizer (DDP): %zu buckets of up to %lld parameters on %zu "
                  "rank(s), each all-reduced (fp32 gradients) on a data-parallel stream of its own once the chunk's final backward "
                  "pass has computed the layer that closes it, the optimizer waiting for the last (the first rank: %zu buckets, "
                  "%.1f M parameters, %.3f ms of all-reduces by the %s profile's NCCL model over %d ranks)",
                  bi.buckets, static_cast<long long>(bi.bucket_params), bi.ranks, bi.buckets_first, static_cast<double>(bi.params_first) / 1e6,
                  static_cast<double>(bi.scatter_first) / 1e6, profile.c_str(), dp);
    return why + line;
  }
  std::snprintf(line, sizeof line,
                " as lumos synth and predict build it (the distributed optimizer, ZeRO-1): %zu buckets of up to %lld parameters on %zu rank(s), "
                "each reduce-scattered (fp32 gradients) on a data-parallel stream of its own once the chunk's final backward "
                "pass has computed the layer that closes it (overlap_grad_reduce), the optimizer waiting for the last, then "
                "all-gathered (bf16 parameters) after the optimizer (the first rank: %zu buckets, %.1f M parameters, %.3f ms of "
                "reduce-scatters and %.3f ms of all-gathers by the %s profile's NCCL model over %d ranks placed at their "
                "Megatron ranks)%s",
                bi.buckets, static_cast<long long>(bi.bucket_params), bi.ranks, bi.buckets_first,
                static_cast<double>(bi.params_first) / 1e6, static_cast<double>(bi.scatter_first) / 1e6,
                static_cast<double>(bi.gather_first) / 1e6, profile.c_str(), dp,
                layers ? "; each reduce-scatter goes with the traced layer that closes its bucket, which the layer change repeats "
                         "or removes, the all-gathers are those of the target's layers"
                       : "");
  std::string s = why + line;
  if (!bi.skipped.empty()) s += "; not on " + std::to_string(bi.skipped.size()) + " chunk(s): " + bi.skipped.front();
  return s;
}

/// The insertion as a change record (its text: `describe_buckets`).
[[nodiscard]] inline change bucket_change(const bucket_insertion& bi, int dp, const std::string& profile, bool layers, std::string why = {}) {
  return note("gradient buckets", "gradient buckets", describe_buckets(bi, dp, profile, layers, std::move(why)))
      .with({count_figure("buckets", bi.buckets), time_figure("reduce-scatters of the first rank", 0, bi.scatter_first),
             time_figure("all-gathers of the first rank", 0, bi.gather_first)});
}

/// Whether the traced job is DDP: its data-parallel gradients all-reduced (no distributed
/// optimizer, no FSDP), as the structure's gradient method tells.
[[nodiscard]] inline bool traced_ddp(const job_structure& st) { return st.gradients.method.value.value_or("") == "all-reduce"; }

/// Whether the traces ran Megatron's distributed optimizer: reduce-scatters in the backward and
/// all-gathers in the optimizer step, and no DP collective in a forward pass (FSDP gathers
/// parameters there).
[[nodiscard]] inline bool runs_distributed_optimizer(const job_structure& st) {
  if (st.gradients.method.value.value_or("") != "reduce-scatter + all-gather") return false;
  for (const auto& pg : st.groups) {
    const bool dp = std::any_of(pg.roles.begin(), pg.roles.end(), [](const fact<group_role>& r) { return r.value == group_role::dp; });
    for (const auto& [what, count] : pg.collectives) {
      if (dp && count > 0 && what.ends_with("in forward")) return false;
    }
  }
  return true;
}

/// The layout inserted gradient buckets are formed for: with a pipeline change, the target's
/// chunks and stages; to a zero-bubble target each bucket waits for its weight gradients, in the
/// W passes (found in `weight_gradients`, which the result points to). `from`: the traces' shape.
[[nodiscard]] inline bucket_target bucket_layout(context& ctx, const graph::built_job& b, const shape_config& from,
                                                 std::vector<std::uint8_t>& weight_gradients) {
  const whatif_options& o = ctx.options;
  bucket_target bt;
  bt.layers = o.layers.value_or(0);
  if (!o.pipeline_asked()) return bt;
  const job_structure& st = ctx.structure(b);
  bt.pp = o.pp.value_or(st.parallel.pp.value.value_or(1));
  const bool chunked = o.vp.value_or(1) > 1 || (o.schedule && o.schedule->supports_chunks);
  bt.vp = chunked ? o.vp.value_or(2) : 1;
  if (o.schedule && o.schedule->splits_backward) {
    weight_gradients = weight_gradient_tasks(ctx.job, b, st, from);
    bt.weight_gradients = &weight_gradients;
  }
  return bt;
}

/// Inserts the reduction of `dp` replicas for `ctx`'s target (`insert_gradient_buckets` with the
/// target's shape and layout, the traced cluster's NCCL model), and discovers the structure again
/// with the buckets in their layers. `from`: the traces' shape; `vocab`: their full vocabulary;
/// `layer_params`: one layer's parameters per rank (0: the shape's; `bucket_target`); `all_reduce`:
/// DDP's buckets (`bucket_target::all_reduce`).
[[nodiscard]] inline bucket_insertion insert_target_buckets(context& ctx, graph::built_job& b, int dp, const shape_config& from,
                                                            std::int64_t vocab, std::int64_t layer_params = 0, bool all_reduce = false) {
  const job_structure& st = ctx.structure(b);
  const shape_config to = ctx.shape_to ? *ctx.shape_to : from;
  const shape_costs& costs = ctx.costs(b);
  const model::nccl_model model_of_costs{costs.profile};
  std::vector<std::uint8_t> weight_gradients;
  bucket_target bt = bucket_layout(ctx, b, from, weight_gradients);
  bt.layer_params = layer_params;
  bt.all_reduce = all_reduce;
  const bucket_insertion bi = insert_gradient_buckets(b, st, to, vocab, st.model.gated_mlp, dp,
                                                      ctx.nccl ? ctx.nccl->first : model_of_costs, ctx.nccl ? ctx.nccl->second : costs.hw,
                                                      costs.profile, bt);
  if (bi.buckets > 0) {
    ctx.buckets_inserted = !all_reduce;  // a distributed optimizer's (DDP's steps every parameter as traced)
    ctx.refresh(b);
    attach_to_layers(ctx.structure(b), bi.in_layers);
  }
  return bi;
}

/// The name of the profile whose NCCL model times inserted buckets.
[[nodiscard]] inline std::string bucket_profile_name(context& ctx, const graph::built_job& b) {
  return ctx.nccl ? ctx.nccl->first.profile.name : ctx.costs(b).profile.name;
}

/// Pass: a pipeline split of traces without stages that ran the distributed optimizer. Megatron
/// forms each stage's buckets from the stage's own parameters, where the traced ones span the
/// whole model, so they are replaced by the target chunks' (as for DP from one replica), of the
/// target's shape. With a DP change too they stay as traced (the DP pass resizes them). When no
/// bucket can be formed the traced ones are restored: better than none.
struct gradient_bucket_pass {
  /// Whether the target's stages form their own buckets where the traces' span the whole model:
  /// from PP 1, with the distributed optimizer over more than one replica and their DP kept, or
  /// with `any_dp` another DP too (the caller inserts them at the target's); with `ddp` DDP's
  /// all-reduce buckets too, their DP kept.
  [[nodiscard]] static bool stages_rebucketed(const context& ctx, bool any_dp = false, bool ddp = false) {
    const whatif_options& o = ctx.options;
    const auto& st = ctx.known_structure();
    if (!o.pp || *o.pp <= 1 || ctx.traced_pp() != 1 || !st) return false;
    const int traced_dp = st->parallel.dp.value.value_or(1);
    const bool dp_kept = !o.dp || *o.dp == ctx.traced_replicas();
    if (ddp && traced_ddp(*st)) return traced_dp > 1 && dp_kept;
    return traced_dp > 1 && (any_dp || dp_kept) && runs_distributed_optimizer(*st);
  }
  [[nodiscard]] bool wanted(const context& ctx) const {
    // On MoE layers the MoE pass forms the stages' buckets (moe.hpp, `rebucket`).
    return stages_rebucketed(ctx) && !ctx.known_structure()->moe.found();
  }
  /// Runs `rebucket()` (an edit of `b` that strips buckets and inserts others, returning its
  /// changes); when it throws `lumos::error`, `b` and `ctx`'s structures are set back as they were
  /// and a note says why the traced buckets were kept.
  template <class Rebucket>
  [[nodiscard]] static change_list kept_on_error(context& ctx, graph::built_job& b, Rebucket&& rebucket) {
    graph::built_job kept = b;
    std::optional<job_structure> kept_structure = ctx.known_structure(), kept_traced = ctx.refreshed_from();
    const bool kept_inserted = ctx.buckets_inserted;
    try {
      return rebucket();
    } catch (const error& e) {
      b = std::move(kept);
      ctx.restore_structure(std::move(kept_structure), std::move(kept_traced));
      ctx.buckets_inserted = kept_inserted;
      return {note("gradient buckets", "gradient buckets", std::string("gradient buckets kept as traced: ") + e.what())};
    }
  }
  /// Throws `lumos::error` when `bi` formed no bucket, or none on a chunk.
  static void require_formed(const bucket_insertion& bi) {
    if (bi.buckets == 0 || !bi.skipped.empty()) throw error(bi.skipped.empty() ? "no bucket formed" : "no bucket formed on " + bi.skipped.front());
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    // The replicas' gradient group at the target's CP (DP x CP ranks reduce the gradients).
    const int group = ctx.target_gradient_group();
    return kept_on_error(ctx, b, [&]() -> change_list {
      const job_structure& st = ctx.structure(b);
      const shape_config from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
      const std::int64_t vocab = traced_vocab_local(ctx.job, st, from) * from.tp;
      const std::size_t removed = strip_gradient_collectives(b, ctx.job, st);
      if (removed == 0) return {};
      ctx.refresh(b);  // the buckets are placed in the layers of the stripped graph
      const bucket_insertion bi = insert_target_buckets(ctx, b, group, from, vocab);
      require_formed(bi);
      return {bucket_change(bi, group, bucket_profile_name(ctx, b), ctx.options.layers.has_value(),
                            "PP 1 -> " + std::to_string(*ctx.options.pp) + ": the traces' " + std::to_string(removed) +
                                " data-parallel reduce-scatters and all-gathers (buckets over the whole model) removed, since Megatron "
                                "forms each stage's buckets from its own parameters, and each target stage's reduction inserted")};
    });
  }
};
static_assert(Rewrite<gradient_bucket_pass>);

}  // namespace lumos::whatif

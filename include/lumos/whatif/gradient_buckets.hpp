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
#include <numeric>
#include <string>
#include <unordered_map>
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
  /// Each reduce-scatter as the tasks a layer change must copy with the layer that closes its
  /// bucket: the GPU op it follows, its launch call (or no_task), its arrive and complete.
  std::vector<std::array<graph::task_id, 4>> in_layers;
};

/// Adds each reduce-scatter of `bi` to the layer task group that holds the op it follows (the
/// layer that closes its bucket), so that a layer change repeats or removes it with the layer and
/// a pipeline split puts it on that layer's stage. `st` is the structure discovered after the
/// insertion.
inline void attach_to_layers(job_structure& st, const bucket_insertion& bi) {
  std::unordered_map<graph::task_id, std::size_t> group_of;
  for (std::size_t i = 0; i < st.layer_groups.size(); ++i) {
    for (const graph::task_id t : st.layer_groups[i].tasks) group_of.emplace(t, i);
  }
  for (const auto& [hook, call, arrive, complete] : bi.in_layers) {
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
  /// A zero-bubble target split in the graph: per task of the graph, 1 for a weight gradient
  /// (`weight_gradient_tasks`). Each bucket then waits for its segment's last weight gradient,
  /// which the split puts in the W pass, instead of the segment's last kernel (in B).
  const std::vector<std::uint8_t>* weight_gradients = nullptr;
};

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
  const graph::task_graph& g = b.graph;
  const int pp = std::max(1, st.parallel.pp.value.value_or(1));
  const int chunks = std::max(1, st.parallel.chunks.value.value_or(1));
  const int tp_traced = std::max(1, st.parallel.tp.value.value_or(1));
  const model::transformer m = counted_transformer(shape, st, vocab, gated);
  const std::int64_t per_chunk = m.layers / (static_cast<std::int64_t>(pp) * chunks);
  // Traces without stages split into target.pp stages of target.vp chunks: buckets per target chunk.
  const bool split = pp == 1 && chunks == 1 && target.pp > 1;
  const int pp_to = split ? target.pp : pp;
  const int virtual_to = split ? target.pp * std::max(1, target.vp) : pp * chunks;
  const std::int64_t layer_params = model::layer_parameters_per_rank(m, shape.tp);
  const std::int64_t embed_params =
      m.vocab * m.hidden / shape.tp + (m.position == model::position_kind::learned ? m.seq * m.hidden : 0);
  auto head_params = [&](int stages) {
    return model::norm_parameter_count(m) + ((!m.tied_embeddings || stages > 1) ? m.vocab * m.hidden / shape.tp : 0);
  };
  // The parameter segments of one chunk of `layers` layers in backward order: the head's (on the
  // last virtual stage; with `stages` > 1 it holds its own copy of a tied embedding), the
  // layers' (last first), the embedding's (on the first).
  auto segments_of = [&](bool first, bool last, std::int64_t layers, int stages) {
    std::vector<std::int64_t> params;
    if (last) params.push_back(head_params(stages));
    params.insert(params.end(), static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)), layer_params);
    if (first) params.push_back(embed_params);
    return params;
  };
  // The all-gathers after the step follow the target's layout and layers (the reduce-scatters
  // sit in the traced layers, which a layer change repeats or removes with them).
  const int gather_pp = target.pp > 0 ? target.pp : pp;
  const int gather_chunks = target.pp > 0 ? std::max(1, target.vp) : chunks;
  const std::int64_t gather_layers = (target.layers > 0 ? target.layers : m.layers) / (static_cast<std::int64_t>(gather_pp) * gather_chunks);
  auto stage_gathers = [&](int s) {
    std::vector<std::int64_t> out_params;
    for (int c = 0; c < gather_chunks; ++c) {
      const int vs = c * gather_pp + s;
      const auto seg = segments_of(vs == 0, vs == gather_pp * gather_chunks - 1, gather_layers, gather_pp);
      for (const auto& [segment, count] : model::gradient_buckets(seg, out.bucket_params)) out_params.push_back(count);
    }
    return out_params;
  };
  const auto launch_ns = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host_ns = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch_ns);

  std::vector<std::uint32_t> launch_edge(g.task_count(), ~std::uint32_t{0});  // launch edge into a task
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    if (g.edges[i].kind == graph::edge_kind::launch) launch_edge[g.edges[i].to] = i;
  }
  auto launched = [&](graph::task_id t) { return launch_edge[t] != ~std::uint32_t{0}; };
  struct bucket {
    graph::task_id after = graph::no_task;  // the GPU op that completes its gradients
    std::int64_t params = 0;
    time_ns scatter = 0;
    int stage = 0;  // of the target, with a split
  };
  struct rank_plan {
    std::vector<bucket> buckets;
    graph::task_id gate = graph::no_task;       // first GPU op after the final backward
    graph::task_id step = graph::no_task;       // the optimizer's last GPU op
    graph::task_id host_wait = graph::no_task;  // the host's wait for the device that ends the step
    std::uint32_t host_wait_edge = 0;           // its sync edge from the step's stream (its tail, its flags)
    std::vector<graph::task_id> after_sync;     // collectives that follow the gradient sync
    std::vector<time_ns> gathers;               // the all-gathers' transfers, in order
    std::vector<std::int64_t> gathered;         // and their parameters
    std::vector<int> members;
    graph::processor_id stream = 0;
  };
  std::vector<rank_plan> plans;
  // Each rank's GPU ops in launch order (indices into st.gpu_ops).
  std::vector<std::vector<std::size_t>> ops_of(b.ranks.size());
  for (std::size_t i = 0; i < st.gpu_ops.size(); ++i) {
    if (st.gpu_ops[i].rank < ops_of.size() && !st.gpu_ops[i].comm) ops_of[st.gpu_ops[i].rank].push_back(i);
  }
  for (std::size_t ri = 0; ri < b.ranks.size() && ri < st.ranks.size(); ++ri) {
    const rank_structure& rs = st.ranks[ri];
    const int rank = b.ranks[ri].rank;
    auto task_of = [&](std::size_t gi) {
      const std::uint32_t ev = st.gpu_ops[gi].op;
      const auto& map = b.ranks[ri].task_of_event;
      return ev < map.size() ? map[ev] : graph::no_task;
    };
    const bool split_backward = std::any_of(rs.passes.begin(), rs.passes.end(), [](const pass_info& p) { return p.op.kind == pipeline::op_kind::weight; });
    const pipeline::op_kind grad_kind = split_backward ? pipeline::op_kind::weight : pipeline::op_kind::backward;
    rank_plan plan;
    int last_grad_pass = -1;
    const int stage = rs.stage.value.value_or(0);
    // The chunks whose buckets are formed: the traced ones (each from its final backward pass),
    // or with a split every target chunk (its share of the lone backward pass's layers).
    struct chunk_of {
      int pass = -1;
      bool first = false, last = false;
      std::int64_t from = 0, to = 0;  // its layers, in the pass's numbering
      int stage = 0;                  // of the target
    };
    std::vector<chunk_of> targets;
    for (int c = 0; c < (split ? 1 : chunks); ++c) {
      int pass = -1;
      for (std::size_t p = 0; p < rs.passes.size(); ++p) {
        if (rs.passes[p].op.kind == grad_kind && rs.passes[p].op.chunk == c) pass = static_cast<int>(p);
      }
      if (pass < 0) {
        out.skipped.push_back("rank " + std::to_string(rank) + " chunk " + std::to_string(c) + ": no backward pass found");
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
    for (const chunk_of& tc : targets) {
      const int pass = tc.pass;
      std::vector<std::size_t> ops;
      for (const std::size_t gi : ops_of[ri]) {
        if (st.gpu_ops[gi].pass == pass) ops.push_back(gi);
      }
      if (ops.empty()) {
        out.skipped.push_back("rank " + std::to_string(rank) + ": no GPU ops in its final backward pass");
        continue;
      }
      last_grad_pass = std::max(last_grad_pass, pass);
      // The segments in backward order and the op that ends each: the head (before the first
      // layer op), the layers last first, the embedding (after the last layer op). An empty
      // segment ends where the one before it did.
      const bool first = tc.first, last = tc.last;
      std::size_t first_layer = ops.size(), last_layer = ops.size();
      for (std::size_t k = 0; k < ops.size(); ++k) {
        if (st.gpu_ops[ops[k]].layer >= 0) {
          if (first_layer == ops.size()) first_layer = k;
          last_layer = k;
        }
      }
      const std::vector<std::int64_t> params = segments_of(first, last, tc.to - tc.from, pp_to);
      std::vector<std::size_t> end_of;  // index into ops of each segment's last op
      std::size_t reached = 0;
      auto ends = [&](std::size_t k) { return reached = std::max(reached, k); };
      // With weight gradients marked (a zero-bubble target), a segment ends at its last one.
      auto weight = [&](std::size_t k) {
        const graph::task_id t = task_of(ops[k]);
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
      if (last) {
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
      if (first) {
        end_of.push_back(ends(last_in(last_layer == ops.size() ? 0 : last_layer, ops.size())));
      } else if (!end_of.empty() && !split) {
        end_of.back() = ends(last_layer == ops.size() ? ops.size() - 1 : last_in(0, last_layer + 1));
      }
      for (const auto& [segment, count] : model::gradient_buckets(params, out.bucket_params)) {
        const graph::task_id t = task_of(ops[end_of[static_cast<std::size_t>(segment)]]);
        if (t != graph::no_task) plan.buckets.push_back({t, count, 0, tc.stage});
      }
    }
    if (plan.buckets.empty()) continue;
    // The optimizer: the GPU ops launched after the final backward pass, the first of which
    // waits for the gradients and the last of which the parameters' all-gathers follow.
    bool after = false;
    for (const std::size_t gi : ops_of[ri]) {
      if (st.gpu_ops[gi].pass == last_grad_pass) {
        after = true;
      } else if (after && (st.gpu_ops[gi].pass < 0 || st.gpu_ops[gi].pass > last_grad_pass)) {
        if (const graph::task_id t = task_of(gi); t != graph::no_task) {
          if (plan.gate == graph::no_task) plan.gate = t;
          plan.step = t;
        }
      }
    }
    // Collectives launched between the final backward and the optimizer (the tied embedding's
    // all-reduce): Megatron's finalize_model_grads finishes the gradient sync before them.
    after = false;
    for (std::size_t gi = 0; gi < st.gpu_ops.size(); ++gi) {
      const gpu_op_context& c = st.gpu_ops[gi];
      if (c.rank != ri) continue;
      if (c.pass == last_grad_pass) {
        after = true;
        continue;
      }
      const graph::task_id t = task_of(gi);
      if (!after || t == graph::no_task || c.pass > last_grad_pass) continue;
      if (t == plan.gate) break;
      if (!c.comm || c.p2p) continue;
      const auto& arrive = b.ranks[ri].arrive_of_event;
      plan.after_sync.push_back(c.op < arrive.size() && arrive[c.op] != graph::no_task ? arrive[c.op] : t);
    }
    // The host's last wait for the step's stream (a device synchronize ends a Megatron step).
    if (plan.step != graph::no_task) {
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
    // The group's members where Megatron numbers them (TP innermost, then DP, then PP): the
    // traced rank's stage (with a split, the bucket's) and TP column.
    auto members_of = [&](int s) {
      const std::int64_t first_member = static_cast<std::int64_t>(s) * shape.tp * dp + (rank % tp_traced) % std::max(1, shape.tp);
      std::vector<int> members;
      for (int i = 0; i < dp; ++i) members.push_back(static_cast<int>(first_member + static_cast<std::int64_t>(i) * shape.tp));
      return members;
    };
    plan.members = members_of(stage);
    for (bucket& k : plan.buckets) {
      const model::group_placement placement = model::placement_of(members_of(split ? k.stage : stage), hw);
      k.scatter = nccl.collective_time({model::collective::reduce_scatter, k.params * 4, placement}, hw);
    }
    // In the order they run: by when the op each follows ended in the trace.
    std::stable_sort(plan.buckets.begin(), plan.buckets.end(),
                     [&](const bucket& x, const bucket& y) { return g.observed_end[x.after] < g.observed_end[y.after]; });
    // The parameters' all-gathers after the optimizer, the target stage's buckets. A pipeline
    // change keeps the work after the passes whole on every stage of a traced one: each then
    // gathers the buckets of the stage with the most parameters.
    std::vector<std::int64_t> gathered = stage_gathers(gather_pp == pp ? stage : 0);
    if (gather_pp != pp) {
      auto total = [](const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); };
      for (int s2 = 1; s2 < gather_pp; ++s2) {
        std::vector<std::int64_t> other = stage_gathers(s2);
        if (total(other) > total(gathered)) gathered = std::move(other);
      }
    }
    const model::group_placement home = model::placement_of(plan.members, hw);
    for (const std::int64_t params : gathered) {
      plan.gathers.push_back(nccl.collective_time({model::collective::all_gather, params * 2, home}, hw));
      plan.gathered.push_back(params);
    }
    plans.push_back(std::move(plan));
  }
  if (plans.empty()) return out;

  // A data-parallel stream per rank, on the device of the op its first bucket follows.
  for (rank_plan& p : plans) {
    const graph::processor_info on = g.processors[g.processor[p.buckets.front().after]];
    std::int64_t stream = 0;
    for (const auto& q : g.processors) {
      if (q.kind == graph::processor_kind::gpu_stream && q.rank == on.rank) stream = std::max(stream, q.index);
    }
    p.stream = b.graph.add_processor({graph::processor_kind::gpu_stream, on.rank, on.owner, stream + 1,
                                      "rank " + std::to_string(on.rank) + " stream " + std::to_string(stream + 1) +
                                          " (data-parallel, inserted)"});
  }
  // The host launches: each reduce-scatter just before the launch of the op it follows (so that
  // it sits inside that op's layer, whose stage a pipeline split gives it), the all-gathers just
  // before the optimizer's last launch, inside its step as Megatron's distributed optimizer runs
  // them (their kernels still follow its last kernel), so that a written job reads them back in
  // the optimizer phase (after it, a DP change of the written job did not shard the optimizer).
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
    graph::task_id call = g.edges[launch_edge[op]].from;
    if (inside && before[call] != graph::no_task) call = before[call];
    ins.push_back({.after = call,
                   .spec = {.kind = graph::task_kind::cpu, .duration = launch_ns, .busy_gap = host_ns, .rank = g.rank[call],
                            .observed_start = g.observed_end[call], .observed_end = g.observed_end[call]},
                   .name = "cudaLaunchKernel"});
  };
  for (const rank_plan& p : plans) {
    for (const bucket& k : p.buckets) {
      if (launched(k.after)) call_after(k.after, true);
    }
    if (p.step != graph::no_task && launched(p.step)) {
      for (std::size_t i = 0; i < p.gathers.size(); ++i) call_after(p.step, true);
    }
  }
  edited_graph e = insert_after(b.graph, ins);
  graph::task_graph& ng = e.graph;  // the tasks appended here are on the new streams only
  std::size_t next_call = 0;
  for (const rank_plan& p : plans) {
    const int rank = g.rank[p.buckets.front().after];
    std::int64_t sequence = 0;
    graph::task_id previous = graph::no_task;
    // One collective on the rank's data-parallel stream, after `op` (launched with it when `op` was).
    auto collective = [&](graph::task_id op, const char* kind, const std::string& kernel, time_ns transfer, std::int64_t elements) {
      const time_ns at = g.observed_end[op];
      const graph::task_id arrive = ng.add_task({.kind = graph::task_kind::comm_arrive, .processor = p.stream, .name = kernel,
                                                 .rank = rank, .observed_start = at, .observed_end = at});
      const graph::task_id complete = ng.add_task({.kind = graph::task_kind::comm_complete, .processor = p.stream,
                                                   .duration = transfer, .name = kernel, .rank = rank,
                                                   .observed_start = at, .observed_end = at});
      if (launched(op)) {
        const graph::edge& l = g.edges[launch_edge[op]];
        ng.add_edge(e.inserted[next_call++], arrive, l.delay, graph::edge_kind::launch, l.flags());
      }
      graph::collective_instance ci;
      ci.kind = kind;
      ci.group = std::string(inserted_gradient_group) + std::to_string(rank);
      ci.group_ranks = p.members;
      // Its elements, as a traced instance counts them (In msg nelems), so that a what-if of the
      // written job resizes it as it resizes a traced bucket.
      ci.bytes = elements;
      ci.sequence = sequence++;
      ci.arrive = {arrive};
      ci.complete = {complete};
      ci.match = "inserted by a DP change from 1 (the group folded onto its traced rank)";
      ng.collectives.push_back(std::move(ci));
      previous = complete;
      return arrive;
    };
    for (const bucket& k : p.buckets) {
      const graph::task_id call = launched(k.after) ? e.inserted[next_call] : graph::no_task;
      const graph::task_id a = collective(k.after, "reducescatter", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", k.scatter, k.params);
      ng.add_edge(e.first(k.after), a, 0, graph::edge_kind::cross_stream);
      out.in_layers.push_back({e.first(k.after), call, a, a + 1});
    }
    if (p.gate != graph::no_task) ng.add_edge(previous, e.first(p.gate), 0, graph::edge_kind::cross_stream);
    for (const graph::task_id t : p.after_sync) ng.add_edge(previous, e.first(t), 0, graph::edge_kind::cross_stream);
    if (p.step != graph::no_task) {
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
    out.buckets += p.buckets.size();
    ++out.ranks;
  }
  const rank_plan& p0 = plans.front();
  out.buckets_first = p0.buckets.size();
  for (const bucket& k : p0.buckets) out.params_first += k.params, out.scatter_first += k.scatter;
  for (const time_ns t : p0.gathers) out.gather_first += t;
  (void)adopt(b, std::move(e));  // task ids change: every map of `b` follows
  return out;
}

/// Removes the traces' gradient reduction when it is the distributed optimizer's: the
/// reduce-scatters and all-gathers of the data-parallel groups, each with its launch call and
/// join, matched or not (`lone_collectives`), so that `insert_gradient_buckets` can form the
/// buckets of another layout (a pipeline split: Megatron forms each stage's buckets from its own
/// parameters, where the traced buckets span the whole model). Other collectives of those groups
/// (an all-reduce of the gradient norm) stay. Returns the collectives removed: 0, with `b`
/// unchanged, when the groups reduce no gradient by reduce-scatter (all-reduce buckets, or no DP).
/// Task ids of `b` change (`adopt`); the caller discovers the structure again.
inline std::size_t strip_gradient_collectives(graph::built_job& b, const trace::job& job, const job_structure& st) {
  const std::set<std::string> dp_groups = groups_with_role(st, group_role::dp);
  if (dp_groups.empty()) return 0;
  const graph::task_graph& g = b.graph;
  auto stripped = [](std::string_view kind) {
    const auto k = collective_of_kind(kind);
    return k && (*k == model::collective::reduce_scatter || *k == model::collective::all_gather);
  };
  std::vector<graph::task_id> launch_of(g.task_count(), graph::no_task);
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch) launch_of[e.to] = e.from;
  }
  std::vector<repeat_group> groups;
  bool scatter = false;
  // One group per collective: its GPU tasks, their launch calls and its join (each alone or
  // adjacent on its processor).
  auto drop = [&](std::string_view kind, std::vector<graph::task_id> tasks) {
    scatter = scatter || collective_of_kind(kind) == model::collective::reduce_scatter;
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
    if (!dp_groups.contains(ci.group) || !stripped(ci.kind)) continue;
    std::vector<graph::task_id> tasks = ci.arrive;
    tasks.insert(tasks.end(), ci.complete.begin(), ci.complete.end());
    tasks.push_back(ci.join);
    drop(ci.kind, std::move(tasks));
  }
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (dp_groups.contains(c.group) && stripped(c.kind)) drop(c.kind, {c.arrive, c.task});
  }
  if (!scatter || groups.empty()) return 0;
  const std::size_t removed = groups.size();
  (void)adopt(b, repeat_groups(g, groups));
  return removed;
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
  const bool interleaved = o.vp.value_or(1) > 1 || (o.schedule && *o.schedule == pipeline::schedule_kind::interleaved_one_f_one_b);
  bt.vp = interleaved ? o.vp.value_or(2) : 1;
  if (o.schedule && synth::splits_backward(*o.schedule)) {
    weight_gradients = weight_gradient_tasks(ctx.job, b, st, from);
    bt.weight_gradients = &weight_gradients;
  }
  return bt;
}

/// Inserts the reduction of `dp` replicas for `ctx`'s target (`insert_gradient_buckets` with the
/// target's shape and layout, the traced cluster's NCCL model), and discovers the structure again
/// with the buckets in their layers. `from`: the traces' shape; `vocab`: their full vocabulary.
[[nodiscard]] inline bucket_insertion insert_target_buckets(context& ctx, graph::built_job& b, int dp, const shape_config& from,
                                                            std::int64_t vocab) {
  const job_structure& st = ctx.structure(b);
  const shape_config to = ctx.shape_to ? *ctx.shape_to : from;
  const shape_costs& costs = ctx.costs(b);
  const model::nccl_model model_of_costs{costs.profile};
  std::vector<std::uint8_t> weight_gradients;
  const bucket_target bt = bucket_layout(ctx, b, from, weight_gradients);
  const bucket_insertion bi = insert_gradient_buckets(b, st, to, vocab, st.model.gated_mlp, dp,
                                                      ctx.nccl ? ctx.nccl->first : model_of_costs, ctx.nccl ? ctx.nccl->second : costs.hw,
                                                      costs.profile, bt);
  if (bi.buckets > 0) {
    ctx.buckets_inserted = true;
    ctx.refresh(b);
    attach_to_layers(ctx.structure(b), bi);
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
  [[nodiscard]] bool wanted(const context& ctx) const {
    const whatif_options& o = ctx.options;
    const auto& st = ctx.known_structure();
    if (!o.pp || *o.pp <= 1 || ctx.traced_pp() != 1 || !st) return false;
    const int traced_dp = st->parallel.dp.value.value_or(1);
    return traced_dp > 1 && (!o.dp || *o.dp == traced_dp) && runs_distributed_optimizer(*st);
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const int traced_dp = ctx.structure(b).parallel.dp.value.value_or(1);
    graph::built_job kept = b;
    std::optional<job_structure> kept_structure = ctx.known_structure(), kept_traced = ctx.refreshed_from();
    const bool kept_inserted = ctx.buckets_inserted;
    try {
      const job_structure& st = ctx.structure(b);
      const shape_config from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
      const std::int64_t vocab = traced_vocab_local(ctx.job, st, from) * from.tp;
      const std::size_t removed = strip_gradient_collectives(b, ctx.job, st);
      if (removed == 0) return {};
      ctx.refresh(b);  // the buckets are placed in the layers of the stripped graph
      const bucket_insertion bi = insert_target_buckets(ctx, b, traced_dp, from, vocab);
      if (bi.buckets == 0 || !bi.skipped.empty()) {
        throw error(bi.skipped.empty() ? "no bucket formed" : "no bucket formed on " + bi.skipped.front());
      }
      return {bucket_change(bi, traced_dp, bucket_profile_name(ctx, b), ctx.options.layers.has_value(),
                            "PP 1 -> " + std::to_string(*ctx.options.pp) + ": the traces' " + std::to_string(removed) +
                                " data-parallel reduce-scatters and all-gathers (buckets over the whole model) removed, since Megatron "
                                "forms each stage's buckets from its own parameters, and each target stage's reduction inserted")};
    } catch (const error& e) {
      b = std::move(kept);
      ctx.restore_structure(std::move(kept_structure), std::move(kept_traced));
      ctx.buckets_inserted = kept_inserted;
      return {note("gradient buckets", "gradient buckets", std::string("gradient buckets kept as traced: ") + e.what())};
    }
  }
};
static_assert(Rewrite<gradient_bucket_pass>);

}  // namespace lumos::whatif

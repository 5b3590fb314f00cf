#pragma once
// FSDP's collectives inserted into traces that do not shard parameters (`lumos whatif --fsdp on`
// from DDP or distributed-optimizer traces, once their gradient collectives are stripped), as
// `lumos synth --fsdp on` builds them (synth/detail/program_emission.hpp, `emit_pass`):
//  - the units are the embedding, each transformer layer and the head (the final norm and the
//    logits), each pass running them in its order (backward: the head first). A traced pass's
//    GPU ops before its first layer op are the embedding's (backward: the head's) when its chunk
//    holds it, those after its last layer op the head's (the embedding's); the layers' ops are
//    told apart by structure discovery's layer of each op;
//  - every forward pass (and with reshard after forward every backward pass) all-gathers each
//    unit's bf16 parameters over the shard group before the unit's first kernel, which waits for
//    it. FSDP keeps two units' parameters at most: the gather of the next unit is issued as a unit
//    starts and runs once the unit before that one has ended; the first unit of a pass is gathered
//    at the end of the pass before it (the step's first at its start);
//  - every gradient pass (backward; the weight-gradient pass of a split backward) reduce-scatters
//    each unit's fp32 gradients once its last kernel ends;
//  - they run in the order they are issued on one communication stream per rank (one
//    communicator, as NCCL runs them), each launched from the host just before the launch of the
//    op it is issued at (a gather: the first op of the unit before its unit, or the pass's last
//    op; a reduce-scatter: its unit's last op, so that a written trace has it inside its pass),
//    with the profile's collective host time, each transfer the NCCL model's for the shard group of N ranks
//    at their Megatron ranks (the DP group; `model::placement_of`); the optimizer's first kernel
//    waits for the last reduce-scatter.
// Each rank's collectives form their own folded group (`fsdp.inserted.RANK`): the shard group's
// members run the same, so its transfer time is the model's.

#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

/// The group name (and the rank after it) of the collectives an FSDP insertion makes.
inline constexpr std::string_view inserted_fsdp_group = "fsdp.inserted.";

/// What `insert_fsdp_collectives` did.
struct fsdp_insertion {
  std::size_t gathers = 0, scatters = 0;  ///< inserted over every traced rank
  std::size_t ranks = 0;                  ///< traced ranks that got them
  std::size_t units = 0;                  ///< units of the first rank's first pass
  std::size_t gathers_first = 0, scatters_first = 0;  ///< the first rank's
  time_ns gather_first = 0, scatter_first = 0;        ///< their summed transfer time
  std::vector<std::string> skipped;                   ///< passes or ranks without units, and why
};

namespace detail {

/// One unit of one pass: its first and last GPU ops (tasks) and its parameters per rank.
struct fsdp_unit {
  graph::task_id first = graph::no_task, last = graph::no_task;
  std::int64_t params = 0;
};

/// One collective of a rank's stream, in the order FSDP issues them.
struct fsdp_collective {
  bool gather = false;
  std::int64_t params = 0;
  time_ns transfer = 0;
  graph::task_id wait_for = graph::no_task;  ///< the GPU op whose end it waits for (none: nothing)
  graph::task_id feeds = graph::no_task;     ///< the GPU op that waits for it (a gather's unit)
  graph::task_id near = graph::no_task;      ///< the GPU op whose launch call its launch call precedes
};

/// A rank's collectives, and in `dp` its shard group, its stream, the optimizer's first op and the
/// collectives Megatron runs after the gradient sync (`bucket_planner::find_optimizer`).
struct fsdp_rank_plan {
  std::vector<fsdp_collective> collectives;
  rank_buckets dp;  ///< its buckets empty: the gradients are the collectives'
};

/// Plans the FSDP collectives of each traced rank on a `bucket_planner`'s view of the graph (its
/// parameters per unit, its ops per rank, its optimizer), for a shard group of `bp.dp` ranks.
struct fsdp_planner {
  bucket_planner& bp;
  bool reshard = true;
  fsdp_insertion& out;
  bool counted = false;  ///< the first rank's figures are in `out`

  /// The units of the GPU ops `ops` (indices into st.gpu_ops) of one pass of rank `ri`, in order.
  [[nodiscard]] std::vector<fsdp_unit> units_of(std::size_t ri, const std::vector<std::size_t>& ops, bool forward, bool first,
                                                bool last) const {
    const auto& st = bp.st;
    std::size_t k0 = ops.size(), k1 = ops.size();
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (st.gpu_ops[ops[k]].layer < 0) continue;
      if (k0 == ops.size()) k0 = k;
      k1 = k;
    }
    std::vector<fsdp_unit> units;
    if (k0 == ops.size()) return units;
    const bool pre = forward ? first : last, post = forward ? last : first;
    const std::int64_t head = bp.params.head(bp.pp_to), embedding = bp.params.embedding;
    auto add = [&](std::size_t from, std::size_t to, std::int64_t params) {
      units.push_back({bp.task_of(ri, ops[from]), bp.task_of(ri, ops[to]), params});
    };
    if (pre && k0 > 0) add(0, k0 - 1, forward ? embedding : head);
    const std::size_t end = post && k1 + 1 < ops.size() ? k1 + 1 : ops.size();
    std::size_t from = pre ? k0 : 0;
    int layer = st.gpu_ops[ops[k0]].layer;
    for (std::size_t k = k0 + 1; k < end; ++k) {
      const int l = st.gpu_ops[ops[k]].layer;
      if (l < 0 || l == layer) continue;
      add(from, k - 1, bp.params.layer);
      from = k, layer = l;
    }
    add(from, end - 1, bp.params.layer);
    if (end < ops.size()) add(end, ops.size() - 1, forward ? head : embedding);
    std::erase_if(units, [](const fsdp_unit& u) { return u.first == graph::no_task || u.last == graph::no_task; });
    return units;
  }

  /// The plan of traced rank `ri`; nullopt when none of its passes has units.
  [[nodiscard]] std::optional<fsdp_rank_plan> plan_rank(std::size_t ri) {
    const auto& st = bp.st;
    const rank_structure& rs = st.ranks[ri];
    const bool split =
        std::any_of(rs.passes.begin(), rs.passes.end(), [](const pass_info& p) { return p.op.kind == pipeline::op_kind::weight; });
    const pipeline::op_kind grad_kind = split ? pipeline::op_kind::weight : pipeline::op_kind::backward;
    std::vector<std::vector<std::size_t>> by_pass(rs.passes.size());
    for (const std::size_t gi : bp.ops_of[ri]) {
      const int p = st.gpu_ops[gi].pass;
      if (p >= 0 && static_cast<std::size_t>(p) < by_pass.size()) by_pass[static_cast<std::size_t>(p)].push_back(gi);
    }
    struct pass_units {
      std::vector<fsdp_unit> units;
      bool gathers = false, reduces = false;
    };
    std::vector<pass_units> passes;
    int last_grad_pass = -1;
    const int stage = rs.stage.value.value_or(0);
    for (std::size_t p = 0; p < rs.passes.size(); ++p) {
      const pipeline::op& o = rs.passes[p].op;
      const int vs = o.chunk * bp.pp + stage;
      const bool forward = o.kind == pipeline::op_kind::forward;
      pass_units pu{units_of(ri, by_pass[p], forward, vs == 0, vs == bp.pp * bp.chunks - 1),
                    forward || (o.kind == pipeline::op_kind::backward && reshard), o.kind == grad_kind};
      if (pu.units.empty()) {
        out.skipped.push_back("rank " + std::to_string(rs.rank) + " pass " + std::to_string(p) + ": no layer found in its GPU ops");
        continue;
      }
      if (pu.reduces) last_grad_pass = static_cast<int>(p);
      passes.push_back(std::move(pu));
    }
    if (passes.empty()) return std::nullopt;
    fsdp_rank_plan plan;
    plan.dp.members = dp_group_members(bp.b.ranks[ri].rank, stage, bp.shape.tp, bp.tp_traced, bp.dp);
    const model::group_placement placement = model::placement_of(plan.dp.members, bp.hw);
    auto issue = [&](bool gather, const fsdp_unit& u, graph::task_id wait_for, graph::task_id near) {
      const model::collective kind = gather ? model::collective::all_gather : model::collective::reduce_scatter;
      const time_ns t = bp.nccl.collective_time({kind, u.params * (gather ? 2 : 4), placement}, bp.hw);
      plan.collectives.push_back({gather, u.params, t, wait_for, gather ? u.first : graph::no_task, near});
    };
    // As synth's emit_pass: `free` is where the buffer of the unit before the current one is free.
    graph::task_id free = graph::no_task, previous = graph::no_task;
    bool prefetched = false;
    for (std::size_t p = 0; p < passes.size(); ++p) {
      const pass_units& pu = passes[p];
      if (pu.gathers && !prefetched) issue(true, pu.units.front(), free, pu.units.front().first);
      for (std::size_t si = 0; si < pu.units.size(); ++si) {
        const fsdp_unit& u = pu.units[si];
        if (pu.gathers) {
          free = si == 0 ? previous : pu.units[si - 1].last;
          if (si + 1 < pu.units.size()) issue(true, pu.units[si + 1], free, u.first);
        }
        if (pu.reduces) issue(false, u, u.last, u.last);
      }
      previous = pu.units.back().last;
      prefetched = p + 1 < passes.size() && passes[p + 1].gathers;
      if (prefetched) issue(true, passes[p + 1].units.front(), free, previous);
    }
    bp.find_optimizer(ri, last_grad_pass, plan.dp);
    if (!counted) {
      counted = true;
      out.units = passes.front().units.size();
      for (const fsdp_collective& c : plan.collectives) {
        (c.gather ? out.gathers_first : out.scatters_first) += 1;
        (c.gather ? out.gather_first : out.scatter_first) += c.transfer;
      }
    }
    return plan;
  }
};

/// The host launch of a collective inserted into `g` right after host task `call`: the profile's
/// launch, after the rest of its collective host time.
[[nodiscard]] inline insertion collective_launch(const graph::task_graph& g, graph::task_id call, const model::cost_profile& profile) {
  const auto launch_ns = static_cast<time_ns>(std::llround(profile.cpu_launch_ns));
  const time_ns host_ns = std::max<time_ns>(0, static_cast<time_ns>(std::llround(profile.cpu_collective_ns)) - launch_ns);
  return {.after = call,
          .spec = {.kind = graph::task_kind::cpu, .duration = launch_ns, .busy_gap = host_ns, .rank = g.rank[call],
                   .observed_start = g.observed_end[call], .observed_end = g.observed_end[call]},
          .name = "cudaLaunchKernel"};
}

/// Writes `plans` into `b` (see the header comment). Task ids change (`adopt`).
inline void write_fsdp_collectives(graph::built_job& b, std::vector<fsdp_rank_plan>& plans, const model::cost_profile& profile,
                                   fsdp_insertion& out) {
  for (fsdp_rank_plan& p : plans) p.dp.stream = add_inserted_stream(b, p.collectives.front().near, "FSDP");
  const graph::task_graph& g = b.graph;
  const launch_edges launches(g);
  std::vector<graph::task_id> before(g.task_count(), graph::no_task);
  {
    std::vector<graph::task_id> last(g.processors.size(), graph::no_task);
    for (graph::task_id t = 0; t < g.task_count(); ++t) before[t] = last[g.processor[t]], last[g.processor[t]] = t;
  }
  std::vector<insertion> ins;
  for (const fsdp_rank_plan& p : plans) {
    for (const fsdp_collective& c : p.collectives) {
      if (!launches.launched(c.near)) continue;
      graph::task_id call = g.edges[launches.of[c.near]].from;
      if (before[call] != graph::no_task) call = before[call];
      ins.push_back(collective_launch(g, call, profile));
    }
  }
  edited_graph e = insert_after(g, ins);
  graph::task_graph& ng = e.graph;
  std::size_t next_call = 0;
  for (const fsdp_rank_plan& p : plans) {
    dp_stream_writer w{g, e, launches, p.dp, next_call, g.rank[p.collectives.front().near]};
    w.group = inserted_fsdp_group, w.match = "inserted by --fsdp on (the shard group folded onto its traced rank)";
    for (const fsdp_collective& c : p.collectives) {
      const graph::task_id arrive =
          c.gather ? w.collective(c.near, "allgather", "ncclDevKernel_AllGather_RING_LL", c.transfer, c.params)
                   : w.collective(c.near, "reducescatter", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", c.transfer, c.params);
      if (c.wait_for != graph::no_task) ng.add_edge(e.first(c.wait_for), arrive, 0, graph::edge_kind::cross_stream);
      if (c.feeds != graph::no_task) ng.add_edge(w.previous, e.first(c.feeds), 0, graph::edge_kind::cross_stream);
      ++(c.gather ? out.gathers : out.scatters);
    }
    if (p.dp.gate != graph::no_task) ng.add_edge(w.previous, e.first(p.dp.gate), 0, graph::edge_kind::cross_stream);
    for (const graph::task_id t : p.dp.after_sync) ng.add_edge(w.previous, e.first(t), 0, graph::edge_kind::cross_stream);
    ++out.ranks;
  }
  (void)adopt(b, std::move(e));
}

}  // namespace detail

/// Inserts FSDP's per-unit all-gathers and reduce-scatters over a shard group of `dp` ranks into
/// `b`, whose traces shard nothing and whose gradient collectives were stripped (see the header
/// comment). `st` must be `discover_structure` of `b` as it is; `shape` is the target's shape (its
/// TP places the group and sizes the units), `vocab` the full vocabulary (0: unknown, the
/// embedding and logits then count no parameters), `gated` a Llama-style layer, `reshard` whether
/// backward passes gather again. Task ids of `b` change (`adopt`); the caller discovers the
/// structure again. Returns what was inserted.
[[nodiscard]] inline fsdp_insertion insert_fsdp_collectives(graph::built_job& b, const job_structure& st, const shape_config& shape,
                                                            std::int64_t vocab, bool gated, int dp, bool reshard,
                                                            const model::nccl_model& nccl, const model::hardware& hw,
                                                            const model::cost_profile& profile) {
  fsdp_insertion out;
  bucket_insertion unused;
  detail::bucket_planner bp(b, st, shape, vocab, gated, dp, nccl, hw, bucket_target{}, unused);
  detail::fsdp_planner planner{bp, reshard, out};
  std::vector<detail::fsdp_rank_plan> plans;
  for (std::size_t ri = 0; ri < b.ranks.size() && ri < st.ranks.size(); ++ri) {
    if (auto plan = planner.plan_rank(ri); plan && !plan->collectives.empty()) plans.push_back(std::move(*plan));
  }
  if (!plans.empty()) detail::write_fsdp_collectives(b, plans, profile, out);
  return out;
}

}  // namespace lumos::whatif

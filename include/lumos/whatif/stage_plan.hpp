#pragma once
// Planning of the fine-grained stage split (`split_stages`, whatif/pipeline_graph.hpp): what each
// task of the traced graph becomes, with no edit of the graph. A plan holds the split's geometry
// (stages, chunks, the traced stages' blocks and the ranks' new numbers), every task's pass code,
// layer, virtual stage and the stages that keep it, the processors each traced rank's transfers
// go to, each stage's order of passes (the schedule's) with every processor's runs of one unit in
// that order, the host synchronizations re-targeted by the new order, and the cross-stage
// transfers the schedule needs. whatif/stage_emission.hpp builds the new graph from it.
//
// In a pass, a layer's tasks stay on the stage that holds the layer; the other work of a forward
// pass before its first layer (the embedding) stays on the first stage, after its last layer
// (head, loss) on the last; in a backward pass the reverse; work between layers, and the
// data-parallel gradient collectives, stay on every stage. With traced stages, traced stage σ is
// cut into the block of target stages [σ·k, σ·k + k) (or, merging, each target stage is made from
// one traced stage of the block it merges: `merge_source_stage`).

#include <lumos/core/error.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/schedules.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/stage_geometry.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// A run of a processor's tasks of one unit: positions [begin, end) in the processor's traced
/// order (`stage_plan::on`).
struct stage_run {
  std::uint32_t begin = 0, end = 0;
  std::int32_t unit = 0;
};

/// A cross-stage transfer the schedule needs: the output of unit `from_unit` of stage `from`
/// (traced rank `i_from`'s copy) to unit `to_unit` of stage `to` (traced rank `i`'s copy).
struct planned_transfer {
  std::size_t i = 0, i_from = 0;  ///< indices into job.ranks of the receiving and the sending stage's traced rank
  int from = 0, to = 0, chunk = 0;
  std::int32_t from_unit = 0, to_unit = 0;
  bool forward = true;
};

/// What a stage split makes of each task of a graph, before any edit (`plan_stages`). Per-task
/// vectors are indexed by the task ids of the graph planned; per (stage, processor) ones by
/// s · processors + p.
struct stage_plan {
  stage_geometry geometry;
  std::size_t tasks = 0, processors = 0;  ///< of the graph planned
  std::vector<std::vector<graph::task_id>> on;  ///< per processor: its tasks in order

  // Per task.
  std::vector<std::int32_t> code;         ///< pass code (pass_labels), label_pre / label_post outside the passes
  std::vector<std::uint8_t> p2p_where;    ///< 0: a traced receive, 2: a traced send, 1: neither
  std::vector<std::int32_t> layer;        ///< layer in its chunk (−1: none)
  std::vector<std::uint8_t> everywhere;   ///< kept on every stage (data-parallel collectives, their launches)
  std::vector<std::uint8_t> world_join;   ///< the join of a collective of the whole world: one join, stage 0's
  std::vector<std::int32_t> virtual_stage;  ///< −1: every stage
  std::vector<std::int32_t> join_stage;   ///< a join across traced stages: the stage that keeps it (−1: none)
  std::vector<std::uint32_t> join_collective;  ///< a join: its collective's index in the graph (~0: none)
  std::vector<std::vector<std::uint8_t>> kept;  ///< per stage and task: 1 when the stage keeps it
  std::vector<std::string> world_groups;  ///< groups of collectives of the whole world alone
  std::size_t weight_ops = 0;             ///< zero bubble: GPU ops of the backward passes in their W

  // Per traced rank (index into job.ranks): where its transfers go.
  std::vector<graph::processor_id> main_stream, dp_stream;  ///< compute stream; data-parallel collectives' stream
  std::vector<std::array<graph::processor_id, 2>> main_thread;  ///< host thread launching forward, backward passes
  std::unordered_map<graph::processor_id, std::size_t> index_of_processor;  ///< dp stream -> rank index
  std::unordered_map<graph::processor_id, std::size_t> stream_rank;  ///< compute stream -> rank index
  /// Main thread -> its rank index and the pass kinds it launches (bit 0 forward, bit 1 backward).
  std::unordered_map<graph::processor_id, std::pair<std::size_t, int>> index_of_thread;

  // Per stage.
  std::vector<std::vector<pipeline::op>> orders;     ///< the schedule's order of ops
  std::vector<std::vector<std::int64_t>> position;   ///< per unit: its place in `orders`
  std::vector<std::vector<std::uint8_t>> receives;   ///< per unit: it receives its input from another stage
  std::vector<std::vector<std::uint8_t>> sends_to;   ///< per unit: another stage reads its output
  std::vector<std::uint8_t> present;                 ///< per (stage, processor): the stage has it
  std::vector<std::vector<stage_run>> runs;          ///< per (stage, processor): its runs in the stage's order
  /// Per (stage, edge index): a synchronization's new source (no_task: the edge is dropped).
  std::map<std::pair<int, std::size_t>, graph::task_id> resync;
  std::vector<planned_transfer> transfers;

  /// The unit task `t` runs in: its pass and chunk (code·vp + chunk), or label_pre / label_post.
  [[nodiscard]] std::int32_t unit_of(graph::task_id t) const noexcept {
    const std::int32_t c = code[t];
    if (c == detail::label_pre || c == detail::label_post) return c;
    return c * geometry.vp + (virtual_stage[t] < 0 ? 0 : virtual_stage[t] / geometry.pp);
  }
  /// A unit's place in stage s's order (before and after every pass for label_pre / label_post).
  [[nodiscard]] std::int64_t pos(int s, std::int32_t u) const noexcept {
    if (u == detail::label_pre) return -1;
    if (u == detail::label_post) return std::numeric_limits<std::int64_t>::max();
    return position[static_cast<std::size_t>(s)][static_cast<std::size_t>(u)];
  }
  /// Whether stage s has a copy of task t (that `g` is the graph planned).
  [[nodiscard]] bool copies(int s, graph::task_id t, const graph::task_graph& g) const noexcept {
    return kept[static_cast<std::size_t>(s)][t] != 0 && present[static_cast<std::size_t>(s) * processors + g.processor[t]] != 0;
  }
};

namespace detail {

// Where the structure's tasks (those of the graph before a micro-batch or layer change) went.
// With both (layers first, then micro-batch periods over the layer copies): every period copy of
// every layer copy, layer copy by layer copy; `period_copy` gives each final task's index among
// its period copies and their count, for the micro-batch it runs.
struct split_task_copies {
  std::vector<std::vector<graph::task_id>> composed;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> period_copy;
  const std::vector<std::vector<graph::task_id>>* copies = nullptr;
  std::vector<graph::task_id> inverse;  // first copy -> task before

  // The tasks the structure's task `t` became.
  [[nodiscard]] std::vector<graph::task_id> of(graph::task_id t) const {
    if (copies == nullptr) return {t};
    return t < copies->size() ? (*copies)[t] : std::vector<graph::task_id>{};
  }
  // The tasks that the task an event maps to (its first copy, after an edit) stands for.
  [[nodiscard]] std::vector<graph::task_id> of_first(graph::task_id first) const {
    return copies != nullptr && inverse[first] != graph::no_task ? of(inverse[first]) : std::vector<graph::task_id>{first};
  }
};

[[nodiscard]] inline split_task_copies compose_task_copies(std::size_t n, const stage_split_target& target) {
  using graph::task_id;
  const micro_batch_remap* remap = target.remap;
  const auto* layer_copies = target.layer_copies;
  split_task_copies out;
  if (remap != nullptr && layer_copies != nullptr) {
    out.composed.resize(layer_copies->size());
    for (task_id t = 0; t < layer_copies->size(); ++t) {
      for (const task_id c : (*layer_copies)[t]) {
        if (c < remap->copies->size()) out.composed[t].insert(out.composed[t].end(), (*remap->copies)[c].begin(), (*remap->copies)[c].end());
      }
    }
    out.period_copy.assign(n, {0, 1});
    for (const auto& all : *remap->copies) {
      for (std::size_t k = 0; k < all.size(); ++k) {
        if (all[k] < n) out.period_copy[all[k]] = {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(all.size())};
      }
    }
  }
  out.copies = !out.composed.empty() ? &out.composed : remap != nullptr ? remap->copies : layer_copies;
  if (out.copies != nullptr) {
    out.inverse.assign(n, graph::no_task);
    for (task_id t = 0; t < out.copies->size(); ++t) {
      if (!(*out.copies)[t].empty()) out.inverse[(*out.copies)[t].front()] = t;
    }
  }
  return out;
}

// Pass codes of every task (pass_labels). A traced transfer stays on the end stage of its block
// that faces its peer: placed as the pass's work before its layers (a receive) or after them (a
// send). Zero bubble: the weight gradients of a backward pass are its W (code 2m + micro-batch);
// traces that ran a zero-bubble schedule label their W passes themselves. A join runs in its
// collective's first participant's pass.
inline void plan_pass_codes(stage_plan& p, const graph::built_job& b, const trace::job& job, const job_structure& st,
                            const split_task_copies& copies, const stage_split_target& target) {
  using graph::task_id;
  const stage_geometry& geo = p.geometry;
  const graph::task_graph& g = b.graph;
  const std::size_t n = g.task_count(), R = job.ranks.size();
  const int m = geo.micro_batches, P = geo.traced_pp;
  const micro_batch_remap* remap = target.remap;
  // Op code of copy c of pass k of rank i (task `t`): kind·m + micro-batch (the same on every rank).
  auto code_of_pass = [&](std::size_t i, std::int32_t k, std::size_t c, std::size_t count, task_id t) -> std::int32_t {
    const pipeline::op& o = st.ranks[i].passes[static_cast<std::size_t>(k)].op;
    if (!copies.period_copy.empty() && t < n) c = copies.period_copy[t].first, count = copies.period_copy[t].second;
    return pass_code_of(o, m, remap != nullptr ? remap->micro_batch(o.micro_batch, c, count) : o.micro_batch);
  };
  pass_labels labels = explicit_pass_labels(
      b, job, st, P, [&](task_id first) { return copies.of_first(first); },
      [&](std::size_t i, int pass, std::size_t c, std::size_t count, task_id t) { return code_of_pass(i, pass, c, count, t); });
  std::vector<std::int32_t>& code = labels.code;
  const std::vector<std::uint8_t>& explicit_label = labels.explicit_label;
  if (geo.zero_bubble && geo.traced_weight) {
    for (task_id t = 0; t < n; ++t) p.weight_ops += explicit_label[t] && code[t] >= 2 * m && code[t] < 3 * m && g.kind[t] != graph::task_kind::cpu;
  } else if (geo.zero_bubble) {
    std::vector<std::uint8_t> is_weight(n, 0);
    for (task_id t = 0; t < target.weight->size(); ++t) {
      if (!(*target.weight)[t]) continue;
      for (const task_id c : copies.of(t)) {
        if (c < n) is_weight[c] = 1;
      }
    }
    for (task_id t = 0; t < n; ++t) {
      if (is_weight[t] && explicit_label[t] && code[t] >= m && code[t] < 2 * m) code[t] += m, ++p.weight_ops;
    }
  }
  // Codes run in pass order on each processor: without stages a micro-batch's F then B (F0 B0 F1
  // B1 ...); with stages, a rank's traced order is its schedule's.
  const std::vector<std::vector<std::int64_t>> traced_order = P > 1 ? traced_pass_positions(st, R, m, remap)
                                                                    : std::vector<std::vector<std::int64_t>>{};
  auto traced_position = [&](std::int32_t c, int rank) -> std::int64_t {
    if (c == label_pre) return -1;
    if (c == label_post) return std::numeric_limits<std::int64_t>::max();
    if (!geo.traced_weight) c = geo.pass_of(c);  // a W the split made sits in its backward pass
    if (const auto it = geo.index_of_rank.find(rank); P > 1 && it != geo.index_of_rank.end()) {
      return traced_order[it->second][static_cast<std::size_t>(c)];
    }
    return c < m ? 2 * static_cast<std::int64_t>(c) : 2 * static_cast<std::int64_t>(c - m) + 1;
  };
  fill_pass_labels(g, labels, p.on, traced_position);
  p.join_collective.assign(n, ~std::uint32_t{0});
  for (std::size_t x = 0; x < g.collectives.size(); ++x) {
    const auto& ci = g.collectives[x];
    if (ci.join != graph::no_task && !ci.complete.empty()) {
      p.join_collective[ci.join] = static_cast<std::uint32_t>(x);
      code[ci.join] = code[ci.complete.front()];
    }
  }
  for (task_id t = 0; t < n; ++t) {
    if (code[t] == label_unknown) code[t] = label_pre;
  }
  p.code = std::move(labels.code);
  p.p2p_where = std::move(labels.p2p_where);
}

// Each task's layer: with a layer change, copy j of traced layer k of a rank's chunk is layer
// (copies of the layers before k) + j: repeated in place.
inline void plan_layers(stage_plan& p, const job_structure& st, const split_task_copies& copies, const stage_split_target& target) {
  using graph::task_id;
  const std::size_t n = p.tasks;
  const auto* layer_copies = target.layer_copies;
  const micro_batch_remap* remap = target.remap;
  std::vector<std::int32_t>& layer = p.layer;
  layer.assign(n, -1);
  std::map<std::tuple<int, int, int>, std::int32_t> first_index;  // (rank, chunk, traced layer) -> new index of its copy 0
  if (layer_copies != nullptr) {
    std::map<std::tuple<int, int, int>, std::int32_t> count;
    for (const auto& lg : st.layer_groups) {
      if (lg.tasks.empty() || lg.tasks.front() >= layer_copies->size()) continue;
      count[{lg.rank, lg.op.chunk, lg.layer}] = static_cast<std::int32_t>((*layer_copies)[lg.tasks.front()].size());
    }
    std::int32_t next = 0;
    std::pair<int, int> chunk{std::numeric_limits<int>::min(), 0};
    for (const auto& [key, c] : count) {  // in (rank, chunk, layer) order
      if (std::pair{std::get<0>(key), std::get<1>(key)} != chunk) chunk = {std::get<0>(key), std::get<1>(key)}, next = 0;
      first_index[key] = next;
      next += c;
    }
  }
  for (const auto& lg : st.layer_groups) {
    for (const task_id t : lg.tasks) {
      if (layer_copies == nullptr) {
        for (const task_id c : copies.of(t)) {
          if (c < n) layer[c] = lg.layer;
        }
        continue;
      }
      if (t >= layer_copies->size()) continue;
      const auto& lc = (*layer_copies)[t];
      const std::int32_t first = first_index[{lg.rank, lg.op.chunk, lg.layer}];
      for (std::size_t j = 0; j < lc.size(); ++j) {
        // Copy j of the layer, and each micro-batch period copy of it.
        const std::vector<task_id> own{lc[j]};
        for (const task_id c : remap != nullptr && lc[j] < remap->copies->size() ? (*remap->copies)[lc[j]] : own) {
          if (c < n) layer[c] = first + static_cast<std::int32_t>(j);
        }
      }
    }
  }
}

// The tasks every stage keeps: the data-parallel collectives (and their launches). Collectives
// of the whole world (the gradient norm's, say) span every stage: one join.
inline void plan_everywhere(stage_plan& p, const graph::built_job& b, const trace::job& job, const job_structure& st,
                            const split_task_copies& copies) {
  using graph::task_id;
  using graph::no_task;
  const graph::task_graph& g = b.graph;
  const std::size_t n = p.tasks;
  std::vector<std::uint8_t>& everywhere = p.everywhere;
  std::vector<std::uint8_t>& world_join = p.world_join;
  std::vector<std::string>& world_groups = p.world_groups;
  everywhere.assign(n, 0);
  world_join.assign(n, 0);
  std::vector<std::string> dp_groups;
  // A group that spans the world but has a narrower role too (the TP group of a job with
  // one replica, the DP group of a job without TP) is that role's: split per stage.
  for (const auto& pg : st.groups) {
    bool dp = false, world = false, other = false;
    for (const auto& role : pg.roles) {
      if (!role.value) continue;
      dp = dp || *role.value == group_role::dp;
      world = world || *role.value == group_role::world;
      other = other || (*role.value != group_role::dp && *role.value != group_role::world);
    }
    if (dp && !other) dp_groups.push_back(pg.name);
    if (world && !dp && !other) dp_groups.push_back(pg.name), world_groups.push_back(pg.name);
  }
  for (const auto& ci : g.collectives) {
    if (std::find(dp_groups.begin(), dp_groups.end(), ci.group) == dp_groups.end()) continue;
    if (ci.join != no_task && std::find(world_groups.begin(), world_groups.end(), ci.group) != world_groups.end()) world_join[ci.join] = 1;
    for (const task_id t : ci.arrive) everywhere[t] = 1;
    for (const task_id t : ci.complete) everywhere[t] = 1;
    if (ci.join != no_task) everywhere[ci.join] = 1;
  }
  // Traces of one rank per stage hold no DP peers: their gradient collectives are lone ops,
  // not instances, whose group their args name. Left out, the zero-bubble rule (plan_weight_collectives)
  // kept a reduce-scatter in B, before the W that computes its gradients (gpt3-15b TP 2 PP 2 DP 2
  // without --unfold -> --schedule zb-h1: -1.44 %).
  for (const lone_collective& c : lone_collectives(job, b)) {
    if (std::find(dp_groups.begin(), dp_groups.end(), c.group) == dp_groups.end()) continue;
    for (const task_id first : {c.arrive, c.task}) {
      if (first == no_task) continue;
      for (const task_id t : copies.of_first(first)) everywhere[t] = 1;
    }
  }
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && everywhere[e.to]) everywhere[e.from] = 1;
  }
  for (task_id t = 0; t < n; ++t) {
    if (everywhere[t]) p.layer[t] = -1;
  }
}

// Zero bubble: a gradient collective that waits for a weight gradient runs after that W: a
// data-parallel group's, or a bucket's reduce-scatter that a DP change from one inserted in a
// layer (which a p2p send or a TP collective that waited for the backward's last kernel is not).
inline void plan_weight_collectives(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  using graph::no_task;
  const std::size_t n = p.tasks;
  const int m = p.geometry.micro_batches;
  std::vector<std::int32_t>& code = p.code;
  std::vector<std::uint8_t> inserted_bucket(n, 0);
  for (const auto& ci : g.collectives) {
    if (!ci.group.starts_with(inserted_gradient_group)) continue;
    for (const task_id t : ci.arrive) inserted_bucket[t] = 1;
    for (const task_id t : ci.complete) inserted_bucket[t] = 1;
  }
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::dependency && e.kind != graph::edge_kind::cross_stream) continue;
    if (!(p.everywhere[e.to] || inserted_bucket[e.to]) || code[e.from] < 2 * m || code[e.from] == label_post ||
        code[e.to] != code[e.from] - m) {
      continue;
    }
    code[e.to] = code[e.from];
    // Its arrive or its transfer (a matched op's complete, a lone op's gpu_comm), beside it on
    // its stream.
    const bool arrive = g.kind[e.to] == graph::task_kind::comm_arrive;
    const task_id pair = arrive ? e.to + 1 : e.to - 1;
    const bool paired = pair < n && g.processor[pair] == g.processor[e.to] &&
                        (arrive ? g.kind[pair] == graph::task_kind::comm_complete || g.kind[pair] == graph::task_kind::gpu_comm
                                : g.kind[pair] == graph::task_kind::comm_arrive);
    if (paired) code[pair] = code[e.from];
  }
  for (const auto& ci : g.collectives) {
    if (ci.join != no_task && !ci.complete.empty()) code[ci.join] = code[ci.complete.front()];
  }
  // An inserted bucket's launch goes with it, as the host launches the W pass's kernels in W:
  // left in B, its host time delayed the final backward's launches (+1.1 % on a launch-bound
  // gpt3-15b of 4 layers of hidden 2048, TP 2 PP 2 -> DP 2 ZB-H1).
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && inserted_bucket[e.to] && code[e.to] >= 2 * m && code[e.to] != label_post) {
      code[e.from] = code[e.to];
    }
  }
}

// Tasks that a rewrite inserted into a layer have no event for structure discovery to group. On
// its processor, between two tasks of one layer in one pass, such a task (a tensor-parallel
// all-reduce after its GEMM, its launch) is that layer's (the traces' own tasks there are in the
// layer's group already: a group takes everything from its first task to its last). A GPU op
// inserted on a stream of its own (a data-parallel bucket's reduce-scatter, launched inside the
// layer that closes the bucket) is its launch's layer's; an arrive takes its complete, beside it
// on its stream, along.
inline void plan_inserted_layers(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  const std::size_t n = p.tasks;
  const stage_geometry& geo = p.geometry;
  const std::vector<std::int32_t>& code = p.code;
  std::vector<std::int32_t>& layer = p.layer;
  for (graph::processor_id q = 0; q < p.processors; ++q) {
    const auto& list = p.on[q];
    std::vector<std::int32_t> before_layer(list.size(), -1);
    for (std::size_t x = 1; x < list.size(); ++x) {
      const task_id prev = list[x - 1];
      const bool same_pass = geo.pass_of(code[prev]) == geo.pass_of(code[list[x]]);
      before_layer[x] = !same_pass ? -1 : layer[prev] >= 0 ? layer[prev] : before_layer[x - 1];
    }
    std::int32_t after = -1;
    for (std::size_t x = list.size(); x-- > 0;) {
      const task_id t = list[x];
      const bool same_pass = x + 1 < list.size() && geo.pass_of(code[list[x + 1]]) == geo.pass_of(code[t]);
      if (!same_pass) after = -1;
      if (layer[t] >= 0) {
        after = layer[t];
        continue;
      }
      if (!p.everywhere[t] && code[t] != label_pre && code[t] != label_post && after >= 0 && before_layer[x] == after) {
        layer[t] = after;
      }
    }
  }
  for (const graph::edge& e : g.edges) {
    if (e.kind != graph::edge_kind::launch || layer[e.from] < 0 || layer[e.to] >= 0 || p.everywhere[e.to]) continue;
    layer[e.to] = layer[e.from];
    const task_id pair = e.to + 1;
    if (g.kind[e.to] == graph::task_kind::comm_arrive && pair < n && g.processor[pair] == g.processor[e.to] &&
        g.kind[pair] == graph::task_kind::comm_complete && layer[pair] < 0) {
      layer[pair] = layer[e.from];
    }
  }
}

// The virtual stage of each task of a pass (−1: every stage): a layer's; the work before a
// forward pass's first layer the first virtual stage's, after its last the last's (reversed
// for a backward pass); work between layers every stage's, or with chunks the virtual stage
// of the layer before it. A join runs in its participants' unit.
inline void plan_virtual_stages(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  const std::size_t n = p.tasks;
  const stage_geometry& geo = p.geometry;
  const int m = geo.micro_batches, P = geo.traced_pp, pp = geo.pp, vp = geo.vp;
  const std::vector<std::int32_t>& code = p.code;
  const std::vector<std::int32_t>& layer = p.layer;
  // Where each non-layer task of a pass stands on its processor: before the pass's first layer
  // task there (0), between (1), after its last (2); 1 when the processor has none in the pass.
  std::vector<std::uint8_t> where(n, 1);
  for (graph::processor_id q = 0; q < p.processors; ++q) {
    const auto& list = p.on[q];
    for (std::size_t x = 0; x < list.size();) {
      std::size_t y = x;
      while (y < list.size() && geo.pass_of(code[list[y]]) == geo.pass_of(code[list[x]])) ++y;
      std::size_t first = y, last = y;
      for (std::size_t z = x; z < y; ++z) {
        if (layer[list[z]] >= 0) {
          if (first == y) first = z;
          last = z;
        }
      }
      if (first != y) {
        for (std::size_t z = x; z < y; ++z) where[list[z]] = z < first ? 0 : z > last ? 2 : 1;
      }
      x = y;
    }
  }
  std::vector<std::int32_t>& virtual_stage = p.virtual_stage;
  virtual_stage.assign(n, -1);
  for (graph::processor_id q = 0; q < p.processors; ++q) {
    if (g.processors[q].kind == graph::processor_kind::barrier) continue;  // joins: below
    std::int32_t previous_layer = -1;
    std::int32_t run_code = label_unknown;
    // The first and last virtual stage this processor's rank reaches (its traced stage's block).
    const int base = std::max(0, geo.first_stage(geo.traced_stage(g.processors[q].rank)));
    const int first_vs = P > 1 ? base : 0, last_vs = P > 1 ? (vp - 1) * pp + base + geo.cut - 1 : pp * vp - 1;
    for (const task_id t : p.on[q]) {
      const std::int32_t c = geo.pass_of(code[t]);
      if (c != run_code) previous_layer = -1, run_code = c;
      if (p.everywhere[t] || c == label_pre || c == label_post) continue;
      const bool forward = c < m;
      const std::uint8_t at = p.p2p_where[t] != 1 ? p.p2p_where[t] : where[t];
      if (layer[t] >= 0) {
        // With traced stages, slot q of the block: stage base + q mod k of chunk q / k.
        const int slot = layer[t] / geo.per_chunk;
        virtual_stage[t] = previous_layer = P > 1 ? slot / geo.cut * pp + base + slot % geo.cut : slot;
      } else if (at == 0) {
        virtual_stage[t] = forward ? first_vs : last_vs;
      } else if (at == 2) {
        virtual_stage[t] = forward ? last_vs : first_vs;
      } else {
        virtual_stage[t] = vp > 1 ? previous_layer : -1;
      }
    }
  }
  for (task_id t = 0; t < n; ++t) {
    if (p.join_collective[t] != ~std::uint32_t{0}) virtual_stage[t] = virtual_stage[g.collectives[p.join_collective[t]].complete.front()];
  }
}

// Traces with stages: a collective between traced stages (a traced transfer, the tied
// embedding's all-reduce) stays one instance across the blocks, its join kept where its first
// participant is. A transfer's participants are placed by their pass (plan_virtual_stages); the
// others (the tied embedding's) on the first stage for traced stage 0, the last for the last, else
// the first of their block, with their launches.
inline void plan_join_stages(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  const std::size_t n = p.tasks;
  const stage_geometry& geo = p.geometry;
  const int P = geo.traced_pp, pp = geo.pp;
  std::vector<std::int32_t>& virtual_stage = p.virtual_stage;
  p.join_stage.assign(n, -1);
  if (P <= 1) return;
  std::vector<std::uint8_t> fixed(n, 0);
  for (const auto& ci : g.collectives) {
    if (ci.join == graph::no_task || ci.complete.empty() || p.world_join[ci.join]) continue;
    int lo = std::numeric_limits<int>::max(), hi = -1;
    for (const task_id c : ci.complete) lo = std::min(lo, geo.traced_stage(g.rank[c])), hi = std::max(hi, geo.traced_stage(g.rank[c]));
    if (lo == hi) continue;
    const bool transfer = p.p2p_where[ci.complete.front()] != 1 && virtual_stage[ci.complete.front()] >= 0;
    for (std::size_t x = 0; x < ci.complete.size() && !transfer; ++x) {
      const int sigma = geo.traced_stage(g.rank[ci.complete[x]]);
      const int vs = sigma == 0 ? 0 : sigma == P - 1 ? pp - 1 : std::max(0, geo.first_stage(sigma));
      for (const task_id a : {ci.arrive[x], ci.complete[x]}) virtual_stage[a] = vs, fixed[a] = 1;
    }
    virtual_stage[ci.join] = virtual_stage[ci.complete.front()];
    p.join_stage[ci.join] = virtual_stage[ci.join] < 0 ? -1 : virtual_stage[ci.join] % pp;  // a stage, not a chunk's virtual stage
  }
  for (const graph::edge& e : g.edges) {
    if (e.kind == graph::edge_kind::launch && fixed[e.to]) virtual_stage[e.from] = virtual_stage[e.to];
  }
}

// The tasks each stage keeps: those of its virtual stages and those of every stage. A traced
// transfer (and its launch) is replaced when every transfer is added; a communication op's arrive
// goes with its complete; a join with its collective's first complete.
inline void plan_kept(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  const std::size_t n = p.tasks;
  const stage_geometry& geo = p.geometry;
  const int pp = geo.pp;
  auto keeps = [&](int s, task_id t) {
    if (geo.cross_blocks && p.p2p_where[t] != 1) return false;
    return p.virtual_stage[t] < 0 || p.virtual_stage[t] % pp == s;
  };
  p.kept.assign(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(n, 0));
  for (int s = 0; s < pp; ++s) {
    auto& k = p.kept[static_cast<std::size_t>(s)];
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] != graph::task_kind::join) k[t] = keeps(s, t) ? 1 : 0;
    }
    for (task_id t = 0; t + 1 < n; ++t) {
      if (g.kind[t] == graph::task_kind::comm_arrive && g.processor[t + 1] == g.processor[t]) k[t] = k[t + 1];
    }
    for (task_id t = 0; t < n; ++t) {
      if (g.kind[t] == graph::task_kind::join) {
        const graph::collective_instance* ci = p.join_collective[t] != ~std::uint32_t{0} ? &g.collectives[p.join_collective[t]] : nullptr;
        // With traced stages a stage holds only its block's ranks: a join whose first participant
        // is elsewhere is not its.
        const bool here = ci == nullptr || geo.traced_stage(g.rank[ci->complete.front()]) == geo.source_stage(s);
        k[t] = p.world_join[t] ? s == 0 : ci != nullptr ? k[ci->complete.front()] && here : 1;
      }
    }
  }
}

inline constexpr graph::processor_id no_processor = ~graph::processor_id{0};

// The processor with the most counted tasks (the first of them on a tie; none when empty).
[[nodiscard]] inline graph::processor_id most_counted(const std::map<graph::processor_id, std::size_t>& c) {
  graph::processor_id best = no_processor;
  std::size_t count = 0;
  for (const auto& [q, k] : c) {
    if (k > count) best = q, count = k;
  }
  return best;
}

// Per traced rank: its compute stream (most layer kernels), the host thread of each pass kind
// (most layer launches) and the stream of its data-parallel collectives (else of its other
// collectives off the compute stream, else the compute stream): the cross-stage transfers and
// the tied embedding's all-reduce go there.
inline void plan_rank_processors(stage_plan& p, const graph::task_graph& g, const trace::job& job, const job_structure& st,
                                 const split_task_copies& copies) {
  using graph::task_id;
  const std::size_t n = p.tasks, R = job.ranks.size();
  const auto& index_of_rank = p.geometry.index_of_rank;
  auto rank_of = [&](task_id t) { return t < n ? index_of_rank.find(g.rank[t]) : index_of_rank.end(); };
  std::vector<std::map<graph::processor_id, std::size_t>> stream_count(R), dp_count(R);
  std::vector<std::array<std::map<graph::processor_id, std::size_t>, 2>> thread_count(R);
  for (const auto& lg : st.layer_groups) {
    for (const task_id t0 : lg.tasks) {
      for (const task_id t : copies.of(t0)) {
        const auto it = rank_of(t);
        if (it == index_of_rank.end()) continue;
        const auto k = g.kind[t];
        if (k == graph::task_kind::gpu_compute) ++stream_count[it->second][g.processor[t]];
        if (k == graph::task_kind::cpu || k == graph::task_kind::cpu_blocking) {
          ++thread_count[it->second][lg.op.kind == pipeline::op_kind::forward ? 0 : 1][g.processor[t]];
        }
      }
    }
  }
  // The collectives every stage keeps (the gradients' after the passes); a communication op whose
  // peers are absent from the job (a rank folded onto one of its group) is one task, no instance.
  for (task_id t = 0; t < n; ++t) {
    if (!p.everywhere[t]) continue;
    const bool lone = g.kind[t] == graph::task_kind::gpu_comm && detail::comm_kind(g.task_name(t), {}) != "sendrecv";
    if (g.kind[t] != graph::task_kind::comm_complete && !lone) continue;
    if (const auto it = index_of_rank.find(g.rank[t]); it != index_of_rank.end()) ++dp_count[it->second][g.processor[t]];
  }
  // Inserted gradient buckets are the data-parallel collectives too: with the traced ones
  // removed (gradient_buckets.hpp), the world's all-reduce alone must not pick its stream.
  // Without traced data-parallel collectives, the stream of the rank's other collectives off its
  // compute stream (those a DP change from one replica inserted), if any.
  std::vector<std::map<graph::processor_id, std::size_t>> other_count(R);
  for (const bool inserted : {true, false}) {
    for (const auto& ci : g.collectives) {
      if (inserted ? !ci.group.starts_with(inserted_gradient_group) : ci.kind == "sendrecv" || ci.kind == "send_recv") continue;
      for (const task_id t : ci.complete) {
        if (const auto it = rank_of(t); it != index_of_rank.end()) ++(inserted ? dp_count : other_count)[it->second][g.processor[t]];
      }
    }
  }
  p.main_stream.assign(R, no_processor), p.dp_stream.assign(R, no_processor);
  p.main_thread.assign(R, {no_processor, no_processor});
  for (std::size_t i = 0; i < R; ++i) {
    p.main_stream[i] = most_counted(stream_count[i]);
    p.main_thread[i] = {most_counted(thread_count[i][0]), most_counted(thread_count[i][1])};
    if (p.main_stream[i] == no_processor || p.main_thread[i][0] == no_processor || p.main_thread[i][1] == no_processor) {
      throw error("whatif --pp: rank " + std::to_string(job.ranks[i].rank) + " has no layer kernels or launches to join its stages by");
    }
    other_count[i].erase(p.main_stream[i]);
    p.dp_stream[i] = !dp_count[i].empty() ? most_counted(dp_count[i]) : !other_count[i].empty() ? most_counted(other_count[i]) : p.main_stream[i];
    p.stream_rank[p.main_stream[i]] = i;
    p.index_of_processor[p.dp_stream[i]] = i;
    for (int kind_index = 0; kind_index < 2; ++kind_index) {
      auto& entry = p.index_of_thread[p.main_thread[i][static_cast<std::size_t>(kind_index)]];
      entry.first = i, entry.second |= 1 << kind_index;
    }
  }
}

// Stage orders, each unit's position in them, and which units of a stage receive their input
// from another stage and which send their output. Between traced stages the traced transfer
// stays: only transfers within a block are added (every one, with `cross_blocks`).
inline void plan_orders(stage_plan& p) {
  const stage_geometry& geo = p.geometry;
  const int pp = geo.pp;
  const pipeline::schedule_shape shape{pp, geo.micro_batches, geo.vp};
  p.orders = geo.schedule.orders(shape);
  const auto units = static_cast<std::size_t>((geo.zero_bubble ? 3 : 2) * geo.micro_batches * geo.vp);
  p.position.assign(static_cast<std::size_t>(pp), std::vector<std::int64_t>(units, 0));
  p.receives.assign(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(units, 0));
  p.sends_to.assign(static_cast<std::size_t>(pp), std::vector<std::uint8_t>(units, 0));
  for (int s = 0; s < pp; ++s) {
    const auto& order = p.orders[static_cast<std::size_t>(s)];
    for (std::size_t x = 0; x < order.size(); ++x) {
      const auto u = static_cast<std::size_t>(geo.unit_of_op(order[x]));
      p.position[static_cast<std::size_t>(s)][u] = static_cast<std::int64_t>(x);
      const auto dep = pipeline::dependency_of(shape, s, order[x]);
      if (dep && dep->crosses_stages(s) && (geo.cross_blocks || geo.source_stage(dep->on.stage) == geo.source_stage(s))) {
        p.receives[static_cast<std::size_t>(s)][u] = 1;
        p.sends_to[static_cast<std::size_t>(dep->on.stage)][static_cast<std::size_t>(geo.unit_of_op(dep->on.what))] = 1;
      }
    }
  }
}

// The processors of each stage (with traced stages, only those of its block's traced ranks) and
// each one's runs of one unit in the stage's order (stable: runs of equal position keep theirs).
inline void plan_runs(stage_plan& p, const graph::task_graph& g) {
  const stage_geometry& geo = p.geometry;
  const std::size_t np = p.processors;
  p.present.assign(static_cast<std::size_t>(geo.pp) * np, 0);
  p.runs.assign(static_cast<std::size_t>(geo.pp) * np, {});
  for (int s = 0; s < geo.pp; ++s) {
    for (graph::processor_id q = 0; q < np; ++q) {
      const int rank = g.processors[q].rank;
      if (geo.traced_pp > 1 && rank >= 0 && geo.traced_stage(rank) != geo.source_stage(s)) continue;
      p.present[static_cast<std::size_t>(s) * np + q] = 1;
      const auto& list = p.on[q];
      auto& runs = p.runs[static_cast<std::size_t>(s) * np + q];
      for (std::size_t x = 0; x < list.size();) {
        std::size_t y = x;
        while (y < list.size() && p.unit_of(list[y]) == p.unit_of(list[x])) ++y;
        runs.push_back({static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(y), p.unit_of(list[x])});
        x = y;
      }
      std::stable_sort(runs.begin(), runs.end(), [&](const stage_run& a, const stage_run& c) { return p.pos(s, a.unit) < p.pos(s, c.unit); });
    }
  }
}

// With traced stages, a host synchronization waits for what its thread enqueued before it in the
// new order, not in the traced one: a synchronize after a traced receive waited for the pass the
// traced schedule ran before it (torch.cuda.synchronize() drains every stream). Each traced
// edge from a stream op its own thread launched into a synchronization is re-targeted to the
// last op the thread has launched on that stream by then on the stage (none: dropped). An edge
// from an op another thread launched (the backward's, on the autograd thread) in another pass
// is re-targeted to the last op of the stream in the passes the stage runs before the
// synchronization's.
inline void plan_resync(stage_plan& p, const graph::task_graph& g) {
  using graph::task_id;
  using graph::no_task;
  const std::size_t n = p.tasks, np = p.processors;
  const int pp = p.geometry.pp;
  if (p.geometry.traced_pp <= 1) return;
  // Each stage's processors' tasks in their new order.
  std::vector<std::vector<task_id>> emitted(static_cast<std::size_t>(pp) * np);
  for (int s = 0; s < pp; ++s) {
    for (graph::processor_id q = 0; q < np; ++q) {
      const std::size_t at = static_cast<std::size_t>(s) * np + q;
      for (const stage_run& r : p.runs[at]) {
        for (std::uint32_t z = r.begin; z < r.end; ++z) {
          if (p.kept[static_cast<std::size_t>(s)][p.on[q][z]]) emitted[at].push_back(p.on[q][z]);
        }
      }
    }
  }
  std::vector<task_id> launched_by(n, no_task);
  std::vector<std::vector<task_id>> launches_of(n);
  std::vector<std::vector<std::size_t>> sync_in(n), sync_other(n);
  for (std::size_t x = 0; x < g.edges.size(); ++x) {
    const graph::edge& e = g.edges[x];
    if (e.kind == graph::edge_kind::launch) launched_by[e.to] = e.from, launches_of[e.from].push_back(e.to);
  }
  for (std::size_t x = 0; x < g.edges.size(); ++x) {
    const graph::edge& e = g.edges[x];
    if (e.kind != graph::edge_kind::sync || launched_by[e.from] == no_task) continue;
    if (g.processor[launched_by[e.from]] == g.processor[e.to]) {
      sync_in[e.to].push_back(x);
    } else if (p.unit_of(e.from) != p.unit_of(e.to)) {
      sync_other[e.to].push_back(x);
    }
  }
  for (int s = 0; s < pp; ++s) {
    for (graph::processor_id q = 0; q < np; ++q) {
      const auto pk = g.processors[q].kind;
      if (pk == graph::processor_kind::gpu_stream || pk == graph::processor_kind::barrier) continue;
      std::unordered_map<graph::processor_id, task_id> last;  // per stream: the last op launched on it
      for (const task_id y : emitted[static_cast<std::size_t>(s) * np + q]) {
        for (const std::size_t x : sync_in[y]) {
          const auto it = last.find(g.processor[g.edges[x].from]);
          p.resync[{s, x}] = it == last.end() ? no_task : it->second;
        }
        for (const std::size_t x : sync_other[y]) {
          // The stream's tasks on the stage run in the order of their passes.
          const auto& on_stream = emitted[static_cast<std::size_t>(s) * np + g.processor[g.edges[x].from]];
          const std::int64_t at = p.pos(s, p.unit_of(y));
          const auto end = std::partition_point(on_stream.begin(), on_stream.end(), [&](task_id t) { return p.pos(s, p.unit_of(t)) < at; });
          p.resync[{s, x}] = end == on_stream.begin() ? no_task : *(end - 1);
        }
        for (task_id z : launches_of[y]) {
          if (!p.copies(s, z, g)) continue;
          // A communication op is waited for at its complete, beside its arrive on the stream.
          if (g.kind[z] == graph::task_kind::comm_arrive && z + 1 < n && g.processor[z + 1] == g.processor[z]) ++z;
          last[g.processor[z]] = z;
        }
      }
    }
  }
}

// The cross-stage transfers the schedule needs, per traced rank, consumer stage and op in its
// order: those within a traced stage's block (every one with `cross_blocks`; the others are the
// traced transfers, kept). With traced stages, the sender is the traced rank of the same column on
// the producing block's stage (none traced: no transfer).
inline void plan_transfers(stage_plan& p, const trace::job& job) {
  const stage_geometry& geo = p.geometry;
  const pipeline::schedule_shape shape{geo.pp, geo.micro_batches, geo.vp};
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    for (int consumer = 0; consumer < geo.pp; ++consumer) {
      for (const pipeline::op& o : p.orders[static_cast<std::size_t>(consumer)]) {
        const auto dep = pipeline::dependency_of(shape, consumer, o);
        if (!dep || !dep->crosses_stages(consumer) || geo.source_stage(consumer) != geo.stage_of[i]) continue;
        if (!geo.cross_blocks && geo.source_stage(dep->on.stage) != geo.source_stage(consumer)) continue;
        planned_transfer x;
        x.i = x.i_from = i, x.from = dep->on.stage, x.to = consumer;
        if (geo.traced_pp > 1 && geo.source_stage(dep->on.stage) != geo.stage_of[i]) {
          const auto it = geo.index_of_rank.find(geo.source_stage(dep->on.stage) * geo.traced_width + job.ranks[i].rank % geo.traced_width);
          if (it == geo.index_of_rank.end()) continue;
          x.i_from = it->second;
        }
        x.from_unit = geo.unit_of_op(dep->on.what), x.to_unit = geo.unit_of_op(o);
        x.chunk = dep->on.what.chunk;
        x.forward = o.kind == pipeline::op_kind::forward;
        p.transfers.push_back(x);
      }
    }
  }
}

}  // namespace detail

/// Plans splitting `b`'s graph (of a job whose structure is `st`) for `target`, without editing
/// it: see the header comment and `stage_plan`. Throws `lumos::error` when
/// `stage_split_unsupported` says why, when the target lacks what it needs (the layer count of a
/// layer change, the weight gradients of a zero-bubble schedule, the repeated layers of merged
/// stages), when a processor's passes are not in pass order, or when a traced rank has no layer
/// kernels or launches. O(tasks × stages + edges) time and memory, plus the sort of each
/// processor's runs.
[[nodiscard]] inline stage_plan plan_stages(const graph::built_job& b, const trace::job& job, const job_structure& st,
                                            const stage_split_target& target) {
  if (target.layer_copies != nullptr && target.layers_to <= 0) throw error("whatif --pp: a layer change needs its layer count");
  const int micro_batches = target.remap != nullptr ? target.remap->to : 0;
  if (const std::string why = stage_split_unsupported(st, target.pp, target.vp, target.schedule, micro_batches, &job, target.layers_to);
      !why.empty()) {
    throw error("whatif --pp: " + why);
  }
  if (target.schedule.splits_backward && target.weight == nullptr) {
    throw error("whatif --pp: a zero-bubble schedule needs the weight-gradient kernels");
  }
  if (st.parallel.pp.value.value_or(1) > target.pp && target.layer_copies == nullptr) {
    throw error("whatif --pp: merging stages needs the kept stages' layers repeated first (layer_copies)");
  }
  const graph::task_graph& g = b.graph;
  stage_plan p;
  p.geometry = stage_geometry_of(job, st, target);
  p.tasks = g.task_count(), p.processors = g.processors.size();
  p.on.assign(p.processors, {});
  for (graph::task_id t = 0; t < p.tasks; ++t) p.on[g.processor[t]].push_back(t);
  const detail::split_task_copies copies = detail::compose_task_copies(p.tasks, target);
  detail::plan_pass_codes(p, b, job, st, copies, target);
  detail::plan_layers(p, st, copies, target);
  detail::plan_everywhere(p, b, job, st, copies);
  if (p.geometry.zero_bubble) detail::plan_weight_collectives(p, g);
  detail::plan_inserted_layers(p, g);
  detail::plan_virtual_stages(p, g);
  detail::plan_join_stages(p, g);
  detail::plan_kept(p, g);
  detail::plan_rank_processors(p, g, job, st, copies);
  detail::plan_orders(p);
  detail::plan_runs(p, g);
  detail::plan_resync(p, g);
  detail::plan_transfers(p, job);
  return p;
}

}  // namespace lumos::whatif

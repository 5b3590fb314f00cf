#pragma once
// The layer-count what-if (`lumos whatif --layers N`): the task groups of each transformer layer
// that structure discovery found (its launch calls and GPU ops, in every pass of every rank)
// become repeat groups — each layer repeated or removed in place so that every chunk of every
// stage holds N/L times its layers — with the joins of the collectives inside the layer, so that
// a copied tensor-parallel all-reduce is again joined across its ranks.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/stage_geometry.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace lumos::whatif {

/// The repeat groups for `layers` transformer layers, and what they do.
struct layer_rewrite {
  std::vector<repeat_group> groups;
  whatif::change change;
};

namespace detail {

/// Each layer's tasks merged over the tensor-parallel ranks of a stage, keyed by (stage, chunk,
/// pass kind, micro-batch, layer), and the layers each (stage, chunk) holds.
struct merged_layers {
  using key = std::tuple<int, int, int, int, int>;  // stage, chunk, kind, micro-batch, layer
  std::map<key, std::set<graph::task_id>> tasks;
  std::map<std::pair<int, int>, int> per_chunk;  // (stage, chunk) → layers
};

/// The layer task groups of `st` merged per stage: tensor-parallel ranks of one stage run the
/// same layer together, joined by its collectives.
[[nodiscard]] inline merged_layers merge_layer_groups(const job_structure& st) {
  auto stage_of = [&](int rank) {
    for (const auto& r : st.ranks) {
      if (r.rank == rank && r.stage.known()) return *r.stage.value;
    }
    return 0;
  };
  merged_layers out;
  for (const auto& lg : st.layer_groups) {
    const int stage = stage_of(lg.rank);
    auto& set = out.tasks[{stage, lg.op.chunk, static_cast<int>(lg.op.kind), lg.op.micro_batch, lg.layer}];
    set.insert(lg.tasks.begin(), lg.tasks.end());
    auto& n = out.per_chunk[{stage, lg.op.chunk}];
    n = std::max(n, lg.layer + 1);
  }
  return out;
}

/// How many times layer `layer` of a chunk holding `lc` of the `total` layers runs with `layers`
/// layers in all: Nc / Lc times, the first Nc mod Lc layers once more (Nc = N·Lc/L), or with
/// fewer layers 1 for the first Nc and 0 for the rest. Throws when N does not divide the same way.
[[nodiscard]] inline int layer_copy_count(int layers, int total, int lc, int layer, int stage, int chunk) {
  if ((static_cast<long long>(layers) * lc) % total != 0) {
    throw error("whatif --layers " + std::to_string(layers) + ": stage " + std::to_string(stage) + " chunk " + std::to_string(chunk) +
                " holds " + std::to_string(lc) + " of the " + std::to_string(total) + " layers; " + std::to_string(layers) +
                " layers do not divide over the stages and chunks the same way");
  }
  const int nc = static_cast<int>(static_cast<long long>(layers) * lc / total);
  return nc >= lc ? nc / lc + (layer < nc % lc ? 1 : 0) : (layer < nc ? 1 : 0);
}

/// Grows a layer's tasks to all that must be repeated with it, over one graph: its indexes
/// (processor order, edges both ways, collectives by their completes) are built once for every
/// layer.
class layer_closure {
 public:
  explicit layer_closure(const graph::task_graph& g) : g_(g), n_(g.task_count()) {
    on_.resize(g.processors.size());
    for (graph::task_id t = 0; t < n_; ++t) on_[g.processor[t]].push_back(t);
    for (const auto& ci : g.collectives) {
      for (const graph::task_id c : ci.complete) collective_of_[c] = &ci;
    }
    out_begin_.assign(n_ + 1, 0), in_begin_.assign(n_ + 1, 0);
    for (const graph::edge& e : g.edges) ++out_begin_[e.from + 1], ++in_begin_[e.to + 1];
    for (std::size_t i = 0; i < n_; ++i) out_begin_[i + 1] += out_begin_[i], in_begin_[i + 1] += in_begin_[i];
    out_to_.resize(g.edges.size()), in_from_.resize(g.edges.size());
    std::vector<std::uint32_t> fo(out_begin_.begin(), out_begin_.end() - 1), fi(in_begin_.begin(), in_begin_.end() - 1);
    for (const graph::edge& e : g.edges) out_to_[fo[e.from]++] = e.to, in_from_[fi[e.to]++] = e.from;
    next_on_.assign(n_, graph::no_task), prev_on_.assign(n_, graph::no_task);
    for (const auto& list : on_) {
      for (std::size_t i = 1; i < list.size(); ++i) next_on_[list[i - 1]] = list[i], prev_on_[list[i]] = list[i - 1];
    }
    forward_.assign(n_, 0), backward_.assign(n_, 0);
  }

  /// `tasks`, each communication op's arrive, and the join and every participant of its
  /// collective, grown by `grow`.
  [[nodiscard]] std::set<graph::task_id> of(const std::set<graph::task_id>& tasks) {
    std::set<graph::task_id> all(tasks.begin(), tasks.end());
    for (const graph::task_id t : tasks) {
      if (t > 0 && g_.kind[t - 1] == graph::task_kind::comm_arrive && g_.processor[t - 1] == g_.processor[t]) all.insert(t - 1);
      if (const auto it = collective_of_.find(t); it != collective_of_.end()) {
        if (it->second->join != graph::no_task) all.insert(it->second->join);
        all.insert(it->second->arrive.begin(), it->second->arrive.end());
        all.insert(it->second->complete.begin(), it->second->complete.end());
      }
    }
    // On each processor, everything from the group's first task to its last (work between a
    // layer's launches travels with it); and a task of another processor that the layer both
    // feeds and waits for (a hand-off to a helper thread and back, a side-stream kernel between
    // two of its own) is part of it, so that no edge runs from a later copy back to an earlier
    // one. Repeated until nothing is added.
    for (bool grew = true; grew;) {
      const bool spanned = fill_processor_spans(all);
      grew = add_enclosed(all) || spanned;
    }
    return all;
  }

 private:
  /// Adds every task between the first and the last of `all` on each processor; whether any was new.
  bool fill_processor_spans(std::set<graph::task_id>& all) const {
    bool grew = false;
    std::map<graph::processor_id, std::pair<graph::task_id, graph::task_id>> span;
    for (const graph::task_id t : all) {
      auto [it, fresh] = span.try_emplace(g_.processor[t], t, t);
      if (!fresh) it->second = {std::min(it->second.first, t), std::max(it->second.second, t)};
    }
    for (const auto& [p, range] : span) {
      const auto& list = on_[p];
      for (auto it = std::lower_bound(list.begin(), list.end(), range.first); it != list.end() && *it <= range.second; ++it) {
        grew = all.insert(*it).second || grew;
      }
    }
    return grew;
  }

  /// Adds the tasks between two parts of `all`: reachable from it and reaching it (through edges
  /// and processor order), searched within its measured time span; whether any was new.
  bool add_enclosed(std::set<graph::task_id>& all) {
    bool grew = false;
    time_ns lo = std::numeric_limits<time_ns>::max(), hi = std::numeric_limits<time_ns>::min();
    for (const graph::task_id t : all) lo = std::min(lo, g_.observed_start[t]), hi = std::max(hi, g_.observed_end[t]);
    ++stamp_;
    std::vector<graph::task_id> queue(all.begin(), all.end());
    for (const graph::task_id t : queue) forward_[t] = stamp_;
    for (std::size_t q = 0; q < queue.size(); ++q) {
      const graph::task_id t = queue[q];
      auto visit = [&](graph::task_id u) {
        if (forward_[u] != stamp_ && g_.observed_start[u] <= hi) forward_[u] = stamp_, queue.push_back(u);
      };
      for (std::uint32_t x = out_begin_[t]; x < out_begin_[t + 1]; ++x) visit(out_to_[x]);
      if (next_on_[t] != graph::no_task) visit(next_on_[t]);
    }
    queue.assign(all.begin(), all.end());
    for (const graph::task_id t : queue) backward_[t] = stamp_;
    for (std::size_t q = 0; q < queue.size(); ++q) {
      const graph::task_id t = queue[q];
      auto visit = [&](graph::task_id u) {
        if (backward_[u] != stamp_ && g_.observed_end[u] >= lo) backward_[u] = stamp_, queue.push_back(u);
      };
      for (std::uint32_t x = in_begin_[t]; x < in_begin_[t + 1]; ++x) visit(in_from_[x]);
      if (prev_on_[t] != graph::no_task) visit(prev_on_[t]);
    }
    for (const graph::task_id t : queue) {
      if (forward_[t] == stamp_) grew = all.insert(t).second || grew;
    }
    return grew;
  }

  const graph::task_graph& g_;
  std::size_t n_;
  std::vector<std::vector<graph::task_id>> on_;  // tasks of each processor, in order
  std::map<graph::task_id, const graph::collective_instance*> collective_of_;
  std::vector<std::uint32_t> out_begin_, in_begin_;  // edges by source and by target
  std::vector<graph::task_id> out_to_, in_from_;
  std::vector<graph::task_id> next_on_, prev_on_;  // processor order
  std::vector<std::uint32_t> forward_, backward_;  // search marks, by `stamp_`
  std::uint32_t stamp_ = 0;
};

/// The `changes` record of `layers_to`: `groups` layer task groups of `total` -> `layers`
/// layers, `owner` the group of each task (-1: none).
[[nodiscard]] inline change layer_count_change(const graph::task_graph& g, const job_structure& st, const std::vector<int>& owner,
                                               int total, int layers, std::size_t groups, std::size_t copies, std::size_t removed) {
  // How much of the GPU work the layers found hold: the rest (embedding, head, optimizer,
  // gradient collectives, and any layer work no group took, e.g. a backward without markers
  // whose kernels do not repeat the forward's block) keeps its time whatever the layer count.
  time_ns gpu = 0, in_layers = 0;
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (graph::is_gpu(g.kind[t])) gpu += g.duration[t], in_layers += owner[t] >= 0 ? g.duration[t] : 0;
  }
  char line[640];
  std::snprintf(line, sizeof line,
                "layers %d -> %d: %zu layer task groups (layer x pass x stage, tensor-parallel ranks together) from %s, holding "
                "%.1f %% of the GPU op time; %zu layer copies added, %zu layers removed; each copy keeps the layer's measured "
                "kernels, launches and overheads",
                total, layers, groups, st.layers_method.known() ? st.layers_method.value->c_str() : "structure discovery",
                gpu > 0 ? 100.0 * static_cast<double>(in_layers) / static_cast<double>(gpu) : 0.0, copies, removed);
  return changed("layers", "layers", std::to_string(total), std::to_string(layers), line,
                 {count_figure("layer task groups", groups), count_figure("layer copies added", copies),
                  count_figure("layers removed", removed)});
}

}  // namespace detail

/// Builds the groups (see the header comment). Layer k of a chunk with Lc layers is repeated
/// Nc / Lc times, the first Nc mod Lc layers once more (Nc = N·Lc/L); with fewer layers, the last
/// Lc − Nc layers are removed. On every processor a group spans from its first to its last task
/// there (work between a layer's launches — event records, syncs — travels with it). Throws
/// `lumos::error` when the traces' layers are unknown, N does not divide over the chunks, or two
/// layers interleave on a processor.
[[nodiscard]] inline layer_rewrite layers_to(const graph::built_job& b, const job_structure& st, int layers) {
  if (layers <= 0) throw error("whatif --layers: the layer count must be positive (got " + std::to_string(layers) + ")");
  if (!st.model.layers.known() || st.layer_groups.empty()) {
    throw error("whatif --layers: the traces' transformer layers were not found (" + st.model.layers.source +
                "); `lumos inspect --structure` shows what was found");
  }
  const int total = *st.model.layers.value;
  // Dense layers beside MoE ones (DeepSeek's first layers): which kind the target adds or drops
  // is the model's choice, which the traces do not tell.
  if (const auto mixed = mixed_layers(st)) {
    throw error("whatif --layers " + std::to_string(layers) + ": the traces mix dense and MoE layers (" + std::to_string(mixed->first) +
                " MoE of " + std::to_string(mixed->second) + " layers per pass on rank 0): which kind the target's layers add or remove "
                "is not told by the traces");
  }
  const graph::task_graph& g = b.graph;
  const detail::merged_layers merged = detail::merge_layer_groups(st);
  detail::layer_closure closure(g);
  layer_rewrite out;
  std::vector<int> owner(g.task_count(), -1);
  std::size_t copies = 0, removed = 0;
  for (const auto& [k, tasks] : merged.tasks) {
    const auto [stage, chunk, kind, micro, layer] = k;
    const int count = detail::layer_copy_count(layers, total, merged.per_chunk.at({stage, chunk}), layer, stage, chunk);
    repeat_group rg;
    for (const graph::task_id t : closure.of(tasks)) {
      if (owner[t] >= 0) {
        throw error("whatif --layers: layers interleave on " + g.processors[g.processor[t]].name + " (at " + g.describe(t) +
                    "): they cannot be repeated in place");
      }
      owner[t] = static_cast<int>(out.groups.size());
      rg.tasks.push_back(t);
    }
    rg.count = static_cast<std::size_t>(count);
    copies += count > 1 ? static_cast<std::size_t>(count - 1) : 0;
    removed += count == 0;
    out.groups.push_back(std::move(rg));
  }
  out.change = detail::layer_count_change(g, st, owner, total, layers, out.groups.size(), copies, removed);
  return out;
}

/// The notes of a repeat: edges out of removed tasks moved or dropped (`pass` made it).
[[nodiscard]] inline change_list repeat_notes(const std::string& pass, const edited_graph& e) {
  change_list out;
  if (e.edges_bridged > 0) {
    out.push_back(note(pass, "edges", std::to_string(e.edges_bridged) +
                                          " edges out of removed tasks moved to the last kept task before them on their processor"));
  }
  if (e.edges_dropped > 0) {
    out.push_back(note(pass, "edges",
                       std::to_string(e.edges_dropped) + " edges of removed tasks dropped (their processors still order the rest)"));
  }
  return out;
}

/// Pass: the layer count (`--layers`), each layer repeated or removed in place (`layers_to`); and,
/// for a split into fewer stages than traced, each kept traced stage's layers repeated to its
/// merged block's count (the split drops the other stages). Not when the pipeline change is made
/// by the pass-level model, which takes the layer count itself. Sets `ctx.layer_copies` (the
/// structure stays that of the graph before the copies: the later passes map through them).
struct layers_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept {
    const whatif_options& o = ctx.options;
    const split_choice& s = ctx.split;
    return (o.layers || s.merging) && (s.in_graph || !(o.pipeline_asked() || (ctx.micro_batches && s.staged)));
  }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    // Discovered again when DP rewrote the graph (its maps follow the rewritten tasks); not after
    // gradient buckets were inserted, whose structure holds them in their layers.
    std::optional<job_structure> fresh;
    if (ctx.options.dp && !ctx.buckets_inserted) fresh = discover_structure(ctx.job, b, ctx.discovery_options());
    const job_structure& st = fresh ? *fresh : ctx.structure(b);
    change_list out;
    std::vector<repeat_group> groups;
    if (ctx.split.merging) {
      groups = merged_stage_layers(ctx, b, st, out);
    } else {
      layer_rewrite lr = layers_to(b, st, *ctx.options.layers);
      groups = std::move(lr.groups);
      out.push_back(std::move(lr.change));
    }
    if (groups.empty()) return out;
    edited_graph e = repeat_groups(b.graph, groups);
    change_list notes = repeat_notes("layers", e);
    out.insert(out.end(), notes.begin(), notes.end());
    ctx.layer_copies = adopt(b, std::move(e));
    return out;
  }

  /// Each kept traced stage runs its block's layers: the model's layers over the target's stages,
  /// which is what `layers_to` makes of them x (traced stages / target stages) over the traced
  /// stages. The stages the split drops are left as they are.
  [[nodiscard]] static std::vector<repeat_group> merged_stage_layers(context& ctx, const graph::built_job& b, const job_structure& st,
                                                                     change_list& out) {
    const job_structure& current = ctx.structure(b);
    const int traced_pp = ctx.traced_pp(), split_pp = ctx.split.pp, split_layers = ctx.split.layers;
    const int k = traced_pp / split_pp;
    layer_rewrite lr = layers_to(b, st, split_layers * k);
    const int per_stage = *current.parallel.world.value / traced_pp;
    std::vector<std::uint8_t> kept_stage(static_cast<std::size_t>(traced_pp), 0);
    for (int s = 0; s < split_pp; ++s) kept_stage[static_cast<std::size_t>(merge_source_stage(traced_pp, split_pp, s))] = 1;
    std::erase_if(lr.groups, [&](const repeat_group& g) {
      // A group is one stage's (its joins have no rank).
      const auto t = std::find_if(g.tasks.begin(), g.tasks.end(), [&](graph::task_id x) { return b.graph.rank[x] >= 0; });
      if (t == g.tasks.end()) return true;
      const auto stage = static_cast<std::size_t>(b.graph.rank[*t] / per_stage);
      return stage >= kept_stage.size() || !kept_stage[stage];
    });
    const int traced_per_stage = *current.model.layers.value / traced_pp;
    out.push_back(changed("layers", "layers per stage", std::to_string(traced_per_stage), std::to_string(split_layers / split_pp),
                          "PP " + std::to_string(traced_pp) + " -> " + std::to_string(split_pp) + ": the layers of each kept traced stage (" +
                              std::to_string(traced_per_stage) + ") repeated in place to " + std::to_string(split_layers / split_pp) +
                              ", the stage's share of " + std::to_string(split_layers) + " layers over " + std::to_string(split_pp) +
                              " stages (" + std::to_string(lr.groups.size()) +
                              " layer task groups); each copy keeps the layer's measured kernels, launches and overheads",
                          {count_figure("layer task groups", lr.groups.size())}));
    return std::move(lr.groups);
  }
};
static_assert(Rewrite<layers_pass>);

}  // namespace lumos::whatif

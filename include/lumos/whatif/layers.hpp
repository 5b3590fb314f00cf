#pragma once
// The layer-count what-if (`lumos whatif --layers N`): the task groups of each transformer layer
// that structure discovery found (its launch calls and GPU ops, in every pass of every rank)
// become repeat groups — each layer repeated or removed in place so that every chunk of every
// stage holds N/L times its layers — with the joins of the collectives inside the layer, so that
// a copied tensor-parallel all-reduce is again joined across its ranks.

#include <lumos/core/error.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/whatif/editor.hpp>
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

/// The repeat groups for `layers` transformer layers, and a sentence saying what they do.
struct layer_rewrite {
  std::vector<repeat_group> groups;
  std::string change;
};

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
  const graph::task_graph& g = b.graph;
  // Layers per (stage, chunk) and the merged groups per (stage, layer, pass): tensor-parallel
  // ranks of one stage run the same layer together, joined by its collectives.
  auto stage_of = [&](int rank) {
    for (const auto& r : st.ranks) {
      if (r.rank == rank && r.stage.known()) return *r.stage.value;
    }
    return 0;
  };
  using key = std::tuple<int, int, int, int, int>;  // stage, chunk, kind, micro-batch, layer
  std::map<key, std::set<graph::task_id>> merged;
  std::map<std::pair<int, int>, int> per_chunk;  // (stage, chunk) → layers
  for (const auto& lg : st.layer_groups) {
    const int stage = stage_of(lg.rank);
    auto& set = merged[{stage, lg.op.chunk, static_cast<int>(lg.op.kind), lg.op.micro_batch, lg.layer}];
    set.insert(lg.tasks.begin(), lg.tasks.end());
    auto& n = per_chunk[{stage, lg.op.chunk}];
    n = std::max(n, lg.layer + 1);
  }
  // Processor of each task, tasks of each processor (in order), collectives by their completes.
  std::vector<std::vector<graph::task_id>> on(g.processors.size());
  for (graph::task_id t = 0; t < g.task_count(); ++t) on[g.processor[t]].push_back(t);
  std::map<graph::task_id, const graph::collective_instance*> collective_of;
  for (const auto& ci : g.collectives) {
    for (const graph::task_id c : ci.complete) collective_of[c] = &ci;
  }

  // Adjacency for the searches below: edges by source and by target, and processor order.
  const std::size_t n = g.task_count();
  std::vector<std::uint32_t> out_begin(n + 1, 0), in_begin(n + 1, 0);
  for (const graph::edge& e : g.edges) ++out_begin[e.from + 1], ++in_begin[e.to + 1];
  for (std::size_t i = 0; i < n; ++i) out_begin[i + 1] += out_begin[i], in_begin[i + 1] += in_begin[i];
  std::vector<graph::task_id> out_to(g.edges.size()), in_from(g.edges.size());
  {
    std::vector<std::uint32_t> fo(out_begin.begin(), out_begin.end() - 1), fi(in_begin.begin(), in_begin.end() - 1);
    for (const graph::edge& e : g.edges) out_to[fo[e.from]++] = e.to, in_from[fi[e.to]++] = e.from;
  }
  std::vector<graph::task_id> next_on(n, graph::no_task), prev_on(n, graph::no_task);
  for (const auto& list : on) {
    for (std::size_t i = 1; i < list.size(); ++i) next_on[list[i - 1]] = list[i], prev_on[list[i]] = list[i - 1];
  }
  std::vector<std::uint32_t> forward(n, 0), backward(n, 0);
  std::uint32_t stamp = 0;

  layer_rewrite out;
  std::vector<int> owner(g.task_count(), -1);
  std::size_t copies = 0, removed = 0;
  for (const auto& [k, tasks] : merged) {
    const auto [stage, chunk, kind, micro, layer] = k;
    const int lc = per_chunk[{stage, chunk}];
    if ((static_cast<long long>(layers) * lc) % total != 0) {
      throw error("whatif --layers " + std::to_string(layers) + ": stage " + std::to_string(stage) + " chunk " + std::to_string(chunk) +
                  " holds " + std::to_string(lc) + " of the " + std::to_string(total) + " layers; " + std::to_string(layers) +
                  " layers do not divide over the stages and chunks the same way");
    }
    const int nc = static_cast<int>(static_cast<long long>(layers) * lc / total);
    const int count = nc >= lc ? nc / lc + (layer < nc % lc ? 1 : 0) : (layer < nc ? 1 : 0);
    repeat_group rg;
    std::set<graph::task_id> all(tasks.begin(), tasks.end());
    // A communication op's arrive, and the join and every participant of its collective.
    for (const graph::task_id t : tasks) {
      if (t > 0 && g.kind[t - 1] == graph::task_kind::comm_arrive && g.processor[t - 1] == g.processor[t]) all.insert(t - 1);
      if (const auto it = collective_of.find(t); it != collective_of.end()) {
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
      grew = false;
      std::map<graph::processor_id, std::pair<graph::task_id, graph::task_id>> span;
      for (const graph::task_id t : all) {
        auto [it, fresh] = span.try_emplace(g.processor[t], t, t);
        if (!fresh) it->second = {std::min(it->second.first, t), std::max(it->second.second, t)};
      }
      for (const auto& [p, range] : span) {
        const auto& list = on[p];
        for (auto it = std::lower_bound(list.begin(), list.end(), range.first); it != list.end() && *it <= range.second; ++it) {
          grew = all.insert(*it).second || grew;
        }
      }
      // Tasks between two parts of the layer: reachable from it and reaching it (through edges
      // and processor order), searched within the layer's measured time span.
      time_ns lo = std::numeric_limits<time_ns>::max(), hi = std::numeric_limits<time_ns>::min();
      for (const graph::task_id t : all) lo = std::min(lo, g.observed_start[t]), hi = std::max(hi, g.observed_end[t]);
      ++stamp;
      std::vector<graph::task_id> queue(all.begin(), all.end());
      for (const graph::task_id t : queue) forward[t] = stamp;
      for (std::size_t q = 0; q < queue.size(); ++q) {
        const graph::task_id t = queue[q];
        auto visit = [&](graph::task_id u) {
          if (forward[u] != stamp && g.observed_start[u] <= hi) forward[u] = stamp, queue.push_back(u);
        };
        for (std::uint32_t x = out_begin[t]; x < out_begin[t + 1]; ++x) visit(out_to[x]);
        if (next_on[t] != graph::no_task) visit(next_on[t]);
      }
      queue.assign(all.begin(), all.end());
      for (const graph::task_id t : queue) backward[t] = stamp;
      for (std::size_t q = 0; q < queue.size(); ++q) {
        const graph::task_id t = queue[q];
        auto visit = [&](graph::task_id u) {
          if (backward[u] != stamp && g.observed_end[u] >= lo) backward[u] = stamp, queue.push_back(u);
        };
        for (std::uint32_t x = in_begin[t]; x < in_begin[t + 1]; ++x) visit(in_from[x]);
        if (prev_on[t] != graph::no_task) visit(prev_on[t]);
      }
      for (const graph::task_id t : queue) {
        if (forward[t] == stamp) grew = all.insert(t).second || grew;
      }
    }
    for (const graph::task_id t : all) {
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
                total, layers, out.groups.size(), st.layers_method.known() ? st.layers_method.value->c_str() : "structure discovery",
                gpu > 0 ? 100.0 * static_cast<double>(in_layers) / static_cast<double>(gpu) : 0.0, copies, removed);
  out.change = line;
  return out;
}

}  // namespace lumos::whatif

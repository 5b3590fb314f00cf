#pragma once
// Structure facet: pipeline stages, from the chains (or rings) the point-to-point partners form.

#include <lumos/pipeline/schedule.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// Whether rank `ri` computes a forward pass before its first transfer: stage 0 does; every
/// other stage receives first.
[[nodiscard]] inline bool first_p2p_after_forward(const discovery_inputs& in, const job_structure& out, std::size_t ri) {
  for (const auto& l : in.ranks[ri].launches) {
    if (l.p2p) return false;
    if (l.pass >= 0 && out.ranks[ri].passes[static_cast<std::size_t>(l.pass)].op.kind == pipeline::op_kind::forward && !l.comm) {
      return true;
    }
  }
  return false;
}

/// The peer of rank `ri`'s first point-to-point transfer, or -1.
[[nodiscard]] inline int first_partner(const discovery_inputs& in, std::size_t ri) {
  for (const auto& l : in.ranks[ri].launches) {
    if (!l.p2p) continue;
    for (const int r : in.participants(l.instance)) {
      if (r != in.job.ranks[ri].rank) return r;
    }
  }
  return -1;
}

/// The ranks of `comp` (one component of the partner graph) in stage order, or empty with a
/// note when they form neither a chain nor a ring, when not exactly one of them can be stage 0,
/// or when the walk from it does not reach them all. Sets `ring` for a ring.
[[nodiscard]] inline std::vector<int> walk_stages(const discovery_inputs& in, const job_structure& out, const std::vector<int>& comp,
                                                  std::map<int, std::set<int>>& partners, bool& ring,
                                                  std::vector<std::string>& notes) {
  const std::string members = "ranks " + join_ints(comp);
  std::size_t ends = 0;
  bool shaped = true;
  for (const int r : comp) {
    const auto d = partners[r].size();
    ends += d == 1 ? 1 : 0;
    shaped = shaped && d <= 2;
  }
  ring = shaped && ends == 0 && comp.size() > 2;
  if (!shaped || (!ring && ends != 2)) {
    notes.push_back("point-to-point partners of " + members + " form neither a chain nor a ring: pipeline stages unknown");
    return {};
  }
  std::vector<int> starts;
  for (const int r : comp) {
    const auto it = in.index_of_rank.find(r);
    if ((ring || partners[r].size() == 1) && it != in.index_of_rank.end() && first_p2p_after_forward(in, out, it->second)) {
      starts.push_back(r);
    }
  }
  if (starts.size() != 1) {
    notes.push_back("pipeline of " + members + ": " + std::to_string(starts.size()) +
                    " ranks compute a forward pass before their first transfer (stage 0 must be the only one): stages unknown");
    return {};
  }
  std::vector<int> order = {starts[0]};
  int prev = -1, at = starts[0];
  if (ring) {
    const int next = first_partner(in, in.rank_index(at));
    prev = at;
    at = next;
    if (at >= 0) order.push_back(at);
  }
  while (order.size() < comp.size() && at >= 0) {
    int next = -1;
    for (const int n : partners[at]) {
      if (n != prev && std::find(order.begin(), order.end(), n) == order.end()) next = n;
    }
    if (next < 0) break;
    prev = at, at = next;
    order.push_back(at);
  }
  if (order.size() != comp.size()) {
    notes.push_back("pipeline of " + members + ": could not walk the stages from stage 0");
    return {};
  }
  return order;
}

/// The partners of every rank from the matched point-to-point transfers, and the ranks whose
/// send/recv ops found no peer in the job.
inline void read_partners(const discovery_inputs& in, pipeline_topology& topo) {
  const graph::task_graph& g = in.built.graph;
  for (std::size_t c = 0; c < g.collectives.size(); ++c) {
    if (!in.is_p2p(static_cast<int>(c))) continue;
    const auto ranks = in.participants(static_cast<int>(c));
    topo.partners[ranks[0]].insert(ranks[1]);
    topo.partners[ranks[1]].insert(ranks[0]);
  }
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const trace::rank_trace& t = in.job.ranks[ri];
    for (const auto& l : in.ranks[ri].launches) {
      if (l.comm && l.instance < 0 && comm_kind(t.name(t.events[l.op]), t.arg_text(l.op, trace::arg_key::collective_name)) == "sendrecv" &&
          !context_parallel_description(t.arg_text(l.op, trace::arg_key::process_group_desc))) {
        topo.unmatched_p2p.insert(t.rank);
      }
    }
  }
}

}  // namespace detail

/// Fills each rank's `p2p_partners` and `stage`, and `in.topology`: each component of the
/// graph of point-to-point partners is one pipeline (a TP slice of one DP replica), a chain or
/// a ring walked from the one rank that computes a forward pass before its first transfer.
/// A rank with no transfer is stage 0; one whose transfers found no peer, or whose component
/// could not be walked (with a note), is unknown. Runs after `discover_passes`. Linear in
/// launches and collectives.
inline void discover_stages(discovery_inputs& in, job_structure& out) {
  detail::pipeline_topology& topo = in.topology;
  detail::read_partners(in, topo);
  for (auto& rs : out.ranks) {
    if (const auto it = topo.partners.find(rs.rank); it != topo.partners.end()) rs.p2p_partners.assign(it->second.begin(), it->second.end());
    rs.stage.flag = "--pp";
  }
  std::set<int> seen;
  for (const auto& [r0, nbrs] : topo.partners) {
    if (seen.count(r0)) continue;
    std::vector<int> comp;
    std::vector<int> todo = {r0};
    seen.insert(r0);
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      comp.push_back(r);
      for (const int n : topo.partners[r]) {
        if (seen.insert(n).second) todo.push_back(n);
      }
    }
    std::sort(comp.begin(), comp.end());
    bool ring = false;
    std::vector<int> order = detail::walk_stages(in, out, comp, topo.partners, ring, out.notes);
    if (order.empty()) continue;
    (ring ? topo.ring : topo.chain) = true;
    topo.pipelines.push_back(std::move(order));
  }
  for (const auto& order : topo.pipelines) {
    for (std::size_t s = 0; s < order.size(); ++s) {
      auto& rs = out.ranks[in.rank_index(order[s])];
      rs.stage.value = static_cast<int>(s);
      rs.stage.source = "position in the chain of point-to-point partners " + detail::join_ints(order) +
                        (order.size() > 2 && topo.partners[order.front()].count(order.back()) ? " (a ring)" : "") +
                        " (stage 0 computes a forward before its first transfer)";
    }
  }
  for (auto& rs : out.ranks) {
    if (rs.stage.known()) continue;
    if (topo.partners.count(rs.rank) == 0 && topo.unmatched_p2p.count(rs.rank) == 0) {
      rs.stage.value = 0;
      rs.stage.source = "no point-to-point transfers on this rank";
    } else if (rs.stage.source.empty()) {
      rs.stage.source = topo.unmatched_p2p.count(rs.rank) ? "send/recv ops whose peers are absent from the job" : "see notes";
    }
  }
}

}  // namespace lumos::whatif

#pragma once
// What the model-shape rewrite (whatif/shape.hpp) reads of a job's process groups and
// collectives before it rescales: the groups that carry gradients, which ranks reduce their
// gradient buckets inside the layers, the tied embedding's all-reduce, sequence parallelism.

#include <lumos/graph/task_graph.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lumos::whatif::detail {

/// Per process group name: whether it carries gradients (it has the DP role and not TP's).
[[nodiscard]] inline std::map<std::string, bool> gradient_groups(const job_structure& st) {
  std::map<std::string, bool> out;
  for (const auto& pg : st.groups) {
    bool dp = false, tp = false;
    for (const auto& r : pg.roles) {
      dp = dp || (r.value && *r.value == group_role::dp);
      tp = tp || (r.value && *r.value == group_role::tp);
    }
    out[pg.name] = dp && !tp;
  }
  return out;
}

/// The expert-data-parallel groups of `st`: groups with the DP role whose name or description
/// says expert.
[[nodiscard]] inline std::set<std::string> expert_dp_groups(const job_structure& st) {
  std::set<std::string> out;
  for (const auto& pg : st.groups) {
    const bool dp = std::any_of(pg.roles.begin(), pg.roles.end(), [](const auto& r) { return r.value == group_role::dp; });
    if (dp && (lower(pg.name).find("expert") != std::string::npos || lower(pg.description).find("expert") != std::string::npos ||
               pg.name.starts_with("edp."))) {
      out.insert(pg.name);
    }
  }
  return out;
}

/// Per rank of `job`: whether it reduces its gradient buckets inside the backward's layers
/// (Megatron's overlap_grad_reduce), where they travel with their layers: a collective of a
/// gradient group (`gradient_groups`) in a layer of a backward pass.
[[nodiscard]] inline std::vector<std::uint8_t> buckets_in_layers(const trace::job& job, const job_structure& st,
                                                                 const std::map<std::string, bool>& gradient_group) {
  std::vector<std::uint8_t> out(job.ranks.size(), 0);
  for (const gpu_op_context& c : st.gpu_ops) {
    if (!c.comm || c.p2p || c.phase != phase_kind::backward || c.layer < 0) continue;
    const auto known = gradient_group.find(std::string(job.ranks[c.rank].arg_text(c.op, trace::arg_key::process_group_name)));
    if (known != gradient_group.end() && known->second) out[c.rank] = 1;
  }
  return out;
}

/// Tells the tied embedding's gradient all-reduce (Megatron's EMBEDDING_GROUP): a collective of
/// a group with no TP, DP or world role whose members sit on more than one pipeline stage. It
/// runs after the backward and carries the embedding's gradients, V/TP × hidden per rank; its
/// group size is no TP size even when the two coincide.
class tied_embedding_test {
 public:
  tied_embedding_test(const trace::job& job, const job_structure& st) {
    for (const auto& pg : st.groups) {
      for (const auto& r : pg.roles) {
        if (r.value && (*r.value == group_role::tp || *r.value == group_role::dp || *r.value == group_role::world)) {
          has_role_.insert(pg.name);
        }
      }
    }
    for (std::size_t ri = 0; ri < job.ranks.size() && ri < st.ranks.size(); ++ri) {
      if (st.ranks[ri].stage.value) stage_of_rank_[job.ranks[ri].rank] = *st.ranks[ri].stage.value;
    }
  }

  /// Whether `ci`, a collective of `g`, is the tied embedding's all-reduce.
  [[nodiscard]] bool operator()(const graph::task_graph& g, const graph::collective_instance& ci) const {
    if (has_role_.count(ci.group) || ci.kind == "sendrecv" || ci.kind == "send_recv") return false;
    std::set<int> stages;
    for (const graph::task_id c : ci.complete) {
      if (const auto it = stage_of_rank_.find(g.rank[c]); it != stage_of_rank_.end()) stages.insert(it->second);
    }
    return stages.size() > 1;
  }

 private:
  std::set<std::string> has_role_;   // groups with a TP, DP or world role
  std::map<int, int> stage_of_rank_;  // by the traces' rank number
};

/// Whether the traces run sequence parallelism: a reduce-scatter inside the forward passes.
[[nodiscard]] inline bool forward_reduce_scatter(const trace::job& job, const job_structure& st) {
  for (const auto& c : st.gpu_ops) {
    const auto& tr = job.ranks[c.rank];
    if (c.comm && !c.p2p && c.phase == phase_kind::forward &&
        comm_kind(tr.name(tr.events[c.op]), tr.arg_text(c.op, trace::arg_key::collective_name)) == "reducescatter") {
      return true;
    }
  }
  return false;
}

/// Each collective instance of `g`, by the complete task of each of its participants.
[[nodiscard]] inline std::map<graph::task_id, const graph::collective_instance*> collectives_by_complete(const graph::task_graph& g) {
  std::map<graph::task_id, const graph::collective_instance*> out;
  for (const auto& ci : g.collectives) {
    for (const graph::task_id c : ci.complete) out[c] = &ci;
  }
  return out;
}

}  // namespace lumos::whatif::detail

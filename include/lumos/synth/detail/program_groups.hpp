#pragma once
// program_builder: the per-stage plan (the last gradient op of each chunk, reserved capacity)
// and the process groups (TP, DP, p2p, norm, tied embedding) with their placement and joins.

#include <lumos/synth/detail/program_builder.hpp>

namespace lumos::synth::detail {

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::plan_stages() {
  final_grad_.assign(static_cast<std::size_t>(pp_), {});
  const pipeline::op_kind grad_kind = split_ ? pipeline::op_kind::weight : pipeline::op_kind::backward;
  for (int s = 0; s < pp_; ++s) {
    const auto& order = (*orders_)[static_cast<std::size_t>(s)];
    auto& flags = final_grad_[static_cast<std::size_t>(s)];
    flags.assign(order.size(), 0);
    std::vector<int> last(static_cast<std::size_t>(shape_.chunks), -1);
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order[i].kind == grad_kind) last[static_cast<std::size_t>(order[i].chunk)] = static_cast<int>(i);
    }
    for (const int i : last) {
      if (i >= 0) flags[static_cast<std::size_t>(i)] = 1;
    }
  }
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::reserve() {
  // Tasks and edges, counted from the templates (exact up to joins, buckets and the tail), so
  // that the big arrays are allocated once and no more than needed.
  const int virtual_stages = pp_ * shape_.chunks;
  std::size_t tasks = 0, edges = 0;
  for (int s = 0; s < pp_; ++s) {
    std::size_t t = 64, e = 64;
    for (const pipeline::op& o : (*orders_)[static_cast<std::size_t>(s)]) {
      const int vs = o.chunk * pp_ + s;
      const std::size_t k = static_cast<std::size_t>(
          o.kind == pipeline::op_kind::forward ? pass_kind::forward
          : o.kind == pipeline::op_kind::weight ? pass_kind::weight_grad
          : split_                              ? pass_kind::input_grad
                                                : pass_kind::backward);
      const totals& tot = pass_totals_[k][vs == 0][vs == virtual_stages - 1];
      if (opt_.detail == granularity::kernel) {
        t += 2 * static_cast<std::size_t>(tot.compute_kernels) + 4 * static_cast<std::size_t>(tot.comm_kernels);
        e += static_cast<std::size_t>(tot.compute_kernels) + 3 * static_cast<std::size_t>(tot.comm_kernels);
      } else {
        t += 6;
        e += 4;
      }
      if (pp_ > 1) {
        t += 8;  // receive and send: launch, arrive, complete each, and a join per pair
        e += 8;
      }
    }
    tasks += t * (opt_.unfold ? static_cast<std::size_t>(tp_ * dp_) : 1);
    edges += e * (opt_.unfold ? static_cast<std::size_t>(tp_ * dp_) : 1);
  }
  g_->processor.reserve(tasks);
  g_->kind.reserve(tasks);
  g_->duration.reserve(tasks);
  g_->idle_gap.reserve(tasks);
  g_->busy_gap.reserve(tasks);
  g_->name.reserve(tasks);
  g_->rank.reserve(tasks);
  g_->source.reserve(tasks);
  g_->observed_start.reserve(tasks);
  g_->observed_end.reserve(tasks);
  g_->edges.reserve(edges);
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::build_groups() {
  // Dense ids: tp (pp·dp groups), dp (pp·tp), act and grad channels (pp·tp·dp each: the
  // sender's stage and column), gradient-norm (dp replicas, or one world group under ZeRO),
  // tied-embedding (tp·dp columns).
  tp_base_ = 0;
  dp_base_ = tp_base_ + pp_ * dp_;
  act_base_ = dp_base_ + pp_ * tp_;
  grad_base_ = act_base_ + pp_ * tp_ * dp_;
  norm_base_ = grad_base_ + pp_ * tp_ * dp_;
  embd_base_ = norm_base_ + dp_;
  groups_.clear();
  group_slot_.assign(static_cast<std::size_t>(embd_base_ + tp_ * dp_), -1);
}

template <model::ComputeModel Compute, model::CommModel Comm>
group_state& program_builder<Compute, Comm>::group(group_type type, int a, int b) {
  int id = 0;
  switch (type) {
    case group_type::tp: id = tp_base_ + a * dp_ + b; break;          // a = stage, b = dp index
    case group_type::dp: id = dp_base_ + a * tp_ + b; break;          // a = stage, b = tp index
    case group_type::act: id = act_base_ + a * tp_ * dp_ + b; break;  // a = sender stage, b = column
    case group_type::grad: id = grad_base_ + a * tp_ * dp_ + b; break;
    case group_type::norm: id = norm_base_ + (par_.zero_stage >= 1 ? 0 : a); break;  // a = dp index
    case group_type::embd: id = embd_base_ + a; break;                // a = column
  }
  std::int32_t& slot = group_slot_[static_cast<std::size_t>(id)];
  if (slot < 0) {
    slot = static_cast<std::int32_t>(groups_.size());
    group_state& made = groups_.emplace_back();
    made.id = id;
    init_group(made, type, a, b);
  }
  group_state& gs = groups_[static_cast<std::size_t>(slot)];
  return gs;
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::init_group(group_state& gs, group_type type, int a, int b) {
  gs.ready = true;
  switch (type) {
    case group_type::tp:
      gs.type = comm_group::tp;
      gs.name = "tp." + std::to_string(a) + "." + std::to_string(b);
      for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(a, b * tp_ + t));
      gs.participants = opt_.unfold ? tp_ : 1;
      break;
    case group_type::dp:
      gs.type = comm_group::dp;
      gs.name = "dp." + std::to_string(a) + "." + std::to_string(b);
      for (int d = 0; d < dp_; ++d) gs.ranks.push_back(global_rank(a, d * tp_ + b));
      gs.participants = opt_.unfold ? dp_ : 1;
      break;
    case group_type::act:
    case group_type::grad: {
      const int to = (a + 1) % pp_;
      gs.type = comm_group::pp;
      gs.name = std::string(type == group_type::act ? "pp.fwd." : "pp.bwd.") + std::to_string(a) + "-" +
                std::to_string(to) + "." + std::to_string(b);
      if (type == group_type::act) {
        gs.ranks = {global_rank(a, b), global_rank(to, b)};
      } else {
        gs.ranks = {global_rank(to, b), global_rank(a, b)};
      }
      gs.participants = 2;
      break;
    }
    case group_type::norm:
      gs.type = par_.zero_stage >= 1 ? comm_group::world : comm_group::model_parallel;
      if (par_.zero_stage >= 1) {
        gs.name = "world";
        for (int r = 0; r < world_; ++r) gs.ranks.push_back(r);
        gs.participants = opt_.unfold ? world_ : pp_;
      } else {
        gs.name = "mp." + std::to_string(a);
        for (int s = 0; s < pp_; ++s) {
          for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(s, a * tp_ + t));
        }
        gs.participants = opt_.unfold ? tp_ * pp_ : pp_;
      }
      break;
    case group_type::embd:
      gs.type = comm_group::embedding;
      gs.name = "embd." + std::to_string(a);
      gs.ranks = {global_rank(0, a), global_rank(pp_ - 1, a)};
      gs.participants = 2;
      break;
  }
  gs.placement = placement_of(gs.ranks, hw_);
}

}  // namespace lumos::synth::detail

#pragma once
// program_builder: the per-stage plan (the last gradient op of each chunk, the expected size,
// where each op's input comes from) and the process groups (TP, DP, p2p, norm, tied embedding)
// with their placement and joins.

#include <lumos/graph/graph_size.hpp>
#include <lumos/synth/detail/program_builder.hpp>

namespace lumos::synth::detail {

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::keep_forwards(stage_orders& orders) {
  for (auto& o : orders) {
    std::erase_if(o, [](const pipeline::op& x) { return x.kind != pipeline::op_kind::forward; });
  }
}

// What every build needs before the first task: names, pass templates, groups, stage plan.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::prepare() {
  intern_names();
  build_templates();
  build_groups();
  // The stage plan depends on the orders alone, which the schedule, the shape and forward_only
  // decide: a build of the same as the last one's keeps its plan.
  const program_buffers::plan_key key{policy_.orders, shape_, opt_.forward_only};
  if (!(buf_.planned == key)) {
    buf_.planned = {};
    plan_stages();
    plan_senders();
    buf_.planned = key;
  }
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::plan_stages() {
  if (final_grad_.size() < static_cast<std::size_t>(pp_)) final_grad_.resize(static_cast<std::size_t>(pp_));
  const pipeline::op_kind grad_kind = split_ ? pipeline::op_kind::weight : pipeline::op_kind::backward;
  std::vector<std::int32_t>& last = buf_.last_grad;
  for (int s = 0; s < pp_; ++s) {
    const auto& order = (*orders_)[static_cast<std::size_t>(s)];
    auto& flags = final_grad_[static_cast<std::size_t>(s)];
    flags.assign(order.size(), 0);
    last.assign(static_cast<std::size_t>(shape_.chunks), -1);
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order[i].kind == grad_kind) last[static_cast<std::size_t>(order[i].chunk)] = static_cast<std::int32_t>(i);
    }
    for (const std::int32_t i : last) {
      if (i >= 0) flags[static_cast<std::size_t>(i)] = 1;
    }
  }
}

// Tasks and edges, counted from the templates (exact up to joins, buckets and the tail), so
// that the big arrays are allocated once and no more than needed.
template <model::ComputeModel Compute, model::CommModel Comm>
std::pair<std::size_t, std::size_t> program_builder<Compute, Comm>::expected_size() const {
  const int virtual_stages = pp_ * shape_.chunks;
  std::size_t tasks = 0, edges = 0;
  for (int s = 0; s < pp_; ++s) {
    std::size_t t = 64, e = 64;
    for (const pipeline::op& o : (*orders_)[static_cast<std::size_t>(s)]) {
      const int vs = o.chunk * pp_ + s;
      const auto k = static_cast<std::size_t>(pass_of(o));
      const chunk_plan* dc = chunk_plan_of(s, o);
      const totals& tot = dc != nullptr ? dc->passes[k] : pass_totals_[k][vs == 0][vs == virtual_stages - 1];
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
  return {tasks, edges};
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::reserve_graph() {
  const auto [tasks, edges] = expected_size();
  graph::check_graph_size(static_cast<double>(tasks), static_cast<double>(edges),
                          "the iteration's graph (" + std::to_string(m_.layers) + " layers, " + std::to_string(shape_.micro_batches) +
                              " micro-batches per pipeline, " + std::string(opt_.detail == granularity::kernel ? "kernel" : "op") + " detail)");
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

// For each op of each stage's order, the op on another stage that sends its input (stage,
// index in that stage's order), for `input_sent`.
template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::plan_senders() {
  const auto v = static_cast<std::size_t>(shape_.chunks), m = static_cast<std::size_t>(shape_.micro_batches);
  const auto slot = [&](int stage, const pipeline::op& o) {
    return (static_cast<std::size_t>(stage) * 3 + static_cast<std::size_t>(o.kind)) * v * m + static_cast<std::size_t>(o.chunk) * m +
           static_cast<std::size_t>(o.micro_batch);
  };
  buf_.op_index.assign(3 * v * m * static_cast<std::size_t>(pp_), -1);
  buf_.stage_ops.assign(static_cast<std::size_t>(pp_) + 1, 0);
  for (int s = 0; s < pp_; ++s) {
    const auto& order = (*orders_)[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < order.size(); ++i) buf_.op_index[slot(s, order[i])] = static_cast<std::int32_t>(i);
    buf_.stage_ops[static_cast<std::size_t>(s) + 1] = buf_.stage_ops[static_cast<std::size_t>(s)] + order.size();
  }
  buf_.sender.clear();
  buf_.receiver.assign(buf_.stage_ops.back(), {-1, -1});
  for (int s = 0; s < pp_; ++s) {
    const auto& order = (*orders_)[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto dep = pipeline::dependency_of(shape_, s, order[i]);
      if (!dep || !dep->crosses_stages(s)) {
        buf_.sender.emplace_back(-1, -1);
        continue;
      }
      const std::int32_t from = buf_.op_index[slot(dep->on.stage, dep->on.what)];
      buf_.sender.emplace_back(dep->on.stage, from);
      if (from >= 0) {
        buf_.receiver[buf_.stage_ops[static_cast<std::size_t>(dep->on.stage)] + static_cast<std::size_t>(from)] = {
            s, static_cast<std::int32_t>(i)};
      }
    }
  }
}

// Whether the next op of `rs` may be emitted: it takes no input from another stage, or the op
// that sends it (on the same column of the sending stage) has been emitted.
template <model::ComputeModel Compute, model::CommModel Comm>
bool program_builder<Compute, Comm>::input_sent(const rank_state& rs) const {
  const auto [stage, index] = buf_.sender[buf_.stage_ops[static_cast<std::size_t>(rs.info.stage)] + rs.next_op];
  if (index < 0) return true;  // no input to wait for, or a sender that never runs the op
  const int sender = opt_.unfold ? global_rank(stage, rs.col) : stage;
  return static_cast<std::size_t>(index) < buf_.ranks[static_cast<std::size_t>(sender)].next_op;
}

// Whether the stage that receives the output of `rs`'s next op (if another does) has posted
// that receive: it has emitted every op before the one that consumes it.
template <model::ComputeModel Compute, model::CommModel Comm>
bool program_builder<Compute, Comm>::output_posted(const rank_state& rs) const {
  const auto [stage, index] = buf_.receiver[buf_.stage_ops[static_cast<std::size_t>(rs.info.stage)] + rs.next_op];
  if (index < 0) return true;
  const int receiver = opt_.unfold ? global_rank(stage, rs.col) : stage;
  return static_cast<std::size_t>(index) <= buf_.ranks[static_cast<std::size_t>(receiver)].next_op;
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
  edp_base_ = embd_base_ + tp_ * dp_;  // expert-data-parallel: pp·etp·ep groups (MoE only)
  // HSDP: shard groups (pp·tp·replicas) and replica groups (pp·tp·shard); FSDP without hybrid
  // sharding shards over the dp groups. Context-parallel rings: pp·tp·(dp / cp) groups.
  shard_base_ = edp_base_ + (m_.is_moe() ? pp_ * expert_grid() : 0);
  const bool hybrid = fsdp_ && replicas_ > 1;
  replica_base_ = shard_base_ + (hybrid ? pp_ * tp_ * replicas_ : 0);
  cp_base_ = replica_base_ + (hybrid ? pp_ * tp_ * shard_ : 0);
  // Expert-parallel groups (MoE): pp·tp·dp / ep (EP may exceed DP where expert TP < TP);
  // expert-tensor-parallel ones of their own: pp·tp·dp / etp.
  ep_base_ = cp_base_ + (par_.cp > 1 ? pp_ * tp_ * (dp_ / par_.cp) : 0);
  etp_base_ = ep_base_ + (m_.is_moe() && par_.ep > 1 ? pp_ * (tp_ * dp_ / par_.ep) : 0);
  buf_.groups_used = 0;
  group_slot_.assign(static_cast<std::size_t>(etp_base_ + (own_expert_tp() ? pp_ * tp_ * dp_ / par_.expert_tp() : 0)), -1);
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
    case group_type::edp: id = edp_base_ + a * expert_grid() + b; break;  // a = stage, b = column mod etp·ep
    case group_type::shard: id = shard_base_ + a * tp_ * replicas_ + b; break;  // b = replica · tp + tp index
    case group_type::replica: id = replica_base_ + a * tp_ * shard_ + b; break;  // b = dp index mod shard · tp + tp index
    case group_type::cp: id = cp_base_ + a * tp_ * (dp_ / par_.cp) + b; break;  // b = dp index / cp · tp + tp index
    case group_type::ep: id = ep_base_ + a * (tp_ * dp_ / par_.ep) + b; break;  // b = column / (etp · ep) · etp + column mod etp
    case group_type::etp: id = etp_base_ + a * (tp_ * dp_ / par_.expert_tp()) + b; break;  // b = column / etp
  }
  std::int32_t& slot = group_slot_[static_cast<std::size_t>(id)];
  if (slot < 0) {
    // The deque's groups past `groups_used` are earlier builds': made again in place.
    slot = static_cast<std::int32_t>(buf_.groups_used++);
    if (groups_.size() < buf_.groups_used) groups_.emplace_back();
    group_state& made = groups_[static_cast<std::size_t>(slot)];
    made.reset();
    made.id = id;
    init_group(made, type, a, b);
  }
  group_state& gs = groups_[static_cast<std::size_t>(slot)];
  return gs;
}

template <model::ComputeModel Compute, model::CommModel Comm>
void program_builder<Compute, Comm>::init_group(group_state& gs, group_type type, int a, int b) {
  gs.ready = true;
  // Names are for processor names and collective records only.
  const bool named = opt_.names || opt_.record_collectives;
  switch (type) {
    case group_type::tp:
      gs.type = comm_group::tp;
      if (named) gs.name = "tp." + std::to_string(a) + "." + std::to_string(b);
      for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(a, b * tp_ + t));
      gs.participants = opt_.unfold ? tp_ : 1;
      break;
    case group_type::dp:
      gs.type = comm_group::dp;
      if (named) gs.name = "dp." + std::to_string(a) + "." + std::to_string(b);
      for (int d = 0; d < dp_; ++d) gs.ranks.push_back(global_rank(a, d * tp_ + b));
      gs.participants = opt_.unfold ? dp_ : 1;
      break;
    case group_type::act:
    case group_type::grad: {
      const int to = (a + 1) % pp_;
      gs.type = comm_group::pp;
      if (named) {
        gs.name = std::string(type == group_type::act ? "pp.fwd." : "pp.bwd.") + std::to_string(a) + "-" +
                  std::to_string(to) + "." + std::to_string(b);
      }
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
        if (named) gs.name = "world";
        for (int r = 0; r < world_; ++r) gs.ranks.push_back(r);
        gs.participants = opt_.unfold ? world_ : pp_;
      } else {
        if (named) gs.name = "mp." + std::to_string(a);
        for (int s = 0; s < pp_; ++s) {
          for (int t = 0; t < tp_; ++t) gs.ranks.push_back(global_rank(s, a * tp_ + t));
        }
        gs.participants = opt_.unfold ? tp_ * pp_ : pp_;
      }
      break;
    case group_type::edp:
      // The ranks holding the same expert shard in the folded expert grid: columns b, b + etp·ep, ...
      gs.type = comm_group::expert_dp;
      if (named) gs.name = "edp." + std::to_string(a) + "." + std::to_string(b);
      for (int c = b; c < tp_ * dp_; c += expert_grid()) gs.ranks.push_back(global_rank(a, c));
      gs.participants = opt_.unfold ? par_.expert_data_parallel() : 1;
      break;
    case group_type::shard:
    case group_type::replica: {
      // A shard group: the `shard_` consecutive dp ranks of replica b / tp; a replica group: the
      // dp ranks at b / tp of each shard group (the same shard of the states).
      const bool shard = type == group_type::shard;
      const int t = b % tp_, j = b / tp_;
      gs.type = comm_group::dp;
      if (named) gs.name = std::string(shard ? "fsdp.shard." : "fsdp.replica.") + std::to_string(a) + "." + std::to_string(b);
      const int n = shard ? shard_ : replicas_;
      for (int i = 0; i < n; ++i) gs.ranks.push_back(global_rank(a, (shard ? j * shard_ + i : i * shard_ + j) * tp_ + t));
      gs.participants = opt_.unfold ? n : 1;
      break;
    }
    case group_type::cp:
    case group_type::ep: {
      // n ranks of one block of n·stride consecutive columns, `stride` apart: Megatron's
      // context-parallel group (its order: tp, cp, dp, pp: stride tp) or expert-parallel group
      // (the folded expert grid's order: etp, ep, edp: stride etp).
      const bool cp = type == group_type::cp;
      const int n = cp ? par_.cp : par_.ep, stride = cp ? tp_ : par_.expert_tp(), t = b % stride, j = b / stride;
      gs.type = cp ? comm_group::context_parallel : comm_group::ep;
      if (named) gs.name = std::string(cp ? "cp." : "ep.") + std::to_string(a) + "." + std::to_string(b);
      for (int c = 0; c < n; ++c) gs.ranks.push_back(global_rank(a, (j * n + c) * stride + t));
      gs.participants = opt_.unfold ? n : 1;
      break;
    }
    case group_type::etp:
      // etp consecutive columns of the folded expert grid: the ranks splitting each expert's width.
      gs.type = comm_group::expert_tp;
      if (named) gs.name = "etp." + std::to_string(a) + "." + std::to_string(b);
      for (int c = 0; c < par_.expert_tp(); ++c) gs.ranks.push_back(global_rank(a, b * par_.expert_tp() + c));
      gs.participants = opt_.unfold ? par_.expert_tp() : 1;
      break;
    case group_type::embd:
      gs.type = comm_group::embedding;
      if (named) gs.name = "embd." + std::to_string(a);
      gs.ranks = {global_rank(0, a), global_rank(pp_ - 1, a)};
      gs.participants = 2;
      break;
  }
  gs.placement = model::placement_of(gs.ranks, hw_, buf_.nodes);
}

}  // namespace lumos::synth::detail

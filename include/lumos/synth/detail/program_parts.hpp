#pragma once
// The program builder's parts that are not the builder: a pass's items and their totals (what
// the `pass` granularity folds), gradient segments, group placement and per-group state.

#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/synth/detail/direct_sink.hpp>
#include <lumos/synth/job.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::synth {

namespace detail {

/// Which pass of a chunk an emission stands for: forward, split input gradient, split weight
/// gradient, or the whole backward of schedules that do not split it.
enum class pass_kind : std::uint8_t { forward, input_grad, weight_grad, backward };

[[nodiscard]] constexpr std::string_view collective_kind_name(model::collective c) noexcept {
  switch (c) {
    case model::collective::all_reduce: return "allreduce";
    case model::collective::all_gather: return "allgather";
    case model::collective::reduce_scatter: return "reduce_scatter";
    case model::collective::all_to_all: return "alltoall";
    case model::collective::broadcast: return "broadcast";
  }
  return "?";
}

/// One step of a pass on the compute stream: a compute op or a TP collective.
struct item {
  bool comm = false;
  time_ns duration = 0;
  time_ns cpu = 0;  ///< host time before it is queued (dispatch + launch)
  string_id name = 0;
  std::int32_t kernels = 1;
  model::collective kind = model::collective::all_reduce;
  std::int64_t bytes = 0;
  std::int64_t element_bytes = 2;  ///< collectives: bytes per element
  std::uint32_t op = program_notes::none;  ///< compute: index into `program_notes::ops`
  bool recompute = false;
  /// A transfer on a stream of its own that runs beside the next item (context parallelism's
  /// ring exchange beside its attention): the item after that one waits for it.
  bool beside = false;
  /// Compute: the launching thread waits for this item's kernels (and all before them) to finish
  /// before it goes on (`model::op_cost::host_sync`).
  bool host_sync = false;
  /// A collective over the rank's expert-parallel group (MoE token dispatch), not its TP group.
  bool expert_parallel = false;
  /// A collective over the rank's expert-tensor-parallel group where that is not its TP group
  /// (the MoE token copies' all-gather and reduce-scatter under --expert-tp < --tp).
  bool expert_tp = false;
  /// A collective over the rank's context-parallel group (the all-gather variant's K/V
  /// all-gather and dK/dV reduce-scatter), not its TP group.
  bool context_parallel = false;
};

/// A span of a pass after which weight gradients of `params` parameters are final (a layer,
/// the head, the embedding).
struct segment {
  const std::vector<item>* items = nullptr;
  std::int64_t params = 0;
};

/// Totals of a run of items, for the `pass` granularity.
/// `cpu` and `lead` make a run of items exact as one task when the launching thread starts the
/// run at time c and the stream is free at g: item i is queued at c + C_i (C_i: host time up to
/// and including item i) and the kernel-level stream finishes at
///   max(g + G, c + max_i (C_i + G_i..n)) = max(g + G, c + lead + G),  lead = max_i (C_i - G_<i),
/// with G the run's GPU time and G_<i the GPU time before item i (max-plus algebra: per-item
/// launch edges and a FIFO stream). So the folded task gets a launch edge of `lead`.
struct totals {
  time_ns compute = 0;
  std::int32_t compute_kernels = 0;
  time_ns comm = 0;
  std::int32_t comm_kernels = 0;
  std::int64_t comm_bytes = 0;
  time_ns cpu = 0;
  time_ns lead = std::numeric_limits<time_ns>::min();

  /// A `beside` item counts as a collective of the part the next item does not hide,
  /// max(0, its duration - the next item's), after that item: exact when both start together
  /// (the stream busy when they are launched), an upper bound otherwise (the transfer, launched
  /// first, may start earlier).
  void add(const std::vector<item>& items, std::int64_t times = 1) {
    for (std::int64_t r = 0; r < times; ++r) {
      time_ns beside = -1;  // the duration of a `beside` item the next item runs with
      for (const item& i : items) add_one(i, beside);
    }
  }
  /// One item of a run; `beside` carries the duration of a `beside` item to the next item
  /// (start a run with -1).
  void add_one(const item& i, time_ns& beside) {
    cpu += i.cpu;
    lead = std::max(lead, cpu - compute - comm);
    if (i.beside) {
      beside = i.duration;
      comm_kernels += i.kernels;
      comm_bytes += i.bytes;
      return;
    }
    if (i.comm) {
      comm += i.duration;
      comm_kernels += i.kernels;
      comm_bytes += i.bytes;
    } else {
      compute += i.duration;
      compute_kernels += i.kernels;
    }
    if (beside >= 0) {
      comm += std::max<time_ns>(0, beside - i.duration);
      beside = -1;
    }
  }
};

/// A virtual stage whose passes the builder's shared templates (by first / last virtual stage)
/// do not describe: one that holds some of a MoE model's dense first layers
/// (`model::moe_spec::first_dense_layers`), or any under an explicit pipeline layout
/// (`model::parallel_config::layout`). Its layers, its passes' totals and its gradient buckets
/// (the dense layers' parameters all reduced over the data-parallel group).
struct chunk_plan {
  int dense = 0;                         ///< dense layers of the chunk (its first ones)
  int layers = 0;                        ///< layers of the chunk, the dense ones included
  std::array<totals, 4> passes{};        ///< [pass kind] → totals of the chunk's pass
  std::vector<std::pair<int, std::int64_t>> buckets, expert_buckets;
  std::int64_t params = 0;               ///< parameters of the chunk on a rank
};

using model::placement_of;

// The op lists of a compute model, into `out`: through the model's allocation-free overload
// (`layer(m, p, hw, out)`, ...) when it has one, which a caller that keeps `out` between builds
// relies on to allocate nothing.
template <class C>
void layer_ops(const C& c, const model::transformer& m, const model::parallel_config& p, const model::hardware& hw,
               model::op_list& out) {
  if constexpr (requires { c.layer(m, p, hw, out); }) {
    c.layer(m, p, hw, out);
  } else {
    out = c.layer(m, p, hw);
  }
}
template <class C>
void embedding_ops(const C& c, const model::transformer& m, const model::parallel_config& p, const model::hardware& hw,
                   model::op_list& out) {
  if constexpr (requires { c.embedding(m, p, hw, out); }) {
    c.embedding(m, p, hw, out);
  } else {
    out = c.embedding(m, p, hw);
  }
}
template <class C>
void head_ops(const C& c, const model::transformer& m, const model::parallel_config& p, const model::hardware& hw,
              model::op_list& out) {
  if constexpr (requires { c.head(m, p, hw, out); }) {
    c.head(m, p, hw, out);
  } else {
    out = c.head(m, p, hw);
  }
}
template <class C>
void optimizer_ops(const C& c, const model::transformer& m, const model::parallel_config& p, const model::hardware& hw,
                   int stage, model::op_list& out) {
  if constexpr (requires { c.optimizer(m, p, hw, stage, out); }) {
    c.optimizer(m, p, hw, stage, out);
  } else {
    out = c.optimizer(m, p, hw, stage);
  }
}

/// A process group of the job, created when first used.
struct group_state {
  bool ready = false;
  std::int64_t id = 0;  ///< dense id (program_builder::group): the owner of its barrier
  comm_group type = comm_group::tp;
  std::string name;
  std::vector<int> ranks;  ///< global ranks of all members
  int participants = 1;    ///< members present in the graph
  model::group_placement placement;
  graph::processor_id barrier = no_processor;
  bool barrier_folded = false;  ///< compiled program: joins folded, their barrier not made (counted)
  std::vector<graph::task_id> joins;       ///< by sequence (participants > 1)
  std::vector<std::uint32_t> instances;    ///< by sequence (when recording)
  // Compiled program: the arrives of each sequence ([k · participants + i], `arrived[k]` of
  // them), which the completes take when the join is folded (compiled_program); `joins[k]` is
  // then `folded_join`.
  std::vector<graph::task_id> arrives;
  std::vector<std::uint32_t> arrived;
  static constexpr graph::task_id folded_join = graph::no_task - 1;
  // Compiled program: pipeline sends that came before their receive was posted, in sequence
  // order from `queued_head`; each is added once its receiver arrives (nothing but later sends
  // on its stream and the final sync follow a send, so nothing waits for it meanwhile).
  struct queued_send {
    std::size_t seq = 0;
    graph::processor_id stream = 0;
    launch_ref launch;
    graph::task_id after = graph::no_task;
    time_ns duration = 0;
  };
  std::vector<queued_send> queued;
  std::size_t queued_head = 0;
  /// The last durations priced on this group (FSDP's per-unit collectives come in a few sizes,
  /// every micro-batch): (collective kind, bytes) → ns, replaced round-robin.
  struct priced {
    int kind = -1;
    std::int64_t bytes = -1;
    time_ns duration = 0;
  };
  std::array<priced, 6> prices{};
  std::uint8_t next_price = 0;

  /// Back to a group not yet made, keeping the capacity of its lists.
  void reset() {
    ready = false;
    id = 0;
    type = comm_group::tp;
    name.clear();
    ranks.clear();
    participants = 1;
    placement = {};
    barrier = no_processor;
    barrier_folded = false;
    joins.clear();
    instances.clear();
    arrives.clear();
    arrived.clear();
    queued.clear();
    queued_head = 0;
    prices = {};
    next_price = 0;
  }
};

/// The two tasks of one participant of a collective.
struct collective_tasks {
  graph::task_id arrive = graph::no_task;
  graph::task_id complete = graph::no_task;
};

/// How a GPU task is launched: `cpu` ns of host time before it is queued, a launch edge of
/// `lead` from the launching call's start. `before_last`: at the `pass` granularity, its launch
/// goes before the last one batched (a collective queued behind the compute task whose host
/// time covers both, see `program_builder::emit_totals`).
struct launch_spec {
  time_ns cpu = 0;
  time_ns lead = 0;
  bool before_last = false;
};

/// A list of task handles that is filled and emptied over and over (the start edges or host
/// waits the next task takes: a handful): its storage only grows, so that pushing is a store
/// and a compare.
class task_list {
 public:
  task_list() : items_(8) {}
  [[gnu::always_inline]] void push_back(graph::task_id t) {
    if (size_ == items_.size()) [[unlikely]] grow();
    items_[size_++] = t;
  }
  void clear() noexcept { size_ = 0; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const graph::task_id* begin() const noexcept { return items_.data(); }
  [[nodiscard]] const graph::task_id* end() const noexcept { return items_.data() + size_; }
  // NOLINTNEXTLINE(google-explicit-constructor): a list is a span of its tasks
  operator std::span<const graph::task_id>() const noexcept { return {items_.data(), size_}; }

 private:
  std::vector<graph::task_id> items_;  // its first size_ are the list
  std::size_t size_ = 0;

  [[gnu::noinline]] void grow() { items_.resize(2 * items_.size()); }
};

/// What the builder keeps of one simulated rank while it emits it, op by op.
struct rank_state {
  simulated_rank info;
  std::int64_t seq_tp = 0, seq_dp = 0, seq_act_out = 0, seq_act_in = 0, seq_grad_out = 0, seq_grad_in = 0;
  std::int64_t seq_norm = 0, seq_embd = 0, seq_edp = 0;
  std::int64_t seq_replica = 0;  ///< FSDP's hybrid-sharding replica group
  std::int64_t seq_cp = 0;       ///< context parallelism's ring exchange or all-gather
  std::int64_t seq_ep = 0;       ///< expert parallelism's token dispatch
  std::int64_t seq_etp = 0;      ///< expert tensor parallelism's token copies (own group)
  task_list pending;  ///< start edges into the next compute-stream task
  task_list waits;    ///< host waits folded into the next CPU task (compiled)
  graph::task_id last_compute = graph::no_task;
  graph::task_id last_dp = graph::no_task;
  struct pending_launch {
    graph::task_id gpu;
    time_ns cpu;   ///< host time of its dispatch
    time_ns lead;  ///< launch edge, relative to the start of its dispatch
  };
  std::vector<pending_launch> launches;  ///< batched (pass granularity, task graph)
  std::vector<graph::task_id> cpu_tasks;  ///< its CPU tasks in order (with notes)
  // The batch's launching CPU task in a compiled program: made before the first GPU task it
  // launches, its length (the batch's host time) set when the batch is flushed.
  graph::task_id launcher = graph::no_task;
  time_ns batch_cpu = 0;        ///< host time of the batch so far
  time_ns last_launch_cpu = 0;  ///< host time of the batch's last launch
  /// The last compute task launched in a compiled program, its launcher and launch delay.
  struct launched_task {
    graph::task_id task = graph::no_task;
    graph::task_id launcher = graph::no_task;
    std::int32_t delay = 0;
  } launched;
  // Where the emission of its pipeline ops stands.
  std::size_t next_op = 0;
  std::size_t ops = 0;  ///< the ops of its stage's order
  int col = 0;
  bool in_pipeline = false;
  bool gather_early = false;
  graph::task_id first_gathered = graph::no_task, all_gathered = graph::no_task;
  collective_tasks prefetched{};  ///< FSDP / ZeRO-3: the all-gather of the next unit
  graph::processor_id fsdp_reduce = no_processor;  ///< HSDP: its replica all-reduce stream
  graph::task_id fsdp_free = graph::no_task;  ///< FSDP: the end of the unit before the last gathered one
  // The receive of the next op, posted (its arrive placed) as soon as the op before is done, so
  // that the sender's transfer finds its join complete (compiled program).
  struct posted_receive {
    group_state* group = nullptr;
    std::size_t seq = 0;
    graph::task_id arrive = graph::no_task;
    graph::processor_id stream = 0;
    time_ns duration = 0;
  } posted;
  // The rank's groups, found once.
  group_state* tp_group = nullptr;
  group_state* dp_group = nullptr;
  group_state* edp_group = nullptr;  ///< expert-data-parallel (MoE)
  group_state* act_in = nullptr;
  group_state* act_out = nullptr;
  group_state* grad_in = nullptr;
  group_state* grad_out = nullptr;
  group_state* shard_group = nullptr;    ///< FSDP: the ranks its states are sharded over
  group_state* replica_group = nullptr;  ///< HSDP: the ranks holding the same shard
  group_state* cp_group = nullptr;       ///< the ranks of its context-parallel ring
  group_state* ep_group = nullptr;       ///< the ranks its routed experts are sharded over (MoE)
  group_state* etp_group = nullptr;      ///< the ranks splitting each of its experts' width (MoE, expert TP < TP)

  /// Ready for another rank, keeping the capacity of its lists.
  void reset() {
    info = {};
    seq_tp = seq_dp = seq_act_out = seq_act_in = seq_grad_out = seq_grad_in = seq_norm = seq_embd = seq_edp = seq_replica = seq_cp = seq_ep = seq_etp = 0;
    pending.clear();
    waits.clear();
    last_compute = last_dp = graph::no_task;
    launches.clear();
    cpu_tasks.clear();
    launcher = graph::no_task;
    batch_cpu = last_launch_cpu = 0;
    launched = {};
    next_op = 0;
    ops = 0;
    col = 0;
    in_pipeline = gather_early = false;
    first_gathered = all_gathered = graph::no_task;
    prefetched = {};
    fsdp_reduce = no_processor;
    fsdp_free = graph::no_task;
    posted = {};
    tp_group = dp_group = edp_group = act_in = act_out = grad_in = grad_out = shard_group = replica_group = cp_group = ep_group = etp_group = nullptr;
  }
};

}  // namespace detail

}  // namespace lumos::synth

#pragma once
// The pipeline program builder class (what it builds: synth/program.hpp). Its members are defined
// in program_templates.hpp (names, pass templates), program_groups.hpp (stage plan, process
// groups), program_tasks.hpp (the tasks themselves, into a task graph or a compiled program)
// and program_emission.hpp (what one rank emits, op by op).

#include <lumos/core/error.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>
#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/compiled_program.hpp>
#include <lumos/synth/detail/direct_sink.hpp>
#include <lumos/synth/detail/program_parts.hpp>
#include <lumos/synth/job.hpp>
#include <lumos/synth/schedules.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::synth {

namespace detail {

/// The stage orders of a build: the schedule's, or the caller's (a sweep keeps them per shape).
using stage_orders = std::vector<std::vector<pipeline::op>>;

template <model::ComputeModel Compute, model::CommModel Comm>
class program_builder {
 public:
  program_builder(const job& j, const program_options& opt, const Compute& compute, const Comm& comm, program_buffers& buffers)
      : m_(j.model), par_(j.parallel), hw_(j.hardware), opt_(opt), compute_(compute), comm_(comm), buf_(buffers),
        layer_items_(buffers.layer_items), head_items_(buffers.head_items), embed_items_(buffers.embed_items),
        buckets_(buffers.buckets), expert_buckets_(buffers.expert_buckets), p2p_folded_(buffers.p2p_folded), final_grad_(buffers.final_grad),
        group_slot_(buffers.group_slot), groups_(buffers.groups), segments_scratch_(buffers.segments_scratch) {
    policy_ = resolve_schedule(j);
    par_.validate(m_, hw_);
    if (par_.vp > 1 && !policy_.supports_chunks) {
      throw error("vp = " + std::to_string(par_.vp) + " model chunks need the interleaved schedule, not " +
                  std::string(policy_.title) +
                  " (set the schedule to interleaved or vp = 1)");
    }
    const std::int64_t micro = par_.micro_batches();
    model::check_micro_batch_count(micro, "global batch " + std::to_string(par_.global_batch) + " / (micro-batch " +
                                              std::to_string(par_.micro_batch) + " x DP " + std::to_string(par_.dp) + ")",
                                   "raise --micro-batch or --dp, or lower --global-batch");
    shape_ = {par_.pp, static_cast<std::int32_t>(micro), par_.vp};
    policy_.validate(shape_);
    split_ = policy_.splits_backward;
    if (par_.world_size() > (1 << 24)) {
      throw error("world size " + std::to_string(par_.world_size()) + " is beyond what lumos models (2^24 ranks)");
    }
    tp_ = par_.tp;
    pp_ = par_.pp;
    // The columns of a stage are its tp * cp * dp ranks; gradients are reduced over the DP x CP
    // group (stride tp), so the builder's "dp" is dp * cp. The micro-batches are dp's (above).
    dp_ = par_.gradient_ranks();
    world_ = static_cast<int>(par_.world_size());
    launch_cost_ = opt_.launch_cost >= 0 ? opt_.launch_cost : hw_.kernel_launch_overhead;
    collective_cpu_ = opt_.collective_cpu >= 0 ? opt_.collective_cpu : launch_cost_;
    bucket_params_ = opt_.bucket_params > 0 ? opt_.bucket_params : model::megatron_bucket_params(dp_);
    layers_per_chunk_ = static_cast<int>(par_.layers_per_chunk(m_));
    embedding_loss_in_split_ = par_.embedding_loss_in_split(m_);
    if (m_.is_moe() && (par_.zero_stage >= 2 || par_.fsdp) && dp_ > 1) {
      throw error("ZeRO stage " + std::to_string(par_.zero_stage) + (par_.fsdp ? " (FSDP)" : "") +
                  " with a mixture-of-experts model is not modelled: use zero_stage 0 or 1 (the distributed optimizer)");
    }
    // FSDP and ZeRO-3 are one path: per-unit all-gathers and reduce-scatters over the shard group.
    fsdp_ = par_.sharded_parameters() && dp_ > 1;
    shard_ = par_.shard_size();
    replicas_ = dp_ / shard_;
  }

  /// Builds the task graph into `out`, reusing the capacity of its graph arrays.
  void build(program& out) {
    clear(out);
    out.schedule = policy_;
    out.split_backward = split_;
    out.shape = shape_;
    out.unfolded = opt_.unfold;
    out.detail = opt_.detail;
    out.world_size = world_;
    out.orders = policy_.orders(shape_);
    if (opt_.forward_only) keep_forwards(out.orders);
    orders_ = &out.orders;
    g_ = &out.graph;
    out_ = &out;
    notes_ = opt_.notes && opt_.detail == granularity::kernel;
    buf_.first_on.clear();
    buf_.last_on.clear();
    prepare();
    reserve_graph();
    // Rank after rank: task ids (and so traces written from the graph) follow the ranks.
    for (int i = 0; i < simulated_ranks(); ++i) {
      if (buf_.ranks.empty()) buf_.ranks.emplace_back();
      rank_state& rs = buf_.ranks.front();
      begin_rank(rs, i);
      while (rs.next_op < order_of(rs).size()) emit_op(rs);
      end_rank(rs);
      out.ranks.push_back(rs.info);
    }
    if (notes_) {
      out.notes.op_of_task.resize(g_->task_count(), program_notes::none);
      out.notes.comm_of_task.resize(g_->task_count(), program_notes::none);
    }
  }

  /// Builds the compiled form into `out` (see compiled_program), placing each task as soon as
  /// its predecessors are placed; `orders`, when given, are the schedule's stage orders for this
  /// job's shape; `parts`, what `out` keeps. The ranks' pipeline ops are emitted in rounds, each
  /// rank's next op once the op that sends it its input has been, so that few tasks wait.
  /// Returns false when some tasks wait for each other (the task graph has a cycle;
  /// `graph::compile` of it names it).
  [[nodiscard]] bool build(compiled_program& out, const stage_orders* orders, compiled_parts parts = compiled_parts::all) {
    direct_ = true;
    sink_ = &buf_.sink;
    opt_.names = false;
    opt_.record_collectives = false;
    opt_.notes = false;
    notes_ = false;
    out.schedule = policy_;
    out.split_backward = split_;
    out.shape = shape_;
    out.unfolded = opt_.unfold;
    out.detail = opt_.detail;
    out.world_size = world_;
    out.parts = parts;
    out.ranks.clear();
    if (orders == nullptr || opt_.forward_only) {
      if (orders == nullptr) {
        buf_.orders = policy_.orders(shape_);
      } else {
        buf_.orders = *orders;
      }
      if (opt_.forward_only) keep_forwards(buf_.orders);
      orders = &buf_.orders;
    }
    orders_ = orders;
    prepare();
    const auto [tasks, edges] = expected_size();
    sink_->reset(out.graph, out.kind, out.processors, out.watched, out.times, tasks, edges, parts == compiled_parts::all);
    const int n = simulated_ranks();
    while (buf_.ranks.size() < static_cast<std::size_t>(n)) buf_.ranks.emplace_back();
    for (int i = 0; i < n; ++i) {
      begin_rank(buf_.ranks[static_cast<std::size_t>(i)], i);
      post_receive(buf_.ranks[static_cast<std::size_t>(i)]);
    }
    // An op goes once the op that sends its input has.
    for (bool more = true; more;) {
      more = false;
      bool progress = false;
      for (int i = n; i-- > 0;) {
        rank_state& rs = buf_.ranks[static_cast<std::size_t>(i)];
        if (rs.next_op >= rs.ops) continue;
        more = true;
        if (!input_sent(rs)) continue;
        emit_op(rs);
        post_receive(rs);
        progress = true;
      }
      if (more && !progress) return false;  // no rank can go on: the schedule waits on itself
    }
    // A send whose receive was never posted (a schedule that never runs the op it feeds).
    for (std::size_t g = 0; g < buf_.groups_used; ++g) {
      if (groups_[g].queued_head < groups_[g].queued.size()) return false;
    }
    for (int i = 0; i < n; ++i) end_rank(buf_.ranks[static_cast<std::size_t>(i)]);
    if (!sink_->finish()) return false;
    out.makespan = sink_->makespan();
    out.tasks = sink_->graph_tasks();
    out.edges = sink_->graph_edges();
    out.processor_count = out.processors.size() + folded_barriers_;
    for (int i = 0; i < n; ++i) out.ranks.push_back(compiled(buf_.ranks[static_cast<std::size_t>(i)].info));
    return true;
  }

  // Empties `out` and keeps the capacity of its arrays. The string table is kept too: the names
  // a builder interns are a small fixed set, so a reused table stops growing (ids may differ from
  // a fresh build's; the names they stand for do not).
  static void clear(program& out) {
    graph::task_graph& g = out.graph;
    g.processors.clear();
    g.processor.clear();
    g.kind.clear();
    g.duration.clear();
    g.idle_gap.clear();
    g.busy_gap.clear();
    g.name.clear();
    g.rank.clear();
    g.source.clear();
    g.observed_start.clear();
    g.observed_end.clear();
    g.edges.clear();
    g.collectives.clear();
    out.ranks.clear();
    out.notes = {};
  }

 private:
  // ---- configuration ----
  const model::transformer& m_;
  model::parallel_config par_;
  const model::hardware& hw_;
  program_options opt_;
  const Compute& compute_;
  const Comm& comm_;
  program_buffers& buf_;
  schedule_policy policy_{};
  pipeline::schedule_shape shape_{};
  bool split_ = false;
  bool fsdp_ = false;           ///< parameters sharded (FSDP / ZeRO-3) over more than one rank
  int shard_ = 1, replicas_ = 1;  ///< FSDP shard group size, and the shard groups (HSDP: dp / hsdp)
  int tp_ = 1, pp_ = 1, dp_ = 1, world_ = 1;
  int layers_per_chunk_ = 1;
  bool embedding_loss_in_split_ = false;  ///< model::parallel_config::embedding_loss_in_split
  /// Layers of a chunk that is the first virtual stage or not, the last or not: one fewer for
  /// each under Megatron's split with the embedding and the loss counted as layers.
  [[nodiscard]] int chunk_layers(bool first, bool last) const noexcept {
    return std::max(0, layers_per_chunk_ - (embedding_loss_in_split_ && first ? 1 : 0) - (embedding_loss_in_split_ && last ? 1 : 0));
  }
  /// Ranks of the expert grid's ETP x EP plane (model::parallel_config): the stride of an
  /// expert-data-parallel group's columns.
  [[nodiscard]] int expert_grid() const noexcept { return par_.expert_tp() * par_.ep; }
  /// Expert tensor parallelism over a group of its own (fewer ranks than TP): its token-copy
  /// all-gathers and reduce-scatters do not run over the TP group.
  [[nodiscard]] bool own_expert_tp() const noexcept { return m_.is_moe() && par_.expert_tp() != tp_; }
  /// Parameters of one of a MoE model's dense first layers on a rank (reduced over DP).
  [[nodiscard]] std::int64_t dense_layer_params() const noexcept { return model::layer_parameters_per_rank(m_, tp_); }
  time_ns launch_cost_ = 0;
  time_ns collective_cpu_ = 0;
  std::int64_t bucket_params_ = 0;
  const stage_orders* orders_ = nullptr;
  graph::task_graph* g_ = nullptr;  ///< the task graph being built, or null
  program* out_ = nullptr;
  bool direct_ = false;             ///< building a compiled program into `sink_`
  direct_sink* sink_ = nullptr;
  std::size_t folded_barriers_ = 0;  ///< barrier processors of folded joins, not made
  bool notes_ = false;

  // ---- names ----
  string_id n_unnamed_ = 0;
  string_id n_launch_ = 0, n_join_ = 0, n_send_fwd_ = 0, n_recv_fwd_ = 0, n_send_bwd_ = 0, n_recv_bwd_ = 0;
  string_id n_grad_ar_ = 0, n_grad_rs_ = 0, n_param_ag_ = 0, n_embd_ar_ = 0, n_norm_ar_ = 0, n_host_sync_ = 0;
  std::array<string_id, 4> n_pass_compute_{}, n_pass_comm_{};

  // ---- pass templates (in program_buffers) ----
  // [pass_kind] → items of one layer / the head / the embedding.
  std::array<std::vector<item>, 4>& layer_items_;
  std::array<std::vector<item>, 4>& head_items_;
  std::array<std::vector<item>, 4>& embed_items_;
  std::int64_t layer_params_ = 0, head_params_ = 0, embed_params_ = 0;
  std::int64_t expert_layer_params_ = 0;  ///< routed-expert parameters of one layer on this rank (MoE)
  // [pass_kind][first][last] → totals of a whole chunk pass.
  std::array<std::array<std::array<totals, 2>, 2>, 4> pass_totals_{};
  // [pass_kind] → totals of one layer, the embedding, the head (per-unit passes at `pass`).
  std::array<std::array<totals, 4>, 4> unit_totals_{};  ///< [pass kind][layer, embedding, head, dense layer]
  // [first][last] → (backward segment index closing a bucket, bucket params).
  std::array<std::array<std::vector<std::pair<int, std::int64_t>>, 2>, 2>& buckets_;
  std::array<std::array<std::vector<std::pair<int, std::int64_t>>, 2>, 2>& expert_buckets_;  ///< as buckets_, routed experts
  std::array<std::array<std::int64_t, 2>, 2> chunk_params_{};

  // ---- p2p ----
  std::int64_t p2p_bytes_ = 0;
  std::vector<time_ns>& p2p_folded_;  ///< [stage boundary s → s+1 mod p]: slowest pair

  // ---- per stage plan ----
  std::vector<std::vector<std::uint8_t>>& final_grad_;  ///< [stage][op index]: last grad op of its chunk

  // ---- groups ----
  // Made when first used, in `groups_` (a deque: references stay valid as more are made), and
  // found by dense id (see build_groups) through `group_slot_` (−1: not made yet). A folded job
  // of a huge world uses a handful of its ~3·world groups, which a dense table of groups held
  // whole (7 GB at 2^24 ranks); the slots take 4 bytes a group.
  std::vector<std::int32_t>& group_slot_;
  std::deque<group_state>& groups_;
  int tp_base_ = 0, dp_base_ = 0, act_base_ = 0, grad_base_ = 0, norm_base_ = 0, embd_base_ = 0, edp_base_ = 0;
  int shard_base_ = 0, replica_base_ = 0, cp_base_ = 0, ep_base_ = 0, etp_base_ = 0;
  model::group_placement tp_placement_;
  std::array<model::group_placement, 3> moe_placement_{};  ///< [model::moe_group]
  std::array<model::cp_exchange, 2> cp_exchange_{};  ///< a layer's K/V exchange: [0] forward, [1] backward

  // ---- names and pass templates: synth/detail/program_templates.hpp ----
  // Where the TP collectives of a layer sit among its ops (comm.hpp lists them; Megatron's
  // positions): `fwd` hooks apply to forward ops and to recomputed forward ops (full
  // recomputation repeats the forward collectives), `dgrad` to input-gradient ops, `wgrad` to
  // weight-gradient ops.
  enum class hook_phase : std::uint8_t { fwd, dgrad, wgrad };
  // How Transformer Engine overlaps a sequence-parallel collective with a GEMM under
  // `tp_comm_overlap`: `ring` splits the GEMM into tp chunks fed (all-gather) or drained
  // (reduce-scatter) by a ring exchange, so one chunk of the GEMM cannot overlap; `bulk` runs
  // the whole collective beside an independent GEMM of the same size (the dgrad / wgrad pair).
  enum class overlap_kind : std::uint8_t { ring, bulk };
  struct hook {
    model::op_role role;  // the op it attaches to
    hook_phase phase;
    bool after;
    std::string_view collective_name;
    overlap_kind overlap = overlap_kind::ring;
  };
  string_id intern(std::string_view s);
  void intern_names();
  [[nodiscard]] static bool in_pass(const model::op_cost& o, pass_kind pk) noexcept;
  std::uint32_t note_op(const model::op_cost& o);
  item compute_item(const model::op_cost& o);
  item comm_item(std::string_view name, model::collective c, std::int64_t bytes, std::int64_t element_bytes = 0,
                 const model::group_placement* placement = nullptr);
  void emit_moe_collectives(const model::op_cost& o, bool after, std::vector<item>& out);
  void emit_cp_exchange(const model::op_cost& o, bool after, std::vector<item>& out);
  [[nodiscard]] std::span<const hook> layer_hooks() const;
  [[nodiscard]] time_ns exposed_tp_comm(time_ns comm, time_ns gemm, overlap_kind k) const noexcept;
  [[nodiscard]] static hook_phase phase_of(const model::op_cost& o) noexcept;
  void layer_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out);
  void embed_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out);
  void embedding_collectives(const model::op_cost& o, bool after, std::vector<item>& out);
  void eh_proj_collectives(const model::op_cost& o, bool after, std::vector<item>& out);
  void head_template(const model::op_list& ops, pass_kind pk, std::vector<item>& out);
  [[nodiscard]] std::int64_t activation_message() const;
  void build_templates();
  [[nodiscard]] int global_rank(int stage, int col) const noexcept;
  [[nodiscard]] bool same_node(int s, int col) const noexcept;
  [[nodiscard]] time_ns p2p_time(int s, int col) const;

  // ---- stage plan and process groups: synth/detail/program_groups.hpp ----
  enum class group_type : std::uint8_t { tp, dp, act, grad, norm, embd, edp, shard, replica, cp, ep, etp };
  static void keep_forwards(stage_orders& orders);
  void prepare();
  void plan_stages();
  [[nodiscard]] std::pair<std::size_t, std::size_t> expected_size() const;
  void reserve_graph();
  void plan_senders();
  [[nodiscard]] bool input_sent(const rank_state& rs) const;
  [[nodiscard]] bool output_posted(const rank_state& rs) const;
  void build_groups();
  group_state& group(group_type type, int a, int b);
  group_state& cached_group(group_state*& slot, group_type type, int a, int b) {
    if (slot == nullptr) slot = &group(type, a, b);
    return *slot;
  }
  void init_group(group_state& gs, group_type type, int a, int b);
  group_state& special_group(rank_state& rs, const item& i);

  // ---- the tasks, into the task graph or the compiled program: synth/detail/program_tasks.hpp ----
  graph::task_id add(graph::processor_id p, graph::task_kind k, time_ns d, string_id name, int rank);
  graph::processor_id cpu_thread(int rank);
  graph::processor_id stream(const simulated_rank& r, std::int64_t index, std::string_view what);
  graph::processor_id barrier(const group_state& gs);
  graph::task_id on_compute(rank_state& rs, graph::task_kind k, time_ns d, string_id name, const launch_spec* launch = nullptr);
  launch_ref launch_edge(rank_state& rs, const launch_spec& l);
  graph::task_id cpu_task(rank_state& rs, time_ns duration);
  graph::task_id arrive(rank_state& rs, graph::processor_id stream_id, group_state& gs, std::size_t k, const launch_ref& l,
                        graph::task_id after, graph::task_kind kind = graph::task_kind::comm_arrive, time_ns duration = 0);
  void join_arrive(group_state& gs, std::size_t k, graph::task_id a);
  void more_sequences(group_state& gs, std::size_t k);
  void send_queued(group_state& gs, std::size_t k);
  graph::task_id complete(graph::processor_id stream_id, group_state& gs, std::size_t k, time_ns duration);
  void launched(rank_state& rs, graph::task_id gpu_task, const launch_spec& l);
  static void note_task(std::vector<std::uint32_t>& v, graph::task_id t, std::uint32_t value);
  [[nodiscard]] std::size_t span_mark(const rank_state& rs) const;
  void span_close(const rank_state& rs, span_kind kind, int index, std::size_t mark);
  void flush_launches(rank_state& rs);
  void host_wait(rank_state& rs, graph::task_id gpu_task);
  collective_tasks collective(rank_state& rs, graph::processor_id stream_id, group_state& gs, std::int64_t& seq,
                              std::string_view kind, std::int64_t bytes, time_ns duration, string_id name,
                              std::int32_t kernels = 1, time_ns cpu = -1, time_ns lead = -1,
                              std::int64_t element_bytes = 2, graph::task_id after = graph::no_task,
                              bool before_last = false);
  collective_tasks place_joined(rank_state& rs, graph::processor_id stream_id, group_state& gs, std::size_t k,
                                const launch_spec& launch, time_ns duration, graph::task_id after);
  collective_tasks add_collective(rank_state& rs, graph::processor_id stream_id, group_state& gs, std::size_t k,
                                  std::string_view kind, std::int64_t bytes, time_ns duration, string_id name,
                                  const launch_spec& launch, std::int64_t element_bytes, graph::task_id after);
  void record_collective(group_state& gs, std::size_t k, std::string_view kind, std::int64_t bytes, graph::task_id join,
                         collective_tasks c);
  void final_device_sync(rank_state& rs);
  [[nodiscard]] compiled_rank compiled(const simulated_rank& r) const;

  // ---- emission of one rank's tasks: synth/detail/program_emission.hpp ----
  std::vector<segment>& segments_scratch_;
  void emit_compute(rank_state& rs, time_ns d, time_ns cpu, time_ns lead, string_id name,
                    std::uint32_t op = program_notes::none);
  void emit_tp_collective(rank_state& rs, std::string_view kind, std::int64_t bytes, time_ns d, string_id name,
                          std::int32_t kernels, time_ns cpu, time_ns lead, std::int64_t element_bytes = 2,
                          bool before_last = false);
  graph::task_id emit_beside(rank_state& rs, const item& i);
  void emit_items(rank_state& rs, const std::vector<item>& items, int layer = -1, bool forward = false);
  void emit_totals(rank_state& rs, const totals& t, pass_kind pk);
  void segments_of(pass_kind pk, bool first, bool last, std::vector<segment>& out, int layers, int dense) const;
  // The virtual stages with their own plans (synth/detail/program_templates.hpp): those of an
  // explicit layout, or those holding a MoE model's dense first layers (and their layer
  // template); the plan of the chunk of `o` on `stage` when it has one.
  void build_chunk_plans();
  [[nodiscard]] int dense_layers_of(int vs) const noexcept;
  [[nodiscard]] int layers_of(int vs) const noexcept;
  [[nodiscard]] const chunk_plan* chunk_plan_of(int stage, const pipeline::op& o) const noexcept;
  void emit_pass(rank_state& rs, pass_kind pk, bool first, bool last,
                 const std::vector<std::pair<int, std::int64_t>>* buckets, bool final_grad = false,
                 const chunk_plan* plan = nullptr);
  void emit_segment(rank_state& rs, pass_kind pk, const segment& seg, int& layers_seen, int chunk_layers);
  void ensure_task(rank_state& rs);
  graph::processor_id dp_stream(rank_state& rs);
  void reduce_gradients(rank_state& rs, std::int64_t params, graph::task_id after, bool experts = false);
  collective_tasks gather_parameters(rank_state& rs, std::int64_t params, graph::task_id after, bool experts = false);
  // FSDP / ZeRO-3 (program_emission.hpp): the shard and replica groups, per-unit gathers and reductions.
  group_state& shard_group(rank_state& rs);
  time_ns priced_time(group_state& gs, model::collective kind, std::int64_t bytes);
  collective_tasks fsdp_gather(rank_state& rs, std::int64_t params, graph::task_id after);
  void fsdp_reduce(rank_state& rs, std::int64_t params, graph::task_id after, bool final_grad);
  [[nodiscard]] bool fsdp_gathers(pass_kind pk) const noexcept;
  [[nodiscard]] std::int64_t first_unit_params(pass_kind pk, bool first, bool last, int layers) const noexcept;
  group_state& expert_dp_group(rank_state& rs);
  [[nodiscard]] time_ns p2p_duration(int sender_stage, int col) const;
  [[nodiscard]] int simulated_ranks() const noexcept { return opt_.unfold ? world_ : pp_; }
  [[nodiscard]] const std::vector<pipeline::op>& order_of(const rank_state& rs) const {
    return (*orders_)[static_cast<std::size_t>(rs.info.stage)];
  }
  [[nodiscard]] pass_kind pass_of(const pipeline::op& o) const noexcept;
  [[nodiscard]] std::pair<bool, bool> chunk_role(int stage, const pipeline::op& o) const noexcept;
  [[nodiscard]] int plan_layers(int stage, const pipeline::op& o) const noexcept;
  void begin_rank(rank_state& rs, int index);
  struct receive {
    group_state* group;
    std::int64_t* seq;
    graph::processor_id stream;
    time_ns duration;
    string_id name;
  };
  std::optional<receive> receive_of(rank_state& rs, std::size_t i);
  void receive_input(rank_state& rs, std::size_t i);
  void post_receive(rank_state& rs);
  void emit_op(rank_state& rs);
  void end_rank(rank_state& rs);
  void optimizer_step(rank_state& rs);
};

}  // namespace detail

}  // namespace lumos::synth

#pragma once
// compiled_program — a model-built iteration in the compiled form the replay engine runs,
// emitted by the program builder without a task_graph (synth::build_compiled_into), and
// program_buffers, the builder's memory, which a caller keeps to build one program after
// another without allocating.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/synth/detail/direct_sink.hpp>
#include <lumos/synth/detail/program_parts.hpp>
#include <lumos/synth/job.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace lumos::synth {

/// A position no task has: a compiled rank without pipeline ops.
inline constexpr graph::position no_position{~std::uint32_t{0}};

/// What `build_compiled_into` keeps of a compiled program: all of it, or its timeline alone —
/// `times` and `makespan`, with `processors`, `ranks`, `watched` and the counts, what
/// `emitted_figures` reads — without `graph` and `kind` (empty), which a sweep that ranks
/// configurations by their figures never reads.
enum class compiled_parts : std::uint8_t { all, timeline };

/// One simulated rank of a `compiled_program`: `simulated_rank`'s facts, with the span of its
/// pipeline phase as positions of the compiled graph.
struct compiled_rank {
  int rank = 0;
  int stage = 0;
  int tp_index = 0;
  int dp_index = 0;
  graph::processor_id compute = no_processor;  ///< its compute stream
  /// First and last position of the schedule's ops on its compute stream, or no_position.
  graph::position pipeline_first = no_position;
  graph::position pipeline_last = no_position;
};

/// The iteration `build_program` describes, compiled for the replay engine: the compiled graph
/// `graph::compile` makes of its task graph, emitted directly by the builder, with what reports
/// of a replay need besides the records — each position's task kind, the processors (unnamed)
/// and the simulated ranks. No task ids, names or collective records: `graph.task` and
/// `graph.positions` are empty.
///
/// Emitted directly (`build_compiled_into`), zero-length tasks that only pass a time on to the
/// next are folded into it, as graph::compile folds a task's busy prelude into its gap: a
/// launching thread's host wait into the thread's next task (which takes its sync edge), the
/// join of a collective whose participants have all arrived into their completes (which take
/// the arrives' edges: the join's barrier never binds, as every participant's next arrive
/// follows its complete on the same stream), and the arrive of a collective with one
/// participant into its complete. On the compute streams of ranks other than 0, whose tasks the
/// figures read only for their busy time, a collective with one participant queued right behind
/// the compute task of its launch batch, and launched no later, is merged into that task: it
/// starts when that task ends, so the task takes its time (and keeps its kind). Every other task
/// starts and finishes as in the compiled task graph (tests/synth compares them processor by
/// processor); `tasks`, `edges` and `processor_count` count the task graph's.
struct compiled_program {
  graph::compiled_graph graph;
  output_vector<graph::task_kind> kind;  ///< per position
  std::vector<graph::processor_info> processors;
  std::vector<compiled_rank> ranks;  ///< ascending global rank
  /// The tasks replay_figures reads, by ascending position: [0] those on the compute stream of
  /// each stage's representative rank (tp and dp index 0), [1] those on rank 0's GPU streams;
  /// each with its processor and kind.
  std::array<output_vector<watched_task>, 2> watched;
  /// The start and finish of each position, interleaved, and the latest finish: the timeline
  /// sim::basic_replay gives for `graph` (with in-order processors), computed as the tasks were
  /// placed (emitted_figures reads it; replay_figures replays the graph instead).
  output_vector<time_ns> times;
  time_ns makespan = 0;
  compiled_parts parts = compiled_parts::all;  ///< what it holds
  schedule_policy schedule = policy_of<pipeline::one_f_one_b>();
  pipeline::schedule_shape shape{};
  bool unfolded = false;
  granularity detail = granularity::pass;
  std::int64_t world_size = 1;
  bool split_backward = false;
  std::size_t tasks = 0;  ///< tasks of the task graph (`build_program`)
  std::size_t edges = 0;  ///< edges of the task graph
  std::size_t processor_count = 0;  ///< processors of the task graph (with barriers of folded joins)

  [[nodiscard]] std::size_t task_count() const noexcept { return tasks; }
  [[nodiscard]] std::size_t edge_count() const noexcept { return edges; }
  /// The rank of the task at position `i` (that of its processor).
  [[nodiscard]] int rank_at(std::uint32_t i) const noexcept { return processors[graph.processor(i)].rank; }
  /// The simulated rank with tp_index 0 and dp_index 0 of `stage`.
  [[nodiscard]] const compiled_rank& representative(int stage) const {
    for (const auto& r : ranks) {
      if (r.stage == stage && r.tp_index == 0 && r.dp_index == 0) return r;
    }
    throw error("program: no rank for stage " + std::to_string(stage));
  }
};

/// The program builder's working memory: the cost model's op lists, the pass templates, the
/// process groups, each simulated rank's emission state, the placement of a compiled build.
/// Every array keeps its capacity, so a caller that builds one program after another (a sweep's
/// workspace) allocates nothing once they are as large as its largest program. Opaque; not
/// shared between threads while in use.
struct program_buffers {
  model::op_list layer_ops, embedding_ops, head_ops;
  std::vector<model::op_list> optimizer_ops;  ///< per stage
  std::vector<model::tp_collective> tp_collectives;
  std::vector<model::moe_collective> moe_collectives;
  std::vector<std::int64_t> nodes;  ///< placement scratch
  std::array<std::vector<detail::item>, 4> layer_items, head_items, embed_items;
  /// [pass kind] → a layer's items as runs that end at a host synchronisation (one run when none).
  std::array<std::vector<detail::totals>, 4> layer_runs;
  model::op_list dense_layer_ops;  ///< a MoE model's dense first layers: one layer's ops
  std::array<std::vector<detail::item>, 4> dense_layer_items;
  std::vector<detail::chunk_plan> chunk_plans;  ///< [virtual stage] → its own layers (the leading ones, or all)
  std::array<std::array<std::vector<std::pair<int, std::int64_t>>, 2>, 2> buckets;
  /// The routed experts' gradient buckets (reduced over the expert-data-parallel group), as `buckets`.
  std::array<std::array<std::vector<std::pair<int, std::int64_t>>, 2>, 2> expert_buckets;
  std::vector<std::int64_t> segments;
  std::vector<time_ns> p2p_folded;
  std::vector<std::vector<std::uint8_t>> final_grad;
  std::vector<std::int32_t> last_grad;  ///< per chunk: its last gradient op (stage plan scratch)
  std::vector<std::int32_t> chunk_ops;  ///< ops ending a chunk's gradients (early all-gathers)
  std::vector<std::int32_t> group_slot;
  std::deque<detail::group_state> groups;  ///< the first `groups_used` are this build's
  std::size_t groups_used = 0;
  std::vector<detail::segment> segments_scratch;
  std::vector<detail::rank_state> ranks;  ///< the simulated ranks being emitted (grown before they are)
  std::vector<graph::task_id> first_on, last_on;  ///< per processor (task graph)
  std::vector<std::int32_t> op_index;  ///< [stage][kind][chunk][micro-batch] → index in its order, or −1
  std::vector<std::size_t> stage_ops;  ///< stage → its first op in `sender`
  /// Per op: the stage that sends its input and the index of the sending op in that stage's
  /// order (−1 when the stage never runs it); (−1, −1) when its input does not cross stages.
  std::vector<std::pair<std::int32_t, std::int32_t>> sender;
  std::vector<std::pair<std::int32_t, std::int32_t>> receiver;  ///< per op: (stage, op index) receiving its output, or (−1, −1)
  std::vector<std::vector<pipeline::op>> orders;     ///< the stage orders, when the caller has none
  /// What the stage plan above (final_grad, op_index, stage_ops, sender, receiver) was made for.
  struct plan_key {
    std::vector<std::vector<pipeline::op>> (*orders)(const pipeline::schedule_shape&) = nullptr;
    pipeline::schedule_shape shape{};
    bool forward_only = false;
    friend bool operator==(const plan_key&, const plan_key&) = default;
  } planned;
  detail::direct_sink sink;
};

}  // namespace lumos::synth

#pragma once
// The trace graph builder's class: its state and the order of its passes (`build`). The
// passes are defined one dependency kind per header next to this one; graph/trace_builder.hpp
// includes them all.

#include <lumos/graph/build_options.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/core/sort.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/trace/comm.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/runtime_calls.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/summary.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <array>
#include <charconv>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace lumos::graph {

namespace detail {

[[nodiscard]] inline bool is_runtime(trace::category c) noexcept {
  return c == trace::category::cuda_runtime || c == trace::category::cuda_driver;
}

// Collective type of a communication kernel from its name: ncclKernel_AllReduce_..., 
// ncclDevKernel_AllGather_..., or the collective args.
[[nodiscard]] inline std::string collective_type(std::string_view name, std::string_view arg) {
  if (!arg.empty()) return trace::collective_name_kind(arg);
  for (std::string_view kind : {"AllReduce", "AllGather", "ReduceScatter", "SendRecv", "Broadcast", "AllToAll", "Reduce",
                                "Send", "Recv"}) {
    if (name.find(kind) != std::string_view::npos) {
      std::string s(kind);
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    }
  }
  if (name.find("all_reduce") != std::string_view::npos) return "allreduce";
  if (name.find("all_gather") != std::string_view::npos) return "allgather";
  return "comm";
}

[[nodiscard]] inline std::vector<int> parse_rank_list(std::string_view text) {
  std::vector<int> ranks;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] < '0' || text[i] > '9')) ++i;
    int v = 0;
    const auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
    if (ec != std::errc{}) break;
    ranks.push_back(v);
    i = static_cast<std::size_t>(p - text.data());
  }
  return ranks;
}

[[nodiscard]] inline time_ns quantile(std::vector<time_ns> v, double q, time_ns fallback) {
  if (v.empty()) return fallback;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  const auto at = v.begin() + static_cast<std::ptrdiff_t>(std::min(k, v.size() - 1));
  std::nth_element(v.begin(), at, v.end());
  return *at;
}

[[nodiscard]] inline time_ns median(std::vector<time_ns> v, time_ns fallback) { return quantile(std::move(v), 0.5, fallback); }

[[nodiscard]] inline bool is_poll(std::string_view name) noexcept {
  return trace::is_query_call(name);
}

[[nodiscard]] inline bool is_kernel_launch(std::string_view name) noexcept {
  return name.find("Launch") != std::string_view::npos;
}

// A multimap from 64-bit keys (correlation ids, external ids) to event indices, filled once,
// sealed, then only read: two sorted arrays instead of a hash table of vectors (a large job has
// millions of correlations, and a node plus a vector per key cost far more than the lookups).
// Values of one key stay in the order they were added.
class event_multimap {
 public:
  void add(std::int64_t key, std::uint32_t value) { entries_.push_back({key, value}); }
  void seal() {
    std::stable_sort(entries_.begin(), entries_.end(), [](const entry& a, const entry& b) { return a.key < b.key; });
    values_.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) values_[i] = entries_[i].value;
    keys_.clear();
    first_ = entries_.empty() ? 0 : entries_.front().key;
    const std::uint64_t span = entries_.empty() ? 0 : offset(entries_.back().key) + 1;
    if (span <= 2 * entries_.size() + 64) {
      // Dense keys (correlation ids count up): the values of key k start at begin_[k - first].
      begin_.assign(span + 1, 0);
      for (const entry& e : entries_) ++begin_[static_cast<std::size_t>(offset(e.key)) + 1];
      for (std::size_t k = 0; k < span; ++k) begin_[k + 1] += begin_[k];
    } else {
      begin_.clear();
      keys_.resize(entries_.size());
      for (std::size_t i = 0; i < entries_.size(); ++i) keys_[i] = entries_[i].key;
    }
    entries_ = std::vector<entry>{};  // freed (`= {}` would keep the capacity)
  }
  // Every value of `key` (empty when it has none).
  [[nodiscard]] std::span<const std::uint32_t> find(std::int64_t key) const noexcept {
    if (!begin_.empty()) {
      if (key < first_ || offset(key) + 1 >= begin_.size()) return {};
      const auto k = static_cast<std::size_t>(offset(key));
      return {values_.data() + begin_[k], begin_[k + 1] - begin_[k]};
    }
    const auto [b, e] = std::equal_range(keys_.begin(), keys_.end(), key);
    return {values_.data() + (b - keys_.begin()), static_cast<std::size_t>(e - b)};
  }
  // The first value added for `key`, or `missing`.
  [[nodiscard]] std::uint32_t first(std::int64_t key, std::uint32_t missing) const noexcept {
    const auto values = find(key);
    return values.empty() ? missing : values.front();
  }

 private:
  struct entry {
    std::int64_t key;
    std::uint32_t value;
  };
  // key − first_ for key >= first_, in unsigned arithmetic (no overflow whatever the keys).
  [[nodiscard]] std::uint64_t offset(std::int64_t key) const noexcept {
    return static_cast<std::uint64_t>(key) - static_cast<std::uint64_t>(first_);
  }
  std::vector<entry> entries_;
  std::vector<std::uint32_t> values_;
  std::int64_t first_ = 0;
  std::vector<std::uint32_t> begin_;  // dense keys: offsets into values_ by key − first_
  std::vector<std::int64_t> keys_;    // sparse keys: parallel to values_
};

// Lists of event indices keyed by an event index of the same rank (a blocking call → the GPU
// ops it waited for, a GPU op → its cross-stream producers): filled once on an analysis thread,
// then looked up for nearly every event while the rank's tasks are made, one thread for the
// whole job. A dense offset table (4 bytes an event) makes a lookup two loads, where a hash
// table of vectors costs a hash, a bucket and a node. Values of a key keep the order added.
class event_lists {
 public:
  void add(std::uint32_t key, std::uint32_t value) { pairs_.push_back({key, value}); }
  // Every key added is below `bound` (the rank's event count).
  void seal(std::size_t bound) {
    // begin_[k + 1] counts key k, then, summed, is where its values start; filling moves it to
    // where they end, which is where key k + 1's start.
    begin_.assign(bound + 2, 0);
    for (const auto& [k, v] : pairs_) ++begin_[std::size_t{k} + 2];
    for (std::size_t k = 2; k < begin_.size(); ++k) begin_[k] += begin_[k - 1];
    values_.resize(pairs_.size());
    for (const auto& [k, v] : pairs_) values_[begin_[std::size_t{k} + 1]++] = v;
    begin_.pop_back();
    keys_.clear();
    for (std::size_t k = 0; k < bound; ++k) {
      if (begin_[k + 1] != begin_[k]) keys_.push_back(static_cast<std::uint32_t>(k));
    }
    pairs_ = {};
  }
  [[nodiscard]] std::span<const std::uint32_t> find(std::uint32_t key) const noexcept {
    if (std::size_t{key} + 1 >= begin_.size()) return {};
    return {values_.data() + begin_[key], begin_[std::size_t{key} + 1] - begin_[key]};
  }
  // The keys that have values, ascending.
  [[nodiscard]] const std::vector<std::uint32_t>& keys() const noexcept { return keys_; }

 private:
  std::vector<std::pair<std::uint32_t, std::uint32_t>> pairs_;  // until sealed
  std::vector<std::uint32_t> begin_;
  std::vector<std::uint32_t> values_;
  std::vector<std::uint32_t> keys_;
};

// Piecewise-constant multiplier over one thread's time line: the product of the factors of the
// `op_scales` whose events cover each instant. Identity (and free) when no pattern matched.
class time_warp {
 public:
  // `spans` are (begin, end, factor) of matched events; spans of one pattern may nest.
  void build(std::vector<std::tuple<time_ns, time_ns, double>> spans) {
    points_.clear();
    factor_.clear();
    if (spans.empty()) return;
    std::vector<time_ns> cuts;
    for (const auto& [b, e, f] : spans) cuts.push_back(b), cuts.push_back(e);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    points_ = cuts;
    factor_.assign(cuts.size(), 1.0);
    // Callers pass, per pattern, the union of its events (a pattern applies once however
    // deeply its events nest); spans of different patterns multiply.
    for (const auto& [b, e, f] : spans) {
      auto i = static_cast<std::size_t>(std::lower_bound(points_.begin(), points_.end(), b) - points_.begin());
      for (; i + 1 < points_.size() && points_[i] < e; ++i) factor_[i] *= f;
    }
  }
  [[nodiscard]] bool empty() const noexcept { return points_.empty(); }
  // The multiplier at instant t (of the segment starting at or before t).
  [[nodiscard]] double at(time_ns t) const noexcept {
    if (points_.empty() || t < points_.front() || t >= points_.back()) return 1.0;
    const auto i = static_cast<std::size_t>(std::upper_bound(points_.begin(), points_.end(), t) - points_.begin()) - 1;
    return factor_[i];
  }
  // The length of [from, to) after the multipliers.
  [[nodiscard]] time_ns length(time_ns from, time_ns to) const noexcept {
    if (to <= from) return std::max<time_ns>(0, to - from);
    if (points_.empty() || to <= points_.front() || from >= points_.back()) return to - from;
    double total = 0;
    time_ns cur = from;
    auto i = static_cast<std::size_t>(std::upper_bound(points_.begin(), points_.end(), from) - points_.begin());
    while (cur < to) {
      const time_ns next = i < points_.size() ? std::min(to, points_[i]) : to;
      const double f = (i == 0 || i >= points_.size()) ? 1.0 : factor_[i - 1];
      total += static_cast<double>(next - cur) * f;
      cur = next;
      ++i;
    }
    return static_cast<time_ns>(std::llround(total));
  }

 private:
  std::vector<time_ns> points_;
  std::vector<double> factor_;  // factor_[i] applies on [points_[i], points_[i + 1])
};

// Adds the counters of `from` (one rank's) to `to` (the job's, built from the ranks before it),
// keeping the first worst causality violation, and appends its streams' overheads.
inline void add_counts(build_stats& to, build_stats&& from) {
  for (auto field : {&build_stats::cpu_tasks, &build_stats::gpu_tasks, &build_stats::threads, &build_stats::streams,
                     &build_stats::launch_edges, &build_stats::graph_launch_ops, &build_stats::ops_without_launch,
                     &build_stats::cross_stream_exact, &build_stats::cross_stream_inferred, &build_stats::cross_stream_implicit,
                     &build_stats::cross_stream_unresolved, &build_stats::blocking_calls, &build_stats::poll_waits,
                     &build_stats::queue_blocked_launches,
                     &build_stats::sync_edges, &build_stats::handoffs, &build_stats::collectives_matched,
                     &build_stats::collective_participants, &build_stats::collectives_unmatched, &build_stats::p2p_eager,
                     &build_stats::unmatched_transfer_same_op, &build_stats::unmatched_transfer_same_size,
                     &build_stats::unmatched_kept_whole, &build_stats::stream_overlaps, &build_stats::ops_queued,
                     &build_stats::ops_launch_bound, &build_stats::ops_dependency_bound, &build_stats::ops_unexplained,
                     &build_stats::op_scaled_gpu, &build_stats::op_scaled_cpu}) {
    to.*field += from.*field;
  }
  to.queue_blocked_wait += from.queue_blocked_wait;
  if (from.causality_violations > 0 && (from.worst_violation > to.worst_violation || to.worst_violation_text.empty())) {
    to.worst_violation = from.worst_violation;
    to.worst_violation_text = std::move(from.worst_violation_text);
  }
  to.causality_violations += from.causality_violations;
  to.overheads.insert(to.overheads.end(), from.overheads.begin(), from.overheads.end());
}

// Lends the graph's columns, as they fill, the pages of stores freed meanwhile (a trace's
// events, rank by rank: `lent_capacity`). Each step gives the column with the least lent ahead,
// relative to what it needs for the coming tasks and edges, the bytes it lacks, until the block
// cache is empty or every column has what it needs: a column takes a freed block whole or in a
// few parts, so the moves (each a mapping of the process) stay few.
class column_pages {
 public:
  /// Whether a column of `g` (as reserved) is large enough to be lent pages, with room for the
  /// compile's arrays, a few times a column, to be large_allocator's mapped blocks too.
  [[nodiscard]] static bool worth_lending(task_graph& g) {
    bool any = false;
    column_pages none;
    none.each(g, 0, 0, [&](std::size_t, const auto& column, const auto&, std::size_t) {
      using value = typename std::remove_cvref_t<decltype(column)>::value_type;
      any = any || column.capacity() * sizeof(value) >= large_allocator<value>::mapped_threshold / 4;
    });
    return any;
  }

  void lend(task_graph& g, std::size_t tasks, std::size_t edges) {
    std::uint32_t refused = 0;  // columns whose buffers cannot be lent pages (below the cache's blocks)
    while (block_cache_bytes() > 0) {
      std::size_t pick = columns, want = 0;
      double least = 1;  // lent ahead over needed, of the neediest column
      each(g, tasks, edges, [&](std::size_t i, const auto& column, const auto& lent, std::size_t n) {
        const std::size_t need = n * sizeof(typename std::remove_cvref_t<decltype(column)>::value_type);
        const std::size_t ahead = lent.ahead(column);
        if ((refused >> i & 1U) != 0 || ahead >= need) return;
        const double share = static_cast<double>(ahead) / static_cast<double>(need);
        if (share < least) least = share, pick = i, want = need - ahead;
      });
      if (pick == columns) return;
      std::size_t lent_now = 0;
      each(g, tasks, edges, [&](std::size_t i, auto& column, auto& lent, std::size_t) {
        if (i == pick) lent_now = lent.lend(column, want);
      });
      if (lent_now == 0) refused |= 1U << pick;
    }
  }

 private:
  static constexpr std::size_t columns = 11;

  template <class F>
  void each(task_graph& g, std::size_t tasks, std::size_t edges, F&& f) {
    auto& [processor, kind, duration, idle_gap, busy_gap, name, rank, source, start, end, edge] = lent_;
    f(0, g.processor, processor, tasks), f(1, g.kind, kind, tasks), f(2, g.duration, duration, tasks);
    f(3, g.idle_gap, idle_gap, tasks), f(4, g.busy_gap, busy_gap, tasks), f(5, g.name, name, tasks);
    f(6, g.rank, rank, tasks), f(7, g.source, source, tasks), f(8, g.observed_start, start, tasks);
    f(9, g.observed_end, end, tasks), f(10, g.edges, edge, edges);
  }

  std::tuple<lent_capacity<processor_id>, lent_capacity<task_kind>, lent_capacity<time_ns>, lent_capacity<time_ns>,
             lent_capacity<time_ns>, lent_capacity<string_id>, lent_capacity<std::int32_t>, lent_capacity<std::uint32_t>,
             lent_capacity<time_ns>, lent_capacity<time_ns>, lent_capacity<edge>>
      lent_;
};

}  // namespace detail

/// Builds the graph of `job`. `Comm` decides which GPU ops are communication.
template <trace::CommClassifier Comm = trace::default_comm_classifier>
class trace_graph_builder {
 public:
  explicit trace_graph_builder(const trace::job& job, build_options options = {}, Comm is_comm = {})
      : job_(job), options_(options), is_comm_(is_comm) {}

  [[nodiscard]] built_job build() {
    out_.origin = job_origin();
    ranks_.resize(job_.ranks.size());
    for_each_rank([this](std::size_t r) { index_rank(r); });
    if (options_.match_collectives) match_collectives();
    estimate_clock_offsets();
    std::size_t events = 0;
    for (const trace::rank_trace& t : job_.ranks) events += t.events.size();
    // About a task per event (metadata and instant events make none; a matched collective
    // makes two, plus its join): growing ten columns one task at a time would copy them all.
    out_.graph.reserve(events + events / 16, events);
    for (const trace::rank_trace& t : job_.ranks) event_counts_.push_back(t.events.size());
    // The block cache's freed blocks serve large_allocator's mapped blocks (lent to the columns
    // as they fill, or taken by the compile's arrays) and event stores. A graph whose columns
    // stay well below those blocks (a job of up to about a million events) takes none of them:
    // what the cache holds then (the reader's outgrown buffers, and the events freed as the
    // ranks are built) would only add to the peak, and goes back at once.
    lend_pages_ = detail::column_pages::worth_lending(out_.graph);
    if (!lend_pages_) release_block_cache();
    build_ranks();
    finish_collectives();
    for (kept_delay& k : out_.kept) k.at = out_.graph.observed_start[k.task];
    if (options_.strict && out_.stats.causality_violations > 0) {
      throw error(std::to_string(out_.stats.causality_violations) + " causality violation" +
                  (out_.stats.causality_violations == 1 ? "" : "s") + " (--strict); the worst: " + out_.stats.worst_violation_text);
    }
    out_.ranks.resize(job_.ranks.size());
    for (std::size_t r = 0; r < job_.ranks.size(); ++r) {
      out_.ranks[r].rank = job_.ranks[r].rank;
      out_.ranks[r].offset = ranks_[r].offset;
      out_.ranks[r].recorded = std::move(ranks_[r].recorded);
      out_.ranks[r].metadata_op = ranks_[r].metadata_op;
      std::sort(out_.ranks[r].recorded.begin(), out_.ranks[r].recorded.end());
      if (!options_.keep_event_maps) continue;
      out_.ranks[r].task_of_event = std::move(ranks_[r].task_of_event);
      out_.ranks[r].arrive_of_event = std::move(ranks_[r].arrive_of_event);
    }
    return std::move(out_);
  }

 private:
  using event_index = std::uint32_t;
  static constexpr event_index no_event = ~event_index{0};

  struct stream_key {
    int device;
    int stream;
    auto operator<=>(const stream_key&) const = default;
  };

  using producer_map = detail::event_lists;
  using awaited_map = detail::event_lists;

  // Everything indexed about one rank before tasks are made.
  struct rank_state {
    time_ns offset = 0;
    std::vector<std::pair<std::uint32_t, std::vector<event_index>>> cpu_lanes;  // lane → events by time
    std::map<stream_key, std::vector<event_index>> streams;                     // GPU ops by start
    detail::event_multimap runtime_by_corr;            // runtime calls (the first per correlation counts)
    detail::event_multimap ops_by_corr;                // GPU ops
    detail::event_multimap sync_by_corr;               // cuda_sync rows
    detail::event_multimap collective_op_by_external;  // record_param_comms (the first counts)
    std::vector<std::uint8_t> is_comm;                                           // per event
    std::vector<event_index> comm_ops;   // communication ops by enqueue time (then index)
    std::vector<std::int32_t> instance;  // per event: collective instance (matched ops), or -1
    std::vector<task_id> task_of_event;
    std::vector<task_id> arrive_of_event;
    std::vector<recorded_events> recorded;  // per CPU task with a source (rank_map::recorded)
    time_ns metadata_op = 0;                // rank_map::metadata_op
    std::vector<time_ns> enqueue;        // per GPU op: start of its launch call (or its own start)
    std::vector<time_ns> anchor;         // per GPU op: where its launch latency counts from (rank-local ts)
    std::vector<double> gpu_factor;      // per GPU op: product of the op_scales that apply to it (empty: none given)
    // The factor of op o: 1 without op_scales, whose per-event table (8 bytes an event, kept to
    // the end of the build) a plain replay then does not hold.
    [[nodiscard]] double factor(event_index o) const noexcept { return gpu_factor.empty() ? 1.0 : gpu_factor[o]; }
    std::vector<detail::time_warp> warps;        // per CPU lane slot: op_scales over the thread's time
    std::map<stream_key, stream_overheads> overheads;
    std::unordered_map<event_index, time_ns> transfer;  // unmatched communication ops: transfer part
    std::vector<string_id> graph_names;  // the trace's string id → the part's (no_string: not yet added)
    // What `build_rank` makes, on a worker, for `merge_rank` to add to the graph in rank order:
    // tasks and edges in `part_of(r)`, and these, with the part's task ids.
    std::vector<kept_delay> kept;
    std::map<std::int64_t, task_id> launch_task;  // split blocking copies: correlation → the issue task
    std::unordered_set<task_id> removed_calls;    // blocking calls inside an op scaled to 0
    // What `analyse_rank` hands to `build_rank` (made on an analysis thread).
    awaited_map awaited;                                     // blocking call → the GPU ops it waited for
    producer_map producers;                                  // GPU op → its cross-stream producers
    std::unordered_map<event_index, event_index> poll_runs;  // first query of a poll → its last
    build_stats counts;  // the rank's counters (analysis and build), added in rank order
  };

  // The part's id of a name of rank r's trace: interned once per distinct name, not per task.
  [[nodiscard]] string_id graph_name(std::size_t r, string_id name) {
    std::vector<string_id>& ids = ranks_[r].graph_names;
    if (ids.size() <= name) ids.resize(job_.ranks[r].strings.size(), no_string);
    if (ids[name] == no_string) ids[name] = part_of(r).strings.intern(job_.ranks[r].strings[name]);
    return ids[name];
  }

  // The graph that `build_rank(r)` fills: one of a few reused in turn (a rank's part is
  // emptied once merged, and `build_ranks` builds at most `parts_.size()` ranks ahead of the
  // merge), so their pages stay resident from rank to rank.
  [[nodiscard]] task_graph& part_of(std::size_t r) noexcept { return parts_[r % parts_.size()]; }

  // Adds rank r's part to the graph: its tasks, edges and names after those of the ranks
  // before it, its task ids in the event maps and kept delays offset to the graph's, and its
  // counters (the causality violation reported is the first worst, as if built in one piece).
  void merge_rank(std::size_t r) {
    rank_state& s = ranks_[r];
    task_graph& part = part_of(r);
    const task_id base = out_.graph.append(part).first_task;
    for (auto* ids : {&s.task_of_event, &s.arrive_of_event}) {
      for (task_id& t : *ids) t = t == no_task ? no_task : t + base;
    }
    for (kept_delay k : s.kept) k.task += base, out_.kept.push_back(k);
    s.kept = decltype(s.kept){};  // freed (`= {}` would keep the capacity)
    detail::add_counts(out_.stats, std::move(s.counts));
    part.clear();
  }
  static constexpr time_ns no_anchor = std::numeric_limits<time_ns>::min();

  // Frees what only `build_rank(r)` reads (the correlation maps and per-event scratch dominate
  // a large job's memory); `merge_rank` still needs the task maps, kept delays and counters,
  // and `finish_collectives` the offset, the task maps and the GPU factors.
  void release_indexes(std::size_t r) {
    rank_state& s = ranks_[r];
    auto release = [](auto& x) { x = std::remove_reference_t<decltype(x)>{}; };
    release(s.cpu_lanes), release(s.streams), release(s.runtime_by_corr), release(s.ops_by_corr);
    release(s.sync_by_corr), release(s.collective_op_by_external), release(s.is_comm), release(s.comm_ops), release(s.instance);
    release(s.enqueue), release(s.anchor), release(s.warps), release(s.overheads), release(s.transfer);
    release(s.graph_names), release(s.awaited), release(s.producers), release(s.poll_runs);
    release(s.launch_task), release(s.removed_calls);
  }

  // Every 64 ranks, gives the heap's free pages back to the system: the indexes of all ranks
  // (made together, before the tasks) are freed rank by rank while the graph's columns grow
  // elsewhere (mmap), and glibc keeps freed small blocks, so the peak would hold both.
  static void trim_heap(std::size_t r) noexcept {
    if (r % 64 == 63) lumos::trim_heap();
  }

  // Once rank r's events are freed (`build_options::events_done`), the graph's columns take
  // their pages for the tasks and edges of the next ranks (`detail::column_pages`): the graph
  // then fills pages that are resident already, instead of the events' going back to the system
  // while the kernel zeroes as many fresh ones (a 512-rank job: about 800 MB, faulted in by the
  // build's one serial thread before).
  void lend_freed_pages(std::size_t r) {
    if (!lend_pages_) {
      release_block_cache();
      return;
    }
    constexpr std::size_t ahead = 8;  // ranks: a freed block goes to one or two columns
    events_built_ += event_counts_[r];
    if (events_built_ == 0) return;
    std::size_t coming = 0;
    for (std::size_t k = r + 1; k < std::min(event_counts_.size(), r + 1 + ahead); ++k) coming += event_counts_[k];
    const graph::task_graph& g = out_.graph;
    const auto per_event = [&](std::size_t made) {
      return static_cast<std::size_t>(static_cast<double>(coming) * static_cast<double>(made) / static_cast<double>(events_built_));
    };
    column_pages_.lend(out_.graph, per_event(g.task_count()), per_event(g.edges.size()));
  }

  // ---- indexing ---------------------------------------------------------------------------

  [[nodiscard]] time_ns job_origin() const;

  void index_rank(std::size_t r);
  void index_streams(std::size_t r);
  void index_launches(std::size_t r);

  // Event order on a timeline: by start, the longer (enclosing) first, then by index.
  [[nodiscard]] static bool starts_before(const trace::rank_trace& t, event_index a, event_index b) noexcept {
    const auto& x = t.events[a];
    const auto& y = t.events[b];
    if (x.ts != y.ts) return x.ts < y.ts;
    if (x.dur != y.dur) return x.dur > y.dur;  // parents before children
    return a < b;
  }

  // Sorts `events` by `starts_before`, on copies of the keys: the comparison reads no event
  // (a rank's events are far apart in memory, and its lanes are long).
  static void sort_by_start(const trace::rank_trace& t, std::vector<event_index>& events) {
    const auto in_order = [&](event_index a, event_index b) { return starts_before(t, a, b); };
    if (std::is_sorted(events.begin(), events.end(), in_order)) return;  // traces are mostly in order
    struct key {
      time_ns ts, dur;
      event_index index;
    };
    std::vector<key> keys(events.size());
    for (std::size_t i = 0; i < events.size(); ++i) keys[i] = {t.events[events[i]].ts, t.events[events[i]].dur, events[i]};
    sort_runs(keys.begin(), keys.end(), [](const key& a, const key& b) {
      if (a.ts != b.ts) return a.ts < b.ts;
      if (a.dur != b.dur) return a.dur > b.dur;
      return a.index < b.index;
    });
    for (std::size_t i = 0; i < events.size(); ++i) events[i] = keys[i].index;
  }

  void apply_op_scales(std::size_t r);

  [[nodiscard]] time_ns job_time(std::size_t r, time_ns ts) const noexcept { return ts + ranks_[r].offset; }
  [[nodiscard]] time_ns start_of(std::size_t r, event_index i) const noexcept { return job_time(r, job_.ranks[r].events[i].ts); }
  [[nodiscard]] time_ns end_of(std::size_t r, event_index i) const noexcept { return job_time(r, job_.ranks[r].events[i].end()); }

  // ---- collectives ------------------------------------------------------------------------

  // A collective's participant, with its op's times (rank-local): joining the participants
  // reads no event, so a rank's events can go once its tasks are added
  // (`build_options::events_done`).
  struct participant {
    std::size_t rank_index;
    event_index op;
    time_ns ts, dur;
  };
  [[nodiscard]] time_ns start_of(const participant& m) const noexcept { return job_time(m.rank_index, m.ts); }
  [[nodiscard]] time_ns end_of(const participant& m) const noexcept { return job_time(m.rank_index, m.ts + m.dur); }
  // What the graph's collective `instances_[i]` joins (the two lists stay parallel: the
  // instances become the graph's without a copy).
  struct instance_plan {
    std::vector<participant> members;
  };

  // The steps of `match_collectives` and what they hand on (graph/detail/collectives.hpp).
  struct comm_key;
  struct rank_comm_keys;
  struct job_comm_names;
  struct instance_runs;
  [[nodiscard]] rank_comm_keys comm_keys(std::size_t r) const;
  [[nodiscard]] job_comm_names number_comm_keys(std::vector<rank_comm_keys>& keys) const;
  [[nodiscard]] static instance_runs form_instances(const std::vector<rank_comm_keys>& keys, std::size_t total);
  void add_instance_plans(const instance_runs& runs, const job_comm_names& names);
  void match_collectives();

  void estimate_clock_offsets();

  // ---- building one rank -----------------------------------------------------------------

  struct cpu_task_info {
    task_id task;
    std::uint32_t lane_slot;
    time_ns start, end, busy;  // observed, job time
  };

  [[nodiscard]] unsigned thread_count() const noexcept {
    return options_.threads != 0 ? options_.threads : hardware_threads() + 1;
  }

  // Runs fn(r) for every rank on up to thread_count() threads, the calling one included; fn
  // must touch only rank r's state. The exception of the first failing rank (in rank order,
  // as one thread would have met it) is rethrown once every thread is done.
  template <class Fn>
  void for_each_rank(Fn fn) const {
    parallel_for(job_.ranks.size(), thread_count(), fn);
  }

  void build_ranks();
  void analyse_rank(std::size_t r);
  void build_rank(std::size_t r);

  void learn_overheads(std::size_t r, const producer_map& producers);

  void unmatched_transfers(std::size_t r);

  awaited_map find_blocking_calls(std::size_t r);
  void find_queue_blocked_launches(std::size_t r, awaited_map& awaited);

  void build_thread(std::size_t r, std::uint32_t slot, const awaited_map& awaited, std::vector<cpu_task_info>& cpu_tasks);

  producer_map find_cross_stream(std::size_t r);

  void gpu_edges(std::size_t r, const producer_map& producers);

  [[nodiscard]] task_id task_of(std::size_t r, event_index o) const { return ranks_[r].task_of_event[o]; }

  // Counts a causality violation in `st` (a rank's counters, or the job's), which describes the
  // first worst.
  static void violation(build_stats& st, time_ns amount, std::string text) {
    ++st.causality_violations;
    if (amount > st.worst_violation || st.worst_violation_text.empty()) {
      st.worst_violation = amount;
      st.worst_violation_text = std::move(text);
    }
  }

  [[nodiscard]] std::string where(std::size_t r, event_index i) const {
    const trace::rank_trace& t = job_.ranks[r];
    return t.file + ": event #" + std::to_string(i) + " '" + std::string(t.name(t.events[i])) + "'";
  }
  // The same for a collective's participant, named after its task (its events may be gone).
  [[nodiscard]] std::string where(const participant& m) const {
    return job_.ranks[m.rank_index].file + ": event #" + std::to_string(m.op) + " '" +
           std::string(out_.graph.task_name(ranks_[m.rank_index].task_of_event[m.op])) + "'";
  }

  [[nodiscard]] task_id launch_task_for(std::size_t r, event_index call) const {
    const rank_state& s = ranks_[r];
    const auto it = s.launch_task.find(job_.ranks[r].events[call].correlation);
    return it != s.launch_task.end() ? it->second : s.task_of_event[call];
  }

  void handoffs(std::size_t r, std::vector<cpu_task_info>& tasks);

  // ---- joins ------------------------------------------------------------------------------

  void finish_collectives();

  const trace::job& job_;
  build_options options_;
  Comm is_comm_;
  std::vector<rank_state> ranks_;
  std::vector<instance_plan> plans_;
  std::vector<collective_instance> instances_;  // per plan
  std::vector<task_graph> parts_;  // `part_of`
  built_job out_;
  std::vector<std::size_t> event_counts_;  // per rank, read before any is freed
  std::size_t events_built_ = 0;           // of the ranks built so far
  detail::column_pages column_pages_;
  bool lend_pages_ = true;  // the columns can be lent the freed events' pages (see `build`)
};

}  // namespace lumos::graph

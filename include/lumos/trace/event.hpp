#pragma once
// The event model of one rank's Kineto trace: compact events, interned names, args side table.

#include <lumos/core/allocator.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::trace {

/// The categories (`cat`) the graph and the reports use. Everything else is `other`: counted
/// by its `cat` string, kept, never an error, never used by the graph.
enum class category : std::uint8_t {
  other,
  cpu_op,               ///< PyTorch operator
  user_annotation,      ///< record_function range, e.g. ProfilerStep#N
  python_function,      ///< Python frame (with_stack)
  cuda_runtime,         ///< CUDA runtime API call
  cuda_driver,          ///< CUDA driver API call (cuLaunchKernel...)
  kernel,               ///< GPU kernel
  gpu_memcpy,           ///< GPU copy
  gpu_memset,           ///< GPU memset
  gpu_user_annotation,  ///< annotation projected on a stream
  cuda_sync,            ///< GPU-side synchronisation record (enable_cuda_sync_events)
  cuda_event,           ///< cudaEventRecord record of the newest writers
  flow,                 ///< ac2g / async_cpu_to_gpu / fwdbwd arrows
};
inline constexpr std::size_t category_count = 13;

[[nodiscard]] constexpr std::string_view to_string(category c) noexcept {
  constexpr std::array<std::string_view, category_count> names = {
      "other",      "cpu_op",     "user_annotation",     "python_function", "cuda_runtime",
      "cuda_driver", "kernel",    "gpu_memcpy",          "gpu_memset",      "gpu_user_annotation",
      "cuda_sync",  "cuda_event", "flow"};
  return names[static_cast<std::size_t>(c)];
}

/// Category of a `cat` string (exact match; unknown strings are `other`).
[[nodiscard]] constexpr category category_of(std::string_view cat) noexcept {
  if (cat == "kernel" || cat == "Kernel") return category::kernel;  // capitalised: Kineto < 1.13
  if (cat == "cpu_op" || cat == "Operator") return category::cpu_op;
  if (cat == "cuda_runtime" || cat == "Runtime") return category::cuda_runtime;
  if (cat == "cuda_driver") return category::cuda_driver;
  if (cat == "user_annotation") return category::user_annotation;
  if (cat == "python_function") return category::python_function;
  if (cat == "gpu_memcpy" || cat == "Memcpy") return category::gpu_memcpy;
  if (cat == "gpu_memset" || cat == "Memset") return category::gpu_memset;
  if (cat == "gpu_user_annotation") return category::gpu_user_annotation;
  if (cat == "cuda_sync") return category::cuda_sync;
  if (cat == "cuda_event") return category::cuda_event;
  if (cat == "ac2g" || cat == "async_cpu_to_gpu" || cat == "fwdbwd") return category::flow;
  return category::other;
}

[[nodiscard]] constexpr bool is_gpu_op(category c) noexcept {
  return c == category::kernel || c == category::gpu_memcpy || c == category::gpu_memset;
}
/// Events that sit on a GPU timeline (device, stream) rather than a CPU thread.
[[nodiscard]] constexpr bool is_gpu_side(category c) noexcept {
  return is_gpu_op(c) || c == category::gpu_user_annotation || c == category::cuda_sync ||
         c == category::cuda_event;
}
[[nodiscard]] constexpr bool is_cpu_side(category c) noexcept {
  return c == category::cpu_op || c == category::user_annotation ||
         c == category::python_function || c == category::cuda_runtime ||
         c == category::cuda_driver;
}

/// Trace Event Format phase (`ph`).
enum class phase : std::uint8_t { complete, instant, counter, flow_start, flow_step, flow_end, other };

/// One `traceEvents` entry (metadata `M` entries are folded into lane names instead).
/// 56 bytes; names and args live in side tables of the owning `rank_trace`.
struct event {
  time_ns ts = 0;                ///< start, ns, relative to `rank_trace::base_ns`
  time_ns dur = 0;               ///< duration, ns (0 unless `ph` is X)
  std::int64_t correlation = -1; ///< args.correlation; flow id for flow events; -1 if absent
  std::int64_t external_id = -1; ///< args["External id"]; -1 if absent
  string_id name = no_string;
  string_id cat_name = no_string;  ///< the raw `cat` string; `no_string` if absent
  std::uint32_t lane = 0;          ///< index into `rank_trace::lanes` (pid, tid)
  std::uint32_t args_begin = 0;    ///< first arg in the side table; ends at the next event's
  std::int32_t stream = -1;        ///< GPU-side events: args.stream, else tid; -1 otherwise
  std::int16_t device = -1;        ///< GPU-side events: args.device, else pid; -1 otherwise
  category cat = category::other;
  phase ph = phase::other;

  [[nodiscard]] constexpr time_ns end() const noexcept { return ts + dur; }
};
static_assert(sizeof(event) == 56, "keep events compact: they dominate the memory of a job");

/// Args the graph and the what-ifs need, stored sparsely per event (others, e.g. "Input type" or
/// "Concrete Inputs", are skipped: nothing downstream reads them). String-valued keys hold a
/// `string_id`; keys whose JSON value is an array or object (Input Dims, grid) hold the interned
/// raw JSON text of the value.
enum class arg_key : std::uint8_t {
  sequence_number,       ///< "Sequence number" (autograd)
  fwd_thread_id,         ///< "Fwd thread id"
  input_dims,            ///< "Input Dims" (string: raw JSON)
  bytes,                 ///< "bytes" (memcpy / memset)
  graph_id,              ///< "graph id" (CUDA graphs)
  graph_node_id,         ///< "graph node id"
  grid,                  ///< "grid" (string: raw JSON)
  block,                 ///< "block" (string: raw JSON)
  collective_name,       ///< "Collective name" (string)
  dtype,                 ///< "dtype" (string)
  in_msg_nelems,         ///< "In msg nelems"
  out_msg_nelems,        ///< "Out msg nelems"
  in_split_size,         ///< "In split size" (string)
  out_split_size,        ///< "Out split size" (string)
  group_size,            ///< "Group size"
  process_group_name,    ///< "Process Group Name" (string)
  process_group_desc,    ///< "Process Group Description" (string)
  process_group_ranks,   ///< "Process Group Ranks" (string)
  collective_rank,       ///< "Rank"
  collective_seq,        ///< "Seq"
  global_rank_start,     ///< "Global rank start"
  global_rank_stride,    ///< "Global rank stride"
  wait_on_stream,        ///< cuda_sync: stream the awaited event was recorded on
  wait_on_event_record_correlation,  ///< cuda_sync: correlation of that cudaEventRecord
  wait_on_event_id,      ///< cuda_sync: the CUDA event id
  event_id,              ///< cuda_event: the CUDA event id
  total_allocated,       ///< "Total Allocated": `[memory]` events (profile_memory=True), bytes after it
  total_reserved,        ///< "Total Reserved": the caching allocator's reserved bytes after it
  device_id,             ///< "Device Id" of a `[memory]` event (-1: host memory)
  count_
};
inline constexpr std::size_t arg_key_count = static_cast<std::size_t>(arg_key::count_);

[[nodiscard]] constexpr bool is_string_arg(arg_key k) noexcept {
  switch (k) {
    case arg_key::input_dims:
    case arg_key::grid:
    case arg_key::block:
    case arg_key::collective_name:
    case arg_key::dtype:
    case arg_key::in_split_size:
    case arg_key::out_split_size:
    case arg_key::process_group_name:
    case arg_key::process_group_desc:
    case arg_key::process_group_ranks:
      return true;
    default:
      return false;
  }
}

/// The JSON key of an arg.
[[nodiscard]] constexpr std::string_view json_key(arg_key k) noexcept {
  constexpr std::array<std::string_view, arg_key_count> keys = {
      "Sequence number", "Fwd thread id", "Input Dims", "bytes", "graph id",
      "graph node id", "grid", "block", "Collective name", "dtype", "In msg nelems",
      "Out msg nelems", "In split size", "Out split size", "Group size", "Process Group Name",
      "Process Group Description", "Process Group Ranks", "Rank", "Seq", "Global rank start",
      "Global rank stride", "wait_on_stream", "wait_on_cuda_event_record_corr_id",
      "wait_on_cuda_event_id", "event_id", "Total Allocated", "Total Reserved", "Device Id"};
  return keys[static_cast<std::size_t>(k)];
}

/// Bytes per element of a tensor dtype as PyTorch's profiler writes it in a communication op's
/// `dtype` arg ("BFloat16", "Float", "Float8_e4m3fn", ...); 0 for a name it does not know.
[[nodiscard]] constexpr std::int64_t dtype_bytes(std::string_view dtype) noexcept {
  if (dtype == "BFloat16" || dtype == "Half" || dtype == "Short") return 2;
  if (dtype == "Float" || dtype == "Int" || dtype == "ComplexHalf") return 4;
  if (dtype == "Double" || dtype == "Long" || dtype == "ComplexFloat") return 8;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool" || dtype.starts_with("Float8")) return 1;
  return 0;
}

/// A CPU thread or a GPU stream row of the trace, identified by its (pid, tid).
struct lane {
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  string_id pid_text = no_string;  ///< set when the JSON pid was a string ("Spans"...)
  string_id tid_text = no_string;
  string_id process_name = no_string;  ///< from `M` process_name
  string_id thread_name = no_string;   ///< from `M` thread_name
};

/// One entry of `deviceProperties`.
struct device_info {
  int id = -1;
  std::string name;
  int num_sms = 0;
  std::int64_t total_memory = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

/// One entry of `distributedInfo.pg_config`.
struct process_group_info {
  std::string name;
  std::string description;
  std::string backend;
  int size = 0;
  std::vector<int> ranks;
};

/// The largest world size lumos accepts (2^24 ranks, the same bound `synth` enforces, so every
/// job it writes reads back). Rank numbers index per-rank tables, so an unchecked rank of 2e9
/// from a corrupt file would cost gigabytes; real jobs are far below this.
inline constexpr int max_world_size = 1 << 24;

/// How a rank number was determined.
enum class rank_origin : std::uint8_t { distributed_info, file_name, order };

[[nodiscard]] constexpr std::string_view to_string(rank_origin o) noexcept {
  switch (o) {
    case rank_origin::distributed_info:
      return "distributedInfo";
    case rank_origin::file_name:
      return "file name";
    case rank_origin::order:
      return "order given";
  }
  return "?";
}

/// Everything read from one rank's trace file.
struct rank_trace {
  std::string file;
  int rank = -1;
  rank_origin origin = rank_origin::order;
  std::optional<int> world_size;     ///< distributedInfo.world_size
  std::string backend;               ///< distributedInfo.backend
  std::vector<process_group_info> process_groups;
  std::vector<device_info> devices;  ///< deviceProperties
  std::optional<int> distributed_rank;  ///< distributedInfo.rank as written
  time_ns base_ns = 0;               ///< baseTimeNanoseconds (0 when timestamps are absolute)

  std::uint64_t entries = 0;         ///< every element of traceEvents, whatever its kind
  std::uint64_t metadata_entries = 0;
  std::uint64_t skipped_entries = 0;  ///< entries of unknown phase: counted, not stored
  std::uint64_t ignored_args = 0;     ///< known args with an unexpected type: counted, dropped
  // Recyclable: a replay frees them rank by rank while the graph's columns fill, which take
  // their pages (`lent_capacity`).
  recyclable_vector<event> events;         ///< in file order
  recyclable_vector<arg_key> arg_keys;     ///< args side table (CSR by event::args_begin)
  recyclable_vector<std::int64_t> arg_values;
  std::vector<lane> lanes;
  std::vector<std::uint64_t> category_counts;  ///< by `cat` string id; 0 for other strings
  string_table strings;

  [[nodiscard]] std::string_view str(string_id id) const noexcept {
    return id == no_string ? std::string_view{} : strings[id];
  }
  [[nodiscard]] std::string_view name(const event& e) const noexcept { return str(e.name); }

  /// Index range of the args of event `i`.
  [[nodiscard]] std::pair<std::uint32_t, std::uint32_t> arg_range(std::size_t i) const noexcept {
    const std::uint32_t b = events[i].args_begin;
    const std::uint32_t e = i + 1 < events.size() ? events[i + 1].args_begin
                                                  : static_cast<std::uint32_t>(arg_keys.size());
    return {b, e};
  }
  /// Integer value of arg `k` of event `i` (string args: the string id), if present.
  [[nodiscard]] std::optional<std::int64_t> arg(std::size_t i, arg_key k) const noexcept {
    const auto [b, e] = arg_range(i);
    for (std::uint32_t a = b; a < e; ++a) {
      if (arg_keys[a] == k) return arg_values[a];
    }
    return std::nullopt;
  }
  /// String value of a string arg of event `i`; empty if absent.
  [[nodiscard]] std::string_view arg_text(std::size_t i, arg_key k) const noexcept {
    const auto v = arg(i, k);
    return v ? str(static_cast<string_id>(*v)) : std::string_view{};
  }

  /// Frees the events and their args, keeping the rest (file, rank, strings, lanes, process
  /// groups): for a caller done with them (`trace::job::drop_events`,
  /// `graph::build_options::events_done`).
  void drop_events() noexcept {
    // Swapped out (`= {}` would keep the capacity).
    decltype(events)().swap(events);
    decltype(arg_keys)().swap(arg_keys);
    decltype(arg_values)().swap(arg_values);
  }

  /// Bytes held by the event store of this rank (events, args, lanes, strings).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return events.capacity() * sizeof(event) + arg_keys.capacity() * sizeof(arg_key) +
           arg_values.capacity() * sizeof(std::int64_t) + lanes.capacity() * sizeof(lane) +
           category_counts.capacity() * sizeof(std::uint64_t) + strings.memory_bytes();
  }
};

}  // namespace lumos::trace

#pragma once
// What `lumos inspect` reports about one rank: counts, streams, threads, profiler steps.

#include <lumos/trace/comm.hpp>
#include <lumos/trace/event.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lumos::trace {

/// One `ProfilerStep#N` annotation.
struct profiler_step {
  std::string name;
  int number = -1;
  time_ns start = 0;  ///< ns, relative to the rank's base time, as written
  time_ns dur = 0;
  std::size_t event = 0;  ///< index in rank_trace::events
};

/// Every `ProfilerStep#N` CPU annotation of a rank, sorted by start.
[[nodiscard]] inline std::vector<profiler_step> profiler_steps(const rank_trace& t) {
  std::vector<profiler_step> steps;
  constexpr std::string_view prefix = "ProfilerStep#";
  // Whether each name is a step's, decided once per name: a rank has a few thousand names for
  // its tens of thousands of CPU events, and reading each event's name text missed the cache.
  std::vector<std::int8_t> is_step(t.strings.size(), -1);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    if (e.ph != phase::complete || !is_cpu_side(e.cat)) continue;
    if (e.name < is_step.size()) {
      std::int8_t& known = is_step[e.name];
      if (known < 0) known = t.strings[e.name].starts_with(prefix) ? 1 : 0;
      if (known == 0) continue;
    }
    const std::string_view name = t.name(e);
    if (!name.starts_with(prefix)) continue;
    int number = -1;
    const std::string_view digits = name.substr(prefix.size());
    std::from_chars(digits.data(), digits.data() + digits.size(), number);
    steps.push_back({std::string(name), number, e.ts, e.dur, i});
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const profiler_step& a, const profiler_step& b) { return a.start < b.start; });
  return steps;
}

/// The peak of the GPU memory the profiler's memory events record (`profile_memory=True`:
/// `[memory]` instant events whose "Total Allocated" is the caching allocator's allocated bytes
/// after each allocation or free, as `torch.cuda.memory_allocated()` counts them).
struct memory_peak {
  std::int64_t allocated = 0;  ///< the largest "Total Allocated" of the rank's GPU
  std::int64_t reserved = 0;   ///< the largest "Total Reserved"
  time_ns at = 0;              ///< trace time of the event that reached `allocated`
  int device = -1;
  std::uint64_t events = 0;    ///< GPU memory events read
};

/// The peak over the rank's GPU memory events (events with "Device Id" >= 0), or nothing when the
/// trace has none. Linear in events.
[[nodiscard]] inline std::optional<memory_peak> measured_memory_peak(const rank_trace& t) {
  memory_peak p;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    if (e.ph != phase::instant || t.name(e) != "[memory]") continue;
    const auto dev = t.arg(i, arg_key::device_id);
    const auto total = t.arg(i, arg_key::total_allocated);
    if (!dev || *dev < 0 || !total) continue;
    ++p.events;
    if (p.events == 1 || *total > p.allocated) p.allocated = *total, p.at = e.ts, p.device = static_cast<int>(*dev);
    if (const auto r = t.arg(i, arg_key::total_reserved)) p.reserved = std::max(p.reserved, *r);
  }
  if (p.events == 0) return std::nullopt;
  return p;
}

/// Counts that `lumos inspect` prints for one rank.
struct rank_summary {
  std::vector<std::pair<std::string, std::uint64_t>> by_category;  ///< sorted by category
  std::uint64_t gpu_ops = 0;    ///< kernels, memcpy and memset
  std::uint64_t comm_ops = 0;   ///< GPU ops the classifier calls communication
  std::uint64_t streams = 0;    ///< distinct (device, stream) of GPU ops
  std::uint64_t threads = 0;    ///< distinct (pid, tid) of CPU-side events
  std::string device;           ///< name of the GPU the ops ran on (deviceProperties)
  std::vector<profiler_step> steps;
  std::optional<memory_peak> memory;  ///< from the profiler's memory events, when recorded
};

template <CommClassifier Comm = default_comm_classifier>
[[nodiscard]] rank_summary summarize(const rank_trace& t, const Comm& is_comm = {}) {
  rank_summary s;
  for (string_id id = 0; id < t.category_counts.size(); ++id) {
    if (t.category_counts[id] != 0) s.by_category.emplace_back(std::string(t.strings[id]), t.category_counts[id]);
  }
  std::sort(s.by_category.begin(), s.by_category.end());
  std::set<std::pair<int, int>> streams;
  std::set<std::uint32_t> threads;
  std::optional<int> gpu;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    if (e.ph != phase::complete) continue;
    if (is_gpu_op(e.cat)) {
      ++s.gpu_ops;
      if (is_comm(t, i)) ++s.comm_ops;
      streams.emplace(e.device, e.stream);
      if (!gpu) gpu = e.device;
    } else if (is_cpu_side(e.cat)) {
      threads.insert(e.lane);
    }
  }
  s.streams = streams.size();
  s.threads = threads.size();
  for (const auto& d : t.devices) {
    if (gpu && d.id == *gpu) s.device = d.name;
  }
  if (s.device.empty() && !t.devices.empty()) s.device = t.devices.front().name;
  s.steps = profiler_steps(t);
  s.memory = measured_memory_peak(t);
  return s;
}

}  // namespace lumos::trace

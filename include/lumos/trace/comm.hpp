#pragma once
// Which GPU ops are communication: a policy, because every library names its kernels its own way.

#include <lumos/trace/event.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <concepts>
#include <string>
#include <string_view>

namespace lumos::trace {

/// A communication classifier is called with a rank's trace and an event index (a GPU op) and
/// says whether that op is communication.
template <class C>
concept CommClassifier = requires(const C& c, const rank_trace& t, std::size_t i) {
  { c(t, i) } -> std::convertible_to<bool>;
};

/// Default policy: NCCL/RCCL kernels (`ncclKernel_*`, `ncclDevKernel_*`, `rccl*`), any GPU op that
/// carries collective args ("Collective name", newer PyTorch), and the known non-NCCL collective
/// kernels: symmetric-memory and vLLM custom all-reduce. Extend by composing your own callable.
struct default_comm_classifier {
  static constexpr std::array<std::string_view, 5> known_substrings = {
      "multimem_all_reduce", "multimem_all_gather", "cross_device_reduce",
      "one_shot_all_reduce", "two_shot_all_reduce"};

  [[nodiscard]] static bool is_comm_name(std::string_view name) noexcept {
    if (name.starts_with("nccl") || name.starts_with("rccl")) return true;
    // Called for every GPU op: a name shorter than the substrings (all of one length) holds none.
    static_assert(std::all_of(known_substrings.begin(), known_substrings.end(),
                              [](std::string_view s) { return s.size() == known_substrings[0].size(); }));
    if (name.size() < known_substrings[0].size()) return false;
    for (auto s : known_substrings) {
      if (name.find(s) != std::string_view::npos) return true;
    }
    return false;
  }

  [[nodiscard]] bool operator()(const rank_trace& t, std::size_t i) const noexcept {
    const event& e = t.events[i];
    if (!is_gpu_op(e.cat)) return false;
    return is_comm_name(t.name(e)) || t.arg(i, arg_key::collective_name).has_value();
  }
};
static_assert(CommClassifier<default_comm_classifier>);

/// A `Collective name` arg in the one spelling the rest of lumos compares against: lower case,
/// underscores dropped, and c10d's variants of a collective named by the collective they run
/// (`_allgather_base`, `allgather_into_tensor_coalesced`, `allgather_coalesced` → "allgather";
/// `_reduce_scatter_base`, `reduce_scatter_tensor_coalesced` → "reducescatter";
/// `allreduce_coalesced` → "allreduce"). FSDP2 and DDP record these names, which name the same
/// NCCL collective as the plain ones. Other names keep their letters ("send", "alltoallbase").
[[nodiscard]] inline std::string collective_name_kind(std::string_view arg) {
  std::string s;
  s.reserve(arg.size());
  for (const char c : arg) {
    if (c != '_') s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (const std::string_view kind : {"allgather", "reducescatter", "allreduce"}) {
    if (s.starts_with(kind)) return std::string(kind);
  }
  return s;
}

}  // namespace lumos::trace

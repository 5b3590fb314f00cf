#pragma once
// Schedules at run time: `schedule_policy`, the runtime descriptor of any
// `pipeline::PipelineSchedule` type (`policy_of<S>()`), which jobs, programs, predictions, the
// sweep and the what-if carry; and the registry of the schedules lumos ships (`schedule_types`),
// which parses a name and lists the candidates structure discovery recognises.

#include <lumos/core/error.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/zero_bubble.hpp>

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace lumos::synth {

/// A list of types, for folds over it.
template <class... T>
struct type_list {};

/// The schedule policies lumos ships, in the order of `pipeline::all_schedule_kinds` (each has
/// a `kind` member naming its enumerator). A user's schedule need not be listed: it is used by
/// passing `policy_of<S>()`.
using schedule_types = type_list<pipeline::gpipe, pipeline::one_f_one_b, pipeline::interleaved_one_f_one_b,
                                 pipeline::zero_bubble_h1, pipeline::zero_bubble_h2>;

/// A pipeline schedule as a runtime value: what the program builder needs from a static policy
/// type `S` (its names, flags, shape check and stage orders), taken once by `policy_of<S>()`.
/// It lets a job, a sweep or a what-if carry any `pipeline::PipelineSchedule` type — a user's
/// included — without making every builder a template over the schedule. Plain data (views of
/// `S`'s constant names and pointers to its static members): trivially copyable, comparable,
/// shareable between threads. A default-constructed one names no schedule (null functions).
struct schedule_policy {
  std::string_view name;   ///< `S::name`: command lines, JSON, and what tells schedules apart
  std::string_view title;  ///< `S::title`: messages
  bool splits_backward = false;
  bool supports_chunks = false;
  void (*validate)(const pipeline::schedule_shape&) = nullptr;
  std::vector<std::vector<pipeline::op>> (*orders)(const pipeline::schedule_shape&) = nullptr;

  friend bool operator==(const schedule_policy&, const schedule_policy&) = default;
};

namespace detail {
template <pipeline::PipelineSchedule S>
void validate_policy(const pipeline::schedule_shape& shape) {
  S::validate(shape);
}
}  // namespace detail

/// The runtime descriptor of schedule policy `S`. Constant time; no allocation.
template <pipeline::PipelineSchedule S>
[[nodiscard]] constexpr schedule_policy policy_of() noexcept {
  schedule_policy p;
  p.name = S::name;
  p.title = S::title;
  p.splits_backward = S::splits_backward;
  p.supports_chunks = S::supports_chunks;
  p.validate = &detail::validate_policy<S>;
  p.orders = &pipeline::all_stage_ops<S>;
  return p;
}

namespace detail {

template <class F, class... S>
void for_each_schedule_in(type_list<S...>, F& f) {
  static_assert((pipeline::PipelineSchedule<S> && ...));
  (f(std::type_identity<S>{}), ...);
}

template <class Result, class F, class... S>
std::optional<Result> visit_schedule_in(type_list<S...>, pipeline::schedule_kind kind, F& f) {
  std::optional<Result> out;
  // Left to right, the first policy of `kind` only.
  ((S::kind == kind && !out ? void(out.emplace(f(std::type_identity<S>{}))) : void()), ...);
  return out;
}

}  // namespace detail

/// Calls `f(std::type_identity<S>{})` for each shipped policy `S` of `schedule_types`, in order.
template <class F>
void for_each_schedule(F&& f) {
  detail::for_each_schedule_in(schedule_types{}, f);
}

/// Calls `f(std::type_identity<S>{})` for the shipped policy `S` whose `S::kind == kind` and
/// returns its result. `f` must return the same non-void type for every policy. O(1): five
/// comparisons. Throws `lumos::error` for a kind with no policy (cannot happen for the enum's
/// values).
template <class F>
auto visit_schedule(pipeline::schedule_kind kind, F&& f) {
  using result = std::invoke_result_t<F&, std::type_identity<pipeline::one_f_one_b>>;
  static_assert(!std::is_void_v<result>, "visit_schedule: the visitor must return a value");
  std::optional<result> out = detail::visit_schedule_in<result>(schedule_types{}, kind, f);
  if (!out) throw error("no pipeline schedule policy for kind " + std::to_string(static_cast<int>(kind)));
  return std::move(*out);
}

/// The descriptor of the shipped policy for `kind`.
[[nodiscard]] inline schedule_policy policy_of(pipeline::schedule_kind kind) {
  return visit_schedule(kind, [](auto t) { return policy_of<typename decltype(t)::type>(); });
}

/// Short names accepted beside the shipped policies' own: (alias, name).
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 1> schedule_aliases = {
    std::pair<std::string_view, std::string_view>{"interleaved", pipeline::interleaved_one_f_one_b::name}};

/// The shipped policy named `name` (its `S::name`, exact, lower case, or an alias of
/// `schedule_aliases`: "interleaved" for "interleaved-1f1b"). Throws `lumos::error` listing the
/// names otherwise. A user's schedule has no name here: pass its `policy_of<S>()`.
[[nodiscard]] inline schedule_policy parse_schedule(std::string_view name) {
  for (const auto& [alias, full] : schedule_aliases) {
    if (name == alias) name = full;
  }
  std::optional<schedule_policy> found;
  std::vector<std::string_view> names;
  for_each_schedule([&](auto t) {
    using S = typename decltype(t)::type;
    if (S::name == name) found = policy_of<S>();
    names.push_back(S::name);
  });
  if (!found) {
    std::string msg = "unknown pipeline schedule '" + std::string(name) + "' (expected ";
    for (std::size_t i = 0; i < names.size(); ++i) {
      msg += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
      msg += names[i];
    }
    for (const auto& [alias, full] : schedule_aliases) msg += "; " + std::string(alias) + " for " + std::string(full);
    throw error(msg + ")");
  }
  return *found;
}

}  // namespace lumos::synth

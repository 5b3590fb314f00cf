#pragma once
// Runtime dispatch from a `schedule_kind` to the static schedule policy types: a five-element
// list of types, walked by a fold once per dispatch.

#include <lumos/core/error.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/zero_bubble.hpp>

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

/// The schedule policies lumos ships, one per `pipeline::schedule_kind`.
using schedule_types = type_list<pipeline::gpipe, pipeline::one_f_one_b, pipeline::interleaved_one_f_one_b,
                                 pipeline::zero_bubble_h1, pipeline::zero_bubble_h2>;

namespace detail {

template <class Result, class F, class... S>
std::optional<Result> visit_schedule_in(type_list<S...>, pipeline::schedule_kind kind, F& f) {
  static_assert((pipeline::PipelineSchedule<S> && ...));
  std::optional<Result> out;
  // Left to right, the first policy of `kind` only.
  ((S::kind == kind && !out ? void(out.emplace(f(std::type_identity<S>{}))) : void()), ...);
  return out;
}

}  // namespace detail

/// Calls `f(std::type_identity<S>{})` for the policy `S` whose `S::kind == kind` and returns
/// its result; `S` satisfies `pipeline::PipelineSchedule`. `f` must return the same non-void
/// type for every policy. O(1): five comparisons. Throws `lumos::error` for a kind with no
/// policy (cannot happen for the enum's values).
template <class F>
auto visit_schedule(pipeline::schedule_kind kind, F&& f) {
  using result = std::invoke_result_t<F&, std::type_identity<pipeline::one_f_one_b>>;
  static_assert(!std::is_void_v<result>, "visit_schedule: the visitor must return a value");
  std::optional<result> out = detail::visit_schedule_in<result>(schedule_types{}, kind, f);
  if (!out) throw error("no pipeline schedule policy for kind " + std::to_string(static_cast<int>(kind)));
  return std::move(*out);
}

/// A pipeline schedule as a runtime value: what the program builder needs from a static policy
/// type `S` (its flags, its shape check and its stage orders), taken once by `policy_of<S>()`.
/// It lets a job or a sweep carry any `pipeline::PipelineSchedule` type — including a user's,
/// which need not be one of the shipped `schedule_kind`s — without making every builder a
/// template over the schedule. Plain data (function pointers to `S`'s static members): trivially
/// copyable, comparable, shareable between threads.
struct schedule_policy {
  pipeline::schedule_kind kind = pipeline::schedule_kind::one_f_one_b;  ///< `S::kind` (for reports)
  bool splits_backward = false;
  bool supports_chunks = false;
  std::string_view name;  ///< `S::name` when `S` has one, else `schedule_name(kind)`
  void (*validate)(const pipeline::schedule_shape&) = nullptr;
  std::vector<std::vector<pipeline::op>> (*orders)(const pipeline::schedule_shape&) = nullptr;

  friend bool operator==(const schedule_policy&, const schedule_policy&) = default;
};

namespace detail {
template <class S>
concept named_schedule = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};
template <pipeline::PipelineSchedule S>
void validate_policy(const pipeline::schedule_shape& shape) {
  S::validate(shape);
}
}  // namespace detail

/// The runtime descriptor of schedule policy `S`. Constant time; no allocation.
template <pipeline::PipelineSchedule S>
[[nodiscard]] constexpr schedule_policy policy_of() noexcept {
  schedule_policy p;
  p.kind = S::kind;
  p.splits_backward = S::splits_backward;
  p.supports_chunks = S::supports_chunks;
  if constexpr (detail::named_schedule<S>) {
    p.name = S::name;
  } else {
    p.name = pipeline::schedule_name(S::kind);
  }
  p.validate = &detail::validate_policy<S>;
  p.orders = &pipeline::all_stage_ops<S>;
  return p;
}

/// The descriptor of the shipped policy for `kind`.
[[nodiscard]] inline schedule_policy policy_of(pipeline::schedule_kind kind) {
  return visit_schedule(kind, [](auto t) { return policy_of<typename decltype(t)::type>(); });
}

/// `parse_schedule_kind` that also accepts "interleaved" for "interleaved-1f1b" (the CLI's
/// short name). Throws `lumos::error` listing the names otherwise.
[[nodiscard]] inline pipeline::schedule_kind parse_schedule_name(std::string_view name) {
  if (name == "interleaved") return pipeline::schedule_kind::interleaved_one_f_one_b;
  try {
    return pipeline::parse_schedule_kind(name);
  } catch (const error&) {
    throw error("unknown pipeline schedule '" + std::string(name) +
                "' (expected gpipe, 1f1b, interleaved, zb-h1 or zb-h2)");
  }
}

/// Whether the schedule splits the backward into B and W (the zero-bubble schedules).
[[nodiscard]] inline bool splits_backward(pipeline::schedule_kind kind) {
  return visit_schedule(kind, [](auto t) { return decltype(t)::type::splits_backward; });
}

/// Validates `shape` for `kind` (throws `lumos::error` with the schedule's one-line reason).
inline void validate_schedule(pipeline::schedule_kind kind, const pipeline::schedule_shape& shape) {
  (void)visit_schedule(kind, [&](auto t) {
    decltype(t)::type::validate(shape);
    return true;
  });
}

/// The orders of all stages of `kind` on `shape` (`result[r]` is stage r's). Validates first.
[[nodiscard]] inline std::vector<std::vector<pipeline::op>> stage_orders(pipeline::schedule_kind kind,
                                                                         const pipeline::schedule_shape& shape) {
  return visit_schedule(kind, [&](auto t) { return pipeline::all_stage_ops<typename decltype(t)::type>(shape); });
}

}  // namespace lumos::synth

// Must not compile: a type that is not a PipelineSchedule used where one is required. It has the
// flags, the shape check and the orders, and a shipped schedule's `kind`, but no `name`: the
// concept, not a deeper template, rejects it, and says which requirement failed.
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/synth/schedules.hpp>

#include <cstdint>
#include <vector>

struct not_a_schedule {
  static constexpr lumos::pipeline::schedule_kind kind = lumos::pipeline::schedule_kind::one_f_one_b;
  static constexpr bool splits_backward = false;
  static constexpr bool supports_chunks = false;
  static constexpr void validate(const lumos::pipeline::schedule_shape& shape) { lumos::pipeline::one_f_one_b::validate(shape); }
  static std::vector<lumos::pipeline::op> stage_ops(const lumos::pipeline::schedule_shape& shape, std::int32_t stage) {
    return lumos::pipeline::one_f_one_b::stage_ops(shape, stage);
  }
};

int main() {
  constexpr lumos::synth::schedule_policy policy = lumos::synth::policy_of<not_a_schedule>();
  return static_cast<int>(policy.name.size());
}

// Must not compile: a type that is not a PipelineSchedule used where one is required.
#include <lumos/pipeline/schedule.hpp>

struct not_a_schedule {};

int main() {
  const auto orders = lumos::pipeline::all_stage_ops<not_a_schedule>(lumos::pipeline::schedule_shape{2, 4, 1});
  return static_cast<int>(orders.size());
}

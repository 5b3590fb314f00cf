#pragma once
// Everything: every public header of lumos, the I/O part (reader, job loader, trace files)
// included, so it needs lumos::lumos. For lumos::core alone include the headers you use; for
// declarations only, lumos/fwd.hpp. tests/CMakeLists.txt checks that this list is complete.

#include <lumos/core/allocator.hpp>
#include <lumos/core/error.hpp>
#include <lumos/core/json_writer.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/core/sort.hpp>
#include <lumos/core/strings.hpp>
#include <lumos/core/time.hpp>

#include <lumos/trace/comm.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/trace/reader.hpp>
#include <lumos/trace/runtime_calls.hpp>
#include <lumos/trace/summary.hpp>

#include <lumos/graph/build_options.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/graph/trace_builder.hpp>

#include <lumos/sim/replay.hpp>

#include <lumos/pipeline/dependencies.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/pipeline/schedule.hpp>
#include <lumos/pipeline/timeline.hpp>
#include <lumos/pipeline/zero_bubble.hpp>

#include <lumos/model/calibrate.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/eager_memory.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/moe.hpp>
#include <lumos/model/nccl.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/pipeline_layout.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/profiler_cost.hpp>
#include <lumos/model/transformer.hpp>

#include <lumos/synth/compiled_program.hpp>
#include <lumos/synth/figures.hpp>
#include <lumos/synth/job.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/synth/predict.hpp>
#include <lumos/synth/program.hpp>
#include <lumos/synth/schedule_graph.hpp>
#include <lumos/synth/schedules.hpp>

#include <lumos/report/breakdown.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/frozen.hpp>
#include <lumos/report/held_out.hpp>
#include <lumos/report/html.hpp>
#include <lumos/report/iteration.hpp>
#include <lumos/report/json/inspect.hpp>
#include <lumos/report/json/predict.hpp>
#include <lumos/report/json/replay.hpp>
#include <lumos/report/json/sweep.hpp>
#include <lumos/report/json/whatif.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/report/simulated_job.hpp>
#include <lumos/report/sweep_html.hpp>
#include <lumos/report/trace_files.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/report/whatif_files.hpp>
#include <lumos/report/whatif_rows.hpp>

#include <lumos/sweep/evaluate.hpp>
#include <lumos/sweep/space.hpp>
#include <lumos/sweep/sweep.hpp>

#include <lumos/whatif/attribution.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/collectives.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/context_parallel.hpp>
#include <lumos/whatif/data_parallel.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/fsdp.hpp>
#include <lumos/whatif/fsdp_insertion.hpp>
#include <lumos/whatif/gpu_change.hpp>
#include <lumos/whatif/gradient_buckets.hpp>
#include <lumos/whatif/hsdp.hpp>
#include <lumos/whatif/layers.hpp>
#include <lumos/whatif/micro_batches.hpp>
#include <lumos/whatif/model_fit.hpp>
#include <lumos/whatif/moe.hpp>
#include <lumos/whatif/moe_dispatch.hpp>
#include <lumos/whatif/options.hpp>
#include <lumos/whatif/pass_labels.hpp>
#include <lumos/whatif/pipeline.hpp>
#include <lumos/whatif/pipeline_change.hpp>
#include <lumos/whatif/pipeline_graph.hpp>
#include <lumos/whatif/precision.hpp>
#include <lumos/whatif/result.hpp>
#include <lumos/whatif/shape.hpp>
#include <lumos/whatif/stage_emission.hpp>
#include <lumos/whatif/stage_geometry.hpp>
#include <lumos/whatif/stage_plan.hpp>
#include <lumos/whatif/stage_split.hpp>
#include <lumos/whatif/structure.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/context_parallel.hpp>
#include <lumos/whatif/structure/fsdp.hpp>
#include <lumos/whatif/structure/gradients.hpp>
#include <lumos/whatif/structure/groups.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/iteration.hpp>
#include <lumos/whatif/structure/layers.hpp>
#include <lumos/whatif/structure/layout.hpp>
#include <lumos/whatif/structure/memory_recipe.hpp>
#include <lumos/whatif/structure/model_shape.hpp>
#include <lumos/whatif/structure/moe.hpp>
#include <lumos/whatif/structure/overrides.hpp>
#include <lumos/whatif/structure/passes.hpp>
#include <lumos/whatif/structure/phases.hpp>
#include <lumos/whatif/structure/schedule.hpp>
#include <lumos/whatif/structure/stages.hpp>
#include <lumos/whatif/structure/tasks.hpp>
#include <lumos/whatif/structure/types.hpp>
#include <lumos/whatif/summary.hpp>
#include <lumos/whatif/tensor_parallel.hpp>
#include <lumos/whatif/weight_gradients.hpp>
#include <lumos/whatif/whatif.hpp>

#include <lumos/cli/args.hpp>
#include <lumos/cli/calibrate.hpp>
#include <lumos/cli/predict.hpp>
#include <lumos/cli/routing.hpp>
#include <lumos/cli/scale.hpp>
#include <lumos/cli/sweep.hpp>
#include <lumos/cli/whatif.hpp>

#pragma once
// The precision what-if (`lumos whatif --precision fp8`): bf16 (or fp16) traces rewritten for fp8
// training as Transformer Engine runs it. Every linear GEMM of the transformer layers (QKV,
// attention output, the MLP's: `model::fp8_gemm`) is rescaled by the kernel-level model's fp8 / 16-bit
// time ratio of its shape (model/kernel_costs.hpp) on the target GPU (`--gpu`, else the traced one),
// and the kernels TE runs before it are inserted (`model::fp8_casts`: the input and weight casts
// before a forward GEMM, the output gradient's before an input gradient, amax reductions under
// current scaling), each on the GEMM's stream right before it and launched from a new launch call
// right before the GEMM's, with the model's GPU time (on the traced GPU: the GPU change, which runs
// later, rescales them with the other memory-bound kernels) and host time. The attention core, the
// logits, the norms, the optimizer and communication stay as traced.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/model/compute.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/kernel_costs.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/synth/kernel_trace.hpp>
#include <lumos/whatif/change.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/context.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/editor.hpp>
#include <lumos/whatif/shape.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lumos::whatif {

/// What a GEMM of a layer computes, as the precision change reads it from its dims and order.
enum class linear_pass : std::uint8_t { forward, input_gradient, weight_gradient };

/// One linear GEMM of a layer, found in the traces.
struct layer_gemm {
  graph::task_id task = graph::no_task;
  linear_pass kind = linear_pass::forward;
  bool recompute = false;     ///< a forward rerun in backward (full recomputation)
  bool shared_input = false;  ///< reads the input the GEMM launched right before it cast (the up GEMM of a gated MLP)
  detail::gemm_shape to;      ///< its dims in the target shape
};

namespace detail {

/// The linear GEMMs of the layers of `st` whose dims map to a layer's (`map_gemm`, from the
/// traced shape `from` to `to`), per rank in launch order, read as forward, input or weight
/// gradient: forward in forward passes; in backward, a GEMM with the tokens as K is a weight
/// gradient, one with the tokens as M is an input gradient when the next one is the weight
/// gradient of the same dims (autograd runs them in that order), else a recomputed forward.
[[nodiscard]] inline std::vector<layer_gemm> find_layer_gemms(const trace::job& job, const graph::built_job& b, const job_structure& st,
                                                              const shape_config& from, const shape_config& to) {
  std::vector<layer_gemm> out;
  std::vector<std::array<std::int64_t, 3>> dims;  // traced, sorted: to pair an input gradient with its weight gradient
  std::vector<std::array<std::int64_t, 3>> traced;  // M, K, N as traced
  std::vector<std::size_t> rank_of;
  std::size_t previous = ~std::size_t{0};  // index in st.gpu_ops of the GEMM found last
  for (std::size_t i = 0; i < st.gpu_ops.size(); ++i) {
    const gpu_op_context& c = st.gpu_ops[i];
    if (c.layer < 0 || c.comm || c.shape_op == no_event || c.rank >= b.ranks.size()) continue;
    const trace::rank_trace& tr = job.ranks[c.rank];
    const auto gs = gemm_of(tr.name(tr.events[c.shape_op]), parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)));
    if (!gs || gs->kind != gemm_shape::role::linear) continue;
    const auto m = map_gemm(*gs, from, to, false);
    const auto& map = b.ranks[c.rank].task_of_event;
    // Only the GEMM kernel itself: an operator may launch a memset or a copy too.
    if (!m || c.op >= map.size() || map[c.op] == graph::no_task || !is_gemm_kernel(tr.name(tr.events[c.op]))) continue;
    layer_gemm g;
    g.task = map[c.op];
    g.to = m->to;
    std::array<std::int64_t, 3> d{gs->m, gs->k, gs->n};
    std::sort(d.begin(), d.end());
    const bool same_rank = !out.empty() && rank_of.back() == c.rank;
    if (c.phase != phase_kind::backward) {
      g.kind = linear_pass::forward;
    } else if (gs->k == from.tokens() && gs->m == from.tokens()) {
      // Tokens = a width (tokens = hidden, say): right after an input gradient of the same dims
      // it is that one's weight gradient.
      const bool after_dgrad = same_rank && out.back().kind == linear_pass::input_gradient && dims.back() == d;
      g.kind = after_dgrad ? linear_pass::weight_gradient : linear_pass::input_gradient;
    } else {
      g.kind = gs->k == from.tokens() ? linear_pass::weight_gradient : linear_pass::input_gradient;
    }
    // A forward GEMM launched right after one of the same M, K and N reads that one's input
    // (the up GEMM after the gate of a gated MLP; K and V after Q when they are separate GEMMs).
    const std::array<std::int64_t, 3> exact{gs->m, gs->k, gs->n};
    if (g.kind == linear_pass::forward && same_rank && previous + 1 == i && out.back().kind == linear_pass::forward &&
        traced.back() == exact) {
      g.shared_input = true;
    }
    previous = i;
    out.push_back(g);
    dims.push_back(d);
    traced.push_back(exact);
    rank_of.push_back(c.rank);
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i].kind != linear_pass::input_gradient) continue;
    const bool paired = i + 1 < out.size() && rank_of[i + 1] == rank_of[i] && out[i + 1].kind == linear_pass::weight_gradient &&
                        dims[i + 1] == dims[i];
    if (!paired) out[i].kind = linear_pass::forward, out[i].recompute = true;
  }
  return out;
}

/// The tasks right before each task on its processor (no_task for the first).
[[nodiscard]] inline std::vector<graph::task_id> previous_on_processor(const graph::task_graph& g) {
  std::vector<graph::task_id> prev(g.task_count(), graph::no_task), last(g.processors.size(), graph::no_task);
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    prev[t] = last[g.processor[t]];
    last[g.processor[t]] = t;
  }
  return prev;
}

}  // namespace detail

/// What a precision change did.
struct precision_stats {
  std::size_t gemms = 0;       ///< GEMMs rescaled
  std::size_t casts = 0;       ///< cast and amax kernels inserted
  std::size_t unlaunched = 0;  ///< of `casts`, inserted without a launch call (the GEMM's call starts its thread)
  std::size_t skipped = 0;     ///< casts not inserted: the GEMM starts its stream
  time_ns gemm_before = 0, gemm_after = 0, cast_time = 0;
};

/// Rewrites the linear GEMMs `gemms` of `b` for fp8 (see the header comment): `costs` are the
/// traced GPU's (the casts' time), `target` and `target_profile` the GPU the GEMMs' ratio is taken
/// on, `traced` the traces' precision. Renumbers the graph's tasks. O(tasks + edges).
inline precision_stats rewrite_fp8(graph::built_job& b, const std::vector<layer_gemm>& gemms, const shape_costs& costs,
                                   const model::hardware& target, const model::cost_profile& target_profile, model::precision traced,
                                   model::fp8_scaling scaling) {
  graph::task_graph& g = b.graph;
  const model::kernel_level source{.profile = costs.profile}, on_target{.profile = target_profile};
  const double peak8 = target.peak_flops(model::precision::fp8), peak16 = target.peak_flops(traced);
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> launch_of(g.task_count(), none);
  for (std::uint32_t i = 0; i < g.edges.size(); ++i) {
    if (g.edges[i].kind == graph::edge_kind::launch) launch_of[g.edges[i].to] = i;
  }
  const std::vector<graph::task_id> prev = detail::previous_on_processor(g);
  precision_stats st;
  std::vector<insertion> ins;
  std::vector<std::uint32_t> launch_edge;  // per insertion: a launch call's GEMM launch edge (none for a kernel)
  for (const layer_gemm& lg : gemms) {
    const graph::task_id t = lg.task;
    const double M = static_cast<double>(lg.to.m), N = static_cast<double>(lg.to.n), K = static_cast<double>(lg.to.k);
    const double c_bytes = lg.kind == linear_pass::weight_gradient ? 8.0 : 2.0;
    const double min_ns = target_profile.min_kernel_ns;
    const double ratio = std::max(on_target.gemm_ns(target, peak8, 1.0, M, N, K, c_bytes), min_ns) /
                         std::max(on_target.gemm_ns(target, peak16, 2.0, M, N, K, c_bytes), min_ns);
    st.gemm_before += g.duration[t];
    g.duration[t] = static_cast<time_ns>(std::llround(static_cast<double>(g.duration[t]) * ratio));
    st.gemm_after += g.duration[t];
    ++st.gemms;
    const model::op_phase phase = lg.kind == linear_pass::forward          ? model::op_phase::forward
                                  : lg.kind == linear_pass::input_gradient ? model::op_phase::backward_input
                                                                           : model::op_phase::backward_weight;
    std::array<model::fp8_cast, 4> casts;
    const std::size_t n = model::fp8_casts(scaling, lg.shared_input ? model::op_role::mlp_up : model::op_role::qkv, phase,
                                           lg.recompute, M, N, K, 1.0, lg.shared_input, casts);
    if (n == 0) continue;
    if (prev[t] == graph::no_task) {
      st.skipped += n;
      continue;
    }
    const bool forward = phase == model::op_phase::forward || lg.recompute;
    const std::uint32_t l = launch_of[t];
    const graph::task_id call = l != none ? g.edges[l].from : graph::no_task;
    const bool launched = call != graph::no_task && prev[call] != graph::no_task;
    const time_ns at = g.observed_start[t];
    for (std::size_t i = 0; i < n; ++i) {
      const model::fp8_cast& c = casts[i];
      const time_ns gpu = static_cast<time_ns>(std::llround(
          std::max(source.vector_ns(costs.hw, model::op_class::elementwise, c.flops, c.bytes), costs.profile.min_kernel_ns)));
      if (launched) {
        const double host = forward ? costs.profile.cpu_forward_op_ns : costs.profile.cpu_backward_op_ns;
        ins.push_back({.after = prev[call],
                       .spec = {.kind = graph::task_kind::cpu, .duration = static_cast<time_ns>(std::llround(costs.profile.cpu_launch_ns)),
                                .busy_gap = static_cast<time_ns>(std::llround(host)), .rank = g.rank[t],
                                .observed_start = g.observed_start[call], .observed_end = g.observed_start[call]},
                       .name = "cudaLaunchKernel"});
        launch_edge.push_back(l);
      } else {
        ++st.unlaunched;
      }
      ins.push_back({.after = prev[t],
                     .spec = {.kind = graph::task_kind::gpu_compute, .duration = gpu, .rank = g.rank[t], .observed_start = at,
                              .observed_end = at},
                     .name = synth::kernel_names::fp8_kernel(c.role)});
      launch_edge.push_back(none);
      st.cast_time += gpu;
      ++st.casts;
    }
  }
  edited_graph e = insert_after(g, ins);
  // Each launch call is followed in `ins` by the kernel it launches.
  for (std::size_t i = 0; i + 1 < ins.size(); ++i) {
    if (launch_edge[i] == none) continue;
    const graph::edge& le = g.edges[launch_edge[i]];
    e.graph.add_edge(e.inserted[i], e.inserted[i + 1], le.delay, graph::edge_kind::launch, le.flags());
  }
  (void)adopt(b, std::move(e));
  return st;
}

/// Pass: another training precision (`--precision`). From bf16 or fp16 traces to fp8 it rewrites
/// the layers' linear GEMMs and inserts their casts (`rewrite_fp8`); to the traces' own precision
/// it changes nothing; from fp8 traces, or between the 16-bit formats, it is refused with an error.
/// It runs after the tensor-parallel change and before the layers and micro-batches are copied,
/// so that the copies carry the casts.
struct precision_pass {
  [[nodiscard]] bool wanted(const context& ctx) const noexcept { return ctx.options.precision.has_value(); }
  [[nodiscard]] change_list apply(context& ctx, graph::built_job& b) const {
    const model::precision want = *ctx.options.precision;
    const job_structure& st = ctx.structure(b);
    const shape_costs costs = ctx.costs(b);
    const std::string traced_name = st.model.dtype.value.value_or("bf16");
    const model::precision traced = traced_name == "fp8" ? model::precision::fp8 : traced_name == "fp16" ? model::precision::fp16
                                                                                                       : model::precision::bf16;
    const std::string to_name(model::to_string(want));
    if (want == traced) {
      return {note("precision", "precision", "--precision " + to_name + ": the traces' GEMMs already run in " + traced_name +
                                                 " (" + st.model.dtype.source + "); nothing to change")};
    }
    if (traced == model::precision::fp8 || want != model::precision::fp8) {
      throw error("whatif --precision " + to_name + ": from " + traced_name +
                  " traces only --precision fp8 is supported (fp8 traces cannot be rewritten to 16-bit GEMMs)");
    }
    const model::hardware& target = ctx.target_gpu ? *ctx.target_gpu : costs.hw;
    if (target.gpu.fp8_flops <= 0) throw error("whatif --precision fp8: the " + target.name + " has no fp8 tensor cores");
    const model::cost_profile target_profile = ctx.target_gpu ? model::profile_preset(target.name) : costs.profile;
    shape_config from, to;
    try {
      from = ctx.shape_from ? *ctx.shape_from : traced_shape(st);
      to = ctx.shape_to ? *ctx.shape_to : from;
    } catch (const error& e) {
      throw error(std::string("whatif --precision fp8 needs the traces' layer shapes: ") + e.what());
    }
    const std::vector<layer_gemm> gemms = detail::find_layer_gemms(ctx.job, b, st, from, to);
    if (gemms.empty()) throw error("whatif --precision fp8: no linear GEMM of a transformer layer with recorded shapes in the traces");
    const model::fp8_scaling scaling = model::fp8_scaling::delayed;
    const precision_stats s = rewrite_fp8(b, gemms, costs, target, target_profile, traced, scaling);
    ctx.refresh(b);
    char line[1024];
    std::snprintf(line, sizeof line,
                  "%s -> fp8 (Transformer Engine, %s scaling): %zu linear GEMMs of the layers rescaled by the kernel model's fp8 / %s "
                  "time of their shape on the %s, %.3f -> %.3f ms; %zu cast kernels inserted before them (input and weight before "
                  "each forward GEMM, the output gradient before each input gradient), %.3f ms on the %s with %.1f us of host time "
                  "each in forward, %.1f us in backward%s%s; attention, logits, norms, optimizer and communication as traced",
                  traced_name.c_str(), std::string(model::to_string(scaling)).c_str(), s.gemms, traced_name.c_str(), target.name.c_str(),
                  static_cast<double>(s.gemm_before) / 1e6, static_cast<double>(s.gemm_after) / 1e6, s.casts,
                  static_cast<double>(s.cast_time) / 1e6, costs.hw.name.c_str(),
                  (costs.profile.cpu_launch_ns + costs.profile.cpu_forward_op_ns) / 1e3,
                  (costs.profile.cpu_launch_ns + costs.profile.cpu_backward_op_ns) / 1e3,
                  s.skipped > 0 ? " (casts of GEMMs that start their stream skipped)" : "",
                  s.unlaunched > 0 ? " (casts of GEMMs whose launch starts its thread inserted without a launch call)" : "");
    change_list out;
    if (!st.model.dtype.value) {
      out.push_back(note("precision", "traced precision", "the traces' GEMMs taken as bf16: " + st.model.dtype.source));
    }
    out.push_back(changed("precision", "precision", traced_name, "fp8", line,
                          {count_figure("GEMMs rescaled", s.gemms), count_figure("cast kernels inserted", s.casts),
                           time_figure("layer GEMM time", s.gemm_before, s.gemm_after), time_figure("cast kernel time", 0, s.cast_time)}));
    return out;
  }
};
static_assert(Rewrite<precision_pass>);

}  // namespace lumos::whatif

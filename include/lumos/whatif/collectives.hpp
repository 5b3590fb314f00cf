#pragma once
// The traced collectives as the what-if rewrites read them: the groups of a role, the model kind
// of a collective, its element size, a latency + bandwidth fit of the traces' own collectives,
// and the communication ops whose peers are absent from the job.

#include <lumos/core/error.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

/// Latency + bandwidth fit of one collective kind: t = alpha + bus_factor(n)·bytes / busbw.
struct comm_fit {
  double alpha_ns = 0;   ///< fixed time per collective
  double busbw = 0;      ///< bytes/ns on the bus (nccl-tests convention)
  std::size_t samples = 0;
  std::string how;       ///< "least squares over K collectives", "one size: bandwidth only", ...

  [[nodiscard]] double time_ns(model::collective c, double bytes, std::int64_t n) const noexcept {
    if (n <= 1 || bytes <= 0) return 0.0;
    return alpha_ns + model::bus_factor(c, n) * bytes / busbw;
  }
};

/// The names of the process groups structure discovery gave `role`.
[[nodiscard]] inline std::set<std::string> groups_with_role(const job_structure& st, group_role role) {
  std::set<std::string> out;
  for (const auto& pg : st.groups) {
    for (const auto& r : pg.roles) {
      if (r.value == role) out.insert(pg.name);
    }
  }
  return out;
}

/// The model kind of a graph collective's kind string, if it is one the fit knows.
[[nodiscard]] inline std::optional<model::collective> collective_of_kind(std::string_view kind) {
  std::string k(kind);
  std::erase(k, '_');
  if (k == "allreduce") return model::collective::all_reduce;
  if (k == "allgather") return model::collective::all_gather;
  if (k == "reducescatter") return model::collective::reduce_scatter;
  if (k == "broadcast") return model::collective::broadcast;
  if (k == "alltoall") return model::collective::all_to_all;
  return std::nullopt;
}

/// Bytes per element of the data type an NCCL kernel's name carries (ncclDevKernel_AllReduce_
/// Sum_f32_RING_LL: 4; NCCL before 2.19, ncclKernel_AllReduce_RING_LL_Sum_float: 4), else 1: a
/// traced `collective_instance::bytes` counts elements (In msg nelems), and the NCCL model wants
/// bytes. All-gather and send/recv kernels name no type (they copy bytes): 1, their elements.
[[nodiscard]] inline std::int64_t element_bytes_of_kernel(std::string_view name) noexcept {
  struct type {
    std::string_view token;
    std::int64_t bytes;
  };
  constexpr type types[] = {{"_f32_", 4}, {"_bf16_", 2}, {"_f16_", 2}, {"_f64_", 8}, {"_i32_", 4}, {"_u32_", 4},
                            {"_i64_", 8}, {"_u64_", 8}, {"_i8_", 1}, {"_u8_", 1}, {"_bfloat16", 2}, {"_half", 2},
                            {"_double", 8}, {"_float", 4}};
  for (const type& t : types) {
    if (name.find(t.token) != std::string_view::npos) return t.bytes;
  }
  return 1;
}

/// Bytes per element of a traced collective's message: its `dtype` arg, else the type its kernel's
/// name carries (`element_bytes_of_kernel`), else 1.
[[nodiscard]] inline std::int64_t element_bytes_of(const graph::collective_instance& ci, const graph::task_graph& g) noexcept {
  if (ci.element_bytes > 0) return ci.element_bytes;
  return ci.complete.empty() ? 1 : element_bytes_of_kernel(g.task_name(ci.complete.front()));
}

/// Fits `comm_fit` for kind `c` on every matched instance of that kind in `g` with a known size:
/// x = bus_factor(n)·bytes, y = the transfer time (mean over participants). Least squares when
/// the sizes differ and the fit is physical (alpha ≥ 0, bandwidth > 0), else bandwidth through
/// the origin. Throws when no instance has a size.
[[nodiscard]] inline comm_fit fit_collective(const graph::task_graph& g, model::collective c) {
  std::vector<double> xs, ys;
  for (const auto& ci : g.collectives) {
    const auto k = collective_of_kind(ci.kind);
    if (!k || *k != c || ci.bytes <= 0 || ci.complete.empty()) continue;
    const auto n = static_cast<std::int64_t>(ci.group_ranks.empty() ? ci.complete.size() : ci.group_ranks.size());
    if (n <= 1) continue;
    double sum = 0;
    for (const graph::task_id t : ci.complete) sum += static_cast<double>(g.duration[t]);
    xs.push_back(model::bus_factor(c, n) * static_cast<double>(ci.bytes * element_bytes_of(ci, g)));
    ys.push_back(sum / static_cast<double>(ci.complete.size()));
  }
  if (xs.empty()) throw error("whatif --dp: the trace has no sized collective of this kind to fit a communication model on");
  comm_fit f;
  f.samples = xs.size();
  const double n = static_cast<double>(xs.size());
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) mx += xs[i] / n, my += ys[i] / n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  if (xs.size() >= 2 && sxx > 0 && sxy > 0 && my - sxy / sxx * mx >= 0) {
    f.busbw = sxx / sxy;
    f.alpha_ns = my - mx / f.busbw;
    f.how = "least squares over " + std::to_string(xs.size()) + " collectives";
  } else {
    f.busbw = my > 0 ? mx / my : 1.0;
    f.alpha_ns = 0;
    f.how = "bandwidth through the origin over " + std::to_string(xs.size()) + " collective(s) (sizes too alike for a latency)";
  }
  return f;
}

/// A communication op whose peers are absent from the job (traces written one rank per pipeline
/// stage: its DP partners were not written), with what its arguments say. Unmatched, it is a
/// single gpu_comm task, not a `collective_instance`, and `resize_data_parallel` resizes it as it
/// does the matched ones.
struct lone_collective {
  graph::task_id task = graph::no_task;  ///< its gpu_comm task
  graph::task_id arrive = graph::no_task;  ///< its comm_arrive task (its peer wait leads to `task`)
  std::string group;                     ///< Process Group Name ("" when not recorded)
  std::string kind;                      ///< "allreduce", "reducescatter", ... (detail::comm_kind)
  std::int64_t elements = 0;             ///< In msg nelems, as collective_instance::bytes (0: unknown)
  std::int64_t element_bytes = 1;        ///< bytes per element: its dtype, else its kernel's name, else 1
  std::int64_t group_size = 0;           ///< Group size (0: unknown)
};

/// The communication ops of `job` that matched no peer, read from their args or from those of
/// the record_param_comms op that carries them. Needs the event-to-task maps (`b.ranks`).
[[nodiscard]] inline std::vector<lone_collective> lone_collectives(const trace::job& job, const graph::built_job& b) {
  std::vector<lone_collective> out;
  for (std::size_t ri = 0; ri < job.ranks.size() && ri < b.ranks.size(); ++ri) {
    const trace::rank_trace& t = job.ranks[ri];
    const auto& task_of = b.ranks[ri].task_of_event;
    const detail::comm_args_source args_of(t);
    for (std::uint32_t i = 0; i < t.events.size() && i < task_of.size(); ++i) {
      const graph::task_id task = task_of[i];
      if (task == graph::no_task || task >= b.graph.task_count() || b.graph.kind[task] != graph::task_kind::gpu_comm) continue;
      const std::uint32_t src = args_of.of(i);
      lone_collective c;
      c.task = task;
      const auto& arrive_of = b.ranks[ri].arrive_of_event;
      if (i < arrive_of.size()) c.arrive = arrive_of[i];
      c.group = std::string(t.arg_text(src, trace::arg_key::process_group_name));
      c.kind = detail::comm_kind(t.name(t.events[i]), t.arg_text(src, trace::arg_key::collective_name));
      if (const auto v = t.arg(src, trace::arg_key::in_msg_nelems)) c.elements = *v;
      c.element_bytes = trace::dtype_bytes(t.arg_text(src, trace::arg_key::dtype));
      if (c.element_bytes == 0) c.element_bytes = element_bytes_of_kernel(b.graph.task_name(task));
      if (const auto v = t.arg(src, trace::arg_key::group_size)) c.group_size = detail::group_size_of(*v).value_or(0);
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace lumos::whatif

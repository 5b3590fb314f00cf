#pragma once
// Calibration: fit a `cost_profile` from the kernels, CPU ops and NCCL kernels of real traces
// (`lumos calibrate`). Reads events only (trace/event.hpp); no JSON parsing here.

#include <lumos/core/error.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/event.hpp>
#include <lumos/trace/runtime_calls.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lumos::model {

/// One GEMM measured in a trace: (batch of) M x N x K and its kernel time.
struct gemm_sample {
  double batch = 1, m = 0, n = 0, k = 0;
  double ns = 0;
  [[nodiscard]] double efficiency(double peak) const { return 2.0 * batch * m * n * k / (ns * 1e-9) / peak; }
};

/// One collective's transfer: kind, bytes (nccl-tests convention), group size and the shortest
/// participant's kernel time (the others include waiting for their peers).
struct collective_sample {
  collective kind = collective::all_reduce;
  double bytes = 0;
  std::int64_t group = 1;
  double ns = 0;
  bool ll = false;  ///< LL protocol kernel
};

/// What calibration measured, with the fitted profile.
struct calibration {
  cost_profile profile;
  std::vector<gemm_sample> gemms;  ///< one per distinct shape, median time
  std::vector<collective_sample> collectives;
  std::map<std::string, double> memory_fractions;  ///< class -> median fraction of HBM peak
  double launch_ns = 0;
  double forward_op_ns = 0;
  double host_sync_ns = 0;  ///< synchronize calls inside the top-level CPU ops (not counted as dispatch)
  std::size_t kernels = 0;
  std::size_t ranks = 0;
  std::string gpu_name;
  double gemm_rms_log_error = 0;  ///< of the fitted efficiency curve over `gemms`
  std::vector<std::string> notes;  ///< further fits (e.g. whatif::fit_to_traced_configuration), one line each
};

namespace detail {

// Parses "[[a, b], [c], []]" into lists of integers (dims of each input).
[[nodiscard]] inline std::vector<std::vector<double>> parse_dims(std::string_view s) {
  std::vector<std::vector<double>> out;
  int depth = 0;
  double cur = 0;
  bool in_num = false;
  for (const char c : s) {
    if (c == '[') {
      ++depth;
      if (depth == 2) out.emplace_back();
    } else if (c >= '0' && c <= '9') {
      cur = cur * 10 + (c - '0');
      in_num = true;
    } else {
      if (in_num && depth >= 2 && !out.empty()) out.back().push_back(cur);
      cur = 0;
      in_num = false;
      if (c == ']') --depth;
    }
  }
  return out;
}

[[nodiscard]] inline double elements(const std::vector<double>& d) {
  if (d.empty()) return 0;
  double n = 1;
  for (const double x : d) n *= x;
  return n;
}

[[nodiscard]] inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[nodiscard]] inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// GEMM shape from an aten op name and its Input Dims; false when it is not a GEMM we know.
[[nodiscard]] inline bool gemm_of(std::string_view op, const std::vector<std::vector<double>>& d, gemm_sample& g) {
  auto two = [&](std::size_t a, std::size_t b) { return d.size() > b && d[a].size() == 2 && d[b].size() == 2; };
  auto three = [&](std::size_t a, std::size_t b) { return d.size() > b && d[a].size() == 3 && d[b].size() == 3; };
  if (op == "aten::mm" && two(0, 1)) {
    g = {1, d[0][0], d[1][1], d[0][1], 0};
  } else if (op == "aten::addmm" && two(1, 2)) {
    g = {1, d[1][0], d[2][1], d[1][1], 0};
  } else if (op == "aten::bmm" && three(0, 1)) {
    g = {d[0][0], d[0][1], d[1][2], d[0][2], 0};
  } else if (op == "aten::baddbmm" && three(1, 2)) {
    g = {d[1][0], d[1][1], d[2][2], d[1][2], 0};
  } else {
    return false;
  }
  return g.m > 0 && g.n > 0 && g.k > 0;
}

}  // namespace detail

/// Least-squares fit (in log efficiency) of `gemm_max` and `gemm_half_dim` to `samples`,
/// half_dim on a fixed log grid from 1 to 4096 (deterministic). Returns the RMS log error.
inline double fit_gemm(const std::vector<gemm_sample>& samples, double peak, cost_profile& p) {
  if (samples.empty()) return 0;
  double best = 1e300;
  for (int i = 0; i <= 480; ++i) {
    const double h = std::pow(2.0, i / 40.0);
    double sum = 0;
    for (const auto& g : samples) sum += std::log(g.efficiency(peak)) - std::log(g.m / (g.m + h) * g.n / (g.n + h) * g.k / (g.k + h));
    // The efficiency cannot exceed 1: a half_dim whose unclamped fit needs a larger maximum is
    // judged with the clamped one it would get (else tiny GEMMs pick a curve scaled far off).
    const double log_max = std::min(0.0, sum / static_cast<double>(samples.size()));
    double err = 0;
    for (const auto& g : samples) {
      const double r = std::log(g.efficiency(peak)) - log_max - std::log(g.m / (g.m + h) * g.n / (g.n + h) * g.k / (g.k + h));
      err += r * r;
    }
    if (err < best) {
      best = err;
      p.gemm_half_dim = h;
      p.gemm_max = std::exp(log_max);
    }
  }
  return std::sqrt(best / static_cast<double>(samples.size()));
}

namespace detail {

/// A rank's CPU ops by start, for the innermost op that encloses a runtime call.
class enclosing_ops {
 public:
  /// `ops`: indices of the CPU ops among `r`'s events, in any order.
  enclosing_ops(const trace::rank_trace& r, std::vector<std::size_t> ops) : ev_(r.events), ops_(std::move(ops)) {
    std::sort(ops_.begin(), ops_.end(), [&](std::size_t a, std::size_t b) {
      return ev_[a].ts != ev_[b].ts ? ev_[a].ts < ev_[b].ts : ev_[a].dur > ev_[b].dur;
    });
    start_.reserve(ops_.size());
    for (const std::size_t i : ops_) start_.push_back(ev_[i].ts);
  }

  /// The ops by start (the longer first).
  [[nodiscard]] const std::vector<std::size_t>& ops() const noexcept { return ops_; }

  /// The event index of the latest-starting op of `call`'s lane that encloses it, -1 if none
  /// among the 256 ops that start last before it.
  [[nodiscard]] std::ptrdiff_t innermost(const trace::event& call) const {
    auto it = std::upper_bound(start_.begin(), start_.end(), call.ts);
    std::ptrdiff_t best = -1;
    std::size_t scanned = 0;
    while (it != start_.begin() && scanned < 256) {
      --it;
      ++scanned;
      const std::size_t i = ops_[static_cast<std::size_t>(it - start_.begin())];
      if (ev_[i].lane == call.lane && ev_[i].ts <= call.ts && call.ts <= ev_[i].end()) {
        if (best < 0 || ev_[i].ts >= ev_[static_cast<std::size_t>(best)].ts) best = static_cast<std::ptrdiff_t>(i);
        if (ev_[i].ts < call.ts) break;
      }
    }
    return best;
  }

 private:
  const recyclable_vector<trace::event>& ev_;
  std::vector<std::size_t> ops_;
  std::vector<time_ns> start_;
};

/// Host time of `r`'s top-level CPU ops (not inside another op of the same lane; `ops` by start)
/// and, second, the synchronize calls inside them, which the first leaves out: waiting for the
/// GPU (`.item()` at the end of a GPU-bound step) is not dispatch work.
[[nodiscard]] inline std::pair<double, double> top_level_host_time(const trace::rank_trace& r, const std::vector<std::size_t>& ops) {
  const auto& ev = r.events;
  double busy = 0, sync = 0;
  std::vector<std::size_t> by_lane = ops;
  std::stable_sort(by_lane.begin(), by_lane.end(), [&](std::size_t a, std::size_t b) { return ev[a].lane < ev[b].lane; });
  time_ns end = -1;
  std::uint32_t lane = ~0U;
  std::vector<std::tuple<std::uint32_t, time_ns, time_ns>> counted;  // lane, start, end (sorted)
  for (const std::size_t i : by_lane) {
    if (ev[i].lane != lane) {
      lane = ev[i].lane;
      end = -1;
    }
    if (ev[i].ts >= end) {
      end = ev[i].end();
      const auto n = r.name(ev[i]);
      if (!contains(n, "ProfilerStep") && !contains(n, "record_param_comms")) {
        busy += static_cast<double>(ev[i].dur);
        counted.emplace_back(ev[i].lane, ev[i].ts, ev[i].end());
      }
    }
  }
  for (const auto& e : ev) {
    if (e.ph != trace::phase::complete || e.cat != trace::category::cuda_runtime || !contains(r.name(e), "Synchronize")) continue;
    auto it = std::upper_bound(counted.begin(), counted.end(), std::tuple{e.lane, e.ts, std::numeric_limits<time_ns>::max()});
    if (it != counted.begin() && std::get<0>(*--it) == e.lane && std::get<1>(*it) <= e.ts && e.end() <= std::get<2>(*it)) {
      busy -= static_cast<double>(e.dur);
      sync += static_cast<double>(e.dur);
    }
  }
  return {busy, sync};
}

/// The transfer of NCCL kernel `i` of `r` (named `kname`, under an op with Input Dims `dims`) as
/// a sample, its group `world` unless the kernel states its own; nullopt for the point-to-point
/// kernels (pipeline send/recv, all-to-all as SendRecv) and broadcasts, which are no ring
/// collective: they would be fitted as all-reduces.
[[nodiscard]] inline std::optional<collective_sample> collective_sample_of(const trace::rank_trace& r, std::size_t i, std::string_view kname,
                                                                           const std::vector<std::vector<double>>& dims, int world) {
  if (contains(kname, "SendRecv") || contains(kname, "_Send") || contains(kname, "_Recv") || contains(kname, "AllToAll") ||
      contains(kname, "Broadcast")) {
    return std::nullopt;
  }
  collective_sample c;
  c.kind = contains(kname, "AllGather") ? collective::all_gather : contains(kname, "ReduceScatter") ? collective::reduce_scatter : collective::all_reduce;
  const std::string_view dtype = r.arg_text(i, trace::arg_key::dtype);
  const double elem = dtype == "Float" || dtype == "Int" || contains(kname, "f32") || contains(kname, "float") ? 4.0
                      : dtype == "Double" || dtype == "Long"                                                   ? 8.0
                                                                                                               : 2.0;
  // The group: the kernel's own "Group size" (PyTorch >= 2.1), else the world.
  c.group = world;
  if (const auto g = r.arg(i, trace::arg_key::group_size); g && *g > 0) c.group = *g;
  // The size by the convention of `collective` (all-gather: the gathered output): the
  // kernel's own message size when it has one, else its operator's Input Dims.
  const auto nelems = r.arg(i, c.kind == collective::all_gather ? trace::arg_key::out_msg_nelems : trace::arg_key::in_msg_nelems);
  if (nelems && *nelems > 0) {
    c.bytes = static_cast<double>(*nelems) * elem;
  } else if (!dims.empty()) {
    c.bytes = elements(dims.front()) * elem * (c.kind == collective::all_gather ? static_cast<double>(c.group) : 1.0);
  }
  c.ns = static_cast<double>(r.events[i].dur);
  c.ll = contains(kname, "_LL") && !contains(kname, "LL128");
  return c;
}

/// The fraction of HBM peak `hw` that a memory-bound kernel of `dur` ns under an op with Input
/// Dims `dims` reaches: 2 B x (all inputs + the largest input as output).
[[nodiscard]] inline double memory_fraction(const std::vector<std::vector<double>>& dims, time_ns dur, const hardware& hw) {
  double in = 0, largest = 0;
  for (const auto& d : dims) {
    in += elements(d);
    largest = std::max(largest, elements(d));
  }
  const double bytes = 2.0 * (in + largest);
  return bytes / (static_cast<double>(dur) * 1e-9) / hw.gpu.hbm_bandwidth;
}

/// The memory-bound kernel class of an op: norm, softmax or elementwise.
[[nodiscard]] inline std::string memory_class(std::string_view op_name) {
  return contains(op_name, "Norm") || contains(op_name, "norm") ? "norm" : contains(op_name, "oftmax") ? "softmax" : "elementwise";
}

/// What calibration reads from the events of every rank, before the fits.
struct calibration_samples {
  std::map<std::string, std::vector<double>> gemm_times;  // "b m n k" -> times
  std::map<std::string, gemm_sample> gemm_shapes;
  std::map<std::string, std::vector<double>> mem_fracs;  // class -> fractions of HBM peak
  std::vector<double> kernel_durs, launches;
  double host_busy = 0;  // top-level CPU op time, all ranks
  double host_sync = 0;  // synchronize calls inside it
  std::size_t kernels = 0;
  // Each collective by (process group, position among the group's collectives on its rank):
  // the participants of one instance share the key, whichever ranks the traces hold.
  std::map<std::pair<std::string, std::size_t>, collective_sample> instances;

  /// Adds the launches, host time and kernels of `r`; `world` the group of a collective
  /// kernel that states none, `hw` the hardware the memory-bound fractions are of.
  void add_rank(const trace::rank_trace& r, int world, const hardware& hw) {
    const auto& ev = r.events;
    std::unordered_map<std::int64_t, std::size_t> runtime_of;  // correlation -> event
    std::vector<std::size_t> ops;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      const auto& e = ev[i];
      if (e.ph != trace::phase::complete) continue;
      if ((e.cat == trace::category::cuda_runtime || e.cat == trace::category::cuda_driver) && e.correlation >= 0) {
        runtime_of[e.correlation] = i;
        const auto n = r.name(e);
        if (trace::is_kernel_launch_call(n)) launches.push_back(static_cast<double>(e.dur));
      }
      if (e.cat == trace::category::cpu_op) ops.push_back(i);
    }
    const enclosing_ops enclosing(r, std::move(ops));
    const auto [busy, waited] = top_level_host_time(r, enclosing.ops());
    host_busy += busy, host_sync += waited;
    std::map<std::string, std::size_t, std::less<>> seen_in_group;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      const auto& e = ev[i];
      if (e.cat != trace::category::kernel || e.ph != trace::phase::complete || e.dur <= 0) continue;
      ++kernels;
      kernel_durs.push_back(static_cast<double>(e.dur));
      const auto rt = runtime_of.find(e.correlation);
      const std::ptrdiff_t op = rt != runtime_of.end() ? enclosing.innermost(ev[rt->second]) : -1;
      add_kernel(r, i, op, world, hw, seen_in_group);
    }
  }

 private:
  /// Adds kernel `i` of `r`, launched under CPU op `op` (-1: none), as a collective, GEMM or
  /// memory-bound sample, if it is one.
  void add_kernel(const trace::rank_trace& r, std::size_t i, std::ptrdiff_t op, int world, const hardware& hw,
                  std::map<std::string, std::size_t, std::less<>>& seen_in_group) {
    const auto& e = r.events[i];
    const auto kname = r.name(e);
    const std::string_view op_name = op >= 0 ? r.name(r.events[static_cast<std::size_t>(op)]) : std::string_view{};
    const auto dims = op >= 0 ? parse_dims(r.arg_text(static_cast<std::size_t>(op), trace::arg_key::input_dims))
                              : std::vector<std::vector<double>>{};
    if (kname.substr(0, 4) == "nccl") {
      const auto c = collective_sample_of(r, i, kname, dims, world);
      if (!c) return;
      std::string group(r.arg_text(i, trace::arg_key::process_group_name));
      const std::size_t k = seen_in_group[group]++;
      auto [it, added] = instances.try_emplace({std::move(group), k}, *c);
      if (!added) it->second.ns = std::min(it->second.ns, c->ns);  // the shortest participant is the transfer
      return;
    }
    gemm_sample g;
    if (gemm_of(op_name, dims, g)) {
      char key[128];
      std::snprintf(key, sizeof key, "%.0f %.0f %.0f %.0f", g.batch, g.m, g.n, g.k);
      gemm_times[key].push_back(static_cast<double>(e.dur));
      gemm_shapes[key] = g;
      return;
    }
    if (dims.empty() || e.dur < 20000) return;
    // Multi-tensor (optimizer, gradient-norm, unscale) kernels sweep every parameter, not their
    // op's Input Dims (one tensor of the list): their bandwidth is the optimizer's, fitted on
    // the optimizer phase (whatif::fit_to_traced_configuration). As elementwise or norm
    // kernels ("multi_tensor_l2norm") they made those fractions 0.02 on a small model.
    if (contains(kname, "multi_tensor") || contains(op_name, "multi_tensor") || contains(op_name, "_foreach_") ||
        contains(op_name, "non_finite_check")) {
      return;
    }
    const double frac = memory_fraction(dims, e.dur, hw);
    if (frac > 0 && frac <= 1.0) mem_fracs[memory_class(op_name)].push_back(frac);
  }
};

/// The base profile of a calibration: the preset of the GPU `ranks` name (setting
/// `out.gpu_name`), else `fallback` with a note in `out`.
[[nodiscard]] inline cost_profile base_profile(const std::vector<trace::rank_trace>& ranks, const cost_profile& fallback, calibration& out) {
  for (const auto& r : ranks) {
    if (!r.devices.empty()) {
      out.gpu_name = r.devices.front().name;
      break;
    }
  }
  // The preset of the traced GPU: the peak the efficiencies are measured against, and what the
  // parameters the traces do not show keep. Matched as whatif matches it ("h100-sxm", which
  // `lumos synth` writes, was taken for an unknown GPU: H100 kernels measured against the A100's
  // peak, efficiencies of 1.96 clipped to 1, and `predict --profile` twice too slow).
  const std::string preset = preset_of_device(out.gpu_name);
  cost_profile p = preset.empty() ? fallback : profile_preset(preset);
  if (preset.empty()) {
    out.notes.push_back("the traces' GPU " + (out.gpu_name.empty() ? std::string("is not named") : "'" + out.gpu_name + "' names no preset") +
                        ": efficiencies are measured against the " + p.hardware + " peak, and what the traces do not show keeps its preset");
  }
  return p;
}

/// Fits the GEMM efficiency (median time per shape), the memory-bound fractions, the minimum
/// kernel time and the host times of `p` from `s`, each with its provenance (`from` first).
inline void fit_kernels_and_host(calibration& out, calibration_samples& s, double peak, cost_profile& p, const std::string& from) {
  for (const auto& [key, times] : s.gemm_times) {
    gemm_sample g = s.gemm_shapes[key];
    g.ns = median(times);
    out.gemms.push_back(g);
  }
  if (!out.gemms.empty()) {
    out.gemm_rms_log_error = fit_gemm(out.gemms, peak, p);
    p.provenance["gemm.max_efficiency"] = from + std::to_string(out.gemms.size()) + " GEMM shapes, log least squares";
    p.provenance["gemm.half_dim"] = p.provenance["gemm.max_efficiency"];
  }
  for (const auto& [cls, v] : s.mem_fracs) {
    const double f = median(v);
    out.memory_fractions[cls] = f;
    const std::string key = "memory." + cls + "_bw_fraction";
    if (cls == "norm") p.norm_bw = f;
    if (cls == "softmax") p.softmax_bw = f;
    if (cls == "elementwise") p.elementwise_bw = f;
    p.provenance[key] = from + "median of " + std::to_string(v.size()) + " kernels >= 20 us";
  }
  if (!s.kernel_durs.empty()) {
    std::sort(s.kernel_durs.begin(), s.kernel_durs.end());
    p.min_kernel_ns = std::max(1000.0, s.kernel_durs[s.kernel_durs.size() / 100]);
    p.provenance["kernel.min_ns"] = from + "1st percentile of " + std::to_string(s.kernel_durs.size()) + " kernels";
  }
  if (!s.launches.empty()) {
    out.launch_ns = median(s.launches);
    p.cpu_launch_ns = out.launch_ns;
    p.provenance["cpu.launch_ns"] = from + "median of " + std::to_string(s.launches.size()) + " launch calls (profiler overhead included)";
  }
  if (s.host_busy > 0) {
    // All host time of the traced ops, spread over the kernels they launched: the glue ops
    // without kernels are folded in, so the layer glue term is dropped.
    out.forward_op_ns = std::max(0.0, s.host_busy / static_cast<double>(out.kernels) - out.launch_ns);
    p.cpu_forward_op_ns = out.forward_op_ns;
    p.cpu_collective_ns = out.forward_op_ns + out.launch_ns;
    p.cpu_layer_glue_ns = 0;
    const std::string what = from + "top-level CPU op time / kernels launched, minus one launch (kernel-less ops included; profiler overhead included)";
    p.provenance["cpu.forward_op_ns"] = what;
    p.provenance["cpu.collective_ns"] = what;
    p.provenance["cpu.layer_glue_ns"] = from + "0: folded into cpu.forward_op_ns";
  }
}

/// Fits the NCCL latency and bandwidths of `p` from `out.collectives` (one sample per instance,
/// its shortest participant's time: the others waited), each with its provenance.
inline void fit_collectives(const calibration& out, cost_profile& p, const std::string& from) {
  if (out.collectives.empty() || out.ranks <= 1) return;
  // The first of the smallest, in the order of (group name, position in the group): deterministic.
  const auto smallest = std::min_element(out.collectives.begin(), out.collectives.end(),
                                         [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  const double lat = smallest->ns;
  // Bus bandwidths of the messages >= 1 MiB, by what the model reads them as (model/nccl.hpp):
  // Simple all-reduces the all-reduce busbw when the profile has one (NVLS), other Simple
  // collectives the busbw, LL kernels a fraction of whichever of the two their kind uses (all
  // were once taken as LL of the busbw: an H100 job's LL all-reduces at 0.87 of the NVLS 480
  // GB/s fitted a fraction above 1 of 370, clipped to 1).
  std::vector<double> simple_allreduce, simple_other, ll_bw;
  std::vector<bool> ll_allreduce;
  for (const auto& c : out.collectives) {
    if (c.bytes < 1048576.0 || c.ns <= lat) continue;
    const double b = bus_factor(c.kind, c.group) * c.bytes / ((c.ns - lat) * 1e-9);
    const bool nvls = c.kind == collective::all_reduce && p.intra.allreduce_busbw > 0;
    if (c.ll) {
      ll_bw.push_back(b), ll_allreduce.push_back(nvls);
    } else {
      (nvls ? simple_allreduce : simple_other).push_back(b);
    }
  }
  const std::string simple_why = " messages >= 1 MiB (shortest participant)";
  if (!simple_other.empty()) {
    p.intra.busbw = median(simple_other);
    p.provenance["nccl.intra.busbw"] = from + "busbw of " + std::to_string(simple_other.size()) + simple_why;
  }
  if (!simple_allreduce.empty()) {
    p.intra.allreduce_busbw = median(simple_allreduce);
    p.provenance["nccl.intra.allreduce_busbw"] = from + "all-reduce busbw of " + std::to_string(simple_allreduce.size()) + simple_why;
  }
  const double steps = static_cast<double>(ring_steps(smallest->kind, smallest->group));
  if (smallest->ll) {
    p.intra.ll_base_ns = std::max(0.0, lat - steps * p.intra.ll_step_ns);
    p.provenance["nccl.intra.ll_base_ns"] = from + "shortest participant of the smallest collective minus the steps";
  }
  if (!ll_bw.empty()) {
    std::vector<double> fraction;
    for (std::size_t i = 0; i < ll_bw.size(); ++i) fraction.push_back(ll_bw[i] / (ll_allreduce[i] ? p.intra.allreduce_busbw : p.intra.busbw));
    p.intra.ll_fraction = std::min(1.0, median(fraction));
    p.provenance["nccl.intra.ll_fraction"] = from + "LL busbw of " + std::to_string(ll_bw.size()) +
                                             " messages >= 1 MiB (shortest participant) / the busbw of their kind";
  }
}

}  // namespace detail

/// The host entry of `ranks` (`cost_profile::host_ops`): the median duration of each ATen op
/// called at least `min_calls` times whose median is at most `max_ns`. Cheap, frequent ops
/// (views, empty, transposes, small in-place updates) are dispatch work: their time is the
/// host's speed (with the profiler's per-op cost, which any other profiled trace has as well),
/// not the GPU's or the shapes'.
[[nodiscard]] inline std::map<std::string, double> host_entry(const std::vector<trace::rank_trace>& ranks, std::size_t min_calls = 10,
                                                             double max_ns = 30000) {
  std::map<std::string, std::vector<double>, std::less<>> durations;
  for (const trace::rank_trace& r : ranks) {
    for (const trace::event& e : r.events) {
      if (e.cat != trace::category::cpu_op || e.ph != trace::phase::complete) continue;
      const std::string_view name = r.name(e);
      if (!name.starts_with("aten::")) continue;
      auto it = durations.find(name);
      if (it == durations.end()) it = durations.emplace(std::string(name), std::vector<double>{}).first;
      it->second.push_back(static_cast<double>(e.dur));
    }
  }
  std::map<std::string, double> out;
  for (auto& [name, d] : durations) {
    if (d.size() < min_calls) continue;
    std::sort(d.begin(), d.end());
    const std::size_t n = d.size();
    const double median = n % 2 == 1 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2;
    if (median > 0 && median <= max_ns) out.emplace(name, median);
  }
  return out;
}

/// Calibrates on `ranks` (one or more ranks of one run, e.g. `trace::load_job(...).ranks`). The base profile is the preset of the GPU
/// the traces name (deviceProperties, `preset_of_device`: A100, H100, H200, B200, GB200, MI300X; else `fallback`,
/// with a note); fitted values replace
/// it where the traces carry the evidence, each with its provenance:
///  - GEMM efficiency: every kernel launched inside aten::mm/addmm/bmm/baddbmm with Input Dims,
///    median time per shape, fitted by `fit_gemm` against the 16-bit dense peak;
///  - memory-bound bandwidth: kernels of other ops with Input Dims lasting >= 20 us, bytes =
///    2 B x (all inputs + the largest input as output), median fraction per class (norm,
///    softmax, elementwise);
///  - minimum kernel time: 1st percentile of kernel durations (at least 1 us);
///  - host: median launch call (`trace::is_kernel_launch_call`: CUDA and HIP); forward
///    op dispatch = top-level CPU op time / kernels launched - one launch (what the traced host
///    really spent per kernel, profiler overhead included; backward ops keep the preset when the
///    traces have none);
///  - the host entry (`host_entry`): medians of the cheap, frequent ATen ops, which another
///    trace's compare with (`relative_host_speed`: `whatif --host-speed PROFILE`);
///  - NCCL: the k-th all-reduce, all-gather or reduce-scatter kernel of a process group on each
///    rank is one collective (a group's ranks issue them in the same order; point-to-point,
///    all-to-all and broadcast kernels are left out); its transfer is the shortest participant;
///    its size the kernel's "In msg nelems" ("Out msg nelems" for an all-gather) times the size
///    of its dtype, else the enclosing record_param_comms Input Dims; its group the kernel's
///    "Group size", else the world. The smallest message gives the latency, messages >= 1 MiB
///    the bandwidth (LL kernels: the LL fraction).
/// Throws `lumos::error` when no rank has kernels.
[[nodiscard]] inline calibration calibrate(const std::vector<trace::rank_trace>& ranks, const std::string& source,
                                           const cost_profile& fallback = a100_profile()) {
  calibration out;
  out.ranks = ranks.size();
  cost_profile p = detail::base_profile(ranks, fallback, out);
  // The traces' own kernels set the efficiencies below: they are the speed of the traced run.
  p.at_scale = 1.0;
  p.provenance["compute.at_scale_fraction"] = "1: the efficiencies are measured on the traced run";
  const hardware hw = hardware_preset(p.hardware);
  detail::calibration_samples samples;
  for (const trace::rank_trace& r : ranks) samples.add_rank(r, r.world_size.value_or(static_cast<int>(ranks.size())), hw);
  out.kernels = samples.kernels;
  out.host_sync_ns = samples.host_sync;
  if (out.kernels == 0) throw error("calibrate: no GPU kernels in " + source);

  const std::string from = "calibrated from " + source + " (" + out.gpu_name + ", " + std::to_string(out.ranks) + " ranks): ";
  detail::fit_kernels_and_host(out, samples, hw.gpu.fp16_flops, p, from);
  for (const auto& [key, c] : samples.instances) {
    if (c.bytes > 0 && c.group > 1) out.collectives.push_back(c);
  }
  detail::fit_collectives(out, p, from);
  p.host_ops = host_entry(ranks);
  p.provenance["host_ops"] = from + "median durations of " + std::to_string(p.host_ops.size()) +
                             " ATen ops called >= 10 times with a median <= 30 us (profiler on)";
  p.name = "calibrated";
  validate(p);
  out.profile = p;
  return out;
}

}  // namespace lumos::model

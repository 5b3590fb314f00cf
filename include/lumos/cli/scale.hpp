#pragma once
// `--scale KIND=F` and `--scale op:TEXT=F` (lumos/cli/args.hpp), the duration multipliers of
// `lumos replay`, `report` and `whatif`, read into the graph's scales and op scales. The
// commands and the Python package's `lumos.whatif` read them here.

#include <lumos/cli/args.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/compile.hpp>
#include <lumos/model/profiler_cost.hpp>

#include <cmath>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::cli {

/// `--scale` items: the kind scales and the selective (op:TEXT=F) ones.
struct what_if {
  graph::scales scales;
  std::vector<graph::op_scale> ops;

  /// No item scales anything: every kind at 1 and no op scale.
  [[nodiscard]] bool none() const noexcept { return ops.empty() && scales.compute == 1.0 && scales.comm == 1.0 && scales.cpu == 1.0; }
};

/// The values of `--scale`, in order (a later kind overrides an earlier one; op scales add up
/// in order). Usage errors for a malformed item, an unknown kind or a factor out of range.
inline what_if parse_scales(const std::vector<std::string>& items) {
  what_if w;
  for (const auto& item : items) {
    // The factor follows the last '=': op patterns may contain '=' themselves.
    const auto eq = item.rfind('=');
    if (eq == std::string::npos) throw usage_error("--scale expects KIND=F or op:TEXT=F, e.g. compute=2 (got '" + item + "')");
    const std::string kind = item.substr(0, eq);
    const double f = parse_number<double>(std::string_view(item).substr(eq + 1), "--scale " + kind);
    if (kind.starts_with("op:")) {
      if (kind.size() == 3) throw usage_error("--scale op:TEXT=F needs a non-empty TEXT (got '" + item + "')");
      if (!(f >= 0) || f > 1e6) throw usage_error("--scale " + kind + " must be a factor from 0 to 1e6 (got " + item.substr(eq + 1) + ")");
      w.ops.push_back({kind.substr(3), f});
      continue;
    }
    if (!(f > 0) || f > 1e6) throw usage_error("--scale " + kind + " must be a factor above 0, at most 1e6 (got " + item.substr(eq + 1) + ")");
    if (kind == "compute") w.scales.compute = f;
    else if (kind == "comm") w.scales.comm = f;
    else if (kind == "cpu") w.scales.cpu = f;
    else throw usage_error("--scale: unknown kind '" + kind + "' (compute, comm, cpu or op:TEXT)");
  }
  return w;
}

/// `--profiler-cost`: the profiler's host time per recorded event, for the step without the
/// profiler — `Fx`, F times each rank's metadata operator time (`model::profiler_cost::
/// per_metadata_op`), or fixed costs in µs: `US` for every kind, or `KIND=US` items separated by
/// commas (kinds `op`, `runtime`, `python`; kinds left out keep the shipped
/// `model::fitted_profiler_cost`). Fixed costs replace the multiple. 0 everywhere: no estimate.
/// Usage errors for a malformed or empty item, an unknown or repeated kind or a cost out of range.
inline model::profiler_cost parse_profiler_cost(std::string_view text) {
  model::profiler_cost c = model::fitted_profiler_cost;
  if (!text.empty() && text.back() == 'x') {
    const double f = parse_number<double>(text.substr(0, text.size() - 1), "--profiler-cost");
    if (!(f > 0) || f > 1e3) throw usage_error("--profiler-cost Fx must have F above 0, at most 1000 (got " + std::string(text) + ")");
    c.per_metadata_op = f;
    return c;
  }
  c.per_metadata_op = 0;
  auto us = [&](std::string_view v, const std::string& what) {
    const double x = parse_number<double>(v, what);
    if (!(x >= 0) || x > 1e6) throw usage_error(what + " must be from 0 to 1e6 us (got " + std::string(v) + ")");
    return static_cast<time_ns>(std::llround(x * 1e3));
  };
  if (text.find('=') == std::string_view::npos) {
    c.per_op = c.per_runtime = c.per_python = us(text, "--profiler-cost");
    return c;
  }
  std::string seen = ",";
  for (bool more = true; more;) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    more = comma != std::string_view::npos;
    if (more) text = text.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) throw usage_error("--profiler-cost expects US or KIND=US,... (got '" + std::string(item) + "')");
    const std::string kind(item.substr(0, eq));
    if (seen.find("," + kind + ",") != std::string::npos) throw usage_error("--profiler-cost gives " + kind + " twice");
    seen += kind + ",";
    const time_ns v = us(item.substr(eq + 1), "--profiler-cost " + kind);
    if (kind == "op") c.per_op = v;
    else if (kind == "runtime") c.per_runtime = v;
    else if (kind == "python") c.per_python = v;
    else throw usage_error("--profiler-cost: unknown kind '" + kind + "' (op, runtime or python)");
  }
  return c;
}

/// The `--profiler-cost` of `a`, if given, as the replay's estimate of the step without the
/// profiler: unset when every cost is 0 (no estimate).
inline std::optional<model::profiler_cost> profiler_cost_option(args& a) {
  const auto v = a.option("--profiler-cost");
  if (!v) return model::fitted_profiler_cost;
  const model::profiler_cost c = parse_profiler_cost(*v);
  if (c.none()) return std::nullopt;
  return c;
}

}  // namespace lumos::cli

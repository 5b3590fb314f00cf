#pragma once
// `--scale KIND=F` and `--scale op:TEXT=F` (lumos/cli/args.hpp), the duration multipliers of
// `lumos replay`, `report` and `whatif`, read into the graph's scales and op scales. The
// commands and the Python package's `lumos.whatif` read them here.

#include <lumos/cli/args.hpp>
#include <lumos/graph/build_options.hpp>
#include <lumos/graph/compile.hpp>

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

}  // namespace lumos::cli

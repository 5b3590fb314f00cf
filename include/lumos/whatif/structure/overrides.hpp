#pragma once
// The facts the user gives (structure_options) over the ones the traces gave.

#include <lumos/whatif/structure/types.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// Sets `f` to the user's value, if any, noting when it differs from the trace's.
template <class T, class U>
void override_fact(fact<T>& f, const std::optional<U>& user, std::string_view flag, std::vector<std::string>& notes) {
  if (!user) return;
  if (f.known() && static_cast<std::int64_t>(*f.value) != static_cast<std::int64_t>(*user)) {
    notes.push_back(std::string(flag) + " " + std::to_string(*user) + " overrides the trace's " + std::to_string(*f.value) + " (" +
                    f.source + ")");
  }
  f.value = static_cast<T>(*user);
  f.source = "given (" + std::string(flag) + ")";
}

}  // namespace detail

/// Applies the facts `options` gives: layers, widths, heads, sequence, micro-batch size, TP,
/// PP and DP always (with a note where the trace said otherwise); chunks and schedule only
/// where the trace did not determine them. Notes --layers given with no layer found. The last
/// step of `discover_structure`. Constant time.
inline void apply_overrides(const structure_options& options, job_structure& out) {
  auto& md = out.model;
  auto& par = out.parallel;
  detail::override_fact(md.layers, options.layers, "--layers", out.notes);
  detail::override_fact(md.hidden, options.hidden, "--hidden", out.notes);
  detail::override_fact(md.ffn, options.ffn, "--ffn", out.notes);
  detail::override_fact(md.heads, options.heads, "--heads", out.notes);
  detail::override_fact(md.seq, options.seq, "--seq", out.notes);
  detail::override_fact(md.micro_batch_size, options.micro_batch_size, "--micro-batch", out.notes);
  detail::override_fact(par.tp, options.tp, "--tp", out.notes);
  detail::override_fact(par.pp, options.pp, "--pp", out.notes);
  detail::override_fact(par.dp, options.dp, "--dp", out.notes);
  if (options.chunks && !par.chunks.known()) detail::override_fact(par.chunks, options.chunks, "--vp", out.notes);
  if (options.schedule && !par.schedule.known()) {
    par.schedule.value = *options.schedule;
    par.schedule.source = "given (--schedule); the trace did not determine it: " + par.schedule.source;
  }
  if (options.layers && out.layer_groups.empty()) {
    out.notes.push_back("--layers given but no layer boundaries were found in the trace: no per-layer task groups");
  }
}

}  // namespace lumos::whatif

#pragma once
// The facts the user gives (structure_options) over the ones the traces gave.

#include <lumos/core/error.hpp>
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

/// Throws `lumos::error` when the TP, PP and DP that `options` gives, with the ones the traces
/// gave for the rest, do not make the traces' world: TP x PP x DP ranks, DP being the ranks that
/// reduce the gradients (DP x CP under context parallelism, as discovery reads it). The world is
/// exact when the traces record it (distributedInfo.world_size); counted from the files, it is
/// only the least the product can be (a job's files may be some of its ranks). Runs after
/// `apply_overrides`; checks nothing when no degree was given or one is unknown.
inline void check_given_degrees(const structure_options& options, const job_structure& st, bool world_recorded) {
  const auto& par = st.parallel;
  if ((!options.tp && !options.pp && !options.dp) || !par.tp.known() || !par.pp.known() || !par.dp.known() || !par.world.known()) return;
  const std::int64_t product = std::int64_t{*par.tp.value} * *par.pp.value * *par.dp.value;
  const std::int64_t world = *par.world.value;
  if (world_recorded ? product == world : product >= world) return;
  auto degree = [](const fact<int>& f, std::string_view name) {
    return std::string(name) + " " + std::to_string(*f.value) + (f.source.rfind("given", 0) == 0 ? " (given)" : " (traced)");
  };
  throw error("--tp/--pp/--dp: TP x PP x DP must " + std::string(world_recorded ? "be" : "be at least") + " the traces' world of " +
              std::to_string(world) + " ranks (" + par.world.source + "), but " + degree(par.tp, "TP") + " x " + degree(par.pp, "PP") +
              " x " + degree(par.dp, "DP") + " = " + std::to_string(product) +
              " (DP counts the ranks that reduce the gradients: DP x CP under context parallelism)");
}

}  // namespace lumos::whatif

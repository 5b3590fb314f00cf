#pragma once
// lumos schedule --kind K --stages P --microbatches M [--chunks V] [--costs F=1,B=2,W=0] [--json]

#include "cli.hpp"

#include <lumos/core/json_writer.hpp>
#include <lumos/pipeline/format.hpp>
#include <lumos/synth/schedule_graph.hpp>
#include <lumos/synth/schedules.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

namespace lumos::cli {

inline constexpr std::string_view schedule_usage =
    "usage: lumos schedule --kind {gpipe,1f1b,interleaved,zb-h1,zb-h2} --stages P --microbatches M\n"
    "                      [--chunks V] [--costs F=1,B=2,W=0] [--json]\n"
    "  prints each stage's op order, one line per stage: 'stage 0: F0 F1 B0 ...' (micro-batches\n"
    "  from 0; 'F3.1' is micro-batch 3 of model chunk 1; W ops only for the zero-bubble schedules)\n"
    "  --chunks V   model chunks per stage (interleaved only; default 2 there, 1 otherwise)\n"
    "  --costs      per-stage costs of one micro-batch (W is folded into B for schedules that do\n"
    "               not split the backward; each chunk costs 1/V). Simulates the schedule with free\n"
    "               communication through the replay engine and prints the makespan and the\n"
    "               bubble fraction (makespan - M*(F+B+W)) / makespan\n"
    "  --json       {\"stages\":[[\"F0\",...],...],\"makespan\":X,\"bubble_fraction\":Y} (the last two\n"
    "               only with --costs)\n";

namespace detail {

inline std::string format_number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return {buf, static_cast<std::size_t>(r.ptr - buf)};
}

inline std::int32_t required_count(args& a, std::string_view name) {
  const auto v = a.option(name);
  if (!v) throw usage_error("missing " + std::string(name));
  return parse_number<std::int32_t>(*v, name);
}

}  // namespace detail

inline int run_schedule(args& a) {
  const bool json = a.flag("--json");
  const auto kind_text = a.option("--kind");
  if (!kind_text) throw usage_error("missing --kind");
  const synth::schedule_policy schedule = synth::parse_schedule(*kind_text);
  pipeline::schedule_shape shape;
  shape.stages = detail::required_count(a, "--stages");
  shape.micro_batches = detail::required_count(a, "--microbatches");
  if (const auto v = a.option("--chunks")) {
    shape.chunks = parse_number<std::int32_t>(*v, "--chunks");
  } else {
    shape.chunks = schedule.supports_chunks ? 2 : 1;
  }
  const auto costs_text = a.option("--costs");
  a.no_positionals();

  std::optional<synth::decimal_schedule_simulation> sim;
  std::vector<std::vector<pipeline::op>> orders;
  if (costs_text) {
    sim = synth::simulate_schedule(schedule, shape, pipeline::parse_costs<double>(*costs_text));
    orders = sim->orders;
  } else {
    orders = schedule.orders(shape);
  }
  const bool show_chunk = shape.chunks > 1;

  std::string out;
  if (json) {
    json_writer w(out);
    w.begin_object().key("stages").begin_array();
    for (const auto& order : orders) {
      w.begin_array();
      for (const auto& o : order) w.value(pipeline::format_op(o, show_chunk));
      w.end_array();
    }
    w.end_array();
    if (sim) w.field("makespan", sim->makespan).field("bubble_fraction", sim->bubble_fraction);
    w.end_object();
    out += '\n';
  } else {
    for (std::size_t s = 0; s < orders.size(); ++s) {
      out += "stage " + std::to_string(s) + ": " + pipeline::format_ops(orders[s], show_chunk) + '\n';
    }
    if (sim) {
      out += "makespan: " + detail::format_number(sim->makespan) + '\n';
      out += "bubble fraction: " + detail::format_number(sim->bubble_fraction) +
             " (= (makespan - M*(F+B+W)) / makespan, M*(F+B+W) = " + detail::format_number(sim->stage_work) +
             "; simulated by the replay engine, free communication)\n";
    }
  }
  write_stdout(out);
  return 0;
}

}  // namespace lumos::cli

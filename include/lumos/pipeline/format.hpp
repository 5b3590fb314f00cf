#pragma once
// Text for pipeline ops ("F0 F1 B0 …", "F3.1" for micro-batch 3 of chunk 1) and the parser of
// the `--costs F=1,B=2,W=0` option.

#include <lumos/core/error.hpp>
#include <lumos/pipeline/schedule.hpp>

#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace lumos::pipeline {

/// "F3", "B0", "W2"; with `show_chunk` the chunk follows a dot: "F3.1" is the forward of
/// micro-batch 3 on chunk 1. Only zero-bubble schedules produce W ops, so only their orders
/// print W.
[[nodiscard]] inline std::string format_op(const op& o, bool show_chunk = false) {
  std::string out;
  detail::append_op_text(out, o, show_chunk);
  return out;
}

/// The ops separated by single spaces ("" for none). Linear in the count.
[[nodiscard]] inline std::string format_ops(std::span<const op> ops, bool show_chunk = false) {
  std::string out;
  out.reserve(ops.size() * 4);
  for (const op& o : ops) {
    if (!out.empty()) out += ' ';
    detail::append_op_text(out, o, show_chunk);
  }
  return out;
}

/// Stage `stage`'s order under `S`, chunks shown exactly when v > 1. Throws what
/// `S::stage_ops` throws.
template <PipelineSchedule S>
[[nodiscard]] std::string format_stage(const schedule_shape& shape, std::int32_t stage) {
  const std::vector<op> ops = S::stage_ops(shape, stage);
  return format_ops(ops, shape.chunks > 1);
}

namespace detail {

[[noreturn]] inline void fail_op_text(std::string_view text) {
  std::string msg = "bad pipeline op '";
  msg += text;
  msg +=
      "': expected F, B or W, a micro-batch index and optionally '.' and a chunk (e.g. F3, "
      "B0.1)";
  throw error(msg);
}

/// Parses a non-negative decimal integer that fills `text`; false on anything else.
[[nodiscard]] inline bool parse_index(std::string_view text, std::int32_t& value) noexcept {
  if (text.empty()) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
  }
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc{} && end == text.data() + text.size();
}

[[nodiscard]] constexpr std::string_view trim_blanks(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

[[noreturn]] inline void fail_costs(std::string_view what) {
  std::string msg = "--costs: ";
  msg += what;
  msg += " (expected e.g. F=1,B=2,W=0)";
  throw error(msg);
}

}  // namespace detail

/// Inverse of `format_op`: "F3", "B0.1", "W12" (chunk 0 when absent). Throws `lumos::error`
/// quoting the text for anything else, including signs, blanks and indices beyond 2^31 − 1.
[[nodiscard]] inline op parse_op(std::string_view text) {
  if (text.size() < 2) detail::fail_op_text(text);
  op result{};
  switch (text.front()) {
    case 'F':
      result.kind = op_kind::forward;
      break;
    case 'B':
      result.kind = op_kind::backward;
      break;
    case 'W':
      result.kind = op_kind::weight;
      break;
    default:
      detail::fail_op_text(text);
  }
  const std::string_view rest = text.substr(1);
  const std::size_t dot = rest.find('.');
  if (!detail::parse_index(rest.substr(0, dot), result.micro_batch)) detail::fail_op_text(text);
  if (dot != std::string_view::npos && !detail::parse_index(rest.substr(dot + 1), result.chunk)) {
    detail::fail_op_text(text);
  }
  return result;
}

/// Parses ops separated by blanks ("F0 F1 B0.1"). Throws like `parse_op`. Linear.
[[nodiscard]] inline std::vector<op> parse_ops(std::string_view text) {
  std::vector<op> ops;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == '\t' || text[i] == '\n') {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\n') ++j;
    ops.push_back(parse_op(text.substr(i, j - i)));
    i = j;
  }
  return ops;
}

/// Parses the value of `--costs`: comma-separated KIND=VALUE items, KIND one of F, B, W (upper
/// or lower case), each at most once, blanks around items, kinds and values ignored. VALUE is a
/// plain decimal ("2", "0.5", ".5"; for an integral `T` digits only; no sign, exponent, inf or
/// nan). F and B are required and must be > 0; W defaults to 0 and may be 0. These are per-stage
/// costs of one micro-batch (see `per_op_costs`). Throws `lumos::error` starting "--costs:" that
/// quotes the offending item. Linear in the text length.
template <class T = double>
[[nodiscard]] op_costs<T> parse_costs(std::string_view text) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "costs are parsed into an arithmetic type");
  if (detail::trim_blanks(text).empty()) detail::fail_costs("empty cost list");
  op_costs<T> costs{};
  bool seen[3] = {false, false, false};
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t comma = text.find(',', begin);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = detail::trim_blanks(text.substr(begin, comma - begin));
    const std::string quoted = "'" + std::string(item) + "'";
    if (item.empty()) {
      detail::fail_costs("empty item in '" + std::string(text) + "'");
    }
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) detail::fail_costs(quoted + " is not KIND=VALUE");
    const std::string_view key = detail::trim_blanks(item.substr(0, eq));
    const std::string_view value = detail::trim_blanks(item.substr(eq + 1));
    int index = -1;
    if (key == "F" || key == "f") index = 0;
    if (key == "B" || key == "b") index = 1;
    if (key == "W" || key == "w") index = 2;
    if (index < 0) {
      detail::fail_costs("unknown op kind '" + std::string(key) + "' in " + quoted +
                         ": use F, B or W");
    }
    const char letter = "FBW"[index];
    if (seen[index]) detail::fail_costs(std::string(1, letter) + " is given twice");
    seen[index] = true;
    if (value.empty())
      detail::fail_costs("no value for " + std::string(1, letter) + " in " + quoted);

    std::size_t digits = 0;
    std::size_t dots = 0;
    for (const char c : value) {
      if (c >= '0' && c <= '9') {
        ++digits;
      } else if (c == '.' && std::is_floating_point_v<T>) {
        ++dots;
      } else {
        digits = 0;
        break;
      }
    }
    T parsed{};
    bool ok = digits > 0 && dots <= 1;
    if (ok) {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
      ok = ec == std::errc{} && end == value.data() + value.size();
    }
    if (!ok) {
      detail::fail_costs(
          "'" + std::string(value) + "' in " + quoted + " is not a " +
          (std::is_floating_point_v<T> ? "non-negative decimal number" : "non-negative integer") +
          " within range");
    }
    (index == 0 ? costs.forward : index == 1 ? costs.backward : costs.weight) = parsed;
    begin = comma + 1;
  }
  if (!seen[0]) detail::fail_costs("missing F");
  if (!seen[1]) detail::fail_costs("missing B");
  if (!(costs.forward > T{})) detail::fail_costs("F must be greater than 0");
  if (!(costs.backward > T{})) detail::fail_costs("B must be greater than 0");
  return costs;
}

}  // namespace lumos::pipeline

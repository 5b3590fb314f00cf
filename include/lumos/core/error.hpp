#pragma once
// lumos::error — the one exception type lumos throws for bad input or impossible requests.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lumos {

/// Raised for every input lumos cannot accept: unreadable files, malformed JSON, wrong types,
/// missing fields, absurd values, cycles, inconsistent jobs. The message is one line that names
/// the file, the position (byte offset and/or event index) and what was expected. Never thrown for
/// unknown-but-well-formed data, which is counted and skipped instead.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where in an input a problem was found. Unknown parts are left at their defaults.
struct input_position {
  std::string_view file;
  std::uint64_t byte_offset = no_offset;
  std::int64_t event_index = -1;  ///< index in `traceEvents`, or -1

  static constexpr std::uint64_t no_offset = ~std::uint64_t{0};
};

/// Formats "FILE: byte B, event #I: WHAT" (omitting the parts that are unknown).
[[nodiscard]] inline std::string format_error(const input_position& at, std::string_view what) {
  std::string msg(at.file.empty() ? std::string_view("<input>") : at.file);
  msg += ':';
  if (at.byte_offset != input_position::no_offset) {
    msg += " byte ";
    msg += std::to_string(at.byte_offset);
    msg += at.event_index >= 0 ? "," : ":";
  }
  if (at.event_index >= 0) {
    msg += " event #";
    msg += std::to_string(at.event_index);
    msg += ':';
  }
  msg += ' ';
  msg += what;
  return msg;
}

[[noreturn]] inline void fail(const input_position& at, std::string_view what) {
  throw error(format_error(at, what));
}

}  // namespace lumos

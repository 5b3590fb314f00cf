#pragma once
// The reader's text window: decompressed text flows through it, a bounded buffer refilled from
// the byte source, with the offsets errors report.

#include <lumos/trace/detail/kineto_reader.hpp>

namespace lumos::trace {

[[nodiscard]] inline auto kineto_reader::offset_of(const char* p) const noexcept -> std::uint64_t {
  return offset_of(static_cast<std::size_t>(p - buffer_.get()));
}

[[noreturn]] inline void kineto_reader::fail_at(std::uint64_t offset, std::string_view what, std::int64_t event) const {
  fail({name_, offset, event}, what);
}

// Reads more text, keeping [pos_, hi_). Returns false at the end of the input.
inline auto kineto_reader::fill() -> bool {
  if (eof_) return false;
  if (pos_ > 0) {
    std::memmove(buffer_.get(), buffer_.get() + pos_, hi_ - pos_);
    base_offset_ += pos_;
    hi_ -= pos_;
    pos_ = 0;
  }
  if (hi_ == capacity_) {
    if (capacity_ >= detail::max_window) {
      fail_at(offset_of(pos_), "a single JSON value exceeds 4 GiB", current_event());
    }
    const std::size_t grown = std::min(capacity_ * 2, detail::max_window);
    auto bigger = std::make_unique<char[]>(grown + detail::padding);
    std::memcpy(bigger.get(), buffer_.get(), hi_);
    buffer_ = std::move(bigger);
    capacity_ = grown;
  }
  const std::size_t got = source_.read(buffer_.get() + hi_, capacity_ - hi_);
  if (got == 0) {
    eof_ = true;
    return false;
  }
  hi_ += got;
  return true;
}

// Next non-whitespace byte (not consumed), or '\0' at the end of the input.
inline auto kineto_reader::peek() -> char {
  while (true) {
    while (pos_ < hi_ && detail::is_ws(buffer_[pos_])) ++pos_;
    if (pos_ < hi_) return buffer_[pos_];
    if (!fill()) return '\0';
  }
}

inline void kineto_reader::expect(char c, std::string_view what) {
  const char got = peek();
  if (got != c) {
    fail_at(offset_of(pos_), got == '\0' ? "unexpected end of file; expected " + std::string(what)
                                         : "expected " + std::string(what));
  }
  ++pos_;
}

[[nodiscard]] inline auto kineto_reader::current_event() const noexcept -> std::int64_t {
  return in_events_ ? static_cast<std::int64_t>(out_.entries) : -1;
}

}  // namespace lumos::trace

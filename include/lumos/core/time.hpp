#pragma once
// Integer-nanosecond time and the exact conversion from Kineto's microsecond number text.

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace lumos {

/// All times and durations in lumos are signed 64-bit integer nanoseconds.
using time_ns = std::int64_t;

/// Largest magnitude accepted from input (about 146 years in ns): leaves headroom so that sums of
/// a few such values cannot overflow `time_ns`.
inline constexpr time_ns max_input_ns = time_ns{1} << 62;

/// Why a number could not be converted.
enum class number_error : std::uint8_t { none, syntax, out_of_range };

struct parsed_ns {
  time_ns value = 0;
  number_error error = number_error::none;
};

struct parsed_int {
  std::int64_t value = 0;
  number_error error = number_error::none;
};

/// The text of a base-10 integer ("-12", "007") as `std::int64_t`, accepting exactly what
/// `std::from_chars` accepts and consumes whole: an optional '-', then digits, nothing else.
/// Kineto's ids and counts are short: one plain loop beats the general routine (bench_reader).
[[nodiscard]] constexpr parsed_int parse_integer(std::string_view text) noexcept {
  std::size_t i = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) i = 1;
  if (i == text.size()) return {0, number_error::syntax};
  while (i + 1 < text.size() && text[i] == '0') ++i;  // leading zeros do not count toward 19 digits
  const std::size_t digits = text.size() - i;
  std::uint64_t magnitude = 0;
  for (; i < text.size(); ++i) {
    const auto d = static_cast<unsigned>(static_cast<unsigned char>(text[i])) - unsigned{'0'};
    if (d > 9) return {0, number_error::syntax};
    magnitude = magnitude * 10 + d;  // wraps only past 19 digits, rejected below
  }
  const std::uint64_t limit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + (negative ? 1 : 0);
  if (digits > 19 || magnitude > limit) return {0, number_error::out_of_range};
  return {negative ? static_cast<std::int64_t>(0 - magnitude) : static_cast<std::int64_t>(magnitude), number_error::none};
}

/// Converts the text of a JSON number of microseconds to nanoseconds without going through
/// floating point: "1706850122846038" and "4458676522690.655" are exact. Digits below one
/// nanosecond are rounded to nearest, ties away from zero. Exponents are applied exactly.
/// Results whose magnitude exceeds `max_input_ns` are `out_of_range` (e.g. "1e300").
/// Complexity: linear in the text length. Never reads outside `text`.
[[nodiscard]] constexpr parsed_ns parse_microseconds(std::string_view text) noexcept {
  // Fast path for what Kineto writes: up to 16 integer digits, then optionally '.' and 1 to 3
  // decimals. Anything else (sign, exponent, more digits) takes the general path below.
  if (!text.empty() && text.size() <= 20 && text[0] >= '0' && text[0] <= '9') {
    std::uint64_t whole = 0;
    std::size_t k = 0;
    while (k < text.size() && k < 16 && text[k] >= '0' && text[k] <= '9') whole = whole * 10 + static_cast<std::uint64_t>(text[k++] - '0');
    // 16 digits times 1000 fits in 64 bits unsigned; the range check is the general path's.
    auto result = [](std::uint64_t ns) -> parsed_ns {
      if (ns > static_cast<std::uint64_t>(max_input_ns)) return {0, number_error::out_of_range};
      return {static_cast<time_ns>(ns), number_error::none};
    };
    if (k == text.size()) return result(whole * 1000);
    if (text[k] == '.' && text.size() - k - 1 >= 1 && text.size() - k - 1 <= 3) {
      std::uint64_t frac = 0;
      std::size_t digits = 0;
      bool ok = true;
      for (std::size_t j = k + 1; j < text.size(); ++j, ++digits) {
        ok = ok && text[j] >= '0' && text[j] <= '9';
        frac = frac * 10 + static_cast<std::uint64_t>(text[j] - '0');
      }
      if (ok) {
        for (; digits < 3; ++digits) frac *= 10;
        return result(whole * 1000 + frac);
      }
    }
  }
  std::size_t i = 0;
  const std::size_t n = text.size();
  bool negative = false;
  if (i < n && text[i] == '-') {
    negative = true;
    ++i;
  }
  // Significant digits, with `point` = number of digits before the decimal point (may go
  // negative or beyond the digit count after applying the exponent).
  constexpr int max_digits = 40;  // far more than int64 needs; the rest only matters for rounding
  char digits[max_digits] = {};
  int count = 0;
  long long point = 0;
  bool any_digit = false;
  auto push = [&](char c) {
    if (count == 0 && c == '0') return false;  // leading zeros are not significant
    if (count < max_digits) digits[count++] = c;  // later digits cannot change the rounding
    return true;
  };
  // Integer part (JSON: "0" or [1-9][0-9]*; we accept leading zeros leniently).
  while (i < n && text[i] >= '0' && text[i] <= '9') {
    any_digit = true;
    if (push(text[i]) || count > 0) ++point;
    ++i;
  }
  if (!any_digit) return {0, number_error::syntax};
  if (i < n && text[i] == '.') {
    ++i;
    bool frac_digit = false;
    while (i < n && text[i] >= '0' && text[i] <= '9') {
      frac_digit = true;
      if (count == 0 && text[i] == '0') {
        --point;  // 0.000123: leading zeros of the fraction move the point
      } else {
        push(text[i]);
      }
      ++i;
    }
    if (!frac_digit) return {0, number_error::syntax};
  }
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < n && (text[i] == '+' || text[i] == '-')) {
      exp_negative = text[i] == '-';
      ++i;
    }
    long long exponent = 0;
    bool exp_digit = false;
    while (i < n && text[i] >= '0' && text[i] <= '9') {
      exp_digit = true;
      if (exponent < 1'000'000) exponent = exponent * 10 + (text[i] - '0');
      ++i;
    }
    if (!exp_digit) return {0, number_error::syntax};
    point += exp_negative ? -exponent : exponent;
  }
  if (i != n) return {0, number_error::syntax};
  if (count == 0) return {0, number_error::none};  // zero, however written

  // Nanoseconds: the first (point + 3) significant digits form the integer part.
  const long long int_digits = point + 3;
  if (int_digits > 19) return {0, number_error::out_of_range};
  std::uint64_t value = 0;
  for (long long d = 0; d < int_digits; ++d) {
    value = value * 10 + static_cast<std::uint64_t>(d < count ? digits[d] - '0' : 0);
  }
  // Round half away from zero on the first dropped digit.
  if (int_digits >= 0 && int_digits < count && digits[int_digits] >= '5') ++value;
  if (value > static_cast<std::uint64_t>(max_input_ns)) return {0, number_error::out_of_range};
  const auto signed_value = static_cast<time_ns>(value);
  return {negative ? -signed_value : signed_value, number_error::none};
}

/// Nanoseconds as Kineto microsecond text with exactly three decimals ("12.345"); exact inverse
/// of `parse_microseconds` for every representable value.
template <class Out>
void write_microseconds(Out& out, time_ns ns) {
  char buf[32];
  int len = 0;
  std::uint64_t mag = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  const unsigned frac = static_cast<unsigned>(mag % 1000);
  mag /= 1000;
  char tmp[24];
  int t = 0;
  do {
    tmp[t++] = static_cast<char>('0' + mag % 10);
    mag /= 10;
  } while (mag != 0);
  if (ns < 0) buf[len++] = '-';
  while (t > 0) buf[len++] = tmp[--t];
  buf[len++] = '.';
  buf[len++] = static_cast<char>('0' + frac / 100);
  buf[len++] = static_cast<char>('0' + frac / 10 % 10);
  buf[len++] = static_cast<char>('0' + frac % 10);
  out.append(buf, static_cast<std::size_t>(len));
}

}  // namespace lumos

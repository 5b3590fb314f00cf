#pragma once
// Finds the boundaries of the elements of a JSON array without parsing them, so that the reader
// can hand simdjson complete batches of events from a bounded window. Internal to the reader.

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace lumos::detail {

/// Result of scanning a run of array elements.
struct scan_result {
  /// Position of the array's closing bracket when it was reached, else nullptr.
  const char* array_end = nullptr;
  /// Where the scan stopped being certain: one past the last complete element's closing bracket,
  /// or `begin` when no element completed.
  const char* resume = nullptr;
};

/// Scans `[begin, end)`, which must start outside any string, between elements of an array (at
/// nesting depth 0 relative to that array). For every complete object or array element found,
/// appends its start and one-past-end offsets (relative to `base`) to `starts`/`ends`. Stops at
/// the array's closing bracket or at `end`. Scalars between elements are not reported; simdjson
/// rejects them when the batch is parsed. Reads up to 63 bytes past `end` (the caller's buffer
/// must be padded), but never uses them. O(n) with a small constant: 64 bytes per step.
scan_result scan_elements(const char* base, const char* begin, const char* end,
                          std::vector<std::uint32_t>& starts, std::vector<std::uint32_t>& ends);

/// Byte-at-a-time reference implementation of `scan_elements` (no padding needed).
scan_result scan_elements_scalar(const char* base, const char* begin, const char* end,
                                 std::vector<std::uint32_t>& starts, std::vector<std::uint32_t>& ends);

inline scan_result scan_elements_scalar(const char* base, const char* begin, const char* end,
                                        std::vector<std::uint32_t>& starts,
                                        std::vector<std::uint32_t>& ends) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  const char* start = nullptr;
  scan_result result{nullptr, begin};
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        if (depth++ == 0) start = p;
        break;
      case '}':
      case ']':
        if (depth == 0) {
          result.array_end = p;
          return result;
        }
        if (--depth == 0) {
          starts.push_back(static_cast<std::uint32_t>(start - base));
          ends.push_back(static_cast<std::uint32_t>(p + 1 - base));
          result.resume = p + 1;
        }
        break;
      default:
        break;
    }
  }
  return result;
}

#if defined(__SSE2__)

namespace scan {

struct block_masks {
  std::uint64_t quote, backslash, open, close;
};

inline std::uint64_t movemask16(__m128i v) noexcept {
  return static_cast<std::uint32_t>(_mm_movemask_epi8(v)) & 0xFFFFu;
}

inline block_masks classify(const char* p) noexcept {
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i lower = _mm_set1_epi8(0x20);
  // '{' (0x7B) and '[' (0x5B) are the only bytes with (b | 0x20) == 0x7B; likewise '}'/']' and 0x7D.
  const __m128i open = _mm_set1_epi8(0x7B);
  const __m128i close = _mm_set1_epi8(0x7D);
  block_masks m{0, 0, 0, 0};
  for (int k = 0; k < 4; ++k) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    const __m128i folded = _mm_or_si128(v, lower);
    const int shift = 16 * k;
    m.quote |= movemask16(_mm_cmpeq_epi8(v, quote)) << shift;
    m.backslash |= movemask16(_mm_cmpeq_epi8(v, backslash)) << shift;
    m.open |= movemask16(_mm_cmpeq_epi8(folded, open)) << shift;
    m.close |= movemask16(_mm_cmpeq_epi8(folded, close)) << shift;
  }
  return m;
}

// Characters preceded by an odd run of backslashes (the escaped ones). `carry` is 1 when the
// previous block ended in an odd run. The classic branchless formulation: runs starting on odd
// bit positions flip the parity pattern through the carry of an addition.
inline std::uint64_t escaped_chars(std::uint64_t backslash, std::uint64_t& carry) noexcept {
  constexpr std::uint64_t even_bits = 0x5555555555555555ULL;
  backslash &= ~carry;
  const std::uint64_t follows_escape = (backslash << 1) | carry;
  const std::uint64_t odd_starts = backslash & ~even_bits & ~follows_escape;
  std::uint64_t sequences_on_even = 0;
  carry = __builtin_add_overflow(odd_starts, backslash, &sequences_on_even) ? 1 : 0;
  const std::uint64_t invert = sequences_on_even << 1;
  return (even_bits ^ invert) & follows_escape;
}

inline std::uint64_t prefix_xor(std::uint64_t x) noexcept {
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  x ^= x << 32;
  return x;
}

}  // namespace scan

inline scan_result scan_elements(const char* base, const char* begin, const char* end,
                                 std::vector<std::uint32_t>& starts,
                                 std::vector<std::uint32_t>& ends) {
  int depth = 0;
  std::uint64_t escape_carry = 0;
  std::uint64_t in_string_carry = 0;  // all ones while a string spans the block boundary
  const char* start = nullptr;
  scan_result result{nullptr, begin};
  for (const char* p = begin; p < end; p += 64) {
    const auto left = static_cast<std::size_t>(end - p);
    const std::uint64_t valid = left >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << left) - 1;
    const scan::block_masks m = scan::classify(p);
    const std::uint64_t escaped = scan::escaped_chars(m.backslash & valid, escape_carry);
    const std::uint64_t quotes = m.quote & ~escaped & valid;
    const std::uint64_t in_string = scan::prefix_xor(quotes) ^ in_string_carry;
    in_string_carry = static_cast<std::uint64_t>(static_cast<std::int64_t>(in_string) >> 63);
    const std::uint64_t opens = m.open & ~in_string & valid;
    const std::uint64_t closes = m.close & ~in_string & valid;
    std::uint64_t brackets = opens | closes;
    while (brackets != 0) {
      const int i = __builtin_ctzll(brackets);
      brackets &= brackets - 1;
      if ((opens >> i) & 1U) {
        if (depth++ == 0) start = p + i;
      } else {
        if (depth == 0) {
          result.array_end = p + i;
          return result;
        }
        if (--depth == 0) {
          starts.push_back(static_cast<std::uint32_t>(start - base));
          ends.push_back(static_cast<std::uint32_t>(p + i + 1 - base));
          result.resume = p + i + 1;
        }
      }
    }
  }
  return result;
}

#else

inline scan_result scan_elements(const char* base, const char* begin, const char* end,
                                 std::vector<std::uint32_t>& starts,
                                 std::vector<std::uint32_t>& ends) {
  return scan_elements_scalar(base, begin, end, starts, ends);
}

#endif

}  // namespace lumos::detail

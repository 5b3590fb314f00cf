#pragma once
// Finds the boundaries of the elements of a JSON array without parsing them, so that the reader
// can hand simdjson complete batches of events from a bounded window. Internal to the reader.

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LUMOS_SCAN_AVX2 1
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

/// Scans `[begin, end)`, which must start outside any string, between elements of an array of
/// objects. For every complete object found, appends its start and one-past-end offsets
/// (relative to `base`) to `starts`/`ends`. Only curly braces are counted (arrays inside events
/// cannot end an event), and a ']' or '}' outside any object ends the scan as `array_end` (the
/// caller checks which it is). Other values between objects are not reported; the caller's gap
/// check or simdjson rejects them. Reads up to 63 bytes past `end` (the caller's buffer must be
/// padded), but never uses them. O(n) with a small constant: 64 bytes per step.
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
    // Same semantics as the SIMD path: a backslash escapes the next quote wherever it is
    // (outside strings only invalid JSON has backslashes, which simdjson then rejects).
    const bool is_escaped = escaped;
    escaped = c == '\\' && !is_escaped;
    if (c == '"' && !is_escaped) {
      in_string = !in_string;
      continue;
    }
    if (in_string) continue;
    switch (c) {
      case '{':
        if (depth++ == 0) start = p;
        break;
      case '}':
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
      case ']':
        if (depth == 0) {
          result.array_end = p;
          return result;
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
  std::uint64_t quote, backslash, open, close, square_close;
};

inline std::uint64_t movemask16(__m128i v) noexcept {
  return static_cast<std::uint32_t>(_mm_movemask_epi8(v)) & 0xFFFFu;
}

inline block_masks classify(const char* p) noexcept {
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i open = _mm_set1_epi8('{');
  const __m128i close = _mm_set1_epi8('}');
  const __m128i square_close = _mm_set1_epi8(']');
  block_masks m{0, 0, 0, 0, 0};
  for (int k = 0; k < 4; ++k) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    const int shift = 16 * k;
    m.quote |= movemask16(_mm_cmpeq_epi8(v, quote)) << shift;
    m.backslash |= movemask16(_mm_cmpeq_epi8(v, backslash)) << shift;
    m.open |= movemask16(_mm_cmpeq_epi8(v, open)) << shift;
    m.close |= movemask16(_mm_cmpeq_epi8(v, close)) << shift;
    m.square_close |= movemask16(_mm_cmpeq_epi8(v, square_close)) << shift;
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

namespace scan {

// The scan loop, parameterised by how a 64-byte block is classified. Always inlined into the
// ISA-specific entry points below so that the classification inlines too.
template <class Classify, class PrefixXor>
[[gnu::always_inline]] inline scan_result scan_loop(Classify classify, PrefixXor prefix_xor_of, const char* base, const char* begin,
                                                    const char* end, std::vector<std::uint32_t>& starts,
                                                    std::vector<std::uint32_t>& ends) {
  int depth = 0;
  std::uint64_t escape_carry = 0;
  std::uint64_t in_string_carry = 0;  // all ones while a string spans the block boundary
  const char* start = nullptr;
  scan_result result{nullptr, begin};
  for (const char* p = begin; p < end; p += 64) {
    const auto left = static_cast<std::size_t>(end - p);
    const std::uint64_t valid = left >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << left) - 1;
    const block_masks m = classify(p);
    const std::uint64_t escaped = escaped_chars(m.backslash & valid, escape_carry);
    const std::uint64_t quotes = m.quote & ~escaped & valid;
    const std::uint64_t in_string = prefix_xor_of(quotes) ^ in_string_carry;
    in_string_carry = static_cast<std::uint64_t>(static_cast<std::int64_t>(in_string) >> 63);
    const std::uint64_t opens = m.open & ~in_string & valid;
    const std::uint64_t closes = m.close & ~in_string & valid;
    // Inside an element, a block with fewer closing braces than the depth cannot end it (nor
    // the array): only the depth changes. Most blocks of an event take this path.
    const int close_count = __builtin_popcountll(closes);
    if (depth > close_count) {
      depth += __builtin_popcountll(opens) - close_count;
      continue;
    }
    const std::uint64_t square_closes = m.square_close & ~in_string & valid;
    // Bits [gap, next open) are outside every object: a ']' or '}' there ends the array.
    int gap = depth == 0 ? 0 : 64;
    auto array_end_in = [&](int from, int to) -> const char* {
      if (from >= to) return nullptr;
      const std::uint64_t range = (to >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << to) - 1) & ~((std::uint64_t{1} << from) - 1);
      const std::uint64_t hit = (square_closes | closes) & range;
      return hit != 0 ? p + __builtin_ctzll(hit) : nullptr;
    };
    std::uint64_t braces = opens | closes;
    while (braces != 0) {
      const int i = __builtin_ctzll(braces);
      braces &= braces - 1;
      if ((opens >> i) & 1U) {
        if (depth++ == 0) {
          if (const char* a = array_end_in(gap, i)) {
            result.array_end = a;
            return result;
          }
          start = p + i;
        }
      } else {
        if (depth == 0) {  // a '}' outside every object: the first ']' or '}' of the gap ends it
          result.array_end = array_end_in(gap, i + 1);
          return result;
        }
        if (--depth == 0) {
          starts.push_back(static_cast<std::uint32_t>(start - base));
          ends.push_back(static_cast<std::uint32_t>(p + i + 1 - base));
          result.resume = p + i + 1;
          gap = i + 1;
        }
      }
    }
    if (depth == 0) {
      if (const char* a = array_end_in(gap, 64)) {
        result.array_end = a;
        return result;
      }
    }
  }
  return result;
}

#if defined(LUMOS_SCAN_AVX2)
struct classify_avx2 {
  [[gnu::target("avx2")]] block_masks operator()(const char* p) const noexcept {
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i backslash = _mm256_set1_epi8('\\');
    const __m256i open = _mm256_set1_epi8('{');
    const __m256i close = _mm256_set1_epi8('}');
    const __m256i square_close = _mm256_set1_epi8(']');
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
#define LUMOS_MASK64(a, b) \
  (static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm256_movemask_epi8(a))) | \
   static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm256_movemask_epi8(b))) << 32)
    block_masks m{};
    m.quote = LUMOS_MASK64(_mm256_cmpeq_epi8(lo, quote), _mm256_cmpeq_epi8(hi, quote));
    m.backslash = LUMOS_MASK64(_mm256_cmpeq_epi8(lo, backslash), _mm256_cmpeq_epi8(hi, backslash));
    m.open = LUMOS_MASK64(_mm256_cmpeq_epi8(lo, open), _mm256_cmpeq_epi8(hi, open));
    m.close = LUMOS_MASK64(_mm256_cmpeq_epi8(lo, close), _mm256_cmpeq_epi8(hi, close));
    m.square_close = LUMOS_MASK64(_mm256_cmpeq_epi8(lo, square_close), _mm256_cmpeq_epi8(hi, square_close));
#undef LUMOS_MASK64
    return m;
  }
};

// Prefix XOR in one carry-less multiplication by all ones (instead of six dependent shifts).
struct prefix_xor_clmul {
  [[gnu::target("avx2,pclmul")]] std::uint64_t operator()(std::uint64_t x) const noexcept {
    const __m128i product = _mm_clmulepi64_si128(_mm_set_epi64x(0, static_cast<long long>(x)), _mm_set1_epi8(-1), 0);
    return static_cast<std::uint64_t>(_mm_cvtsi128_si64(product));
  }
};

[[gnu::target("avx2,pclmul")]] inline scan_result scan_avx2(const char* base, const char* begin, const char* end,
                                                      std::vector<std::uint32_t>& starts,
                                                      std::vector<std::uint32_t>& ends) {
  return scan_loop(classify_avx2{}, prefix_xor_clmul{}, base, begin, end, starts, ends);
}
// AVX-512BW: one 64-byte load, each class a mask compare.
struct classify_avx512 {
  [[gnu::target("avx512f,avx512bw")]] block_masks operator()(const char* p) const noexcept {
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(p));
    block_masks m{};
    m.quote = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('"'));
    m.backslash = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\\'));
    m.open = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('{'));
    m.close = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('}'));
    m.square_close = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(']'));
    return m;
  }
};

[[gnu::target("avx512f,avx512bw,pclmul")]] inline scan_result scan_avx512(const char* base, const char* begin, const char* end,
                                                                        std::vector<std::uint32_t>& starts,
                                                                        std::vector<std::uint32_t>& ends) {
  return scan_loop(classify_avx512{}, prefix_xor_clmul{}, base, begin, end, starts, ends);
}

#endif

struct prefix_xor_shifts {
  std::uint64_t operator()(std::uint64_t x) const noexcept { return prefix_xor(x); }
};

struct classify_sse2 {
  block_masks operator()(const char* p) const noexcept { return classify(p); }
};

inline scan_result scan_sse2(const char* base, const char* begin, const char* end,
                             std::vector<std::uint32_t>& starts, std::vector<std::uint32_t>& ends) {
  return scan_loop(classify_sse2{}, prefix_xor_shifts{}, base, begin, end, starts, ends);
}

}  // namespace scan

inline scan_result scan_elements(const char* base, const char* begin, const char* end,
                                 std::vector<std::uint32_t>& starts,
                                 std::vector<std::uint32_t>& ends) {
#if defined(LUMOS_SCAN_AVX2)
  static const bool avx512 = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("pclmul");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("pclmul");
  if (avx512) return scan::scan_avx512(base, begin, end, starts, ends);
  if (avx2) return scan::scan_avx2(base, begin, end, starts, ends);
#endif
  return scan::scan_sse2(base, begin, end, starts, ends);
}

#else

inline scan_result scan_elements(const char* base, const char* begin, const char* end,
                                 std::vector<std::uint32_t>& starts,
                                 std::vector<std::uint32_t>& ends) {
  return scan_elements_scalar(base, begin, end, starts, ends);
}

#endif

}  // namespace lumos::detail

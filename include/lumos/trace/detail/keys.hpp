#pragma once
// The reader's key tables (the event and args fields it keeps, matched without a hash) and the
// small scanning helpers the reader's parts share.


#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/detail/byte_source.hpp>
#include <lumos/detail/json_scan.hpp>
#include <lumos/trace/event.hpp>

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lumos::trace {

namespace detail {

using namespace simdjson;

inline constexpr std::size_t padding = 64;  // >= SIMDJSON_PADDING
static_assert(padding >= SIMDJSON_PADDING);
inline constexpr std::size_t max_window = std::size_t{1} << 32;  // simdjson's document limit

[[nodiscard]] constexpr bool is_ws(char c) noexcept {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// Key codes of the fields the reader keeps. Event-level and args-level keys share one table.
enum key_code : std::int8_t {
  k_unknown = -1,
  // event-level
  k_ph = 64, k_cat, k_name, k_pid, k_tid, k_ts, k_dur, k_args, k_id,
  // args-level fields stored in the event itself
  k_correlation, k_external_id, k_stream, k_device,
  // args of metadata events
  k_meta_name,
};

struct key_entry {
  std::string_view text;
  int code;
};

// Arg keys (codes 0..arg_key_count-1 are arg_key values) plus the event fields read from args.
inline constexpr std::array<key_entry, arg_key_count + 5> args_keys = [] {
  std::array<key_entry, arg_key_count + 5> t{};
  for (std::size_t i = 0; i < arg_key_count; ++i) {
    t[i] = {json_key(static_cast<arg_key>(i)), static_cast<int>(i)};
  }
  t[arg_key_count + 0] = {"correlation", k_correlation};
  t[arg_key_count + 1] = {"External id", k_external_id};
  t[arg_key_count + 2] = {"stream", k_stream};
  t[arg_key_count + 3] = {"device", k_device};
  t[arg_key_count + 4] = {"name", k_meta_name};
  return t;
}();

inline constexpr std::array<key_entry, 9> event_keys = {{{"ph", k_ph},
                                                         {"cat", k_cat},
                                                         {"name", k_name},
                                                         {"pid", k_pid},
                                                         {"tid", k_tid},
                                                         {"ts", k_ts},
                                                         {"dur", k_dur},
                                                         {"args", k_args},
                                                         {"id", k_id}}};

inline constexpr std::size_t max_key_length = 40;

// The first 8 bytes of a key as a little-endian word, zero-filled beyond its length.
[[nodiscard]] constexpr std::uint64_t prefix_word(std::string_view k) noexcept {
  std::uint64_t w = 0;
  for (std::size_t i = 0; i < 8 && i < k.size(); ++i) w |= std::uint64_t{static_cast<unsigned char>(k[i])} << (8 * i);
  return w;
}

// Lowest byte equal to `c` in `x` (bit 7 of that byte set; higher bits may be false positives).
[[nodiscard]] constexpr std::uint64_t bytes_equal(std::uint64_t x, char c) noexcept {
  const std::uint64_t v = x ^ (0x0101010101010101ULL * static_cast<unsigned char>(c));
  return (v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL;
}

// A field key as written, found by its closing quote 8 bytes at a time. Keys we know contain no
// escapes; a key with a backslash or longer than any known key is unknown (empty view). Reads
// whole words past the key: the batch is followed by at least `padding` readable bytes.
[[nodiscard]] inline std::string_view raw_key(const char* k) noexcept {
  for (std::size_t off = 0; off <= max_key_length; off += 8) {
    std::uint64_t w;
    std::memcpy(&w, k + off, 8);
    const std::uint64_t quote = bytes_equal(w, '"');
    const std::uint64_t slash = bytes_equal(w, '\\');
    if ((quote | slash) == 0) continue;
    const int q = quote != 0 ? __builtin_ctzll(quote) : 64;
    const int b = slash != 0 ? __builtin_ctzll(slash) : 64;
    if (b < q) return {};
    return {k, off + static_cast<std::size_t>(q / 8)};
  }
  return {};
}

// Keys bucketed by length and compared as words, so a lookup costs a few integer compares.
template <std::size_t N>
struct key_index {
  static constexpr std::size_t words_per_key = (max_key_length + 7) / 8;
  std::array<std::array<std::int8_t, 8>, max_key_length + 1> by_length{};
  std::array<std::uint8_t, max_key_length + 1> count{};
  std::array<key_entry, N> entries{};
  std::array<std::array<std::uint64_t, words_per_key>, N> words{};  // zero-padded key text

  // Keys of up to 7 bytes fit in one word with their closing quote: a perfect hash of that word
  // finds them with one probe, no loop over the keys of a length (`find_raw`).
  static constexpr int short_bits = 6;
  struct short_slot {
    std::uint64_t word = 0;
    std::int8_t length = 0;  // 0: empty
    std::int8_t code = k_unknown;
  };
  std::array<short_slot, std::size_t{1} << short_bits> short_keys{};
  std::uint64_t short_multiplier = 0;

  [[nodiscard]] constexpr std::size_t short_slot_of(std::uint64_t word) const noexcept {
    return static_cast<std::size_t>((word * short_multiplier) >> (64 - short_bits));
  }

  constexpr explicit key_index(const std::array<key_entry, N>& e) : entries(e) {
    for (std::size_t i = 0; i < N; ++i) {
      const std::size_t len = e[i].text.size();
      by_length[len][count[len]++] = static_cast<std::int8_t>(i);
      for (std::size_t w = 0; w * 8 < len; ++w) words[i][w] = prefix_word(e[i].text.substr(w * 8));
    }
    // The first multiplier of a fixed pseudo-random sequence that puts every short key in a slot
    // of its own; a table without one does not compile (constant evaluation runs out).
    for (std::uint64_t m = 0x9E3779B97F4A7C15ULL;; m = m * 6364136223846793005ULL + 1442695040888963407ULL) {
      short_multiplier = m | 1;
      short_keys = {};
      bool distinct = true;
      for (std::size_t i = 0; i < N && distinct; ++i) {
        const std::size_t len = e[i].text.size();
        if (len == 0 || len > 7) continue;
        short_slot& s = short_keys[short_slot_of(words[i][0])];
        if (s.length != 0) distinct = false;
        s = {words[i][0], static_cast<std::int8_t>(len), static_cast<std::int8_t>(e[i].code)};
      }
      if (distinct) break;
    }
  }

  /// `find(raw_key(k))`: the code of the key whose text starts at `k` (after its opening quote).
  [[nodiscard]] int find_raw(const char* k) const noexcept {
    const std::string_view key = raw_key(k);
    if (key.empty() || key.size() > 7) return find(key);
    std::uint64_t w;
    std::memcpy(&w, k, 8);  // padded input: see raw_key
    const std::uint64_t word = w & ((std::uint64_t{1} << (8 * key.size())) - 1);
    const short_slot& s = short_keys[short_slot_of(word)];
    return static_cast<std::size_t>(s.length) == key.size() && s.word == word ? static_cast<int>(s.code)
                                                                                : static_cast<int>(k_unknown);
  }

  // Compares whole words, the last one masked to the key's length: no call, no byte loop.
  [[nodiscard]] int find(std::string_view key) const noexcept {
    const std::size_t len = key.size();
    if (len == 0 || len > max_key_length || count[len] == 0) return k_unknown;
    const std::size_t last = (len - 1) / 8;
    const std::uint64_t last_mask = len % 8 == 0 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * (len % 8))) - 1;
    std::uint64_t first;
    std::memcpy(&first, key.data(), 8);  // padded input: see raw_key
    if (last == 0) first &= last_mask;
    for (std::size_t j = 0; j < count[len]; ++j) {
      const auto i = static_cast<std::size_t>(by_length[len][j]);
      if (words[i][0] != first) continue;
      bool equal = true;
      for (std::size_t w = 1; w <= last && equal; ++w) {
        std::uint64_t x;
        std::memcpy(&x, key.data() + 8 * w, 8);
        if (w == last) x &= last_mask;
        equal = words[i][w] == x;
      }
      if (equal) return entries[i].code;
    }
    return k_unknown;
  }
};

inline constexpr key_index<args_keys.size()> args_index{args_keys};
inline constexpr key_index<event_keys.size()> event_index{event_keys};

// Metadata (top-level) keys are matched on unescaped text; they are small and rare.
[[nodiscard]] inline std::string_view raw_key(const ondemand::raw_json_string& key) noexcept {
  const char* k = key.raw();
  for (std::size_t n = 0; n <= max_key_length; ++n) {
    if (k[n] == '"') return std::string_view(k, n);
    if (k[n] == '\\') return {};
  }
  return {};
}

// First '"' or '\\' at or after `p`; the string is known to close before `end`, and the input is
// padded, so 16-byte loads past the closing quote are safe.
[[nodiscard]] inline const char* find_quote_or_escape(const char* p, const char* end) noexcept {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i slash = _mm_set1_epi8('\\');
  for (; p < end; p += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const int m = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)));
    if (m != 0) return p + __builtin_ctz(static_cast<unsigned>(m));
  }
  return end;
#else
  for (; p < end; ++p) {
    if (*p == '"' || *p == '\\') return p;
  }
  return end;
#endif
}

[[nodiscard]] inline std::string_view trim_right(std::string_view s) noexcept {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

[[nodiscard]] inline std::string_view type_name(ondemand::json_type t) noexcept {
  switch (t) {
    case ondemand::json_type::array:
      return "array";
    case ondemand::json_type::object:
      return "object";
    case ondemand::json_type::number:
      return "number";
    case ondemand::json_type::string:
      return "string";
    case ondemand::json_type::boolean:
      return "boolean";
    case ondemand::json_type::null:
      return "null";
  }
  return "value";
}

// A byte-at-a-time skipper for one JSON value at the top level of the file (scalar, resumable
// across window refills; top-level values other than traceEvents are small or rare).
struct value_skipper {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  bool started = false;
  bool scalar = false;  // a number or literal: ends at the first delimiter

  // Consumes bytes from [p, end); returns the position one past the value, or nullptr when the
  // value continues beyond `end`.
  const char* feed(const char* p, const char* end) noexcept {
    for (; p < end; ++p) {
      const char c = *p;
      if (!started) {
        started = true;
        if (c == '"') {
          in_string = true;
          continue;
        }
        if (c == '{' || c == '[') {
          depth = 1;
          continue;
        }
        scalar = true;
      }
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
          if (depth == 0) return p + 1;
        }
        continue;
      }
      if (scalar) {
        if (c == ',' || c == '}' || c == ']' || is_ws(c)) return p;
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return p + 1;
      }
    }
    return nullptr;
  }
};

}  // namespace detail

}  // namespace lumos::trace

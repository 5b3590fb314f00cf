#pragma once
// The Kineto trace reader: one file (.json or .json.gz) → one rank_trace.
//
// The file is never held whole. Decompressed text flows through a bounded window; a SIMD scan
// finds where complete events end; each run of complete events is handed to simdjson on-demand
// as one small document ("[ev, ev, ...]", made in place by borrowing the separator bytes around
// the run). Top-level metadata (distributedInfo, deviceProperties, baseTimeNanoseconds) may come
// before or after traceEvents. This is the only header that includes simdjson.

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

/// Options for reading one trace file.
struct read_options {
  /// Bytes of decompressed text held at once; the window grows only for a single event larger
  /// than it. A reader also holds simdjson's index of one batch (see `batch_bytes`).
  std::size_t window_bytes = std::size_t{1} << 20;
  /// Expected uncompressed size, used to reserve the event store once (0 = unknown).
  std::uint64_t size_hint = 0;
  /// Events are handed to simdjson in runs of about this many bytes (at least one event), so
  /// that the scan, simdjson's index and its walk stay in the core's L2 cache. The result does
  /// not depend on it.
  std::size_t batch_bytes = std::size_t{64} << 10;
};

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

  constexpr explicit key_index(const std::array<key_entry, N>& e) : entries(e) {
    for (std::size_t i = 0; i < N; ++i) {
      const std::size_t len = e[i].text.size();
      by_length[len][count[len]++] = static_cast<std::int8_t>(i);
      for (std::size_t w = 0; w * 8 < len; ++w) words[i][w] = prefix_word(e[i].text.substr(w * 8));
    }
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

/// The reusable memory of a reader (text window, simdjson parser, scan offsets). Reading many
/// files with one workspace per thread avoids re-allocating (and re-faulting) it per file.
class reader_workspace {
 public:
  reader_workspace() = default;

 private:
  friend class kineto_reader;
  void reserve(std::size_t capacity) {
    if (capacity_ >= capacity && buffer_) return;
    buffer_ = std::make_unique<char[]>(capacity + detail::padding);
    capacity_ = capacity;
  }
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_ = 0;
  simdjson::ondemand::parser parser_;
  std::vector<std::uint32_t> starts_, ends_;
  std::string scratch_;
};

/// Reads one Kineto trace from a byte source. Use `read_trace` / `read_trace_bytes`.
class kineto_reader {
 public:
  kineto_reader(lumos::detail::byte_source& source, const read_options& options, reader_workspace& workspace)
      : source_(source),
        name_(source.name()),
        buffer_(workspace.buffer_),
        capacity_(workspace.capacity_),
        starts_(workspace.starts_),
        ends_(workspace.ends_),
        parser_(workspace.parser_),
        scratch_(workspace.scratch_) {
    workspace.reserve(std::clamp<std::size_t>(options.window_bytes, 4096, detail::max_window));
    out_.file = name_;
    size_hint_ = options.size_hint;
    batch_bytes_ = std::max<std::size_t>(options.batch_bytes, 1);
  }

  /// Reads the whole trace. Throws lumos::error on malformed input.
  rank_trace read() {
    parse_top_level();
    finish();
    return std::move(out_);
  }

 private:
  // ---- window ---------------------------------------------------------------------------------

  [[nodiscard]] std::uint64_t offset_of(std::size_t pos) const noexcept { return base_offset_ + pos; }
  [[nodiscard]] std::uint64_t offset_of(const char* p) const noexcept {
    return offset_of(static_cast<std::size_t>(p - buffer_.get()));
  }

  [[noreturn]] void fail_at(std::uint64_t offset, std::string_view what, std::int64_t event = -1) const {
    fail({name_, offset, event}, what);
  }

  // Reads more text, keeping [pos_, hi_). Returns false at the end of the input.
  bool fill() {
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
  char peek() {
    while (true) {
      while (pos_ < hi_ && detail::is_ws(buffer_[pos_])) ++pos_;
      if (pos_ < hi_) return buffer_[pos_];
      if (!fill()) return '\0';
    }
  }

  void expect(char c, std::string_view what) {
    const char got = peek();
    if (got != c) {
      fail_at(offset_of(pos_), got == '\0' ? "unexpected end of file; expected " + std::string(what)
                                           : "expected " + std::string(what));
    }
    ++pos_;
  }

  [[nodiscard]] std::int64_t current_event() const noexcept {
    return in_events_ ? static_cast<std::int64_t>(out_.entries) : -1;
  }

  // ---- top level ----------------------------------------------------------------------------

  // Reads a top-level key (no unescaping: the keys we look for have no escapes).
  std::string read_key() {
    expect('"', "a key string");
    std::string key;
    bool escaped = false;
    while (true) {
      if (pos_ == hi_ && !fill()) fail_at(offset_of(pos_), "unexpected end of file inside a key");
      const char c = buffer_[pos_++];
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        return key;
      }
      if (key.size() < 256) key += c;
    }
  }

  // Skips one value, or copies it into `capture` when given.
  void skip_value(std::string* capture) {
    if (peek() == '\0') fail_at(offset_of(pos_), "unexpected end of file; expected a value");
    const std::uint64_t start = offset_of(pos_);
    detail::value_skipper skipper;
    while (true) {
      const char* from = buffer_.get() + pos_;
      const char* end = skipper.feed(from, buffer_.get() + hi_);
      const char* stop = end != nullptr ? end : buffer_.get() + hi_;
      if (capture != nullptr) capture->append(from, static_cast<std::size_t>(stop - from));
      pos_ = static_cast<std::size_t>(stop - buffer_.get());
      if (end != nullptr) return;
      if (!fill()) {
        if (skipper.scalar) return;  // a number at the very end: the '}' check reports it
        fail_at(start, "unexpected end of file inside a top-level value");
      }
    }
  }

  void parse_top_level() {
    const char first = peek();
    if (first == '\0') fail_at(0, "empty file; expected a Kineto trace (a JSON object)");
    if (first != '{') fail_at(offset_of(pos_), "expected a JSON object at the top level");
    ++pos_;
    bool seen_events = false;
    if (peek() == '}') {
      ++pos_;
    } else {
      while (true) {
        const std::uint64_t key_offset = offset_of(pos_);
        const std::string key = read_key();
        expect(':', "':' after a key");
        peek();
        const std::uint64_t value_offset = offset_of(pos_);
        if (key == "traceEvents") {
          if (seen_events) fail_at(key_offset, "duplicate \"traceEvents\"");
          seen_events = true;
          if (peek() != '[') fail_at(value_offset, "expected an array for \"traceEvents\"");
          read_events();
        } else if (key == "distributedInfo" || key == "deviceProperties" ||
                   key == "baseTimeNanoseconds") {
          std::string text;
          skip_value(&text);
          parse_metadata(key, text, value_offset);
        } else {
          skip_value(nullptr);
        }
        const char sep = peek();
        if (sep == ',') {
          ++pos_;
          continue;
        }
        if (sep == '}') {
          ++pos_;
          break;
        }
        fail_at(offset_of(pos_), sep == '\0' ? "unexpected end of file; expected ',' or '}'"
                                             : "expected ',' or '}' after a top-level value");
      }
    }
    if (peek() != '\0') fail_at(offset_of(pos_), "unexpected data after the top-level object");
    if (!seen_events) fail_at(offset_of(pos_), "missing \"traceEvents\"; not a Kineto trace");
  }

  // ---- metadata -----------------------------------------------------------------------------

  template <class T>
  [[nodiscard]] T need(simdjson::simdjson_result<T> r, std::uint64_t at, std::string_view what) const {
    T v{};
    if (std::move(r).get(v) != simdjson::SUCCESS) fail_at(at, "expected " + std::string(what));
    return v;
  }

  void parse_metadata(const std::string& key, const std::string& text, std::uint64_t at) {
    namespace od = simdjson::ondemand;
    simdjson::padded_string padded(text);
    od::parser parser;
    od::document doc;
    if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) {
      fail_at(at, "malformed JSON in \"" + key + "\"");
    }
    if (key == "baseTimeNanoseconds") {
      std::string_view token;
      if (doc.raw_json_token().get(token) != simdjson::SUCCESS) fail_at(at, "malformed baseTimeNanoseconds");
      token = detail::trim_right(token);
      std::uint64_t v = 0;
      const auto [p, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
      if (ec != std::errc{} || p != token.data() + token.size() || v > static_cast<std::uint64_t>(max_input_ns)) {
        fail_at(at, "expected a non-negative integer number of nanoseconds for \"baseTimeNanoseconds\"");
      }
      out_.base_ns = static_cast<time_ns>(v);
      return;
    }
    try {
      if (key == "distributedInfo") {
        od::object obj = need(doc.get_object(), at, "an object for \"distributedInfo\"");
        std::optional<std::int64_t> rank, world;
        for (auto f : obj) {
          od::field field = need(std::move(f), at, "a field in \"distributedInfo\"");
          const std::string_view k = detail::raw_key(field.key());
          if (k == "rank") {
            rank = need(field.value().get_int64(), at, "an integer for distributedInfo.rank");
          } else if (k == "world_size") {
            world = need(field.value().get_int64(), at, "an integer for distributedInfo.world_size");
          } else if (k == "backend") {
            out_.backend = std::string(need(field.value().get_string(), at, "a string for distributedInfo.backend"));
          } else if (k == "pg_config") {
            parse_process_groups(field.value(), at);
          }
        }
        check_distributed_info(rank, world, at);
      } else {  // deviceProperties
        od::array arr = need(doc.get_array(), at, "an array for \"deviceProperties\"");
        for (auto d : arr) {
          od::object obj = need(d.get_object(), at, "an object in \"deviceProperties\"");
          device_info info;
          for (auto f : obj) {
            od::field field = need(std::move(f), at, "a field in \"deviceProperties\"");
            const std::string_view k = detail::raw_key(field.key());
            if (k == "id") info.id = static_cast<int>(need(field.value().get_int64(), at, "an integer device id"));
            else if (k == "name") info.name = std::string(need(field.value().get_string(), at, "a string device name"));
            else if (k == "numSms") info.num_sms = static_cast<int>(need(field.value().get_int64(), at, "an integer numSms"));
            else if (k == "totalGlobalMem") info.total_memory = need(field.value().get_int64(), at, "an integer totalGlobalMem");
            else if (k == "computeMajor") info.compute_major = static_cast<int>(need(field.value().get_int64(), at, "an integer computeMajor"));
            else if (k == "computeMinor") info.compute_minor = static_cast<int>(need(field.value().get_int64(), at, "an integer computeMinor"));
          }
          out_.devices.push_back(std::move(info));
        }
      }
    } catch (const simdjson::simdjson_error& e) {
      fail_at(at, std::string("malformed \"") + key + "\": " + e.what());
    }
  }

  // The rank and world size index per-rank tables downstream: reject what no job can have
  // (checked after the whole object, since "rank" may come before or after "world_size").
  void check_distributed_info(std::optional<std::int64_t> rank, std::optional<std::int64_t> world, std::uint64_t at) {
    if (world && (*world < 1 || *world > max_world_size)) {
      fail_at(at, "distributedInfo.world_size " + std::to_string(*world) + " is out of range (1 to " +
                      std::to_string(max_world_size) + ")");
    }
    if (rank && (*rank < 0 || *rank >= max_world_size)) {
      fail_at(at, "distributedInfo.rank " + std::to_string(*rank) + " is out of range (0 to " +
                      std::to_string(max_world_size - 1) + ")");
    }
    if (rank && world && *rank >= *world) {
      fail_at(at, "distributedInfo.rank " + std::to_string(*rank) + " is not below world_size " + std::to_string(*world));
    }
    if (rank) out_.distributed_rank = static_cast<int>(*rank);
    if (world) out_.world_size = static_cast<int>(*world);
  }

  void parse_process_groups(simdjson::ondemand::value v, std::uint64_t at) {
    namespace od = simdjson::ondemand;
    od::array arr = need(v.get_array(), at, "an array for distributedInfo.pg_config");
    for (auto g : arr) {
      od::object obj = need(g.get_object(), at, "an object in pg_config");
      process_group_info pg;
      for (auto f : obj) {
        od::field field = need(std::move(f), at, "a field in pg_config");
        const std::string_view k = detail::raw_key(field.key());
        if (k == "pg_name") pg.name = std::string(need(field.value().get_string(), at, "a string pg_name"));
        else if (k == "pg_desc") pg.description = std::string(need(field.value().get_string(), at, "a string pg_desc"));
        else if (k == "backend_config") pg.backend = std::string(need(field.value().get_string(), at, "a string backend_config"));
        else if (k == "pg_size") pg.size = static_cast<int>(need(field.value().get_int64(), at, "an integer pg_size"));
        else if (k == "ranks") {
          od::array ranks = need(field.value().get_array(), at, "an array of ranks");
          for (auto r : ranks) pg.ranks.push_back(static_cast<int>(need(r.get_int64(), at, "an integer rank")));
        }
      }
      out_.process_groups.push_back(std::move(pg));
    }
  }

  // ---- traceEvents --------------------------------------------------------------------------

  // Checks the bytes between two elements (or after '[' / before ']'): whitespace and, when
  // `comma` is set, exactly one ','.
  void check_gap(std::size_t from, std::size_t to, bool comma, std::string_view context) const {
    bool seen = false;
    for (std::size_t i = from; i < to; ++i) {
      const char c = buffer_[i];
      if (detail::is_ws(c)) continue;
      if (c == ',' && comma && !seen) {
        seen = true;
        continue;
      }
      fail_at(offset_of(i), std::string("expected ") + std::string(context), current_event());
    }
    if (comma && !seen) fail_at(offset_of(to), "expected ',' between events", current_event());
  }

  void read_events() {
    in_events_ = true;
    // pos_ is at '['. Until the first batch, keep it in the window: the batch borrows a byte
    // before its first element for its own '['.
    bool first = true;
    while (true) {
      const std::size_t scan_from = pos_ + (first ? 1 : 0);
      // Batches of about batch_bytes_: the scan, simdjson's index and its walk then run over
      // text still in the core's L2 cache instead of streaming the whole window three times.
      const std::size_t scan_to = hi_ - scan_from > batch_bytes_ ? scan_from + batch_bytes_ : hi_;
      starts_.clear();
      ends_.clear();
      auto r = lumos::detail::scan_elements(buffer_.get(), buffer_.get() + scan_from, buffer_.get() + scan_to,
                                            starts_, ends_);
      if (starts_.empty() && r.array_end == nullptr && scan_to < hi_) {  // one event larger than a batch
        r = lumos::detail::scan_elements(buffer_.get(), buffer_.get() + scan_from, buffer_.get() + hi_, starts_, ends_);
      }
      if (!starts_.empty()) {
        check_gap(scan_from, starts_.front(), !first, "',' and then an event object");
        parse_batch();
        first = false;
        pos_ = ends_.back();
      }
      if (r.array_end != nullptr) {
        const auto close = static_cast<std::size_t>(r.array_end - buffer_.get());
        if (buffer_[close] != ']') fail_at(offset_of(close), "expected an event object or ']'", current_event());
        check_gap(pos_ + (first ? 1 : 0), close, false, "an event object or ']'");
        pos_ = close + 1;
        in_events_ = false;
        return;
      }
      if (starts_.empty() && !fill()) {
        fail_at(offset_of(hi_), "unexpected end of file inside \"traceEvents\" (truncated trace?)",
                current_event());
      }
    }
  }

  void parse_batch() {
    namespace od = simdjson::ondemand;
    char* const base = buffer_.get();
    const std::size_t open = starts_.front() - 1;
    const std::size_t close = ends_.back();
    const char saved_open = base[open];
    const char saved_close = base[close];
    base[open] = '[';
    base[close] = ']';
    struct restore {
      char* b;
      std::size_t o, c;
      char so, sc;
      ~restore() {
        b[o] = so;
        b[c] = sc;
      }
    } guard{base, open, close, saved_open, saved_close};

    const std::size_t length = close + 1 - open;
    batch_end_ = base + close + 1;
    od::document doc;
    od::array array;
    if (parser_.iterate(simdjson::padded_string_view(base + open, length, length + detail::padding))
            .get(doc) != simdjson::SUCCESS ||
        doc.get_array().get(array) != simdjson::SUCCESS) {
      locate_batch_error();
    }
    if (!reserved_) reserve_from_first_batch(length);
    std::size_t k = 0;
    for (auto element : array) {
      // simdjson does not check that brackets match ('{"a", "b"]'), so it may see more elements
      // than the scan did: the batch is malformed, and starts_[k] must not be read past its end.
      if (k >= starts_.size()) locate_batch_error();
      batch_index_ = k;
      event_index_ = out_.entries;
      od::object obj;
      if (element.get_object().get(obj) != simdjson::SUCCESS) {
        event_fail("expected an event object");
      }
      parse_event(obj);
      ++k;
    }
    if (k != starts_.size()) locate_batch_error();
  }

  // Sizes the event store once, from the bytes per event of the first batch and the expected
  // file size: no repeated growth (each a copy and fresh page faults), little overshoot.
  void reserve_from_first_batch(std::size_t first_batch_bytes) {
    reserved_ = true;
    if (size_hint_ == 0 || starts_.empty()) return;
    // Floored: a first batch of tiny or skipped entries ("{}") must not make a reservation of
    // dozens of bytes per input byte. No event the reader stores is shorter than this.
    constexpr double min_bytes_per_event = 32;
    const double bytes_per_event =
        std::max(min_bytes_per_event, static_cast<double>(first_batch_bytes) / static_cast<double>(starts_.size()));
    const double expected = static_cast<double>(size_hint_) / bytes_per_event * 1.05 + 64;
    const auto events = static_cast<std::size_t>(std::min(expected, 2.0e9));
    out_.events.reserve(events);
    out_.arg_keys.reserve(events);
    out_.arg_values.reserve(events);
  }

  // A batch failed as a whole (e.g. invalid UTF-8): find the first event that fails on its own.
  [[noreturn]] void locate_batch_error() {
    namespace od = simdjson::ondemand;
    od::parser single;
    for (std::size_t k = 0; k < starts_.size(); ++k) {
      simdjson::padded_string text(buffer_.get() + starts_[k], ends_[k] - starts_[k]);
      od::document doc;
      auto err = single.iterate(text).get(doc);
      if (err == simdjson::SUCCESS) {
        od::object obj;
        err = doc.get_object().get(obj);
        if (err == simdjson::SUCCESS) {
          for (auto f : obj) {
            od::field field;
            if ((err = std::move(f).get(field)) != simdjson::SUCCESS) break;
            od::json_type t;
            if ((err = field.value().type().get(t)) != simdjson::SUCCESS) break;
          }
        }
      }
      if (err != simdjson::SUCCESS) {
        fail_at(offset_of(starts_[k]), std::string("malformed event: ") + simdjson::error_message(err),
                static_cast<std::int64_t>(out_.entries + k));
      }
    }
    fail_at(offset_of(starts_.front()), "malformed JSON in traceEvents", current_event());
  }

  // The event being parsed is element `batch_index_` of the batch and entry `event_index_`.
  [[noreturn]] void event_fail(std::string_view what) const {
    fail_at(offset_of(starts_[batch_index_]), what, static_cast<std::int64_t>(event_index_));
  }

  [[noreturn]] void type_fail(std::string_view field, std::string_view expected,
                              simdjson::ondemand::value& v) const {
    simdjson::ondemand::json_type t{};
    std::string got = v.type().get(t) == simdjson::SUCCESS ? std::string(detail::type_name(t)) : "malformed JSON";
    event_fail("expected " + std::string(expected) + " for \"" + std::string(field) + "\", got " + got);
  }

  time_ns read_time(simdjson::ondemand::value& v, std::string_view field) {
    const std::string_view token = detail::trim_right(v.raw_json_token());
    if (token.empty() || !(token[0] == '-' || (token[0] >= '0' && token[0] <= '9'))) {
      type_fail(field, "a number of microseconds", v);
    }
    const parsed_ns p = parse_microseconds(token);
    if (p.error == number_error::out_of_range) {
      event_fail("absurd value for \"" + std::string(field) + "\": " + std::string(token.substr(0, 40)) + " us");
    }
    if (p.error != number_error::none) event_fail("malformed number for \"" + std::string(field) + "\"");
    return p.value;
  }

  // Integers from the raw token (one pass, no type dispatch); anything else is a type error.
  std::int64_t read_int(simdjson::ondemand::value& v, std::string_view field) {
    const std::string_view token = detail::trim_right(v.raw_json_token());
    const parsed_int x = parse_integer(token);
    if (x.error != number_error::none) {
      if (x.error == number_error::out_of_range) event_fail("integer out of range for \"" + std::string(field) + "\"");
      type_fail(field, "an integer", v);
    }
    return x.value;
  }

  // pid / tid: an integer, or a string (Kineto writes "Spans", "Traces" rows).
  void read_id(simdjson::ondemand::value& v, std::string_view field, std::int64_t& number, string_id& text) {
    const std::string_view token = v.raw_json_token();
    if (!token.empty() && token[0] == '"') {
      text = out_.strings.intern(read_string(v, field));
      number = 0;
      return;
    }
    number = read_int(v, field);
    text = no_string;
  }

  // A string value as a view: straight into the input when it has no escapes (the common
  // case), else unescaped into the workspace's scratch buffer. Valid until the next call.
  std::string_view read_string(simdjson::ondemand::value& v, std::string_view field) {
    simdjson::ondemand::raw_json_string raw;
    if (v.get_raw_json_string().get(raw) != simdjson::SUCCESS) type_fail(field, "a string", v);
    const char* const begin = raw.raw();
    const char* const stop = detail::find_quote_or_escape(begin, batch_end_);
    if (stop == batch_end_) event_fail("unterminated string");
    if (*stop == '"') return {begin, static_cast<std::size_t>(stop - begin)};
    return unescape(begin, batch_end_);
  }

  // JSON string unescaping (RFC 8259), writing UTF-8; the input was UTF-8-validated by simdjson.
  std::string_view unescape(const char* p, const char* end) {
    scratch_.clear();
    auto hex4 = [&](const char* q) -> std::uint32_t {
      if (end - q < 4) event_fail("malformed \\u escape in a string");
      std::uint32_t v = 0;
      for (int i = 0; i < 4; ++i) {
        const char c = q[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
        else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
        else event_fail("malformed \\u escape in a string");
      }
      return v;
    };
    while (p < end) {
      const char c = *p++;
      if (c == '"') return scratch_;
      if (c != '\\') {
        scratch_ += c;
        continue;
      }
      if (p >= end) break;
      const char e = *p++;
      switch (e) {
        case '"': scratch_ += '"'; break;
        case '\\': scratch_ += '\\'; break;
        case '/': scratch_ += '/'; break;
        case 'b': scratch_ += '\b'; break;
        case 'f': scratch_ += '\f'; break;
        case 'n': scratch_ += '\n'; break;
        case 'r': scratch_ += '\r'; break;
        case 't': scratch_ += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4(p);
          p += 4;
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u') event_fail("unpaired surrogate in a string");
            const std::uint32_t low = hex4(p + 2);
            if (low < 0xDC00 || low >= 0xE000) event_fail("unpaired surrogate in a string");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            p += 6;
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            event_fail("unpaired surrogate in a string");
          }
          if (cp < 0x80) {
            scratch_ += static_cast<char>(cp);
          } else if (cp < 0x800) {
            scratch_ += static_cast<char>(0xC0 | (cp >> 6));
            scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            scratch_ += static_cast<char>(0xE0 | (cp >> 12));
            scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            scratch_ += static_cast<char>(0xF0 | (cp >> 18));
            scratch_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          event_fail("malformed escape in a string");
      }
    }
    event_fail("unterminated string");
  }

  // A string-valued arg: strings are interned as is; arrays, objects and numbers by their JSON.
  string_id read_text_arg(simdjson::ondemand::value& v) {
    namespace od = simdjson::ondemand;
    od::json_type t{};
    if (v.type().get(t) != simdjson::SUCCESS) event_fail("malformed value in \"args\"");
    std::string_view s;
    simdjson::error_code err = simdjson::SUCCESS;
    switch (t) {
      case od::json_type::string:
        s = read_string(v, "args");
        break;
      case od::json_type::array: {
        od::array a;
        err = v.get_array().get(a);
        if (!err) err = a.raw_json().get(s);
        break;
      }
      case od::json_type::object: {
        od::object o;
        err = v.get_object().get(o);
        if (!err) err = o.raw_json().get(s);
        break;
      }
      default:
        s = detail::trim_right(v.raw_json_token());
        break;
    }
    if (err) event_fail("malformed value in \"args\"");
    return out_.strings.intern(s);
  }

  struct pending {
    std::int64_t pid = 0, tid = 0;
    string_id pid_text = no_string, tid_text = no_string;
    std::int64_t stream = 0, device = 0;
    std::string_view meta_name;
    bool has_ph = false, has_ts = false, has_dur = false, has_name = false;
    bool has_pid = false, has_tid = false, has_stream = false, has_device = false, has_meta_name = false;
    char ph = 0;
  };

  void parse_args(simdjson::ondemand::value& v, event& e, pending& p) {
    namespace od = simdjson::ondemand;
    od::object obj;
    if (v.get_object().get(obj) != simdjson::SUCCESS) type_fail("args", "an object", v);
    for (auto f : obj) {
      if (f.error() != simdjson::SUCCESS) event_fail("malformed \"args\"");
      od::field& field = f.value_unsafe();
      const int code = detail::args_index.find(detail::raw_key(field.key().raw()));
      if (code == detail::k_unknown) continue;
      od::value& value = field.value();
      switch (code) {
        case detail::k_correlation:
          e.correlation = read_int(value, "args.correlation");
          break;
        case detail::k_external_id:
          e.external_id = read_int(value, "args.External id");
          break;
        case detail::k_stream:
          p.stream = read_int(value, "args.stream");
          p.has_stream = true;
          break;
        case detail::k_device:
          p.device = read_int(value, "args.device");
          p.has_device = true;
          break;
        case detail::k_meta_name: {
          const std::string_view token = value.raw_json_token();
          if (!token.empty() && token[0] == '"') {
            meta_name_ = read_string(value, "args.name");  // copied: scratch is reused
            p.meta_name = meta_name_;
            p.has_meta_name = true;
          }
          break;
        }
        default: {
          const auto key = static_cast<arg_key>(code);
          if (is_string_arg(key)) {
            push_arg(key, read_text_arg(value));
          } else {
            const std::string_view token = detail::trim_right(value.raw_json_token());
            const parsed_int x = parse_integer(token);
            if (x.error == number_error::none) {
              push_arg(key, x.value);
            } else {
              ++out_.ignored_args;  // e.g. a float or a string where an integer is usual
            }
          }
        }
      }
    }
  }

  void push_arg(arg_key k, std::int64_t v) {
    out_.arg_keys.push_back(k);
    out_.arg_values.push_back(v);
  }
  void push_arg(arg_key k, string_id v) { push_arg(k, static_cast<std::int64_t>(v)); }

  category category_for(string_id cat) {
    if (cat >= cat_kind_.size()) cat_kind_.resize(out_.strings.size(), 0xFF);
    if (cat_kind_[cat] == 0xFF) cat_kind_[cat] = static_cast<std::uint8_t>(category_of(out_.strings[cat]));
    return static_cast<category>(cat_kind_[cat]);
  }

  void parse_event(simdjson::ondemand::object& obj) {
    namespace od = simdjson::ondemand;
    event e;
    pending p;
    e.args_begin = static_cast<std::uint32_t>(out_.arg_keys.size());
    for (auto f : obj) {
      if (f.error() != simdjson::SUCCESS) event_fail("malformed event");
      od::field& field = f.value_unsafe();
      const int code = detail::event_index.find(detail::raw_key(field.key().raw()));
      if (code == detail::k_unknown) continue;
      od::value& value = field.value();
      switch (code) {
        case detail::k_ph: {
          // Phases are one letter: look at the raw token before paying for a string read.
          const std::string_view token = value.raw_json_token();
          if (token.size() >= 3 && token[0] == '"' && token[2] == '"') {
            p.ph = token[1];
          } else {
            const std::string_view s = read_string(value, "ph");
            p.ph = s.size() == 1 ? s[0] : '?';
          }
          p.has_ph = true;
          break;
        }
        case detail::k_cat: {
          // Consecutive events mostly share a category: compare the raw bytes first.
          const std::string_view token = value.raw_json_token();
          if (last_cat_ != no_string && token.size() > last_cat_text_.size() + 1 && token[0] == '"' &&
              token[last_cat_text_.size() + 1] == '"' &&
              std::memcmp(token.data() + 1, last_cat_text_.data(), last_cat_text_.size()) == 0) {
            e.cat_name = last_cat_;
            break;
          }
          last_cat_ = out_.strings.intern(read_string(value, "cat"));
          last_cat_text_ = out_.strings[last_cat_];
          e.cat_name = last_cat_;
          break;
        }
        case detail::k_name:
          e.name = out_.strings.intern(read_string(value, "name"));
          p.has_name = true;
          break;
        case detail::k_pid:
          read_id(value, "pid", p.pid, p.pid_text);
          p.has_pid = true;
          break;
        case detail::k_tid:
          read_id(value, "tid", p.tid, p.tid_text);
          p.has_tid = true;
          break;
        case detail::k_ts:
          e.ts = read_time(value, "ts");
          p.has_ts = true;
          break;
        case detail::k_dur:
          e.dur = read_time(value, "dur");
          p.has_dur = true;
          break;
        case detail::k_args:
          parse_args(value, e, p);
          break;
        case detail::k_id: {
          const std::string_view token = detail::trim_right(value.raw_json_token());
          const parsed_int id = parse_integer(token);
          if (id.error == number_error::none) e.correlation = id.value;
          break;
        }
        default:
          break;
      }
    }
    ++out_.entries;
    if (e.cat_name != no_string) {
      if (e.cat_name >= out_.category_counts.size()) out_.category_counts.resize(out_.strings.size(), 0);
      ++out_.category_counts[e.cat_name];
      e.cat = category_for(e.cat_name);
    }
    if (!p.has_ph) event_fail("missing \"ph\"");
    switch (p.ph) {
      case 'X':
        e.ph = phase::complete;
        if (!p.has_ts) event_fail("missing \"ts\"");
        if (!p.has_dur) event_fail("missing \"dur\"");
        if (!p.has_name) event_fail("missing \"name\"");
        if (e.dur < 0) event_fail("negative duration");
        break;
      case 'i':
      case 'I':
        e.ph = phase::instant;
        break;
      case 'C':
        e.ph = phase::counter;
        break;
      case 's':
        e.ph = phase::flow_start;
        break;
      case 't':
        e.ph = phase::flow_step;
        break;
      case 'f':
        e.ph = phase::flow_end;
        break;
      case 'M':
        ++out_.metadata_entries;
        record_metadata(e, p);
        rollback_args(e);
        return;
      default:  // B/E, async, object... events: counted, not used
        ++out_.skipped_entries;
        rollback_args(e);
        return;
    }
    if (e.ph != phase::complete) e.dur = 0;
    if (!p.has_pid || !p.has_tid) {
      if (e.ph == phase::complete) event_fail(p.has_pid ? "missing \"tid\"" : "missing \"pid\"");
    }
    e.lane = lane_of(p.pid, p.tid, p.pid_text, p.tid_text);
    if (is_gpu_side(e.cat)) {
      const std::int64_t stream = p.has_stream ? p.stream : p.tid;
      const std::int64_t device = p.has_device ? p.device : p.pid;
      e.stream = static_cast<std::int32_t>(std::clamp<std::int64_t>(stream, INT32_MIN, INT32_MAX));
      e.device = static_cast<std::int16_t>(std::clamp<std::int64_t>(device, -1, INT16_MAX));
    }
    out_.events.push_back(e);
  }

  void rollback_args(const event& e) {
    out_.arg_keys.resize(e.args_begin);
    out_.arg_values.resize(e.args_begin);
  }

  void record_metadata(const event& e, const pending& p) {
    if (!p.has_meta_name || !p.has_pid) return;
    const std::string_view kind = out_.str(e.name);
    const string_id value = out_.strings.intern(p.meta_name);
    if (kind == "process_name") {
      process_names_.push_back({p.pid, p.pid_text, value});
    } else if (kind == "thread_name") {
      thread_names_.push_back({lane_key{p.pid, p.tid, p.pid_text, p.tid_text}, value});
    }
  }

  struct lane_key {
    std::int64_t pid, tid;
    string_id pid_text, tid_text;
    bool operator==(const lane_key&) const = default;
  };
  struct lane_hash {
    std::size_t operator()(const lane_key& k) const noexcept {
      std::uint64_t h = static_cast<std::uint64_t>(k.pid) * 0x9E3779B97F4A7C15ULL;
      h ^= static_cast<std::uint64_t>(k.tid) + 0x7F4A7C159E3779B9ULL + (h << 6) + (h >> 2);
      h ^= (static_cast<std::uint64_t>(k.pid_text) << 32 | k.tid_text) * 0xC2B2AE3D27D4EB4FULL;
      return static_cast<std::size_t>(h ^ (h >> 31));
    }
  };

  std::uint32_t lane_of(std::int64_t pid, std::int64_t tid, string_id pid_text, string_id tid_text) {
    const lane_key key{pid, tid, pid_text, tid_text};
    if (last_lane_ != ~std::uint32_t{0} && last_lane_key_ == key) return last_lane_;
    auto [it, inserted] = lane_ids_.try_emplace(key, static_cast<std::uint32_t>(out_.lanes.size()));
    if (inserted) {
      lane l;
      l.pid = pid;
      l.tid = tid;
      l.pid_text = pid_text;
      l.tid_text = tid_text;
      out_.lanes.push_back(l);
    }
    last_lane_key_ = key;
    last_lane_ = it->second;
    return it->second;
  }

  void finish() {
    for (const auto& [key, name] : thread_names_) {
      const auto it = lane_ids_.find(key);
      if (it != lane_ids_.end()) out_.lanes[it->second].thread_name = name;
    }
    for (const auto& pn : process_names_) {
      for (lane& l : out_.lanes) {
        if (l.pid == pn.pid && l.pid_text == pn.pid_text) l.process_name = pn.name;
      }
    }
    out_.category_counts.resize(out_.strings.size(), 0);
    // Give back a reservation that overshot by more than 1/16 (one copy of the store, a few
    // percent of the read), so that the store's footprint is what it holds.
    auto trim = [](auto& v) {
      if (v.capacity() > v.size() + v.size() / 16 + 64) v.shrink_to_fit();
    };
    trim(out_.events);
    trim(out_.arg_keys);
    trim(out_.arg_values);
  }

  struct process_name_entry {
    std::int64_t pid;
    string_id pid_text;
    string_id name;
  };

  lumos::detail::byte_source& source_;
  std::string name_;
  std::unique_ptr<char[]>& buffer_;  // the workspace's, which may grow while reading
  std::size_t& capacity_;
  std::vector<std::uint32_t>& starts_;
  std::vector<std::uint32_t>& ends_;
  simdjson::ondemand::parser& parser_;
  std::string& scratch_;
  std::size_t pos_ = 0;
  std::size_t hi_ = 0;
  std::uint64_t base_offset_ = 0;
  bool eof_ = false;
  bool in_events_ = false;
  std::size_t batch_index_ = 0;
  std::size_t batch_bytes_ = 0;
  const char* batch_end_ = nullptr;
  std::uint64_t size_hint_ = 0;
  bool reserved_ = false;
  std::uint64_t event_index_ = 0;
  rank_trace out_;
  std::vector<std::uint8_t> cat_kind_;
  std::string meta_name_;
  string_id last_cat_ = no_string;
  std::string_view last_cat_text_;
  std::unordered_map<lane_key, std::uint32_t, lane_hash> lane_ids_;
  lane_key last_lane_key_{};
  std::uint32_t last_lane_ = ~std::uint32_t{0};
  std::vector<std::pair<lane_key, string_id>> thread_names_;
  std::vector<process_name_entry> process_names_;
};

namespace detail {

// Deflate's best case: a 258-byte match coded in 2 bits of a dynamic block, about 1032:1.
inline constexpr std::uint64_t max_deflate_ratio = 1032;

// The ISIZE trailer of a gzip stream of `compressed` bytes, as a size hint. The trailer is not
// checked until the stream's end, so a corrupt one may claim 4 GiB for a few KiB of input: no
// stream can inflate beyond max_deflate_ratio times its size (plus the header), so neither can
// the hint, which bounds what the reader reserves from it.
[[nodiscard]] constexpr std::uint64_t plausible_gzip_size(std::uint64_t isize, std::uint64_t compressed) noexcept {
  return std::clamp<std::uint64_t>(isize, compressed, compressed * max_deflate_ratio);
}

// Uncompressed size of gzip bytes from the ISIZE trailer (exact below 4 GiB, bounded by what
// the bytes can inflate to), else the size.
[[nodiscard]] inline std::uint64_t gzip_size_hint(std::string_view bytes) noexcept {
  if (bytes.size() < 18 || static_cast<unsigned char>(bytes[0]) != 0x1f || static_cast<unsigned char>(bytes[1]) != 0x8b) {
    return bytes.size();
  }
  const auto* t = reinterpret_cast<const unsigned char*>(bytes.data() + bytes.size() - 4);
  const std::uint64_t isize = std::uint64_t{t[0]} | std::uint64_t{t[1]} << 8 | std::uint64_t{t[2]} << 16 | std::uint64_t{t[3]} << 24;
  return plausible_gzip_size(isize, bytes.size());
}

// Uncompressed size of a file: its size, or for gzip the ISIZE trailer (exact below 4 GiB,
// bounded as in gzip_size_hint).
[[nodiscard]] inline std::uint64_t uncompressed_size_hint(const std::filesystem::path& p) {
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(p, ec);
  if (ec) return 0;
  std::FILE* f = std::fopen(p.string().c_str(), "rb");
  if (f == nullptr) return size;
  unsigned char head[2] = {0, 0};
  unsigned char tail[4] = {0, 0, 0, 0};
  std::uint64_t result = size;
  if (std::fread(head, 1, 2, f) == 2 && head[0] == 0x1f && head[1] == 0x8b && size >= 18 &&
      std::fseek(f, -4, SEEK_END) == 0 && std::fread(tail, 1, 4, f) == 4) {
    result = std::uint64_t{tail[0]} | std::uint64_t{tail[1]} << 8 | std::uint64_t{tail[2]} << 16 |
             std::uint64_t{tail[3]} << 24;
    result = plausible_gzip_size(result, size);
  }
  std::fclose(f);
  return result;
}

inline rank_trace finish_rank(rank_trace t) {
  if (t.distributed_rank) {
    t.rank = *t.distributed_rank;
    t.origin = rank_origin::distributed_info;
  }
  return t;
}

}  // namespace detail

/// Reads one trace file (.json or .json.gz, recognised by content). The rank is set from
/// distributedInfo.rank when present (the job loader decides otherwise). Pass a workspace to
/// reuse buffers across files.
[[nodiscard]] inline rank_trace read_trace(const std::filesystem::path& file, read_options options = {},
                                           reader_workspace* workspace = nullptr) {
  if (options.size_hint == 0) options.size_hint = detail::uncompressed_size_hint(file);
  lumos::detail::byte_source source(file.string());
  reader_workspace local;
  kineto_reader reader(source, options, workspace != nullptr ? *workspace : local);
  return detail::finish_rank(reader.read());
}

/// Reads a trace held in memory (JSON text or gzip bytes); `name` is used in error messages.
[[nodiscard]] inline rank_trace read_trace_bytes(std::string_view bytes, std::string name = "<memory>",
                                                 read_options options = {}, reader_workspace* workspace = nullptr) {
  if (options.size_hint == 0) options.size_hint = detail::gzip_size_hint(bytes);
  lumos::detail::byte_source source(bytes, std::move(name));
  reader_workspace local;
  kineto_reader reader(source, options, workspace != nullptr ? *workspace : local);
  return detail::finish_rank(reader.read());
}

}  // namespace lumos::trace

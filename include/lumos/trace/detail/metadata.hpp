#pragma once
// The top level of a trace file and its metadata: distributedInfo, deviceProperties,
// baseTimeNanoseconds, process groups (before or after traceEvents).

#include <lumos/trace/detail/kineto_reader.hpp>

namespace lumos::trace {

// Reads a top-level key (no unescaping: the keys we look for have no escapes).
inline auto kineto_reader::read_key() -> std::string {
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
inline void kineto_reader::skip_value(std::string* capture) {
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

inline void kineto_reader::parse_top_level() {
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

template <class T>
[[nodiscard]] inline auto kineto_reader::need(simdjson::simdjson_result<T> r, std::uint64_t at, std::string_view what) const -> T {
  T v{};
  if (std::move(r).get(v) != simdjson::SUCCESS) fail_at(at, "expected " + std::string(what));
  return v;
}

inline void kineto_reader::parse_metadata(const std::string& key, const std::string& text, std::uint64_t at) {
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
inline void kineto_reader::check_distributed_info(std::optional<std::int64_t> rank, std::optional<std::int64_t> world, std::uint64_t at) {
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

inline void kineto_reader::parse_process_groups(simdjson::ondemand::value v, std::uint64_t at) {
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

}  // namespace lumos::trace

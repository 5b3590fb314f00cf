#pragma once
// The traceEvents parser: batches of complete events handed to simdjson on-demand, each event
// into the compact store (events, args side table, lanes, interned strings).

#include <lumos/trace/detail/kineto_reader.hpp>

namespace lumos::trace {

// Checks the bytes between two elements (or after '[' / before ']'): whitespace and, when
// `comma` is set, exactly one ','.
inline void kineto_reader::check_gap(std::size_t from, std::size_t to, bool comma, std::string_view context) const {
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

inline void kineto_reader::read_events() {
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

inline void kineto_reader::parse_batch() {
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
  const bool first_batch = !reserved_;
  if (first_batch) reserve_events(length);
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
  if (first_batch) reserve_args();
}

// Sizes the event store once, from the bytes per event of the first batch and the expected
// file size: no repeated growth (each a copy and fresh page faults), little overshoot.
inline void kineto_reader::reserve_events(std::size_t first_batch_bytes) {
  reserved_ = true;
  if (size_hint_ == 0 || starts_.empty()) return;
  // Floored: a first batch of tiny or skipped entries ("{}") must not make a reservation of
  // dozens of bytes per input byte. No event the reader stores is shorter than this.
  constexpr double min_bytes_per_event = 32;
  const double bytes_per_event =
      std::max(min_bytes_per_event, static_cast<double>(first_batch_bytes) / static_cast<double>(starts_.size()));
  const double expected = static_cast<double>(size_hint_) / bytes_per_event * 1.05 + 64;
  expected_events_ = std::min(expected, 2.0e9);
  out_.events.reserve(static_cast<std::size_t>(expected_events_));
}

// Sizes the args side table once the first batch is stored, at its args per event: about a
// third of the events carry args, so sizing it like the events would overshoot threefold.
inline void kineto_reader::reserve_args() {
  if (expected_events_ == 0 || out_.events.empty()) return;
  const double per_event = static_cast<double>(out_.arg_keys.size()) / static_cast<double>(out_.events.size());
  const auto args = static_cast<std::size_t>(expected_events_ * per_event * 1.05 + 64);
  out_.arg_keys.reserve(args);
  out_.arg_values.reserve(args);
}

// A batch failed as a whole (e.g. invalid UTF-8): find the first event that fails on its own.
[[noreturn]] inline void kineto_reader::locate_batch_error() {
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
[[noreturn]] inline void kineto_reader::event_fail(std::string_view what) const {
  fail_at(offset_of(starts_[batch_index_]), what, static_cast<std::int64_t>(event_index_));
}

[[noreturn]] inline void kineto_reader::type_fail(std::string_view field, std::string_view expected,
    simdjson::ondemand::value& v) const {
  simdjson::ondemand::json_type t{};
  std::string got = v.type().get(t) == simdjson::SUCCESS ? std::string(detail::type_name(t)) : "malformed JSON";
  event_fail("expected " + std::string(expected) + " for \"" + std::string(field) + "\", got " + got);
}

inline auto kineto_reader::read_time(simdjson::ondemand::value& v, std::string_view field) -> time_ns {
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
inline auto kineto_reader::read_int(simdjson::ondemand::value& v, std::string_view field) -> std::int64_t {
  const std::string_view token = detail::trim_right(v.raw_json_token());
  const parsed_int x = parse_integer(token);
  if (x.error != number_error::none) {
    if (x.error == number_error::out_of_range) event_fail("integer out of range for \"" + std::string(field) + "\"");
    type_fail(field, "an integer", v);
  }
  return x.value;
}

// pid / tid: an integer, or a string (Kineto writes "Spans", "Traces" rows).
inline void kineto_reader::read_id(simdjson::ondemand::value& v, std::string_view field, std::int64_t& number, string_id& text) {
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
inline auto kineto_reader::read_string(simdjson::ondemand::value& v, std::string_view field) -> std::string_view {
  simdjson::ondemand::raw_json_string raw;
  if (v.get_raw_json_string().get(raw) != simdjson::SUCCESS) type_fail(field, "a string", v);
  const char* const begin = raw.raw();
  const char* const stop = detail::find_quote_or_escape(begin, batch_end_);
  if (stop == batch_end_) event_fail("unterminated string");
  if (*stop == '"') return {begin, static_cast<std::size_t>(stop - begin)};
  return unescape(begin, batch_end_);
}

// JSON string unescaping (RFC 8259), writing UTF-8; the input was UTF-8-validated by simdjson.
inline auto kineto_reader::unescape(const char* p, const char* end) -> std::string_view {
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
inline auto kineto_reader::read_text_arg(simdjson::ondemand::value& v) -> string_id {
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

inline void kineto_reader::parse_args(simdjson::ondemand::value& v, event& e, pending& p) {
  namespace od = simdjson::ondemand;
  od::object obj;
  if (v.get_object().get(obj) != simdjson::SUCCESS) type_fail("args", "an object", v);
  for (auto f : obj) {
    if (f.error() != simdjson::SUCCESS) event_fail("malformed \"args\"");
    od::field& field = f.value_unsafe();
    const int code = detail::args_index.find_raw(field.key().raw());
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

inline void kineto_reader::push_arg(arg_key k, std::int64_t v) {
  out_.arg_keys.push_back(k);
  out_.arg_values.push_back(v);
}

inline auto kineto_reader::category_for(string_id cat) -> category {
  if (cat >= cat_kind_.size()) cat_kind_.resize(out_.strings.size(), 0xFF);
  if (cat_kind_[cat] == 0xFF) cat_kind_[cat] = static_cast<std::uint8_t>(category_of(out_.strings[cat]));
  return static_cast<category>(cat_kind_[cat]);
}

inline void kineto_reader::parse_event(simdjson::ondemand::object& obj) {
  namespace od = simdjson::ondemand;
  event e;
  pending p;
  e.args_begin = static_cast<std::uint32_t>(out_.arg_keys.size());
  for (auto f : obj) {
    if (f.error() != simdjson::SUCCESS) event_fail("malformed event");
    od::field& field = f.value_unsafe();
    const int code = detail::event_index.find_raw(field.key().raw());
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
      case detail::k_cat:
      case detail::k_name: {
        // Consecutive events mostly share a category, and alternate a few names: compare the
        // raw bytes first.
        const bool cat = code == detail::k_cat;
        detail::recent_strings& recent = cat ? recent_cats_ : recent_names_;
        string_id id = recent.find(value.raw_json_token());
        if (id == no_string) {
          id = out_.strings.intern(read_string(value, cat ? "cat" : "name"));
          recent.add(id, out_.strings[id]);
        }
        (cat ? e.cat_name : e.name) = id;
        p.has_name = p.has_name || !cat;
        break;
      }
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

inline void kineto_reader::rollback_args(const event& e) {
  out_.arg_keys.resize(e.args_begin);
  out_.arg_values.resize(e.args_begin);
}

inline void kineto_reader::record_metadata(const event& e, const pending& p) {
  if (!p.has_meta_name || !p.has_pid) return;
  const std::string_view kind = out_.str(e.name);
  const string_id value = out_.strings.intern(p.meta_name);
  if (kind == "process_name") {
    process_names_.push_back({p.pid, p.pid_text, value});
  } else if (kind == "thread_name") {
    thread_names_.push_back({lane_key{p.pid, p.tid, p.pid_text, p.tid_text}, value});
  }
}

// Kineto writes a kernel next to its launch, so consecutive events alternate between two lanes
// more often than they stay on one: the two lanes used last are remembered.
inline auto kineto_reader::lane_of(std::int64_t pid, std::int64_t tid, string_id pid_text, string_id tid_text) -> std::uint32_t {
  const lane_key key{pid, tid, pid_text, tid_text};
  if (recent_lanes_[0].lane != ~std::uint32_t{0} && recent_lanes_[0].key == key) return recent_lanes_[0].lane;
  if (recent_lanes_[1].lane != ~std::uint32_t{0} && recent_lanes_[1].key == key) {
    std::swap(recent_lanes_[0], recent_lanes_[1]);
    return recent_lanes_[0].lane;
  }
  auto [it, inserted] = lane_ids_.try_emplace(key, static_cast<std::uint32_t>(out_.lanes.size()));
  if (inserted) {
    lane l;
    l.pid = pid;
    l.tid = tid;
    l.pid_text = pid_text;
    l.tid_text = tid_text;
    out_.lanes.push_back(l);
  }
  recent_lanes_[1] = recent_lanes_[0];
  recent_lanes_[0] = {key, it->second};
  return it->second;
}

inline void kineto_reader::finish() {
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
  // Give back a reservation that overshot by more than a quarter. A smaller overshoot (the
  // 5 % headroom and the first batch's density being off by a few percent: 7 % on every rank
  // of a synthesized 512-rank job) is left: its pages were never touched, so they cost no
  // resident memory, and copying the store to trim it cost a pass and fresh page faults.
  auto trim = [](auto& v) {
    if (v.capacity() > v.size() + v.size() / 4 + 64) v.shrink_to_fit();
  };
  trim(out_.events);
  trim(out_.arg_keys);
  trim(out_.arg_values);
}

}  // namespace lumos::trace

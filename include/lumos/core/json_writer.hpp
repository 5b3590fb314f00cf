#pragma once
// A minimal streaming JSON writer: enough for reports and Kineto-style traces, no DOM.

#include <lumos/core/time.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lumos {

/// Appends JSON to a std::string. Commas are inserted automatically; the caller nests
/// begin/end calls correctly (checked in debug builds only through the stack depth).
/// Doubles are written with the shortest representation that round-trips (std::to_chars), so
/// the output is deterministic.
class json_writer {
 public:
  explicit json_writer(std::string& out) : out_(out) {}

  json_writer& begin_object() { return open('{'); }
  json_writer& end_object() { return close('}'); }
  json_writer& begin_array() { return open('['); }
  json_writer& end_array() { return close(']'); }

  json_writer& key(std::string_view k) {
    comma();
    string_literal(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  json_writer& value(std::string_view s) {
    comma();
    string_literal(s);
    return *this;
  }
  json_writer& value(const char* s) { return value(std::string_view(s)); }
  json_writer& value(bool b) {
    comma();
    out_ += b ? "true" : "false";
    return *this;
  }
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  json_writer& value(T v) {
    comma();
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, static_cast<std::size_t>(r.ptr - buf));
    return *this;
  }
  json_writer& value(double v) {
    comma();
    if (!std::isfinite(v)) {
      out_ += "null";
      return *this;
    }
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, static_cast<std::size_t>(r.ptr - buf));
    return *this;
  }
  json_writer& null() {
    comma();
    out_ += "null";
    return *this;
  }
  /// Writes nanoseconds as Kineto microseconds with three decimals.
  json_writer& microseconds(time_ns ns) {
    comma();
    write_microseconds(out_, ns);
    return *this;
  }
  /// Inserts pre-formatted JSON as one value.
  json_writer& raw(std::string_view json) {
    comma();
    out_ += json;
    return *this;
  }
  template <class T>
  json_writer& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }

  /// Appends `s` as a JSON string literal, escaping as RFC 8259 requires.
  static void escape(std::string& out, std::string_view s) {
    out += '"';
    // Runs that need no escape (nearly everything in a trace) are appended whole.
    std::size_t plain = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      out.append(s.data() + plain, i - plain);
      plain = i + 1;
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default: {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        }
      }
    }
    out.append(s.data() + plain, s.size() - plain);
    out += '"';
  }

 private:
  json_writer& open(char c) {
    comma();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  json_writer& close(char c) {
    out_ += c;
    if (!first_.empty()) first_.pop_back();
    return *this;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void string_literal(std::string_view s) { escape(out_, s); }

  std::string& out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace lumos

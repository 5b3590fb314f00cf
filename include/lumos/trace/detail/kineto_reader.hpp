#pragma once
// The reader's class: its options, its reusable workspace and its state. Its members are defined
// by part next to this header: the text window (window.hpp), the top level and metadata
// (metadata.hpp), and the traceEvents parser (events.hpp); trace/reader.hpp includes them all.

#include <lumos/trace/detail/keys.hpp>


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

// The strings a reader met last (a trace alternates kernels and their launch calls, so two),
// matched on an event's raw JSON token before it pays for a string read and an intern. A token
// "TEXT" is the string TEXT only when nothing in TEXT was escaped, so a string with a backslash
// is never kept: ab\ (read from "ab\\") would match the token "ab\"", which is the string ab".
class recent_strings {
 public:
  [[nodiscard]] string_id find(std::string_view token) noexcept {
    for (unsigned i = 0; i < slots_.size(); ++i) {
      const slot& s = slots_[i];
      if (s.id != no_string && token.size() >= s.text.size() + 2 && token[0] == '"' && token[s.text.size() + 1] == '"' &&
          token.substr(1, s.text.size()) == s.text) {
        last_ = i;
        return s.id;
      }
    }
    return no_string;
  }
  // `text` must outlive the reader (a view into its string table).
  void add(string_id id, std::string_view text) noexcept {
    if (text.find('\\') != std::string_view::npos) return;
    last_ ^= 1U;  // replaces the one used less recently
    slots_[last_] = {id, text};
  }

 private:
  struct slot {
    string_id id = no_string;
    std::string_view text;
  };
  std::array<slot, 2> slots_{};
  unsigned last_ = 0;  // the slot matched or added last
};

}  // namespace detail

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
  [[nodiscard]] std::uint64_t offset_of(const char* p) const noexcept;

  [[noreturn]] void fail_at(std::uint64_t offset, std::string_view what, std::int64_t event = -1) const;

  bool fill();

  char peek();

  void expect(char c, std::string_view what);

  [[nodiscard]] std::int64_t current_event() const noexcept;

  // ---- top level ----------------------------------------------------------------------------

  std::string read_key();

  void skip_value(std::string* capture);

  void parse_top_level();

  // ---- metadata -----------------------------------------------------------------------------

  template <class T>
  [[nodiscard]] T need(simdjson::simdjson_result<T> r, std::uint64_t at, std::string_view what) const;

  void parse_metadata(const std::string& key, const std::string& text, std::uint64_t at);

  void check_distributed_info(std::optional<std::int64_t> rank, std::optional<std::int64_t> world, std::uint64_t at);

  void parse_process_groups(simdjson::ondemand::value v, std::uint64_t at);

  // ---- traceEvents --------------------------------------------------------------------------

  void check_gap(std::size_t from, std::size_t to, bool comma, std::string_view context) const;

  void read_events();

  void parse_batch();

  void reserve_events(std::size_t first_batch_bytes);
  void reserve_args();

  [[noreturn]] void locate_batch_error();

  [[noreturn]] void event_fail(std::string_view what) const;

  [[noreturn]] void type_fail(std::string_view field, std::string_view expected,
                              simdjson::ondemand::value& v) const;

  time_ns read_time(simdjson::ondemand::value& v, std::string_view field);

  std::int64_t read_int(simdjson::ondemand::value& v, std::string_view field);

  void read_id(simdjson::ondemand::value& v, std::string_view field, std::int64_t& number, string_id& text);

  std::string_view read_string(simdjson::ondemand::value& v, std::string_view field);

  std::string_view unescape(const char* p, const char* end);

  string_id read_text_arg(simdjson::ondemand::value& v);

  struct pending {
    std::int64_t pid = 0, tid = 0;
    string_id pid_text = no_string, tid_text = no_string;
    std::int64_t stream = 0, device = 0;
    std::string_view meta_name;
    bool has_ph = false, has_ts = false, has_dur = false, has_name = false;
    bool has_pid = false, has_tid = false, has_stream = false, has_device = false, has_meta_name = false;
    char ph = 0;
  };

  void parse_args(simdjson::ondemand::value& v, event& e, pending& p);

  void push_arg(arg_key k, std::int64_t v);
  void push_arg(arg_key k, string_id v) { push_arg(k, static_cast<std::int64_t>(v)); }

  category category_for(string_id cat);

  void parse_event(simdjson::ondemand::object& obj);

  void rollback_args(const event& e);

  void record_metadata(const event& e, const pending& p);

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

  std::uint32_t lane_of(std::int64_t pid, std::int64_t tid, string_id pid_text, string_id tid_text);

  void finish();

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
  double expected_events_ = 0;
  std::uint64_t event_index_ = 0;
  rank_trace out_;
  std::vector<std::uint8_t> cat_kind_;
  std::string meta_name_;
  detail::recent_strings recent_cats_, recent_names_;
  std::unordered_map<lane_key, std::uint32_t, lane_hash> lane_ids_;
  struct recent_lane {
    lane_key key{};
    std::uint32_t lane = ~std::uint32_t{0};
  };
  std::array<recent_lane, 2> recent_lanes_{};  // the lane used last first
  std::vector<std::pair<lane_key, string_id>> thread_names_;
  std::vector<process_name_entry> process_names_;
};

}  // namespace lumos::trace

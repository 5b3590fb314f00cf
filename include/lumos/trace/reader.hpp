#pragma once
// The Kineto trace reader: one file (.json or .json.gz) → one rank_trace.
//
// The file is never held whole. Decompressed text flows through a bounded window; a SIMD scan
// finds where complete events end; each run of complete events is handed to simdjson on-demand
// as one small document ("[ev, ev, ...]", made in place by borrowing the separator bytes around
// the run). Top-level metadata (distributedInfo, deviceProperties, baseTimeNanoseconds) may come
// before or after traceEvents. This is the only header that includes simdjson.
//
// The parts are in trace/detail/: key tables (keys.hpp), the class and its options
// (kineto_reader.hpp), the text window, the top level and metadata, and the event parser.

#include <lumos/trace/detail/kineto_reader.hpp>
#include <lumos/trace/detail/window.hpp>
#include <lumos/trace/detail/metadata.hpp>
#include <lumos/trace/detail/events.hpp>


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

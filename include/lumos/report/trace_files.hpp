#pragma once
// Writing files: a simulated job as one Kineto trace file per rank, and any text (a trace, an
// HTML report) to a file, gzip-compressed when its name ends in `.gz`. The I/O half of
// report/trace_writer.hpp: it needs zlib, so it is part of lumos::lumos, not lumos::core.

#include <lumos/core/error.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/trace/job.hpp>

#ifdef LUMOS_HAVE_ISAL
#include <isa-l/igzip_lib.h>
#endif
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace lumos::report {

namespace detail {

/// Creates the directories `path` is in, as `--trace-out` creates its own: every file a command
/// writes (reports, traces, CSV, profiles) may name a directory that does not exist yet.
inline void create_parent_directories(const std::filesystem::path& path) {
  if (!path.has_parent_path()) return;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) throw error(path.parent_path().string() + ": cannot create directory: " + ec.message());
}

inline void write_plain(const std::filesystem::path& path, std::string_view text) {
  create_parent_directories(path);
  std::FILE* f = std::fopen(path.string().c_str(), "wb");
  if (f == nullptr) throw error(path.string() + ": cannot write");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw error(path.string() + ": write failed");
}

#ifdef LUMOS_HAVE_ISAL
// igzip's fast level: several times zlib's speed on trace JSON for slightly larger files (a
// 512-rank job writes gigabytes of JSON; `bash scripts/bench.sh scale` times it).
inline void write_gzip(const std::filesystem::path& path, const std::string& text, std::string& out) {
  out.resize(std::max(out.size(), text.size() / 4 + (1 << 16)));
  // Zeroed, on the heap, cache-line aligned (igzip_lib.h asks for an aligned hash head): the
  // level-1 body reads stream state that isal_deflate_init leaves as it was, so a stream on the
  // stack compressed or crashed (in isal_deflate_icf_body_hash_hist) depending on what a caller
  // had left there; and 80 KB of stream does not belong on a worker thread's stack.
  struct alignas(64) deflate_state {
    isal_zstream stream;
    alignas(64) std::uint8_t level_buf[ISAL_DEF_LVL1_DEFAULT];
  };
  const auto state = std::make_unique<deflate_state>();
  isal_zstream& z = state->stream;
  isal_deflate_init(&z);
  z.gzip_flag = IGZIP_GZIP;
  z.level = 1;
  z.level_buf = state->level_buf;
  z.level_buf_size = static_cast<std::uint32_t>(sizeof state->level_buf);
  z.flush = NO_FLUSH;
  std::size_t in_at = 0;
  std::size_t out_at = 0;
  constexpr std::size_t chunk = std::size_t{1} << 30;  // avail_in is 32 bits
  while (z.internal_state.state != ZSTATE_END) {
    if (z.avail_in == 0 && in_at < text.size()) {
      const std::size_t n = std::min(chunk, text.size() - in_at);
      z.next_in = reinterpret_cast<std::uint8_t*>(const_cast<char*>(text.data() + in_at));
      z.avail_in = static_cast<std::uint32_t>(n);
      in_at += n;
    }
    z.end_of_stream = in_at == text.size() ? 1 : 0;
    if (out.size() - out_at < (1 << 16)) out.resize(out.size() * 2);
    const std::size_t room = std::min(out.size() - out_at, chunk);
    z.next_out = reinterpret_cast<std::uint8_t*>(out.data() + out_at);
    z.avail_out = static_cast<std::uint32_t>(room);
    if (isal_deflate(&z) != COMP_OK) throw error(path.string() + ": gzip compression failed");
    out_at += room - z.avail_out;
  }
  write_plain(path, std::string_view(out).substr(0, out_at));
}
#else
inline void write_gzip(const std::filesystem::path& path, const std::string& text, std::string& /*scratch*/) {
  create_parent_directories(path);
  gzFile f = gzopen(path.string().c_str(), "wb1");
  if (f == nullptr) throw error(path.string() + ": cannot write");
  bool ok = true;
  constexpr std::size_t chunk = std::size_t{1} << 30;  // gzwrite takes an unsigned count
  for (std::size_t at = 0; ok && at < text.size(); at += chunk) {
    const auto n = static_cast<unsigned>(std::min(chunk, text.size() - at));
    ok = gzwrite(f, text.data() + at, n) == static_cast<int>(n);
  }
  if (gzclose(f) != Z_OK || !ok) throw error(path.string() + ": write failed");
}
#endif

/// `scratch`: a buffer for the compressed bytes, kept by callers that write many files.
inline void write_file(const std::filesystem::path& path, const std::string& text, std::string& scratch) {
  const std::string name = path.filename().string();
  const bool gz = name.size() > 3 && name.compare(name.size() - 3, 3, ".gz") == 0;
  if (gz) {
    write_gzip(path, text, scratch);
  } else {
    write_plain(path, text);
  }
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::string scratch;
  write_file(path, text, scratch);
}

}  // namespace detail

/// Writes every rank of `job` to `path`: a directory (one `rank{R}.json` per rank, or
/// `.json.gz` when `gzip`), or — for a single-rank job — a file named `*.json` / `*.json.gz`.
/// Ranks are serialised and compressed on up to `threads` threads (0: one per core); the files
/// do not depend on the thread count, nor does the error when one cannot be written (the first
/// failing rank in `ranks` order; the ranks after it are not written).
inline std::vector<std::filesystem::path> write_kineto(const simulated_job& job, const std::vector<int>& ranks,
                                                       const std::filesystem::path& path, bool gzip = false,
                                                       unsigned threads = 0) {
  namespace fs = std::filesystem;
  const rank_index index = index_ranks(*job.graph, ranks);
  std::vector<fs::path> files;
  const bool is_file = ranks.size() == 1 && trace::is_trace_file_name(path);
  if (is_file) {
    detail::write_file(path, kineto_json(job, ranks.front(), index));
    files.push_back(path);
    return files;
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw error(path.string() + ": cannot create directory: " + ec.message());
  for (const int r : ranks) files.push_back(path / ("rank" + std::to_string(r) + (gzip ? ".json.gz" : ".json")));
  struct buffers {
    std::string json, compressed;  // reused: fresh multi-megabyte buffers per rank cost page faults
  };
  parallel_for(
      ranks.size(), hardware_threads(threads), [] { return buffers{}; },
      [&](buffers& b, std::size_t i) {
        kineto_json(b.json, job, ranks[i], index);
        detail::write_file(files[i], b.json, b.compressed);
      });
  return files;
}

}  // namespace lumos::report

#pragma once
// Writing files: a simulated job as one Kineto trace file per rank, and any text (a trace, an
// HTML report) to a file, gzip-compressed when its name ends in `.gz`. The I/O half of
// report/trace_writer.hpp: it needs zlib, so it is part of lumos::lumos, not lumos::core.

#include <lumos/core/error.hpp>
#include <lumos/report/trace_writer.hpp>
#include <lumos/trace/job.hpp>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace lumos::report {

namespace detail {

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  const std::string name = path.filename().string();
  const bool gz = name.size() > 3 && name.compare(name.size() - 3, 3, ".gz") == 0;
  if (gz) {
    gzFile f = gzopen(path.string().c_str(), "wb6");
    if (f == nullptr) throw error(path.string() + ": cannot write");
    const bool ok = gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size());
    if (gzclose(f) != Z_OK || !ok) throw error(path.string() + ": write failed");
    return;
  }
  std::FILE* f = std::fopen(path.string().c_str(), "wb");
  if (f == nullptr) throw error(path.string() + ": cannot write");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw error(path.string() + ": write failed");
}

}  // namespace detail

/// Writes every rank of `job` to `path`: a directory (one `rank{R}.json` per rank, or
/// `.json.gz` when `gzip`), or — for a single-rank job — a file named `*.json` / `*.json.gz`.
inline std::vector<std::filesystem::path> write_kineto(const simulated_job& job, const std::vector<int>& ranks,
                                                       const std::filesystem::path& path, bool gzip = false) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  const std::string name = path.filename().string();
  const bool is_file = ranks.size() == 1 && trace::is_trace_file_name(path);
  if (is_file) {
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    detail::write_file(path, kineto_json(job, ranks.front()));
    files.push_back(path);
    return files;
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw error(path.string() + ": cannot create directory: " + ec.message());
  for (const int r : ranks) {
    const fs::path file = path / ("rank" + std::to_string(r) + (gzip ? ".json.gz" : ".json"));
    detail::write_file(file, kineto_json(job, r));
    files.push_back(file);
  }
  return files;
}

}  // namespace lumos::report

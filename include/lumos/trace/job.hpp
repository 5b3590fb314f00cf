#pragma once
// Loading a job: one trace per rank, read in parallel (the `job` type itself is in trace/data.hpp).

#include <lumos/core/error.hpp>
#include <lumos/core/parallel.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/trace/reader.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <system_error>
#include <string>
#include <vector>

namespace lumos::trace {

struct load_options {
  /// Loader threads; 0 = one per hardware thread (never more than files).
  unsigned threads = 0;
  /// Window per reader; 0 = automatic: small enough that all readers together hold less than
  /// the uncompressed size of the largest file, capped at 1 MiB.
  std::size_t window_bytes = 0;
  /// Called after each file is read (from a loader thread, serialised), e.g. for progress.
  std::function<void(const rank_trace&, std::size_t done, std::size_t total)> on_loaded;
};

/// True for names a trace file may have: *.json or *.json.gz.
[[nodiscard]] inline bool is_trace_file_name(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  auto ends_with = [&](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".json") || ends_with(".json.gz");
}

/// Files of a job from a list of files and directories. A directory contributes its *.json and
/// *.json.gz files (not recursively), sorted by name. Errors: missing path, empty directory.
[[nodiscard]] inline std::vector<std::filesystem::path> expand_inputs(
    const std::vector<std::filesystem::path>& inputs) {
  namespace fs = std::filesystem;
  if (inputs.empty()) throw error("no trace files given");
  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    const auto status = fs::status(in, ec);
    if (ec || !fs::exists(status)) fail({in.string()}, "no such file or directory");
    if (fs::is_directory(status)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(in, ec)) {
        if (entry.is_regular_file() && is_trace_file_name(entry.path())) found.push_back(entry.path());
      }
      if (ec) fail({in.string()}, "cannot list directory: " + ec.message());
      if (found.empty()) fail({in.string()}, "directory holds no .json or .json.gz trace files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

/// Rank written in a file name: "rank-3", "rank_3", "rank3", "worker3", or a trailing "_3"/"-3"
/// of at most six digits before the extension ("megatron_kineto_3.json.gz"). Empty when none.
/// Throws lumos::error when "rank"/"worker" is followed by a number of max_world_size or more:
/// such a name says it holds a rank, and no rank can be that large.
[[nodiscard]] inline std::optional<int> rank_from_file_name(const std::filesystem::path& p) {
  std::string name = p.filename().string();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto digits_at = [&](std::size_t i) -> std::optional<int> {
    if (i < name.size() && (name[i] == '-' || name[i] == '_')) ++i;
    if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
    const std::size_t first = i;
    std::int64_t v = 0;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) {
      v = std::min<std::int64_t>(v * 10 + (name[i++] - '0'), max_world_size);  // saturates: no overflow
    }
    if (v >= max_world_size) {
      fail({p.string()}, "rank " + name.substr(first, i - first) + " in the file name is out of range (0 to " +
                             std::to_string(max_world_size - 1) + ")");
    }
    return static_cast<int>(v);
  };
  for (std::string_view word : {"rank", "worker"}) {
    for (std::size_t at = name.find(word); at != std::string::npos; at = name.find(word, at + 1)) {
      if (auto r = digits_at(at + word.size())) return r;
    }
  }
  for (std::string_view ext : {".json.gz", ".json", ".pt.trace"}) {
    if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
      name.resize(name.size() - ext.size());
    }
  }
  std::size_t i = name.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(name[i - 1]))) --i;
  if (i == name.size() || i == 0 || (name[i - 1] != '_' && name[i - 1] != '-')) return std::nullopt;
  if (name.size() - i > 6) return std::nullopt;
  return std::stoi(name.substr(i));
}


/// Loads every rank of a job. Ranks come from distributedInfo.rank, else from the file name,
/// else from the position in the (expanded) input list; two files with one rank are an error.
/// Files are read in parallel; the result does not depend on the thread count.
[[nodiscard]] inline job load_job(const std::vector<std::filesystem::path>& inputs, const load_options& options = {}) {
  const std::vector<std::filesystem::path> files = expand_inputs(inputs);
  if (files.size() > static_cast<std::size_t>(max_world_size)) {
    throw error(std::to_string(files.size()) + " trace files: more ranks than lumos accepts (" +
                std::to_string(max_world_size) + ")");
  }
  const unsigned threads = std::min<unsigned>(hardware_threads(options.threads), static_cast<unsigned>(files.size()));

  read_options read;
  if (options.window_bytes != 0) {
    read.window_bytes = options.window_bytes;
  } else {
    std::uint64_t largest = 0;
    for (const auto& f : files) largest = std::max(largest, detail::uncompressed_size_hint(f));
    // Each thread's reader holds its window (plus the index of one batch): throughput does not
    // depend on the window above ~64 KiB (bench_reader), so keep it small when memory is shared.
    const std::uint64_t share = largest / (8ULL * threads);
    read.window_bytes = static_cast<std::size_t>(std::clamp<std::uint64_t>(share, 64 * 1024, 1 << 20));
  }

  std::vector<std::optional<rank_trace>> loaded(files.size());
  std::mutex progress;
  std::size_t done = 0;
  // The error reported is the first failing file in input order, whatever the timing; files
  // after it are not read.
  parallel_for(
      files.size(), threads, [] { return reader_workspace{}; },
      [&](reader_workspace& workspace, std::size_t i) {
        loaded[i] = read_trace(files[i], read, &workspace);
        if (options.on_loaded) {
          std::lock_guard lock(progress);
          options.on_loaded(*loaded[i], ++done, files.size());
        }
      });

  job result;
  result.ranks.reserve(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    rank_trace& t = *loaded[i];
    if (t.distributed_rank) {
      t.rank = *t.distributed_rank;
      t.origin = rank_origin::distributed_info;
    } else if (auto r = rank_from_file_name(files[i])) {
      t.rank = *r;
      t.origin = rank_origin::file_name;
    } else {
      t.rank = static_cast<int>(i);
      t.origin = rank_origin::order;
    }
    // The reader checked distributedInfo.rank against world_size; a rank from the name or the
    // order must fit the world size the file declares too.
    if (t.world_size && t.rank >= *t.world_size) {
      fail({t.file}, "rank " + std::to_string(t.rank) + " (from the " + std::string(to_string(t.origin)) +
                         ") is not below distributedInfo.world_size " + std::to_string(*t.world_size));
    }
    result.ranks.push_back(std::move(t));
  }
  std::stable_sort(result.ranks.begin(), result.ranks.end(),
                   [](const rank_trace& a, const rank_trace& b) { return a.rank < b.rank; });
  for (std::size_t i = 1; i < result.ranks.size(); ++i) {
    if (result.ranks[i].rank == result.ranks[i - 1].rank) {
      throw error("duplicate rank " + std::to_string(result.ranks[i].rank) + ": " +
                  result.ranks[i - 1].file + " (" + std::string(to_string(result.ranks[i - 1].origin)) +
                  ") and " + result.ranks[i].file + " (" + std::string(to_string(result.ranks[i].origin)) + ")");
    }
  }
  return result;
}

}  // namespace lumos::trace

#pragma once
// Helpers shared by the test executables: temp files, gzip, locating the shared traces.

#include <sys/wait.h>
#include <zlib.h>

#include <cstdio>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace lumos_test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

/// gzip-compresses `text` (one member), with zlib.
inline std::string gzip(const std::string& text, int level = 6) {
  z_stream z{};
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("deflateInit2");
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

/// Decompresses gzip bytes with zlib (an independent path from the reader's inflater).
inline std::string gunzip(const std::string& bytes) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw std::runtime_error("inflateInit2");
  std::string out;
  std::vector<char> buf(1 << 20);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) throw std::runtime_error("inflate failed");
    out.append(buf.data(), buf.size() - z.avail_out);
  }
  inflateEnd(&z);
  return out;
}

/// A fresh directory under the system temp dir, removed on destruction.
class temp_dir {
 public:
  temp_dir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("lumos-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  std::filesystem::path write(const std::string& name, const std::string& bytes) const {
    const auto p = path_ / name;
    write_file(p, bytes);
    return p;
  }

 private:
  std::filesystem::path path_;
};

inline std::filesystem::path data_dir() { return LUMOS_TEST_DATA_DIR; }

/// Whether the tests run under CI (CI=true), where a missing input is a failure, not a skip.
inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

/// The shared real traces: $LUMOS_TRACE_DIR, else the configured default (../shared/traces).
/// Empty when absent, so that a local run without them skips what needs them; under CI=true a
/// missing directory throws instead, which fails the calling test: CI must never pass a test
/// that silently left out the traces it exists for. Every test reaches the traces through here.
inline std::filesystem::path trace_dir() {
  const char* env = std::getenv("LUMOS_TRACE_DIR");
  std::filesystem::path p = env != nullptr && *env != '\0' ? env : LUMOS_DEFAULT_TRACE_DIR;
  if (std::filesystem::is_directory(p)) return p;
  if (running_in_ci())
    throw std::runtime_error("shared traces not found at " + p.string() + " and CI=true (set LUMOS_TRACE_DIR)");
  return {};
}

#ifdef LUMOS_CLI_PATH
/// What the lumos executable did: its exit code, stdout and stderr.
struct cli_result {
  int code = -1;
  std::string out;
  std::string err;
};

/// Runs `lumos ARGS` (through the shell) and collects its output.
inline cli_result run_cli(const std::string& args) {
  temp_dir dir;
  const auto err_file = dir.path() / "stderr";
  const std::string cmd = std::string(LUMOS_CLI_PATH) + " " + args + " 2>" + err_file.string();
  cli_result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed");
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_file);
  return r;
}
#endif

}  // namespace lumos_test

/// In a test case: returns early (with a message) when the shared traces are missing; under
/// CI=true `trace_dir()` has already failed the test. Expands to `const auto traces = ...`.
#define LUMOS_REQUIRE_TRACES(traces)                                \
  const std::filesystem::path traces = lumos_test::trace_dir();     \
  if (traces.empty()) {                                              \
    WARN("shared traces not found: set LUMOS_TRACE_DIR; skipping"); \
    return;                                                          \
  }

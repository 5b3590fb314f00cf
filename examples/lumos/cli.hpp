#pragma once
// Small helpers shared by the lumos subcommands: output. The words of a command are parsed by
// the library's lumos/cli/ headers, which the Python bindings share.

#include <lumos/cli/args.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace lumos::cli {

inline bool stderr_is_terminal() { return ::isatty(2) != 0; }

inline void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
}

/// Warnings and notes of a text-mode command: on standard error, so that standard output holds
/// the results alone (in `--json` they are fields of the object).
inline void write_diagnostics(const std::string& s) {
  std::fflush(stdout);
  std::fwrite(s.data(), 1, s.size(), stderr);
}

inline std::vector<std::filesystem::path> paths(const std::vector<std::string>& items) {
  return {items.begin(), items.end()};
}

}  // namespace lumos::cli

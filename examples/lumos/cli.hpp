#pragma once
// Small helpers shared by the lumos subcommands: output. The words of a command are parsed by
// the library's lumos/cli/ headers, which the Python bindings share.

#include <lumos/cli/args.hpp>

#include <cstddef>
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

/// The outputs of `count` steps (`--step N,M,...`), `document(i)` the i-th's, in the order given:
/// a JSON array of the documents under `--json`, else the texts a blank line apart.
template <class Document>
[[nodiscard]] std::string join_step_documents(std::size_t count, bool json, Document&& document) {
  std::string out = json ? "[\n" : "";
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0) out += json ? ",\n" : "\n";
    out += document(i);
  }
  if (json) out += "]\n";
  return out;
}

inline std::vector<std::filesystem::path> paths(const std::vector<std::string>& items) {
  return {items.begin(), items.end()};
}

}  // namespace lumos::cli

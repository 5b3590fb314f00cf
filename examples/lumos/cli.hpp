#pragma once
// Small helpers shared by the lumos subcommands: argument parsing and output.

#include <lumos/core/error.hpp>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace lumos::cli {

/// A usage error: printed with the command's usage, exit code 2.
struct usage_error : lumos::error {
  using lumos::error::error;
};

/// Command-line arguments of one subcommand: flags (--name value, --name=value, --switch) and
/// positional arguments, consumed by the command and checked for leftovers.
class args {
 public:
  args(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) items_.emplace_back(argv[i]);
    used_.assign(items_.size(), false);
  }

  /// True if the switch is present (and marks it used).
  bool flag(std::string_view name) {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (!used_[i] && items_[i] == name) {
        used_[i] = true;
        return true;
      }
    }
    return false;
  }

  /// Value of `--name V` or `--name=V` (last one wins).
  std::optional<std::string> option(std::string_view name) {
    std::optional<std::string> found;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (used_[i]) continue;
      const std::string& a = items_[i];
      if (a == name) {
        if (i + 1 >= items_.size()) throw usage_error("option " + std::string(name) + " needs a value");
        used_[i] = used_[i + 1] = true;
        found = items_[i + 1];
        ++i;
      } else if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        used_[i] = true;
        found = a.substr(name.size() + 1);
      }
    }
    return found;
  }

  /// Every value of a repeatable option, in order.
  std::vector<std::string> options(std::string_view name) {
    std::vector<std::string> all;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (used_[i]) continue;
      const std::string& a = items_[i];
      if (a == name) {
        if (i + 1 >= items_.size()) throw usage_error("option " + std::string(name) + " needs a value");
        used_[i] = used_[i + 1] = true;
        all.push_back(items_[i + 1]);
        ++i;
      } else if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        used_[i] = true;
        all.push_back(a.substr(name.size() + 1));
      }
    }
    return all;
  }

  /// The remaining arguments; any leftover `--flag` is an error.
  std::vector<std::string> positionals() {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (used_[i]) continue;
      if (items_[i].size() > 1 && items_[i][0] == '-') throw usage_error("unknown option " + items_[i]);
      used_[i] = true;
      out.push_back(items_[i]);
    }
    return out;
  }

 private:
  std::vector<std::string> items_;
  std::vector<bool> used_;
};

template <class T>
T parse_number(std::string_view text, std::string_view what) {
  T v{};
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size()) {
    throw usage_error("expected a number for " + std::string(what) + ", got '" + std::string(text) + "'");
  }
  return v;
}

inline bool stderr_is_terminal() { return ::isatty(2) != 0; }

inline void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
}

inline std::vector<std::filesystem::path> paths(const std::vector<std::string>& items) {
  return {items.begin(), items.end()};
}

}  // namespace lumos::cli

#pragma once
// lumos/cli/: options from command-line words, shared by the `lumos` command (examples/lumos)
// and the Python bindings (python/src/module.cpp), so that a flag, its default, its checks and
// its messages have one definition. These headers parse words into the library's requests and
// run nothing but the library; printing, progress and file output stay with the command.
//
// This header: the words of one subcommand, consumed flag by flag.

#include <lumos/core/error.hpp>

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::cli {

/// A usage error: the command prints it with its usage, exit code 2. Other bad values are plain
/// `lumos::error`s (one line, exit code 2); the bindings raise both as `LumosError`.
struct usage_error : lumos::error {
  using lumos::error::error;
};

/// Command-line arguments of one subcommand: flags (--name value, --name=value, --switch) and
/// positional arguments, consumed by the command and checked for leftovers.
class args {
 public:
  /// `argv[first..argc)`: the words after the program and the subcommand.
  args(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) items_.emplace_back(argv[i]);
    used_.assign(items_.size(), false);
  }

  /// The words themselves (the bindings pass a list of flags).
  explicit args(std::vector<std::string> words) : items_(std::move(words)), used_(items_.size(), false) {}

  /// True if the switch is present (and marks it used).
  bool flag(std::string_view name) {
    remember(name);
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
    for_each_value(name, [&](std::string v) { found = std::move(v); });
    return found;
  }

  /// Every value of a repeatable option, in order.
  std::vector<std::string> options(std::string_view name) {
    std::vector<std::string> all;
    for_each_value(name, [&](std::string v) { all.push_back(std::move(v)); });
    return all;
  }

  /// The remaining arguments; any leftover `--flag` is an error, which lists the options the
  /// command asked for (a command asks for all of them before its positionals).
  std::vector<std::string> positionals() {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (used_[i]) continue;
      if (items_[i].size() > 1 && items_[i][0] == '-') {
        std::string taken;
        for (const auto& name : asked_) {
          if (name != "--help" && name != "-h") taken += " " + name;
        }
        throw usage_error("unknown option " + items_[i] + " (this command takes:" + taken + ")");
      }
      used_[i] = true;
      out.push_back(items_[i]);
    }
    return out;
  }

  /// The options asked for so far, in the order asked.
  [[nodiscard]] const std::vector<std::string>& asked() const { return asked_; }

  /// For commands that take no positional argument: any leftover word is an error.
  void no_positionals() {
    if (const auto rest = positionals(); !rest.empty()) throw usage_error("unexpected argument '" + rest.front() + "'");
  }

 private:
  void remember(std::string_view name) {
    for (const auto& n : asked_) {
      if (n == name) return;
    }
    asked_.emplace_back(name);
  }

  template <class Take>
  void for_each_value(std::string_view name, Take&& take) {
    remember(name);
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (used_[i]) continue;
      const std::string& a = items_[i];
      if (a == name) {
        if (i + 1 >= items_.size()) throw usage_error("option " + std::string(name) + " needs a value");
        used_[i] = used_[i + 1] = true;
        take(items_[i + 1]);
        ++i;
      } else if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        used_[i] = true;
        take(a.substr(name.size() + 1));
      }
    }
  }

  std::vector<std::string> items_;
  std::vector<bool> used_;
  std::vector<std::string> asked_;
};

/// `text` as a number of type T (the whole text), or a usage error naming `what`.
template <class T>
T parse_number(std::string_view text, std::string_view what) {
  T v{};
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size()) {
    throw usage_error("expected a number for " + std::string(what) + ", got '" + std::string(text) + "'");
  }
  return v;
}

/// The items of a comma-separated list; an empty item is a usage error naming `flag`.
inline std::vector<std::string> split_list(const std::string& text, std::string_view flag) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) throw usage_error(std::string(flag) + " has an empty item in '" + text + "'");
    out.push_back(std::move(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace lumos::cli

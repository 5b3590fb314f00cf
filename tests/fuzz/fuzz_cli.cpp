// libFuzzer entry point for the lumos CLI's argument parsing: the bytes, split at '\0', are the
// arguments of a command (the first byte picks which parser runs: predict's, sweep's, replay's
// --scale list, or the bare flag/option/positional queries every command makes). Parsing either
// succeeds or raises lumos::error (a usage error: exit 2). Crashes and hangs are bugs.
#include "../../examples/lumos/cli.hpp"
#include "../../examples/lumos/replay.hpp"
#include "../../examples/lumos/sweep.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned which = data[0] % 4;
  std::vector<std::string> items;
  std::string cur;
  for (std::size_t i = 1; i < size && items.size() < 64; ++i) {
    if (data[i] == 0) {
      items.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  items.push_back(std::move(cur));
  // Options that read files are left out: the parsers would open whatever path the bytes name.
  std::erase_if(items, [](const std::string& s) { return s.starts_with("--profile"); });
  std::vector<char*> argv;
  std::string program = "lumos", command = "cmd";
  argv.push_back(program.data());
  argv.push_back(command.data());
  for (auto& s : items) argv.push_back(s.data());
  try {
    lumos::cli::args a(static_cast<int>(argv.size()), argv.data(), 2);
    switch (which) {
      case 0:
        (void)lumos::cli::parse_predict(a);
        break;
      case 1:
        (void)lumos::cli::parse_sweep(a);
        break;
      case 2:
        (void)lumos::cli::parse_scales(a.options("--scale"));
        break;
      default:
        (void)a.flag("--json");
        if (const auto n = a.option("--step")) (void)lumos::cli::parse_number<int>(*n, "--step");
        if (const auto x = a.option("--window")) (void)lumos::cli::parse_number<double>(*x, "--window");
        (void)a.options("--include");
        break;
    }
    (void)a.positionals();
  } catch (const lumos::error&) {
  }
  return 0;
}

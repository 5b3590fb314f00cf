// lumos — command-line tool: inspect, replay and model distributed LLM training from traces.

#include "cli.hpp"
#include "inspect.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

namespace {

constexpr std::string_view usage =
    "usage: lumos COMMAND [ARGS]\n"
    "commands:\n"
    "  inspect PATH... [--json]   summarise Kineto traces (one file per rank)\n"
    "run 'lumos COMMAND --help' for a command's options\n";

int dispatch(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(usage.data(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view command = argv[1];
  lumos::cli::args a(argc, argv, 2);
  if (command == "inspect") {
    if (a.flag("--help")) {
      std::fputs(lumos::cli::inspect_usage.data(), stdout);
      return 0;
    }
    try {
      return lumos::cli::run_inspect(a);
    } catch (const lumos::cli::usage_error& e) {
      std::fprintf(stderr, "lumos inspect: %s\n%s", e.what(), lumos::cli::inspect_usage.data());
      return 2;
    }
  }
  std::fprintf(stderr, "lumos: unknown command '%s'\n%s", argv[1], usage.data());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const lumos::error& e) {
    std::fprintf(stderr, "lumos: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "lumos: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lumos: %s\n", e.what());
    return 2;
  }
}

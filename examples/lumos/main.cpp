// lumos — command-line tool: inspect, replay and model distributed LLM training from traces.

#include "cli.hpp"
#include "inspect.hpp"
#include "predict.hpp"
#include "schedule.hpp"
#include "synth.hpp"
#include "replay.hpp"
#include "report.hpp"

#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

namespace {

struct command {
  std::string_view name;
  std::string_view summary;
  std::string_view usage;
  int (*run)(lumos::cli::args&);
};

// One line per subcommand.
const std::array commands = {
    command{"inspect", "summarise Kineto traces (one file per rank)", lumos::cli::inspect_usage, lumos::cli::run_inspect},
    command{"replay", "rebuild the execution graph of a job and replay it", lumos::cli::replay_usage, lumos::cli::run_replay},
    command{"schedule", "print a pipeline schedule's op order; simulate it with --costs", lumos::cli::schedule_usage, lumos::cli::run_schedule},
    command{"predict", "model one training iteration from a model description: time, MFU, bubble, memory", lumos::cli::predict_usage, lumos::cli::run_predict},
    command{"report", "replay a job and write a self-contained HTML report (bars, timelines, critical path)", lumos::cli::report_usage, lumos::cli::run_report},
    command{"synth", "write a modelled iteration as Kineto traces (one per distinct rank)", lumos::cli::synth_usage, lumos::cli::run_synth},
};

void print_usage(std::FILE* to) {
  std::fputs("usage: lumos COMMAND [ARGS]\ncommands:\n", to);
  for (const auto& c : commands) std::fprintf(to, "  %-10s %s\n", std::string(c.name).c_str(), std::string(c.summary).c_str());
  std::fputs("run 'lumos COMMAND --help' for a command's options\n", to);
}

int dispatch(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view name = argv[1];
  for (const auto& c : commands) {
    if (c.name != name) continue;
    lumos::cli::args a(argc, argv, 2);
    if (a.flag("--help") || a.flag("-h")) {
      std::fputs(c.usage.data(), stdout);
      return 0;
    }
    try {
      return c.run(a);
    } catch (const lumos::cli::usage_error& e) {
      std::fprintf(stderr, "lumos %s: %s\n%s", argv[1], e.what(), c.usage.data());
      return 2;
    }
  }
  std::fprintf(stderr, "lumos: unknown command '%s'\n", argv[1]);
  print_usage(stderr);
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

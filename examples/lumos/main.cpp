// lumos — command-line tool: inspect, replay and model distributed LLM training from traces.

#include "cli.hpp"
#include "inspect.hpp"
#include "predict.hpp"
#include "schedule.hpp"
#include "sweep.hpp"
#include "synth.hpp"
#include "replay.hpp"
#include "report.hpp"
#include "whatif.hpp"

#include <lumos/core/allocator.hpp>

#include <array>
#include <cstddef>
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
    command{"whatif", "predict a traced job in another configuration (GPU, shape, layers, TP/DP/PP, schedule, batch, scales)", lumos::cli::whatif_usage, lumos::cli::run_whatif},
    command{"sweep", "predict every configuration of a space on all cores (and MPI ranks); rank them", lumos::cli::sweep_usage, lumos::cli::run_sweep},
    command{"calibrate", "fit a cost profile (GEMM, bandwidth, CPU, NCCL) from traces: predict --profile", lumos::cli::calibrate_usage, lumos::cli::run_calibrate},
};

#ifndef LUMOS_VERSION
#error "LUMOS_VERSION (the CMake project version) must be defined by the build"
#endif

void print_usage(std::FILE* to) {
  std::fputs("usage: lumos COMMAND [ARGS]\n       lumos help [COMMAND] | --help | --version\ncommands:\n", to);
  for (const auto& c : commands) std::fprintf(to, "  %-10s %s\n", std::string(c.name).c_str(), std::string(c.summary).c_str());
  std::fputs("run 'lumos help COMMAND' or 'lumos COMMAND --help' for a command's options\n", to);
}

const command* find_command(std::string_view name) {
  for (const auto& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

int unknown_command(std::string_view name) {
  std::fprintf(stderr, "lumos: unknown command '%.*s'\n", static_cast<int>(name.size()), name.data());
  print_usage(stderr);
  return 2;
}

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || (name == "help" && argc == 2)) {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "-V") {
    std::fputs("lumos " LUMOS_VERSION "\n", stdout);
    return 0;
  }
  if (name == "help") {
    if (argc > 3) {
      std::fputs("lumos help: expected at most one COMMAND\n", stderr);
      print_usage(stderr);
      return 2;
    }
    const command* c = find_command(argv[2]);
    if (c == nullptr) return unknown_command(argv[2]);
    std::fputs(c->usage.data(), stdout);
    return 0;
  }
  if (const command* found = find_command(name)) {
    const command& c = *found;
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
  return unknown_command(name);
}

}  // namespace

int main(int argc, char** argv) {
  // One-shot runs write each large array once: 4 KiB pages come cheaper than huge pages on first
  // touch (include/lumos/core/allocator.hpp; LUMOS_HUGE_PAGES=1 overrides).
  lumos::set_huge_pages_default(false);
  // Large arrays reuse each other's pages through large_allocator's block cache, and the graph's
  // columns take the pages of the event stores freed as they fill (core/allocator.hpp,
  // `lent_capacity`). A one-shot run ends soon after its peak, so the cache may hold what the
  // phases free for the next ones: the compile of a 512-rank job then takes half as many fresh
  // pages as with the library's 256 MiB (`bash scripts/bench.sh scale`), at the same peak.
  lumos::set_block_cache_limit(std::size_t{1} << 30);
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

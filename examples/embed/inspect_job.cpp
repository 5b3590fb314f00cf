// Embedding example from the README: load a job and print each rank's profiler steps.
#include <lumos/trace/job.hpp>
#include <lumos/trace/summary.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs(argv + 1, argv + argc);
  try {
    const lumos::trace::job job = lumos::trace::load_job(inputs);
    for (const auto& rank : job.ranks) {
      for (const auto& step : lumos::trace::profiler_steps(rank)) {
        std::printf("rank %d %s %.3f ms\n", rank.rank, step.name.c_str(), step.dur / 1e6);
      }
    }
  } catch (const lumos::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

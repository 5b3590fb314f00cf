#include <lumos/trace/job.hpp>
#include <lumos/trace/summary.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const auto job = lumos::trace::load_job({argv[1]});
  for (const auto& r : job.ranks) {
    std::printf("rank %d: %llu events\n", r.rank, static_cast<unsigned long long>(r.entries));
  }
  return 0;
}

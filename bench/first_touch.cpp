// What writing fresh memory costs on this machine, with and without transparent huge pages:
//   first_touch [MiB]
// Maps MiB (default 1024) of anonymous memory, advises it MADV_HUGEPAGE or MADV_NOHUGEPAGE, and
// times the first write of every page (the kernel zeroes it, and on a virtual machine the host
// may have to back it), then a second write of the whole block (no faults). Each mapping is
// made and unmapped twice: the second round shows memory that this process gave back and got
// again. Run by `bash scripts/bench.sh touch`; the reason the `lumos` CLI turns large_allocator's
// huge pages off (include/lumos/core/allocator.hpp). Linux only.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool touch(std::size_t bytes, bool huge, int round) {
  const auto start = std::chrono::steady_clock::now();
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    std::perror("mmap");
    return false;
  }
  auto* p = static_cast<volatile char*>(map);
  (void)::madvise(map, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  const double first = seconds_since(start);
  const auto again = std::chrono::steady_clock::now();
  std::memset(map, 2, bytes);
  const double second = seconds_since(again);
  ::munmap(map, bytes);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("%-11s round %d  first touch %6.3f s (%6.2f s/GB)  rewrite %6.3f s (%6.2f s/GB)\n",
              huge ? "huge pages" : "4 KiB pages", round, first, first / gb, second, second / gb);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 1024;
  if (mib <= 0) {
    std::fprintf(stderr, "usage: first_touch [MiB > 0]\n");
    return 2;
  }
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
  for (const bool huge : {true, false}) {
    for (int round = 1; round <= 2; ++round) {
      if (!touch(bytes, huge, round)) return 1;
    }
  }
  return 0;
}

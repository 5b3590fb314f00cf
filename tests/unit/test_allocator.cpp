// large_allocator's block cache (core/allocator.hpp): freed large blocks serve the next ones,
// with their pages still resident, whole or moved together under one range.
#include <lumos/core/allocator.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#if defined(LUMOS_BLOCK_CACHE)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Sets the cache's limit for one test and empties the cache after it (the cache is per process).
struct cache_limit {
  explicit cache_limit(std::size_t bytes) { lumos::set_block_cache_limit(bytes); }
  ~cache_limit() { lumos::set_block_cache_limit(0); }
  cache_limit(const cache_limit&) = delete;
  cache_limit& operator=(const cache_limit&) = delete;
};

#if defined(LUMOS_BLOCK_CACHE)
// Bytes of [p, p + bytes) whose pages are resident (p at a page boundary).
std::size_t resident_bytes(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  REQUIRE(::mincore(const_cast<void*>(p), bytes, in.data()) == 0);
  return static_cast<std::size_t>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; })) * page;
}
#endif

}  // namespace

TEST_CASE("block cache: a freed large block serves the next one from its resident pages", "[memory]") {
  const cache_limit on(64 * MiB);
#if !defined(LUMOS_BLOCK_CACHE)
  // Large blocks come from operator new here (a sanitizer build, or not Linux): nothing is held.
  { const lumos::large_vector<std::uint64_t> a(8 * MiB / 8, 7); }
  CHECK(lumos::block_cache_bytes() == 0);
#else
  REQUIRE(lumos::block_cache_bytes() == 0);
  const std::uint64_t* first = nullptr;
  {
    const lumos::large_vector<std::uint64_t> a(8 * MiB / 8, 7);  // every page written
    first = a.data();
  }
  CHECK(lumos::block_cache_bytes() == 8 * MiB);
  // A smaller block is the head of the cached one; the rest stays cached.
  lumos::large_vector<std::uint64_t> b;
  b.reserve(6 * MiB / 8);
  CHECK(b.data() == first);
  CHECK(lumos::block_cache_bytes() == 2 * MiB);
  CHECK(resident_bytes(b.data(), 6 * MiB) == 6 * MiB);
  // Old contents are allowed (containers construct their elements): the vector's own are right.
  b.resize(6 * MiB / 8);
  CHECK(std::all_of(b.begin(), b.end(), [](std::uint64_t v) { return v == 0; }));
#endif
}

TEST_CASE("block cache: a block larger than any cached one takes their pages under one range", "[memory]") {
  const cache_limit on(64 * MiB);
#if !defined(LUMOS_BLOCK_CACHE)
  SUCCEED("large blocks do not come from mmap in this build");
#else
  {
    const lumos::large_vector<std::uint64_t> a(6 * MiB / 8, 1);
    const lumos::large_vector<std::uint64_t> b(5 * MiB / 8, 2);
  }
  REQUIRE(lumos::block_cache_bytes() == 11 * MiB);
  lumos::large_vector<std::uint32_t> c;
  c.reserve(10 * MiB / 4);
  // 6 MiB from one block and 4 of the other's 5: all of it resident before the vector writes.
  CHECK(lumos::block_cache_bytes() == 1 * MiB);
  CHECK(resident_bytes(c.data(), 10 * MiB) == 10 * MiB);
  c.resize(10 * MiB / 4);
  std::iota(c.begin(), c.end(), 0U);
  bool ok = true;
  for (std::size_t i = 0; i < c.size(); ++i) ok = ok && c[i] == i;
  CHECK(ok);
  // Larger still than what is cached: the part no cached page covers is fresh memory.
  {
    lumos::large_vector<std::uint8_t> d(24 * MiB, 9);
    CHECK(lumos::block_cache_bytes() == 0);
    CHECK(std::all_of(d.begin(), d.end(), [](std::uint8_t v) { return v == 9; }));
  }
#endif
}

TEST_CASE("block cache: the limit bounds what is held, and lowering it gives blocks back", "[memory]") {
  const cache_limit on(12 * MiB);
  {
    const lumos::large_vector<std::uint8_t> a(8 * MiB, 1);
    const lumos::large_vector<std::uint8_t> b(16 * MiB, 1);  // freed first, and over the limit: unmapped
  }
  { const lumos::large_vector<std::uint8_t> c(3 * MiB, 1); }  // small: the heap's, never cached
#if defined(LUMOS_BLOCK_CACHE)
  CHECK(lumos::block_cache_bytes() == 8 * MiB);
#endif
  lumos::set_block_cache_limit(4 * MiB);
  CHECK(lumos::block_cache_bytes() <= 4 * MiB);
  lumos::set_block_cache_limit(0);
  CHECK(lumos::block_cache_bytes() == 0);
  { const lumos::large_vector<std::uint8_t> d(8 * MiB, 1); }  // limit 0: given back at once
  CHECK(lumos::block_cache_bytes() == 0);
}

TEST_CASE("block cache: threads allocating and freeing large blocks keep their own contents", "[memory][threads]") {
  const cache_limit on(48 * MiB);
  constexpr unsigned threads = 4;
  std::vector<int> bad(threads, 0);
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([t, &bad] {
        for (std::uint64_t round = 0; round < 24; ++round) {
          const std::size_t n = (4 * MiB + ((round * 7 + t * 3) % 9) * MiB) / 8;  // 4 to 12 MiB
          lumos::large_vector<std::uint64_t> v(n);
          const std::uint64_t mark = (std::uint64_t{t} << 32) | round;
          std::fill(v.begin(), v.end(), mark);
          bad[t] += std::any_of(v.begin(), v.end(), [&](std::uint64_t x) { return x != mark; }) ? 1 : 0;
        }
      });
    }
  }
  CHECK(std::all_of(bad.begin(), bad.end(), [](int b) { return b == 0; }));
  CHECK(lumos::block_cache_bytes() <= 48 * MiB);
}

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

// The smallest block the cache takes.
constexpr std::size_t unit = lumos::large_allocator<char>::mapped_threshold;

// Empties the cache (per process, and on by default) and sets its limit for one test, then
// empties it again and restores the default.
struct cache_limit {
  explicit cache_limit(std::size_t bytes) {
    lumos::set_block_cache_limit(0);
    lumos::set_block_cache_limit(bytes);
  }
  ~cache_limit() {
    lumos::set_block_cache_limit(0);
    lumos::set_block_cache_limit(lumos::default_block_cache_limit);
  }
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
  const cache_limit on(8 * unit);
#if !defined(LUMOS_BLOCK_CACHE)
  // Large blocks come from operator new here (a sanitizer build, or not Linux): nothing is held.
  { const lumos::large_vector<std::uint64_t> a(2 * unit / 8, 7); }
  CHECK(lumos::block_cache_bytes() == 0);
#else
  REQUIRE(lumos::block_cache_bytes() == 0);
  const std::uint64_t* first = nullptr;
  {
    const lumos::large_vector<std::uint64_t> a(2 * unit / 8, 7);  // every page written
    first = a.data();
  }
  CHECK(lumos::block_cache_bytes() == 2 * unit);
  // A smaller block is the head of the cached one; the rest stays cached.
  lumos::large_vector<std::uint64_t> b;
  b.reserve(3 * unit / 2 / 8);
  CHECK(b.data() == first);
  CHECK(lumos::block_cache_bytes() == unit / 2);
  CHECK(resident_bytes(b.data(), 3 * unit / 2) == 3 * unit / 2);
  // Old contents are allowed (containers construct their elements): the vector's own are right.
  b.resize(3 * unit / 2 / 8);
  CHECK(std::all_of(b.begin(), b.end(), [](std::uint64_t v) { return v == 0; }));
  // Below the threshold, blocks are the heap's: neither taken from the cache nor given to it.
  { const lumos::large_vector<std::uint8_t> small(unit / 2, 1); }
  CHECK(lumos::block_cache_bytes() == unit / 2);
#endif
}

TEST_CASE("block cache: a block larger than any cached one takes their pages under one range", "[memory]") {
  const cache_limit on(8 * unit);
#if !defined(LUMOS_BLOCK_CACHE)
  SUCCEED("large blocks do not come from mmap in this build");
#else
  {
    const lumos::large_vector<std::uint64_t> a(3 * unit / 2 / 8, 1);
    const lumos::large_vector<std::uint64_t> b(5 * unit / 4 / 8, 2);
  }
  REQUIRE(lumos::block_cache_bytes() == 11 * unit / 4);
  lumos::large_vector<std::uint32_t> c;
  c.reserve(10 * unit / 4 / 4);
  // 1.5 units from one block and 1 of the other's 1.25: all of it resident before the vector writes.
  CHECK(lumos::block_cache_bytes() == unit / 4);
  CHECK(resident_bytes(c.data(), 10 * unit / 4) == 10 * unit / 4);
  c.resize(10 * unit / 4 / 4);
  std::iota(c.begin(), c.end(), 0U);
  bool ok = true;
  for (std::size_t i = 0; i < c.size(); ++i) ok = ok && c[i] == i;
  CHECK(ok);
  // Larger still than what is cached: the part no cached page covers is fresh memory.
  {
    lumos::large_vector<std::uint8_t> d(3 * unit, 9);
    CHECK(lumos::block_cache_bytes() == 0);
    CHECK(std::all_of(d.begin(), d.end(), [](std::uint8_t v) { return v == 9; }));
  }
#endif
}

TEST_CASE("block cache: the limit bounds what is held, and lowering it gives blocks back", "[memory]") {
  const cache_limit on(3 * unit);
  {
    const lumos::large_vector<std::uint8_t> a(2 * unit, 1);
    const lumos::large_vector<std::uint8_t> b(4 * unit, 1);  // freed first, and over the limit: unmapped
  }
#if defined(LUMOS_BLOCK_CACHE)
  CHECK(lumos::block_cache_bytes() == 2 * unit);
#endif
  lumos::set_block_cache_limit(unit);
  CHECK(lumos::block_cache_bytes() <= unit);
  lumos::set_block_cache_limit(0);
  CHECK(lumos::block_cache_bytes() == 0);
  { const lumos::large_vector<std::uint8_t> d(2 * unit, 1); }  // limit 0: given back at once
  CHECK(lumos::block_cache_bytes() == 0);
}

TEST_CASE("block cache: threads allocating and freeing large blocks keep their own contents", "[memory][threads]") {
  const cache_limit on(4 * unit);
  constexpr unsigned threads = 4;
  std::vector<int> bad(threads, 0);
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([t, &bad] {
        for (std::uint64_t round = 0; round < 6; ++round) {
          const std::size_t n = (unit + ((round * 7 + t * 3) % 5) * unit / 4) / 8;  // 1 to 2 units
          lumos::large_vector<std::uint64_t> v(n);
          const std::uint64_t mark = (std::uint64_t{t} << 32) | round;
          std::fill(v.begin(), v.end(), mark);
          bad[t] += std::any_of(v.begin(), v.end(), [&](std::uint64_t x) { return x != mark; }) ? 1 : 0;
        }
      });
    }
  }
  CHECK(std::all_of(bad.begin(), bad.end(), [](int b) { return b == 0; }));
  CHECK(lumos::block_cache_bytes() <= 4 * unit);
}

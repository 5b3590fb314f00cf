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

// Small pages for one test (lent pages are small ones; huge pages would make every first touch
// resident 2 MiB at a time), then the library default again.
struct small_pages {
  small_pages() { lumos::set_huge_pages_default(false); }
  ~small_pages() { lumos::set_huge_pages_default(true); }
  small_pages(const small_pages&) = delete;
  small_pages& operator=(const small_pages&) = delete;
};

// False, with a warning, when LUMOS_HUGE_PAGES=1 in the environment keeps huge pages on whatever
// the test sets: nothing is lent on them.
bool small_pages_in_use() {
  if (!lumos::huge_pages_enabled()) return true;
  WARN("LUMOS_HUGE_PAGES=1 in the environment: nothing is lent on huge pages");
  return false;
}

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

TEST_CASE("recyclable blocks go to the block cache, and lent pages take a vector's next elements", "[memory]") {
  const cache_limit on(8 * unit);
  const small_pages off;
  if (!small_pages_in_use()) return;
#if !defined(LUMOS_BLOCK_CACHE)
  { const lumos::recyclable_vector<std::uint64_t> a(unit / 8, 7); }
  CHECK(lumos::block_cache_bytes() == 0);
  lumos::large_vector<std::uint64_t> v;
  v.reserve(unit / 8);
  lumos::lent_capacity<std::uint64_t> lent;
  CHECK(lent.lend(v, unit) == 0);
#else
  constexpr std::size_t small = lumos::recyclable_allocator<char>::mapped_threshold;
  REQUIRE(lumos::block_cache_bytes() == 0);
  // Below its threshold a recyclable block is the heap's; from it on, whole pages of the cache.
  { const lumos::recyclable_vector<std::uint8_t> tiny(small / 2, 1); }
  CHECK(lumos::block_cache_bytes() == 0);
  // A column being filled: a fresh cache block, its first elements written.
  lumos::large_vector<std::uint64_t> column;
  column.reserve(2 * unit / 8);
  for (std::uint64_t i = 0; i < 1000; ++i) column.push_back(i);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t used = (1000 * 8 + page - 1) / page * page;  // pages the elements are on
  CHECK(resident_bytes(column.data(), 2 * unit) == used);
  {
    // A store freed meanwhile, every page of it written: the cache keeps it.
    const lumos::recyclable_vector<std::uint64_t> events(3 * small / 8 + 5, 9);
  }
  const std::size_t freed = lumos::block_cache_bytes();
  CHECK(freed == (3 * small + 40 + page - 1) / page * page);
  lumos::lent_capacity<std::uint64_t> lent;
  CHECK(lent.ahead(column) == 0);
  // Asking for more than is held lends what is held, past the elements' last page.
  CHECK(lent.lend(column, 4 * small) == freed);
  CHECK(lumos::block_cache_bytes() == 0);
  CHECK(lent.ahead(column) == used + freed - 1000 * 8);
  CHECK(resident_bytes(column.data(), 2 * unit) == used + freed);
  CHECK(lent.lend(column, small) == 0);  // nothing left to lend
  // The column writes its next elements over the lent pages (old contents are not read).
  const std::size_t lent_elements = lent.ahead(column) / 8;
  for (std::uint64_t i = 1000; i < 1000 + lent_elements; ++i) column.push_back(i);
  bool ok = true;
  for (std::size_t i = 0; i < column.size(); ++i) ok = ok && column[i] == i;
  CHECK(ok);
  CHECK(resident_bytes(column.data(), 2 * unit) == used + freed);
  CHECK(lent.ahead(column) == 0);
  // A buffer below the large blocks' threshold is not the cache's: it is lent nothing.
  { const lumos::recyclable_vector<std::uint64_t> more(small / 8, 3); }
  lumos::large_vector<std::uint64_t> heap_block;
  heap_block.reserve(unit / 16);
  lumos::lent_capacity<std::uint64_t> none;
  CHECK(none.lend(heap_block, small) == 0);
  CHECK(lumos::block_cache_bytes() == small);
#endif
}

TEST_CASE("block cache: a block made of several mappings (lent pages) is moved whole into the next", "[memory]") {
  const cache_limit on(8 * unit);
  const small_pages off;
  if (!small_pages_in_use()) return;
#if !defined(LUMOS_BLOCK_CACHE)
  SUCCEED("large blocks do not come from mmap in this build");
#else
  constexpr std::size_t small = lumos::recyclable_allocator<char>::mapped_threshold;
  {
    // The column's block holds lent pages in three places: four mappings, and fresh pages around.
    lumos::large_vector<std::uint32_t> column;
    column.reserve(unit / 4);
    lumos::lent_capacity<std::uint32_t> lent;
    for (int part = 0; part < 3; ++part) {
      { const lumos::recyclable_vector<std::uint8_t> events(small, 5); }
      REQUIRE(lent.lend(column, small) == small);
      column.resize(column.size() + small / 4 + 1000, static_cast<std::uint32_t>(part));
    }
  }
  REQUIRE(lumos::block_cache_bytes() == unit);
  // Larger than it: assembled from its pages and fresh ones (before Linux 6.17 one mremap moves
  // one mapping, so the block moves in parts). Every page of it moved: none were lost.
  lumos::large_vector<std::uint64_t> next;
  next.reserve(3 * unit / 2 / 8);
  CHECK(lumos::block_cache_bytes() == 0);
  CHECK(resident_bytes(next.data(), 3 * unit / 2) >= 3 * small);
  next.resize(3 * unit / 2 / 8);
  std::iota(next.begin(), next.end(), std::uint64_t{0});
  bool ok = true;
  for (std::size_t i = 0; i < next.size(); ++i) ok = ok && next[i] == i;
  CHECK(ok);
#endif
}

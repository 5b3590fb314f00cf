#pragma once
// large_allocator — std::allocator for the big flat arrays (graph columns, compiled graphs):
// large blocks are 2 MiB aligned and, unless turned off, marked for transparent huge pages; on
// Linux the largest are mapped directly, and freed ones can be kept for the next
// (`set_block_cache_limit`, 256 MiB unless a program says otherwise). recyclable_allocator (a
// trace's event stores) gives its blocks of 64 KiB and more to the same cache, and
// `lent_capacity` moves cached pages under the spare capacity of a vector being filled.
//
// Which pages are faster depends on how the memory is used. A huge page a process touches for the
// first time costs several times its 512 small pages on the virtual machines this project runs on
// (the host backs each 2 MiB on demand), and a one-shot run writes each array once: `lumos replay`
// of a 512-rank job took a third longer with them. A program that allocates again and again (a
// sweep, an autotuner, the benchmarks) gets its huge pages back cheaply and walks them with fewer
// TLB misses: `bench_replay`'s compile of a generated graph ran 1.4-1.8x faster with them. So the
// library default is on, the `lumos` CLI turns it off, and LUMOS_HUGE_PAGES=1 or 0 in the
// environment overrides both (docs/replay.md, `bash scripts/bench.sh touch` and `scale`).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lumos {

namespace detail {
// LUMOS_HUGE_PAGES: 1 (on), 0 (off), else -1 (unset: the process default decides). Read once.
[[nodiscard]] inline int huge_pages_from_environment() noexcept {
  static const int value = [] {
    const char* v = std::getenv("LUMOS_HUGE_PAGES");  // NOLINT(concurrency-mt-unsafe): read once
    if (v == nullptr || v[0] == '\0' || v[1] != '\0') return -1;
    return v[0] == '1' ? 1 : v[0] == '0' ? 0 : -1;
  }();
  return value;
}
[[nodiscard]] inline std::atomic<bool>& huge_pages_default() noexcept {
  static std::atomic<bool> on{true};
  return on;
}
}  // namespace detail

/// Gives the heap's free pages back to the system. glibc keeps the pages of freed small blocks
/// resident until later allocations reuse them, so a phase that frees many (a graph build's
/// per-rank indexes, the planning's per-rank lists) leaves them counted in the process's memory
/// while the next phase allocates elsewhere (large blocks come from mmap). A no-op without glibc.
inline void trim_heap() noexcept {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

/// Sets whether large blocks go on transparent huge pages when LUMOS_HUGE_PAGES does not say (on
/// by default; see the top of this file). Blocks allocated before keep theirs.
inline void set_huge_pages_default(bool on) noexcept { detail::huge_pages_default().store(on, std::memory_order_relaxed); }

/// Whether large blocks are advised onto transparent huge pages: LUMOS_HUGE_PAGES=1 or 0 in the
/// environment, else the process default (`set_huge_pages_default`).
[[nodiscard]] inline bool huge_pages_enabled() noexcept {
  const int env = detail::huge_pages_from_environment();
  return env >= 0 ? env == 1 : detail::huge_pages_default().load(std::memory_order_relaxed);
}

// Large blocks straight from mmap, so that a freed one can be kept mapped and handed out again
// (`set_block_cache_limit`). Not under AddressSanitizer, which checks only the blocks it
// allocates itself, nor where LUMOS_NO_BLOCK_CACHE is defined (a program that counts its heap
// through operator new; define it in all of a program's translation units or in none).
#if defined(__linux__) && !defined(LUMOS_NO_BLOCK_CACHE) && !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(memory_sanitizer)
#define LUMOS_BLOCK_CACHE 1
#endif
#else
#define LUMOS_BLOCK_CACHE 1
#endif
#endif

/// The block cache's limit until `set_block_cache_limit` says otherwise.
inline constexpr std::size_t default_block_cache_limit = std::size_t{256} << 20;

namespace detail {

#if defined(LUMOS_BLOCK_CACHE)
// Freed large blocks, kept mapped up to a limit, for the next large blocks: their pages are
// resident already, so reusing them costs no page fault and no zeroing. On the virtual machines
// this project runs on a first touch costs about 1.7 us a page (the kernel's fault path, zeroing
// and the memory cgroup's accounting); a 512-rank replay touched 4.4 GB for a 1.4 GB peak, a
// fifth of its CPU time in the kernel. A block is carved from the head of a cached block that
// holds it, or assembled from several: their pages are moved under one fresh range (mremap moves
// page-table entries, it copies nothing), and what they do not cover is fresh memory; `lend`
// moves cached pages under the unwritten capacity of a live block instead. Every block is a
// whole number of pages, mapped exactly; reused pages hold old contents, which allocators need
// not clear (containers construct their elements).
class block_cache {
 public:
  static constexpr std::size_t max_blocks = 256;
  static constexpr std::size_t max_moves = 16384;  // moves made by `lend`: a mapping or two each

  // Never destroyed: a static object elsewhere may free its blocks after this one would be.
  static block_cache& instance() noexcept {
    static block_cache* const cache = new block_cache;
    return *cache;
  }
  // `bytes` up to a whole number of pages; a size no mapping can have (within a page of the
  // largest size_t) stays unrounded, for mmap to refuse.
  [[nodiscard]] std::size_t round(std::size_t bytes) const noexcept {
    return bytes > ~std::size_t{0} - page_ ? bytes : (bytes + page_ - 1) / page_ * page_;
  }

  // A block of `bytes` (from `round`), `align`ed when fresh.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t align) {
    if (bytes > ~std::size_t{0} / 2) throw std::bad_alloc();
    {
      std::lock_guard lock(mutex_);
      if (!blocks_.empty()) return take(bytes, align);
    }
    return fresh(bytes, align);
  }

  void deallocate(void* p, std::size_t bytes) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (bytes <= limit_ && held_ <= limit_ - bytes && blocks_.size() < max_blocks) {
        blocks_.push_back({static_cast<char*>(p), bytes});
        held_ += bytes;
        return;
      }
    }
    ::munmap(p, bytes);
  }

  void set_limit(std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    while (held_ > limit_) drop_last();
  }
  [[nodiscard]] std::size_t held() noexcept {
    std::lock_guard lock(mutex_);
    return held_;
  }
  void release() noexcept {
    std::lock_guard lock(mutex_);
    while (!blocks_.empty()) drop_last();
  }

  // Moves cached pages under [at, end): page-aligned, inside a block this cache handed out, and
  // pages there never written (a vector's spare capacity), which the moved ones replace. Returns
  // where the lent pages end (`at` when the cache is empty). Each move splits the block's
  // mapping, and a process may hold only so many (vm.max_map_count, 65530 by default): after
  // `max_moves` the cache lends no more.
  char* lend(char* at, char* end) noexcept {
    std::lock_guard lock(mutex_);
    if (at >= end || blocks_.empty() || moves_ >= max_moves) return at;
    // Largest first: the fewest moves, so the fewest mappings.
    std::sort(blocks_.begin(), blocks_.end(), [](const block& a, const block& b) { return a.bytes < b.bytes; });
    const auto want = static_cast<std::size_t>(end - at);
    bool failed = false;
    const std::size_t filled = move_cached(at, want, failed, moves_);
    // What a failed move left unmapped, inside a live block, must be memory again.
    if (failed && !map_fixed(at + filled, want - filled)) {
      std::fputs("lumos: block_cache: cannot map memory back under a vector's capacity\n", stderr);
      std::abort();
    }
    return at + filled;
  }

 private:
  struct block {
    char* p;
    std::size_t bytes;
  };

  block_cache() { blocks_.reserve(max_blocks); }  // deallocate never allocates

  // A fresh mapping of `bytes` at a multiple of `align` (over-mapped, then trimmed).
  [[nodiscard]] void* fresh(std::size_t bytes, std::size_t align) const {
    if (align <= page_) {
      void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      return m;
    }
    const std::size_t span = bytes + align;
    void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    char* const base = static_cast<char*>(m);
    char* const p = base + (align - reinterpret_cast<std::uintptr_t>(base) % align) % align;
    if (p > base) ::munmap(base, static_cast<std::size_t>(p - base));
    if (base + span > p + bytes) ::munmap(p + bytes, static_cast<std::size_t>(base + span - (p + bytes)));
    return p;
  }

  void drop_last() noexcept {
    ::munmap(blocks_.back().p, blocks_.back().bytes);
    held_ -= blocks_.back().bytes;
    blocks_.pop_back();
  }

  // Called with the lock held and at least one block cached.
  [[nodiscard]] void* take(std::size_t bytes, std::size_t align) {
    // The smallest block that holds `bytes`: its head, the rest stays cached.
    std::size_t best = blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].bytes >= bytes && (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes)) best = i;
    }
    if (best < blocks_.size()) {
      block& b = blocks_[best];
      char* const p = b.p;
      held_ -= bytes;
      if (b.bytes == bytes) {
        b = blocks_.back();
        blocks_.pop_back();
      } else {
        b.p += bytes;
        b.bytes -= bytes;
      }
      return p;
    }
    // None does: move the cached blocks, largest first, under a fresh range.
    char* const p = static_cast<char*>(fresh(bytes, align));
    std::sort(blocks_.begin(), blocks_.end(), [](const block& a, const block& b) { return a.bytes < b.bytes; });
    bool failed = false;
    std::size_t pieces = 0;
    const std::size_t filled = move_cached(p, bytes, failed, pieces);
    if (failed && !map_fixed(p + filled, bytes - filled)) {
      ::munmap(p, bytes);
      throw std::bad_alloc();
    }
    return p;
  }

  // Called with the lock held: moves cached pages, from the back of `blocks_`, under
  // [to, to + bytes) (page-aligned, and a range this process maps or one it may map over) until
  // that is covered or the cache is empty, counting the moves in `pieces`. Returns how much of it
  // is covered from `to` on; after a move that `failed`, the rest may have lost its mapping, which the caller maps fresh.
  std::size_t move_cached(char* to, std::size_t bytes, bool& failed, std::size_t& pieces) noexcept {
    std::size_t filled = 0;
    failed = false;
    while (!blocks_.empty() && filled < bytes) {
      block& b = blocks_.back();
      const std::size_t n = std::min(b.bytes, bytes - filled);
      const std::size_t moved = move_pages(b.p, n, to + filled);
      ++pieces;
      failed = moved < n;
      filled += moved;
      held_ -= moved;
      if (moved == b.bytes) {
        blocks_.pop_back();
      } else {
        b.p += moved;
        b.bytes -= moved;
      }
      if (moved < n) break;
    }
    return filled;
  }

  // Moves the pages of [from, from + bytes) under [to, to + bytes) (page-aligned; mremap moves
  // page-table entries, it copies nothing). One mremap moves a range of one mapping; a block
  // made of several (assembled from cached blocks, or lent pages) is moved in halves, and so on
  // down to pages. Returns how much was moved from the start: the source of the rest is still
  // mapped where it was, its target may be unmapped (a failed mremap unmaps its target first).
  std::size_t move_pages(char* from, std::size_t bytes, char* to) const noexcept {
    if (::mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED) return bytes;
    if (bytes <= page_) return 0;
    const std::size_t half = bytes / 2 / page_ * page_;
    const std::size_t first = move_pages(from, half, to);
    return first < half ? first : half + move_pages(from + half, bytes - half, to + half);
  }

  // Fresh anonymous pages over [p, p + bytes), whatever is mapped there now.
  [[nodiscard]] static bool map_fixed(char* p, std::size_t bytes) noexcept {
    return ::mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
  }

  const std::size_t page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::mutex mutex_;
  std::vector<block> blocks_;
  std::size_t held_ = 0;
  std::size_t moves_ = 0;  // made by `lend` so far
  std::size_t limit_ = default_block_cache_limit;
};
#endif

}  // namespace detail

/// Keeps up to `bytes` of freed large blocks (`large_allocator`'s of its `mapped_threshold` and
/// more) mapped, for the next ones to reuse without touching fresh pages
/// (`default_block_cache_limit` until this is called); 0 gives every freed block back at once,
/// and lowering the limit gives back what is over it. Phases that free big arrays and then make
/// others reuse their pages, as `lumos replay` does (the graph's observed times, then the
/// compiled graph, then the replay's times), and so do programs that build graph after graph (a
/// sweep, the benchmarks). Held blocks count in the process's resident memory: its peak does not
/// grow (a block is reused before fresh pages are taken) but it does not fall when blocks are
/// freed. A no-op where large blocks do not come from mmap (not Linux, or under a sanitizer).
inline void set_block_cache_limit([[maybe_unused]] std::size_t bytes) noexcept {
#if defined(LUMOS_BLOCK_CACHE)
  detail::block_cache::instance().set_limit(bytes);
#endif
}

/// Gives back every freed block the cache holds now; the limit stays. For a program that knows
/// nothing coming will take them: only `large_allocator`'s blocks of its `mapped_threshold` and
/// more (and lent capacity) and `recyclable_allocator`'s stores reuse them. A no-op where large
/// blocks do not come from mmap.
inline void release_block_cache() noexcept {
#if defined(LUMOS_BLOCK_CACHE)
  detail::block_cache::instance().release();
#endif
}

/// Bytes of freed large blocks held for reuse now (`set_block_cache_limit`).
[[nodiscard]] inline std::size_t block_cache_bytes() noexcept {
#if defined(LUMOS_BLOCK_CACHE)
  return detail::block_cache::instance().held();
#else
  return 0;
#endif
}

/// Stateless allocator: blocks of at least `huge_threshold` bytes are 2 MiB aligned (with
/// `MADV_HUGEPAGE` when `huge_pages_enabled()`), smaller ones from the plain operator new. On
/// Linux blocks of `mapped_threshold` and more come from mmap (2 MiB aligned when fresh; freed
/// ones kept for reuse up to `set_block_cache_limit`), the others from the aligned global
/// operator new. Interchangeable instances (always equal), so containers move freely.
template <class T>
struct large_allocator {
  using value_type = T;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;
  static constexpr std::size_t huge_threshold = std::size_t{4} << 20;
  /// glibc's largest mmap threshold: below it, its heap keeps freed blocks for the next ones by
  /// itself, and seeing them freed is what raises its threshold and the point at which it trims
  /// the heap (taken away from it, the blocks of a few megabytes of a graph built again and again
  /// came back as fresh pages each time: `bench_replay`'s BM_build of a 200 000-event trace ran
  /// 18 % slower); above it, glibc maps and unmaps every block, and the cache reuses them.
  static constexpr std::size_t mapped_threshold = std::size_t{32} << 20;

  large_allocator() noexcept = default;
  template <class U>
  large_allocator(const large_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_threshold) return static_cast<T*>(::operator new(bytes));
#if defined(LUMOS_BLOCK_CACHE)
    void* p = nullptr;
    if (bytes >= mapped_threshold) {
      detail::block_cache& cache = detail::block_cache::instance();
      p = cache.allocate(cache.round(bytes), huge_page);
    } else {
      p = ::operator new(bytes, std::align_val_t{huge_page});
    }
#else
    void* p = ::operator new(bytes, std::align_val_t{huge_page});
#endif
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: failure (THP disabled) leaves ordinary pages, which is still correct. Pages a
    // block took from the cache stay as they are.
    if (huge_pages_enabled()) (void)::madvise(p, bytes / huge_page * huge_page, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_threshold) {
      ::operator delete(p);
#if defined(LUMOS_BLOCK_CACHE)
    } else if (bytes >= mapped_threshold) {
      detail::block_cache& cache = detail::block_cache::instance();
      cache.deallocate(p, cache.round(bytes));
#endif
    } else {
      ::operator delete(p, std::align_val_t{huge_page});
    }
  }

  template <class U>
  bool operator==(const large_allocator<U>&) const noexcept {
    return true;
  }
};

/// A vector for big flat arrays.
template <class T>
using large_vector = std::vector<T, large_allocator<T>>;

/// Allocator for stores that are freed while other big arrays fill (a trace's events, freed rank
/// by rank as the graph's columns grow): on Linux, blocks of `mapped_threshold` (64 KiB) and more
/// are whole pages of the block cache, so that, freed, their pages serve the next large blocks or
/// are lent to the spare capacity of growing ones (`lent_capacity`) instead of going back to the
/// system while fresh pages are taken elsewhere. Smaller blocks, and every block without the
/// cache (a sanitizer build, not Linux), come from the global operator new.
template <class T>
struct recyclable_allocator {
  using value_type = T;
  static constexpr std::size_t mapped_threshold = std::size_t{64} << 10;

  recyclable_allocator() noexcept = default;
  template <class U>
  recyclable_allocator(const recyclable_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
#if defined(LUMOS_BLOCK_CACHE)
    if (bytes >= mapped_threshold) {
      detail::block_cache& cache = detail::block_cache::instance();
      return static_cast<T*>(cache.allocate(cache.round(bytes), 1));
    }
#endif
    return static_cast<T*>(::operator new(bytes));
  }

  void deallocate(T* p, std::size_t n) noexcept {
#if defined(LUMOS_BLOCK_CACHE)
    const std::size_t bytes = n * sizeof(T);
    if (bytes >= mapped_threshold) {
      detail::block_cache& cache = detail::block_cache::instance();
      cache.deallocate(p, cache.round(bytes));
      return;
    }
#else
    (void)n;
#endif
    ::operator delete(p);
  }

  template <class U>
  bool operator==(const recyclable_allocator<U>&) const noexcept {
    return true;
  }
};

/// A vector for big stores freed while others fill (see `recyclable_allocator`).
template <class T>
using recyclable_vector = std::vector<T, recyclable_allocator<T>>;

/// How far past its elements a `large_vector`'s spare capacity has been lent pages of freed
/// blocks (the block cache's, `set_block_cache_limit`): a vector that a builder fills while it
/// frees other stores (the graph's columns, as a trace's events go rank by rank) then writes its
/// next elements to pages that are resident already, instead of the kernel zeroing fresh ones
/// (which also costs a fault each, and a host fault on a virtual machine that gave them back).
/// Appending never writes a lent page twice, so a page lent once serves once; the capacity must
/// not be reallocated meanwhile (a new buffer starts with nothing lent). Only a buffer that the
/// cache handed out, of `large_allocator::mapped_threshold` bytes and more, can be lent pages;
/// for others, with huge pages on (`huge_pages_enabled`), and in builds without the cache,
/// `lend` lends nothing.
template <class T>
class lent_capacity {
 public:
  /// Bytes of lent pages past the elements of `v`.
  [[nodiscard]] std::size_t ahead(const large_vector<T>& v) const noexcept {
    const std::size_t used = v.size() * sizeof(T);
    return v.data() == buffer_ && end_ > used ? end_ - used : 0;
  }

  /// Lends `v` up to `bytes` more (whole pages past its last element's page, within its
  /// capacity), as far as the cache holds; returns how much was lent.
  std::size_t lend([[maybe_unused]] large_vector<T>& v, [[maybe_unused]] std::size_t bytes) noexcept {
#if defined(LUMOS_BLOCK_CACHE)
    // On huge pages a fresh page costs little per byte, and small pages moved in would split them.
    const std::size_t capacity = v.capacity() * sizeof(T);
    if (capacity < large_allocator<T>::mapped_threshold || huge_pages_enabled()) return 0;
    detail::block_cache& cache = detail::block_cache::instance();
    if (v.data() != buffer_) buffer_ = v.data(), end_ = 0;
    // From the page after the one the last element is on (that one is written), to the end of
    // the block (its capacity up to a page: the cache maps whole pages).
    const std::size_t from = std::max(end_, cache.round(v.size() * sizeof(T)));
    const std::size_t to = std::min(cache.round(capacity), from + cache.round(bytes));
    if (from >= to) return 0;
    char* const base = reinterpret_cast<char*>(v.data());
    const auto lent = static_cast<std::size_t>(cache.lend(base + from, base + to) - (base + from));
    if (lent > 0) end_ = from + lent;
    return lent;
#else
    return 0;
#endif
  }

 private:
  const T* buffer_ = nullptr;
  std::size_t end_ = 0;  // bytes from buffer_
};

/// large_allocator whose `resize` leaves trivially constructible elements uninitialised (it
/// default-initialises instead of value-initialising): for the outputs of the compile and the
/// replay, every element of which is written right after. Zeroing them first was one more pass
/// over hundreds of MB on one core (a 512-rank job: 0.5 s of its compile).
template <class T>
struct uninitialized_allocator : large_allocator<T> {
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() noexcept = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A vector for big flat arrays that are written whole after `resize` (see above).
template <class T>
using output_vector = std::vector<T, uninitialized_allocator<T>>;

}  // namespace lumos

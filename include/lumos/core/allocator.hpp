#pragma once
// large_allocator — std::allocator for the big flat arrays (event stores, graph columns,
// compiled graphs): large blocks are 2 MiB aligned and, unless turned off, marked for transparent
// huge pages.
//
// Which pages are faster depends on how the memory is used. A huge page a process touches for the
// first time costs several times its 512 small pages on the virtual machines this project runs on
// (the host backs each 2 MiB on demand), and a one-shot run writes each array once: `lumos replay`
// of a 512-rank job took a third longer with them. A program that allocates again and again (a
// sweep, an autotuner, the benchmarks) gets its huge pages back cheaply and walks them with fewer
// TLB misses: `bench_replay`'s compile of a generated graph ran 1.4-1.8x faster with them. So the
// library default is on, the `lumos` CLI turns it off, and LUMOS_HUGE_PAGES=1 or 0 in the
// environment overrides both (docs/replay.md, `bash scripts/bench.sh touch` and `scale`).

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
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

/// Stateless allocator: blocks of at least `huge_threshold` bytes come from the aligned
/// global operator new (with `MADV_HUGEPAGE` when `huge_pages_enabled()`, on Linux), smaller
/// ones from the plain operator new. Interchangeable instances (always equal), so containers
/// move freely.
template <class T>
struct large_allocator {
  using value_type = T;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;
  static constexpr std::size_t huge_threshold = std::size_t{4} << 20;

  large_allocator() noexcept = default;
  template <class U>
  large_allocator(const large_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_threshold) return static_cast<T*>(::operator new(bytes));
    void* p = ::operator new(bytes, std::align_val_t{huge_page});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: failure (THP disabled) leaves ordinary pages, which is still correct.
    if (huge_pages_enabled()) (void)::madvise(p, bytes / huge_page * huge_page, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_threshold) {
      ::operator delete(p);
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

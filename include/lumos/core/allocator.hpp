#pragma once
// large_allocator — std::allocator for the big flat arrays (event stores, graph columns,
// compiled graphs): large blocks are 2 MiB aligned and, when LUMOS_HUGE_PAGES=1 is set in the
// environment, marked for transparent huge pages.
//
// Huge pages are opt-in because first touch decides: each array here is written once, right
// after it is allocated. On the virtual machines this project is built and measured on, a
// huge page touched for the first time costs several times what 4 KiB pages do (the host backs
// each 2 MiB page on demand), which made `lumos replay` of a 512-rank job a third slower
// (docs/replay.md, `bash scripts/bench.sh touch` and `scale`). Where huge pages come cheap,
// the setting gives ~500x fewer page faults and fewer TLB misses in the walks.

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace lumos {

/// Whether large blocks are advised onto transparent huge pages: LUMOS_HUGE_PAGES=1 in the
/// environment (read once per process; see the top of this file for why it is off by default).
[[nodiscard]] inline bool huge_pages_enabled() noexcept {
  static const bool enabled = [] {
    const char* v = std::getenv("LUMOS_HUGE_PAGES");  // NOLINT(concurrency-mt-unsafe): read once
    return v != nullptr && v[0] == '1' && v[1] == '\0';
  }();
  return enabled;
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

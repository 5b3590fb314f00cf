#pragma once
// One way to spread independent work over threads: reading rank files, analysing ranks while
// the graph is built, writing rank files.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <new>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

namespace lumos {

/// The thread count a `0 = all cores` option stands for.
[[nodiscard]] inline unsigned hardware_threads(unsigned requested = 0) noexcept {
  return requested != 0 ? requested : std::max(1U, std::thread::hardware_concurrency());
}

/// Calls `work(state, i)` for every i in [0, n) on up to `threads` threads, the calling thread
/// one of them; `make_state()` gives each thread its own scratch (buffers reused from one index
/// to the next). Indices are handed out in increasing order and an index above one that failed
/// is skipped, so the exception rethrown, once every thread has joined, is the one of the
/// lowest failing index, whatever the timing: the error one thread would have met first.
/// A thread the system refuses to start leaves its share to the others.
template <class MakeState, class Work>
void parallel_for(std::size_t n, unsigned threads, MakeState make_state, Work work) {
  if (n == 0) return;
  threads = static_cast<unsigned>(std::min<std::size_t>(std::max(1U, threads), n));
  if (threads <= 1) {
    auto state = make_state();
    for (std::size_t i = 0; i < n; ++i) work(state, i);
    return;
  }
  std::vector<std::exception_ptr> failed(n);
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> first_failed{n};
  // Never lets an exception escape a thread (that would call std::terminate).
  auto run = [&]() noexcept {
    std::optional<decltype(make_state())> state;  // made on the thread's first index
    while (true) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n || i > first_failed.load()) return;
      try {
        if (!state) state.emplace(make_state());
        work(*state, i);
      } catch (...) {
        failed[i] = std::current_exception();
        std::size_t seen = first_failed.load();
        while (i < seen && !first_failed.compare_exchange_weak(seen, i)) {
        }
      }
    }
  };
  {
    std::vector<std::jthread> pool;  // joined when it goes out of scope, whatever happens
    try {
      pool.reserve(threads - 1);
      for (unsigned t = 1; t < threads; ++t) pool.emplace_back(run);
    } catch (const std::system_error&) {
    } catch (const std::bad_alloc&) {
    }
    run();
  }
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

/// `parallel_for` without per-thread scratch: `work(i)`.
template <class Work>
void parallel_for(std::size_t n, unsigned threads, Work work) {
  struct none {};
  parallel_for(n, threads, [] { return none{}; }, [&work](none&, std::size_t i) { work(i); });
}

}  // namespace lumos

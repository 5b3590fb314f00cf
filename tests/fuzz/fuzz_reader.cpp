// libFuzzer entry point: any byte sequence given to the reader either reads or raises
// lumos::error. Crashes, hangs, leaks and sanitizer reports are bugs.
#include <lumos/trace/reader.hpp>
#include <lumos/trace/summary.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // A tiny window forces refills, window growth and batch splits on small inputs; bits of the
  // first byte pick the window (growth or not) and the batch size (one event per batch, a few,
  // or the whole window), so every path is fuzzed.
  const unsigned pick = size > 0 ? data[0] : 0;
  lumos::trace::read_options options;
  options.window_bytes = (pick & 1) != 0 ? 4096 : 1 << 16;
  options.batch_bytes = (pick & 6) == 0 ? 1 : (pick & 6) == 2 ? 512 : 1 << 16;
  try {
    const auto trace = lumos::trace::read_trace_bytes(bytes, "fuzz", options);
    (void)lumos::trace::summarize(trace);
  } catch (const lumos::error&) {
  }
  return 0;
}

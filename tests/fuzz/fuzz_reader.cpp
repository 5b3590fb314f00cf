// libFuzzer entry point: any byte sequence given to the reader either reads or raises
// lumos::error. Crashes, hangs, leaks and sanitizer reports are bugs.
#include <lumos/trace/reader.hpp>
#include <lumos/trace/summary.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // A tiny window forces refills, window growth and batch splits on small inputs; the first
  // byte picks the window so both the growth and the no-growth paths are fuzzed.
  const std::size_t window = size > 0 && (data[0] & 1) ? 4096 : 1 << 16;
  try {
    const auto trace = lumos::trace::read_trace_bytes(bytes, "fuzz", {window});
    (void)lumos::trace::summarize(trace);
  } catch (const lumos::error&) {
  }
  return 0;
}

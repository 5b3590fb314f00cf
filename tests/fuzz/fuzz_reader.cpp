// libFuzzer entry point: any byte sequence given to the reader either reads or raises
// lumos::error. Crashes, hangs, leaks and sanitizer reports are bugs.
#include "fuzz_options.hpp"

#include <lumos/trace/reader.hpp>
#include <lumos/trace/summary.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto trace = lumos::trace::read_trace_bytes(bytes, "fuzz", lumos_fuzz::read_options_for(bytes));
    (void)lumos::trace::summarize(trace);
  } catch (const lumos::error&) {
  }
  return 0;
}

// libFuzzer entry point for the graph builder: the bytes drive a generator of valid traces with
// adversarial event relations (job_generator.hpp); loading, building, compiling and replaying
// them either succeeds or raises lumos::error. Crashes, hangs and sanitizer reports are bugs.
#include "job_generator.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)lumos_fuzz::build_and_replay(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const lumos::error&) {
  }
  return 0;
}

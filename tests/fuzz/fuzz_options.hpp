#pragma once
// How the reader fuzzer picks its read options from an input, shared with the unit test that
// replays the inputs it once failed on: a crash found with one window and batch size is replayed
// with the same sizes, not only with defaults that may never reach the failing path.

#include <lumos/trace/reader.hpp>

#include <array>
#include <cstddef>
#include <string_view>

namespace lumos_fuzz {

/// Windows and batch sizes the fuzzer chooses between.
inline constexpr std::array<std::size_t, 2> windows = {4096, std::size_t{1} << 16};
inline constexpr std::array<std::size_t, 3> batches = {1, 512, std::size_t{1} << 16};

/// The options the fuzzer reads `bytes` with. A tiny window forces refills, window growth and
/// batch splits on small inputs; bits of the first byte pick the window (growth or not) and the
/// batch size (one event per batch, a few, or the whole window), so every path is fuzzed.
[[nodiscard]] inline lumos::trace::read_options read_options_for(std::string_view bytes) {
  const unsigned pick = bytes.empty() ? 0U : static_cast<unsigned char>(bytes[0]);
  lumos::trace::read_options options;
  options.window_bytes = windows[(pick & 1U) != 0 ? 0 : 1];
  const unsigned b = (pick >> 1U) & 3U;
  options.batch_bytes = batches[b == 0 ? 0 : b == 1 ? 1 : 2];
  return options;
}

}  // namespace lumos_fuzz

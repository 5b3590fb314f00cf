// The SIMD element scanner must agree with the byte-at-a-time reference on every input.
#include <lumos/detail/json_scan.hpp>

#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

namespace {

struct outcome {
  std::vector<std::uint32_t> starts, ends;
  long array_end = -1;
  long resume = -1;
  bool operator==(const outcome&) const = default;
};

outcome run(bool simd, const std::string& text) {
  std::string padded = text + std::string(64, 'x');  // readable padding, never used
  outcome o;
  const char* b = padded.data();
  const auto r = simd ? lumos::detail::scan_elements(b, b, b + text.size(), o.starts, o.ends)
                      : lumos::detail::scan_elements_scalar(b, b, b + text.size(), o.starts, o.ends);
  o.array_end = r.array_end ? r.array_end - b : -1;
  o.resume = r.resume - b;
  return o;
}

}  // namespace

TEST_CASE("scanner finds element boundaries around strings and escapes", "[scan]") {
  const std::string text = R"( {"a":"}{]\"[","b":[1,{"c":"\\"}]} , {"x":"\\\\\"}"} ,{} ] trailing)";
  const outcome o = run(true, text);
  REQUIRE(o.starts.size() == 3);
  CHECK(text.substr(o.starts[0], o.ends[0] - o.starts[0]) == R"({"a":"}{]\"[","b":[1,{"c":"\\"}]})");
  CHECK(text.substr(o.starts[1], o.ends[1] - o.starts[1]) == R"({"x":"\\\\\"}"})");
  CHECK(text.substr(o.starts[2], o.ends[2] - o.starts[2]) == "{}");
  REQUIRE(o.array_end >= 0);
  CHECK(text[static_cast<std::size_t>(o.array_end)] == ']');
  CHECK(o == run(false, text));
}

TEST_CASE("scanner stops at an incomplete element and reports where to resume", "[scan]") {
  const std::string text = R"({"a":1}, {"b":"unterminated)";
  const outcome o = run(true, text);
  CHECK(o.starts.size() == 1);
  CHECK(o.array_end == -1);
  CHECK(o.resume == 7);
  CHECK(o == run(false, text));
}

TEST_CASE("SIMD and scalar scanners agree on random JSON-like text", "[scan]") {
  std::mt19937 rng(1234);
  // Heavy on the characters that matter, so that backslash runs and strings cross 64-byte
  // block boundaries in every alignment.
  const std::string alphabet = R"({}[]"\\\\\"   ,:ab)";
  for (int round = 0; round < 4000; ++round) {
    const std::size_t n = rng() % 300;
    std::string text;
    for (std::size_t i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    INFO(text);
    REQUIRE(run(true, text) == run(false, text));
  }
}

TEST_CASE("SIMD and scalar scanners agree on well-formed event arrays of every alignment", "[scan]") {
  std::mt19937 rng(99);
  for (int round = 0; round < 500; ++round) {
    std::string text(rng() % 70, ' ');
    const int events = 1 + static_cast<int>(rng() % 20);
    for (int e = 0; e < events; ++e) {
      text += R"({"name":"k\\\"x)" + std::string(rng() % 90, 'n') + R"(","args":{"dims":[[1,2],[]]}})";
      text += e + 1 < events ? "," : "]";
    }
    const outcome simd = run(true, text);
    REQUIRE(simd == run(false, text));
    REQUIRE(simd.starts.size() == static_cast<std::size_t>(events));
    REQUIRE(simd.array_end == static_cast<long>(text.size()) - 1);
  }
}

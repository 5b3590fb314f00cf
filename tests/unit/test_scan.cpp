// The SIMD element scanner must agree with the byte-at-a-time reference on every input; the
// key lookups the reader does in place must agree with each other.
#include <lumos/detail/json_scan.hpp>
#include <lumos/trace/detail/keys.hpp>

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

// The reader matches field keys in place: its one-probe lookup of short keys must give what the
// general lookup gives, for every known key and for near misses around each.

namespace {

template <class Index>
void check_key_lookup(const Index& index) {
  using namespace lumos::trace::detail;
  std::vector<std::string> keys;
  for (const auto& e : index.entries) {
    const std::string k(e.text);
    keys.push_back(k);
    keys.push_back(k.substr(0, k.size() - 1));
    keys.push_back(k + "x");
    keys.push_back("x" + k);
    keys.push_back(k.substr(0, k.size() - 1) + "\\" + k.back());
    std::string upper = k;
    upper[0] = static_cast<char>(upper[0] ^ 0x20);
    keys.push_back(upper);
  }
  for (const char* k : {"", "\\", "\\\"", "a", "abcdefg", "abcdefgh", "ph\x01"}) keys.emplace_back(k);
  keys.emplace_back(std::string("ph\0", 3));  // "ph" and a NUL: one word with "ph", another length
  for (const auto& k : keys) {
    const std::string text = k + "\":1}" + std::string(64, '\0');  // the key after its opening quote, padded
    INFO("key \"" << k << "\"");
    CHECK(index.find_raw(text.data()) == index.find(raw_key(text.data())));
  }
  for (const auto& e : index.entries) {
    const std::string text = std::string(e.text) + "\"" + std::string(64, '\0');
    CHECK(index.find_raw(text.data()) == e.code);
  }
}

}  // namespace

TEST_CASE("short keys are found in one probe, as the general key lookup finds them", "[scan]") {
  check_key_lookup(lumos::trace::detail::event_index);
  check_key_lookup(lumos::trace::detail::args_index);
}

#include <lumos/core/time.hpp>

#include <catch2/catch.hpp>

#include <charconv>
#include <random>
#include <string>

using lumos::number_error;
using lumos::parse_microseconds;

TEST_CASE("microsecond text converts to exact nanoseconds", "[time]") {
  CHECK(parse_microseconds("0").value == 0);
  CHECK(parse_microseconds("1").value == 1000);
  CHECK(parse_microseconds("1.5").value == 1500);
  CHECK(parse_microseconds("12.345").value == 12345);
  CHECK(parse_microseconds("-3.25").value == -3250);
  // Absolute 16-digit timestamps with three decimals: exact, which a double cannot be.
  CHECK(parse_microseconds("1706850122846038.123").value == 1706850122846038123LL);
  CHECK(parse_microseconds("4458676522690.655").value == 4458676522690655LL);
  CHECK(parse_microseconds("0.001").value == 1);
  CHECK(parse_microseconds("000.5").value == 500);
}

TEST_CASE("sub-nanosecond digits round to nearest, ties away from zero", "[time]") {
  CHECK(parse_microseconds("0.0004").value == 0);
  CHECK(parse_microseconds("0.0005").value == 1);
  CHECK(parse_microseconds("1.2344999").value == 1234);
  CHECK(parse_microseconds("1.2345").value == 1235);
  CHECK(parse_microseconds("-1.2345").value == -1235);
  CHECK(parse_microseconds("0.00000000000000000000000000000000000000000009").value == 0);
}

TEST_CASE("exponents are applied exactly", "[time]") {
  CHECK(parse_microseconds("1e3").value == 1'000'000);
  CHECK(parse_microseconds("1.5E-3").value == 2);  // 1.5 ns rounds away from zero
  CHECK(parse_microseconds("2.5e+2").value == 250'000);
  CHECK(parse_microseconds("12345e-3").value == 12345);
  CHECK(parse_microseconds("1e-300").value == 0);
}

TEST_CASE("absurd and malformed numbers are reported, never wrapped", "[time]") {
  CHECK(parse_microseconds("1e300").error == number_error::out_of_range);
  CHECK(parse_microseconds("99999999999999999999").error == number_error::out_of_range);
  CHECK(parse_microseconds("4611686018427387.905").error == number_error::out_of_range);  // 2^62 + 1
  CHECK(parse_microseconds("4611686018427387.904").error == number_error::none);  // 2^62
  for (const char* bad : {"", "-", ".5", "1.", "1e", "1e+", "abc", "1.2.3", "--1", "1 ", "+1", "0x10"}) {
    INFO(bad);
    CHECK(parse_microseconds(bad).error == number_error::syntax);
  }
}

TEST_CASE("writing microseconds is the exact inverse of parsing", "[time]") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    const auto v = static_cast<lumos::time_ns>(rng() % static_cast<std::uint64_t>(lumos::max_input_ns)) *
                   (i % 2 == 0 ? 1 : -1);
    std::string text;
    lumos::write_microseconds(text, v);
    const auto back = parse_microseconds(text);
    REQUIRE(back.error == number_error::none);
    REQUIRE(back.value == v);
  }
  std::string text;
  lumos::write_microseconds(text, -5);
  CHECK(text == "-0.005");
}

static_assert(parse_microseconds("1.5").value == 1500, "usable at compile time");

TEST_CASE("integer text converts as std::from_chars does when it consumes the whole text", "[time]") {
  using lumos::parse_integer;
  auto agrees = [](const std::string& text) {
    std::int64_t expected = 0;
    const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), expected);
    const auto got = parse_integer(text);
    INFO("\"" << text << "\"");
    if (ec == std::errc{} && p == text.data() + text.size()) {
      REQUIRE(got.error == number_error::none);
      REQUIRE(got.value == expected);
    } else {
      REQUIRE(got.error != number_error::none);
    }
  };
  for (const char* t : {"0", "-0", "7", "-7", "007", "-007", "", "-", "+1", " 1", "1 ", "1.0", "1e3", "12a", "--1",
                        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
                        "00000000000000000000009223372036854775807", "99999999999999999999", "18446744073709551616"}) {
    agrees(t);
  }
  CHECK(parse_integer("9223372036854775808").error == number_error::out_of_range);
  CHECK(parse_integer("12a").error == number_error::syntax);
  std::mt19937_64 rng(11);
  const std::string alphabet = "0123456789-";
  for (int round = 0; round < 20000; ++round) {
    std::string text;
    const auto length = rng() % 22;
    for (std::uint64_t k = 0; k < length; ++k) text += alphabet[rng() % (round % 2 == 0 ? 10 : alphabet.size())];
    agrees(text);
  }
  for (int round = 0; round < 20000; ++round) agrees(std::to_string(static_cast<std::int64_t>(rng())));
}

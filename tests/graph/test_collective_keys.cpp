// How the builder numbers the process groups and types of communication ops
// (include/lumos/graph/detail/collectives.hpp): each name once, in the order met, then each
// number's place in text order, so that keys sorted as numbers sort as their text.
#include <lumos/graph/trace_builder.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

TEST_CASE("name_numbers: a number per distinct name, in the order met", "[graph][collective]") {
  lumos::graph::detail::name_numbers n;
  CHECK(n("tp") == 0);
  CHECK(n("dp") == 1);
  CHECK(n("tp") == 0);
  CHECK(n("") == 2);
  CHECK(n.text == std::vector<std::string>{"tp", "dp", ""});
}

TEST_CASE("text_order: each number's place among the names sorted", "[graph][collective]") {
  const std::vector<std::string> text{"tp", "dp", "", "pp"};
  const std::vector<std::uint32_t> place = lumos::graph::detail::text_order(text);
  REQUIRE(place.size() == text.size());
  for (std::size_t a = 0; a < text.size(); ++a) {
    for (std::size_t b = 0; b < text.size(); ++b) CHECK((place[a] < place[b]) == (text[a] < text[b]));
  }
  CHECK(lumos::graph::detail::text_order({}).empty());
}

#include <lumos/core/json_writer.hpp>

#include <catch2/catch.hpp>

TEST_CASE("json writer nests, separates and escapes", "[json]") {
  std::string out;
  lumos::json_writer w(out);
  w.begin_object().field("a", 1).key("b").begin_array().value("x\"y\\z\n\x01").value(2.5).value(true).null().end_array();
  w.key("t").microseconds(1234567).field("n", std::int64_t{-3}).end_object();
  CHECK(out == R"({"a":1,"b":["x\"y\\z\n\u0001",2.5,true,null],"t":1234.567,"n":-3})");
}

TEST_CASE("doubles are written deterministically and non-finite values as null", "[json]") {
  std::string out;
  lumos::json_writer w(out);
  w.begin_array().value(0.1).value(1e-9).value(1.0 / 0.0).end_array();
  CHECK(out == "[0.1,1e-09,null]");
}

#include <lumos/core/strings.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

TEST_CASE("interning gives dense stable ids and stable views", "[strings]") {
  lumos::string_table t;
  const auto a = t.intern("aten::mm");
  const auto b = t.intern("cudaLaunchKernel");
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(t.intern("aten::mm") == a);
  CHECK(t.find("cudaLaunchKernel") == b);
  CHECK(t.find("missing") == lumos::no_string);
  CHECK(t.intern("") == 2);
  CHECK(t[2].empty());

  const std::string_view first = t[a];
  std::vector<std::string> many;
  for (int i = 0; i < 100000; ++i) many.push_back("kernel_" + std::to_string(i));
  for (const auto& s : many) t.intern(s);
  CHECK(first == "aten::mm");  // views survive growth
  CHECK(first.data() == t[a].data());
  for (std::size_t i = 0; i < many.size(); i += 997) CHECK(t[t.find(many[i])] == many[i]);
  CHECK(t.size() == many.size() + 3);
  const std::string big(300000, 'x');  // larger than a storage chunk
  CHECK(t[t.intern(big)] == big);
}

TEST_CASE("a copied table keeps every id and owns its text", "[strings]") {
  std::vector<lumos::string_id> ids;
  lumos::string_table copy;
  {
    lumos::string_table t;
    for (int i = 0; i < 3000; ++i) ids.push_back(t.intern("name_" + std::to_string(i % 1000)));
    t.intern("");
    copy = t;
    CHECK(copy.size() == t.size());
    CHECK(copy[ids[5]].data() != t[ids[5]].data());
    t.intern("only in the source");
    CHECK(copy.find("only in the source") == lumos::no_string);
  }  // the source is gone: the copy's views must not point into it
  for (int i = 0; i < 3000; i += 7) CHECK(copy[ids[static_cast<std::size_t>(i)]] == "name_" + std::to_string(i % 1000));
  CHECK(copy.find("name_999") == ids[999]);
  CHECK(copy.intern("name_42") == ids[42]);
  CHECK(copy.intern("new in the copy") == 1001);
  CHECK(copy[1001] == "new in the copy");
}

TEST_CASE("lower_ascii lowers ASCII letters only", "[strings]") {
  CHECK(lumos::lower_ascii("NCCL:Recv_42") == "nccl:recv_42");
  CHECK(lumos::lower_ascii("") == "");
  CHECK(lumos::lower_ascii("\xc3\x89t\xc3\xa9") == "\xc3\x89t\xc3\xa9");  // UTF-8 bytes untouched
}

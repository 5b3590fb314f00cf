// The parts of the inserted gradient reduction (include/lumos/whatif/gradient_buckets.hpp): the
// parameter segments a chunk's buckets are formed over, and where a bucket's DP group sits.
#include <lumos/whatif/gradient_buckets.hpp>

#include <catch2/catch.hpp>

#include <numeric>
#include <set>

using namespace lumos;

TEST_CASE("chunk_parameters: a chunk's segments in backward order, the head last-stage and the embedding first-stage",
          "[whatif][dp]") {
  whatif::detail::chunk_parameters p;
  p.m.hidden = 1024, p.m.vocab = 32000, p.m.tied_embeddings = true;
  p.tp = 2, p.layer = 7, p.embedding = 11;
  const std::int64_t logits = p.m.vocab * p.m.hidden / p.tp;
  // A tied embedding's logits are the embedding itself on one stage, a copy of their own on the last of several.
  CHECK(p.head(2) - p.head(1) == logits);
  p.m.tied_embeddings = false;
  CHECK(p.head(1) == p.head(2));
  const std::vector<std::int64_t> whole = p.segments(true, true, 3, 1);
  CHECK(whole == std::vector<std::int64_t>{p.head(1), 7, 7, 7, 11});
  CHECK(p.segments(false, false, 2, 4) == std::vector<std::int64_t>{7, 7});
  CHECK(p.segments(true, false, 1, 4) == std::vector<std::int64_t>{7, 11});
  CHECK(p.segments(false, true, 0, 4) == std::vector<std::int64_t>{p.head(4)});
}

TEST_CASE("dp_group_members: a traced rank's DP group at Megatron's ranks (TP innermost, then DP, then PP)", "[whatif][dp]") {
  for (const int tp : {1, 2, 4}) {
    for (const int dp : {2, 4}) {
      std::set<int> seen;
      for (int stage = 0; stage < 2; ++stage) {
        for (int column = 0; column < tp; ++column) {
          const std::vector<int> m = whatif::detail::dp_group_members(column, stage, tp, tp, dp);
          REQUIRE(m.size() == static_cast<std::size_t>(dp));
          for (std::size_t i = 0; i < m.size(); ++i) {
            CHECK(m[i] % tp == column);                // the rank's TP column
            CHECK(m[i] / (tp * dp) == stage);          // inside its stage's block
            if (i > 0) CHECK(m[i] - m[i - 1] == tp);  // consecutive DP replicas
            seen.insert(m[i]);
          }
        }
      }
      CHECK(seen.size() == static_cast<std::size_t>(2 * tp * dp));  // every rank in one group
    }
  }
  // A traced TP 4 rank placed in a target of TP 2: its column is taken modulo the target's.
  CHECK(whatif::detail::dp_group_members(7, 1, 2, 4, 2) == std::vector<int>{5, 7});
}

// A parallel configuration in one call, for the model tests.
#pragma once

#include <lumos/model/parallel.hpp>

#include <cstdint>

namespace lumos::model::test {

inline parallel_config config(int tp, int pp, int dp, std::int64_t mb, std::int64_t gb) {
  parallel_config p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = mb;
  p.global_batch = gb;
  return p;
}

}  // namespace lumos::model::test

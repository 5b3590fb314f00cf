// A parallel configuration in one call, for the model tests.
#pragma once

#include <lumos/model/parallel.hpp>
#include <lumos/model/transformer.hpp>

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

/// A GPT-shaped model small enough to build every rank of a job quickly: GPT-3's layer with
/// hidden 1024, FFN 4096, 16 heads, sequences of 512 and a vocabulary of 32768.
inline transformer small_gpt(std::int64_t layers = 8) {
  transformer m = gpt3_with_layers("small-gpt", layers);
  m.hidden = 1024;
  m.ffn = 4096;
  m.heads = m.kv_heads = 16;
  m.seq = 512;
  m.vocab = 32768;
  return m;
}

}  // namespace lumos::model::test

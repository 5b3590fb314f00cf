// Presets, parallel-config validation, parameter counts, FLOPs/MFU and the memory model,
// each checked against its closed form.

#include <lumos/model/eager_memory.hpp>
#include <lumos/model/flops.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/memory.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/model/transformer.hpp>

#include "config_support.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace lumos::model;
using lumos::model::test::config;
using Catch::Matchers::Contains;

namespace {

// Built in a constant expression: the formulas are usable at compile time.
constexpr transformer gpt3_175b_shape() {
  transformer m;
  m.layers = 96;
  m.hidden = 12288;
  m.ffn = 4 * 12288;
  m.heads = 96;
  m.kv_heads = 96;
  m.seq = 2048;
  m.vocab = 51200;
  return m;
}
static_assert(gpt_parameter_count(gpt3_175b_shape()) == 174'615'822'336LL);
static_assert(parameter_count(gpt3_175b_shape()) == 174'615'822'336LL + 2 * 12288);
static_assert(layer_activation_bytes(gpt3_175b_shape(), [] {
                parallel_config p;
                p.recompute = recompute_kind::full;
                return p;
              }(), true) == 2.0 * 2048 * 12288);

}  // namespace

// ---------------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------------

TEST_CASE("hardware presets carry datasheet peaks and are found by name", "[model][presets]") {
  for (auto name : hardware_preset_names) {
    const hardware hw = hardware_preset(name);
    CHECK(hw.name == name);
    CHECK(hw.gpus_per_node >= 4);
    CHECK(hw.nvlink_domain_size() >= hw.gpus_per_node);
    CHECK((hw.gpu.fp8_flops == 0 || hw.gpu.fp8_flops == Approx(2 * hw.gpu.bf16_flops).epsilon(0.001)));
    CHECK(profile_preset(name).hardware == name);
    CHECK(hw.gpu.bf16_flops > 0);
    CHECK(hw.gpu.hbm_bandwidth > 0);
    CHECK(hw.intra_node.bandwidth > hw.inter_node.bandwidth);
    CHECK(hw.kernel_launch_overhead > 0);
  }
  const hardware a100 = hardware_preset("a100-sxm-80gb");
  CHECK(a100.gpu.bf16_flops == 312e12);
  CHECK(a100.gpu.sm_count == 108);
  CHECK(a100.inter_node.bandwidth == 25e9);  // one 200 Gb/s NIC per GPU
  const hardware h100 = hardware_preset("h100-sxm");
  CHECK(h100.peak_flops(precision::bf16) == Approx(989.4e12));
  CHECK(h100.peak_flops(precision::fp8) == Approx(1978.9e12));
  CHECK(h100.gpu.hbm_bandwidth == Approx(3.35e12));
  CHECK(h100.inter_node.bandwidth == 50e9);  // one 400 Gb/s NIC per GPU
  const hardware h200 = hardware_preset("h200-sxm");
  CHECK(h200.gpu.bf16_flops == h100.gpu.bf16_flops);
  CHECK(h200.gpu.hbm_bandwidth == Approx(4.8e12));
  CHECK(h200.gpu.hbm_capacity > h100.gpu.hbm_capacity);
}

TEST_CASE("B200, GB200 and MI300X: datasheet peaks, NVLink domains and device names", "[model][presets]") {
  const hardware h100 = hardware_preset("h100-sxm"), b = hardware_preset("b200"), gb = hardware_preset("gb200"),
                 mi = hardware_preset("mi300x");
  CHECK(b.peak_flops(precision::bf16) == Approx(2250e12));
  CHECK(b.peak_flops(precision::fp8) == Approx(4500e12));
  CHECK(b.gpu.hbm_bandwidth == Approx(8e12));
  CHECK(b.intra_node.bandwidth == Approx(2 * h100.intra_node.bandwidth));  // NVLink 5: 1.8 TB/s total
  CHECK(b.nvlink_domain_size() == 8);
  CHECK(gb.peak_flops(precision::bf16) == Approx(2500e12));
  CHECK(gb.peak_flops(precision::fp8) == Approx(5000e12));
  CHECK(gb.gpus_per_node == 4);  // a compute tray: two GB200 superchips
  CHECK(gb.nvlink_domain_size() == 72);
  CHECK(mi.peak_flops(precision::bf16) == Approx(1307.4e12));
  CHECK(mi.peak_flops(precision::fp8) == Approx(2614.9e12));
  CHECK(mi.gpu.hbm_bandwidth == Approx(5.3e12));
  CHECK(mi.gpu.hbm_capacity > 192e9);
  CHECK(mi.nvlink_domain_size() == 8);
  // The existing presets keep their node as the NVLink domain.
  CHECK(h100.nvlink_domain == 0);
  CHECK(h100.nvlink_domain_size() == h100.gpus_per_node);
  CHECK(preset_of_device("NVIDIA B200") == "b200");
  CHECK(preset_of_device("NVIDIA GB200") == "gb200");
  CHECK(preset_of_device("AMD Instinct MI300X") == "mi300x");
  CHECK(preset_of_device("MI300X") == "mi300x");
  CHECK(preset_of_device("AMD Instinct MI210").empty());
  for (auto n : hardware_preset_names) CHECK(preset_of_device(n) == n);  // synth writes the preset name
}

TEST_CASE("A100 has no fp8 and says so", "[model][presets]") {
  const hardware a100 = a100_sxm_80gb();
  CHECK_THROWS_AS(a100.peak_flops(precision::fp8), lumos::error);
  CHECK_THROWS_WITH(a100.peak_flops(precision::fp8),
                    Contains("a100-sxm-80gb") && Contains("fp8") && Contains("bf16"));
  CHECK(a100.peak_flops(precision::fp16) == 312e12);
}

TEST_CASE("unknown preset names list the valid ones", "[model][presets]") {
  CHECK_THROWS_AS(hardware_preset("h100"), lumos::error);
  CHECK_THROWS_WITH(hardware_preset("h100"), Contains("'h100'") && Contains("a100-sxm-80gb") &&
                                                 Contains("h100-sxm") && Contains("h200-sxm") && Contains("gb200") &&
                                                 Contains("mi300x"));
  CHECK_THROWS_WITH(profile_preset("b300"), Contains("'b300'") && Contains("b200") && Contains("mi300x"));
  CHECK_THROWS_AS(model_preset("gpt3"), lumos::error);
  for (auto n : model_preset_names) {
    CHECK_THROWS_WITH(model_preset("gpt-4"), Contains(std::string(n)));
  }
}

TEST_CASE("model presets have the documented shapes", "[model][presets]") {
  for (auto name : model_preset_names) {
    const transformer m = model_preset(name);
    CHECK(m.name == name);
    CHECK_NOTHROW(m.validate());
  }
  const transformer g = model_preset("gpt3-175b");
  CHECK(g.layers == 96);
  CHECK(g.hidden == 12288);
  CHECK(g.ffn == 4 * 12288);
  CHECK(g.heads == 96);
  CHECK(g.kv_heads == 96);
  CHECK(g.seq == 2048);
  CHECK(g.vocab == 51200);
  CHECK(g.mlp == mlp_kind::gelu);
  CHECK(g.tied_embeddings);
  CHECK(model_preset("gpt3-15b").layers == 8);
  CHECK(model_preset("gpt3-44b").layers == 24);
  CHECK(model_preset("gpt3-117b").layers == 64);

  const transformer l = model_preset("llama3-70b");
  CHECK(l.layers == 80);
  CHECK(l.hidden == 8192);
  CHECK(l.ffn == 28672);
  CHECK(l.heads == 64);
  CHECK(l.kv_heads == 8);
  CHECK(l.seq == 8192);
  CHECK(l.vocab == 128256);
  CHECK(l.mlp == mlp_kind::swiglu);
  CHECK(l.norm == norm_kind::rmsnorm);
  CHECK_FALSE(l.tied_embeddings);
  CHECK(model_preset("llama3-8b").ffn == 14336);
  CHECK(model_preset("llama3-405b").ffn == 53248);
  CHECK(model_preset("llama3-405b").layers == 126);
}

// ---------------------------------------------------------------------------------------------
// Parallel configuration
// ---------------------------------------------------------------------------------------------

TEST_CASE("micro-batch count and its divisibility rule", "[model][parallel]") {
  parallel_config p = config(8, 8, 16, 1, 1536);
  CHECK(p.world_size() == 1024);
  CHECK(p.micro_batches() == 96);
  p.global_batch = 1000;
  CHECK_THROWS_AS(p.micro_batches(), lumos::error);
  CHECK_THROWS_WITH(p.micro_batches(),
                    Contains("global_batch (1000)") && Contains("micro_batch * dp") &&
                        Contains("multiple of 16"));
}

TEST_CASE("invalid parallel configurations raise errors that say what to change",
          "[model][parallel]") {
  const transformer gpt = gpt3_175b();
  const transformer llama = llama3_405b();
  CHECK_NOTHROW(config(8, 8, 16, 1, 1536).validate(gpt));

  CHECK_THROWS_WITH(config(7, 8, 1, 1, 8).validate(gpt),
                    Contains("heads (96)") && Contains("tp (7)"));
  CHECK_THROWS_WITH(config(16, 2, 1, 1, 8).validate(llama),
                    Contains("kv_heads (8)") && Contains("tp <= kv_heads"));
  CHECK_THROWS_WITH(config(8, 5, 1, 1, 8).validate(gpt),
                    Contains("layers (96)") && Contains("pp * vp"));
  parallel_config v = config(8, 4, 1, 1, 8);
  v.vp = 5;  // 4 * 5 = 20 does not divide 96
  CHECK_THROWS_WITH(v.validate(gpt), Contains("4 * 5 = 20"));
  v.vp = 3;
  CHECK_NOTHROW(v.validate(gpt));
  parallel_config vp_only = config(8, 1, 1, 1, 8);
  vp_only.vp = 2;
  CHECK_THROWS_WITH(vp_only.validate(gpt), Contains("pp > 1"));
  CHECK_THROWS_WITH(config(8, 8, 16, 5, 1536).validate(gpt), Contains("global_batch"));
  CHECK_THROWS_WITH(config(0, 1, 1, 1, 1).validate(gpt), Contains("tp must be at least 1"));
  parallel_config z = config(8, 8, 16, 1, 1536);
  z.zero_stage = 4;
  CHECK_THROWS_WITH(z.validate(gpt), Contains("zero_stage"));

  transformer odd_vocab = gpt;
  odd_vocab.vocab = 50257;
  CHECK_THROWS_WITH(config(8, 8, 1, 1, 8).validate(odd_vocab),
                    Contains("vocab (50257)") && Contains("pad"));
  transformer odd_seq = gpt;
  odd_seq.seq = 2047;
  parallel_config sp = config(8, 8, 1, 1, 8);
  sp.sp = true;
  CHECK_THROWS_WITH(sp.validate(odd_seq), Contains("sequence parallelism"));
  sp.sp = false;
  CHECK_NOTHROW(sp.validate(odd_seq));

  parallel_config fp8 = config(8, 8, 1, 1, 8);
  fp8.dtype = precision::fp8;
  CHECK_THROWS_WITH(fp8.validate(gpt, a100_sxm_80gb()), Contains("fp8"));
  CHECK_NOTHROW(fp8.validate(gpt, h100_sxm()));
}

// ---------------------------------------------------------------------------------------------
// Parameter counts
// ---------------------------------------------------------------------------------------------

TEST_CASE("GPT parameter count is Narayanan et al.'s formula for every GPT preset",
          "[model][flops]") {
  for (auto name : {"gpt3-15b", "gpt3-44b", "gpt3-117b", "gpt3-175b"}) {
    const transformer m = model_preset(name);
    const double l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden),
                 V = static_cast<double>(m.vocab), s = static_cast<double>(m.seq);
    const double formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    INFO(name);
    CHECK(static_cast<double>(gpt_parameter_count(m)) == Approx(formula).epsilon(1e-14));
    // Expanded, exactly in integers.
    CHECK(gpt_parameter_count(m) == 12 * m.layers * m.hidden * m.hidden +
                                        13 * m.layers * m.hidden + (m.vocab + m.seq) * m.hidden);
    // The general count adds only the final LayerNorm the formula leaves out.
    CHECK(parameter_count(m) == gpt_parameter_count(m) + 2 * m.hidden);
  }
  // GPT-3 175B by hand, l = 96, h = 12288, V = 51200, s = 2048: 12 h^2 = 1,811,939,328, times
  // 96 = 173,946,175,488; 13 l h = 15,335,424; (V + s) h = 654,311,424; sum 174,615,822,336
  // (the "175B" of the paper).
  CHECK(gpt_parameter_count(gpt3_175b()) == 174'615'822'336LL);
}

TEST_CASE("general parameter count handles GQA, SwiGLU, RMSNorm and untied embeddings",
          "[model][flops]") {
  // Llama 3 8B by hand: head_dim 128, q width 4096, kv width 8 * 128 = 1024.
  const transformer m = llama3_8b();
  const std::int64_t h = 4096, kv = 1024, f = 14336, V = 128256;
  const std::int64_t layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h;
  const parameter_breakdown p = parameter_counts(m);
  CHECK(p.per_layer == layer);
  CHECK(p.position_embedding == 0);
  CHECK(p.word_embedding == V * h);
  CHECK(p.output == V * h);
  CHECK(p.final_norm == h);
  CHECK(p.total() == 32 * layer + 2 * V * h + h);
  CHECK(p.total() / 10'000'000 == 803);  // 8.03e9, Llama 3's "8B"
  CHECK(parameter_count(llama3_70b()) / 100'000'000 == 705);   // 70.55e9
  CHECK(parameter_count(llama3_405b()) / 100'000'000 == 4058); // 405.85e9
}

TEST_CASE("stage parameters partition the model over pipeline and tensor ranks",
          "[model][flops]") {
  for (auto name : {"gpt3-44b", "llama3-70b"}) {
    const transformer m = model_preset(name);
    INFO(name);
    for (int pp : {1, 2, 4, 8}) {
      parallel_config p = config(1, pp, 1, 1, 8);
      std::int64_t sum = 0;
      for (int st = 0; st < pp; ++st) sum += stage_parameters_per_rank(m, p, st);
      // A tied model with pp > 1 keeps a second word-embedding copy on the last stage.
      const std::int64_t copy = m.tied_embeddings && pp > 1 ? m.vocab * m.hidden : 0;
      CHECK(sum == parameter_count(m) + copy);
    }
  }
  // TP shards GEMM weights and column-parallel biases; norms and row-parallel biases are
  // replicated.
  const transformer g = gpt3_175b();
  const std::int64_t h = g.hidden;
  CHECK(layer_parameters_per_rank(g, 8) == (12 * h * h + 3 * h + 4 * h) / 8 + 4 * h + 2 * h);
  CHECK(layer_parameters_per_rank(g, 1) == parameter_counts(g).per_layer);
  CHECK_THROWS_AS(stage_parameters_per_rank(g, config(8, 8, 1, 1, 8), 8), lumos::error);
}

// ---------------------------------------------------------------------------------------------
// FLOPs, MFU
// ---------------------------------------------------------------------------------------------

TEST_CASE("model FLOPs follow Megatron's 72 B s l h^2 formula", "[model][flops]") {
  for (auto name : {"gpt3-15b", "gpt3-175b"}) {
    const transformer m = model_preset(name);
    const double B = 1536, s = 2048, l = static_cast<double>(m.layers), h = 12288, V = 51200;
    const double f72 = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    const double f96 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    INFO(name);
    CHECK(megatron_model_flops(m, 1536) == Approx(f72).epsilon(1e-14));
    CHECK(model_flops(m, 1536) == Approx(f72).epsilon(1e-12));
    CHECK(megatron_full_recompute_flops(m, 1536) == Approx(f96).epsilon(1e-14));
    CHECK(hardware_flops(m, 1536, recompute_kind::full) == Approx(f96).epsilon(1e-12));
    CHECK(hardware_flops(m, 1536, recompute_kind::none) == model_flops(m, 1536));
    CHECK(hardware_flops(m, 1536, recompute_kind::selective) ==
          Approx(f72 + 4 * B * s * s * l * h).epsilon(1e-12));
  }
  // General count for Llama: 3 B (l (2 s N + 4 s^2 q) + 2 s V h), N = GEMM weights per layer.
  const transformer m = llama3_8b();
  const double N = 4096.0 * (4096 + 2048) + 4096.0 * 4096 + 3 * 4096.0 * 14336;
  const double s = 8192;
  CHECK(model_flops(m, 512) ==
        Approx(3 * 512 * (32 * (2 * s * N + 4 * s * s * 4096) + 2 * s * 128256.0 * 4096))
            .epsilon(1e-12));
}

TEST_CASE("MFU is model FLOPs over time x GPUs x peak", "[model][flops]") {
  const transformer m = gpt3_175b();
  const hardware hw = h100_sxm();
  parallel_config p = config(8, 8, 16, 1, 1536);
  p.recompute = recompute_kind::full;
  const lumos::time_ns t = 20'000'000'000;  // 20 s
  const double F = model_flops(m, 1536);
  CHECK(mfu(m, p, hw, t) == Approx(F / (20.0 * 1024 * 989.4e12)).epsilon(1e-12));
  CHECK(hfu(m, p, hw, t) ==
        Approx(megatron_full_recompute_flops(m, 1536) / (20.0 * 1024 * 989.4e12)).epsilon(1e-12));
  CHECK(tflops_per_gpu(F, t, 1024) == Approx(F / 20.0 / 1024 / 1e12).epsilon(1e-12));
  CHECK(tokens_per_second(m, 1536, t) == Approx(1536.0 * 2048 / 20.0));
  CHECK_THROWS_AS(utilisation(F, 0, 1024, 1e15), lumos::error);
  CHECK_THROWS_AS(utilisation(F, t, 0, 1e15), lumos::error);
  p.dtype = precision::fp8;
  CHECK_THROWS_AS(mfu(m, p, a100_sxm_80gb(), t), lumos::error);
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

TEST_CASE("activation memory matches Korthikanti et al. Table 2 for GPT shapes",
          "[model][memory]") {
  const transformer m = gpt3_175b();
  const double s = 2048, h = 12288, a = 96;
  for (std::int64_t b : {1, 4}) {
    for (int t : {1, 2, 8}) {
      const double sbh = s * static_cast<double>(b) * h;
      parallel_config p = config(t, 8, 1, b, 8 * b);
      INFO("b=" << b << " t=" << t);
      // no recomputation, tensor parallel only
      CHECK(layer_activation_bytes(m, p, false) ==
            Approx(sbh * (10 + 24.0 / t + 5 * a * s / (h * t))).epsilon(1e-14));
      if (t == 1) {
        CHECK(layer_activation_bytes(m, p, false) ==
              Approx(sbh * (34 + 5 * a * s / h)).epsilon(1e-14));
      }
      p.recompute = recompute_kind::selective;
      CHECK(layer_activation_bytes(m, p, false) == Approx(sbh * (10 + 24.0 / t)).epsilon(1e-14));
      p.recompute = recompute_kind::full;
      CHECK(layer_activation_bytes(m, p, false) == 2 * sbh);
      // with sequence parallelism
      p.sp = true;
      p.recompute = recompute_kind::none;
      CHECK(layer_activation_bytes(m, p, false) ==
            Approx(sbh / t * (34 + 5 * a * s / h)).epsilon(1e-14));
      p.recompute = recompute_kind::selective;
      CHECK(layer_activation_bytes(m, p, false) == Approx(34 * sbh / t).epsilon(1e-14));
      CHECK(layer_activation_bytes(m, p, true) == Approx(34 * sbh / t).epsilon(1e-14));
      p.recompute = recompute_kind::full;
      CHECK(layer_activation_bytes(m, p, false) == Approx(2 * sbh / t).epsilon(1e-14));
      // FlashAttention drops only the 5as/h term.
      p.recompute = recompute_kind::none;
      CHECK(layer_activation_bytes(m, p, true) == Approx(34 * sbh / t).epsilon(1e-14));
    }
  }
}

TEST_CASE("activation memory of SwiGLU/GQA layers follows the same accounting",
          "[model][memory]") {
  const transformer m = llama3_70b();  // no dropout, q = 8192, kv = 1024, f = 28672
  const double s = 8192, h = 8192, kv = 1024, f = 28672, a = 64, t = 8;
  parallel_config p = config(8, 8, 1, 1, 8);
  const double rep = 8 * s * h;  // two norm inputs + two GEMM inputs, no dropout masks
  const double shard = 2 * s * h + 4 * s * kv + 2 * s * h + 6 * s * f;
  const double core = 2 * a * s * s;  // softmax output only: no attention dropout
  CHECK(layer_activation_bytes(m, p, false) == Approx(rep + (shard + core) / t).epsilon(1e-14));
  CHECK(layer_activation_bytes(m, p, true) == Approx(rep + shard / t).epsilon(1e-14));
  p.sp = true;
  CHECK(layer_activation_bytes(m, p, true) == Approx((rep + shard) / t).epsilon(1e-14));
}

TEST_CASE("stage activations scale with in-flight micro-batches and interleaving",
          "[model][memory]") {
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 4, 1, 1, 64);
  p.sp = true;
  p.recompute = recompute_kind::selective;
  const double per_layer = layer_activation_bytes(m, p, true);
  memory_options o;
  o.in_flight_microbatches = 4;  // 1F1B stage 0 of 4
  memory_breakdown r = memory_per_gpu(m, p, 0, o);
  CHECK(r.activations == Approx(per_layer * 24 * 4).epsilon(1e-14));
  // Interleaved, v = 2: stage 0 holds L (1 + (p - 1)/(p v)) layers' worth (Korthikanti 4.2.3).
  p.vp = 2;
  o.in_flight_microbatches = 4 * (1 + 3.0 / (4 * 2));
  r = memory_per_gpu(m, p, 0, o);
  CHECK(r.activations == Approx(per_layer * 96 * (1 + 3.0 / 8)).epsilon(1e-14));
  // io terms: stage 0 holds the embedding dropout mask; the last stage the head's buffers.
  const double sbh = 2048.0 * 12288;
  CHECK(r.io_activations == Approx(sbh / 8 * o.in_flight_microbatches).epsilon(1e-14));
  o.in_flight_microbatches = 1;
  r = memory_per_gpu(m, p, 3, o);
  CHECK(r.io_activations == Approx(4 * sbh / 8 + 4 * 2048.0 * 51200 / 8).epsilon(1e-14));
  r = memory_per_gpu(m, p, 1, o);
  CHECK(r.io_activations == 0);
  o.in_flight_microbatches = -1;
  CHECK_THROWS_AS(memory_per_gpu(m, p, 0, o), lumos::error);
}

TEST_CASE("ZeRO stages shard optimizer states, gradients and parameters over dp",
          "[model][memory]") {
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 8, 16, 1, 1536);
  const std::int64_t n = stage_parameters_per_rank(m, p, 1);
  const double N = static_cast<double>(n);
  memory_breakdown z[4];
  for (int stage = 0; stage < 4; ++stage) {
    p.zero_stage = stage;
    z[stage] = memory_per_gpu(m, p, 1);
    CHECK(z[stage].parameter_count == n);
  }
  CHECK(z[0].parameters == 2 * N);
  CHECK(z[0].gradients == 2 * N);
  CHECK(z[0].optimizer_states == 12 * N);
  CHECK(z[1].optimizer_states == Approx(12 * N / 16));
  CHECK(z[1].gradients == 2 * N);
  CHECK(z[2].gradients == Approx(2 * N / 16));
  CHECK(z[2].parameters == 2 * N);
  CHECK(z[3].parameters == Approx(2 * N / 16));
  CHECK(z[3].model_states() == Approx(16 * N / 16));
  CHECK(z[0].model_states() == 16 * N);
  // Activations do not depend on ZeRO.
  CHECK(z[3].activations == z[0].activations);

  // 175B at tp 8, pp 8 without ZeRO: 16 bytes x ~2.7e9 parameters = ~43.5 GB of states;
  // with selective recompute + sp and 8 micro-batches in flight it fits in 80 GB.
  p.zero_stage = 0;
  p.sp = true;
  p.recompute = recompute_kind::selective;
  memory_options o;
  o.in_flight_microbatches = 8;
  CHECK(memory_per_gpu(m, p, 0, o).fits(h100_sxm()));
  // Without recomputation, sp or flash attention it does not.
  p.sp = false;
  p.recompute = recompute_kind::none;
  o.flash_attention = false;
  CHECK_FALSE(memory_per_gpu(m, p, 0, o).fits(h100_sxm()));
}

TEST_CASE("recomputation adds its transient working set", "[model][memory]") {
  const transformer m = gpt3_175b();
  parallel_config p = config(8, 8, 1, 1, 8);
  p.sp = true;
  p.recompute = recompute_kind::full;
  const memory_breakdown r = memory_per_gpu(m, p, 2);
  parallel_config none = p;
  none.recompute = recompute_kind::none;
  CHECK(r.recompute_working == layer_activation_bytes(m, none, true));
  CHECK(r.total() == Approx(r.model_states() + r.activations + r.io_activations +
                            r.recompute_working));
}

// PyTorch eager memory (model/eager_memory.hpp): each term by hand for a GPT layer (GELU,
// FFN 4h, no dropout) under bf16 autocast with fp32 AdamW (foreach): per layer 38 sbh bytes
// (norm inputs 2 x 4, their bf16 casts 2 x 2, Q K V 6, attention output and its copy 2 x 2, FC1
// output and GELU output 2 x 8); weight copies 2 bytes per GEMM weight (12 h^2 per layer and the
// head); the loss 6 sbh + 12 sbV; the optimizer peak 20 bytes per parameter.
TEST_CASE("eager memory: the backward and optimizer peaks of a bf16-autocast AdamW step", "[memory][eager]") {
  transformer m;
  m.layers = 8, m.hidden = 2048, m.ffn = 8192, m.heads = 16, m.kv_heads = 16, m.seq = 1024, m.vocab = 32768;
  m.dropout = false;
  const double P = 539185152.0;  // the module's parameters (untied head, learned positions)
  const double s = 1024, h = 2048, V = 32768;
  for (const std::int64_t b : {1, 4, 8}) {
    const double sbh = s * static_cast<double>(b) * h, sbv = s * static_cast<double>(b) * V;
    const eager_memory e = eager_memory_per_gpu(m, P, b, 1, eager_recipe{});
    CHECK(eager_layer_activation_bytes(m, b, eager_recipe{}) == Approx(38 * sbh));
    CHECK(e.weight_copies == Approx(2 * (8 * 12 * h * h + V * h)));
    CHECK(e.loss == Approx(6 * sbh + 12 * sbv));
    CHECK(e.backward_peak == Approx(12 * P + e.weight_copies + 8 * 38 * sbh + e.loss));
    CHECK(e.optimizer_peak == Approx(20 * P));
    CHECK(e.total() == Approx(std::max(e.backward_peak, e.optimizer_peak)));
  }
  // Micro-batch 1 peaks in the optimizer step, 4 at the start of the backward.
  CHECK(eager_memory_per_gpu(m, P, 1, 1, eager_recipe{}).total() == Approx(20 * P));
  const eager_memory four = eager_memory_per_gpu(m, P, 4, 1, eager_recipe{});
  CHECK(four.total() == Approx(four.backward_peak));
  // Accumulating micro-batches keeps the gradients through the later backward passes.
  CHECK(eager_memory_per_gpu(m, P, 4, 2, eager_recipe{}).backward_peak == Approx(four.backward_peak + 4 * P));
  // A fused optimizer has no full-size temporary; a bf16 module casts no weights.
  eager_recipe fused;
  fused.optimizer_temp = 0;
  CHECK(eager_memory_per_gpu(m, P, 1, 1, fused).optimizer_peak == Approx(16 * P));
  eager_recipe pure;
  pure.param = pure.grad = pure.residual = pure.loss = 2, pure.optimizer = 4, pure.optimizer_temp = 2;
  CHECK(eager_memory_per_gpu(m, P, 4, 1, pure).weight_copies == 0);
}

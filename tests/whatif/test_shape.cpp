// Model-shape and tensor-parallel what-ifs (include/lumos/whatif/shape.hpp, tensor_parallel.hpp):
// the dims of each GEMM mapped to the new shape, the time ratio of each op class against ratios
// derived here from the cost model's published formulas, identity, monotonicity, invalid targets.
#include "../unit/test_support.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/whatif/whatif.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <string>

using namespace lumos;

namespace {

// The hand-made pipeline jobs (tests/data/whatif/make_pipeline_traces.py): hidden 1024,
// FFN 4096, 16 heads of 64, s 512, b 2, TP 1; every kernel 8 µs.
whatif::shape_config pipeline_shape() {
  whatif::shape_config c;
  c.hidden = 1024, c.ffn = 4096, c.heads = 16, c.head_dim = 64, c.seq = 512, c.micro_batch = 2, c.tp = 1;
  return c;
}

// GEMM efficiency per dimension, as model/kernel_costs.hpp documents it: d / (d + half_dim).
double eff(double d) {
  return d / (d + model::h100_profile().gemm_half_dim);
}

// Durations of the predicted graph's GPU compute tasks whose name contains `part`, against the
// baseline's (same task ids: a shape change neither adds nor removes tasks).
std::vector<std::pair<time_ns, time_ns>> durations(const whatif::whatif_result& r, std::string_view part) {
  std::vector<std::pair<time_ns, time_ns>> out;
  const auto& a = r.baseline.built.graph;
  const auto& b = r.predicted.built.graph;
  REQUIRE(a.task_count() == b.task_count());
  for (graph::task_id t = 0; t < a.task_count(); ++t) {
    if (a.kind[t] == graph::task_kind::gpu_compute && a.task_name(t).find(part) != std::string_view::npos) {
      out.emplace_back(a.duration[t], b.duration[t]);
    }
  }
  return out;
}

} // namespace

TEST_CASE("map_gemm: tokens, hidden and inner widths follow the new shape", "[whatif][shape]") {
  const auto a = pipeline_shape();
  whatif::shape_config b = a;
  b.hidden = 2048, b.head_dim = 128, b.seq = 1024;
  using whatif::detail::gemm_shape;
  // QKV forward [T x h] x [h x 3h]: T = 1024 = h here, either choice gives the same dims.
  gemm_shape qkv;
  qkv.m = 1024, qkv.k = 1024, qkv.n = 3072;
  const auto q = whatif::map_gemm(qkv, a, b, false);
  REQUIRE(q);
  CHECK(q->to.m * q->to.k * q->to.n == std::int64_t{2048} * 2048 * 6144); // T' = 2048, h' = 2048, 3h' = 6144
  // FC2 weight gradient [h x T] x [T x f]: K is the tokens; the output is a weight.
  gemm_shape wgrad;
  wgrad.m = 1024, wgrad.k = 1024, wgrad.n = 4096;
  const auto w = whatif::map_gemm(wgrad, a, b, false);
  REQUIRE(w);
  CHECK(w->to.n == 4096); // FFN unchanged
  // Score GEMM: batch b·heads, [s x d] x [d x s].
  gemm_shape score;
  score.kind = gemm_shape::role::batched;
  score.batch = 32, score.m = 512, score.k = 64, score.n = 512;
  const auto s = whatif::map_gemm(score, a, b, false);
  REQUIRE(s);
  CHECK(s->to.batch == 32);
  CHECK(s->to.m == 1024);
  CHECK(s->to.k == 128);
  CHECK(s->to.n == 1024);
  // Logits outside the layers: the unknown width is the vocabulary shard, V/TP; inside a layer
  // the same GEMM does not map.
  gemm_shape logits;
  logits.m = 1024, logits.k = 1024, logits.n = 50304;
  std::int64_t vocab = 0;
  const auto l = whatif::map_gemm(logits, a, b, true, &vocab);
  REQUIRE(l);
  CHECK(vocab == 50304);
  CHECK(l->to.n == 50304);
  CHECK_FALSE(whatif::map_gemm(logits, a, b, false));
  // Grouped-query QKV: 16 heads of 64 and 4 KV heads write 1024 + 2·4·64 = 1536; with head dim
  // 128 and the KV heads kept, 2048 + 2·4·128 = 3072.
  gemm_shape gqa;
  gqa.m = 1024, gqa.k = 1024, gqa.n = 1536;
  const auto g = whatif::map_gemm(gqa, a, b, false);
  REQUIRE(g);
  CHECK(g->to.n == 3072);
  // The heads stay a multiple of the KV heads: 8 heads of 128 group over the 4, 2 heads do not.
  whatif::shape_config fewer = a;
  fewer.heads = 8, fewer.head_dim = 128;
  REQUIRE(whatif::map_gemm(gqa, a, fewer, false));
  CHECK(whatif::map_gemm(gqa, a, fewer, false)->to.n == 1024 + 2 * 4 * 128);
  fewer.heads = 2, fewer.head_dim = 512;
  CHECK_THROWS_WITH(whatif::map_gemm(gqa, a, fewer, false), Catch::Contains("4 key/value heads") && Catch::Contains("multiple of them"));
}

TEST_CASE("map_gemm: when K and the output width coincide, K follows the activation the GEMM reads", "[whatif][shape][tp]") {
  // Hidden 2048, FFN 8192, TP 4: FFN/TP = hidden = tokens = 2048, so FC1 and FC2 forward are both
  // [2048 x 2048] x [2048 x 2048]. To TP 2, FFN/TP becomes 4096.
  whatif::shape_config a;
  a.hidden = 2048, a.ffn = 8192, a.heads = 16, a.head_dim = 128, a.seq = 2048, a.micro_batch = 1, a.tp = 4;
  whatif::shape_config b = a;
  b.tp = 2;
  whatif::detail::gemm_shape fc;
  fc.m = 2048, fc.k = 2048, fc.n = 2048;
  // FC1 reads the norm's output (hidden wide): K = hidden, the output is FFN/TP wide.
  const auto fc1 = whatif::map_gemm(fc, a, b, false, nullptr, 2048.0);
  REQUIRE(fc1);
  CHECK(fc1->to.k == 2048);
  CHECK(fc1->to.n == 4096);
  // FC2 reads the activation (FFN/TP wide): K = FFN/TP, the output is hidden wide.
  const auto fc2 = whatif::map_gemm(fc, a, b, false, nullptr, 4096.0);
  REQUIRE(fc2);
  CHECK(fc2->to.k == 4096);
  CHECK(fc2->to.n == 2048);
  // Same GEMM time either way (the model is symmetric in M, N, K).
  CHECK(fc1->to.m * fc1->to.k * fc1->to.n == fc2->to.m * fc2->to.k * fc2->to.n);
}

TEST_CASE("target_shape: head dim follows hidden / heads, and invalid targets are errors", "[whatif][shape][tp]") {
  const auto a = pipeline_shape();
  whatif::shape_target t;
  t.heads = 32;
  CHECK(whatif::target_shape(a, t).head_dim == 32);
  t = {};
  t.hidden = 1000; // not a multiple of 16 heads
  CHECK_THROWS_WITH(whatif::target_shape(a, t), Catch::Contains("does not divide into 16 heads"));
  t = {};
  t.seq = 0;
  CHECK_THROWS_WITH(whatif::target_shape(a, t), Catch::Contains("--seq"));
  whatif::shape_config tp8 = a;
  tp8.tp = 8;
  t = {};
  t.tp = 3;
  CHECK_THROWS_WITH(whatif::target_shape(tp8, t), Catch::Contains("16 attention heads do not divide over 3"));
  t = {};
  t.ffn = 4100;
  CHECK_THROWS_WITH(whatif::target_shape(tp8, t), Catch::Contains("FFN width 4100 does not divide over 8"));
  // Sequence parallelism splits each CP rank's seq / cp tokens over the TP ranks.
  whatif::shape_config sp8 = tp8;
  sp8.sp = true;
  t = {};
  t.seq = 12;
  CHECK_THROWS_WITH(whatif::target_shape(sp8, t), Catch::Contains("sequence (12) is not divisible by TP x CP (8 x 1)"));
  t.cp = 2;
  t.seq = 24;  // 2 * cp divides it, but not each rank's 12 tokens over TP 8
  CHECK_THROWS_WITH(whatif::target_shape(sp8, t), Catch::Contains("sequence (24) is not divisible by TP x CP (8 x 2)"));
  t.seq = 32;
  CHECK(whatif::target_shape(sp8, t).local_seq() == 16);
  t = {};
  t.tp = 2; // from TP 1: the all-reduces are inserted (tensor_parallel.hpp), the shape is valid
  CHECK(whatif::target_shape(a, t).ffn_local() == a.ffn / 2);
}

TEST_CASE("whatif shape on the pipeline jobs: identity exact, GEMMs by the model ratio, memory-bound ops by bytes",
          "[whatif][shape]") {
  const auto job = trace::load_job({lumos_test::data_dir() / "whatif" / "pp2_1f1b"});
  // Identity through the rescaling itself (not its short cut): every ratio is exactly 1.
  {
    auto built = graph::build_graph(job);
    const auto before = built.graph.duration;
    const auto st = whatif::discover_structure(job, built);
    const auto from = whatif::traced_shape(st);
    CHECK(from == pipeline_shape());
    const auto s = whatif::rescale_shape(built, job, st, from, from, whatif::costs_of(job, st, "", nullptr));
    CHECK(s.gemm > 0);
    CHECK(s.memory > 0);
    CHECK(built.graph.duration == before);
  }
  whatif::whatif_options same;
  same.shape.hidden = 1024;
  same.shape.seq = 512;
  const auto r = whatif::run_whatif(job, same);
  for (std::size_t i = 0; i < r.baseline.ranks.size(); ++i)
    CHECK(r.predicted.ranks[i].simulated_ns == r.baseline.ranks[i].simulated_ns);

  whatif::whatif_options wide;
  wide.shape.hidden = 2048;
  wide.shape.ffn = 4096;  // kept: without it, the traced 4h FFN would follow hidden (below)
  const auto w = whatif::run_whatif(job, wide);
  // QKV [1024 x 1024] x [1024 x 3072] -> [1024 x 2048] x [2048 x 6144]: 4x the FLOPs, both
  // compute-bound on the H100 (about 9.5 us and 38 us against 5.5 us and 16 us of HBM traffic),
  // at the efficiencies of their dims.
  const double qkv = 4.0 * (eff(1024) * eff(1024) * eff(3072)) / (eff(1024) * eff(2048) * eff(6144));
  const auto q = durations(w, "tn_n_qkv");
  REQUIRE(q.size() == 2 * 4 * 2); // 2 ranks x 4 micro-batches x 2 layers
  for (const auto& [before, after] : q) CHECK(after == Approx(static_cast<double>(before) * qkv).margin(1));
  // FC1 [1024 x 1024] x [1024 x 4096] -> [1024 x 2048] x [2048 x 4096]: FFN fixed, 2x the FLOPs.
  const double fc1 = 2.0 * (eff(1024) * eff(1024) * eff(4096)) / (eff(1024) * eff(2048) * eff(4096));
  for (const auto& [before, after] : durations(w, "tn_n_fc1"))
    CHECK(after == Approx(static_cast<double>(before) * fc1).margin(1));
  // Memory-bound: the GeLU works on tokens x FFN (unchanged); the softmax on b·heads·s²
  // (unchanged); layer norms on tokens x hidden (2x; 16 us is above the 2.5 us minimum).
  for (const auto& [before, after] : durations(w, "gelu_kernel")) CHECK(after == before);
  for (const auto& [before, after] : durations(w, "softmax_warp_forward")) CHECK(after == before);
  for (const auto& [before, after] : durations(w, "layer_norm_fwd")) CHECK(after == 2 * before);
  // Backward GEMM kernels carry no Input Dims in these traces: unchanged, and counted.
  for (const auto& [before, after] : durations(w, "dgrad")) CHECK(after == before);
  bool counted = false;
  for (const auto& c : w.changes)
    counted = counted || c.text.find("compute ops whose shape did not map unchanged") != std::string::npos;
  CHECK(counted);

  // Without --ffn the traced FFN (4096 = 4h) stays 4h: FC1 -> [1024 x 2048] x [2048 x 8192], 4x
  // the FLOPs, and the GeLU on tokens x FFN twice the bytes.
  whatif::whatif_options wide4h;
  wide4h.shape.hidden = 2048;
  const auto w4 = whatif::run_whatif(job, wide4h);
  REQUIRE(w4.shape);
  CHECK(w4.shape->to.ffn == 8192);
  const double fc1_4h = 4.0 * (eff(1024) * eff(1024) * eff(4096)) / (eff(1024) * eff(2048) * eff(8192));
  for (const auto& [before, after] : durations(w4, "tn_n_fc1"))
    CHECK(after == Approx(static_cast<double>(before) * fc1_4h).margin(1));
  for (const auto& [before, after] : durations(w4, "gelu_kernel")) CHECK(after == 2 * before);

  // Sequence x2: the softmax works on b·heads·s², 4x.
  whatif::whatif_options longer;
  longer.shape.seq = 1024;
  const auto l = whatif::run_whatif(job, longer);
  for (const auto& [before, after] : durations(l, "softmax_warp_forward")) CHECK(after == 4 * before);
  REQUIRE(l.shape);
  CHECK(l.shape->predicted.memory_bytes_per_gpu > l.shape->baseline.memory_bytes_per_gpu);
}

TEST_CASE("whatif shape: bigger is never faster, and composes with --layers and --gpu", "[whatif][shape]") {
  const auto job = trace::load_job({lumos_test::data_dir() / "whatif" / "pp4_1f1b"});
  whatif::whatif_options none;
  none.shape.hidden = 1024;
  const auto base = whatif::run_whatif(job, none);
  const time_ns t0 = base.baseline.simulated_ns;
  auto run = [&](auto&& set) {
    whatif::whatif_options o;
    set(o);
    return whatif::run_whatif(job, o).predicted.simulated_ns;
  };
  CHECK(run([](auto& o) { o.shape.hidden = 2048; }) >= t0);
  CHECK(run([](auto& o) { o.shape.ffn = 8192; }) >= t0);
  CHECK(run([](auto& o) { o.shape.seq = 1024; }) >= t0);
  // A larger micro-batch keeps the global batch: 8 micro-batches of 2 sequences become 4 of 4
  // (through the pipeline model), the same tokens in fewer, larger passes. Never below half the
  // step: each pass does twice the work of the traced one's (at least as slow per token).
  whatif::whatif_options mb;
  mb.shape.micro_batch = 4;
  const auto larger = whatif::run_whatif(job, mb);
  REQUIRE(larger.pipeline);
  CHECK(larger.pipeline->predicted.shape.micro_batches == 4);
  CHECK(larger.predicted.simulated_ns >= t0 / 2);
  CHECK(run([](auto& o) { o.shape.hidden = 512; }) <= t0);
  const time_ns wide = run([](auto& o) { o.shape.hidden = 4096; });
  CHECK(wide >= run([](auto& o) { o.shape.hidden = 2048; }));
  // With the layer change: the traces' own shape and 16 layers equals 16 layers alone; a wider
  // model with twice the layers takes longer than either change alone.
  const time_ns layers = run([](auto& o) { o.layers = 16; });
  CHECK(run([](auto& o) { o.layers = 16, o.shape.hidden = 1024; }) == layers);
  const time_ns both = run([](auto& o) { o.layers = 16, o.shape.hidden = 4096; });
  CHECK(both > layers);
  CHECK(both > wide);
  // With the GPU change (shape first, then GPU): an H200 is not slower.
  CHECK(run([](auto& o) { o.shape.hidden = 4096, o.gpu = "h200-sxm"; }) <= wide);
}

TEST_CASE("whatif --tp on the Megatron TP8 trace: GEMMs per rank, TP all-reduces over the new group",
          "[whatif][tp][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto job = trace::load_job({traces / "astra-sim_megatron-gpt-tp8_8xA100"});
  whatif::whatif_options same;
  same.shape.hidden = 4096;
  same.shape.tp = 8;
  const auto r = whatif::run_whatif(job, same);
  for (std::size_t i = 0; i < r.baseline.ranks.size(); ++i)
    CHECK(r.predicted.ranks[i].simulated_ns == r.baseline.ranks[i].simulated_ns);

  whatif::whatif_options half;
  half.shape.tp = 4;
  const auto h = whatif::run_whatif(job, half);
  // Every rank's layer GEMMs hold twice the FFN and head columns: GPU time grows, by less than 2x
  // (norms, residuals and the embedding do not shrink with TP).
  std::int64_t before = 0, after = 0;
  const auto& a = h.baseline.built.graph;
  const auto& b = h.predicted.built.graph;
  for (graph::task_id t = 0; t < a.task_count(); ++t) {
    if (a.kind[t] == graph::task_kind::gpu_compute) before += a.duration[t], after += b.duration[t];
  }
  CHECK(after > before);
  CHECK(after < 2 * before);
  // The TP all-reduces keep their bytes per rank over 4 ranks instead of 8: ring factor 2·3/4
  // against 2·7/8 and 6 latency steps against 14, the fixed base the same: each is faster, and
  // by no more than the smaller of those ratios, 6/14.
  std::size_t comm = 0;
  for (graph::task_id t = 0; t < a.task_count(); ++t) {
    if (a.kind[t] != graph::task_kind::comm_complete || a.duration[t] < 100000) continue;
    ++comm;
    CHECK(b.duration[t] < a.duration[t]);
    CHECK(static_cast<double>(b.duration[t]) >= static_cast<double>(a.duration[t]) * (6.0 / 14.0) - 1);
  }
  CHECK(comm > 0);
  REQUIRE(h.shape);
  CHECK(h.shape->predicted.world == 4);
  CHECK(h.shape->predicted.memory_bytes_per_gpu > h.shape->baseline.memory_bytes_per_gpu);
  whatif::whatif_options bad;
  bad.shape.tp = 3;
  CHECK_THROWS_WITH(whatif::run_whatif(job, bad), Catch::Contains("64 attention heads do not divide over 3"));
}

TEST_CASE("shape rescaling agrees with the kernel-level cost model that synth uses", "[whatif][shape][model]") {
  // The forward GEMMs and the FlashAttention op of one layer, from model::kernel_level in two
  // shapes: the time ratio of each must be the ratio the what-if applies to the mapped dims.
  const auto hw = model::hardware_preset("h100-sxm");
  const model::kernel_level kl; // the H100 profile, as costs_of picks for an H100 trace
  whatif::shape_costs costs;
  // GPT (multi-head, GeLU) and Llama-style (4 KV heads, SwiGLU: gate, up, down).
  for (const bool llama : {false, true}) {
    auto gpt = [&](std::int64_t hidden, std::int64_t seq) {
      model::transformer m;
      m.name = "t";
      m.layers = 4, m.hidden = hidden, m.ffn = 4096, m.heads = 16, m.kv_heads = llama ? 4 : 16, m.seq = seq,
      m.vocab = 50304;
      if (llama) m.mlp = model::mlp_kind::swiglu;
      return m;
    };
    model::parallel_config par;
    par.tp = 2, par.micro_batch = 2, par.global_batch = 2;
    const auto a = pipeline_shape();
    for (const auto& [hidden, seq] : {std::pair<std::int64_t, std::int64_t>{2048, 512}, {1024, 2048}, {4096, 1024}}) {
      INFO(hidden << " " << seq << (llama ? " llama" : " gpt"));
      whatif::shape_config from = a, to = a;
      from.tp = to.tp = 2;
      to.hidden = hidden, to.head_dim = hidden / 16, to.seq = seq;
      const auto before = kl.layer(gpt(a.hidden, a.seq), par, hw);
      const auto after = kl.layer(gpt(hidden, seq), par, hw);
      REQUIRE(before.ops.size() == after.ops.size());
      std::size_t checked = 0;
      for (std::size_t i = 0; i < before.ops.size(); ++i) {
        const auto& x = before.ops[i];
        if (x.phase != model::op_phase::forward || x.recompute) continue;
        const double expected = static_cast<double>(after.ops[i].duration) / static_cast<double>(x.duration);
        if (x.kind == model::op_class::gemm) {
          whatif::detail::gemm_shape g;
          g.m = x.shape.m, g.n = x.shape.n, g.k = x.shape.k;
          const auto m = whatif::map_gemm(g, from, to, false);
          REQUIRE(m);
          CHECK(m->to.m * m->to.n * m->to.k == after.ops[i].shape.m * after.ops[i].shape.n * after.ops[i].shape.k);
          const double ratio =
              whatif::detail::gemm_model_ns(costs, 1, double(m->to.m), double(m->to.n), double(m->to.k)) /
              whatif::detail::gemm_model_ns(costs, 1, double(g.m), double(g.n), double(g.k));
          CHECK(ratio == Approx(expected).epsilon(1e-3));
          ++checked;
        } else if (x.kind == model::op_class::attention) {
          const double ratio = whatif::detail::attention_model_ns(costs, 2, 8, double(seq), double(hidden / 16)) /
                               whatif::detail::attention_model_ns(costs, 2, 8, 512, 64);
          CHECK(ratio == Approx(expected).epsilon(1e-3));
          ++checked;
        }
      }
      CHECK(checked == (llama ? 6u : 5u)); // QKV, attention, output projection, FC1 (gate, up), FC2 (down)
    }
  }
}

TEST_CASE("whatif --tp 2 from a real TP 1 trace: the collectives of Megatron's TP, with and without sequence parallelism",
          "[whatif][tp][sp]") {
  // tests/data/gpu/h100-base: a plain PyTorch GPT recorded on an H100 (8 layers, 1 micro-batch,
  // tied logits, no recomputation), whose autograd runs the logits' weight gradient before its
  // input gradient (ATen's MmBackward) and launches the embedding's backward from a copy inside
  // EmbeddingBackward0. Without SP, per layer 2 all-reduces forward and 2 backward, one after
  // the embedding lookup, one after the logits' input gradient, 3 for the cross-entropy; with
  // SP the same places reduce-scatter, and per layer 2 all-gathers forward and 4 backward, one
  // before the logits, its weight gradient and the embedding's backward.
  const auto job = trace::load_job({lumos_test::data_dir() / "gpu" / "h100-base"});
  constexpr std::size_t layers = 8;
  auto inserted = [&](bool sp) {
    whatif::whatif_options o;
    o.shape.tp = 2;
    if (sp) o.shape.sp = true;
    const auto r = whatif::run_whatif(job, o);
    std::map<std::string, std::size_t> n;
    for (const auto& ci : r.predicted.built.graph.collectives) {
      if (ci.group.starts_with("tp.folded.")) ++n[ci.kind];
    }
    CHECK(r.predicted.simulated_ns < r.baseline.simulated_ns);  // the GEMMs halve: faster, as on the H100
    return n;
  };
  const auto plain = inserted(false);
  CHECK(plain.at("allreduce") == 4 * layers + 2 + 3);
  CHECK(plain.size() == 1);
  const auto sp = inserted(true);
  CHECK(sp.at("reducescatter") == 4 * layers + 2);
  CHECK(sp.at("allgather") == 6 * layers + 3);
  CHECK(sp.at("allreduce") == 3);
}

TEST_CASE("parameter_tensor_ratio: weights and vectors follow the parameters, activations are not read as one", "[whatif][shape]") {
  // The recorded GPT's shape: hidden 2048, FFN 8192, 16 heads of 128, seq 1024, micro-batch 1.
  whatif::shape_config a;
  a.hidden = 2048, a.ffn = 8192, a.heads = 16, a.head_dim = 128, a.seq = 1024, a.micro_batch = 1, a.tp = 1;
  using dims = std::vector<std::int64_t>;
  auto ratio = [&](const whatif::shape_config& b, dims d) { return whatif::parameter_tensor_ratio(d, a, b); };
  whatif::shape_config batch = a;
  batch.micro_batch = 8;
  for (const dims& d : {dims{8192, 2048}, dims{2048, 8192}, dims{6144, 2048}, dims{2048, 2048}, dims{32768, 2048}, dims{2048}, dims{6144}}) {
    REQUIRE(ratio(batch, d));
    CHECK(*ratio(batch, d) == 1.0);  // the micro-batch leaves the weights alone
  }
  whatif::shape_config narrow = a;
  narrow.hidden = 1024, narrow.ffn = 4096, narrow.head_dim = 64;
  CHECK(*ratio(narrow, {8192, 2048}) == 0.25);  // FC1: FFN x hidden, both halved
  CHECK(*ratio(narrow, {6144, 2048}) == 0.25);  // QKV: 3 heads x d x hidden
  CHECK(*ratio(narrow, {32768, 2048}) == 0.5);  // the embedding: the vocabulary stays
  CHECK(*ratio(narrow, {2048}) == 0.5);         // a norm's weight
  whatif::shape_config tp2 = a;
  tp2.tp = 2;
  CHECK(*ratio(tp2, {6144, 2048}) == 0.5);  // a column-parallel weight's shard
  // Activations: rank 3, or a dim that is the tokens or the sequence.
  CHECK_FALSE(ratio(batch, {1, 1024, 2048}));
  CHECK_FALSE(ratio(batch, {1024, 2048}));
  CHECK_FALSE(ratio(batch, {4096, 1000}));  // no width of the model
}

TEST_CASE("whatif --micro-batch on a real autocast trace: the fp32 weights' casts stay, the activations' copies grow",
          "[whatif][shape]") {
  // tests/data/gpu/h100-mb1: a GPT recorded with micro-batch 1 under autocast, whose forward casts
  // every fp32 weight to bf16 (aten::to -> aten::copy_ of a 2-D weight) before its GEMM; its other
  // copies work on activations ([b, s, h] and wider).
  const auto job = trace::load_job({lumos_test::data_dir() / "gpu" / "h100-mb1"});
  whatif::whatif_options o;
  o.shape.micro_batch = 8;
  const auto r = whatif::run_whatif(job, o);
  REQUIRE(r.structure);
  const auto& before = r.baseline.built.graph;
  const auto& after = r.predicted.built.graph;
  REQUIRE(before.task_count() == after.task_count());
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::size_t weights = 0, activations = 0, grown = 0;
  for (const auto& c : r.structure->gpu_ops) {
    if (c.inner_op == none || c.shape_op != none || c.phase != whatif::phase_kind::forward) continue;
    const auto& tr = job.ranks[c.rank];
    if (tr.name(tr.events[c.inner_op]) != "aten::copy_") continue;
    const graph::task_id t = r.baseline.built.ranks[c.rank].task_of_event[c.op];
    if (t == graph::no_task) continue;
    const auto dims = whatif::detail::parse_dims(tr.arg_text(c.inner_op, trace::arg_key::input_dims));
    REQUIRE_FALSE(dims.empty());
    if (dims[0].size() == 2) {
      ++weights;
      CHECK(after.duration[t] == before.duration[t]);
    } else if (dims[0].size() >= 3) {
      ++activations;
      CHECK(after.duration[t] >= before.duration[t]);
      grown += after.duration[t] > before.duration[t];
    }
  }
  CHECK(weights >= 4 * 8);  // QKV, output projection, FC1 and FC2 of each of the 8 layers
  CHECK(activations > 0);
  CHECK(grown > 0);
}

TEST_CASE("parameter_ratios: 1 at the traces' own shape, and more parameters per rank with more layers or width",
          "[whatif][shape]") {
  const auto job = trace::load_job({lumos_test::data_dir() / "whatif" / "pp4_1f1b"});
  const auto built = graph::build_graph(job);
  const auto st = whatif::discover_structure(job, built);
  const auto from = whatif::traced_shape(st);
  const int layers = *st.model.layers.value;
  for (const double r : whatif::detail::parameter_ratios(job, st, from, from, false, 0, 0)) CHECK(r == 1.0);
  const std::vector<double> deeper = whatif::detail::parameter_ratios(job, st, from, from, false, 2 * layers, 0);
  whatif::shape_config wide = from;
  wide.hidden *= 2, wide.ffn *= 2, wide.head_dim *= 2;
  const std::vector<double> wider = whatif::detail::parameter_ratios(job, st, from, wide, false, 0, 0);
  REQUIRE(deeper.size() == job.ranks.size());
  for (std::size_t r = 0; r < job.ranks.size(); ++r) {
    // Twice the layers: at most twice the parameters (the embedding and head do not double).
    CHECK(deeper[r] > 1.0);
    CHECK(deeper[r] <= 2.0);
    // Twice the width: the layers' weight matrices grow 4x, the biases and norms 2x.
    CHECK(wider[r] > 2.0);
    CHECK(wider[r] <= 4.0);
  }
  // Half the stages: each rank holds twice the layers.
  for (const double r : whatif::detail::parameter_ratios(job, st, from, from, false, 0, 2)) CHECK(r > 1.0);
}

TEST_CASE("gradient_groups and tied_embedding_test: which collectives carry gradients", "[whatif][shape][dp]") {
  using whatif::group_role;
  whatif::job_structure st;
  auto group = [&](std::string name, std::vector<group_role> roles) {
    whatif::process_group pg;
    pg.name = std::move(name);
    for (const group_role r : roles) pg.roles.push_back({r, "", ""});
    st.groups.push_back(std::move(pg));
  };
  group("tp", {group_role::tp});
  group("dp", {group_role::dp});
  group("dp+tp", {group_role::dp, group_role::tp});  // a DP group that is also TP's carries activations
  group("embedding", {});
  group("pp", {group_role::pp});
  const std::map<std::string, bool> carries = whatif::detail::gradient_groups(st);
  CHECK(carries == std::map<std::string, bool>{{"tp", false}, {"dp", true}, {"dp+tp", false}, {"embedding", false}, {"pp", false}});

  // Four traced ranks on two stages; the graph's tasks name the traced rank numbers.
  trace::job job;
  job.ranks.resize(4);
  for (int r = 0; r < 4; ++r) {
    job.ranks[static_cast<std::size_t>(r)].rank = 10 + r;
    whatif::rank_structure rs;
    rs.rank = 10 + r;
    rs.stage.value = r / 2;
    st.ranks.push_back(rs);
  }
  graph::task_graph g;
  const graph::processor_id p = g.add_processor({graph::processor_kind::gpu_stream, 0, 0, 7, "stream"});
  std::vector<graph::task_id> on_rank;
  for (int r = 0; r < 4; ++r) on_rank.push_back(g.add_task({.kind = graph::task_kind::comm_complete, .processor = p, .rank = 10 + r}));
  auto collective = [&](std::string group_name, std::string kind, std::vector<graph::task_id> complete) {
    graph::collective_instance ci;
    ci.group = std::move(group_name), ci.kind = std::move(kind), ci.complete = std::move(complete);
    return ci;
  };
  const whatif::detail::tied_embedding_test tied(job, st);
  // The first and last stage's ranks in a group of no TP, DP or world role: the embedding's.
  CHECK(tied(g, collective("embedding", "allreduce", {on_rank[0], on_rank[2]})));
  CHECK_FALSE(tied(g, collective("embedding", "allreduce", {on_rank[0], on_rank[1]})));   // one stage
  CHECK_FALSE(tied(g, collective("dp", "allreduce", {on_rank[0], on_rank[2]})));          // a role
  CHECK_FALSE(tied(g, collective("pp", "sendrecv", {on_rank[1], on_rank[3]})));           // point-to-point
  CHECK(tied(g, collective("pp", "allreduce", {on_rank[1], on_rank[3]})));
}

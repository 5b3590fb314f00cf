// Structure discovery: the facts recovered from traces of known construction — the hand-made
// pipeline traces of tests/data/whatif (make_pipeline_traces.py says how each was built) and the
// shared real traces (their README says what they contain).
#include "../unit/test_support.hpp"

#include <lumos/pipeline/gpipe.hpp>
#include <lumos/pipeline/interleaved_one_f_one_b.hpp>
#include <lumos/pipeline/one_f_one_b.hpp>
#include <lumos/trace/job.hpp>
#include <lumos/whatif/structure.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>

namespace fs = std::filesystem;
using namespace lumos;

namespace {

struct discovered {
  trace::job job;
  graph::built_job built;
  whatif::job_structure st;
};

discovered discover(const fs::path& path, const whatif::structure_options& o = {}) {
  discovered d{trace::load_job({path}), {}, {}};
  d.built = graph::build_graph(d.job);
  d.st = whatif::discover_structure(d.job, d.built, o);
  return d;
}

const whatif::process_group* group_with(const whatif::job_structure& st, whatif::group_role role) {
  for (const auto& g : st.groups) {
    for (const auto& r : g.roles) {
      if (r.value == role) return &g;
    }
  }
  return nullptr;
}

// Every layer task group holds tasks of its own rank, and no task is in two groups.
void check_groups(const discovered& d, std::size_t expected) {
  CHECK(d.st.layer_groups.size() == expected);
  std::set<graph::task_id> seen;
  for (const auto& lg : d.st.layer_groups) {
    CHECK_FALSE(lg.tasks.empty());
    for (const auto t : lg.tasks) {
      REQUIRE(t < d.built.graph.task_count());
      CHECK(d.built.graph.rank[t] == lg.rank);
      CHECK(seen.insert(t).second);
    }
  }
}

}  // namespace

TEST_CASE("periodicity finds the repeated block and its count", "[whatif][structure]") {
  // prologue 9 8, five copies of 1 2 3 4 5, epilogue 7
  std::vector<std::uint32_t> seq = {9, 8};
  for (int i = 0; i < 5; ++i) seq.insert(seq.end(), {1, 2, 3, 4, 5});
  seq.push_back(7);
  const auto run = whatif::detail::find_period(seq, 2, 64);
  CHECK(run.period == 5);
  CHECK(run.repetitions == 5);
  CHECK(run.start == 2);
  CHECK_FALSE(whatif::detail::find_period(seq, 2, 64, 4).found());  // no block repeats exactly 4 times
  CHECK_FALSE(whatif::detail::find_period(std::vector<std::uint32_t>{1, 2, 3, 4}, 2, 2).found());
}

TEST_CASE("periodicity: where names allow several starts, durations choose the layers' own", "[whatif][structure]") {
  // The backward pass of a last pipeline stage: the loss's gradient (9), the output layer's input
  // and weight gradient GEMMs (1 2: named as a layer's, 20x longer) and the final norm's
  // backward (3), then four layers of 6 1 2 3 (each ending with its norm's backward). Names
  // allow starts 1 to 4; the earliest took the output layer's GEMMs into the last layer.
  std::vector<std::uint32_t> seq = {9, 1, 2, 3};
  std::vector<double> ns = {50, 400, 400, 10};
  for (int i = 0; i < 4; ++i) seq.insert(seq.end(), {6, 1, 2, 3}), ns.insert(ns.end(), {30, 20, 20, 10});
  const auto run = whatif::detail::find_period(seq, 2, 64, 4);
  REQUIRE(run.found());
  CHECK(run.period == 4);
  CHECK(run.start == 1);
  CHECK(run.slack == 3);
  // Starts 1 and 2 put a 400 us GEMM in a copy of 20 us ones; 3 and 4 both give copies of equal
  // times (the two norms' backwards take as long), and the later one is the layers'.
  CHECK(whatif::detail::align_by_duration(run, [&](std::size_t k) { return ns[k]; }) == 4);
  CHECK(whatif::detail::align_by_duration(run, [](std::size_t) { return 1.0; }) == 4);
  // A run with one start keeps it.
  const auto exact = whatif::detail::find_period(std::vector<std::uint32_t>{9, 1, 2, 1, 2, 1, 2}, 2, 3);
  CHECK((exact.start == 1 && exact.slack == 0));
  CHECK(whatif::detail::align_by_duration(exact, [](std::size_t k) { return double(k + 1); }) == 1);
}

TEST_CASE("GEMM shapes of a Megatron layer give hidden, FFN, heads, sequence", "[whatif][structure]") {
  using whatif::detail::gemm_of;
  using whatif::detail::parse_dims;
  CHECK(parse_dims("[[8192, 4096], [4096, 1536]]") == std::vector<std::vector<std::int64_t>>{{8192, 4096}, {4096, 1536}});
  // TP 8 of hidden 4096, FFN 16384, 64 heads of 64, s 2048, b 4 (shapes of the shared Megatron trace).
  std::vector<whatif::detail::gemm_shape> g;
  for (const auto& [name, dims] : std::vector<std::pair<std::string, std::string>>{
           {"aten::mm", "[[8192, 4096], [4096, 1536]]"},
           {"aten::baddbmm", "[[32, 2048, 2048], [32, 2048, 64], [32, 64, 2048], [], []]"},
           {"aten::bmm", "[[32, 2048, 2048], [32, 2048, 64]]"},
           {"aten::mm", "[[8192, 512], [512, 4096]]"},
           {"aten::mm", "[[8192, 4096], [4096, 2048]]"},
           {"aten::mm", "[[8192, 2048], [2048, 4096]]"}}) {
    const auto s = gemm_of(name, parse_dims(dims));
    REQUIRE(s);
    g.push_back(*s);
  }
  const auto l = whatif::detail::read_layer(g);
  CHECK(l.tokens == 8192);
  CHECK(l.hidden == 4096);
  CHECK(l.ffn_local == 2048);
  CHECK(l.attn_local == 512);
  CHECK(l.qkv_local == 1536);
  CHECK(l.seq == 2048);
  CHECK(l.head_dim == 64);
  CHECK(l.micro_batch == 4);
  CHECK(l.heads_local == 8);
  CHECK_FALSE(l.gated);
}

TEST_CASE("hand-made pipeline traces: stages, schedule, micro-batches, layers, shapes", "[whatif][structure]") {
  struct known {
    const char* dir;
    pipeline::schedule_kind schedule;
    int p, m, v, layers_per_chunk;
    const char* method;
  };
  using pipeline::schedule_kind;
  // The construction of each directory (make_pipeline_traces.py, CONFIGS).
  const std::vector<known> cases = {
      {"pp2_1f1b", schedule_kind::one_f_one_b, 2, 4, 1, 2, "module annotations"},
      {"pp4_1f1b", schedule_kind::one_f_one_b, 4, 8, 1, 2, "kernel periodicity"},
      {"pp4_gpipe", schedule_kind::gpipe, 4, 4, 1, 2, "kernel periodicity"},
      {"pp2_interleaved", schedule_kind::interleaved_one_f_one_b, 2, 4, 2, 2, "kernel periodicity"},
      {"pp4_interleaved", schedule_kind::interleaved_one_f_one_b, 4, 8, 2, 2, "kernel periodicity"},
  };
  for (const auto& k : cases) {
    INFO(k.dir);
    const auto d = discover(lumos_test::data_dir() / "whatif" / k.dir);
    const auto& par = d.st.parallel;
    CHECK(par.world.value == k.p);
    CHECK(par.pp.value == k.p);
    CHECK(par.tp.value == 1);
    CHECK(par.dp.value == 1);
    CHECK(par.ep.value == 1);
    REQUIRE(par.schedule.known());
    CHECK(*par.schedule.value == synth::policy_of(k.schedule));
    CHECK(par.chunks.value == k.v);
    CHECK(par.micro_batches.value == k.m);
    CHECK(d.st.layers_method.value == std::string(k.method));
    CHECK(d.st.model.layers.value == k.p * k.v * k.layers_per_chunk);
    CHECK(d.st.model.hidden.value == 1024);
    CHECK(d.st.model.ffn.value == 4096);
    CHECK(d.st.model.heads.value == 16);
    CHECK(d.st.model.head_dim.value == 64);
    CHECK(d.st.model.seq.value == 512);
    CHECK(d.st.model.micro_batch_size.value == 2);
    CHECK(d.st.model.dtype.value == std::string("bf16"));
    const pipeline::schedule_shape shape{k.p, k.m, k.v};
    for (const auto& r : d.st.ranks) {
      INFO("rank " << r.rank);
      CHECK(r.stage.value == r.rank);  // the generator puts stage s on rank s
      CHECK(r.layers_per_pass.value == k.layers_per_chunk);
      std::vector<pipeline::op> want;
      switch (k.schedule) {
        case schedule_kind::gpipe: want = pipeline::gpipe::stage_ops(shape, r.rank); break;
        case schedule_kind::one_f_one_b: want = pipeline::one_f_one_b::stage_ops(shape, r.rank); break;
        default: want = pipeline::interleaved_one_f_one_b::stage_ops(shape, r.rank); break;
      }
      REQUIRE(r.passes.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK(r.passes[i].op == want[i]);
        CHECK(r.passes[i].layers.value == k.layers_per_chunk);  // backward passes too
      }
      std::set<int> partners(r.p2p_partners.begin(), r.p2p_partners.end());
      std::set<int> expected;
      if (r.rank > 0 || k.v > 1) expected.insert((r.rank + k.p - 1) % k.p);
      if (r.rank < k.p - 1 || k.v > 1) expected.insert((r.rank + 1) % k.p);
      CHECK(partners == expected);
      const auto phases = r.phases;
      REQUIRE(phases.size() == 3);
      CHECK(phases[2].kind == whatif::phase_kind::optimizer);
      CHECK(phases[2].gpu_ops == 3);
    }
    // One group per layer of every pass of every rank (2 passes per micro-batch and chunk).
    check_groups(d, static_cast<std::size_t>(k.p * 2 * k.m * k.v * k.layers_per_chunk));
  }
}

TEST_CASE("an order several schedules share, or none gives, is reported, not guessed", "[whatif][structure]") {
  // --schedule that does not match the trace: no candidate is left.
  whatif::structure_options o;
  o.schedule = synth::policy_of<pipeline::gpipe>();
  const auto d = discover(lumos_test::data_dir() / "whatif" / "pp4_1f1b", o);
  // the user said GPipe: the fact is theirs, and the source says the trace did not show it
  REQUIRE(d.st.parallel.schedule.known());
  CHECK(d.st.parallel.schedule.source.find("given (--schedule)") != std::string::npos);
  CHECK(d.st.parallel.schedule.source.find("matches no") != std::string::npos);
  // User layers that differ from the trace's: used, with a note.
  whatif::structure_options o2;
  o2.layers = 12;
  const auto d2 = discover(lumos_test::data_dir() / "whatif" / "pp2_1f1b", o2);
  CHECK(d2.st.model.layers.value == 12);
  REQUIRE_FALSE(d2.st.notes.empty());
  CHECK(d2.st.notes.back().find("--layers 12 overrides the trace's 4") != std::string::npos);
}

#ifdef LUMOS_CLI_PATH
TEST_CASE("pipeline layouts with a stage of the embedding alone or chunks of unlike layers: the layers of every chunk summed",
          "[whatif][structure][layout][mtp]") {
  // Each layout's transformer layers (t) and multi-token-prediction block (m, a layer scope of its
  // own) are the layers the traces hold, whichever virtual stage holds none (E alone) or more.
  struct item {
    const char* model;
    int layers, pp, vp;
    const char* layout;
  };
  const char* const small = " --seq 512 --hidden 1024 --ffn 2048 --heads 8 --kv-heads 8 --vocab 8192";
  for (const item& c : {item{"llama3-8b", 2, 2, 1, "E|t*2mL"}, item{"mixtral-8x7b", 2, 2, 2, "E|t|t|mL"},
                        item{"mixtral-8x7b", 4, 2, 2, "Et|t*2|t|mL"}, item{"llama3-8b", 3, 4, 1, "E|t|t*2|mL"}}) {
    INFO(c.model << " pp " << c.pp << " vp " << c.vp << " " << c.layout);
    lumos_test::temp_dir dir;
    const std::string flags = std::string("--model ") + c.model + small + (std::string_view(c.model) == "mixtral-8x7b" ? " --expert-ffn 512" : "") +
                              " --layers " + std::to_string(c.layers) + " --mtp-layers 1 --pp " + std::to_string(c.pp) + " --vp " +
                              std::to_string(c.vp) + " --global-batch " + std::to_string(2 * c.pp) + " --pipeline-layout '" + c.layout + "'";
    REQUIRE(lumos_test::run_cli("synth " + flags + " --detail kernel --out " + (dir.path() / "job").string()).code == 0);
    const auto d = discover(dir.path() / "job");
    CHECK(d.st.parallel.chunks.value == c.vp);
    CHECK(d.st.model.layers.value == c.layers + 1);
    for (const auto& n : d.st.notes) CHECK(n.find("disagree") == std::string::npos);
    CHECK(d.st.model.hidden.value == 1024);
  }
}
#endif

TEST_CASE("every fact of the shared traces' structure is known or says why not", "[whatif][structure][traces]") {
  // The timesformer trace once said "heads: unknown []" (attention found, its micro-batch not):
  // a user told to supply --heads was not told why.
  LUMOS_REQUIRE_TRACES(traces);
  std::vector<fs::path> inputs = {traces / "astra-sim_megatron-gpt-tp8_8xA100", traces / "param_dlrm_8xV100"};
  for (const auto& e : fs::directory_iterator(traces / "tracelens_H100_B200")) inputs.push_back(e.path());
  std::sort(inputs.begin(), inputs.end());
  for (const auto& in : inputs) {
    INFO(in.string());
    const auto d = discover(in);
    const auto& md = d.st.model;
    const auto& par = d.st.parallel;
    auto explained = [](const auto& f) { return f.known() || !f.source.empty(); };
    CHECK(explained(md.layers));
    CHECK(explained(md.hidden));
    CHECK(explained(md.ffn));
    CHECK(explained(md.heads));
    CHECK(explained(md.head_dim));
    CHECK(explained(md.seq));
    CHECK(explained(md.micro_batch_size));
    CHECK(explained(md.dtype));
    CHECK(explained(par.schedule));
    CHECK(explained(par.chunks));
    CHECK(explained(par.micro_batches));
    CHECK(explained(par.tp));
    CHECK(explained(par.pp));
    CHECK(explained(par.dp));
  }
}

TEST_CASE("Megatron GPT TP8: 40 layers, hidden 4096, seq 2048, micro-batch 4, fp16, TP 8, forward only",
          "[whatif][structure][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto d = discover(traces / "astra-sim_megatron-gpt-tp8_8xA100");
  const auto& st = d.st;
  CHECK(st.parallel.world.value == 8);
  CHECK(st.parallel.tp.value == 8);
  CHECK(st.parallel.pp.value == 1);
  CHECK(st.parallel.dp.value == 1);
  // Forward only (README), but nothing in the traces marks a pass: the step reads as one forward
  // pass, which tells neither the schedule nor the micro-batches.
  CHECK_FALSE(st.parallel.schedule.known());
  CHECK_FALSE(st.parallel.micro_batches.known());
  CHECK(st.parallel.micro_batches.source.find("no forward/backward annotation") != std::string::npos);
  CHECK(st.model.layers.value == 40);
  CHECK(st.layers_method.value == std::string("kernel periodicity"));
  CHECK(st.model.hidden.value == 4096);
  CHECK(st.model.seq.value == 2048);
  CHECK(st.model.micro_batch_size.value == 4);
  CHECK(st.model.dtype.value == std::string("fp16"));
  // README: per-rank MLP 4096 → 2048 under TP 8.
  CHECK(st.model.ffn.value == 2048 * 8);
  CHECK(st.model.heads.value.has_value());
  const auto* tp = group_with(st, whatif::group_role::tp);
  REQUIRE(tp != nullptr);
  CHECK(tp->size.value == 8);
  for (const auto& r : st.ranks) {
    REQUIRE(r.passes.size() == 1);
    CHECK(r.passes[0].op.kind == pipeline::op_kind::forward);
    CHECK(r.iteration.value == std::string("ProfilerStep#3"));
    for (const auto& p : r.phases) CHECK(p.kind == whatif::phase_kind::forward);
  }
  check_groups(d, 8 * 40);
  CHECK_FALSE(st.gradients.method.known());
}

TEST_CASE("DLRM 8xV100: DP 8 with all-reduce buckets, all-to-all, no transformer layers", "[whatif][structure][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto d = discover(traces / "param_dlrm_8xV100");
  const auto& st = d.st;
  CHECK(st.parallel.world.value == 8);
  CHECK(st.parallel.dp.value == 8);
  CHECK(st.parallel.tp.value == 1);
  CHECK(st.parallel.pp.value == 1);
  CHECK(st.parallel.ep.value == 8);
  CHECK_FALSE(st.model.layers.known());
  CHECK(st.model.layers.flag == "--layers");
  CHECK_FALSE(st.model.hidden.known());
  CHECK(st.layer_groups.empty());
  // README: 3 AllReduce kernels per rank, from DDP's gradient buckets; sizes not recorded.
  CHECK(st.gradients.method.value == std::string("all-reduce"));
  CHECK(st.gradients.buckets.value == 3);
  CHECK_FALSE(st.gradients.bucket_elements.known());
  for (const auto& r : st.ranks) {
    REQUIRE(r.phases.size() == 3);  // forward, backward, optimizer (Adagrad)
    CHECK(r.phases[2].source.find("Optimizer.step#Adagrad.step") != std::string::npos);
    CHECK(r.layers_per_pass.value == 0);
  }
  // The user can still say how many layers there are; no task groups appear from nowhere.
  whatif::structure_options o;
  o.layers = 4;
  const auto with = whatif::discover_structure(d.job, d.built, o);
  CHECK(with.model.layers.value == 4);
  CHECK(with.model.layers.source == "given (--layers)");
  CHECK(with.layer_groups.empty());
}

TEST_CASE("single-rank HTA DDP trace: the data-parallel group from its collective args", "[whatif][structure][traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto d = discover(traces / "hta_testdata/nccl_parser_config/nccl_data.json.gz");
  const auto* dp = group_with(d.st, whatif::group_role::dp);
  REQUIRE(dp != nullptr);
  CHECK(dp->name == "0");
  CHECK(dp->size.value == 2);  // Group size arg; pg_config says [0, 1]
  CHECK(d.st.parallel.dp.value == 2);
  CHECK(d.st.gradients.method.value == std::string("all-reduce"));
  CHECK(d.st.gradients.bucket_elements.known());  // In msg nelems on the kernels
  CHECK(d.st.ranks[0].iteration.value == std::string("ProfilerStep#6"));
}

// The memory recipe of a recorded PyTorch eager run (examples/capture/gpt_train.py: fp32 module,
// bf16 autocast, AdamW foreach, loss on fp32 logits, untied head), and of the hand-made pipeline
// jobs (make_pipeline_traces.py: a bf16 module, AdamW's per-parameter kernels, no log-softmax).
TEST_CASE("structure: the memory recipe of a PyTorch eager step", "[structure][memory]") {
  const auto d = discover(lumos_test::data_dir() / "gpu" / "h100-base");
  const auto& mr = d.st.memory;
  REQUIRE(mr.recipe.has_value());
  CHECK(mr.optimizer.value == std::string("AdamW (torch.optim, foreach)"));
  CHECK(mr.recipe->param == 4);
  CHECK(mr.recipe->optimizer == 8);
  CHECK(mr.recipe->optimizer_temp == 4);
  CHECK(mr.recipe->residual == 4);
  CHECK(mr.recipe->gemm == 2);
  CHECK(mr.recipe->loss == 4);
  CHECK(mr.recipe->weight_copies);
  CHECK_FALSE(mr.tied_embeddings);
  CHECK(mr.embeddings.value == std::string("untied"));
  const auto p = discover(lumos_test::data_dir() / "whatif" / "pp2_1f1b");
  REQUIRE(p.st.memory.recipe.has_value());
  CHECK(p.st.memory.optimizer.value == std::string("AdamW (torch.optim, for-loop)"));
  CHECK(p.st.memory.recipe->param == 2);
  CHECK(p.st.memory.recipe->optimizer_temp == 0);
  CHECK(p.st.memory.recipe->loss == 2);  // no log-softmax kernel: the residual's type
  CHECK_FALSE(p.st.memory.recipe->weight_copies);
}

TEST_CASE("a process group that records no ranks and no size has no size (not size 0)", "[whatif][structure]") {
  // An all-reduce in forward whose "Process Group Ranks" is [] and which has no "Group size": its
  // group's role is TP and its size unknown; TP is never 0 (that would divide by zero downstream).
  const discovered d = discover(fs::path(LUMOS_TEST_DATA_DIR) / "traps" / "empty_group_ranks.json");
  const whatif::process_group* tp = group_with(d.st, whatif::group_role::tp);
  REQUIRE(tp != nullptr);
  CHECK_FALSE(tp->size.known());
  CHECK(d.st.parallel.tp.value.value_or(1) >= 1);
}

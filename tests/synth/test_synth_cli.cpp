// `lumos schedule` and `lumos predict`: output format, JSON fields, exit codes.
#ifdef LUMOS_CLI_PATH

#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

using result = lumos_test::cli_result;

result run(const std::string& args) { return lumos_test::run_cli(args); }

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

// `lumos replay` of the traces in `dir` against `lumos predict` of `job`: within 1 %.
void check_replays_to_prediction(const std::string& job, const std::filesystem::path& dir) {
  const result replayed = run("replay " + dir.string() + " --json");
  const result predicted = run("predict " + job + " --json");
  REQUIRE(replayed.code == 0);
  REQUIRE(predicted.code == 0);
  simdjson::dom::parser p1, p2;
  const auto simulated = int64_t(p1.parse(replayed.out)["job"]["simulated_ns"]);
  const auto iteration = int64_t(p2.parse(predicted.out)["iteration_ns"]);
  CHECK(std::abs(static_cast<double>(simulated - iteration)) <= 0.01 * static_cast<double>(iteration));
}

}  // namespace

TEST_CASE("lumos schedule prints one line per stage", "[cli][synth]") {
  const result r = run("schedule --kind 1f1b --stages 4 --microbatches 8");
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out ==
        "stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
        "stage 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
        "stage 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
        "stage 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n");
  const result z = run("schedule --kind zb-h1 --stages 2 --microbatches 2");
  REQUIRE(z.code == 0);
  CHECK(z.out == "stage 0: F0 F1 B0 W0 B1 W1\nstage 1: F0 B0 F1 B1 W0 W1\n");
  const result i = run("schedule --kind interleaved --stages 2 --microbatches 2 --chunks 2");
  REQUIRE(i.code == 0);
  CHECK(i.out.find("stage 0: F0.0 F1.0 F0.1 F1.1") == 0);
}

TEST_CASE("lumos schedule --costs simulates through the replay engine", "[cli][synth]") {
  const result r = run("schedule --kind 1f1b --stages 4 --microbatches 8 --costs F=1,B=2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("makespan: 33\n") != std::string::npos);  // (8 + 3)(1 + 2)
  CHECK(r.out.find("bubble fraction: 0.2727") != std::string::npos);

  const result j = run("schedule --kind interleaved --stages 4 --microbatches 8 --chunks 2 --costs F=1,B=2,W=0 --json");
  REQUIRE(j.code == 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(j.out);
  simdjson::dom::array stages = doc["stages"];
  REQUIRE(stages.size() == 4);
  simdjson::dom::array first = stages.at(0);
  CHECK(first.size() == 32);
  CHECK(std::string_view(first.at(0)) == "F0.0");
  CHECK(double(doc["makespan"]) == 28.5);  // 8·3 + 3·3/2
  CHECK(double(doc["bubble_fraction"]) == Approx(4.5 / 28.5));

  const result noc = run("schedule --kind gpipe --stages 2 --microbatches 2 --json");
  REQUIRE(noc.code == 0);
  CHECK(noc.out == "{\"stages\":[[\"F0\",\"F1\",\"B0\",\"B1\"],[\"F0\",\"F1\",\"B0\",\"B1\"]]}\n");
}

TEST_CASE("lumos schedule: bad flags and values exit 2", "[cli][synth]") {
  for (const char* args : {"schedule --kind pipedream --stages 2 --microbatches 2",
                           "schedule --kind 1f1b --stages 0 --microbatches 2",
                           "schedule --kind interleaved --stages 4 --microbatches 6",
                           "schedule --kind 1f1b --stages 2 --microbatches 2 --costs F=1",
                           "schedule --kind 1f1b --stages x --microbatches 2",
                           "schedule --kind 1f1b --stages 2"}) {
    INFO(args);
    const result r = run(args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find("lumos") == 0);
  }
  const result unknown = run("schedule --kind 1f1b --stages 2 --microbatches 2 --bogus");
  CHECK(unknown.code == 2);
  CHECK(unknown.err.find("unknown option --bogus") != std::string::npos);
}

TEST_CASE("lumos predict --json prints the documented fields", "[cli][synth]") {
  const result r = run(
      "predict --model gpt3-15b --tp 2 --pp 2 --dp 2 --seq 1024 --micro-batch 1 --global-batch 16 "
      "--recompute selective --sp on --json");
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(r.out);
  CHECK(int64_t(doc["iteration_ns"]) > 0);
  for (const char* f : {"tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "bubble_fraction"}) {
    INFO(f);
    CHECK(double(doc[f]) > 0.0);
  }
  CHECK(double(doc["mfu"]) < 1.0);
  simdjson::dom::object b = doc["breakdown"];
  int64_t sum = 0;
  for (const char* f : {"exposed_compute_ns", "overlapped_ns", "exposed_comm_ns", "other_ns"}) sum += int64_t(b[f]);
  CHECK(sum == int64_t(b["window_ns"]));
  simdjson::dom::object mem = doc["memory_bytes_per_gpu"];
  double parts = 0;
  for (const char* f : {"parameters", "gradients", "optimizer", "activations"}) {
    INFO(f);
    CHECK(double(mem[f]) > 0.0);
    parts += double(mem[f]);
  }
  CHECK(double(mem["total"]) == Approx(parts));
  CHECK(std::string_view(doc["job"]["schedule"]) == "1f1b");
  CHECK(int64_t(doc["job"]["micro_batches_per_pipeline"]) == 8);
  CHECK(!bool(doc["job"]["tp_comm_overlap"]));
  CHECK(std::string_view(doc["flops_convention"]).find("72*B*s*l*h^2") != std::string_view::npos);
}

TEST_CASE("lumos predict --forward-only counts the forward's FLOPs: 24*B*s*l*h^2*(1 + s/6h + V/12lh)", "[cli][synth]") {
  // A GPT shape (ffn 4h, as many KV heads as heads), 8 layers, seq 2048, batch 4: the FLOPs per
  // iteration follow from Megatron's closed form, written out here. They were the training
  // step's (72*...) for a forward-only step too, so MFU read 3x too high.
  const std::string args = "predict --model gpt3-15b --layers 8 --tp 2 --global-batch 4 --json";
  simdjson::dom::parser p1, p2;
  const result train = run(args);
  const result forward = run(args + " --forward-only");
  REQUIRE(train.code == 0);
  REQUIRE(forward.code == 0);
  const simdjson::dom::element a = p1.parse(train.out), b = p2.parse(forward.out);
  const auto h_int = int64_t(b["job"]["hidden"]);
  REQUIRE(int64_t(b["job"]["ffn"]) == 4 * h_int);
  REQUIRE(int64_t(b["job"]["kv_heads"]) == int64_t(b["job"]["heads"]));
  REQUIRE(int64_t(b["job"]["seq"]) == 2048);
  const double B = 4, s = 2048, l = 8, h = double(h_int), V = double(int64_t(b["job"]["vocab"]));
  const double megatron = B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  CHECK(double(a["model_flops_per_iteration"]) == Approx(72 * megatron).epsilon(1e-9));
  CHECK(double(b["model_flops_per_iteration"]) == Approx(24 * megatron).epsilon(1e-9));
  CHECK(double(b["hardware_flops_per_iteration"]) == Approx(24 * megatron).epsilon(1e-9));
  // MFU: those FLOPs over the iteration on every GPU at the dense peak.
  const double seconds = double(int64_t(b["iteration_ns"])) / 1e9;
  CHECK(double(b["mfu"]) == Approx(24 * megatron / (seconds * double(int64_t(b["job"]["gpus"])) *
                                                    double(b["peak_tflops_per_gpu"]) * 1e12)).epsilon(1e-9));
  CHECK(std::string_view(b["flops_convention"]).find("24*B*s*l*h^2") != std::string_view::npos);
  CHECK(int64_t(b["iteration_ns"]) < int64_t(a["iteration_ns"]));
}

TEST_CASE("lumos predict --tp-comm-overlap on hides TP collectives behind GEMMs", "[cli][synth]") {
  const std::string args = "predict --model gpt3-15b --tp 4 --sp on --seq 2048 --global-batch 8 --json";
  simdjson::dom::parser p1, p2;
  const result plain = run(args);
  const result overlapped = run(args + " --tp-comm-overlap on");
  REQUIRE(plain.code == 0);
  REQUIRE(overlapped.code == 0);
  const simdjson::dom::element a = p1.parse(plain.out), b = p2.parse(overlapped.out);
  CHECK(bool(b["job"]["tp_comm_overlap"]));
  CHECK(int64_t(b["iteration_ns"]) < int64_t(a["iteration_ns"]));
  CHECK(int64_t(b["breakdown"]["exposed_comm_ns"]) < int64_t(a["breakdown"]["exposed_comm_ns"]));
}

TEST_CASE("lumos predict prints a readable summary with units and conventions", "[cli][synth]") {
  const result r = run("predict --model gpt3-15b --tp 2 --pp 2 --dp 2 --seq 1024 --global-batch 16");
  REQUIRE(r.code == 0);
  for (const char* s : {"iteration", " s (", "tokens/s", "TFLOP/s per GPU", "MFU", "72*B*s*l*h^2", "pipeline bubble",
                        "breakdown     rank 0", "memory/GPU", "GiB", "ZeRO-1"}) {
    INFO(s);
    CHECK(r.out.find(s) != std::string::npos);
  }
}

TEST_CASE("lumos predict names its cost model, and the H100 preset's at-scale fraction where it applies", "[cli][synth]") {
  const std::string args = "predict --model gpt3-15b --tp 2 --pp 2 --global-batch 8";
  const result h100 = run(args);
  REQUIRE(h100.code == 0);
  CHECK(h100.out.find("costs         kernel-level model, profile h100-sxm; GEMMs and attention at 0.79 of its efficiencies") !=
        std::string::npos);
  const result a100 = run(args + " --gpu a100-sxm-80gb");
  REQUIRE(a100.code == 0);
  CHECK(a100.out.find("costs         kernel-level model, profile a100-sxm-80gb\n") != std::string::npos);
  CHECK(a100.out.find("at-scale") == std::string::npos);
  const result roof = run(args + " --cost-model roofline");
  REQUIRE(roof.code == 0);
  CHECK(roof.out.find("costs         roofline model\n") != std::string::npos);
}

TEST_CASE("lumos predict --unfold agrees with the folded run", "[cli][synth]") {
  const std::string args = "predict --model gpt3-15b --tp 2 --pp 2 --dp 2 --seq 1024 --global-batch 16 --json";
  simdjson::dom::parser p1, p2;
  const result a = run(args);
  const result b = run(args + " --unfold");
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  const auto fa = int64_t(p1.parse(a.out)["iteration_ns"]);
  const auto fb = int64_t(p2.parse(b.out)["iteration_ns"]);
  CHECK(std::abs(static_cast<double>(fa - fb)) <= 0.001 * static_cast<double>(fb));
}

TEST_CASE("lumos predict --fsdp on: ZeRO-3 in the job object, the states sharded over --dp or --hsdp", "[cli][synth][fsdp]") {
  const std::string base = "predict --model llama3-8b --layers 4 --seq 1024 --tp 1 --pp 1 --global-batch 16 --json";
  simdjson::dom::parser p1, p2, p3, p4, p5;
  const result off = run(base + " --dp 8");
  const result on = run(base + " --dp 8 --fsdp on");
  const result wide = run(base + " --dp 16 --fsdp on");
  const result hybrid = run(base + " --dp 16 --fsdp on --hsdp 8");
  const result kept = run(base + " --dp 8 --fsdp on --reshard-after-forward off");
  for (const result* r : {&off, &on, &wide, &hybrid, &kept}) {
    INFO(r->err);
    REQUIRE(r->code == 0);
  }
  const simdjson::dom::element a = p1.parse(off.out), b = p2.parse(on.out), c = p3.parse(wide.out), d = p4.parse(hybrid.out),
                               e = p5.parse(kept.out);
  CHECK(int64_t(a["job"]["zero_stage"]) == 1);
  CHECK(!bool(a["job"]["fsdp"]));
  CHECK(int64_t(b["job"]["zero_stage"]) == 3);
  CHECK(bool(b["job"]["fsdp"]));
  CHECK(int64_t(d["job"]["hsdp"]) == 8);
  CHECK(bool(b["job"]["reshard_after_forward"]));
  CHECK(!bool(e["job"]["reshard_after_forward"]));
  const auto mem = [](const simdjson::dom::element& x, const char* f) { return double(x["memory_bytes_per_gpu"][f]); };
  CHECK(mem(b, "parameters") == Approx(mem(a, "parameters") / 8));
  CHECK(mem(c, "parameters") == Approx(mem(b, "parameters") / 2));
  CHECK(mem(d, "parameters") == Approx(mem(b, "parameters")));
  CHECK(mem(b, "fsdp_buffers") > 0);
  CHECK(mem(e, "fsdp_buffers") > mem(b, "fsdp_buffers"));
  CHECK(mem(b, "total") == Approx(mem(b, "parameters") + mem(b, "gradients") + mem(b, "optimizer") + mem(b, "activations") +
                                  mem(b, "fsdp_buffers")));
  CHECK(int64_t(b["iteration_ns"]) > 0);
  // Without the backward gathers the step cannot be longer.
  CHECK(int64_t(e["iteration_ns"]) <= int64_t(b["iteration_ns"]));
  // The text names the sharding the job runs, not the distributed optimizer's.
  const std::string text = base.substr(0, base.size() - std::string(" --json").size());
  const auto parallelism = [&](const std::string& flags) {
    const std::string out = run(text + flags).out;
    const auto at = out.find("  parallelism");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(parallelism(" --dp 8").find("ZeRO-1 (distributed optimizer)") != std::string::npos);
  CHECK(parallelism(" --dp 8 --fsdp on").find(", FSDP (ZeRO-3)") != std::string::npos);
  CHECK(parallelism(" --dp 16 --fsdp on --hsdp 8").find(", HSDP (shard groups of 8, 2 replicas)") != std::string::npos);
  CHECK(parallelism(" --dp 8 --fsdp on --reshard-after-forward off").find("FSDP (ZeRO-3, parameters kept after the forward)") !=
        std::string::npos);
}

TEST_CASE("lumos predict --distributed-optimizer off: DDP, zero_stage 0, the optimizer states unsharded", "[cli][synth][ddp]") {
  const std::string base = "predict --model llama3-8b --layers 4 --seq 1024 --tp 1 --pp 1 --dp 8 --global-batch 16";
  simdjson::dom::parser p1, p2, p3;
  const result on = run(base + " --json");
  const result off = run(base + " --distributed-optimizer off --json");
  const result said_on = run(base + " --distributed-optimizer on --json");
  for (const result* r : {&on, &off, &said_on}) {
    INFO(r->err);
    REQUIRE(r->code == 0);
  }
  const simdjson::dom::element a = p1.parse(on.out), b = p2.parse(off.out), c = p3.parse(said_on.out);
  CHECK(int64_t(a["job"]["zero_stage"]) == 1);
  CHECK(int64_t(b["job"]["zero_stage"]) == 0);
  CHECK(int64_t(c["iteration_ns"]) == int64_t(a["iteration_ns"]));  // on is the default
  const auto mem = [](const simdjson::dom::element& x, const char* f) { return double(x["memory_bytes_per_gpu"][f]); };
  // Every DP rank holds all of its stage's optimizer states: 8 times the distributed optimizer's.
  CHECK(mem(b, "optimizer") == Approx(8 * mem(a, "optimizer")));
  CHECK(mem(b, "parameters") == Approx(mem(a, "parameters")));
  CHECK(mem(b, "total") > mem(a, "total"));
  CHECK(int64_t(b["iteration_ns"]) > 0);
  const std::string text = run(base + " --distributed-optimizer off").out;
  CHECK(text.find("DDP (no distributed optimizer: gradients all-reduced)") != std::string::npos);
  CHECK(text.find("Adam 12 B per parameter, not sharded") != std::string::npos);
  // A MoE job too: its experts' gradients all-reduced over their expert-data-parallel group.
  const result moe = run("predict --model qwen3-30b-a3b --layers 2 --seq 1024 --dp 4 --ep 2 --global-batch 8 --distributed-optimizer off --json");
  INFO(moe.err);
  REQUIRE(moe.code == 0);
  simdjson::dom::parser p4;
  CHECK(int64_t(p4.parse(moe.out)["job"]["zero_stage"]) == 0);
}

TEST_CASE("lumos synth --detail kernel --distributed-optimizer off: all-reduced gradients that replay to the prediction",
          "[cli][synth][ddp][roundtrip]") {
  const std::string job = "--model llama3-8b --layers 2 --seq 1024 --tp 1 --pp 1 --dp 4 --global-batch 8 --distributed-optimizer off";
  lumos_test::temp_dir dir;
  const result s = run("synth " + job + " --detail kernel --out " + dir.path().string());
  INFO(s.err);
  REQUIRE(s.code == 0);
  std::string traces;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) traces += lumos_test::read_file(f.path());
  CHECK(traces.find("AllReduce") != std::string::npos);
  CHECK(traces.find("ReduceScatter") == std::string::npos);
  check_replays_to_prediction(job, dir.path());
}

TEST_CASE("lumos synth --detail kernel --fsdp on reads back and replays to the prediction", "[cli][synth][fsdp][roundtrip]") {
  const std::string job = "--model llama3-8b --layers 4 --seq 1024 --tp 2 --pp 2 --dp 4 --global-batch 16 --fsdp on --hsdp 2";
  lumos_test::temp_dir dir;
  const result s = run("synth " + job + " --detail kernel --out " + dir.path().string());
  INFO(s.err);
  REQUIRE(s.code == 0);
  check_replays_to_prediction(job, dir.path());
}

TEST_CASE("lumos predict: bad values are one-line errors with exit code 2", "[cli][synth]") {
  for (const char* args : {"predict --tp 5",                                   // heads % tp
                           "predict --pp 5",                                   // layers % pp
                           "predict --dp 3 --global-batch 16",                 // global batch
                           "predict --tp 0", "predict --tp x", "predict --sp maybe", "predict --recompute some",
                           "predict --precision fp4", "predict --gpu tpu", "predict --model gpt5",
                           "predict --schedule pipedream", "predict --gpu a100-sxm-80gb --precision fp8",
                           "predict --vp 2", "predict --tp-comm-overlap maybe",
                           "predict --tp 2 --tp-comm-overlap on",  // overlap needs --sp on
                           "predict --fsdp maybe", "predict --dp 8 --hsdp 4",  // hsdp needs fsdp
                           "predict --dp 8 --fsdp on --hsdp 3", "predict --dp 8 --fsdp on --hsdp 0",
                           "predict --fsdp on --reshard-after-forward later",
                           "predict --dp 8 --reshard-after-forward off",  // an FSDP setting without FSDP
                           "predict --distributed-optimizer maybe", "predict --dp 8 --fsdp on --distributed-optimizer off",
                           "predict --dp 8 --overlap-param-gather on --distributed-optimizer off",
                           "predict --model llama3-8b --seq 12 --cp 2 --tp 4 --sp on"}) {  // 6 tokens per CP rank over TP 4
    INFO(args);
    const result r = run(args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("lumos") == 0);
  }
  const result heads = run("predict --tp 5");
  CHECK(heads.err.find("heads (96) is not divisible by tp (5)") != std::string::npos);
  CHECK(run("predict --dp 8 --reshard-after-forward off").err.find("--reshard-after-forward is a setting of FSDP: it needs --fsdp on") !=
        std::string::npos);
  CHECK(run("predict --dp 8 --fsdp on --distributed-optimizer off").err.find("--fsdp on is ZeRO-3") != std::string::npos);
  CHECK(run("predict --dp 8 --overlap-param-gather on --distributed-optimizer off").err.find("it needs --distributed-optimizer on") !=
        std::string::npos);
  CHECK(run("predict --model llama3-8b --seq 12 --cp 2 --tp 4 --sp on").err.find("seq (12) is not divisible by tp * cp (4 * 2 = 8)") !=
        std::string::npos);
  const result unknown = run("predict --bogus 3");
  CHECK(unknown.code == 2);
  CHECK(unknown.err.find("unknown option --bogus") != std::string::npos);
  const result directory = run("predict --profile " + std::filesystem::temp_directory_path().string());
  CHECK(directory.code == 2);
  CHECK(lines(directory.err) == 1);
  CHECK(directory.err.find("is a directory: give the JSON file `lumos calibrate -o` wrote") != std::string::npos);
}

TEST_CASE("lumos predict --cp: the job object, the world size and the errors", "[cli][synth][cp]") {
  const std::string job = "predict --model llama3-8b --layers 4 --seq 4096 --tp 2 --pp 2 --cp 2 --dp 2 --global-batch 8 --sp on";
  const result r = run(job + " --json");
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.parse(r.out);
  CHECK(int64_t(doc["job"]["cp"]) == 2);
  CHECK(std::string_view(doc["job"]["cp_comm"]) == "p2p");
  CHECK(int64_t(doc["job"]["gpus"]) == 16);
  CHECK(int64_t(doc["job"]["micro_batches_per_pipeline"]) == 4);  // 8 sequences over dp 2
  CHECK(double(doc["memory_bytes_per_gpu"]["cp_buffers"]) > 0.0);
  // The context-parallel job is faster than the same job on half the GPUs without CP.
  simdjson::dom::parser p2;
  const result without = run("predict --model llama3-8b --layers 4 --seq 4096 --tp 2 --pp 2 --dp 2 --global-batch 8 --sp on --json");
  REQUIRE(without.code == 0);
  CHECK(int64_t(doc["iteration_ns"]) < int64_t(p2.parse(without.out)["iteration_ns"]));
  const result text = run(job);
  CHECK(text.out.find("x CP 2 (p2p)") != std::string::npos);
  for (const char* bad : {" --cp 0", " --cp 3", " --cp-comm ring", " --seq 4094",  // 2 * cp divides seq
                          " --cp 1 --cp-comm allgather"}) {                     // no CP: no exchange to choose
    INFO(bad);
    const result e = run(job + bad);
    CHECK(e.code == 2);
    CHECK(lines(e.err) == 1);
  }
  // whatif takes --cp too: what fails here is the missing traces, named in the error.
  const result whatif = run("whatif nowhere --cp 2");
  CHECK(whatif.code == 2);
  CHECK(whatif.err.find("nowhere") != std::string::npos);
}

TEST_CASE("synth --detail kernel --cp: the written job replays to predict's iteration", "[cli][synth][cp]") {
  for (const char* comm : {"p2p", "allgather"}) {
    INFO(comm);
    const std::string job = std::string("--model llama3-8b --layers 4 --seq 4096 --tp 2 --pp 2 --cp 2 --dp 2 --global-batch 8 --sp on --cp-comm ") + comm;
    lumos_test::temp_dir dir;
    const result s = run("synth " + job + " --detail kernel --out " + dir.path().string() + " --json");
    REQUIRE(s.code == 0);
    const result replay = run("replay " + dir.path().string() + " --json");
    REQUIRE(replay.code == 0);
    const result predict = run("predict " + job + " --json");
    REQUIRE(predict.code == 0);
    simdjson::dom::parser a, b, c;
    const int64_t synthesised = int64_t(a.parse(s.out)["iteration_ns"]);
    const simdjson::dom::element replayed = b.parse(replay.out);
    CHECK(int64_t(replayed["job"]["simulated_ns"]) == synthesised);
    CHECK(int64_t(replayed["causality"]["violations"]) == 0);  // no op starts before the one before it on its stream ends
    CHECK(int64_t(c.parse(predict.out)["iteration_ns"]) == synthesised);
  }
}

TEST_CASE("predict of Llama 3.1 405B with CP 2 (Megatron-Bridge's H100 row) runs and is deterministic", "[cli][synth][cp]") {
  const std::string row = " --tp 8 --pp 8 --cp 2 --dp 8 --vp 8 --micro-batch 1 --global-batch 512 --seq 8192 --precision fp8 --gpu h100-sxm --json";
  const result a = run("predict --model llama3.1-405b" + row);
  const result b = run("predict --model llama3.1-405b" + row);
  const result old = run("predict --model llama3-405b" + row);  // the same shape under its first name
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  REQUIRE(old.code == 0);
  simdjson::dom::parser pa, pb, po;
  const simdjson::dom::element x = pa.parse(a.out), y = pb.parse(b.out), z = po.parse(old.out);
  CHECK(std::string_view(x["job"]["model"]) == "llama3.1-405b");
  CHECK(int64_t(x["job"]["gpus"]) == 1024);
  CHECK(int64_t(x["iteration_ns"]) > 0);
  CHECK(int64_t(x["iteration_ns"]) == int64_t(y["iteration_ns"]));
  CHECK(int64_t(x["iteration_ns"]) == int64_t(z["iteration_ns"]));
  CHECK(double(x["memory_bytes_per_gpu"]["total"]) > 0.0);
  CHECK(double(x["memory_bytes_per_gpu"]["total"]) == double(y["memory_bytes_per_gpu"]["total"]));
}

#endif  // LUMOS_CLI_PATH

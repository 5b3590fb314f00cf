// `lumos sweep`: output identical for any thread count (stdout, CSV, HTML page), JSON counts, errors.
#ifdef LUMOS_CLI_PATH

#include "../unit/test_support.hpp"

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <algorithm>
#include <string>

namespace {

using result = lumos_test::cli_result;

// A small space: llama3-8b on 16 GPUs (every reason but gpu-count shows up).
const std::string space =
    "sweep --model llama3-8b --gpus 16 --global-batch 64 --tp 1,2,4,8,16 --pp 1,2,4,8 --vp 1,2 --micro-batch 1,2,3 "
    "--schedule 1f1b,interleaved --recompute none,full --sp off,on";

}  // namespace

TEST_CASE("lumos sweep: the same stdout, CSV and HTML page for 1 and 3 threads", "[sweep][cli]") {
  lumos_test::temp_dir dir;
  const auto a = dir.path() / "one.csv";
  const auto b = dir.path() / "three.csv";
  const auto page_a = dir.path() / "one.html";
  const auto page_b = dir.path() / "three.html";
  const result one = lumos_test::run_cli(space + " --threads 1 --csv " + a.string() + " --report " + page_a.string());
  const result three = lumos_test::run_cli(space + " --threads 3 --csv " + b.string() + " --report " + page_b.string());
  INFO(one.err);
  REQUIRE(one.code == 0);
  REQUIRE(three.code == 0);
  CHECK(one.out == three.out);
  const std::string csv = lumos_test::read_file(a);
  CHECK(csv == lumos_test::read_file(b));
  const std::string page = lumos_test::read_file(page_a);
  CHECK(page == lumos_test::read_file(page_b));
  CHECK(page.find("<table id=\"pareto\">") != std::string::npos);
  CHECK(one.out.find("top 10 by iteration time") != std::string::npos);
  CHECK(one.out.find("rejected by reason:") != std::string::npos);
  // One CSV row per configuration plus the header; the count the text reports.
  const auto rows = static_cast<std::size_t>(std::count(csv.begin(), csv.end(), '\n'));
  CHECK(one.out.find(std::to_string(rows - 1) + " configurations") != std::string::npos);
}

TEST_CASE("lumos sweep --json: every configuration, counts per reason that add up", "[sweep][cli]") {
  const result r = lumos_test::run_cli(space + " --json --top 3");
  INFO(r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.parse(r.out);
  const std::int64_t total = doc["configurations"].get_int64().value();
  std::int64_t sum = doc["accepted"].get_int64().value();
  for (const auto [key, value] : doc["rejected"].get_object()) sum += value.get_int64().value();
  CHECK(sum == total);
  CHECK(static_cast<std::int64_t>(doc["results"].get_array().size()) == total);
  CHECK(doc["top"].get_array().size() == 3);
  CHECK(doc["rejected"]["tp-divisibility"].get_int64().value() > 0);  // tp 16 > 8 KV heads
  // The best configuration is the fastest accepted one.
  const std::int64_t best = doc["top"].at(0).get_int64().value();
  const std::int64_t best_ns = doc["results"].at(static_cast<std::size_t>(best))["iteration_ns"].get_int64().value();
  for (const auto item : doc["results"].get_array()) {
    if (std::string_view(item["status"].get_string()) == "ok") CHECK(item["iteration_ns"].get_int64().value() >= best_ns);
  }
}

TEST_CASE("lumos sweep --fsdp on,off: FSDP is a dimension of the space", "[sweep][cli][fsdp]") {
  const std::string args = "sweep --model llama3-8b --layers 4 --seq 1024 --gpus 8 --global-batch 16 --tp 1,2 --pp 1 "
                           "--micro-batch 1 --recompute none --sp off --json";
  simdjson::dom::parser p1, p2;
  const result plain = lumos_test::run_cli(args);
  const result both = lumos_test::run_cli(args + " --fsdp off,on --hsdp 2");
  INFO(both.err);
  REQUIRE(plain.code == 0);
  REQUIRE(both.code == 0);
  const simdjson::dom::element a = p1.parse(plain.out), b = p2.parse(both.out);
  CHECK(b["configurations"].get_int64().value() == 2 * a["configurations"].get_int64().value());
  CHECK(b["problem"]["hsdp"].get_int64().value() == 2);
  std::size_t on = 0;
  for (const auto item : b["results"].get_array()) {
    const bool fsdp = item["fsdp"].get_bool().value();
    on += fsdp ? 1 : 0;
    if (std::string_view(item["status"].get_string()) != "ok") continue;
    CHECK(item["iteration_ns"].get_int64().value() > 0);
  }
  CHECK(on == 2);
  // Each configuration with FSDP follows the same one without (ZeRO-1), and sharding over all
  // 8 ranks holds less than the distributed optimizer (HSDP 2 above need not).
  simdjson::dom::parser p3;
  const result full = lumos_test::run_cli(args + " --fsdp off,on");
  REQUIRE(full.code == 0);
  const auto results = p3.parse(full.out)["results"].get_array();
  CHECK(!results.at(0)["fsdp"].get_bool().value());
  CHECK(results.at(1)["fsdp"].get_bool().value());
  CHECK(results.at(1)["memory_bytes_per_gpu"].get_double().value() < results.at(0)["memory_bytes_per_gpu"].get_double().value());
  // The table names the column only when FSDP is searched.
  CHECK(lumos_test::run_cli(args.substr(0, args.size() - 7) + " --fsdp off,on").out.find("fsdp") != std::string::npos);
  CHECK(lumos_test::run_cli(args.substr(0, args.size() - 7)).out.find("fsdp") == std::string::npos);
}

TEST_CASE("lumos sweep --distributed-optimizer off: DDP for the configurations without FSDP, as predict's", "[sweep][cli][ddp]") {
  const std::string args = "sweep --model llama3-8b --layers 4 --seq 1024 --gpus 8 --global-batch 16 --tp 1,2 --pp 1 "
                           "--micro-batch 1 --recompute none --sp off --json";
  simdjson::dom::parser p1, p2, p3;
  const result on = lumos_test::run_cli(args);
  const result off = lumos_test::run_cli(args + " --distributed-optimizer off --fsdp off,on");
  INFO(off.err);
  REQUIRE(on.code == 0);
  REQUIRE(off.code == 0);
  const simdjson::dom::element a = p1.parse(on.out), b = p2.parse(off.out);
  CHECK(a["problem"]["zero_stage"].get_int64().value() == 1);
  CHECK(b["problem"]["zero_stage"].get_int64().value() == 0);
  // Results 0 and 2 of `off` are tp 1 and 2 without FSDP: the optimizer states of DP 8 and 4
  // unsharded, more memory than the same configurations of `on`.
  const auto ra = a["results"].get_array(), rb = b["results"].get_array();
  REQUIRE(rb.size() == 2 * ra.size());
  for (std::size_t i = 0; i < ra.size(); ++i) {
    CHECK(!rb.at(2 * i)["fsdp"].get_bool().value());
    CHECK(rb.at(2 * i)["memory_bytes_per_gpu"].get_double().value() > ra.at(i)["memory_bytes_per_gpu"].get_double().value());
  }
  // The first is `lumos predict --distributed-optimizer off` of its configuration.
  const result predicted = lumos_test::run_cli("predict --model llama3-8b --layers 4 --seq 1024 --dp 8 --global-batch 16 "
                                               "--distributed-optimizer off --json");
  REQUIRE(predicted.code == 0);
  CHECK(rb.at(0)["iteration_ns"].get_int64().value() == p3.parse(predicted.out)["iteration_ns"].get_int64().value());
}

TEST_CASE("lumos sweep: bad flags are one-line errors with exit code 2", "[sweep][cli]") {
  for (const char* args : {"sweep", "sweep --gpus 0", "sweep --gpus 8 --tp 1,,2", "sweep --gpus 8 --tp x",
                           "sweep --gpus 8 --recompute some", "sweep --gpus 8 --sp maybe", "sweep --gpus 8 --threads 0",
                           "sweep --gpus 8 --schedule fast", "sweep --gpus 8 --memory-margin 1.5",
                           "sweep --gpus 8 --tp 3 --pp 1", "sweep --gpus 8 --bogus", "sweep --gpus 8 --fsdp maybe",
                           "sweep --gpus 8 --precision fp9", "sweep --gpus 8 --precision bf16,", "sweep --gpus 8 --precision fp8 --gpu a100-sxm-80gb",
                           // FSDP settings without FSDP in the space, experts on a dense model: errors as predict's
                           "sweep --gpus 8 --hsdp 2", "sweep --gpus 8 --fsdp off --reshard-after-forward off",
                           "sweep --gpus 8 --ep 1,2", "sweep --gpus 8 --expert-tp 2", "sweep --gpus 8 --cp-comm allgather",
                           "sweep --gpus 8 --model qwen3-30b-a3b --fsdp on", "sweep --gpus 8 --model qwen3-30b-a3b --ep 3",
                           // DDP: not with FSDP alone (ZeRO-3), nor with the parameter gathers it does not make
                           "sweep --gpus 8 --distributed-optimizer maybe", "sweep --gpus 8 --fsdp on --distributed-optimizer off",
                           "sweep --gpus 8 --overlap-param-gather on --distributed-optimizer off"}) {
    const result r = lumos_test::run_cli(args);
    INFO(args << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("lumos", 0) == 0);
  }
  // An EP that divides no configuration's ranks is named as such, not as a GPU count.
  CHECK(lumos_test::run_cli("sweep --gpus 8 --model qwen3-30b-a3b --ep 3").err.find("no --ep of the list") != std::string::npos);
}

TEST_CASE("lumos sweep --cp: context parallelism joins the space, a cp the sequence cannot split is rejected", "[sweep][cli][cp]") {
  const result r = lumos_test::run_cli(
      "sweep --model llama3-8b --gpus 16 --seq 4100 --global-batch 16 --tp 2 --pp 1 --cp 1,2,4 --micro-batch 1 "
      "--recompute none --sp on --json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.parse(r.out);
  CHECK(doc["configurations"].get_int64().value() == 3);
  std::int64_t seen = 0;
  for (const auto item : doc["results"].get_array()) {
    const std::int64_t cp = item["cp"].error() ? 1 : item["cp"].get_int64().value();
    const std::int64_t dp = item["dp"].get_int64().value();
    CHECK(2 * cp * dp == 16);  // tp * pp * cp * dp
    const bool ok = std::string_view(item["status"].get_string()) == "ok";
    CHECK(ok == (cp != 4));  // 4100 splits into 2 * 2 chunks, not into 2 * 4
    seen |= std::int64_t{1} << cp;
  }
  CHECK(seen == (2 | 4 | 16));
}

TEST_CASE("lumos sweep --precision bf16,fp8: one ranking over both, rows that say theirs", "[sweep][cli][precision]") {
  const std::string args = "sweep --model llama3-8b --layers 4 --seq 1024 --gpus 8 --global-batch 16 --tp 1,2 --pp 1 "
                           "--micro-batch 1 --recompute none --sp off";
  lumos_test::temp_dir dir;
  const auto csv_one = dir.path() / "one.csv", csv_both = dir.path() / "both.csv";
  const result one = lumos_test::run_cli(args + " --json --csv " + csv_one.string());
  const result both = lumos_test::run_cli(args + " --precision bf16,fp8 --json --csv " + csv_both.string());
  INFO(both.err);
  REQUIRE(one.code == 0);
  REQUIRE(both.code == 0);
  simdjson::dom::parser p1, p2;
  const simdjson::dom::element a = p1.parse(one.out), b = p2.parse(both.out);
  CHECK(std::string_view(a["problem"]["precision"].get_string()) == "bf16");
  CHECK(std::string_view(b["problem"]["precision"].get_string()) == "bf16,fp8");
  const auto ra = a["results"].get_array(), rb = b["results"].get_array();
  REQUIRE(rb.size() == 2 * ra.size());
  // Each configuration in bf16, as the single-precision sweep predicts it, then in fp8.
  bool fp8_ok = false;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    CHECK(std::string_view(rb.at(2 * i)["precision"].get_string()) == "bf16");
    CHECK(std::string_view(rb.at(2 * i + 1)["precision"].get_string()) == "fp8");
    CHECK(rb.at(2 * i)["tp"].get_int64().value() == rb.at(2 * i + 1)["tp"].get_int64().value());
    if (std::string_view(ra.at(i)["status"].get_string()) != "ok") continue;
    CHECK(rb.at(2 * i)["iteration_ns"].get_int64().value() == ra.at(i)["iteration_ns"].get_int64().value());
    fp8_ok = fp8_ok || std::string_view(rb.at(2 * i + 1)["status"].get_string()) == "ok";
  }
  CHECK(fp8_ok);
  // One ranking over both precisions: fastest first, the first no slower than any accepted row.
  std::int64_t last = 0;
  for (const auto i : b["top"].get_array()) {
    const std::int64_t ns = rb.at(static_cast<std::size_t>(i.get_int64().value()))["iteration_ns"].get_int64().value();
    CHECK(ns >= last);
    last = ns;
  }
  const std::int64_t best_ns = rb.at(static_cast<std::size_t>(b["top"].at(0).get_int64().value()))["iteration_ns"].get_int64().value();
  for (const auto item : rb) {
    if (std::string_view(item["status"].get_string()) == "ok") CHECK(item["iteration_ns"].get_int64().value() >= best_ns);
  }
  // The CSV and the table name the precision only when several are searched.
  CHECK(lumos_test::read_file(csv_both).find(",sp,precision,status,") != std::string::npos);
  CHECK(lumos_test::read_file(csv_one).find("precision") == std::string::npos);
  CHECK(lumos_test::run_cli(args + " --precision bf16,fp8").out.find(" prec ") != std::string::npos);
  CHECK(lumos_test::run_cli(args).out.find(" prec ") == std::string::npos);
}

TEST_CASE("lumos sweep --precision bf16,fp8 on an A100: fp8 rejected per configuration, bf16 ranked", "[sweep][cli][precision]") {
  const result r = lumos_test::run_cli(
      "sweep --model llama3-8b --layers 4 --seq 1024 --gpus 8 --global-batch 16 --tp 1,2 --pp 1 --micro-batch 1 "
      "--recompute none --sp off --gpu a100-sxm-80gb --precision bf16,fp8 --json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.parse(r.out);
  const std::int64_t total = doc["configurations"].get_int64().value();
  CHECK(doc["rejected"]["precision"].get_int64().value() == total / 2);
  CHECK(doc["accepted"].get_int64().value() > 0);
  for (const auto item : doc["results"].get_array()) {
    const bool fp8 = std::string_view(item["precision"].get_string()) == "fp8";
    CHECK((std::string_view(item["reason"].get_string()) == "precision") == fp8);
  }
}

#endif  // LUMOS_CLI_PATH

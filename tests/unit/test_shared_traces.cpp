// Every shared real trace, read by the reader and by an independent path in this test:
// whole-file zlib decompression + the simdjson DOM API (counts, steps) and a whole-document
// raw-token pass with its own decimal conversion (exact timestamps).
#include "test_support.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/trace/reader.hpp>
#include <lumos/trace/summary.hpp>

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <cmath>
#include <map>

namespace fs = std::filesystem;
using namespace lumos::trace;

namespace {

std::vector<fs::path> shared_trace_files(const fs::path& root) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    // execution_traces/ hold PyTorch execution traces (Chakra), not Kineto traces.
    if (e.is_regular_file() && is_trace_file_name(e.path()) &&
        e.path().string().find("execution_traces") == std::string::npos) {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Microsecond text to ns by splitting at the decimal point (the format Kineto writes: no
// exponent, at most three decimals). Deliberately simpler than lumos::parse_microseconds.
std::int64_t simple_us_to_ns(std::string_view t) {
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n' || t.back() == '\r' || t.back() == '\t')) t.remove_suffix(1);
  const bool neg = !t.empty() && t[0] == '-';
  if (neg) t.remove_prefix(1);
  const auto dot = t.find('.');
  const std::string whole(t.substr(0, dot));
  std::string frac = dot == std::string_view::npos ? "" : std::string(t.substr(dot + 1));
  REQUIRE(frac.size() <= 3);
  frac.resize(3, '0');
  const std::int64_t v = std::stoll(whole) * 1000 + std::stoll(frac);
  return neg ? -v : v;
}

struct independent {
  std::uint64_t entries = 0;
  std::map<std::string, std::uint64_t> by_category;
  std::map<std::string, std::int64_t> step_dur_ns;  // ProfilerStep#N (CPU annotation) -> dur
  std::vector<std::pair<std::int64_t, std::int64_t>> sampled;  // (ts, dur) of every 97th X event
};

independent read_independently(const std::string& json) {
  independent r;
  simdjson::dom::parser dom;
  simdjson::dom::element root = dom.parse(json);
  for (simdjson::dom::element ev : root["traceEvents"].get_array()) {
    ++r.entries;
    std::string_view cat;
    if (ev["cat"].get(cat) == simdjson::SUCCESS) ++r.by_category[std::string(cat)];
    std::string_view name;
    if (ev["name"].get(name) == simdjson::SUCCESS && name.starts_with("ProfilerStep#") && cat == "user_annotation") {
      double dur = 0;
      REQUIRE(ev["dur"].get(dur) == simdjson::SUCCESS);
      r.step_dur_ns[std::string(name)] = std::llround(dur * 1000.0);
    }
  }
  // Exact timestamps from the number text, through the on-demand API over the whole document.
  simdjson::ondemand::parser od;
  simdjson::padded_string padded(json);
  auto doc = od.iterate(padded);
  std::size_t x_index = 0;
  for (auto ev : doc["traceEvents"].get_array()) {
    simdjson::ondemand::object obj = ev.get_object();
    std::string_view ph, ts, dur;
    for (auto field : obj) {
      const std::string_view key = field.unescaped_key();
      if (key == "ph") ph = field.value().get_string();
      else if (key == "ts") ts = field.value().raw_json_token();
      else if (key == "dur") dur = field.value().raw_json_token();
    }
    if (ph != "X") continue;
    if (x_index++ % 97 == 0) r.sampled.emplace_back(simple_us_to_ns(ts), simple_us_to_ns(dur));
  }
  return r;
}

}  // namespace

TEST_CASE("every shared trace reads exactly as an independent parse says", "[traces]") {
  LUMOS_REQUIRE_TRACES(traces);
  const auto files = shared_trace_files(traces);
  REQUIRE(files.size() >= 20);
  for (const auto& file : files) {
    INFO(file.string());
    const rank_trace t = read_trace(file);
    const std::string json = lumos_test::gunzip(lumos_test::read_file(file));
    const independent ref = read_independently(json);

    CHECK(t.entries == ref.entries);
    std::map<std::string, std::uint64_t> by_category;
    for (const auto& [cat, n] : summarize(t).by_category) by_category[cat] = n;
    CHECK(by_category == ref.by_category);

    std::map<std::string, std::int64_t> steps;
    for (const auto& s : profiler_steps(t)) steps[s.name] = s.dur;
    CHECK(steps == ref.step_dur_ns);

    std::vector<std::pair<std::int64_t, std::int64_t>> sampled;
    std::size_t x_index = 0;
    for (const auto& e : t.events) {
      if (e.ph != phase::complete) continue;
      if (x_index++ % 97 == 0) sampled.emplace_back(e.ts, e.dur);
    }
    CHECK(sampled == ref.sampled);

    // Storage budget: 96 bytes per event on average, names and args included.
    CHECK(t.memory_bytes() <= 96 * t.entries + 64 * 1024);
  }
}

TEST_CASE("the multi-rank shared jobs load as whole jobs", "[traces][job]") {
  LUMOS_REQUIRE_TRACES(traces);
  const job megatron = load_job({traces / "astra-sim_megatron-gpt-tp8_8xA100"});
  REQUIRE(megatron.ranks.size() == 8);
  for (int r = 0; r < 8; ++r) {
    CHECK(megatron.ranks[static_cast<std::size_t>(r)].rank == r);
    CHECK(megatron.ranks[static_cast<std::size_t>(r)].world_size == 8);
    CHECK(profiler_steps(megatron.ranks[static_cast<std::size_t>(r)]).size() == 1);
  }
  const job dlrm = load_job({traces / "param_dlrm_8xV100"});
  REQUIRE(dlrm.ranks.size() == 8);
  for (const auto& r : dlrm.ranks) {
    const auto s = summarize(r);
    CHECK(s.comm_ops == 8);  // 5 all-to-all (SendRecv) + 3 all-reduce per rank
    CHECK(s.device == "Tesla V100-SXM2-32GB");
  }
}

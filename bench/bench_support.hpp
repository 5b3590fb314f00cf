#pragma once
// Shared benchmark plumbing: finding traces, and a reporter that prints each benchmark's
// throughput as a ratio against its baseline measured in the same run.

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace lumos_bench {

inline std::filesystem::path trace_dir() {
  const char* env = std::getenv("LUMOS_TRACE_DIR");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : std::filesystem::path(LUMOS_DEFAULT_TRACE_DIR);
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Console output plus, at the end, "NAME: X.XX x BASELINE" for every pair registered with
/// `compare` (both sides measured in this run, so machine noise affects them alike).
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void compare(std::string name, std::string baseline, std::string counter) {
    pairs_.push_back({std::move(name), std::move(baseline), std::move(counter)});
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration && r.aggregate_name != "median") continue;
      std::string name = r.benchmark_name();
      if (const auto cut = name.find("_median"); cut != std::string::npos) name.resize(cut);
      for (const auto& [key, counter] : r.counters) values_[name][key] = counter.value;
      values_[name]["real_time_ns"] = r.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    if (pairs_.empty()) return;
    std::printf("\nThroughput relative to the baseline measured in the same run:\n");
    for (const auto& p : pairs_) {
      const auto a = values_.find(p.name);
      const auto b = values_.find(p.baseline);
      if (a == values_.end() || b == values_.end()) continue;
      const double va = a->second[p.counter];
      const double vb = b->second[p.counter];
      if (vb <= 0) continue;
      std::printf("  %-60s %8.3g %s = %5.2f x %s\n", p.name.c_str(), va, p.counter.c_str(), va / vb, p.baseline.c_str());
    }
  }

 private:
  struct pair_spec {
    std::string name, baseline, counter;
  };
  std::vector<pair_spec> pairs_;
  std::map<std::string, std::map<std::string, double>> values_;
};

}  // namespace lumos_bench

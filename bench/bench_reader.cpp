// Reader throughput on the largest shared traces, in bytes of uncompressed JSON per second.
// The shared .json.gz files are decompressed once into a temporary directory, then:
//   BM_read/<trace>               lumos::trace::read_trace on the .json file (streamed)
//   BM_read_baseline/<trace>      simdjson::padded_string::load of the same file, then a bare
//                                 simdjson on-demand pass that reads every field of every event
//                                 (and of its args)
//   BM_read_mem/<trace>           the reader over the JSON text already in memory
//   BM_read_baseline_mem/<trace>  the baseline pass over the text already in memory (and padded)
//   BM_read_gz/<trace>            the reader on the original .json.gz file (inflate + parse)
//   BM_inflate_isal|zlib/...      the inflaters alone, for the choice of decompressor
#include "bench_support.hpp"

#include <lumos/detail/byte_source.hpp>
#include <lumos/trace/reader.hpp>

#include <simdjson.h>
#include <zlib.h>

#include <fstream>
#include <unistd.h>

namespace {

namespace od = simdjson::ondemand;

// Inflates with zlib into a reused 1 MiB buffer (like the reader's streaming), calling `sink`
// on every piece.
template <class Sink>
void inflate_zlib(const std::string& gz, std::vector<char>& buf, Sink&& sink) {
  z_stream z{};
  inflateInit2(&z, 15 + 32);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    sink(buf.data(), buf.size() - z.avail_out);
  }
  inflateEnd(&z);
}

std::string inflate_zlib(const std::string& gz) {
  std::string out;
  std::vector<char> buf(1 << 20);
  inflate_zlib(gz, buf, [&](const char* p, std::size_t n) { out.append(p, n); });
  return out;
}

// Reads a value the way any consumer of the JSON must: strings through get_string (unescaped),
// numbers through get_double, objects field by field; arrays (Input Dims and the like) are
// skipped by the parser. This is "a bare simdjson on-demand pass that visits every field".
std::size_t visit(od::value v) {
  od::json_type t{};
  if (v.type().get(t) != simdjson::SUCCESS) return 0;
  switch (t) {
    case od::json_type::object: {
      std::size_t n = 0;
      for (auto f : v.get_object()) {
        od::field field;
        if (std::move(f).get(field) != simdjson::SUCCESS) break;
        n += static_cast<std::size_t>(field.key().raw()[0]);
        n += visit(field.value());
      }
      return n;
    }
    case od::json_type::string: {
      std::string_view s;
      return v.get_string().get(s) == simdjson::SUCCESS ? s.size() : 0;
    }
    case od::json_type::number: {
      double d = 0;
      return v.get_double().get(d) == simdjson::SUCCESS ? static_cast<std::size_t>(d != 0) : 0;
    }
    default:
      return 1;
  }
}

std::size_t baseline_pass(od::parser& parser, const simdjson::padded_string& padded) {
  std::size_t n = 0;
  od::document doc = parser.iterate(padded);
  for (auto field : doc.get_object()) {
    if (field.unescaped_key().value() != "traceEvents") continue;
    for (auto ev : field.value().get_array()) n += visit(ev.value());
  }
  return n;
}

void BM_read_baseline_mem(benchmark::State& state, const std::string* json) {
  simdjson::padded_string padded(*json);
  od::parser parser;
  for (auto _ : state) benchmark::DoNotOptimize(baseline_pass(parser, padded));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json->size()));
}

void BM_read_baseline(benchmark::State& state, std::filesystem::path file, std::size_t json_size) {
  od::parser parser;
  for (auto _ : state) {
    const simdjson::padded_string padded = simdjson::padded_string::load(file.string());
    benchmark::DoNotOptimize(baseline_pass(parser, padded));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json_size));
}

// The reader's workspace (window and simdjson parser) is reused across iterations, as the job
// loader reuses it across the files of one thread (and as the baseline reuses its parser).
void BM_read(benchmark::State& state, std::filesystem::path file, std::size_t json_size) {
  lumos::trace::reader_workspace workspace;
  for (auto _ : state) {
    auto t = lumos::trace::read_trace(file, {}, &workspace);
    benchmark::DoNotOptimize(t.events.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json_size));
}

void BM_read_mem(benchmark::State& state, const std::string* json) {
  lumos::trace::reader_workspace workspace;
  for (auto _ : state) {
    auto t = lumos::trace::read_trace_bytes(*json, "bench", {}, &workspace);
    benchmark::DoNotOptimize(t.events.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json->size()));
}

void BM_read_gz(benchmark::State& state, std::filesystem::path gz_file, std::size_t json_size) {
  lumos::trace::reader_workspace workspace;
  for (auto _ : state) {
    auto t = lumos::trace::read_trace(gz_file, {}, &workspace);
    benchmark::DoNotOptimize(t.events.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json_size));
}

void BM_inflate(benchmark::State& state, const std::string* gz, std::size_t json_size, bool isal) {
  std::vector<char> out(1 << 20);
  for (auto _ : state) {
    if (isal) {
      lumos::detail::byte_source src(*gz, "bench.gz");
      while (src.read(out.data(), out.size()) != 0) {
      }
    } else {
      std::size_t total = 0;
      inflate_zlib(*gz, out, [&](const char*, std::size_t n) { total += n; });
      benchmark::DoNotOptimize(total);
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json_size));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lumos_bench::ratio_reporter reporter;
  const auto dir = lumos_bench::trace_dir();
  const std::vector<std::pair<std::string, std::string>> traces = {
      {"owlv2_h100", "tracelens_H100_B200/h100_google_owlv2-large-patch14-ensemble__1016001.json.gz"},
      {"df_index_resolver_v100", "hta_testdata/df_index_resolver/df_index_resolver.json.gz"},
      {"trace_diff_control_a100", "hta_testdata/trace_diff/control/control.json.gz"},
      {"megatron_rank0_a100", "astra-sim_megatron-gpt-tp8_8xA100/megatron_kineto_0.json.gz"},
  };
  // Kept alive for the whole run: benchmarks refer to them.
  static std::vector<std::unique_ptr<std::string>> texts;
  const auto tmp = std::filesystem::temp_directory_path() / ("lumos-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  for (const auto& [name, rel] : traces) {
    const auto path = dir / rel;
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "bench_reader: %s not found (set LUMOS_TRACE_DIR); skipped\n", path.string().c_str());
      continue;
    }
    auto* gz = texts.emplace_back(std::make_unique<std::string>(lumos_bench::read_file(path))).get();
    auto* json = texts.emplace_back(std::make_unique<std::string>(inflate_zlib(*gz))).get();
    const std::size_t size = json->size();
    const auto json_file = tmp / (name + ".json");
    { std::ofstream(json_file, std::ios::binary).write(json->data(), static_cast<std::streamsize>(size)); }
    benchmark::RegisterBenchmark(("BM_read_baseline/" + name).c_str(), BM_read_baseline, json_file, size)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_read/" + name).c_str(), BM_read, json_file, size)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_read_baseline_mem/" + name).c_str(), BM_read_baseline_mem, json)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_read_mem/" + name).c_str(), BM_read_mem, json)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_read_gz/" + name).c_str(), BM_read_gz, path, size)->Unit(benchmark::kMillisecond);
#if defined(LUMOS_HAVE_ISAL)
    benchmark::RegisterBenchmark(("BM_inflate_isal/" + name).c_str(), BM_inflate, gz, size, true)->Unit(benchmark::kMillisecond);
#endif
    benchmark::RegisterBenchmark(("BM_inflate_zlib/" + name).c_str(), BM_inflate, gz, size, false)->Unit(benchmark::kMillisecond);
    reporter.compare("BM_read/" + name, "BM_read_baseline/" + name, "bytes_per_second");
    reporter.compare("BM_read_mem/" + name, "BM_read_baseline_mem/" + name, "bytes_per_second");
    reporter.compare("BM_read_gz/" + name, "BM_read_baseline/" + name, "bytes_per_second");
#if defined(LUMOS_HAVE_ISAL)
    reporter.compare("BM_inflate_isal/" + name, "BM_inflate_zlib/" + name, "bytes_per_second");
#endif
  }
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
}

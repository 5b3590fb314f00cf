// Bad input: a clear lumos::error naming the file and the position; never a crash or a hang.
#include "test_support.hpp"
#include "../fuzz/fuzz_options.hpp"

#include <lumos/trace/job.hpp>
#include <lumos/trace/reader.hpp>

#include <catch2/catch.hpp>

#include <random>

using lumos::trace::read_trace_bytes;

namespace {

const std::string valid = lumos_test::read_file(lumos_test::data_dir() / "traps" / "collectives.json");

std::string error_of(const std::string& bytes, const std::string& name = "bad.json", std::size_t window = 4096) {
  try {
    (void)read_trace_bytes(bytes, name, {window});
  } catch (const lumos::error& e) {
    return e.what();
  }
  return {};
}

std::string with_event(const std::string& event) {
  return R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, )" + event +
         "]}";
}

}  // namespace

TEST_CASE("every truncation of a valid trace is an error, never a crash", "[bad-input]") {
  REQUIRE(error_of(valid).empty());
  for (std::size_t n = 0; n < valid.size(); ++n) {
    const std::string prefix = valid.substr(0, n);
    // Only whitespace may be cut off the end of a valid file.
    if (valid.find_first_not_of(" \n\r\t", n) == std::string::npos) continue;
    const std::string msg = error_of(prefix, "cut.json");
    INFO("prefix length " << n);
    REQUIRE_FALSE(msg.empty());
    REQUIRE(msg.rfind("cut.json:", 0) == 0);
  }
}

TEST_CASE("truncated and corrupt gzip streams are errors", "[bad-input]") {
  const std::string gz = lumos_test::gzip(valid);
  for (std::size_t n = 0; n + 1 < gz.size(); n += 7) {
    INFO("gzip prefix " << n);
    REQUIRE_FALSE(error_of(gz.substr(0, n), "cut.json.gz").empty());
  }
  std::mt19937 rng(7);
  int errors = 0;
  for (int round = 0; round < 300; ++round) {
    std::string bad = gz;
    bad[10 + rng() % (bad.size() - 10)] ^= static_cast<char>(1 + rng() % 255);
    errors += !error_of(bad, "flip.json.gz").empty();  // must not crash; CRC catches nearly all
  }
  CHECK(errors > 290);
  CHECK(error_of(gz + "garbage", "tail.json.gz").find("after the end of the gzip stream") != std::string::npos);
  CHECK(error_of(gz + std::string(16, '\0'), "zeros.json.gz").empty());  // zero padding is tolerated
}

TEST_CASE("non-JSON, empty and structurally wrong files are errors with a position", "[bad-input]") {
  CHECK(error_of("", "empty.json") == "empty.json: byte 0: empty file; expected a Kineto trace (a JSON object)");
  CHECK(error_of("   \n ", "ws.json").find("empty file") != std::string::npos);
  CHECK(error_of("hello", "h.json") == "h.json: byte 0: expected a JSON object at the top level");
  CHECK(error_of("[1, 2]", "a.json").find("expected a JSON object") != std::string::npos);
  CHECK(error_of("{}", "o.json").find("missing \"traceEvents\"") != std::string::npos);
  CHECK(error_of(R"({"traceEvents": {}})", "t.json") == "t.json: byte 16: expected an array for \"traceEvents\"");
  CHECK(error_of(R"({"traceEvents": []} x)", "t.json").find("unexpected data after the top-level object") != std::string::npos);
  CHECK(error_of(R"({"traceEvents": [] "x": 1})", "t.json").find("expected ',' or '}'") != std::string::npos);
  CHECK(error_of(R"({"traceEvents": [], "traceEvents": []})", "t.json").find("duplicate") != std::string::npos);
  CHECK(error_of(R"({"traceEvents": [{"ph": "i", "ts": 1, "pid": 1, "tid": 1} {"ph": "i"}]})", "t.json").find("event #") !=
        std::string::npos);
  CHECK(error_of(R"({"traceEvents": [{"ph": "i", "ts": 1, "pid": 1, "tid": 1},]})", "t.json").find("expected an event object or ']'") !=
        std::string::npos);
  CHECK(error_of(R"({"traceEvents": [1, 2]})", "t.json").find("expected") != std::string::npos);
  CHECK_FALSE(error_of(R"({"traceEvents": [{"ph": "i", "ts": 1, "pid": 1, "tid": 1}, 5]})", "t.json").empty());
  CHECK_FALSE(error_of(R"({"traceEvents": [], "distributedInfo": {"rank": "zero"}})", "t.json").empty());
  CHECK_FALSE(error_of(R"({"traceEvents": [], "baseTimeNanoseconds": -5})", "t.json").empty());
  CHECK_FALSE(error_of(std::string(R"({"traceEvents": [{"ph": "X", "name": "bad \xff\xfe utf8", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]})"),
                       "utf.json")
                  .empty());
  CHECK_FALSE(error_of(R"({"traceEvents": [{"ph": "X", "args": )" + std::string(5000, '[') + "]}").empty());
}

TEST_CASE("wrong types, missing fields and absurd values name the event and what was expected", "[bad-input]") {
  const auto msg = error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": "123", "dur": 1})"));
  CHECK(msg.find("bad.json: byte ") == 0);
  CHECK(msg.find("event #1: expected a number of microseconds for \"ts\", got string") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": {}})")).find("for \"dur\", got object") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": 5, "pid": 1, "tid": 1, "ts": 1, "dur": 1})")).find("expected a string for \"name\"") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1.5, "tid": 1, "ts": 1, "dur": 1})")).find("expected an integer for \"pid\"") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": []})")).find("expected an object for \"args\"") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"correlation": "7"}})"))
            .find("expected an integer for \"args.correlation\", got string") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1})")).find("event #1: missing \"dur\"") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "dur": 1})")).find("missing \"ts\"") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 1})")).find("missing \"name\"") != std::string::npos);
  CHECK(error_of(with_event(R"({"name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1})")).find("missing \"ph\"") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "tid": 1, "ts": 1, "dur": 1})")).find("missing \"pid\"") != std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": -2})")).find("negative duration") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1})")).find("absurd value for \"ts\"") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1e300})")).find("absurd value for \"dur\"") !=
        std::string::npos);
  CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 99999999999999999999, "tid": 1, "ts": 1, "dur": 1})")).find("pid") !=
        std::string::npos);
}

TEST_CASE("job-level errors: missing paths, empty directories, duplicate ranks", "[bad-input][job]") {
  using lumos::trace::load_job;
  lumos_test::temp_dir dir;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const lumos::error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(message([&] { (void)load_job({dir.path()}); }).find("directory holds no .json or .json.gz trace files") != std::string::npos);
  CHECK(message([&] { (void)load_job({dir.path() / "nope.json"}); }).find("no such file or directory") != std::string::npos);
  CHECK(message([&] { (void)load_job({}); }) == "no trace files given");
  const std::string rank3 = R"({"distributedInfo": {"rank": 3}, "traceEvents": []})";
  const auto a = dir.write("a.json", rank3);
  const auto b = dir.write("b.json", rank3);
  const auto dup = message([&] { (void)load_job({a, b}); });
  CHECK(dup.find("duplicate rank 3") != std::string::npos);
  CHECK(dup.find("a.json") != std::string::npos);
  CHECK(dup.find("b.json") != std::string::npos);
  // A bad file among good ones: the error names the bad file, whatever the thread count.
  const auto bad = dir.write("c_rank4.json", R"({"traceEvents": [{"ph": "X"}]})");
  for (unsigned threads : {1U, 4U}) {
    lumos::trace::load_options o;
    o.threads = threads;
    CHECK(message([&] { (void)load_job({a, bad}, o); }).find(bad.string() + ": byte") == 0);
  }
}

TEST_CASE("mismatched brackets inside an event are errors, whatever the window", "[bad-input]") {
  // simdjson counts '[' and '{' alike, the element scan counts braces only: a '{' closed by ']'
  // makes them disagree on where events end, which must be an error and never an out-of-bounds
  // read (found by the fuzzer).
  for (std::size_t window : {64U, 4096U}) {
    INFO("window " << window);
    CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"t": {"f", "f"]}}, )"
                              R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1})"),
                   "bad.json", window)
              .rfind("bad.json: byte ", 0) == 0);
    CHECK(error_of(with_event(R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"t": ["f", "f"}}}, )"
                              R"({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1})"),
                   "bad.json", window)
              .rfind("bad.json: byte ", 0) == 0);
  }
}

TEST_CASE("inputs the fuzzer once failed on are errors, with the sizes that found them and all others", "[bad-input][fuzz]") {
  // Each input is read with the window and batch size the fuzzer derives from it (the run that
  // found it), then with every other combination the fuzzer can pick. The reader's default batch
  // is a whole window, which never reached the failing path of some of these inputs.
  auto starts_with_position = [](const std::string& msg, const std::string& name) {
    return msg.rfind(name + ": byte ", 0) == 0 || msg.rfind(name + ": compressed byte ", 0) == 0;
  };
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(lumos_test::data_dir() / "fuzz-regressions")) {
    const std::string name = entry.path().filename().string();
    const std::string bytes = lumos_test::read_file(entry.path());
    INFO(name);
    std::vector<lumos::trace::read_options> all = {lumos_fuzz::read_options_for(bytes)};
    for (std::size_t window : lumos_fuzz::windows) {
      for (std::size_t batch : lumos_fuzz::batches) {
        lumos::trace::read_options o;
        o.window_bytes = window;
        o.batch_bytes = batch;
        all.push_back(o);
      }
    }
    for (const auto& o : all) {
      INFO("window " << o.window_bytes << ", batch " << o.batch_bytes);
      std::string msg;
      try {
        (void)read_trace_bytes(bytes, name, o);
      } catch (const lumos::error& e) {
        msg = e.what();
      }
      CHECK(starts_with_position(msg, name));
    }
    ++n;
  }
  CHECK(n >= 2);
}

namespace {

std::string load_error(const std::vector<std::filesystem::path>& files, unsigned threads = 1) {
  lumos::trace::load_options o;
  o.threads = threads;
  try {
    (void)lumos::trace::load_job(files, o);
  } catch (const lumos::error& e) {
    return e.what();
  }
  return {};
}

std::string with_info(const std::string& info) {
  return R"({"distributedInfo": )" + info +
         R"(, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]})";
}

}  // namespace

TEST_CASE("absurd ranks and world sizes are errors naming the file and the value", "[bad-input][job][rank]") {
  lumos_test::temp_dir dir;
  const std::string big = std::to_string(lumos::trace::max_world_size);
  struct bad_case {
    std::string info;
    std::string expected;
  };
  const std::vector<bad_case> cases = {
      {R"({"rank": 2000000000})", "distributedInfo.rank 2000000000 is out of range"},
      {R"({"rank": -5, "world_size": 8})", "distributedInfo.rank -5 is out of range"},
      {R"({"rank": 0, "world_size": 1099511627776})", "distributedInfo.world_size 1099511627776 is out of range"},
      {R"({"rank": 0, "world_size": 0})", "distributedInfo.world_size 0 is out of range"},
      {R"({"rank": 0, "world_size": -2})", "distributedInfo.world_size -2 is out of range"},
      {R"({"rank": 4, "world_size": 4})", "distributedInfo.rank 4 is not below world_size 4"},
      {R"({"world_size": 2, "rank": 3})", "distributedInfo.rank 3 is not below world_size 2"},  // either order
      {R"({"rank": )" + big + "}", "distributedInfo.rank " + big + " is out of range"},
      {R"({"rank": 99999999999999999999})", "an integer for distributedInfo.rank"},
  };
  int k = 0;
  for (const auto& c : cases) {
    INFO(c.info);
    const auto file = dir.write("t" + std::to_string(k++) + ".json", with_info(c.info));
    const std::string msg = load_error({file});
    CHECK(msg.rfind(file.string() + ": byte ", 0) == 0);
    CHECK(msg.find(c.expected) != std::string::npos);
    // The same for a single file read on its own.
    CHECK(error_of(with_info(c.info)).find(c.expected) != std::string::npos);
  }
  // The largest accepted values read.
  const auto edge = dir.write("edge.json", with_info(R"({"rank": )" + std::to_string(lumos::trace::max_world_size - 1) +
                                                     R"(, "world_size": )" + big + "}"));
  CHECK(load_error({edge}).empty());
}

TEST_CASE("ranks from file names or order must fit the bound and the declared world size", "[bad-input][job][rank]") {
  lumos_test::temp_dir dir;
  const std::string plain = R"({"traceEvents": []})";
  // A name that says "rank" with a number no job has: an error, not a truncated or huge rank.
  const auto huge = dir.write("rank2000000000.json", plain);
  const std::string msg = load_error({huge});
  CHECK(msg.rfind(huge.string() + ":", 0) == 0);
  CHECK(msg.find("rank 2000000000 in the file name is out of range") != std::string::npos);
  const auto long_digits = dir.write("worker123456789012345678901234567890.json", plain);
  CHECK(load_error({long_digits}).find("in the file name is out of range") != std::string::npos);
  // world_size without a rank: the rank from the name must be below it.
  const auto named = dir.write("trace_rank5.json", with_info(R"({"world_size": 4})"));
  const std::string named_msg = load_error({named});
  CHECK(named_msg.rfind(named.string() + ":", 0) == 0);
  CHECK(named_msg.find("rank 5 (from the file name) is not below distributedInfo.world_size 4") != std::string::npos);
  // ... and so must a rank from the position in the list.
  const auto a = dir.write("a.json", with_info(R"({"world_size": 1})"));
  const auto b = dir.write("b.json", with_info(R"({"world_size": 1})"));
  CHECK(load_error({a, b}).find("rank 1 (from the order given) is not below distributedInfo.world_size 1") != std::string::npos);
  const auto fits = dir.write("trace_rank3.json", with_info(R"({"world_size": 4})"));
  CHECK(load_error({fits}).empty());
}

TEST_CASE("a corrupt file among several: the first in input order is reported, for any thread count", "[bad-input][job][threads]") {
  lumos_test::temp_dir dir;
  std::vector<std::filesystem::path> files;
  for (int r = 0; r < 8; ++r) {
    const std::string name = "rank" + std::to_string(r) + ".json";
    // Ranks 2 and 5 are corrupt in different ways; rank 2 comes first in the list.
    const std::string text = r == 2   ? R"({"traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1}]})"
                             : r == 5 ? R"({"traceEvents": [)"
                                      : with_info(R"({"rank": )" + std::to_string(r) + "}");
    files.push_back(dir.write(name, text));
  }
  for (unsigned threads : {1U, 2U, 3U, 8U, 16U}) {
    INFO("threads " << threads);
    for (int round = 0; round < 5; ++round) {  // timing varies between rounds; the answer must not
      const std::string msg = load_error(files, threads);
      CHECK(msg.rfind(files[2].string() + ": byte ", 0) == 0);
      CHECK(msg.find("missing \"dur\"") != std::string::npos);
    }
  }
  // An exception from the progress callback (on a loader thread) is rethrown, not std::terminate.
  for (unsigned threads : {1U, 4U}) {
    lumos::trace::load_options o;
    o.threads = threads;
    o.on_loaded = [](const lumos::trace::rank_trace& t, std::size_t, std::size_t) {
      if (t.rank == 3) throw lumos::error("stop at rank 3");
    };
    std::vector<std::filesystem::path> good = {files[0], files[1], files[3], files[4]};
    CHECK_THROWS_WITH(lumos::trace::load_job(good, o), "stop at rank 3");
  }
}

// Calibration's readings of the events (include/lumos/model/calibrate.hpp): the CPU op that
// launched a kernel, the host time of the top-level ops, a collective kernel as a sample, and
// the class and bandwidth of a memory-bound kernel.
#include <lumos/model/calibrate.hpp>

#include <catch2/catch.hpp>

#include <utility>
#include <vector>

using namespace lumos;

namespace {

// A rank's events added one at a time, with their names and args.
struct events_of_rank {
  trace::rank_trace r;
  std::size_t add(std::string_view name, trace::category cat, time_ns ts, time_ns dur, std::uint32_t lane = 0,
                  std::vector<std::pair<trace::arg_key, std::int64_t>> args = {}) {
    trace::event e;
    e.name = r.strings.intern(name), e.cat = cat, e.ph = trace::phase::complete, e.ts = ts, e.dur = dur, e.lane = lane;
    e.args_begin = static_cast<std::uint32_t>(r.arg_keys.size());
    for (const auto& [k, v] : args) r.arg_keys.push_back(k), r.arg_values.push_back(v);
    r.events.push_back(e);
    return r.events.size() - 1;
  }
  std::int64_t text(std::string_view s) { return static_cast<std::int64_t>(r.strings.intern(s)); }
};

}  // namespace

TEST_CASE("calibrate: a launch's innermost enclosing CPU op on its own lane", "[model][calibrate]") {
  events_of_rank x;
  const std::size_t outer = x.add("aten::linear", trace::category::cpu_op, 0, 100);
  const std::size_t inner = x.add("aten::addmm", trace::category::cpu_op, 10, 30);
  const std::size_t innermost = x.add("aten::copy_", trace::category::cpu_op, 20, 10);
  const std::size_t other = x.add("aten::mul", trace::category::cpu_op, 22, 10, 1);  // another lane
  const model::detail::enclosing_ops ops(x.r, {innermost, other, outer, inner});
  auto call = [&](time_ns ts, std::uint32_t lane) {
    trace::event e;
    e.ts = ts, e.dur = 1, e.lane = lane;
    return ops.innermost(e);
  };
  CHECK(call(25, 0) == static_cast<std::ptrdiff_t>(innermost));
  CHECK(call(35, 0) == static_cast<std::ptrdiff_t>(inner));
  CHECK(call(60, 0) == static_cast<std::ptrdiff_t>(outer));
  CHECK(call(150, 0) == -1);
  CHECK(call(5, 1) == -1);
  CHECK(call(25, 1) == static_cast<std::ptrdiff_t>(other));
  // By start, the enclosing op first.
  CHECK(ops.ops() == std::vector<std::size_t>{outer, inner, innermost, other});
}

TEST_CASE("calibrate: host time of the top-level ops, less the synchronize calls inside them", "[model][calibrate]") {
  events_of_rank x;
  std::vector<std::size_t> ops;
  ops.push_back(x.add("aten::linear", trace::category::cpu_op, 0, 100));
  ops.push_back(x.add("aten::addmm", trace::category::cpu_op, 10, 10));  // inside: counted with its parent
  ops.push_back(x.add("record_param_comms", trace::category::cpu_op, 200, 10));  // not dispatch
  ops.push_back(x.add("aten::add", trace::category::cpu_op, 5, 20, 1));
  x.add("cudaDeviceSynchronize", trace::category::cuda_runtime, 30, 20);       // inside aten::linear
  x.add("cudaStreamSynchronize", trace::category::cuda_runtime, 300, 50);      // inside no op
  x.add("cudaDeviceSynchronize", trace::category::cuda_runtime, 201, 5);       // inside an op not counted
  const auto [busy, waited] = model::detail::top_level_host_time(x.r, ops);
  CHECK(busy == 100 + 20 - 20);
  CHECK(waited == 20);
}

TEST_CASE("calibrate: a collective kernel's sample, and point-to-point kernels left out", "[model][calibrate]") {
  using trace::arg_key;
  events_of_rank x;
  const std::size_t gather = x.add("ncclDevKernel_AllGather_RING_LL", trace::category::kernel, 0, 900, 0,
                                   {{arg_key::out_msg_nelems, 1024}, {arg_key::dtype, x.text("BFloat16")}, {arg_key::group_size, 4}});
  const std::size_t reduce = x.add("ncclDevKernel_AllReduce_Sum_f32_RING_LL128", trace::category::kernel, 0, 700);
  const std::size_t send = x.add("ncclDevKernel_SendRecv", trace::category::kernel, 0, 100);
  const auto g = model::detail::collective_sample_of(x.r, gather, x.r.name(x.r.events[gather]), {}, 8);
  REQUIRE(g);
  CHECK(g->kind == model::collective::all_gather);
  CHECK(g->bytes == 1024 * 2);  // the gathered output, 16-bit
  CHECK(g->group == 4);         // the kernel's own group size
  CHECK(g->ns == 900);
  CHECK(g->ll);
  // No message size on the kernel: its operator's first input, 4-byte elements by the kernel's name.
  const auto a = model::detail::collective_sample_of(x.r, reduce, x.r.name(x.r.events[reduce]), {{256, 4}}, 8);
  REQUIRE(a);
  CHECK(a->kind == model::collective::all_reduce);
  CHECK(a->bytes == 256 * 4 * 4);
  CHECK(a->group == 8);
  CHECK_FALSE(a->ll);  // LL128 is not LL
  CHECK_FALSE(model::detail::collective_sample_of(x.r, send, x.r.name(x.r.events[send]), {}, 8));
}

TEST_CASE("calibrate: memory-bound kernels by class and by bytes over time", "[model][calibrate]") {
  CHECK(model::detail::memory_class("aten::native_layer_norm") == "norm");
  CHECK(model::detail::memory_class("FusedRMSNorm") == "norm");
  CHECK(model::detail::memory_class("aten::_softmax") == "softmax");
  CHECK(model::detail::memory_class("aten::add") == "elementwise");
  const model::hardware hw = model::hardware_preset("h100-sxm");
  // Two inputs of 1e6 elements and an output as large as the larger: 6 MB of 16-bit data.
  const double bytes = 2.0 * 3e6;
  const auto dur = static_cast<time_ns>(std::llround(bytes / (0.5 * hw.gpu.hbm_bandwidth) * 1e9));
  CHECK(model::detail::memory_fraction({{1000, 1000}, {1000000}}, dur, hw) == Approx(0.5).epsilon(1e-3));
}

// The pass-level pipeline model's measurements (include/lumos/whatif/pipeline.hpp): where a
// rank's pass work ends, and a layer's costs from the summed layer spans.
#include <lumos/whatif/pipeline.hpp>

#include <catch2/catch.hpp>

using namespace lumos;

TEST_CASE("pass_cutoff: the first optimizer or other phase after every pass ends the passes' launches", "[whatif][pipeline]") {
  whatif::rank_structure rs;
  rs.passes.resize(2);
  rs.passes[0].start = 100, rs.passes[1].start = 300;
  CHECK(whatif::detail::pass_cutoff(rs) == std::numeric_limits<time_ns>::max());
  auto phase = [&](whatif::phase_kind kind, time_ns start) {
    whatif::phase_span ph;
    ph.kind = kind, ph.start = start;
    rs.phases.push_back(ph);
  };
  phase(whatif::phase_kind::optimizer, 200);  // before the last pass: not the step's
  phase(whatif::phase_kind::other, 700);
  phase(whatif::phase_kind::optimizer, 500);
  phase(whatif::phase_kind::forward, 400);
  CHECK(whatif::detail::pass_cutoff(rs) == 500);
}

TEST_CASE("set_layer_costs: means per layer, a backward of B and W, and the weight-gradient share", "[whatif][pipeline]") {
  whatif::detail::layer_sums sums;
  sums.cpu[0] = 30, sums.gpu[0] = 90, sums.count[0] = 3;
  sums.cpu[1] = 40, sums.gpu[1] = 120, sums.count[1] = 2;
  SECTION("the traces' own W passes") {
    sums.cpu[2] = 10, sums.gpu[2] = 40, sums.count[2] = 2;
    sums.wgrad = 1000;  // the W passes win over kernel names
    whatif::pass_costs c;
    const whatif::host_device traced = whatif::detail::set_layer_costs(c, sums);
    CHECK(c.layer_forward.cpu == 10);
    CHECK(c.layer_forward.gpu == 30);
    CHECK(traced.cpu == 20);
    CHECK(traced.gpu == 60);
    CHECK(c.layer_backward.cpu == traced.cpu + 5);
    CHECK(c.layer_backward.gpu == traced.gpu + 20);
    CHECK(c.weight_fraction == Approx(20.0 / 80.0));
  }
  SECTION("kernels named wgrad") {
    sums.wgrad = 30, sums.bgrad = 90;
    whatif::pass_costs c;
    const whatif::host_device traced = whatif::detail::set_layer_costs(c, sums);
    CHECK(c.layer_backward.gpu == traced.gpu);
    CHECK(c.weight_fraction == Approx(0.25));
  }
  SECTION("neither: half") {
    whatif::pass_costs c;
    (void)whatif::detail::set_layer_costs(c, sums);
    CHECK(c.weight_fraction == 0.5);
    CHECK(c.weight_source.find("half") != std::string::npos);
  }
}

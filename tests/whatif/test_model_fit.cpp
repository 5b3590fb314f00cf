// The fit to the traced configuration (include/lumos/whatif/model_fit.hpp): the CPU dispatch per
// modelled op from the traced host time.
#include <lumos/whatif/model_fit.hpp>

#include <catch2/catch.hpp>

using namespace lumos;

TEST_CASE("fit_cpu_dispatch: the traced host time over the modelled ops, less one launch", "[whatif][calibrate]") {
  model::calibration c;
  c.profile = model::h100_profile();
  const double launch = c.profile.cpu_launch_ns;
  whatif::model_fit fit;
  fit.host_ns_per_iteration = 200.0 * (launch + 3000.0);
  whatif::detail::fit_cpu_dispatch(c, fit, 200.0, "from the test: ");
  CHECK(c.profile.cpu_forward_op_ns == Approx(3000.0));
  CHECK(c.profile.cpu_backward_op_ns == c.profile.cpu_forward_op_ns);
  CHECK(c.profile.cpu_collective_ns == Approx(3000.0 + launch));
  CHECK(c.profile.cpu_layer_glue_ns == 0);
  CHECK(c.profile.provenance["cpu.forward_op_ns"].rfind("from the test: ", 0) == 0);
  REQUIRE(fit.notes.size() == 1);

  // Less host time than the launches themselves: no negative dispatch.
  fit.host_ns_per_iteration = 10.0 * launch / 2;
  whatif::detail::fit_cpu_dispatch(c, fit, 10.0, "");
  CHECK(c.profile.cpu_forward_op_ns == 0);

  // Nothing measured, or nothing modelled: the profile stays.
  const model::cost_profile kept = c.profile;
  fit.host_ns_per_iteration = 0;
  whatif::detail::fit_cpu_dispatch(c, fit, 10.0, "");
  fit.host_ns_per_iteration = 1e6;
  whatif::detail::fit_cpu_dispatch(c, fit, 0.0, "");
  CHECK(c.profile.cpu_forward_op_ns == kept.cpu_forward_op_ns);
  CHECK(fit.notes.size() == 2);
}

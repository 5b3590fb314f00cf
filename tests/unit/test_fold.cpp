// Folding identical ranks (include/lumos/trace/fold.hpp): which ranks count as identical, which
// fold is refused, and that a job folded so replays and what-ifs as the whole job does.
#include "test_support.hpp"

#include <lumos/report/replay_report.hpp>
#include <lumos/trace/fold.hpp>
#include <lumos/trace/job.hpp>

#include <catch2/catch.hpp>

#include <string>

using namespace lumos;

namespace {

// One rank of a 4-rank job: a launch and its kernel, then an all-reduce over `group`. `kernel_us`
// is the kernel's duration; pid, tid, device and the group's name and members name the rank.
std::string rank_json(int rank, const std::string& group, int kernel_us = 100) {
  const std::string pid = std::to_string(1000 + rank);
  return R"({"distributedInfo":{"backend":"nccl","rank":)" + std::to_string(rank) + R"(,"world_size":4},"traceEvents":[
{"ph":"M","name":"thread_name","pid":)" + pid + R"(,"tid":)" + pid + R"(,"args":{"name":"rank )" + std::to_string(rank) + R"( main"}},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":)" + pid + R"(,"tid":)" + pid + R"(,"ts":10,"dur":5,"args":{"correlation":1}},
{"ph":"X","cat":"kernel","name":"gemm","pid":)" + std::to_string(rank) + R"(,"tid":7,"ts":20,"dur":)" + std::to_string(kernel_us) + R"(,"args":{"correlation":1,"stream":7,"device":)" + std::to_string(rank) + R"(}},
{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":)" + pid + R"(,"tid":)" + pid + R"(,"ts":200,"dur":8,"args":{"Collective name":"allreduce","In msg nelems":1024,"Group size":2,"Process Group Name":"pg)" + group + R"(","Process Group Ranks":"[)" + group + R"(]","Rank":)" + std::to_string(rank % 2) + R"(}},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":)" + pid + R"(,"tid":)" + pid + R"(,"ts":202,"dur":5,"args":{"correlation":2}},
{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_bf16_RING_LL","pid":)" + std::to_string(rank) + R"(,"tid":13,"ts":210,"dur":50,"args":{"correlation":2,"stream":13,"device":)" + std::to_string(rank) + R"(}}
]})";
}

}  // namespace

TEST_CASE("work_fingerprint: identical work at the same times, whatever names the rank", "[fold]") {
  lumos_test::temp_dir dir;
  lumos_test::write_file(dir.path() / "rank0.json", rank_json(0, "0, 1"));
  lumos_test::write_file(dir.path() / "rank1.json", rank_json(1, "0, 1"));
  lumos_test::write_file(dir.path() / "rank2.json", rank_json(2, "2, 3", 120));
  lumos_test::write_file(dir.path() / "rank3.json", rank_json(3, "2, 3"));
  const trace::job job = trace::load_job({dir.path()});
  const auto print = [&](int i) { return trace::work_fingerprint(job.ranks[static_cast<std::size_t>(i)]); };
  CHECK(print(0) == print(1));  // pid, tid, thread name, device, group name and rank differ
  CHECK(print(0) == print(3));  // another group of the same kind
  CHECK(print(0) != print(2));  // one kernel 20 us longer
}

TEST_CASE("fold_identical_ranks keeps the lowest rank of each class, when every group folds whole", "[fold]") {
  lumos_test::temp_dir dir;
  // Ranks 0 and 1 form a group and run the same work; so do ranks 2 and 3, a little slower.
  for (int r = 0; r < 4; ++r) lumos_test::write_file(dir.path() / ("rank" + std::to_string(r) + ".json"), rank_json(r, r < 2 ? "0, 1" : "2, 3", r < 2 ? 100 : 120));
  trace::job job = trace::load_job({dir.path()});
  const report::replay_session whole = report::replay_job(job);
  const trace::rank_folding f = trace::fold_identical_ranks(job);
  REQUIRE(f.folded());
  CHECK(f.traced == 4);
  REQUIRE(job.ranks.size() == 2);
  CHECK(job.ranks[0].rank == 0);
  CHECK(job.ranks[1].rank == 2);
  CHECK(f.stands_for == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  // Each all-reduce is folded onto one participant: the job's iteration is the whole job's.
  const report::replay_session folded = report::replay_job(job);
  CHECK(folded.simulated_ns == whole.simulated_ns);
  CHECK(folded.measured_ns == whole.measured_ns);
}

TEST_CASE("fold_identical_ranks leaves a job whose groups would be cut apart", "[fold]") {
  lumos_test::temp_dir dir;
  // Ranks 0 and 2 are identical, so are 1 and 3; the groups are {0, 1} and {2, 3}. The kept
  // ranks 0 and 1 hold the whole of one group and none of the other: a clean fold, each kept
  // rank standing for its twin in the other group.
  for (int r = 0; r < 4; ++r) lumos_test::write_file(dir.path() / ("rank" + std::to_string(r) + ".json"), rank_json(r, r < 2 ? "0, 1" : "2, 3", r % 2 ? 120 : 100));
  trace::job job = trace::load_job({dir.path()});
  const trace::rank_folding f = trace::fold_identical_ranks(job);
  REQUIRE(f.folded());
  CHECK(f.stands_for == std::vector<std::vector<int>>{{0, 2}, {1, 3}});

  // Ranks 0, 2 and 3 are identical, rank 1 is not: the kept 0 and 1 are two of group {0, 1, 2}'s
  // three members, which folding would cut apart: no fold.
  lumos_test::temp_dir odd;
  for (int r = 0; r < 4; ++r) {
    lumos_test::write_file(odd.path() / ("rank" + std::to_string(r) + ".json"), rank_json(r, r < 3 ? "0, 1, 2" : "3", r == 1 ? 120 : 100));
  }
  trace::job cut = trace::load_job({odd.path()});
  const trace::rank_folding g = trace::fold_identical_ranks(cut);
  CHECK_FALSE(g.folded());
  CHECK(cut.ranks.size() == 4);

  // Nothing identical: nothing folded.
  lumos_test::temp_dir distinct;
  for (int r = 0; r < 4; ++r) lumos_test::write_file(distinct.path() / ("rank" + std::to_string(r) + ".json"), rank_json(r, "0, 1, 2, 3", 100 + r));
  trace::job all = trace::load_job({distinct.path()});
  CHECK_FALSE(trace::fold_identical_ranks(all).folded());
  CHECK(all.ranks.size() == 4);
}

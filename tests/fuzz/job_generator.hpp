#pragma once
// A structured generator for the graph-builder fuzzer: any byte string becomes a small job of
// valid Kineto JSON traces (one per rank) whose events relate in adversarial ways: correlation
// ids shared by several launches and kernels, kernels before their launch, stream waits on
// events recorded later or on the waiting stream itself (cycles through syncs), collectives whose
// ranks disagree on the group size, sequence or group, and partners that never come. The reader
// accepts every trace it writes; what the builder, compile and replay make of them is the test.
// Shared with the unit test that replays the seeds and the inputs the fuzzer once failed on
// (tests/graph/test_fuzz_inputs.cpp): a change to how bytes are read changes what those inputs
// mean, so add new choices after the existing ones rather than reordering them.

#include <lumos/core/json_writer.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/reader.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos_fuzz {

/// Reads the fuzzer's bytes as small numbers; zeros once they run out.
class byte_reader {
 public:
  explicit byte_reader(std::string_view bytes) : bytes_(bytes) {}
  [[nodiscard]] unsigned next() { return pos_ < bytes_.size() ? static_cast<unsigned char>(bytes_[pos_++]) : 0U; }
  /// A number in [0, n).
  [[nodiscard]] unsigned below(unsigned n) { return n == 0 ? 0 : next() % n; }
  [[nodiscard]] bool coin() { return (next() & 1U) != 0; }
  [[nodiscard]] bool empty() const noexcept { return pos_ >= bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

struct generated_job {
  std::vector<std::string> files;  ///< JSON text of each rank
  unsigned option_bits = 0;        ///< build options to vary (strict, clocks, matching, ...)
};

namespace detail {

inline void event(lumos::json_writer& w, std::string_view cat, std::string_view name, int pid, int tid, std::int64_t ts,
                  std::int64_t dur) {
  w.begin_object().field("ph", "X").field("cat", cat).field("name", name).field("pid", pid).field("tid", tid);
  w.field("ts", ts).field("dur", dur);
}

}  // namespace detail

/// The job the bytes describe: 1 to 4 ranks of at most 48 generated actions each.
[[nodiscard]] inline generated_job generate_job(std::string_view bytes) {
  byte_reader in(bytes);
  generated_job out;
  out.option_bits = in.next();
  const unsigned ranks = 1 + in.below(4);
  const bool declare_world = in.coin();
  static constexpr std::string_view collectives[] = {"allreduce", "allgather", "reduce_scatter", "send", "recv", "broadcast"};
  static constexpr std::string_view kernels[] = {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_AllGather_RING_LL",
                                                 "ncclDevKernel_ReduceScatter_Sum_bf16", "ncclDevKernel_SendRecv"};
  static constexpr std::string_view syncs[] = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                               "cudaMemcpy", "cudaEventQuery", "cudaStreamQuery"};
  for (unsigned r = 0; r < ranks; ++r) {
    std::string text;
    lumos::json_writer w(text);
    w.begin_object();
    if (declare_world) {
      w.key("distributedInfo").begin_object().field("backend", "nccl").field("rank", static_cast<int>(r));
      w.field("world_size", static_cast<int>(ranks)).end_object();
    }
    w.key("traceEvents").begin_array();
    std::int64_t now = 1000;
    int corr = 1;
    const unsigned actions = in.below(49);
    unsigned step = 0;
    std::int64_t step_start = now;
    for (unsigned a = 0; a < actions; ++a) {
      const unsigned what = in.below(12);
      const int stream = 7 + static_cast<int>(in.below(3));
      const std::int64_t gap = in.below(40);
      const std::int64_t dur = in.below(60);
      // Correlation ids: fresh, or an earlier one again (duplicates, on purpose).
      const int c = in.coin() ? corr++ : 1 + static_cast<int>(in.below(static_cast<unsigned>(corr)));
      now += gap;
      switch (what) {
        case 0:
          detail::event(w, "cpu_op", "aten::mm", 1, 1, now, dur);
          w.key("args").begin_object().field("External id", static_cast<int>(a)).end_object().end_object();
          break;
        case 1:
        case 2: {  // a launch and its kernel; the kernel may start before the launch
          detail::event(w, "cuda_runtime", "cudaLaunchKernel", 1, 1, now, 1 + dur % 8);
          w.key("args").begin_object().field("correlation", c).end_object().end_object();
          const std::int64_t at = what == 2 ? now - static_cast<std::int64_t>(in.below(30)) : now + 5;
          detail::event(w, "kernel", "gemm", 0, stream, at, dur);
          w.key("args").begin_object().field("device", 0).field("stream", stream).field("correlation", c).end_object().end_object();
          break;
        }
        case 3: {  // a blocking call (or a poll) on the CPU
          const std::string_view name = syncs[in.below(6)];
          detail::event(w, "cuda_runtime", name, 1, 1, now, dur);
          w.key("args").begin_object().field("correlation", c).end_object().end_object();
          if (name == "cudaMemcpy" && in.coin()) {
            detail::event(w, "gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 0, stream, now + 1, dur / 2);
            w.key("args").begin_object().field("device", 0).field("stream", stream).field("correlation", c).end_object().end_object();
          }
          break;
        }
        case 4: {  // record on one stream, wait on another (or the same: a cycle), with a sync row
          const int record_corr = in.coin() ? c : c + static_cast<int>(in.below(5));  // maybe a record that comes later
          detail::event(w, "cuda_runtime", "cudaEventRecord", 1, 1, now, 1);
          w.key("args").begin_object().field("correlation", record_corr).end_object().end_object();
          detail::event(w, "cuda_runtime", "cudaStreamWaitEvent", 1, 1, now + 2, 1);
          w.key("args").begin_object().field("correlation", corr).end_object().end_object();
          const int waiting = in.coin() ? stream : 7 + static_cast<int>(in.below(3));
          detail::event(w, "cuda_sync", "Stream Wait Event", 0, 1000000 + waiting, now + 3, 0);
          w.key("args").begin_object().field("cuda_sync_kind", "Stream Wait Event").field("wait_on_stream", stream);
          w.field("wait_on_cuda_event_record_corr_id", record_corr).field("wait_on_cuda_event_id", static_cast<int>(in.below(4)));
          w.field("stream", waiting).field("correlation", corr).field("device", 0).end_object().end_object();
          ++corr;
          break;
        }
        case 5:
        case 6: {  // a collective: group size, sequence and group may disagree between ranks
          const unsigned kind = in.below(6);
          detail::event(w, "cuda_runtime", "cudaLaunchKernelExC", 1, 1, now, 2);
          w.key("args").begin_object().field("correlation", c).field("External id", c).end_object().end_object();
          if (in.coin()) {
            detail::event(w, "cpu_op", "record_param_comms", 1, 1, now, 3);
            w.key("args").begin_object().field("External id", c).field("Collective name", collectives[kind]);
            w.field("Group size", static_cast<int>(in.below(6))).field("Seq", static_cast<int>(in.below(4))).end_object().end_object();
          }
          detail::event(w, "kernel", kernels[kind % 4], 0, 20 + static_cast<int>(in.below(2)), now + 4, dur);
          w.key("args").begin_object().field("device", 0).field("stream", 20).field("correlation", c).field("External id", c);
          w.field("Collective name", collectives[kind]).field("In msg nelems", static_cast<int>(in.below(200)) * 1024);
          w.field("Group size", static_cast<int>(in.below(6))).field("Process Group Name", in.coin() ? "0" : "1");
          if (in.coin()) {
            std::string list = "[";
            const unsigned n = in.below(5);
            for (unsigned k = 0; k < n; ++k) list += (k ? ", " : "") + std::to_string(in.below(6));
            w.field("Process Group Ranks", list + "]");
          }
          if (in.coin()) w.field("Seq", static_cast<int>(in.below(4)));
          w.end_object().end_object();
          break;
        }
        case 7:  // a second thread: hand-offs
          detail::event(w, "cpu_op", "autograd::engine::evaluate_function", 1, 2, now, dur);
          w.key("args").begin_object().field("Fwd thread id", 1).end_object().end_object();
          break;
        case 8:  // a kernel with no launch at all
          detail::event(w, "kernel", "elementwise", 0, stream, now, dur);
          w.key("args").begin_object().field("device", 0).field("stream", stream).field("correlation", 100000 + c).end_object().end_object();
          break;
        case 9:  // end the current step
          detail::event(w, "user_annotation", "ProfilerStep#" + std::to_string(step), 1, 1, step_start, now - step_start + dur);
          w.key("args").begin_object().end_object().end_object();
          ++step;
          step_start = now + dur;
          break;
        case 10:  // time goes backwards on the CPU thread (overlapping, not nested)
          now -= static_cast<std::int64_t>(in.below(50));
          detail::event(w, "cpu_op", "aten::add", 1, 1, now, dur);
          w.key("args").begin_object().end_object().end_object();
          break;
        default:  // a CUDA graph launch: several kernels of one correlation
          detail::event(w, "cuda_runtime", "cudaGraphLaunch", 1, 1, now, 3);
          w.key("args").begin_object().field("correlation", c).end_object().end_object();
          for (unsigned k = 0, n = 1 + in.below(3); k < n; ++k) {
            detail::event(w, "kernel", "graph_kernel", 0, stream, now + 4 + static_cast<std::int64_t>(k) * 10, dur / 2);
            w.key("args").begin_object().field("device", 0).field("stream", stream).field("correlation", c);
            w.field("graph id", 1).field("graph node id", static_cast<int>(k)).end_object().end_object();
          }
          break;
      }
      now += dur;
    }
    if (step == 0 || in.coin()) {
      detail::event(w, "user_annotation", "ProfilerStep#" + std::to_string(step), 1, 1, step_start, now - step_start + 1);
      w.key("args").begin_object().end_object().end_object();
    }
    w.end_array().end_object();
    out.files.push_back(std::move(text));
  }
  return out;
}

/// Loads, builds and replays the job the bytes describe; lumos::error for what lumos rejects.
[[nodiscard]] inline lumos::report::replay_session build_and_replay(std::string_view bytes) {
  const generated_job g = generate_job(bytes);
  lumos::trace::job job;
  for (std::size_t r = 0; r < g.files.size(); ++r) {
    job.ranks.push_back(lumos::trace::read_trace_bytes(g.files[r], "rank" + std::to_string(r)));
    if (job.ranks.back().rank < 0) job.ranks.back().rank = static_cast<int>(r);
  }
  lumos::report::replay_options o;
  o.build.strict = (g.option_bits & 1U) != 0;
  o.build.align_clocks = (g.option_bits & 2U) != 0;
  o.build.match_collectives = (g.option_bits & 4U) == 0;
  o.build.cross_stream = (g.option_bits & 8U) == 0;
  o.build.implicit_waits = (g.option_bits & 16U) == 0;
  if ((g.option_bits & 32U) != 0) o.build.op_scales.push_back({"mm", (g.option_bits & 64U) != 0 ? 0.0 : 2.0});
  if ((g.option_bits & 128U) != 0) o.durations_from_step = 0;
  return lumos::report::replay_job(job, o);
}

}  // namespace lumos_fuzz

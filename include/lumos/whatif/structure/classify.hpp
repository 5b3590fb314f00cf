#pragma once
// What the names and args of trace events say to structure discovery: the phase a CPU
// annotation marks, a collective's kind, a GEMM or attention kernel, a kernel's data type, a
// process group's size. Shared by the facets and by the what-if rewrites that read the same
// events again.

#include <lumos/core/strings.hpp>
#include <lumos/trace/comm.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// A Group size arg as a group size: 1 to 2^24 ranks; anything else (a corrupt or hostile trace:
/// negative, or 2^40, which as an int is 0) is no size at all.
[[nodiscard]] inline std::optional<int> group_size_of(std::int64_t arg) noexcept {
  if (arg < 1 || arg > (std::int64_t{1} << 24)) return std::nullopt;
  return static_cast<int>(arg);
}

inline constexpr std::uint32_t no_event = ~std::uint32_t{0};

/// What a traced point-to-point op is, by the CPU operator that posted it (`cpu_op`, an event
/// index; c10d names it `nccl:send` / `nccl:recv`): 1 a send, -1 a receive, 0 neither (or both: a
/// batched transfer).
[[nodiscard]] inline int transfer_side(const trace::rank_trace& tr, std::uint32_t cpu_op) {
  if (cpu_op == no_event) return 0;
  const std::string op = lower_ascii(tr.name(tr.events[cpu_op]));
  const bool recv = op.find("recv") != std::string::npos, send = op.find("send") != std::string::npos;
  return send == recv ? 0 : send ? 1 : -1;
}

/// `s` in ASCII lower case (bytes outside ASCII unchanged).
[[nodiscard]] inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// The phase an enclosing CPU event marks, if any (see docs/whatif.md).
[[nodiscard]] inline std::optional<phase_kind> phase_marker(std::string_view name) {
  if (name.starts_with("ProfilerStep#")) return std::nullopt;
  // FSDP2's hooks (FSDP::pre_forward, FSDP::post_forward, ...) wrap a unit's gathers, not its
  // compute: as markers they would leave the unit's GEMMs outside the pass they run in.
  if (name.starts_with("FSDP::")) return std::nullopt;
  const std::string l = lower(name);
  if (l.find("backward") != std::string::npos || l.starts_with("autograd::engine::evaluate_function")) return phase_kind::backward;
  if (l.find("zero_grad") != std::string::npos) return phase_kind::other;
  if (name.starts_with("Optimizer.step") || l.find("## optimizer ##") != std::string::npos) return phase_kind::optimizer;
  if (l.find("forward") != std::string::npos) return phase_kind::forward;
  return std::nullopt;
}

/// Where the args of a rank's communication kernels are: on the kernel itself (newer PyTorch
/// writes `Collective name`, `Process Group Name`... there) or on the `record_param_comms`
/// operator that launched it, found by its External id. `of(op)` is the event to read them from.
class comm_args_source {
 public:
  explicit comm_args_source(const trace::rank_trace& t) : t_(t) {
    for (std::uint32_t i = 0; i < t.events.size(); ++i) {
      const trace::event& e = t.events[i];
      if (e.cat == trace::category::cpu_op && e.external_id >= 0 && has_args(i)) by_external_.try_emplace(e.external_id, i);
    }
  }
  [[nodiscard]] std::uint32_t of(std::uint32_t op) const {
    if (has_args(op)) return op;
    const auto it = by_external_.find(t_.events[op].external_id);
    return it != by_external_.end() ? it->second : op;
  }

 private:
  [[nodiscard]] bool has_args(std::uint32_t i) const {
    return t_.arg(i, trace::arg_key::collective_name) || t_.arg(i, trace::arg_key::process_group_name);
  }
  const trace::rank_trace& t_;
  std::unordered_map<std::int64_t, std::uint32_t> by_external_;  // the first operator per External id
};

/// Whether a Process Group Description names a context-parallel group (Megatron's
/// CONTEXT_PARALLEL_GROUP, TENSOR_AND_CONTEXT_PARALLEL_GROUP; torchtitan's and Transformer
/// Engine's `cp` as a word): its send/recv are ring attention's key/value exchange, not pipeline
/// transfers.
[[nodiscard]] inline bool context_parallel_description(std::string_view description) {
  const std::string d = lower(description);
  if (d.find("context_parallel") != std::string::npos) return true;
  for (std::size_t at = d.find("cp"); at != std::string::npos; at = d.find("cp", at + 1)) {
    const bool left = at == 0 || !std::isalnum(static_cast<unsigned char>(d[at - 1]));
    const bool right = at + 2 >= d.size() || !std::isalnum(static_cast<unsigned char>(d[at + 2]));
    if (left && right) return true;
  }
  return false;
}

/// Collective kind of a communication op from its `Collective name` arg (c10d's variants named by
/// the collective they run: `trace::collective_name_kind`) or its kernel name.
[[nodiscard]] inline std::string comm_kind(std::string_view kernel, std::string_view arg) {
  const std::string s = trace::collective_name_kind(arg);
  if (s == "alltoall" || s == "alltoallbase" || s == "alltoallv") return "alltoall";
  if (s == "send" || s == "recv" || s == "sendrecv" || s == "coalesced") return "sendrecv";
  if (!s.empty()) return s;
  const std::string k = lower(kernel);
  for (std::string_view kind : {"allreduce", "allgather", "reducescatter", "sendrecv", "broadcast", "alltoall", "reduce"}) {
    std::string pat = std::string(kind);
    if (k.find(pat) != std::string::npos) return pat;
  }
  if (k.find("all_reduce") != std::string::npos) return "allreduce";
  if (k.find("all_gather") != std::string::npos) return "allgather";
  return "comm";
}

/// The data type a kernel's name says it computes in ("bf16", "fp8", "fp16", "tf32", "fp32"), or
/// empty when the name says none.
[[nodiscard]] inline std::string dtype_of_kernel(std::string_view name) {
  const std::string l = lower(name);
  // Before bf16: an fp8 GEMM names its bf16 output too (sm90_xmma_gemm_e4m3e4m3_bf16f32_…).
  if (l.find("e4m3") != std::string::npos || l.find("e5m2") != std::string::npos || l.find("fp8") != std::string::npos) return "fp8";
  if (l.find("bf16") != std::string::npos || l.find("bfloat16") != std::string::npos) return "bf16";
  // cuBLAS writes fp16 as "f16" (sm90_xmma_gemm_f16f16_…) or "fp16" (ampere_fp16_s16816gemm_fp16_…).
  if (l.find("f16") != std::string::npos || l.find("fp16") != std::string::npos || l.find("half") != std::string::npos ||
      l.find("h1688") != std::string::npos) {
    return "fp16";
  }
  if (l.find("tf32") != std::string::npos) return "tf32";
  if (l.find("f32") != std::string::npos || l.find("sgemm") != std::string::npos || l.find("float") != std::string::npos) return "fp32";
  return {};
}

/// Whether a kernel's name is a matrix multiply's (cuBLAS, cuBLASLt, CUTLASS).
[[nodiscard]] inline bool is_gemm_kernel(std::string_view name) {
  const std::string l = lower(name);
  return l.find("gemm") != std::string::npos || l.find("xmma") != std::string::npos || l.find("nvjet") != std::string::npos ||
         l.find("cutlass") != std::string::npos;
}

/// Whether a kernel's name is attention's (softmax, flash / fused multi-head attention).
[[nodiscard]] inline bool is_attention_kernel(std::string_view name) {
  const std::string l = lower(name);
  return l.find("softmax") != std::string::npos || l.find("flash") != std::string::npos || l.find("fmha") != std::string::npos ||
         l.find("attention") != std::string::npos || l.find("attn") != std::string::npos;
}

/// "0,1,2": ranks as messages list them.
[[nodiscard]] inline std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace detail

}  // namespace lumos::whatif

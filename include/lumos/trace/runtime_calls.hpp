#pragma once
// What a GPU runtime call does, from its name: the CUDA runtime (`cuda...`), the CUDA driver
// (`cu...`) and HIP (`hip...`, ROCm traces), whose calls Kineto files under the same categories
// (`cuda_runtime`, `cuda_driver`). The graph builder, the calibration and the model fit ask these
// instead of spelling one vendor's names.

#include <string_view>

namespace lumos::trace {

namespace detail {
// `name` is one of the API prefixes followed by `call` (e.g. "hip" + "StreamSynchronize").
[[nodiscard]] constexpr bool is_call(std::string_view name, std::string_view call, bool cuda, bool driver, bool hip) noexcept {
  auto with = [&](std::string_view prefix) {
    return name.size() == prefix.size() + call.size() && name.starts_with(prefix) && name.ends_with(call);
  };
  return (cuda && with("cuda")) || (driver && with("cu")) || (hip && with("hip"));
}
}  // namespace detail

/// A kernel launch call: cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel, hipLaunchKernel,
/// hipExtLaunchKernel, hipModuleLaunchKernel, hipExtModuleLaunchKernel (what PyTorch's ROCm
/// build and hipBLASLt call). O(1).
[[nodiscard]] constexpr bool is_kernel_launch_call(std::string_view name) noexcept {
  return name == "cudaLaunchKernel" || name == "cuLaunchKernel" || name == "cudaLaunchKernelExC" || name == "hipLaunchKernel" ||
         name == "hipExtLaunchKernel" || name == "hipModuleLaunchKernel" || name == "hipExtModuleLaunchKernel";
}

/// A call that enqueues a copy or a memset without waiting for it (cudaMemcpyAsync,
/// cudaMemsetAsync and their HIP names). O(1).
[[nodiscard]] constexpr bool is_async_copy_call(std::string_view name) noexcept {
  return name == "cudaMemcpyAsync" || name == "cudaMemsetAsync" || name == "hipMemcpyAsync" || name == "hipMemsetAsync";
}

/// A copy call (any cudaMemcpy*, cuMemcpy*, hipMemcpy*): it may block until its GPU op ends. O(1).
[[nodiscard]] constexpr bool is_copy_call(std::string_view name) noexcept {
  return name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy") || name.starts_with("hipMemcpy");
}

/// cudaDeviceSynchronize, cudaCtxSynchronize, hipDeviceSynchronize, hipCtxSynchronize. O(1).
[[nodiscard]] constexpr bool is_device_sync_call(std::string_view name) noexcept {
  return detail::is_call(name, "DeviceSynchronize", true, false, true) || detail::is_call(name, "CtxSynchronize", true, false, true);
}

/// cudaStreamSynchronize, cuStreamSynchronize, hipStreamSynchronize. O(1).
[[nodiscard]] constexpr bool is_stream_sync_call(std::string_view name) noexcept {
  return detail::is_call(name, "StreamSynchronize", true, true, true);
}

/// cudaEventSynchronize, cuEventSynchronize, hipEventSynchronize. O(1).
[[nodiscard]] constexpr bool is_event_sync_call(std::string_view name) noexcept {
  return detail::is_call(name, "EventSynchronize", true, true, true);
}

/// cudaEventQuery, cudaStreamQuery and their driver and HIP names: a poll when repeated. O(1).
[[nodiscard]] constexpr bool is_query_call(std::string_view name) noexcept {
  return detail::is_call(name, "EventQuery", true, true, true) || detail::is_call(name, "StreamQuery", true, true, true);
}

/// cudaEventRecord (any variant, e.g. cudaEventRecordWithFlags) or hipEventRecord. O(1).
[[nodiscard]] constexpr bool is_event_record_call(std::string_view name) noexcept {
  return name.starts_with("cudaEventRecord") || name.starts_with("hipEventRecord");
}

/// cudaStreamWaitEvent, cuStreamWaitEvent, hipStreamWaitEvent. O(1).
[[nodiscard]] constexpr bool is_stream_wait_event_call(std::string_view name) noexcept {
  return detail::is_call(name, "StreamWaitEvent", true, true, true);
}

}  // namespace lumos::trace

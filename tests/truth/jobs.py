"""The generated jobs: small training programs that each stress one CUDA/PyTorch behaviour.

Each function returns a `program.Job`. Durations come from `ThreadBuilder.draw` (hash-seeded,
fixed), so every job is the same on every run. Streams: 7 compute, 20 side copies, 24 NCCL
collectives, 28 NCCL point-to-point."""
from __future__ import annotations

from program import (AnnotationBegin, AnnotationEnd, Busy, Comm, DeviceSync, EventPoll, EventRecord,
                     EventSync, Gpu, GraphLaunch, Idle, Job, Launch, OpBegin, OpEnd, Rank, StreamSync,
                     StreamWaitEvent, ThreadBuilder)

COMPUTE, COPY, NCCL, P2P = 7, 20, 24, 28
STEPS = 4


def _steps(b: ThreadBuilder, body, steps: int = STEPS) -> None:
    """ProfilerStep#1..steps around `body(b, n)`, with the profiler's small gap between steps."""
    for n in range(1, steps + 1):
        b.add(AnnotationBegin(f"ProfilerStep#{n}"), Idle(b.draw(5_000, 15_000)))
        body(b, n)
        b.add(AnnotationEnd(), Idle(b.draw(10_000, 30_000)))


def _skewed(b: ThreadBuilder, factor: float):
    """`draw(lo, hi)` of `b` times `factor`: a rank whose CPU or GPU is that much slower."""
    return lambda lo, hi: round(b.draw(lo, hi) * factor)


def gpu_bound() -> Job:
    """(a) Big kernels, light CPU: the CPU runs ahead, a launch queue forms, one
    cudaDeviceSynchronize per step drains it."""
    b = ThreadBuilder("gpu_bound")

    def step(b, n):
        b.add(Idle(b.draw(150_000, 250_000)))  # data loader hands over the next batch
        for layer in range(24):
            b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                        b.draw(150_000, 400_000), b.draw(15_000, 25_000))
            b.kernel_op("aten::gelu", "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", COMPUTE,
                        b.draw(40_000, 80_000), b.draw(8_000, 12_000))
            b.add(Idle(b.draw(2_000, 4_000)))
        for layer in range(24):
            for _ in range(2):
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64", COMPUTE,
                            b.draw(200_000, 500_000), b.draw(15_000, 25_000))
            b.add(Idle(b.draw(2_000, 4_000)))
        for _ in range(10):
            b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, b.draw(40_000, 60_000),
                        b.draw(20_000, 30_000))
        b.add(DeviceSync())

    _steps(b, step)
    return Job("gpu_bound", [Rank([b.actions])], step=3, relative_time=True,
               description="GPU-bound steps, launch queue, device sync per step")


def spill() -> Job:
    """(a') GPU-bound steps with no sync inside them: each step's GPU work runs on past the next
    step's annotation start, so the metric's begin_N = max(a0, end_{N-1}) clause matters and the
    launch queue carries over step boundaries. One cudaDeviceSynchronize after the last step."""
    b = ThreadBuilder("spill")

    def step(b, n):
        b.add(Idle(b.draw(100_000, 200_000)))
        for layer in range(30):
            b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                        b.draw(100_000, 250_000), b.draw(15_000, 25_000))
            b.add(Idle(b.draw(2_000, 4_000)))

    _steps(b, step)
    b.add(DeviceSync())
    return Job("spill", [Rank([b.actions])], step=3, relative_time=False,
               description="GPU-bound steps without syncs: GPU work spills into the next step")


def cpu_bound() -> Job:
    """(b) Tiny kernels under heavy per-op Python time, plus a data-loading idle gap: the GPU
    idles between kernels; `loss.item()` ends the step."""
    b = ThreadBuilder("cpu_bound")

    def step(b, n):
        b.add(Idle(b.draw(600_000, 900_000)))  # waiting for a data-loader worker
        for i in range(260):
            if i % 5 == 0:
                b.op("aten::layer_norm",
                     Launch(Gpu("vectorized_layer_norm_kernel", COMPUTE, b.draw(3_000, 8_000))),
                     Busy(b.draw(5_000, 10_000)),
                     Launch(Gpu("elementwise_kernel", COMPUTE, b.draw(2_000, 5_000))),
                     pre=b.draw(15_000, 30_000), post=b.draw(3_000, 6_000))
            else:
                b.kernel_op("aten::add", "vectorized_elementwise_kernel", COMPUTE, b.draw(2_000, 8_000),
                            b.draw(20_000, 40_000))
            b.add(Idle(b.draw(1_000, 3_000)))
        b.item(COMPUTE, b.draw(8_000, 12_000))

    _steps(b, step)
    return Job("cpu_bound", [Rank([b.actions])], step=3, relative_time=False,
               description="CPU-bound steps, tiny kernels, data-loading gap, .item() per step")


def side_stream() -> Job:
    """(c) A prefetcher copies the next batch on a side stream (record on the copy stream, the
    compute stream waits before using it), and activations are offloaded the other way
    (record on compute, the copy stream waits; the optimizer waits for the offload)."""
    b = ThreadBuilder("side_stream")

    def prefetch(b, batch):
        for i in range(3):
            b.op("aten::copy_", Launch(Gpu("Memcpy HtoD (Pinned -> Device)", COPY, b.draw(250_000, 400_000),
                                           cat="gpu_memcpy", bytes=16 << 20), api="cudaMemcpyAsync"),
                 pre=b.draw(10_000, 15_000), post=b.draw(3_000, 5_000))
        b.op("aten::record_stream", EventRecord(f"batch{batch}", COPY), pre=b.draw(2_000, 4_000))

    def step(b, n):
        b.op("wait_stream", StreamWaitEvent(COMPUTE, f"batch{n}"), pre=b.draw(2_000, 4_000))
        prefetch(b, n + 1)
        for layer in range(12):
            b.kernel_op("aten::mm", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", COMPUTE,
                        b.draw(120_000, 250_000), b.draw(15_000, 25_000))
            b.kernel_op("aten::relu", "vectorized_elementwise_kernel", COMPUTE, b.draw(20_000, 40_000),
                        b.draw(8_000, 12_000))
            if layer == 5:  # offload activations on the copy stream
                b.op("offload", EventRecord(f"act{n}", COMPUTE), StreamWaitEvent(COPY, f"act{n}"),
                     Launch(Gpu("Memcpy DtoH (Device -> Pinned)", COPY, b.draw(300_000, 500_000),
                                cat="gpu_memcpy", bytes=32 << 20), api="cudaMemcpyAsync"),
                     EventRecord(f"offload{n}", COPY), pre=b.draw(5_000, 8_000))
        for layer in range(12):
            b.kernel_op("aten::mm", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn", COMPUTE,
                        b.draw(150_000, 300_000), b.draw(15_000, 25_000))
        b.op("wait_stream", StreamWaitEvent(COMPUTE, f"offload{n}"), pre=b.draw(2_000, 4_000))
        for _ in range(6):
            b.kernel_op("aten::_foreach_mul_", "multi_tensor_apply_kernel", COMPUTE, b.draw(30_000, 50_000),
                        b.draw(15_000, 25_000))
        b.item(COMPUTE, b.draw(8_000, 12_000))

    prefetch(b, 1)
    b.add(Idle(50_000))
    _steps(b, step)
    return Job("side_stream", [Rank([b.actions])], step=3, relative_time=True,
               description="H2D prefetch and D2H offload on a side stream with event record/wait",
               variants=("sync", "nosync", "norecord"))


def polling() -> Job:
    """(d) Inference-style chunks: the CPU records an event after each chunk and polls it with
    cudaEventQuery (sleeping between polls) before post-processing the result on the CPU."""
    b = ThreadBuilder("polling")

    def step(b, n):
        b.add(Idle(b.draw(80_000, 120_000)))
        for chunk in range(3):
            for i in range(30):
                b.kernel_op("aten::linear", "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n", COMPUTE,
                            b.draw(30_000, 120_000), b.draw(10_000, 20_000))
            b.add(EventRecord(f"chunk{n}.{chunk}", COMPUTE), EventPoll(f"chunk{n}.{chunk}"))
            b.op("postprocess", pre=b.draw(150_000, 250_000))

    _steps(b, step)
    return Job("polling", [Rank([b.actions])], step=3, relative_time=False,
               description="cudaEventQuery polling loops")


def item_sync() -> Job:
    """(e) Synchronous copies mid-step: `.item()` as PyTorch 2.x does it (cudaMemcpyAsync +
    cudaStreamSynchronize), the older blocking cudaMemcpy, and a cudaEventSynchronize."""
    b = ThreadBuilder("item_sync")

    def kernels(b, count):
        for _ in range(count):
            b.kernel_op("aten::mm", "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n", COMPUTE, b.draw(60_000, 200_000),
                        b.draw(12_000, 20_000))

    def step(b, n):
        b.add(Idle(b.draw(100_000, 200_000)))
        kernels(b, 20)
        b.item(COMPUTE, b.draw(8_000, 12_000))
        b.op("python_logic", pre=b.draw(100_000, 150_000))
        kernels(b, 20)
        b.legacy_item(COMPUTE, b.draw(8_000, 12_000))
        kernels(b, 15)
        b.add(EventRecord(f"done{n}", COMPUTE), EventSync(f"done{n}"))

    _steps(b, step)
    return Job("item_sync", [Rank([b.actions])], step=3, relative_time=True,
               description=".item() (2.x and legacy cudaMemcpy) and cudaEventSynchronize mid-step")


def data_parallel() -> Job:
    """(f) 4-rank DDP: gradient buckets all-reduced on the NCCL stream while backward goes on;
    the optimizer waits for every bucket. Arrival skew: rank 1's CPU is slower, rank 2's GPU is
    slower, rank 3's data loader is slower."""
    world, buckets, layers = 4, 4, 16
    cpu_factor = [1.0, 1.4, 1.0, 1.0]
    gpu_factor = [1.0, 1.0, 1.15, 1.0]
    loader = [(250_000, 350_000), (250_000, 350_000), (250_000, 350_000), (800_000, 1_000_000)]
    ranks = []
    for r in range(world):
        b = ThreadBuilder(f"data_parallel/{r}")
        seq = [0]

        busy, gpu = _skewed(b, cpu_factor[r]), _skewed(b, gpu_factor[r])

        def allreduce(b, n, bucket, r=r, seq=seq):
            seq[0] += 1
            nelems = (24 + 4 * bucket) << 20
            args = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": nelems,
                    "Out msg nelems": nelems, "Group size": world, "Process Group Name": "0",
                    "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1, 2, 3]",
                    "Rank": r, "Seq": seq[0]}
            transfer = ThreadBuilder(f"data_parallel/transfer/{n}/{bucket}").draw(600_000, 900_000)
            comm = Comm(("dp", seq[0]), world, transfer, args)
            b.add(OpBegin("c10d::allreduce_"), OpBegin("record_param_comms", args), Busy(busy(10_000, 20_000)),
                  EventRecord(f"grad{n}.{bucket}", COMPUTE), StreamWaitEvent(NCCL, f"grad{n}.{bucket}"),
                  Launch(Gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL", NCCL, comm=comm), api="cudaLaunchKernelExC"),
                  EventRecord(f"allreduce{n}.{bucket}", NCCL), OpEnd(), OpEnd())

        def step(b, n, r=r):
            b.add(Idle(b.draw(*loader[r])))
            for layer in range(layers):
                b.kernel_op("aten::mm", "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", COMPUTE, gpu(150_000, 300_000),
                            busy(20_000, 30_000))
                b.kernel_op("aten::gelu", "vectorized_elementwise_kernel", COMPUTE, gpu(30_000, 60_000),
                            busy(8_000, 12_000))
            for layer in range(layers):
                for _ in range(2):
                    b.kernel_op("aten::mm", "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n", COMPUTE,
                                gpu(120_000, 250_000), busy(20_000, 30_000))
                if layer % (layers // buckets) == layers // buckets - 1:
                    allreduce(b, n, layer // (layers // buckets))
            for bucket in range(buckets):
                b.op("Work.wait", StreamWaitEvent(COMPUTE, f"allreduce{n}.{bucket}"), pre=busy(3_000, 5_000))
            for _ in range(8):
                b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, gpu(40_000, 70_000),
                            busy(20_000, 30_000))
            b.item(COMPUTE, busy(8_000, 12_000))

        _steps(b, step)
        ranks.append(Rank([b.actions], start_ns=23_000 * r))
    return Job("data_parallel", ranks, step=3, relative_time=False,
               description="4-rank DDP, bucketed all-reduce overlapping backward, arrival skew")


def pipeline() -> Job:
    """(g) Two pipeline stages, 1F1B over 4 micro-batches: forward of each micro-batch replayed
    as a CUDA graph, backward launched kernel by kernel; activations and gradients cross stages by
    NCCL SendRecv on a p2p stream (Megatron's fused send_forward_recv_backward /
    send_backward_recv_forward in the steady state)."""
    micro = 4
    stage_speed = [1.0, 1.2]   # the last stage also computes the loss: slower
    ranks = []
    for s in range(2):
        b = ThreadBuilder(f"pipeline/{s}")
        exchange = [0]

        def p2p(b, n, send, recv, s=s, exchange=exchange):
            """One fused exchange with the other stage; the compute stream waits for it if it receives."""
            exchange[0] += 1
            k = exchange[0]
            name = "coalesced" if send and recv else ("send" if send else "recv")
            args = {"Collective name": name, "dtype": "BFloat16", "In msg nelems": 4 << 20,
                    "Out msg nelems": 4 << 20, "Group size": 2, "Process Group Name": "1",
                    "Process Group Description": "pipeline_pg", "Process Group Ranks": "[0, 1]"}
            transfer = ThreadBuilder(f"pipeline/transfer/{n}/{k}").draw(150_000, 250_000)
            comm = Comm(("pp", n, k), 2, transfer, args, args_on_kernel=False)
            b.add(OpBegin("record_param_comms", args), Busy(b.draw(15_000, 25_000)))
            if send:
                b.add(EventRecord(f"out{n}.{k}", COMPUTE), StreamWaitEvent(P2P, f"out{n}.{k}"))
            b.add(Launch(Gpu("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", P2P, comm=comm),
                         api="cudaLaunchKernelExC"),
                  EventRecord(f"p2p{n}.{k}", P2P), OpEnd())
            if recv:
                b.op("Work.wait", StreamWaitEvent(COMPUTE, f"p2p{n}.{k}"), pre=b.draw(3_000, 5_000))

        def forward(b, n, m, s=s):
            kernels = tuple(Gpu("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn", COMPUTE,
                                round(b.draw(80_000, 150_000) * stage_speed[s])) for _ in range(6))
            b.op("CUDAGraph.replay", GraphLaunch(COMPUTE, kernels, graph_id=1 + s),
                 pre=b.draw(20_000, 30_000), post=b.draw(5_000, 8_000))

        def backward(b, n, m, s=s):
            for _ in range(12):
                b.kernel_op("aten::mm", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn", COMPUTE,
                            round(b.draw(100_000, 200_000) * stage_speed[s]), b.draw(15_000, 25_000))

        def step(b, n, s=s, exchange=exchange):
            exchange[0] = 0
            if s == 0:
                b.add(Idle(b.draw(150_000, 250_000)))
                forward(b, n, 0)
                p2p(b, n, send=True, recv=False)
                for m in range(micro - 1):
                    forward(b, n, m + 1)
                    p2p(b, n, send=True, recv=True)
                    backward(b, n, m)
                p2p(b, n, send=False, recv=True)
                backward(b, n, micro - 1)
            else:
                p2p(b, n, send=False, recv=True)
                for m in range(micro):
                    forward(b, n, m)
                    backward(b, n, m)
                    p2p(b, n, send=True, recv=m < micro - 1)
            for _ in range(6):
                b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, b.draw(30_000, 50_000),
                            b.draw(20_000, 30_000))
            if s == 1:
                b.item(COMPUTE, b.draw(8_000, 12_000))
            else:
                b.add(StreamSync(COMPUTE))

        _steps(b, step)
        ranks.append(Rank([b.actions], start_ns=41_000 * s))
    return Job("pipeline", ranks, step=3, relative_time=True,
               description="2-stage 1F1B, 4 micro-batches, p2p SendRecv, CUDA-graph forward")


def _collective(b, name: str, kernel: str, stream: int, key: tuple, world: int, rank: int, seq: int, transfer_ns: int,
                nelems: int, dtype: str, group: str, busy_ns: int, extra: dict | None = None) -> None:
    """One c10d collective as PyTorch records it (record_param_comms with its args, the NCCL
    kernel launched on `stream`), with an event `key` recorded on `stream` after it."""
    args = {"Collective name": name, "dtype": dtype, "In msg nelems": nelems, "Out msg nelems": nelems,
            "Group size": world, "Process Group Name": group, "Process Group Description": group,
            "Process Group Ranks": "[" + ", ".join(str(r) for r in range(world)) + "]", "Rank": rank, "Seq": seq}
    args.update(extra or {})
    comm = Comm(key, world, transfer_ns, args)
    b.add(OpBegin("record_param_comms", args), Busy(busy_ns),
          Launch(Gpu(kernel, stream, comm=comm), api="cudaLaunchKernelExC"),
          EventRecord("/".join(str(k) for k in key), stream), OpEnd())


def fsdp() -> Job:
    """(h) 4-rank FSDP2 (fully_shard per layer, reshard after forward): each layer's parameters
    are all-gathered on an all-gather stream one layer ahead of the compute that waits for them,
    in forward and again in backward; each layer's gradients are reduce-scattered on a stream of
    their own while backward goes on; the optimizer steps the shards after the last one. Skew:
    rank 1's CPU and rank 3's GPU are slower."""
    world, layers = 4, 8
    AG, RS = 24, 26
    cpu_factor = [1.0, 1.3, 1.0, 1.0]
    gpu_factor = [1.0, 1.0, 1.0, 1.2]
    ranks = []
    for r in range(world):
        b = ThreadBuilder(f"fsdp/{r}")
        seq = [0]

        busy, gpu = _skewed(b, cpu_factor[r]), _skewed(b, gpu_factor[r])

        def gather(b, n, phase, layer, r=r, seq=seq):
            seq[0] += 1
            key = ("ag", n, phase, layer)
            transfer = ThreadBuilder("fsdp/transfer/" + "/".join(map(str, key))).draw(120_000, 200_000)
            b.add(OpBegin("FSDP::all_gather"))
            b.kernel_op("FSDP::all_gather_copy_in", "void at::native::(anonymous namespace)::CatArrayBatchedCopy", AG,
                        gpu(10_000, 20_000), busy(8_000, 12_000))
            _collective(b, "_allgather_base", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", AG,
                        key, world, r, seq[0], transfer, 32 << 20, "BFloat16", "FSDP_SHARD_GROUP", busy(10_000, 15_000))
            b.add(OpEnd())

        def wait_gather(b, n, phase, layer):
            b.op("FSDP::all_gather_copy_out", StreamWaitEvent(COMPUTE, f"ag/{n}/{phase}/{layer}"),
                 Launch(Gpu("void at::native::(anonymous namespace)::split_with_sizes_copy_out_contiguous_no_cast_kernel",
                            COMPUTE, gpu(8_000, 15_000))), pre=busy(6_000, 10_000))

        def reduce(b, n, layer, r=r, seq=seq):
            seq[0] += 1
            key = ("rs", n, layer)
            transfer = ThreadBuilder("fsdp/transfer/" + "/".join(map(str, key))).draw(150_000, 250_000)
            b.add(OpBegin("FSDP::post_backward_reduce"), EventRecord(f"grad{n}.{layer}", COMPUTE),
                  StreamWaitEvent(RS, f"grad{n}.{layer}"))
            _collective(b, "_reduce_scatter_base", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                        RS, key, world, r, seq[0], transfer, 64 << 20, "Float", "FSDP_SHARD_GROUP", busy(10_000, 15_000))
            b.add(OpEnd())

        def step(b, n, r=r):
            b.add(Idle(b.draw(200_000, 300_000)))
            gather(b, n, "f", 0)
            for layer in range(layers):
                if layer + 1 < layers:
                    gather(b, n, "f", layer + 1)
                wait_gather(b, n, "f", layer)
                for _ in range(3):
                    b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                                gpu(100_000, 200_000), busy(15_000, 25_000))
            gather(b, n, "b", layers - 1)
            for layer in reversed(range(layers)):
                if layer > 0:
                    gather(b, n, "b", layer - 1)
                wait_gather(b, n, "b", layer)
                for _ in range(6):
                    b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64", COMPUTE,
                                gpu(90_000, 180_000), busy(15_000, 25_000))
                reduce(b, n, layer)
            b.op("FSDP::root_post_backward", StreamWaitEvent(COMPUTE, f"rs/{n}/0"), pre=busy(5_000, 8_000))
            for _ in range(4):
                b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, gpu(15_000, 30_000),
                            busy(20_000, 30_000))
            b.item(COMPUTE, busy(8_000, 12_000))

        _steps(b, step)
        ranks.append(Rank([b.actions], start_ns=17_000 * r))
    # Only with cuda_sync rows: without them the compute stream's wait for layer l's gather cannot
    # be told from a wait for layer l+1's, whose record the CPU issued just before (docs/replay.md).
    return Job("fsdp", ranks, step=3, relative_time=False,
               description="4-rank FSDP2: per-layer all-gathers prefetched on a side stream, reduce-scatters beside backward",
               variants=("sync",))


def context_parallel() -> Job:
    """(i) Ring attention over a context-parallel group of 2 (Megatron/TE's p2p variant): in each
    layer's attention the key/value chunk of the peer arrives by NCCL SendRecv on a p2p stream while
    the attention of the local chunk runs; the second chunk's attention waits for it. Backward
    sends the gradients of the chunk back the same way. The gradients are all-reduced over the
    2 ranks (data x context parallel) at the end. Rank 1's GPU is slower (more of the causal work)."""
    world, layers = 2, 6
    gpu_factor = [1.0, 1.1]
    ranks = []
    for r in range(world):
        b = ThreadBuilder(f"context_parallel/{r}")
        seq = [0]

        gpu = _skewed(b, gpu_factor[r])

        def exchange(b, n, tag, r=r, seq=seq):
            seq[0] += 1
            key = ("cp", n, tag)
            transfer = ThreadBuilder("context_parallel/transfer/" + "/".join(map(str, key))).draw(80_000, 140_000)
            b.add(EventRecord(f"kv{n}.{tag}", COMPUTE), StreamWaitEvent(P2P, f"kv{n}.{tag}"))
            _collective(b, "coalesced", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", P2P, key, world, r,
                        seq[0], transfer, 8 << 20, "BFloat16", "CONTEXT_PARALLEL_GROUP", b.draw(10_000, 15_000))

        def attention(b, n, tag, kernel):
            exchange(b, n, tag)
            b.kernel_op("flash_attn::_flash_attn_forward" if "fwd" in kernel else "flash_attn::_flash_attn_backward",
                        kernel, COMPUTE, gpu(150_000, 250_000), b.draw(20_000, 30_000))
            b.op("Work.wait", StreamWaitEvent(COMPUTE, f"cp/{n}/{tag}"), pre=b.draw(3_000, 5_000))
            b.kernel_op("flash_attn::_flash_attn_forward" if "fwd" in kernel else "flash_attn::_flash_attn_backward",
                        kernel, COMPUTE, gpu(100_000, 200_000), b.draw(20_000, 30_000))

        def step(b, n, r=r, seq=seq):
            b.add(Idle(b.draw(150_000, 250_000)))
            for layer in range(layers):
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                            gpu(80_000, 150_000), b.draw(15_000, 25_000))
                attention(b, n, f"f{layer}", "flash_fwd_kernel")
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                            gpu(150_000, 250_000), b.draw(15_000, 25_000))
            for layer in reversed(range(layers)):
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64", COMPUTE,
                            gpu(250_000, 400_000), b.draw(15_000, 25_000))
                attention(b, n, f"b{layer}", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel")
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64", COMPUTE,
                            gpu(120_000, 200_000), b.draw(15_000, 25_000))
            seq[0] += 1
            key = ("grad", n)
            transfer = ThreadBuilder(f"context_parallel/transfer/grad/{n}").draw(500_000, 700_000)
            b.add(EventRecord(f"grads{n}", COMPUTE), StreamWaitEvent(NCCL, f"grads{n}"))
            _collective(b, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", NCCL, key, world, r, seq[0], transfer,
                        48 << 20, "Float", "DATA_PARALLEL_GROUP_WITH_CP", b.draw(10_000, 15_000))
            b.op("Work.wait", StreamWaitEvent(COMPUTE, f"grad/{n}"), pre=b.draw(3_000, 5_000))
            for _ in range(4):
                b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, gpu(30_000, 50_000),
                            b.draw(20_000, 30_000))
            b.item(COMPUTE, b.draw(8_000, 12_000))

        _steps(b, step)
        ranks.append(Rank([b.actions], start_ns=29_000 * r))
    return Job("context_parallel", ranks, step=3, relative_time=True,
               description="context parallel 2: ring attention, KV exchange by SendRecv beside the attention")


def expert_parallel() -> Job:
    """(j) Mixture of experts over an expert-parallel group of 4 (Megatron's dropless all-to-all
    dispatcher): per layer the router runs, the token counts are copied to the host (the CPU
    waits for them: the all-to-all needs its split sizes), the tokens are dispatched by an
    all-to-all with uneven splits, the local experts' grouped GEMM runs, and an all-to-all
    combines the results. Rank 2 holds a straggler expert (about 1.8x the tokens): its expert GEMMs
    are longer and every rank's combine waits for it. Backward has the two all-to-alls in reverse
    and no host sync (the split sizes are known)."""
    world, layers = 4, 4
    load = [1.0, 0.8, 1.8, 0.9]  # tokens each rank's experts receive, relative to balanced
    ranks = []
    for r in range(world):
        b = ThreadBuilder(f"expert_parallel/{r}")
        seq = [0]
        splits = lambda k, r=r: "[" + ", ".join(str(int(1024 * load[p] * (1.0 if k == "in" else load[r]))) for p in range(world)) + "]"

        def all_to_all(b, n, tag, r=r, seq=seq):
            seq[0] += 1
            key = ("a2a", n, tag)
            transfer = ThreadBuilder("expert_parallel/transfer/" + "/".join(map(str, key))).draw(60_000, 120_000)
            b.add(EventRecord(f"tok{n}.{tag}", COMPUTE), StreamWaitEvent(NCCL, f"tok{n}.{tag}"))
            _collective(b, "all_to_allv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", NCCL, key, world, r,
                        seq[0], transfer, 4 << 20, "BFloat16", "EXPERT_MODEL_PARALLEL_GROUP", b.draw(10_000, 15_000),
                        {"In split size": splits("in"), "Out split size": splits("out")})
            b.op("Work.wait", StreamWaitEvent(COMPUTE, f"a2a/{n}/{tag}"), pre=b.draw(3_000, 5_000))

        def experts(b, lo, hi, r=r):
            for _ in range(2):
                b.kernel_op("aten::_grouped_mm", "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>",
                            COMPUTE, round(b.draw(lo, hi) * load[r]), b.draw(15_000, 25_000))

        def step(b, n):
            b.add(Idle(b.draw(150_000, 250_000)))
            for layer in range(layers):
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", COMPUTE,
                            b.draw(150_000, 250_000), b.draw(15_000, 25_000))
                b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", COMPUTE,
                            b.draw(10_000, 20_000), b.draw(15_000, 25_000))  # router
                b.kernel_op("aten::topk", "void at::native::sbtopk::gatherTopK", COMPUTE, b.draw(8_000, 15_000),
                            b.draw(10_000, 15_000))
                b.item(COMPUTE, b.draw(8_000, 12_000))  # token counts to the host
                b.kernel_op("moe::permute", "moe_permute_kernel", COMPUTE, b.draw(20_000, 40_000), b.draw(10_000, 15_000))
                all_to_all(b, n, f"d{layer}")
                experts(b, 100_000, 160_000)
                all_to_all(b, n, f"c{layer}")
                b.kernel_op("moe::unpermute", "moe_unpermute_kernel", COMPUTE, b.draw(20_000, 40_000),
                            b.draw(10_000, 15_000))
            for layer in reversed(range(layers)):
                b.kernel_op("moe::unpermute_backward", "moe_permute_kernel", COMPUTE, b.draw(20_000, 40_000),
                            b.draw(10_000, 15_000))
                all_to_all(b, n, f"bc{layer}")
                experts(b, 180_000, 300_000)
                all_to_all(b, n, f"bd{layer}")
                for _ in range(2):
                    b.kernel_op("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64", COMPUTE,
                                b.draw(150_000, 250_000), b.draw(15_000, 25_000))
            for _ in range(4):
                b.kernel_op("aten::_foreach_add_", "multi_tensor_apply_kernel", COMPUTE, b.draw(30_000, 50_000),
                            b.draw(20_000, 30_000))
            b.item(COMPUTE, b.draw(8_000, 12_000))

        _steps(b, step)
        ranks.append(Rank([b.actions], start_ns=11_000 * r))
    return Job("expert_parallel", ranks, step=3, relative_time=False,
               description="expert parallel 4: dropless all-to-all dispatch with uneven splits, a straggler expert, host sync")


ALL = [gpu_bound, spill, cpu_bound, side_stream, polling, item_sync, data_parallel, pipeline, fsdp,
       context_parallel, expert_parallel]

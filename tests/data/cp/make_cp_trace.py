#!/usr/bin/env python3
"""Writes small hand-made Kineto traces of context-parallel training as Transformer Engine runs
ring attention (`AttnFuncWithCPAndKVP2P`), for the CP structure-discovery tests
(tests/whatif/test_structure_cp.cpp).

The construction, which the tests assert:
  - 2 layers, each inside a `TransformerLayer` record_function scope: the QKV GEMM, TE's
    `te::AttnFuncWithCPAndKVP2P` attention operator, the output projection, a residual add and
    a GELU MLP of FFN 4h;
  - hidden 256, 4 heads of 64, sequence 8192 over CP 2: each rank holds 4096 tokens (micro-batch 1);
  - inside each attention operator the ring: CP - 1 = 1 step, a `record_param_comms` send/recv
    (`ncclDevKernel_SendRecv`) of the K/V chunk on a stream of its own (stream 20), between the
    two `flash_attn::_flash_attn_forward` operators (q, k, v [1, 4096, 4, 64]: the rank's chunk)
    of the chunk in hand and the chunk received;
  - the forward in a `## forward ##` annotation, a backward pass on the autograd thread in a
    `## backward ##` one (the attention's backward exchanges too) and an optimizer step, all in
    ProfilerStep#1.

`te_cp2`: both ranks, the group described as torchtitan names it (`cp`).
`te_cp2_undescribed`: rank 0 alone (its peer absent), the group without a description: only
where its send/recv run (inside the attention) tells it is context parallelism.

Run from anywhere: python3 tests/data/cp/make_cp_trace.py  (deterministic output).
"""
import json
import os

HIDDEN, HEADS, HEAD_DIM, SEQ, CP, MBS = 256, 4, 64, 8192, 2, 1
LOCAL = SEQ // CP
TOKENS = LOCAL * MBS
LAYERS = 2
KV_CHUNK = 2 * MBS * LOCAL * HEADS * HEAD_DIM  # K and V elements of a rank's chunk

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl, at::detail::Array<char*, 2> >"
FLASH_FWD = "void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t> >"
FLASH_BWD = "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t> >"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


class Rank:
    def __init__(self, rank, described):
        self.rank = rank
        self.described = described
        self.events = []
        self.t = 1000.0  # µs; CPU cursor
        self.corr = 1
        self.ext = 1
        self.free = {7: 0.0, 20: 0.0}
        self.pid, self.main, self.autograd = 100 + rank, 1, 2

    def x(self, cat, name, tid, ts, dur, args=None, pid=None):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid if pid is None else pid, "tid": tid,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args or {}})

    def launch(self, kernel, tid, dur=8.0, kargs=None, stream=7, after=0.0):
        c = self.corr
        self.corr += 1
        call = self.t
        self.x("cuda_runtime", "cudaLaunchKernel", tid, call, 2.0, {"correlation": c, "cbid": 211})
        start = max(call + 3.0, self.free[stream], after)
        args = {"device": 0, "stream": stream, "correlation": c, "External id": self.ext}
        args.update(kargs or {})
        self.x("kernel", kernel, stream, start, dur, args, pid=0)
        self.free[stream] = start + dur
        self.t = call + 4.0
        return start + dur

    def op(self, name, tid, dims, kernel=None, dur=8.0):
        begin = self.t
        self.t += 1.0
        self.ext += 1
        if kernel:
            self.launch(kernel, tid, dur)
        self.t += 1.0
        args = {"External id": self.ext}
        if dims is not None:
            args["Input Dims"] = dims
        self.x("cpu_op", name, tid, begin, self.t - begin, args)

    def scope(self, name, tid, body):
        begin = self.t
        self.t += 1.0
        body()
        self.t += 1.0
        self.x("user_annotation", name, tid, begin, self.t - begin)

    def exchange(self, tid, elements):
        """One ring step: record_param_comms around the NCCL send/recv on the CP stream."""
        args = {"Collective name": "send", "Process Group Name": "5", "Process Group Ranks": "[0, 1]", "Group size": CP,
                "dtype": "BFloat16", "In msg nelems": elements, "Out msg nelems": elements}
        if self.described:
            args["Process Group Description"] = "cp"
        begin = self.t
        self.t += 0.5
        self.ext += 1
        self.launch(SENDRECV, tid, 12.0, args, stream=20, after=self.free[7])
        self.t += 0.5
        self.x("cpu_op", "record_param_comms", tid, begin, self.t - begin, {"External id": self.ext})

    def attention(self, tid, name, kernel, elements, dur):
        """TE's CP attention: flash-attn on the chunk in hand, the exchange beside it, flash-attn
        on the chunk received."""
        begin = self.t
        self.t += 1.0
        self.ext += 1
        outer = self.ext
        dims = [[MBS, LOCAL, HEADS, HEAD_DIM]] * 3
        self.op(name, tid, dims, kernel, dur)
        self.exchange(tid, elements)
        self.op(name, tid, dims, kernel, dur)
        self.t += 1.0
        self.x("cpu_op", "te::AttnFuncWithCPAndKVP2P", tid, begin, self.t - begin, {"External id": outer})


def layer(rk):
    tid = rk.main
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, 3 * HIDDEN]], GEMM)
    rk.attention(tid, "flash_attn::_flash_attn_forward", FLASH_FWD, KV_CHUNK, 20.0)
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::add", tid, [[TOKENS, HIDDEN], [TOKENS, HIDDEN]], EW)
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, 4 * HIDDEN]], GEMM)
    rk.op("aten::gelu", tid, [[TOKENS, 4 * HIDDEN]], GELU)
    rk.op("aten::mm", tid, [[TOKENS, 4 * HIDDEN], [4 * HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::add", tid, [[TOKENS, HIDDEN], [TOKENS, HIDDEN]], EW)


def step(rk):
    begin = rk.t
    rk.op("aten::embedding", rk.main, [[32000, HIDDEN], [MBS, LOCAL]], "void at::native::indexSelectLargeIndex<c10::BFloat16>")
    def forward():
        for _ in range(LAYERS):
            rk.scope("TransformerLayer", rk.main, lambda: layer(rk))
        rk.op("aten::mm", rk.main, [[TOKENS, HIDDEN], [HIDDEN, 32000]], GEMM)

    def backward():
        for _ in range(LAYERS):
            rk.op("autograd::engine::evaluate_function: MmBackward0", rk.autograd, None, GEMM)
            rk.attention(rk.autograd, "flash_attn::_flash_attn_backward", FLASH_BWD, 2 * KV_CHUNK, 50.0)
            rk.op("autograd::engine::evaluate_function: MmBackward0", rk.autograd, None, GEMM)

    rk.scope("## forward ##", rk.main, forward)
    rk.t += 5.0
    rk.scope("## backward ##", rk.autograd, backward)
    rk.t += 2.0
    rk.scope("Optimizer.step#AdamW.step", rk.main,
             lambda: rk.op("aten::_foreach_add_", rk.main, None, "void multi_tensor_apply_kernel<AdamFunctor<c10::BFloat16>>"))
    rk.t += 5.0
    rk.x("user_annotation", "ProfilerStep#1", rk.main, begin - 1.0, rk.t - begin + 1.0)


def write(rk, name):
    rk.events.sort(key=lambda e: (e["ts"], -e["dur"]))
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85045870592,
                                 "computeMajor": 9, "computeMinor": 0}],
           "distributedInfo": {"backend": "nccl", "rank": rk.rank, "world_size": CP},
           "traceEvents": rk.events,
           "traceName": f"{name} rank {rk.rank} (lumos tests/data/cp/make_cp_trace.py)"}
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rk.rank}.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def build():
    for r in range(CP):
        rk = Rank(r, True)
        step(rk)
        write(rk, "te_cp2")
    rk = Rank(0, False)
    step(rk)
    write(rk, "te_cp2_undescribed")


if __name__ == "__main__":
    build()

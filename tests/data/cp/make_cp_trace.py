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
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in tests/data
sys.path.insert(0, os.path.dirname(HERE))
import kineto_writer  # noqa: E402

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


class Rank(kineto_writer.Rank):
    def __init__(self, rank, described):
        super().__init__(rank)
        self.described = described

    def exchange(self, tid, elements):
        """One ring step: record_param_comms around the NCCL send/recv on the CP stream."""
        args = {"Collective name": "send", "Process Group Name": "5", "Process Group Ranks": "[0, 1]", "Group size": CP,
                "dtype": "BFloat16", "In msg nelems": elements, "Out msg nelems": elements}
        if self.described:
            args["Process Group Description"] = "cp"
        self.comms(tid, SENDRECV, args, stream=20, dur=12.0, after=self.free[7])

    def attention(self, tid, name, kernel, elements, dur):
        """TE's CP attention: flash-attn on the chunk in hand, the exchange beside it, flash-attn
        on the chunk received."""
        begin = self.t
        self.t += 1.0
        self.ext += 1
        outer = self.ext
        dims = [[MBS, LOCAL, HEADS, HEAD_DIM]] * 3
        self.op(name, tid, dims, kernel, dur=dur)
        self.exchange(tid, elements)
        self.op(name, tid, dims, kernel, dur=dur)
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
    rk.close_step(begin, "aten::_foreach_add_", "void multi_tensor_apply_kernel<AdamFunctor<c10::BFloat16>>")


def write(rk, name):
    rk.write(os.path.join(HERE, name), CP, f"{name} rank {rk.rank} (lumos tests/data/cp/make_cp_trace.py)")


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

#!/usr/bin/env python3
"""Writes a small hand-made Kineto trace of one rank training a mixture-of-experts model the way
Hugging Face's Mixtral block runs it in PyTorch eager mode, for the MoE structure-discovery tests
(tests/whatif/test_structure_moe.cpp).

The construction, which the tests assert:
  - one rank (world 1, no expert parallelism), 2 decoder layers, each inside a
    `MixtralDecoderLayer` record_function scope: QKV and output-projection GEMMs around an SDPA
    attention op, then a MoE block;
  - hidden 256, expert FFN 512, sequence 128 × micro-batch 2 = 256 tokens, 4 experts, top-2;
  - the MoE block: the router GEMM (aten::mm [256, 256]·[256, 4]), aten::softmax, aten::topk,
    then a loop over the experts: aten::index gathers each expert's tokens, its gate and up
    GEMMs ([n, 256]·[256, 512]), SiLU, its down GEMM ([n, 512]·[512, 256]) and aten::index_add_;
  - unbalanced routing: the experts receive EXPERT_TOKENS = 200, 130, 90, 92 token copies
    (sum 512 = 256 tokens × top-2);
  - a backward pass on the autograd thread and an optimizer step, all in ProfilerStep#1.

`ep2_grouped_splits`: two ranks of expert parallelism 2 over the same shapes (2 experts per rank),
each MoE block a router, aten::topk, the dispatch all-to-all (`c10d::alltoall_base_` over
`record_param_comms`, an NCCL SendRecv kernel carrying `In split size` / `Out split size`), one
`aten::_grouped_mm` per expert GEMM over the rank's 2 experts, and the combine all-to-all back.
Rank r sends SENT[r][p] token copies to peer p (rank 0: 300, 212; rank 1: 180, 332), so rank 0's
experts compute 480 rows and rank 1's 544.

Run from anywhere: python3 tests/data/moe/make_moe_trace.py  (deterministic output).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in tests/data
sys.path.insert(0, os.path.dirname(HERE))
import kineto_writer  # noqa: E402

HIDDEN, EXPERT_FFN, SEQ, MBS, EXPERTS, TOP_K = 256, 512, 128, 2, 4, 2
TOKENS = SEQ * MBS
EXPERT_TOKENS = [200, 130, 90, 92]
LAYERS = 2
assert sum(EXPERT_TOKENS) == TOKENS * TOP_K


SENT = [[300, 212], [180, 332]]  # ep2_grouped_splits: token copies rank r sends to peer p
assert all(sum(row) == TOKENS * TOP_K for row in SENT)


TRACE_NAME = " (lumos tests/data/moe/make_moe_trace.py)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"


def attention(rk, tid):
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, 3 * HIDDEN]], GEMM)
    rk.op("aten::_scaled_dot_product_flash_attention", tid, [[MBS, 4, SEQ, 64], [MBS, 4, SEQ, 64], [MBS, 4, SEQ, 64], [], [], []],
          "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >")
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::add", tid, [[TOKENS, HIDDEN], [TOKENS, HIDDEN]], EW)


def all_to_all(rk, sent, received):
    """all_to_all_single of rows: c10d's operator around record_param_comms, its NCCL kernel."""
    args = {"Collective name": "all_to_all", "Process Group Name": "3", "Process Group Description": "EXPERT_MODEL_PARALLEL_GROUP",
            "Process Group Ranks": "[0, 1]", "Group size": 2, "dtype": "BFloat16",
            "In msg nelems": sum(sent) * HIDDEN, "Out msg nelems": sum(received) * HIDDEN,
            "In split size": "[" + ", ".join(map(str, sent)) + "]", "Out split size": "[" + ", ".join(map(str, received)) + "]"}
    begin = rk.t
    rk.t += 1.0
    rk.comms(rk.main, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", args, dur=20.0)
    rk.t += 1.0
    rk.x("cpu_op", "c10d::alltoall_base_", rk.main, begin, rk.t - begin,
         {"External id": rk.ext, "Input Dims": [[sum(received), HIDDEN], [sum(sent), HIDDEN], [], [], [], []]})


def grouped_layer(rk, r):
    tid = rk.main
    attention(rk, tid)
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, EXPERTS]], GEMM)
    rk.op("aten::topk", tid, [[TOKENS, EXPERTS], [], [], [], []], "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>")
    rk.op("aten::index_select", tid, [[TOKENS, HIDDEN], [], [TOKENS * TOP_K]],
          "void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>")
    sent = SENT[r]
    received = [SENT[p][r] for p in range(len(SENT))]
    all_to_all(rk, sent, received)
    rows, local = sum(received), EXPERTS // len(SENT)
    grouped = "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass_tensorop_bf16_gemm_grouped_128x128_tn> >"
    rk.op("aten::_grouped_mm", tid, [[rows, HIDDEN], [local, HIDDEN, 2 * EXPERT_FFN], [local]], grouped)
    rk.op("aten::silu", tid, [[rows, EXPERT_FFN]],
          "void at::native::vectorized_elementwise_kernel<4, at::native::SiluCUDAKernelImpl, at::detail::Array<char*, 2> >")
    rk.op("aten::_grouped_mm", tid, [[rows, EXPERT_FFN], [local, EXPERT_FFN, HIDDEN], [local]], grouped)
    all_to_all(rk, received, sent)
    rk.op("aten::index_add_", tid, [[TOKENS, HIDDEN], [], [], [TOKENS * TOP_K, HIDDEN]],
          "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>")


def decoder_layer(rk):
    tid = rk.main
    attention(rk, tid)
    # the router
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, EXPERTS]], GEMM)
    rk.op("aten::softmax", tid, [[TOKENS, EXPERTS], [], []],
          "void (anonymous namespace)::softmax_warp_forward<float, float, float, 2, false, false>")
    rk.op("aten::topk", tid, [[TOKENS, EXPERTS], [], [], [], []], "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>")
    for n in EXPERT_TOKENS:
        rk.op("aten::index", tid, [[TOKENS, HIDDEN], []],
              "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<c10::BFloat16> >")
        rk.op("aten::mm", tid, [[n, HIDDEN], [HIDDEN, EXPERT_FFN]], GEMM)
        rk.op("aten::mm", tid, [[n, HIDDEN], [HIDDEN, EXPERT_FFN]], GEMM)
        rk.op("aten::silu", tid, [[n, EXPERT_FFN]],
              "void at::native::vectorized_elementwise_kernel<4, at::native::SiluCUDAKernelImpl, at::detail::Array<char*, 2> >")
        rk.op("aten::mm", tid, [[n, EXPERT_FFN], [EXPERT_FFN, HIDDEN]], GEMM)
        rk.op("aten::index_add_", tid, [[TOKENS, HIDDEN], [], [], [n, HIDDEN]],
              "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>")


def step(rk, forward_layer, backward_names):
    begin = rk.t
    rk.op("aten::embedding", rk.main, [[32000, HIDDEN], [MBS, SEQ]], "void at::native::indexSelectLargeIndex<c10::BFloat16>")
    for _ in range(LAYERS):
        rk.scope("MixtralDecoderLayer", rk.main, forward_layer)
    rk.op("aten::mm", rk.main, [[TOKENS, HIDDEN], [HIDDEN, 32000]], GEMM)
    rk.t += 5.0
    for _ in range(LAYERS):
        for name in backward_names:
            rk.op("autograd::engine::evaluate_function: " + name, rk.autograd, None, GEMM if name.startswith("Mm") else EW)
    rk.t += 2.0
    rk.close_step(begin, "aten::_foreach_add_", "void multi_tensor_apply_kernel<AdamFunctor<c10::BFloat16>>")


def build():
    rk = kineto_writer.Rank(0)
    step(rk, lambda: decoder_layer(rk), ("MmBackward0", "SiluBackward0", "MmBackward0", "TopkBackward0", "MmBackward0", "MmBackward0"))
    rk.write(os.path.join(HERE, "loop_unbalanced"), 1, "moe loop rank 0" + TRACE_NAME)
    for r in range(len(SENT)):
        rk = kineto_writer.Rank(r)
        step(rk, lambda rk=rk, r=r: grouped_layer(rk, r), ("GroupedMmBackward0", "SiluBackward0", "GroupedMmBackward0", "MmBackward0"))
        rk.write(os.path.join(HERE, "ep2_grouped_splits"), len(SENT), f"moe ep2 rank {r}" + TRACE_NAME)


if __name__ == "__main__":
    build()

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

`router_rows_are_experts`: the loop of `loop_unbalanced` over 8 tokens (sequence 4 × micro-batch 2)
and 8 experts, so that the router GEMM is [8, 256]·[256, 8] and every attention GEMM has as many
rows as there are experts; the experts receive SMALL_EXPERT_TOKENS = 3, 1, 2, 2, 3, 1, 2, 2 copies.

`fsdp_tp2`: the loop of `loop_unbalanced` on 4 ranks, TP 2 x DP 2 (no sequence parallelism: every
rank's router sees the 256 tokens), each layer's attention followed by an all-reduce over its TP
group (`TENSOR_MODEL_PARALLEL_GROUP`, ranks 2k and 2k + 1), and between the router and the experts
FSDP's all-gather of the experts' weights over its DP group (`DATA_PARALLEL_GROUP`, ranks k and
k + 2: half of 4 x 3 x 256 x 512 elements in, all of them out). Top-2: 512 copies of 256 tokens.

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


# router_rows_are_experts: the loop's layers over 4 x 2 = 8 tokens and 8 experts, so that the router
# GEMM's rows equal its outputs ([8, 256]·[256, 8]); top-2 gives 16 copies.
SMALL_SEQ, SMALL_EXPERTS = 4, 8
SMALL_EXPERT_TOKENS = [3, 1, 2, 2, 3, 1, 2, 2]
assert sum(SMALL_EXPERT_TOKENS) == SMALL_SEQ * MBS * TOP_K and len(SMALL_EXPERT_TOKENS) == SMALL_EXPERTS

SENT = [[300, 212], [180, 332]]  # ep2_grouped_splits: token copies rank r sends to peer p
assert all(sum(row) == TOKENS * TOP_K for row in SENT)


TRACE_NAME = " (lumos tests/data/moe/make_moe_trace.py)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"


def attention(rk, tid, seq=SEQ):
    tokens = seq * MBS
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, 3 * HIDDEN]], GEMM)
    rk.op("aten::_scaled_dot_product_flash_attention", tid, [[MBS, 4, seq, 64], [MBS, 4, seq, 64], [MBS, 4, seq, 64], [], [], []],
          "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >")
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::add", tid, [[tokens, HIDDEN], [tokens, HIDDEN]], EW)


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


def group_collective(rk, kind, kernel, group, description, ranks, sent, received):
    """A collective of `kind` over process group `group` (`ranks`), `sent` and `received` elements."""
    args = {"Collective name": kind, "Process Group Name": group, "Process Group Description": description,
            "Process Group Ranks": "[" + ", ".join(map(str, ranks)) + "]", "Group size": len(ranks), "dtype": "BFloat16",
            "In msg nelems": sent, "Out msg nelems": received}
    rk.comms(rk.main, kernel + "(ncclDevKernelArgsStorage<4096ul>)", args, dur=20.0)


def fsdp_tp_layer(rk, r):
    """decoder_layer on rank r of TP 2 x DP 2: the attention's all-reduce over the TP group, and
    FSDP's all-gather of the experts' weights over the DP group between the router and the experts."""
    tp_group = [r - r % 2, r - r % 2 + 1]
    dp_group = [r % 2, r % 2 + 2]
    weights = EXPERTS * 3 * HIDDEN * EXPERT_FFN

    def tp_all_reduce():
        group_collective(rk, "allreduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "tp%d" % (r // 2),
                         "TENSOR_MODEL_PARALLEL_GROUP", tp_group, TOKENS * HIDDEN, TOKENS * HIDDEN)

    def fsdp_all_gather():
        group_collective(rk, "_allgather_base", "ncclDevKernel_AllGather_RING_LL", "dp%d" % (r % 2), "DATA_PARALLEL_GROUP",
                         dp_group, weights // 2, weights)
    decoder_layer(rk, after_attention=tp_all_reduce, before_experts=fsdp_all_gather)


def decoder_layer(rk, seq=SEQ, experts=EXPERTS, expert_tokens=EXPERT_TOKENS, after_attention=None, before_experts=None):
    tid = rk.main
    tokens = seq * MBS
    attention(rk, tid, seq)
    if after_attention:
        after_attention()
    # the router
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, experts]], GEMM)
    rk.op("aten::softmax", tid, [[tokens, experts], [], []],
          "void (anonymous namespace)::softmax_warp_forward<float, float, float, 2, false, false>")
    rk.op("aten::topk", tid, [[tokens, experts], [], [], [], []], "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>")
    if before_experts:
        before_experts()
    for n in expert_tokens:
        rk.op("aten::index", tid, [[tokens, HIDDEN], []],
              "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<c10::BFloat16> >")
        rk.op("aten::mm", tid, [[n, HIDDEN], [HIDDEN, EXPERT_FFN]], GEMM)
        rk.op("aten::mm", tid, [[n, HIDDEN], [HIDDEN, EXPERT_FFN]], GEMM)
        rk.op("aten::silu", tid, [[n, EXPERT_FFN]],
              "void at::native::vectorized_elementwise_kernel<4, at::native::SiluCUDAKernelImpl, at::detail::Array<char*, 2> >")
        rk.op("aten::mm", tid, [[n, EXPERT_FFN], [EXPERT_FFN, HIDDEN]], GEMM)
        rk.op("aten::index_add_", tid, [[tokens, HIDDEN], [], [], [n, HIDDEN]],
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
    rk = kineto_writer.Rank(0)
    step(rk, lambda: decoder_layer(rk, SMALL_SEQ, SMALL_EXPERTS, SMALL_EXPERT_TOKENS),
         ("MmBackward0", "SiluBackward0", "MmBackward0", "TopkBackward0", "MmBackward0", "MmBackward0"))
    rk.write(os.path.join(HERE, "router_rows_are_experts"), 1, "moe loop, as many tokens as experts, rank 0" + TRACE_NAME)
    for r in range(4):
        rk = kineto_writer.Rank(r)
        step(rk, lambda rk=rk, r=r: fsdp_tp_layer(rk, r),
             ("MmBackward0", "SiluBackward0", "MmBackward0", "TopkBackward0", "MmBackward0", "MmBackward0"))
        rk.write(os.path.join(HERE, "fsdp_tp2"), 4, f"moe loop, TP 2 x FSDP 2, rank {r}" + TRACE_NAME)
    for r in range(len(SENT)):
        rk = kineto_writer.Rank(r)
        step(rk, lambda rk=rk, r=r: grouped_layer(rk, r), ("GroupedMmBackward0", "SiluBackward0", "GroupedMmBackward0", "MmBackward0"))
        rk.write(os.path.join(HERE, "ep2_grouped_splits"), len(SENT), f"moe ep2 rank {r}" + TRACE_NAME)


if __name__ == "__main__":
    build()

#!/usr/bin/env python3
"""Writes small hand-made Kineto traces of pipeline-parallel transformer training, one directory
per configuration, one .json.gz per rank, for the structure-discovery tests (tests/whatif).

Each trace is built from a known construction, which the tests assert:
  - p stages (one rank each, TP = DP = 1), m micro-batches, v model chunks per stage;
  - the per-stage order of Megatron's GPipe / 1F1B / interleaved 1F1B (formulas below, the same
    as include/lumos/pipeline/*);
  - `layers_per_chunk` transformer layers in each chunk, hidden 1024, FFN 4096, 16 heads of 64,
    sequence 512, micro-batch size 2, bf16;
  - activations and gradients sent point to point between neighbouring virtual stages (the last
    stage wraps to the first for interleaved), one NCCL SendRecv kernel on each side carrying the
    collective args; forward on the main thread, backward under autograd ops on a second thread,
    then an optimizer step;
  - `annotate`: each forward layer inside a `TransformerLayer` record_function scope (else layers
    are only recoverable from the repeating kernel sequence).

Run from anywhere: python3 tests/data/whatif/make_pipeline_traces.py  (deterministic output).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in tests/data
sys.path.insert(0, os.path.dirname(HERE))
import kineto_writer  # noqa: E402

HIDDEN, FFN, HEADS, HEAD_DIM, SEQ, MBS = 1024, 4096, 16, 64, 512, 2
TOKENS = SEQ * MBS
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"

CONFIGS = {
    # name: (schedule, p, m, v, layers_per_chunk, annotate)
    "pp2_1f1b": ("1f1b", 2, 4, 1, 2, True),
    "pp4_1f1b": ("1f1b", 4, 8, 1, 2, False),
    "pp4_gpipe": ("gpipe", 4, 4, 1, 2, False),
    "pp2_interleaved": ("interleaved", 2, 4, 2, 2, False),
    "pp4_interleaved": ("interleaved", 4, 8, 2, 2, False),
    # Targets of the pipeline what-if from pp4_1f1b (8 layers, m 8), same layers and micro-batches:
    "pp2_1f1b_m8": ("1f1b", 2, 8, 1, 4, False),
    "pp4_gpipe_m8": ("gpipe", 4, 8, 1, 2, False),
    "pp4_interleaved_l1": ("interleaved", 4, 8, 2, 1, False),
}


def stage_ops(kind, p, m, v, r):
    """Ops ('F'|'B', micro_batch, chunk) of stage r: Megatron's orders (see pipeline/*.hpp)."""
    if kind == "gpipe":
        return [("F", k, 0) for k in range(m)] + [("B", k, 0) for k in range(m)]
    if kind == "1f1b":
        w = min(p - r - 1, m)
        fw = [("F", k, 0) for k in range(m)]
        bw = [("B", k, 0) for k in range(m)]
    else:
        total = m * v

        def fwd(k):
            g = k % (p * v)
            return ("F", (k // (p * v)) * p + k % p, g // p)

        fw = [fwd(k) for k in range(total)]
        bw = [("B", f[1], v - 1 - f[2]) for f in fw]
        w = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
        m = total
    ops = fw[:w]
    for i in range(m - w):
        ops += [fw[w + i], bw[i]]
    ops += bw[m - w:]
    return ops


FWD_LAYER = [  # (kernel, cpu op, Input Dims)
    ("void layer_norm_fwd<__nv_bfloat16>", "aten::native_layer_norm", [[MBS, SEQ, HIDDEN]]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_qkv", "aten::mm", [[TOKENS, HIDDEN], [HIDDEN, 3 * HIDDEN]]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_score", "aten::baddbmm",
     [[MBS * HEADS, SEQ, SEQ], [MBS * HEADS, SEQ, HEAD_DIM], [MBS * HEADS, HEAD_DIM, SEQ], [], []]),
    ("void softmax_warp_forward<__nv_bfloat16>", "aten::_softmax", [[MBS, HEADS, SEQ, SEQ], [], []]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_ctx", "aten::bmm", [[MBS * HEADS, SEQ, SEQ], [MBS * HEADS, SEQ, HEAD_DIM]]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_proj", "aten::mm", [[TOKENS, HIDDEN], [HIDDEN, HIDDEN]]),
    ("void layer_norm_fwd<__nv_bfloat16>", "aten::native_layer_norm", [[MBS, SEQ, HIDDEN]]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_fc1", "aten::mm", [[TOKENS, HIDDEN], [HIDDEN, FFN]]),
    ("void gelu_kernel<__nv_bfloat16>", "aten::gelu", [[MBS, SEQ, FFN]]),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_fc2", "aten::mm", [[TOKENS, FFN], [FFN, HIDDEN]]),
]
BWD_LAYER = [
    ("sm90_xmma_gemm_bf16_dgrad_fc2", "MmBackward0"),
    ("sm90_xmma_gemm_bf16_wgrad_fc2", "MmBackward0"),
    ("void gelu_backward_kernel<__nv_bfloat16>", "GeluBackward0"),
    ("sm90_xmma_gemm_bf16_dgrad_fc1", "MmBackward0"),
    ("void layer_norm_bwd<__nv_bfloat16>", "NativeLayerNormBackward0"),
    ("void softmax_warp_backward<__nv_bfloat16>", "SoftmaxBackward0"),
    ("sm90_xmma_gemm_bf16_dgrad_qkv", "MmBackward0"),
    ("void layer_norm_bwd<__nv_bfloat16>", "NativeLayerNormBackward0"),
]


def p2p_args(kind, tag, src, dst):
    """Args of a send/recv kernel. One group per direction and tensor kind, so that the k-th op of
    a rank in a group pairs with the k-th of its peer (docs/whatif.md)."""
    return {"Collective name": kind, "Process Group Name": f"p2p_{tag}_{src}to{dst}",
            "Process Group Description": "pipeline p2p", "Process Group Ranks": f"[{min(src, dst)}, {max(src, dst)}]",
            "Group size": 2, "In msg nelems": TOKENS * HIDDEN, "dtype": "BFloat16"}


def build(name, kind, p, m, v, lpc, annotate):
    ranks = [kineto_writer.Rank(r) for r in range(p)]
    orders = [stage_ops(kind, p, m, v, r) for r in range(p)]
    pos = [0] * p
    sent = {}  # (what, micro_batch, to virtual stage) -> kernel ready time
    V = p * v
    steps = [r.t for r in ranks]

    def forward_layer(rk, tid):
        for kernel, op, dims in FWD_LAYER:
            rk.op(op, tid, dims, kernel)

    def run(r, op):
        rk = ranks[r]
        k, mb, c = op
        vs = c * p + r
        group_tag = {"F": "act", "B": "grad"}[k]
        # receive what this pass consumes
        src_vs = vs - 1 if k == "F" else vs + 1
        if 0 <= src_vs < V:
            key = (group_tag, mb, vs)
            if key not in sent:
                return False
            src = src_vs % p
            args = p2p_args("recv", group_tag, src, r)
            end = rk.launch(SENDRECV, rk.main, stream=21, dur=6.0, after=sent[key], kargs=args)
            rk.t = max(rk.t, end + 1.0)  # the pass waits for its input
        if k == "F":
            if vs == 0:
                rk.op("aten::embedding", rk.main, [[50304, HIDDEN], [MBS, SEQ]], "void indexSelectLargeIndex<__nv_bfloat16>")
            for layer in range(lpc):
                if annotate:
                    rk.scope("megatron.core.transformer.TransformerLayer", rk.main, lambda: forward_layer(rk, rk.main))
                else:
                    forward_layer(rk, rk.main)
            if vs == V - 1:
                rk.op("aten::cross_entropy_loss", rk.main, [[TOKENS, 50304], [TOKENS]], "void cross_entropy_fwd<__nv_bfloat16>")
        else:
            rk.t += 5.0  # backward() hands off to the autograd thread
            if vs == V - 1:
                rk.op("autograd::engine::evaluate_function: NllLossBackward0", rk.autograd, None,
                      "void cross_entropy_bwd<__nv_bfloat16>")
            for layer in range(lpc):
                for kernel, op in BWD_LAYER:
                    rk.op("autograd::engine::evaluate_function: " + op, rk.autograd, None, kernel)
            if vs == 0:
                rk.op("autograd::engine::evaluate_function: EmbeddingBackward0", rk.autograd, None,
                      "void embedding_backward_kernel<__nv_bfloat16>")
            rk.t += 2.0
        # send what this pass produces
        dst_vs = vs + 1 if k == "F" else vs - 1
        if 0 <= dst_vs < V:
            dst = dst_vs % p
            args = p2p_args("send", group_tag, r, dst)
            sent[(group_tag, mb, dst_vs)] = rk.t
            rk.launch(SENDRECV, rk.main, stream=21, dur=6.0, kargs=args)
        return True

    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(orders[r]) and run(r, orders[r][pos[r]]):
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(orders[r]) for r in range(p)), f"{name}: schedule deadlocked"
    # The optimizer step and the iteration's annotation.
    for rk in ranks:
        rk.close_step(steps[rk.rank], "aten::_foreach_add_", "void multi_tensor_apply_kernel<AdamFunctor<__nv_bfloat16>>", ops=3)
        kineto_writer.write_json(os.path.join(HERE, name, f"rank{rk.rank}.json.gz"),
                                 rk.document(p, f"{name} rank {rk.rank} (lumos tests/data/whatif/make_pipeline_traces.py)"),
                                 newline=False, stored_name=False)


if __name__ == "__main__":
    for name, (kind, p, m, v, lpc, annotate) in CONFIGS.items():
        build(name, kind, p, m, v, lpc, annotate)

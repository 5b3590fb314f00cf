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

Run from anywhere: python3 tests/data/moe/make_moe_trace.py  (deterministic output).
"""
import json
import os

HIDDEN, EXPERT_FFN, SEQ, MBS, EXPERTS, TOP_K = 256, 512, 128, 2, 4, 2
TOKENS = SEQ * MBS
EXPERT_TOKENS = [200, 130, 90, 92]
LAYERS = 2
assert sum(EXPERT_TOKENS) == TOKENS * TOP_K


class Rank:
    def __init__(self):
        self.events = []
        self.t = 1000.0  # µs; CPU cursor
        self.corr = 1
        self.ext = 1
        self.stream_free = 0.0
        self.pid, self.main, self.autograd = 100, 1, 2

    def x(self, cat, name, tid, ts, dur, args=None, pid=None):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid if pid is None else pid, "tid": tid,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args or {}})

    def launch(self, kernel, tid, dur=8.0):
        c = self.corr
        self.corr += 1
        call = self.t
        self.x("cuda_runtime", "cudaLaunchKernel", tid, call, 2.0, {"correlation": c, "cbid": 211})
        start = max(call + 3.0, self.stream_free)
        self.x("kernel", kernel, 7, start, dur, {"device": 0, "stream": 7, "correlation": c, "External id": self.ext}, pid=0)
        self.stream_free = start + dur
        self.t = call + 4.0

    def op(self, name, tid, dims, kernel=None):
        begin = self.t
        self.t += 1.0
        self.ext += 1
        if kernel:
            self.launch(kernel, tid)
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


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"


def decoder_layer(rk):
    tid = rk.main
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, 3 * HIDDEN]], GEMM)
    rk.op("aten::_scaled_dot_product_flash_attention", tid, [[MBS, 4, SEQ, 64], [MBS, 4, SEQ, 64], [MBS, 4, SEQ, 64], [], [], []],
          "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >")
    rk.op("aten::mm", tid, [[TOKENS, HIDDEN], [HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::add", tid, [[TOKENS, HIDDEN], [TOKENS, HIDDEN]], EW)
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


def build():
    rk = Rank()
    step = rk.t
    rk.op("aten::embedding", rk.main, [[32000, HIDDEN], [MBS, SEQ]], "void at::native::indexSelectLargeIndex<c10::BFloat16>")
    for _ in range(LAYERS):
        rk.scope("MixtralDecoderLayer", rk.main, lambda: decoder_layer(rk))
    rk.op("aten::mm", rk.main, [[TOKENS, HIDDEN], [HIDDEN, 32000]], GEMM)
    rk.t += 5.0
    for _ in range(LAYERS):
        for name in ("MmBackward0", "SiluBackward0", "MmBackward0", "TopkBackward0", "MmBackward0", "MmBackward0"):
            rk.op("autograd::engine::evaluate_function: " + name, rk.autograd, None, GEMM if name.startswith("Mm") else EW)
    rk.t += 2.0
    rk.scope("Optimizer.step#AdamW.step", rk.main,
             lambda: rk.op("aten::_foreach_add_", rk.main, None, "void multi_tensor_apply_kernel<AdamFunctor<c10::BFloat16>>"))
    rk.t += 5.0
    rk.x("user_annotation", "ProfilerStep#1", rk.main, step - 1.0, rk.t - step + 1.0)
    rk.events.sort(key=lambda e: (e["ts"], -e["dur"]))
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85045870592,
                                 "computeMajor": 9, "computeMinor": 0}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
           "traceEvents": rk.events,
           "traceName": "moe loop rank 0 (lumos tests/data/moe/make_moe_trace.py)"}
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop_unbalanced")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rank0.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    build()

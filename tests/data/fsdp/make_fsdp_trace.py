#!/usr/bin/env python3
"""Writes small hand-made Kineto traces of ranks training a dense transformer with PyTorch FSDP2
(`torch.distributed.fsdp.fully_shard`, as torchtitan wraps it), for the FSDP structure-discovery
tests (tests/whatif/test_fsdp.cpp).

The construction, which the tests assert:
  - LAYERS = 2 transformer blocks (`TransformerBlock` record_function scopes) and the root unit
    (embedding and output projection): 3 FSDP units, one micro-batch, hidden 256, sequence 128;
  - forward: each unit's `FSDP::pre_forward` runs `FSDP::all_gather` (a `record_param_comms`
    operator launching ncclDevKernel_AllGather on stream 20, `In msg nelems` the rank's shard,
    `Out msg nelems` the whole unit) and `FSDP::all_gather_copy_out` (a copy kernel on the compute
    stream 7), then the unit's GEMMs;
  - backward, on the autograd thread: with reshard after forward each block's `FSDP::pre_backward`
    gathers it again (the root unit is not resharded, as torchtitan sets it), then its gradient
    GEMMs, then `FSDP::post_backward_reduce` (ncclDevKernel_ReduceScatter on stream 24) and
    `FSDP::post_backward_reshard`; under HSDP the reduce also all-reduces the shard over the
    replica group;
  - an AdamW step and ProfilerStep#1 around everything.

`fsdp2_shard2`: 2 ranks, one shard group of 2 (`mesh_dp_shard`), reshard after forward: per rank
5 all-gathers (3 forward + 2 backward) and 3 reduce-scatters.
`hsdp_2x2`: 4 ranks, shard groups {0,1} {2,3} (`mesh_dp_shard`) and replica groups {0,2} {1,3}
(`mesh_dp_replicate`), reshard after forward off: 3 all-gathers, 3 reduce-scatters, 3 all-reduces.
`fsdp2_default_pg`: `fsdp2_shard2` as FSDP2 over the whole world writes it on one node: the only
process group is the default one (name "0", description `default_pg`), and each collective's
`record_param_comms` sits inside c10d's operator (`c10d::_allgather_base_`,
`c10d::_reduce_scatter_base_`) beside the NCCL backend's (`nccl:_all_gather_base`,
`nccl:_reduce_scatter_base`), as torch.distributed records them.

Run from anywhere: python3 tests/data/fsdp/make_fsdp_trace.py  (deterministic output).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in tests/data
sys.path.insert(0, os.path.dirname(HERE))
import kineto_writer  # noqa: E402

HIDDEN, FFN, SEQ, VOCAB, LAYERS = 256, 1024, 128, 32000, 2
LAYER_PARAMS = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN
ROOT_PARAMS = 2 * VOCAB * HIDDEN

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
COPY = "void at::native::(anonymous namespace)::split_with_sizes_copy_out_contiguous_no_cast_kernel<c10::BFloat16>"
ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedAdamMathFunctor>"


class Rank(kineto_writer.Rank):
    KERNEL_US = 20.0

    def __init__(self, rank, world, shard_ranks, replica_ranks, reshard, default_pg=False):
        super().__init__(rank)
        self.world, self.default_pg = world, default_pg
        self.shard_ranks, self.replica_ranks, self.reshard = shard_ranks, replica_ranks, reshard

    def collective(self, tid, kernel, coll, group, desc, ranks, stream, nelems_in, nelems_out, dtype, dur):
        if self.default_pg:
            group, desc = "0", "default_pg"
        args = {"Collective name": coll, "Process Group Name": group, "Process Group Description": desc,
                "Process Group Ranks": "[" + ", ".join(map(str, ranks)) + "]", "Group size": len(ranks), "dtype": dtype,
                "In msg nelems": nelems_in, "Out msg nelems": nelems_out}
        if not self.default_pg:
            self.op("record_param_comms", tid, None, kernel, stream=stream, dur=dur, kargs=args)
            return
        # torch.distributed's nesting: c10d's operator, the record_param_comms that launches the
        # kernel, then the NCCL backend's op.
        backend = {"_allgather_base": "nccl:_all_gather_base", "_reduce_scatter_base": "nccl:_reduce_scatter_base"}.get(coll, "nccl:" + coll)

        def body():
            self.op("record_param_comms", tid, None, kernel, stream=stream, dur=dur, kargs=args)
            self.op(backend, tid)
        self.scope("c10d::" + coll + "_", tid, body, "cpu_op")

    def shard_group(self):
        return "1" if self.shard_ranks[0] == 0 else "2"

    def replica_group(self):
        return "3" if self.replica_ranks[0] == 0 else "4"

    def all_gather(self, tid, params, hook):
        n = len(self.shard_ranks)

        def body():
            self.scope("FSDP::all_gather", tid, lambda: self.collective(
                tid, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "_allgather_base", self.shard_group(),
                "mesh_dp_shard", self.shard_ranks, 20, params // n, params, "BFloat16", 200.0))
            self.scope("FSDP::all_gather_copy_out", tid, lambda: self.op(
                "aten::split_with_sizes_copy", tid, [[params], [], []], COPY, dur=15.0))
        self.scope(hook, tid, body)

    def reduce(self, tid, params):
        n = len(self.shard_ranks)

        def body():
            self.collective(tid, "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                            "_reduce_scatter_base", self.shard_group(), "mesh_dp_shard", self.shard_ranks, 24, params, params // n,
                            "Float", 300.0)
            if len(self.replica_ranks) > 1:
                self.collective(tid, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce",
                                self.replica_group(), "mesh_dp_replicate", self.replica_ranks, 24, params // n, params // n,
                                "Float", 150.0)
        self.scope("FSDP::post_backward_reduce", tid, body)
        self.scope("FSDP::post_backward_reshard", tid, lambda: None)


def block_forward(rk):
    tid, tokens = rk.main, SEQ
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, 3 * HIDDEN]], GEMM)
    rk.op("aten::_scaled_dot_product_flash_attention", tid, [[1, 4, SEQ, 64], [1, 4, SEQ, 64], [1, 4, SEQ, 64], [], [], []],
          "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >")
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, HIDDEN]], GEMM)
    rk.op("aten::mm", tid, [[tokens, HIDDEN], [HIDDEN, 2 * FFN]], GEMM)
    rk.op("aten::mm", tid, [[tokens, FFN], [FFN, HIDDEN]], GEMM)


def step(rk):
    begin = rk.t
    main, ag = rk.main, rk.autograd
    rk.scope("FSDP::root_pre_forward", main, lambda: None)
    rk.all_gather(main, ROOT_PARAMS, "FSDP::pre_forward")
    rk.op("aten::embedding", main, [[VOCAB, HIDDEN], [1, SEQ]], "void at::native::indexSelectLargeIndex<c10::BFloat16>")
    for _ in range(LAYERS):
        def layer():
            rk.all_gather(main, LAYER_PARAMS, "FSDP::pre_forward")
            block_forward(rk)
            rk.scope("FSDP::post_forward", main, lambda: None)
        rk.scope("TransformerBlock", main, layer)
    rk.op("aten::mm", main, [[SEQ, HIDDEN], [HIDDEN, VOCAB]], GEMM)
    rk.t += 5.0

    def grad(name, kernel=GEMM):
        rk.op("autograd::engine::evaluate_function: " + name, ag, None, kernel)

    grad("MmBackward0")
    for _ in range(LAYERS):
        if rk.reshard:
            rk.scope("autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward", ag,
                     lambda: rk.all_gather(ag, LAYER_PARAMS, "FSDP::pre_backward"), "cpu_op")
        for name in ("MmBackward0", "MmBackward0", "MmBackward0", "MmBackward0"):
            grad(name)
        rk.scope("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", ag,
                 lambda: rk.reduce(ag, LAYER_PARAMS), "cpu_op")
    grad("EmbeddingBackward0", "void at::native::embedding_backward_feature_kernel<c10::BFloat16, float, long>")
    rk.scope("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", ag, lambda: rk.reduce(ag, ROOT_PARAMS), "cpu_op")
    rk.t += 2.0
    rk.close_step(begin, "aten::_fused_adamw_", ADAM)


def write(rk, name):
    rk.write(os.path.join(HERE, name), rk.world, name + " rank %d (lumos tests/data/fsdp/make_fsdp_trace.py)" % rk.rank)


def build():
    for r in range(2):
        rk = Rank(r, 2, [0, 1], [r], True)
        step(rk)
        write(rk, "fsdp2_shard2")
    for r in range(4):
        shard = [r - r % 2, r - r % 2 + 1]
        replica = [r % 2, r % 2 + 2]
        rk = Rank(r, 4, shard, replica, False)
        step(rk)
        write(rk, "hsdp_2x2")
    for r in range(2):
        rk = Rank(r, 2, [0, 1], [r], True, default_pg=True)
        step(rk)
        write(rk, "fsdp2_default_pg")


if __name__ == "__main__":
    build()

#!/usr/bin/env python3
"""Writes examples/data/tiny_job: a small, hand-designed 2-rank data-parallel training step in
Kineto format. It exercises what lumos models: CPU launches, a compute and a communication stream,
cudaEventRecord -> cudaStreamWaitEvent, an NCCL all-reduce matched across ranks (rank 1 computes
more slowly, so rank 0's all-reduce waits), and a final cudaStreamSynchronize.

Usage: python3 scripts/make_example_job.py [OUT_DIR]   (default: examples/data/tiny_job)
Rank 0 is written as .json, rank 1 as .json.gz, so both formats are covered."""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in tests/data
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
import kineto_writer  # noqa: E402

BASE_US = 1_700_000_000_000_000  # absolute microseconds, like older Kineto traces


# The GPU of these traces, as older Kineto described it.
H100 = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0, "numSms": 132}


class Rank(kineto_writer.Rank):
    """A rank as older Kineto traces record it: absolute times, External ids on runtime calls,
    the device's index as its kernels' process; compute-stream kernels take `speed` times as long."""

    LAUNCH_US = 4.0
    QUEUE_US = 6.0

    def __init__(self, rank, speed):
        super().__init__(rank)
        self.speed = speed
        self.pid = self.main = 4000 + rank
        self.t, self.corr, self.ext, self.device, self.base = 0.0, 100, 0, rank, BASE_US

    def runtime_args(self, corr, cbid):
        return {"External id": self.ext, "cbid": cbid, "correlation": corr}

    def kernel_args(self, stream, corr):
        return {"External id": self.ext, "queued": 0, "device": self.device, "context": 1, "stream": stream,
                "correlation": corr, "grid": [132, 1, 1], "block": [256, 1, 1]}

    def launch(self, kernel, tid, stream=7, dur=None, **kw):
        return super().launch(kernel, tid, stream, dur * (self.speed if stream == 7 else 1.0), **kw)

    def cpu_op(self, name, least, dims=None, **work):
        """An operator of the main thread lasting at least `least` µs (`work`: what it launches or
        runs, as Rank.op takes it), then the Python gap to the next."""
        self.op(name, self.main, dims, min_dur=least, **work)
        self.t += 2.0


def build():
    ranks = [Rank(0, 1.0), Rank(1, 1.25)]
    for r in ranks:
        r.step_start = r.t
        for layer in range(3):
            r.cpu_op("aten::mm", 10, [[4096, 1024], [1024, 1024]], kernel="sm90_xmma_gemm_bf16_fwd", dur=120.0)
            r.cpu_op("aten::gelu", 8, [[4096, 1024]], kernel="vectorized_elementwise_kernel", dur=30.0)
        for layer in range(3):
            r.cpu_op("aten::mm", 10, [[4096, 1024], [1024, 1024]], kernel="sm90_xmma_gemm_bf16_bwd", dur=240.0)
        # Gradient all-reduce on the communication stream, after the compute stream's work.
        def comm(r=r):
            r.runtime("cudaEventRecord", r.main, 2.0, 1)
            r.runtime("cudaStreamWaitEvent", r.main, 2.0, 1)
            r.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", r.main,
                     20, 0.0, api="cudaLaunchKernelExC",
                     kargs={"Collective name": "allreduce", "In msg nelems": 3145728,
                            "Out msg nelems": 3145728, "Group size": 2, "dtype": "BFloat16",
                            "Process Group Name": "0", "Process Group Description": "default_pg",
                            "Process Group Ranks": "[0, 1]"}, after=r.free[7])
        r.cpu_op("record_param_comms", 12, body=comm)
        r.comm_ready = r.events[-2]["ts"] - BASE_US  # the NCCL kernel's own start
    # A collective ends together on every rank: it starts when the last rank arrives.
    transfer = 180.0
    start = max(r.comm_ready for r in ranks)
    for r in ranks:
        k = r.events[-2]
        k["ts"] = round(BASE_US + r.comm_ready, 3)
        k["dur"] = round(start + transfer - r.comm_ready, 3)
        r.free[20] = start + transfer
    for r in ranks:
        def opt(r=r):
            r.runtime("cudaEventRecord", r.main, 2.0, 1)
            r.runtime("cudaStreamWaitEvent", r.main, 2.0, 1)
            r.launch("multi_tensor_apply_kernel", r.main, 7, 60.0, after=r.free[20])
        r.cpu_op("Optimizer.step#AdamW.step", 20, body=opt)
        sync_start = r.t
        sync_end = max(sync_start + 3.0, r.free[7] + 4.0)
        r.ext += 1  # the synchronize's own External id
        r.runtime("cudaStreamSynchronize", r.main, sync_end - sync_start, 131)
        r.t = sync_end + 1.0
        r.x("user_annotation", "ProfilerStep#1", r.main, r.step_start, r.t - r.step_start, {"External id": 0})
    return ranks


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "examples", "data", "tiny_job")
    for r in build():
        doc = r.document(2, "tiny_job rank %d (written by scripts/make_example_job.py)" % r.rank, devices=2, device=H100,
                         meta=r.metadata([7, 20]))
        kineto_writer.write_json(os.path.join(out, "rank0.json" if r.rank == 0 else "rank1.json.gz"), doc, indent=1)


if __name__ == "__main__":
    main()

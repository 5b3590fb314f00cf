#!/usr/bin/env python3
"""Writes examples/data/tiny_job: a small, hand-designed 2-rank data-parallel training step in
Kineto format. It exercises what lumos models: CPU launches, a compute and a communication stream,
cudaEventRecord -> cudaStreamWaitEvent, an NCCL all-reduce matched across ranks (rank 1 computes
more slowly, so rank 0's all-reduce waits), and a final cudaStreamSynchronize.

Usage: python3 scripts/make_example_job.py [OUT_DIR]   (default: examples/data/tiny_job)
Rank 0 is written as .json, rank 1 as .json.gz, so both formats are covered."""
import gzip
import json
import os
import sys

BASE_US = 1_700_000_000_000_000  # absolute microseconds, like older Kineto traces


class Rank:
    def __init__(self, rank, speed):
        self.rank, self.speed = rank, speed
        self.pid, self.tid = 4000 + rank, 4000 + rank
        self.events, self.corr, self.ext = [], 100, 1
        self.cpu = 0.0       # CPU clock (us, relative)
        self.stream = {7: 0.0, 20: 0.0}  # stream free times
        self.last_on = {7: None, 20: None}

    def x(self, cat, name, ts, dur, pid, tid, args):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                            "ts": round(BASE_US + ts, 3), "dur": round(dur, 3), "args": args})

    def cpu_op(self, name, dur, body=None, dims=None):
        ext = self.ext
        self.ext += 1
        start = self.cpu
        self.cpu += 1.0
        if body:
            body(ext)
        self.cpu = max(self.cpu + 1.0, start + dur)
        args = {"External id": ext}
        if dims is not None:
            args["Input Dims"] = dims
        self.x("cpu_op", name, start, self.cpu - start, self.pid, self.tid, args)
        self.cpu += 2.0  # Python gap between ops

    def launch(self, ext, kernel, stream, gpu_dur, api="cudaLaunchKernel", extra=None, ready=0.0):
        corr = self.corr
        self.corr += 1
        t = self.cpu
        self.x("cuda_runtime", api, t, 4.0, self.pid, self.tid,
               {"External id": ext, "cbid": 211, "correlation": corr})
        self.cpu += 4.0
        start = max(t + 6.0, self.stream[stream], ready)
        dur = gpu_dur * (self.speed if stream == 7 else 1.0)
        args = {"External id": ext, "queued": 0, "device": self.rank, "context": 1,
                "stream": stream, "correlation": corr, "grid": [132, 1, 1], "block": [256, 1, 1]}
        if extra:
            args.update(extra)
        self.x("kernel", kernel, start, dur, self.rank, stream, args)
        self.stream[stream] = start + dur
        self.last_on[stream] = start + dur
        return start, dur

    def runtime(self, ext, name, dur=2.0):
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", name, self.cpu, dur, self.pid, self.tid,
               {"External id": ext, "cbid": 1, "correlation": corr})
        self.cpu += dur


def build(allreduce_start):
    ranks = [Rank(0, 1.0), Rank(1, 1.25)]
    for r in ranks:
        step_start = r.cpu
        for layer in range(3):
            r.cpu_op("aten::mm", 10, lambda e, r=r: r.launch(e, "sm90_xmma_gemm_bf16_fwd", 7, 120.0),
                     dims=[[4096, 1024], [1024, 1024]])
            r.cpu_op("aten::gelu", 8, lambda e, r=r: r.launch(e, "vectorized_elementwise_kernel", 7, 30.0),
                     dims=[[4096, 1024]])
        for layer in range(3):
            r.cpu_op("aten::mm", 10, lambda e, r=r: r.launch(e, "sm90_xmma_gemm_bf16_bwd", 7, 240.0),
                     dims=[[4096, 1024], [1024, 1024]])
        # Gradient all-reduce on the communication stream, after the compute stream's work.
        def comm(ext, r=r):
            r.runtime(ext, "cudaEventRecord")
            r.runtime(ext, "cudaStreamWaitEvent")
            ready = r.last_on[7]
            r.launch(ext, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                     20, 0.0, api="cudaLaunchKernelExC",
                     extra={"Collective name": "allreduce", "In msg nelems": 3145728,
                            "Out msg nelems": 3145728, "Group size": 2, "dtype": "BFloat16",
                            "Process Group Name": "0", "Process Group Description": "default_pg",
                            "Process Group Ranks": "[0, 1]"}, ready=ready)
        r.cpu_op("record_param_comms", 12, comm)
        r.comm_ready = r.events[-2]["ts"] - BASE_US  # the NCCL kernel's own start
        r.step_start = step_start
    # A collective ends together on every rank: it starts when the last rank arrives.
    transfer = 180.0
    start = max(r.comm_ready for r in ranks)
    for r in ranks:
        k = r.events[-2]
        k["ts"] = round(BASE_US + r.comm_ready, 3)
        k["dur"] = round(start + transfer - r.comm_ready, 3)
        r.stream[20] = start + transfer
    for r in ranks:
        def opt(ext, r=r):
            r.runtime(ext, "cudaEventRecord")
            r.runtime(ext, "cudaStreamWaitEvent")
            r.launch(ext, "multi_tensor_apply_kernel", 7, 60.0, ready=r.stream[20])
        r.cpu_op("Optimizer.step#AdamW.step", 20, opt)
        sync_start = r.cpu
        end_gpu = r.stream[7]
        sync_end = max(sync_start + 3.0, end_gpu + 4.0)
        corr = r.corr
        r.corr += 1
        r.x("cuda_runtime", "cudaStreamSynchronize", sync_start, sync_end - sync_start, r.pid, r.tid,
            {"External id": r.ext, "cbid": 131, "correlation": corr})
        r.cpu = sync_end + 1.0
        r.x("user_annotation", "ProfilerStep#1", r.step_start, r.cpu - r.step_start, r.pid, r.tid,
            {"External id": 0})
    return ranks


def document(r):
    meta = [
        {"name": "process_name", "ph": "M", "ts": BASE_US, "pid": r.pid, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "ts": BASE_US, "pid": r.pid, "tid": r.tid, "args": {"name": "thread %d (python)" % r.tid}},
        {"name": "process_name", "ph": "M", "ts": BASE_US, "pid": r.rank, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "ts": BASE_US, "pid": r.rank, "tid": 7, "args": {"name": "stream 7"}},
        {"name": "thread_name", "ph": "M", "ts": BASE_US, "pid": r.rank, "tid": 20, "args": {"name": "stream 20"}},
    ]
    events = sorted(r.events, key=lambda e: (e["ts"], -e["dur"]))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132} for i in range(2)],
        "distributedInfo": {"backend": "nccl", "rank": r.rank, "world_size": 2},
        "traceEvents": meta + events,
        "traceName": "tiny_job rank %d (written by scripts/make_example_job.py)" % r.rank,
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "examples", "data", "tiny_job")
    os.makedirs(out, exist_ok=True)
    for r in build(None):
        text = json.dumps(document(r), indent=1)
        if r.rank == 0:
            with open(os.path.join(out, "rank0.json"), "w") as f:
                f.write(text + "\n")
        else:
            with gzip.GzipFile(os.path.join(out, "rank1.json.gz"), "wb", mtime=0) as f:
                f.write((text + "\n").encode())


if __name__ == "__main__":
    main()

"""Writes one rank of an `executor.Execution` as a Kineto trace, the way PyTorch 2.x does.

Layout (the Kineto format as docs/reader.md describes it): `ph:"X"` events with cat cpu_op / user_annotation /
cuda_runtime on the process's thread rows (pid = process id, tid = thread id) and kernel /
gpu_memcpy / gpu_memset on the device rows (pid = device, tid = stream) with `args.correlation`,
`args["External id"]`, `args.stream`, `args.device`; one `ac2g` flow pair (`s` at the runtime
call, `f` at the GPU op) per launch; `distributedInfo`; thread and process names.

Variants:
- `sync`: with the `cuda_sync` rows CUPTI adds under `enable_cuda_sync_events` ("Stream Wait
  Event", "Stream Sync", "Event Sync" — also one per cudaEventQuery, as CUPTI reports them —
  and "Context Sync"), each spanning its runtime call.
- `nosync`: without them (most real traces).
- `norecord`: as `nosync`, and without the cudaEventRecord calls, which some PyTorch versions do
  not report although their cudaStreamWaitEvent calls are there.

Timestamps are µs with exactly three decimals, printed from integer ns (never through a float,
which cannot hold 16-digit absolute µs with ns precision)."""
from __future__ import annotations

import gzip
import json
import re

from executor import Execution

BASE_TIME_NS = 1_751_410_836_000_000_000   # baseTimeNanoseconds of relative traces
RELATIVE_OFFSET_NS = 1_428_625_000_000_000  # relative ts of t=0 (as large as in real traces)
ABSOLUTE_OFFSET_NS = 1_712_867_402_000_000_000  # absolute traces: t=0 in ns since the epoch

_TIME = re.compile(r'"@ns:(\d+)@"')
_CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51,
         "cudaMemcpy": 31, "cudaEventRecord": 135, "cudaStreamWaitEvent": 147, "cudaStreamSynchronize": 131,
         "cudaDeviceSynchronize": 165, "cudaEventSynchronize": 137, "cudaEventQuery": 138, "cudaGraphLaunch": 311}


def _ns(t: int) -> str:
    """Placeholder replaced by the exact µs text after json.dumps."""
    return f"@ns:{t}@"


def _us(match: re.Match) -> str:
    ns = int(match.group(1))
    return f"{ns // 1000}.{ns % 1000:03d}"


def trace_document(execution: Execution, rank: int, variant: str) -> str:
    """The JSON text of rank `rank`'s trace in `variant` ("sync", "nosync" or "norecord")."""
    job, run = execution.job, execution.ranks[rank]
    offset = RELATIVE_OFFSET_NS if job.relative_time else ABSOLUTE_OFFSET_NS
    pid = 20_000 + 17 * rank
    device = rank
    streams = sorted({op.work.stream for op in run.gpu})
    threads = sorted({ev.thread for ev in run.cpu})

    def tid_of(thread: int) -> int:
        return pid + thread

    def x(cat, name, p, tid, start, end, args):
        return {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": tid, "ts": _ns(start + offset),
                "dur": _ns(end - start), "args": args}

    events = [{"name": "process_name", "ph": "M", "ts": _ns(offset), "pid": pid, "tid": 0, "args": {"name": "python3"}},
              {"name": "process_name", "ph": "M", "ts": _ns(offset), "pid": device, "tid": 0, "args": {"name": "python3"}}]
    events += [{"name": "thread_name", "ph": "M", "ts": _ns(offset), "pid": pid, "tid": tid_of(t),
                "args": {"name": f"thread {tid_of(t)} (python3)"}} for t in threads]
    events += [{"name": "thread_name", "ph": "M", "ts": _ns(offset), "pid": device, "tid": s,
                "args": {"name": f"stream {s}"}} for s in streams]

    for ev in run.cpu:
        if variant == "norecord" and ev.name == "cudaEventRecord":
            continue
        args = {}
        if ev.external_id is not None:
            args["External id"] = ev.external_id
        if ev.cat == "cuda_runtime":
            args["cbid"] = _CBID[ev.name]
            args["correlation"] = ev.correlation
        args.update(ev.args)
        events.append(x(ev.cat, ev.name, pid, tid_of(ev.thread), ev.start, ev.end, args))
        if ev.sync is not None and variant == "sync":
            events.append(_sync_row(ev, device, offset))

    flowed = set()
    for op in run.gpu:
        w = op.work
        args = {"External id": op.launch.external_id if op.launch.external_id is not None else 0,
                "device": device, "context": 1, "stream": w.stream, "correlation": op.launch.correlation}
        if w.cat == "kernel":
            args.update({"queued": 0, "registers per thread": 128, "shared memory": 0,
                         "grid": [132, 1, 1], "block": [256, 1, 1]})
        else:
            args.update({"bytes": w.bytes, "memory bandwidth (GB/s)": round(w.bytes / max(op.end - op.start, 1), 6)})
        if op.graph is not None:
            args["graph id"], args["graph node id"] = op.graph
        if w.comm is not None and w.comm.args_on_kernel:
            args.update(w.comm.args)
        events.append(x(w.cat, w.name, device, w.stream, op.start, op.end, args))
        corr = op.launch.correlation
        if corr not in flowed:   # one arrow per launch call (CUDA graphs: to the first node)
            flowed.add(corr)
            events.append({"ph": "s", "id": corr, "pid": pid, "tid": tid_of(op.launch.thread),
                           "ts": _ns(op.launch.start + offset), "cat": "ac2g", "name": "ac2g"})
            events.append({"ph": "f", "id": corr, "pid": device, "tid": w.stream, "ts": _ns(op.start + offset),
                           "cat": "ac2g", "name": "ac2g", "bp": "e"})

    world = len(execution.ranks)
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                                 "computeMajor": 9, "computeMinor": 0, "numSms": 132} for i in range(world)],
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
           "displayTimeUnit": "ms",
           "traceEvents": events,
           "traceName": f"{job.name} rank {rank} ({variant}; written by tests/truth/writer.py)"}
    if job.relative_time:
        doc["baseTimeNanoseconds"] = BASE_TIME_NS
    return _TIME.sub(_us, json.dumps(doc, separators=(",", ":")))


def _sync_row(ev, device: int, offset: int) -> dict:
    """The cuda_sync row of a runtime call: it starts up to 1 µs into the call and ends with it
    (as CUPTI's synchronization records do in real traces)."""
    s = ev.sync
    args = {"External id": ev.external_id if ev.external_id is not None else ev.correlation,
            "cuda_sync_kind": s["kind"]}
    for key, name in (("wait_on_stream", "wait_on_stream"), ("record_correlation", "wait_on_cuda_event_record_corr_id"),
                      ("event_id", "wait_on_cuda_event_id")):
        if key in s:
            args[name] = s[key]
    args.update({"stream": s["stream"], "correlation": ev.correlation, "device": device, "context": 1})
    start = ev.start + min(1_000, (ev.end - ev.start) // 4)
    return {"ph": "X", "cat": "cuda_sync", "name": s["kind"], "pid": device, "tid": s["stream"],
            "ts": _ns(start + offset), "dur": _ns(ev.end - start), "args": args}


def write_rank(execution: Execution, rank: int, variant: str, path: str) -> None:
    """Writes the trace gzip-compressed when `path` ends in .gz (with a fixed mtime: reproducible)."""
    text = trace_document(execution, rank, variant)
    if path.endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(text.encode())
    else:
        with open(path, "w") as f:
            f.write(text)

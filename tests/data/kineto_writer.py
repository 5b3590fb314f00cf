"""The machinery the hand-made Kineto (PyTorch profiler) trace generators share, so that the trace
format is written in one place: a `Rank` builds one rank's events on a CPU cursor, `write_json`
writes the document. The generators (tests/data/*/make_*.py, scripts/make_example_job.py) add
what their construction needs, by parameters or by subclassing `Rank`.

The conventions of the events, on which the generators' checked-in output depends byte for byte
(a change here changes test data: rerun every generator and review `git diff`):
  - events are complete events ("ph": "X"), and the process/thread names of `metadata` ("ph":
    "M"); times are µs, `base` + the cursor, rounded to 3 decimals;
  - a kernel launch is a CUDA runtime call at the cursor (its own correlation id) and the kernel
    on its stream, which starts QUEUE_US after the call at the earliest and after the stream's
    previous kernel; the launching thread moves on LAUNCH_CPU_US after the call;
  - a CPU operator takes a fresh External id, which the kernels it launches carry;
  - events are written sorted by (ts, -dur), parents before their children.

Import it from a generator as `sys.path.insert(0, <this directory>)`, then `import kineto_writer`.
"""
import collections
import gzip
import json
import os

# deviceProperties of one GPU, as recent Kineto writes them (without "id").
H100 = {"name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85045870592, "computeMajor": 9, "computeMinor": 0}


class Rank:
    """One rank's trace under construction. `t` is the CPU cursor (µs), `free` the time each
    stream's last kernel ends, `main` and `autograd` the Python and autograd threads of process
    `pid`; kernels appear under process `device`. Subclasses change the class constants, the
    attributes after __init__, and `runtime_args` / `kernel_args` for another Kineto flavour."""

    KERNEL_US = 8.0  # a kernel's duration where the caller gives none
    LAUNCH_US = 2.0  # the launch call's own duration
    LAUNCH_CPU_US = 4.0  # where the cursor moves after a launch call
    QUEUE_US = 3.0  # the earliest a kernel starts after its launch call

    def __init__(self, rank):
        self.rank = rank
        self.events = []
        self.t = 1000.0
        self.corr = 1
        self.ext = 1  # the last External id taken
        self.free = collections.defaultdict(float)
        self.pid, self.main, self.autograd = 100 + rank, 1, 2
        self.device = 0
        self.base = 0  # added to every time written (absolute-time traces)

    def x(self, cat, name, tid, ts, dur, args=None, pid=None):
        """A complete event of `pid` (default: the rank's process) on thread `tid`."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid if pid is None else pid, "tid": tid,
                            "ts": round(self.base + ts, 3), "dur": round(dur, 3), "args": args or {}})

    def runtime_args(self, corr, cbid):
        return {"correlation": corr, "cbid": cbid}

    def kernel_args(self, stream, corr):
        return {"device": self.device, "stream": stream, "correlation": corr, "External id": self.ext}

    def runtime(self, name, tid, dur, cbid):
        """A CUDA runtime call at the cursor, which it advances by `dur`."""
        corr = self.corr
        self.corr += 1
        self.x("cuda_runtime", name, tid, self.t, dur, self.runtime_args(corr, cbid))
        self.t += dur

    def launch(self, kernel, tid, stream=7, dur=None, kargs=None, after=0.0, api="cudaLaunchKernel"):
        """Launches `kernel` from thread `tid` on `stream`, not before `after`; `kargs` are added
        to the kernel's args (a collective's). Returns when the kernel ends."""
        corr = self.corr
        call = self.t
        self.runtime(api, tid, self.LAUNCH_US, 211)
        start = max(call + self.QUEUE_US, self.free[stream], after)
        dur = self.KERNEL_US if dur is None else dur
        args = self.kernel_args(stream, corr)
        args.update(kargs or {})
        self.x("kernel", kernel, stream, start, dur, args, pid=self.device)
        self.free[stream] = start + dur
        self.t = call + self.LAUNCH_CPU_US
        return start + dur

    def op(self, name, tid, dims=None, kernel=None, body=None, min_dur=0.0, **launch):
        """A CPU operator (`dims`: its Input Dims) at the cursor, 1 µs before and after what it
        does: launch `kernel` (with `launch`'s arguments) or run `body`; `min_dur` is the least
        it lasts."""
        begin = self.t
        self.t += 1.0
        self.ext += 1
        ext = self.ext
        if kernel:
            self.launch(kernel, tid, **launch)
        if body:
            body()
        self.t = max(self.t + 1.0, begin + min_dur)
        args = {"External id": ext}
        if dims is not None:
            args["Input Dims"] = dims
        self.x("cpu_op", name, tid, begin, self.t - begin, args)

    def scope(self, name, tid, body, cat="user_annotation"):
        """An annotation (or, with `cat`, another event with no args) around `body`, 1 µs wider
        on each side."""
        begin = self.t
        self.t += 1.0
        body()
        self.t += 1.0
        self.x(cat, name, tid, begin, self.t - begin)

    def comms(self, tid, kernel, args, **launch):
        """`record_param_comms` around the launch of a collective's NCCL kernel (`args`: the
        collective's), 0.5 µs wider on each side."""
        begin = self.t
        self.t += 0.5
        self.ext += 1
        self.launch(kernel, tid, kargs=args, **launch)
        self.t += 0.5
        self.x("cpu_op", "record_param_comms", tid, begin, self.t - begin, {"External id": self.ext})

    def close_step(self, begin, name, kernel, ops=1):
        """The optimizer step (`ops` operators `name`, each launching `kernel`) on the main thread,
        then, 5 µs later, the end of ProfilerStep#1, which began 1 µs before `begin`."""
        def body():
            for _ in range(ops):
                self.op(name, self.main, None, kernel)
        self.scope("Optimizer.step#AdamW.step", self.main, body)
        self.t += 5.0
        self.x("user_annotation", "ProfilerStep#1", self.main, begin - 1.0, self.t - begin + 1.0)

    def metadata(self, streams):
        """Kineto's process and thread names: the Python process and thread, the GPU's streams."""
        def meta(kind, pid, tid, name):
            return {"name": kind, "ph": "M", "ts": self.base, "pid": pid, "tid": tid, "args": {"name": name}}
        return ([meta("process_name", self.pid, 0, "python"),
                 meta("thread_name", self.pid, self.main, "thread %d (python)" % self.main),
                 meta("process_name", self.device, 0, "python")] +
                [meta("thread_name", self.device, s, "stream %d" % s) for s in streams])

    def document(self, world, trace_name, devices=1, device=H100, meta=()):
        """The trace document: `devices` GPUs described as `device`, the rank's distributedInfo
        in an NCCL world of `world`, the `meta` events then the rank's events in time order."""
        return {"schemaVersion": 1,
                "deviceProperties": [dict({"id": i}, **device) for i in range(devices)],
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": world},
                "traceEvents": list(meta) + sorted(self.events, key=lambda e: (e["ts"], -e["dur"])),
                "traceName": trace_name}

    def write(self, out_dir, world, trace_name):
        """Writes the document to out_dir/rank<rank>.json, compact, as most generators do."""
        write_json(os.path.join(out_dir, "rank%d.json" % self.rank), self.document(world, trace_name))


def write_json(path, doc, indent=None, newline=True, stored_name=True):
    """Writes `doc` as JSON to `path` (its directory made if missing): compact unless `indent`,
    ending in a newline if `newline`; gzip-compressed where `path` ends in .gz, with mtime 0 so the
    bytes are deterministic, the header recording the file's name only if `stored_name`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    separators = (",", ": ") if indent is not None else (",", ":")
    text = json.dumps(doc, indent=indent, separators=separators) + ("\n" if newline else "")
    if not path.endswith(".gz"):
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path, "wb") as f:
        with gzip.GzipFile(path if stored_name else "", mode="wb", fileobj=f, mtime=0) as z:
            z.write(text.encode())

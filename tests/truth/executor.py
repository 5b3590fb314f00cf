"""Reference executor: runs a `program.Job` with CUDA semantics and scaled durations.

The model (all times integer ns):
- A CPU thread runs its actions one after another. `Busy` and runtime-call own times are
  multiplied by cpu=F; `Idle` gaps, launch latencies, stream gaps, sync tails and poll spacings
  are overheads and stay.
- Streams are in order. A GPU op starts at
      max(launch call start + L, stream predecessor end + G, end of each awaited event op + G)
  where the awaited ops come from cudaStreamWaitEvent calls made on its stream since the previous
  op was queued there. A compute op (kernel, memcpy, memset) lasts dur × compute.
- A communication op (collective or p2p) starts the same way on its own stream; every participant
  of one instance ends at max(participants' starts) + transfer × comm.
- Blocking calls (stream/device/event synchronize, legacy cudaMemcpy) return at
  max(call start + own time, awaited op end) + tail. cudaEventQuery polls repeat, spaced by a sleep,
  until one starts at or after the awaited op's end.

Beyond the program, `Conditions` say how the machine behaves. By default every overhead (runtime-call
own times, launch latencies, stream gaps, sync tails, poll spacings) is drawn once per call site and
is the same in every run, and the launch queue is unbounded: exactly the replay's own assumptions,
so that a replay matching this executor is an implementation check. `Conditions(run=n)` draws the
overheads afresh for run n (the measured run and the target run then differ in them, as two real runs
do); `Conditions(launch_queue=q)` bounds the launch queue: a launch call whose rank already has q
launched ops not finished blocks until the oldest of them ends, as cudaLaunchKernel blocks on a full
queue.

Because every value is a function of values computed before it (a dataflow, not a clock), the
order in which ranks and threads are advanced does not change the result: ranks that block on a
collective whose peers have not arrived yet simply wait until the peers' threads progress."""
from __future__ import annotations

from dataclasses import dataclass, field

from program import (AnnotationBegin, AnnotationEnd, BlockingMemcpy, Busy, DeviceSync, EventPoll,
                     EventRecord, EventSync, Gpu, GraphLaunch, Idle, Job, Launch, OpBegin, OpEnd,
                     Overheads, StreamSync, StreamWaitEvent, jitter)


@dataclass(frozen=True)
class Scales:
    compute: float = 1.0
    comm: float = 1.0
    cpu: float = 1.0

    def label(self) -> str:
        parts = [f"{k}={v:g}" for k, v in (("compute", self.compute), ("comm", self.comm), ("cpu", self.cpu)) if v != 1.0]
        return "+".join(parts) or "identity"

    def cli_args(self) -> list:
        return [a for k, v in (("compute", self.compute), ("comm", self.comm), ("cpu", self.cpu)) if v != 1.0
                for a in ("--scale", f"{k}={v:g}")]


@dataclass(frozen=True)
class Conditions:
    """How the machine behaves beyond the program (see the module doc). The default keeps every
    overhead fixed between runs and never blocks a launch."""
    run: int | None = None           # None: overheads fixed across runs; n: drawn afresh for run n
    launch_queue: int | None = None  # None: unbounded; q: a launch blocks while q launched ops are unfinished

    def label(self) -> str:
        parts = ([f"overheads of run {self.run}"] if self.run is not None else []) + \
                ([f"launch queue {self.launch_queue}"] if self.launch_queue is not None else [])
        return ", ".join(parts) or "fixed"


@dataclass
class CpuEvent:
    """A cpu_op, user_annotation or cuda_runtime range on a thread. Runtime calls carry their
    correlation; `sync` describes the cuda_sync row CUPTI would add for them (writer's business)."""
    cat: str
    name: str
    thread: int
    start: int
    end: int = -1
    args: dict = field(default_factory=dict)
    correlation: int | None = None
    external_id: int | None = None
    sync: dict | None = None


@dataclass
class GpuOp:
    work: Gpu
    launch: CpuEvent
    latency: int
    gap: int
    prev: "GpuOp | None"
    waits: list
    graph: tuple | None = None   # (graph id, node index) for CUDA-graph kernels
    start: int | None = None
    end: int | None = None


@dataclass
class RankRun:
    """What one rank did: its CPU events (in issue order) and its GPU ops (in queue order)."""
    cpu: list = field(default_factory=list)
    gpu: list = field(default_factory=list)


@dataclass
class Execution:
    job: Job
    scales: Scales
    ranks: list


class _Recorded:
    """A cudaEventRecord: the op it follows (None when its stream was empty) and its identity."""
    __slots__ = ("op", "stream", "correlation", "event_id")

    def __init__(self, op, stream, correlation, event_id):
        self.op, self.stream, self.correlation, self.event_id = op, stream, correlation, event_id


class _Rank:
    """Mutable per-rank state during one execution."""

    def __init__(self, index: int):
        self.index = index
        self.run = RankRun()
        self.last_on: dict = {}        # stream -> last queued op
        self.pending_waits: dict = {}  # stream -> ops the next queued op must wait for
        self.events: dict = {}         # event name -> _Recorded
        self.event_ids: dict = {}
        self.correlation = 0
        self.external_id = 0


def execute(job: Job, scales: Scales = Scales(), conditions: Conditions = Conditions()) -> Execution:
    """Runs every rank of `job` under `scales` and `conditions`; returns the timestamps of everything."""
    return _Executor(job, scales, conditions).run()


class _Executor:
    def __init__(self, job: Job, scales: Scales, conditions: Conditions = Conditions()):
        self.job, self.scales, self.conditions = job, scales, conditions
        self.ranks = [_Rank(i) for i in range(len(job.ranks))]
        self.unresolved: list = []
        self.comm_instances: dict = {}   # comm key -> participant ops

    # ---- durations --------------------------------------------------------------------------
    def cpu_time(self, ns: int) -> int:
        return round(ns * self.scales.cpu)

    def compute_time(self, ns: int) -> int:
        return round(ns * self.scales.compute)

    def jitter(self, key: str, lo: int, hi: int) -> int:
        """An overhead drawn for call site `key`: the same in every run unless the conditions draw afresh."""
        return jitter(key if self.conditions.run is None else f"{key}#run{self.conditions.run}", lo, hi)

    def own(self, key: str, bounds: tuple) -> int:
        """A runtime call's own (busy) time: jittered per call, then scaled by cpu."""
        return self.cpu_time(self.jitter(key + "/own", *bounds))

    # ---- driver -----------------------------------------------------------------------------
    def run(self) -> Execution:
        threads = []
        for r, rank in enumerate(self.job.ranks):
            for t, actions in enumerate(rank.threads):
                gen = self.thread(self.ranks[r], t, actions, rank.start_ns)
                threads.append([gen, self.advance(gen, None)])
        while True:
            progressed = False
            for th in threads:
                while th[1] is not _DONE and th[1].end is not None:
                    th[1] = self.advance(th[0], th[1].end)
                    progressed = True
            progressed |= self.resolve()
            if all(th[1] is _DONE for th in threads) and not self.unresolved:
                break
            if not progressed:
                raise RuntimeError(f"{self.job.name}: deadlock ({len(self.unresolved)} GPU ops cannot start)")
        return Execution(self.job, self.scales, [r.run for r in self.ranks])

    @staticmethod
    def advance(gen, value):
        try:
            return gen.send(value)
        except StopIteration:
            return _DONE

    def resolve(self) -> bool:
        """Gives start and end times to every GPU op whose inputs are known; True if any."""
        any_done = False
        changed = True
        while changed:
            changed = False
            still = []
            for op in self.unresolved:
                if self.try_resolve(op):
                    changed = any_done = True
                else:
                    still.append(op)
            self.unresolved = still
        return any_done

    def try_resolve(self, op: GpuOp) -> bool:
        if op.start is None:
            deps = ([op.prev] if op.prev is not None else []) + op.waits
            if any(d.end is None for d in deps):
                return False
            start = op.launch.start + op.latency
            if op.prev is not None:
                start = max(start, op.prev.end + op.gap)
            for w in op.waits:
                start = max(start, w.end + op.gap)
            op.start = start
            if op.work.comm is None:
                op.end = start + self.compute_time(op.work.dur_ns)
                return True
        comm = op.work.comm
        peers = self.comm_instances.get(comm.key, [])
        if len(peers) < comm.participants or any(p.start is None for p in peers):
            return False
        end = max(p.start for p in peers) + round(comm.transfer_ns * self.scales.comm)
        for p in peers:
            p.end = end
        return True

    # ---- one CPU thread ---------------------------------------------------------------------
    def enqueue(self, rank: _Rank, work: Gpu, launch: CpuEvent, key: str,
                latency: int | None = None, gap: int | None = None, graph: tuple | None = None) -> GpuOp:
        s = work.stream
        op = GpuOp(work=work, launch=launch,
                   latency=latency if latency is not None else self.jitter(key + "/L", *Overheads.LAUNCH_LATENCY),
                   gap=gap if gap is not None else self.jitter(key + "/G", *Overheads.STREAM_GAP),
                   prev=rank.last_on.get(s), waits=rank.pending_waits.pop(s, []), graph=graph)
        rank.last_on[s] = op
        rank.run.gpu.append(op)
        self.unresolved.append(op)
        if work.comm is not None:
            peers = self.comm_instances.setdefault(work.comm.key, [])
            if peers and peers[0].work.comm.transfer_ns != work.comm.transfer_ns:
                raise ValueError(f"{self.job.name}: participants of {work.comm.key} disagree on the transfer")
            peers.append(op)
        return op

    def thread(self, rank: _Rank, tid: int, actions: list, t: int):
        """A generator: yields a GPU op whose end it needs, receives that end, goes on."""
        open_ranges: list = []   # CpuEvents of open cpu_ops / annotations (innermost last)

        def call(name: str, start: int, own: int) -> CpuEvent:
            rank.correlation += 1
            ext = next((e.external_id for e in reversed(open_ranges) if e.cat == "cpu_op"), None)
            ev = CpuEvent("cuda_runtime", name, tid, start, start + own, correlation=rank.correlation,
                          external_id=ext)
            rank.run.cpu.append(ev)
            return ev

        def event_id(name: str) -> int:
            return rank.event_ids.setdefault(name, len(rank.event_ids) + 1)

        for i, a in enumerate(actions):
            key = f"{self.job.name}/{rank.index}/{tid}/{i}"
            if isinstance(a, Busy):
                t += self.cpu_time(a.ns)
            elif isinstance(a, Idle):
                t += a.ns
            elif isinstance(a, (AnnotationBegin, OpBegin)):
                rank.external_id += 1
                ev = CpuEvent("user_annotation" if isinstance(a, AnnotationBegin) else "cpu_op", a.name, tid, t,
                              args=dict(getattr(a, "args", {})), external_id=rank.external_id)
                rank.run.cpu.append(ev)
                open_ranges.append(ev)
            elif isinstance(a, (AnnotationEnd, OpEnd)):
                open_ranges.pop().end = t
            elif isinstance(a, Launch):
                ev = call(a.api, t, self.own(key, Overheads.LAUNCH_CALL))
                q = self.conditions.launch_queue
                if q is not None and len(rank.run.gpu) >= q:
                    # A full queue: the call returns once the oldest of the last q launched ops is done.
                    ev.end = max(ev.end, (yield rank.run.gpu[-q]))
                self.enqueue(rank, a.work, ev, key)
                t = ev.end
            elif isinstance(a, GraphLaunch):
                ev = call("cudaGraphLaunch", t, self.own(key, Overheads.GRAPH_CALL))
                latency = self.jitter(key + "/L", *Overheads.LAUNCH_LATENCY)
                for n, k in enumerate(a.kernels):
                    gap = None if n == 0 else self.jitter(f"{key}/node{n}", *Overheads.GRAPH_NODE_GAP)
                    self.enqueue(rank, k, ev, f"{key}/{n}", latency=latency, gap=gap, graph=(a.graph_id, n + 1))
                t = ev.end
            elif isinstance(a, EventRecord):
                ev = call("cudaEventRecord", t, self.own(key, Overheads.SMALL_CALL))
                rank.events[a.event] = _Recorded(rank.last_on.get(a.stream), a.stream, ev.correlation, event_id(a.event))
                t = ev.end
            elif isinstance(a, StreamWaitEvent):
                ev = call("cudaStreamWaitEvent", t, self.own(key, Overheads.SMALL_CALL))
                rec = rank.events[a.event]
                if rec.op is not None:
                    rank.pending_waits.setdefault(a.stream, []).append(rec.op)
                ev.sync = {"kind": "Stream Wait Event", "stream": a.stream, "wait_on_stream": rec.stream,
                           "record_correlation": rec.correlation, "event_id": rec.event_id}
                t = ev.end
            elif isinstance(a, (StreamSync, DeviceSync, EventSync)):
                name, awaited, sync = self.sync_target(rank, a)
                ev = call(name, t, self.own(key, Overheads.SYNC_CALL))
                ev.sync = sync
                ready = ev.end
                for op in awaited:
                    ready = max(ready, (yield op))
                ev.end = ready + self.jitter(key + "/tail", *Overheads.SYNC_TAIL)
                t = ev.end
            elif isinstance(a, BlockingMemcpy):
                ev = call("cudaMemcpy", t, self.own(key, Overheads.LAUNCH_CALL))
                op = self.enqueue(rank, a.work, ev, key)
                done = yield op
                ev.end = max(ev.end, done) + self.jitter(key + "/tail", *Overheads.SYNC_TAIL)
                t = ev.end
            elif isinstance(a, EventPoll):
                rec = rank.events[a.event]
                ready = (yield rec.op) if rec.op is not None else t
                n = 0
                while True:
                    ev = call("cudaEventQuery", t, self.own(f"{key}/{n}", Overheads.QUERY_CALL))
                    ev.sync = {"kind": "Event Sync", "stream": -1, "wait_on_stream": rec.stream,
                               "record_correlation": rec.correlation, "event_id": rec.event_id}
                    if ev.start >= ready:
                        t = ev.end
                        break
                    t = ev.end + self.jitter(f"{key}/{n}/sleep", *Overheads.POLL_SPACING)
                    n += 1
            else:
                raise TypeError(f"unknown action {a!r}")
        if open_ranges:
            raise ValueError(f"{self.job.name}: rank {rank.index} thread {tid} leaves ranges open")

    @staticmethod
    def sync_target(rank: _Rank, a) -> tuple:
        """(runtime call name, ops it waits for, its cuda_sync row description)."""
        if isinstance(a, StreamSync):
            op = rank.last_on.get(a.stream)
            return ("cudaStreamSynchronize", [op] if op else [],
                    {"kind": "Stream Sync", "stream": a.stream, "wait_on_stream": -1, "record_correlation": -1,
                     "event_id": -1})
        if isinstance(a, DeviceSync):
            return ("cudaDeviceSynchronize", [op for _, op in sorted(rank.last_on.items())],
                    {"kind": "Context Sync", "stream": -1})
        rec = rank.events[a.event]
        return ("cudaEventSynchronize", [rec.op] if rec.op else [],
                {"kind": "Event Sync", "stream": -1, "wait_on_stream": rec.stream,
                 "record_correlation": rec.correlation, "event_id": rec.event_id})


class _Done:
    """Marks a finished thread."""


_DONE = _Done()


# ---- the metric (docs/replay.md "Metrics", computed on the executor's own timestamps) ----------

def step_windows(run: RankRun) -> dict:
    """{N: (begin, end)} of every ProfilerStep#N on the rank's main thread:
    end_N = max(annotation end, end of every GPU op whose launch call started inside
    [annotation start, annotation end)); begin_N = max(annotation start, end_{N-1}) when step N-1
    is in the trace, else the annotation start."""
    steps = {}
    for ev in run.cpu:
        if ev.cat == "user_annotation" and ev.thread == 0 and ev.name.startswith("ProfilerStep#"):
            steps[int(ev.name.split("#")[1])] = (ev.start, ev.end)
    ends = {}
    for n, (a0, a1) in steps.items():
        ends[n] = max([a1] + [op.end for op in run.gpu if a0 <= op.launch.start < a1])
    return {n: (max(a0, ends[n - 1]) if n - 1 in ends else a0, ends[n]) for n, (a0, a1) in steps.items()}


def iteration_ns(execution: Execution, step: int) -> tuple:
    """(job iteration, [per-rank iteration]) of ProfilerStep#step."""
    per_rank = []
    for run in execution.ranks:
        begin, end = step_windows(run)[step]
        per_rank.append(end - begin)
    return max(per_rank), per_rank


def check(execution: Execution) -> None:
    """Invariants any CUDA execution satisfies; raises AssertionError naming the first broken one.
    A guard against executor bugs (the truth is only as good as this model)."""
    for r, run in enumerate(execution.ranks):
        streams: dict = {}
        for op in run.gpu:
            assert op.start is not None and op.end is not None and op.end >= op.start, f"rank {r}: {op.work.name} unresolved"
            assert op.start >= op.launch.start + op.latency, f"rank {r}: {op.work.name} starts before its launch"
            streams.setdefault(op.work.stream, []).append(op)
        for s, ops in streams.items():
            for a, b in zip(ops, ops[1:]):
                assert b.start >= a.end, f"rank {r} stream {s}: {b.work.name} overlaps {a.work.name}"
        threads: dict = {}
        for ev in run.cpu:
            threads.setdefault(ev.thread, []).append(ev)
        for t, evs in threads.items():
            calls = [e for e in evs if e.cat == "cuda_runtime"]
            for a, b in zip(calls, calls[1:]):
                assert b.start >= a.end, f"rank {r} thread {t}: {b.name} overlaps {a.name}"
            for e in evs:
                if e.cat != "cuda_runtime":
                    inside = [c for c in calls if e.start <= c.start < e.end]
                    assert all(c.end <= e.end for c in inside), f"rank {r}: {e.name} ends inside a runtime call"

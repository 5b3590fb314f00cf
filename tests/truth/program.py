"""What the reference executor runs: per-rank programs of CPU actions with CUDA semantics.

A job is a list of ranks; a rank is a list of CPU threads; a thread is a flat list of actions
(the Python/PyTorch side of a training script, as the CPU sees it). Actions either take CPU time
(`Busy`, scaled by cpu=F; `Idle`, not scaled), open and close ranges (`OpBegin`/`OpEnd` for
`cpu_op`s, `AnnotationBegin`/`AnnotationEnd` for `user_annotation`s such as ProfilerStep#N), or
call the CUDA runtime (launches, event record/wait, synchronisation, polling, copies).

Nothing here depends on how lumos reads or replays traces: the executor (executor.py) gives these
actions their CUDA meaning, the writer (writer.py) turns an execution into a Kineto trace.

Every duration is an integer number of nanoseconds. The overheads that are not part of the
program text (launch latency, inter-kernel gap, runtime-call own time, sync return tail, polling
spacing) are drawn by `jitter` from a key naming the op, so that a re-execution with scaled
durations sees exactly the same overheads op by op, whatever else changed (e.g. the number of
polls)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def jitter(key: str, lo: int, hi: int) -> int:
    """A deterministic integer in [lo, hi] derived from `key` alone (not from a draw order)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return lo + int.from_bytes(digest, "little") % (hi - lo + 1)


class Overheads:
    """Ranges (ns) of the per-op overheads drawn with `jitter`. Which ones a what-if scales:
    runtime-call own times are CPU busy time (scaled by cpu=F); launch latency, stream gap,
    sync tail, poll spacing and CUDA-graph node gap are overheads that stay."""
    LAUNCH_CALL = (3_000, 6_000)       # cudaLaunchKernel / cudaMemcpyAsync / cudaMemsetAsync own time
    GRAPH_CALL = (8_000, 12_000)       # cudaGraphLaunch own time
    SMALL_CALL = (1_500, 3_000)        # cudaEventRecord / cudaStreamWaitEvent
    SYNC_CALL = (2_000, 4_000)         # own time of a blocking call when nothing is awaited
    QUERY_CALL = (1_000, 2_000)        # cudaEventQuery
    LAUNCH_LATENCY = (4_000, 8_000)    # launch call start -> kernel start on an idle stream
    STREAM_GAP = (1_000, 3_000)        # previous op end (or awaited event) -> kernel start
    GRAPH_NODE_GAP = (500, 1_500)      # between kernels of one CUDA graph
    SYNC_TAIL = (2_000, 5_000)         # awaited op end -> blocking call return
    POLL_SPACING = (5_000, 10_000)     # sleep between two cudaEventQuery calls


@dataclass(frozen=True)
class Comm:
    """A collective or point-to-point transfer. Participants with the same `key` form one
    instance; it ends on every participant at max(participants' starts) + transfer_ns × comm."""
    key: tuple
    participants: int
    transfer_ns: int
    args: dict = field(default_factory=dict, hash=False, compare=False)  # collective args (trace only)
    args_on_kernel: bool = True   # newer PyTorch copies the collective args onto the NCCL kernel


@dataclass(frozen=True)
class Gpu:
    """One GPU op: `cat` is kernel / gpu_memcpy / gpu_memset. `dur_ns` is the compute duration
    (scaled by compute=F); communication ops take their time from `comm` instead."""
    name: str
    stream: int
    dur_ns: int = 0
    cat: str = "kernel"
    bytes: int = 0
    comm: Comm | None = None


# ---- CPU actions ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Busy:
    """Framework / Python work inside a cpu_op: scaled by cpu=F."""
    ns: int


@dataclass(frozen=True)
class Idle:
    """CPU time outside every op (data loading, sleeps, loop overhead): never scaled."""
    ns: int


@dataclass(frozen=True)
class AnnotationBegin:
    name: str


@dataclass(frozen=True)
class AnnotationEnd:
    pass


@dataclass(frozen=True)
class OpBegin:
    name: str
    args: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class OpEnd:
    pass


@dataclass(frozen=True)
class Launch:
    """An asynchronous launch (cudaLaunchKernel, cudaMemcpyAsync, ...): the op is queued on its
    stream and the call returns after its own time."""
    work: Gpu
    api: str = "cudaLaunchKernel"


@dataclass(frozen=True)
class GraphLaunch:
    """cudaGraphLaunch: every kernel shares the call's correlation and runs back to back."""
    stream: int
    kernels: tuple
    graph_id: int


@dataclass(frozen=True)
class EventRecord:
    event: str
    stream: int


@dataclass(frozen=True)
class StreamWaitEvent:
    """The next op queued on `stream` waits for the op `event` was recorded after."""
    stream: int
    event: str


@dataclass(frozen=True)
class StreamSync:
    stream: int


@dataclass(frozen=True)
class DeviceSync:
    pass


@dataclass(frozen=True)
class EventSync:
    event: str


@dataclass(frozen=True)
class EventPoll:
    """`while not event.query(): sleep` — cudaEventQuery calls until one starts after the op end."""
    event: str


@dataclass(frozen=True)
class BlockingMemcpy:
    """Legacy cudaMemcpy: queues its copy behind the stream and returns once the copy ended."""
    work: Gpu


@dataclass
class Rank:
    """One process: its CPU threads (thread 0 is the main thread with the ProfilerStep ranges),
    the CPU time it starts at (arrival skew between ranks) and whether its traces use
    `baseTimeNanoseconds` or absolute timestamps."""
    threads: list
    start_ns: int = 0


@dataclass
class Job:
    name: str
    ranks: list
    step: int                  # the ProfilerStep the what-ifs are evaluated on
    relative_time: bool = True  # write baseTimeNanoseconds + relative ts (else absolute µs)
    description: str = ""
    variants: tuple = ("sync", "nosync")  # trace variants written (writer.py)


class ThreadBuilder:
    """Helpers that append the action patterns PyTorch produces (op with launches, .item(), ...)."""

    def __init__(self, key: str):
        self.actions: list = []
        self.key = key
        self._n = 0

    def draw(self, lo: int, hi: int) -> int:
        """A program-text duration: deterministic per builder and call index."""
        self._n += 1
        return jitter(f"{self.key}/prog/{self._n}", lo, hi)

    def add(self, *actions) -> "ThreadBuilder":
        self.actions.extend(actions)
        return self

    def op(self, name: str, *body, pre: int = 0, post: int = 0, args: dict | None = None) -> "ThreadBuilder":
        """A cpu_op: `pre` ns of busy time, the body actions, `post` ns of busy time."""
        self.add(OpBegin(name, args or {}))
        if pre:
            self.add(Busy(pre))
        self.add(*body)
        if post:
            self.add(Busy(post))
        return self.add(OpEnd())

    def kernel_op(self, name: str, kernel: str, stream: int, dur_ns: int, busy_ns: int) -> "ThreadBuilder":
        """An aten op that launches one kernel: most of its busy time before the launch."""
        pre = busy_ns * 3 // 4
        return self.op(name, Launch(Gpu(kernel, stream, dur_ns)), pre=pre, post=busy_ns - pre)

    def item(self, stream: int, busy_ns: int) -> "ThreadBuilder":
        """`tensor.item()` in PyTorch 2.x: a small DtoH cudaMemcpyAsync then cudaStreamSynchronize."""
        copy = Gpu("Memcpy DtoH (Device -> Pinned)", stream, 2_000, cat="gpu_memcpy", bytes=4)
        self.add(OpBegin("aten::item"), OpBegin("aten::_local_scalar_dense"), Busy(busy_ns),
                 Launch(copy, api="cudaMemcpyAsync"), StreamSync(stream), OpEnd(), OpEnd())
        return self

    def legacy_item(self, stream: int, busy_ns: int) -> "ThreadBuilder":
        """The older blocking pattern: one cudaMemcpy that returns after its copy ran."""
        copy = Gpu("Memcpy DtoH (Device -> Pageable)", stream, 2_500, cat="gpu_memcpy", bytes=4)
        self.add(OpBegin("aten::item"), OpBegin("aten::_local_scalar_dense"), Busy(busy_ns),
                 BlockingMemcpy(copy), OpEnd(), OpEnd())
        return self

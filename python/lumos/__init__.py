"""lumos: replay and predict distributed LLM training from PyTorch profiler (Kineto) traces.

    import lumos
    job = lumos.load_job("traces/")                 # one Kineto trace per rank
    r = lumos.replay(job)                           # measured vs simulated iteration per rank
    r.ranks[0].simulated_ns, r.breakdowns()         # plain attributes, NumPy arrays
    lumos.replay(job, scale={"compute": 0.5})       # what-if: GPU compute twice as fast
    r.report("report.html")                         # the `lumos report` page
    w = lumos.whatif(job, gpu="h200-sxm", dp=4)     # `lumos whatif`: the graph rewritten
    w.speedup, w.changes, w.predicted.breakdowns()  # baseline and predicted are replays
    lumos.predict(model="gpt3-175b", tp=8, pp=8, dp=8).iteration_ns
    lumos.sweep(model="gpt3-175b", gpus=512, top=5).best          # `lumos sweep`
    lumos.calibrate("traces/", output="profile.json")            # `lumos calibrate`

Every result has ``to_dict()`` (the numbers ``lumos ... --json`` prints, exactly) and, where a
table fits, ``to_pandas()`` (when pandas is installed). Input errors raise ``lumos.LumosError``
with the library's message (file, position, reason). Loading, replay and prediction run with
the GIL released.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import _lumos
from ._lumos import LumosError

LumosError.__module__ = "lumos"  # shown as lumos.LumosError in tracebacks

__all__ = [
    "LumosError",
    "Job",
    "RankReplay",
    "Replay",
    "Timeline",
    "WhatIf",
    "whatif",
    "Prediction",
    "load_job",
    "replay",
    "predict",
    "Sweep",
    "sweep",
    "calibrate",
    "BREAKDOWN_COLUMNS",
]

__version__ = "0.1.0"

#: Columns of :meth:`Replay.breakdowns` (ns).
BREAKDOWN_COLUMNS = ("exposed_compute_ns", "overlapped_ns", "exposed_comm_ns", "other_ns", "exposed_comm_wait_ns")

PathLike = Union[str, "os.PathLike[str]"]


def _numpy():
    try:
        import numpy
    except ImportError as e:  # the arrays need NumPy; everything else works without it
        raise ImportError("lumos: this result is a NumPy array; install numpy (Debian: python3-numpy)") from e
    return numpy


def _pandas():
    try:
        import pandas
    except ImportError as e:
        raise ImportError("lumos: to_pandas() needs pandas (Debian: python3-pandas)") from e
    return pandas


class Job:
    """A job: one loaded trace per rank, sorted by rank. Made by :func:`load_job`."""

    def __init__(self, native: "_lumos.Job", paths: Sequence[str]):
        self._native = native
        self.paths: List[str] = list(paths)

    @property
    def ranks(self) -> List[int]:
        """Rank numbers, ascending."""
        return list(self._native.ranks)

    @property
    def files(self) -> List[str]:
        """The file of each rank, in rank order."""
        return list(self._native.files)

    def __len__(self) -> int:
        return len(self._native)

    def inspect(self, structure: bool = False, groups: bool = False) -> Dict[str, Any]:
        """What ``lumos inspect --json`` prints: per rank its file, event counts by category,
        GPU and communication ops, streams, threads, device, world size and profiler steps.

        ``structure=True``: what ``lumos inspect --structure --json`` prints instead, the job's
        discovered structure (parallelism, pipeline stages and schedule, layers, model shape,
        process groups, per rank its iteration, phases and passes), each fact with its source;
        ``groups=True`` also lists the per-layer task groups (``--groups``)."""
        if structure:
            return json.loads(self._native.structure_json(groups))
        if groups:
            raise TypeError("inspect(groups=True) needs structure=True")
        return json.loads(self._native.inspect_json())

    def __repr__(self) -> str:
        return f"lumos.Job({len(self)} ranks from {self.paths!r})"


def load_job(paths: Union[PathLike, Iterable[PathLike]], threads: int = 0) -> Job:
    """Loads a job: trace files (``.json``/``.json.gz``) or directories of them, one file per
    rank. ``threads=0`` reads with one thread per core. Raises :class:`LumosError`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    items = [os.fspath(p) for p in paths]
    return Job(_lumos.load_job(items, threads), items)


class _Plain:
    """A plain result object: attributes from a dict, ``to_dict()`` back."""

    _fields: Sequence[str] = ()

    def __init__(self, data: Mapping[str, Any]):
        self._data = dict(data)
        for k, v in self._data.items():
            setattr(self, k, v)

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self._data))  # a deep copy the caller may change

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._data[k]!r}" for k in self._fields if k in self._data)
        return f"{type(self).__name__}({shown})"


class RankReplay(_Plain):
    """One rank of a replay: ``rank``, ``file``, ``step``, ``measured_ns``, ``simulated_ns``,
    ``error``, ``breakdown`` and ``breakdown_measured`` (dicts of ns), ``sm_utilization``,
    ``sm_utilization_measured``."""

    _fields = ("rank", "step", "measured_ns", "simulated_ns", "error")
    rank: int
    file: str
    step: str
    measured_ns: int
    simulated_ns: int
    error: float
    breakdown: Dict[str, int]
    breakdown_measured: Dict[str, int]
    sm_utilization: float
    sm_utilization_measured: float


class Timeline:
    """Every task of one rank on the simulated and measured timelines, as NumPy columns
    (job time, ns; ``origin_ns + start_ns`` is the absolute time ``Replay.write_trace`` writes).

    Columns: ``task``, ``processor`` (index into ``processors``), ``kind`` (index into
    ``kind_names``), ``start_ns``, ``end_ns``, ``duration_ns`` (own, scaled), ``measured_start_ns``,
    ``measured_end_ns``; ``name`` is a list of str."""

    COLUMNS = ("task", "processor", "kind", "start_ns", "end_ns", "duration_ns", "measured_start_ns", "measured_end_ns")

    def __init__(self, data: Dict[str, Any]):
        np = _numpy()
        self.rank: int = data["rank"]
        self.origin_ns: int = data["origin_ns"]
        self.window_ns = tuple(data["window_ns"])
        self.measured_window_ns = tuple(data["measured_window_ns"])
        self.kind_names: List[str] = list(data["kind_names"])
        self.processors: List[Dict[str, Any]] = list(data["processors"])
        self.name: List[str] = list(data["name"])
        for c in self.COLUMNS:
            setattr(self, c, np.asarray(data[c]))

    def __len__(self) -> int:
        return len(self.name)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {c: getattr(self, c).tolist() for c in self.COLUMNS}
        d.update(rank=self.rank, origin_ns=self.origin_ns, window_ns=list(self.window_ns), name=list(self.name),
                 kind_names=list(self.kind_names), processors=[dict(p) for p in self.processors])
        return d

    def to_pandas(self):
        """One row per task, with the processor's and the kind's names."""
        pd = _pandas()
        df = pd.DataFrame({c: getattr(self, c) for c in self.COLUMNS})
        df.insert(1, "name", self.name)
        df["kind"] = pd.Categorical.from_codes(df["kind"], categories=self.kind_names)
        df["processor_name"] = [self.processors[p]["name"] for p in self.processor]
        return df

    def __repr__(self) -> str:
        return f"lumos.Timeline(rank {self.rank}, {len(self)} tasks)"


class Replay(_Plain):
    """A replay (``lumos replay``): ``measured_ns``, ``simulated_ns``, ``error`` of the job (its
    slowest rank), ``unprofiled_ns`` (estimate of the simulated step with the profiler off), ``ranks`` (:class:`RankReplay`), ``scales``, ``graph``, ``dependencies``,
    ``causality``, ``clocks``, ``gpu_ops_bound_by``, ``overheads`` (per stream), ``collectives``:
    the object ``lumos replay --json`` prints, less what has a method of its own (each rank's
    SM utilisation series and kept overheads, the critical path)."""

    _fields = ("measured_ns", "simulated_ns", "error", "unprofiled_ns")

    def __init__(self, native: "_lumos.Replay", job: Job):
        data = json.loads(native.summary_json())
        super().__init__(data)
        self._native = native
        self.job_info = data["job"]
        self.measured_ns: int = data["job"]["measured_ns"]
        self.simulated_ns: int = data["job"]["simulated_ns"]
        self.error: float = data["job"]["error"]
        self.unprofiled_ns: int = data["job"]["unprofiled_ns"]
        self.ranks: List[RankReplay] = [RankReplay(r) for r in data["ranks"]]
        self._job = job

    def rank(self, rank: int) -> RankReplay:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(f"no rank {rank} in this job")

    def breakdowns(self, simulated: bool = True):
        """(n_ranks, 5) int64 NumPy array, rows in rank order, columns ``BREAKDOWN_COLUMNS``."""
        _numpy()
        return self._native.breakdowns(simulated)

    def timeline(self, rank: int) -> Timeline:
        """Every task of ``rank`` with its simulated and measured times."""
        _numpy()
        return Timeline(self._native.timeline(rank))

    def sm_utilization_series(self, rank: int, simulated: bool = True):
        """Lumos's SM utilisation per 1 ms bucket of the rank's window (NumPy float64)."""
        _numpy()
        return self._native.sm_utilization_series(rank, simulated)

    def critical_path(self, rank: Optional[int] = None) -> Dict[str, Any]:
        """The critical path of ``rank``'s iteration (default: the slowest rank), as
        ``lumos replay --critical-path --json`` prints it, plus task ids and names."""
        return json.loads(self._native.critical_path_json(rank))

    def frozen(self) -> List[Dict[str, Any]]:
        """Per rank, the overheads a what-if keeps (``lumos replay --explain``)."""
        return json.loads(self._native.frozen_json())

    def html(self, title: Optional[str] = None) -> str:
        """The ``lumos report`` page of this replay (with the baseline beside a what-if)."""
        return self._native.html(title or "lumos report", self._job.paths)

    def report(self, path: PathLike, title: Optional[str] = None) -> str:
        """Writes :meth:`html` to ``path``; returns the path."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html(title))
        return os.fspath(path)

    def write_trace(self, path: PathLike, gzip: bool = False) -> List[str]:
        """Writes the simulated job as Kineto JSON (``lumos replay --trace-out``)."""
        return [os.fspath(p) for p in self._native.write_trace(os.fspath(path), gzip)]

    def to_dict(self) -> Dict[str, Any]:
        return super().to_dict()

    def to_pandas(self):
        """One row per rank: iteration times, error, breakdown (simulated) and SM utilisation."""
        pd = _pandas()
        rows = []
        for r in self.ranks:
            row = {"rank": r.rank, "step": r.step, "measured_ns": r.measured_ns, "simulated_ns": r.simulated_ns, "error": r.error}
            row.update(r.breakdown)
            row["sm_utilization"] = r.sm_utilization
            rows.append(row)
        return pd.DataFrame(rows).set_index("rank")

    def __repr__(self) -> str:
        return (f"lumos.Replay({len(self.ranks)} ranks, measured {self.measured_ns / 1e6:.3f} ms, "
                f"simulated {self.simulated_ns / 1e6:.3f} ms, error {100 * self.error:.2f}%)")


_SCALE_KINDS = ("compute", "comm", "cpu")


def replay(job: Union[Job, PathLike, Iterable[PathLike]], scale: Optional[Mapping[str, float]] = None,
           step: Optional[int] = None, baseline: bool = False) -> Replay:
    """Builds the job's execution graph, replays it and evaluates every rank's iteration.

    ``scale`` is a what-if, as ``lumos replay --scale``: ``{"compute": 0.5}`` (GPU compute),
    ``"comm"`` (communication transfers), ``"cpu"`` (CPU busy time), and ``"op:TEXT"`` for every
    op whose name contains TEXT (0 removes it). ``step`` picks ProfilerStep#N (default: the last
    one every rank has). ``baseline=True`` also replays the unscaled job, shown beside the
    what-if in :meth:`Replay.html`."""
    if not isinstance(job, Job):
        job = load_job(job)
    kinds = {k: 1.0 for k in _SCALE_KINDS}
    ops = []
    for key, factor in (scale or {}).items():
        factor = float(factor)
        if key.startswith("op:"):
            if len(key) == 3:
                raise LumosError("scale op:TEXT needs a non-empty TEXT")
            if not (factor >= 0) or factor > 1e6:
                raise LumosError(f"scale {key} must be a factor >= 0 (got {factor:g})")
            ops.append((key[3:], factor))
        elif key in kinds:
            if not (factor > 0) or factor > 1e6:
                raise LumosError(f"scale {key} must be a positive factor (got {factor:g})")
            kinds[key] = factor
        else:
            raise LumosError(f"scale: unknown kind '{key}' (compute, comm, cpu or op:TEXT)")
    native = _lumos.replay(job._native, kinds["compute"], kinds["comm"], kinds["cpu"], ops, step, baseline)
    return Replay(native, job)


class _WhatIfReplay(Replay):
    """The baseline or the prediction of a :class:`WhatIf`: a :class:`Replay` whose prediction
    writes the what-if's page and traces (:meth:`WhatIf.report`, :meth:`WhatIf.write_trace`)."""

    def __init__(self, native: "_lumos.Replay", job: Job, owner: "WhatIf", predicted: bool):
        super().__init__(native, job)
        self._owner = owner
        self._predicted = predicted

    def html(self, title: Optional[str] = None) -> str:
        if self._predicted:
            return self._owner.html(title)
        return super().html(title)

    def write_trace(self, path: PathLike, gzip: bool = False) -> List[str]:
        if self._predicted:
            return self._owner.write_trace(path, gzip)
        return super().write_trace(path, gzip)


class WhatIf(_Plain):
    """A what-if (``lumos whatif``): the job's execution graph rewritten for another
    configuration and replayed. ``to_dict()`` is what ``lumos whatif --json`` prints.

    ``baseline`` and ``predicted`` are :class:`Replay` objects (breakdowns, timelines, critical
    path as for any replay; the prediction's ``report`` and ``write_trace`` are the what-if's);
    ``changes`` the change records (pass, subject, from, to, figures, text); ``change_texts``
    their sentences; ``speedup`` the baseline's iteration over the prediction's; ``iteration_ns``
    and ``baseline_ns`` the two iterations; ``unprofiled_ns`` and ``baseline_unprofiled_ns`` the
    two steps estimated with the profiler off; ``bound_by``, ``critical_path_shares`` and
    ``attribution`` why the step moved as it did; ``shape``, ``pipeline``, ``structure`` and
    ``folded`` as in the JSON (None when absent)."""

    _fields = ("iteration_ns", "baseline_ns", "speedup", "unprofiled_ns", "baseline_unprofiled_ns")

    def __init__(self, native: "_lumos.WhatIf", job: Job):
        data = json.loads(native.json())
        super().__init__(data)
        self._native = native
        self._job = job
        self.changes: List[Dict[str, Any]] = data["change_records"]
        self.change_texts: List[str] = data["changes"]
        self.iteration_ns: int = data["predicted"]["iteration_ns"]
        self.baseline_ns: int = data["baseline"]["iteration_ns"]
        self.unprofiled_ns: int = data["predicted"]["unprofiled_ns"]
        self.baseline_unprofiled_ns: int = data["baseline"]["unprofiled_ns"]
        self.speedup: float = data["speedup"]
        self.bound_by: str = data["bound_by"]
        self.critical_path_shares: Dict[str, Optional[Dict[str, float]]] = data["critical_path_shares"]
        self.attribution: Dict[str, Any] = data["attribution"]
        for key in ("shape", "pipeline", "structure", "folded"):
            setattr(self, key, data.get(key))
        self.baseline = _WhatIfReplay(native.baseline(), job, self, predicted=False)
        self.predicted = _WhatIfReplay(native.predicted(), job, self, predicted=True)
        self.trace_note: str = ""

    def html(self, title: Optional[str] = None) -> str:
        """The ``lumos whatif --report`` page: the prediction with the baseline beside it, its
        changes first."""
        return self._native.html(title or "lumos whatif")

    def report(self, path: PathLike, title: Optional[str] = None) -> str:
        """Writes :meth:`html` to ``path``; returns the path."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html(title))
        return os.fspath(path)

    def write_trace(self, path: PathLike, gzip: bool = False) -> List[str]:
        """Writes the prediction as Kineto traces, one file per rank, as ``lumos whatif
        --trace-out`` does (after a pipeline split in the graph, every rank of every stage);
        ``lumos replay`` reads them back to the same prediction. Needs every traced rank: a
        what-if that folded identical ranks raises :class:`LumosError` (run it with
        ``fold=False``), as does one predicted by the pass-level pipeline model. How the written
        ranks stand for a larger target is in ``trace_note``."""
        files, self.trace_note = self._native.write_trace(os.fspath(path), gzip)
        return [os.fspath(p) for p in files]

    def to_pandas(self):
        """One row per rank of the prediction: iteration and breakdown (``predicted.ranks`` of
        the JSON)."""
        pd = _pandas()
        rows = []
        for r in self._data["predicted"]["ranks"]:
            row = {"rank": r["rank"], "step": r["step"], "iteration_ns": r["iteration_ns"]}
            row.update(r["breakdown"])
            row["sm_utilization"] = r["sm_utilization"]
            rows.append(row)
        return pd.DataFrame(rows).set_index("rank")

    def __repr__(self) -> str:
        return (f"lumos.WhatIf({len(self.changes)} changes, baseline {self.baseline_ns / 1e6:.3f} ms, "
                f"predicted {self.iteration_ns / 1e6:.3f} ms, speedup {self.speedup:.3f}x)")


# keyword → `lumos whatif` flag.
_WHATIF_FLAGS = {
    "layers": "--layers", "gpu": "--gpu", "from_gpu": "--from-gpu", "dp": "--dp", "pp": "--pp", "vp": "--vp",
    "tp": "--tp", "sp": "--sp", "global_batch": "--global-batch", "micro_batch": "--micro-batch", "hidden": "--hidden",
    "ffn": "--ffn", "heads": "--heads", "seq": "--seq", "schedule": "--schedule", "profile": "--profile", "step": "--step",
    "host_speed": "--host-speed", "precision": "--precision", "cp": "--cp", "fsdp": "--fsdp", "hsdp": "--hsdp",
    "reshard_after_forward": "--reshard-after-forward", "ep": "--ep", "experts": "--experts", "top_k": "--top-k",
    "expert_ffn": "--expert-ffn", "routing": "--routing", "cp_comm": "--cp-comm",
}


def whatif(job: Union[Job, PathLike, Iterable[PathLike]], *, layers: Optional[int] = None, gpu: Optional[str] = None,
           from_gpu: Optional[str] = None, dp: Optional[int] = None, pp: Optional[int] = None, vp: Optional[int] = None,
           tp: Optional[int] = None, sp: Optional[Union[bool, str]] = None, global_batch: Optional[int] = None,
           micro_batch: Optional[int] = None, hidden: Optional[int] = None, ffn: Optional[int] = None,
           heads: Optional[int] = None, seq: Optional[int] = None, schedule: Optional[str] = None,
           profile: Optional[PathLike] = None, step: Optional[int] = None, scale: Optional[Mapping[str, float]] = None,
           fold: bool = True, host_speed: Optional[Union[float, PathLike]] = None, precision: Optional[str] = None,
           cp: Optional[int] = None, fsdp: Optional[Union[bool, str]] = None, hsdp: Optional[int] = None,
           reshard_after_forward: Optional[Union[bool, str]] = None, ep: Optional[int] = None, experts: Optional[int] = None,
           top_k: Optional[int] = None, expert_ffn: Optional[int] = None, routing: Optional[str] = None,
           cp_comm: Optional[str] = None) -> WhatIf:
    """Rewrites the job's execution graph for another configuration and replays it, as
    ``lumos whatif`` does: ``lumos.whatif(job, gpu="h200-sxm")``, ``lumos.whatif(job, tp=4,
    dp=2)``, ``lumos.whatif(job, pp=2, schedule="1f1b")``. Each keyword is the command's flag
    (``_`` for ``-``), read by the command's own parser: same defaults, checks and messages
    (``lumos whatif --help`` explains each): ``lumos.whatif(job, cp=4, dp=1)``,
    ``lumos.whatif(job, fsdp=True, dp=8, global_batch=16)``, ``lumos.whatif(job, ep=4)``,
    ``lumos.whatif(job, precision="fp8")``. ``sp``, ``fsdp`` and ``reshard_after_forward`` take a
    boolean or on/off; ``profile`` a
    file from :func:`calibrate`; ``host_speed`` the target host, a factor or a profile from
    :func:`calibrate` of a trace recorded on it; ``scale`` as for :func:`replay` (applied to the baseline and
    the prediction). ``fold=False`` replays every traced rank (``--no-fold``); by default ranks
    with identical traces are folded onto one of each class. Raises :class:`LumosError`."""
    if not isinstance(job, Job):
        job = load_job(job)
    config = dict(layers=layers, gpu=gpu, from_gpu=from_gpu, dp=dp, pp=pp, vp=vp, tp=tp, sp=sp, global_batch=global_batch,
                  micro_batch=micro_batch, hidden=hidden, ffn=ffn, heads=heads, seq=seq, schedule=schedule,
                  profile=None if profile is None else os.fspath(profile), step=step,
                  host_speed=None if host_speed is None else (repr(float(host_speed)) if isinstance(host_speed, (int, float))
                                                              else os.fspath(host_speed)),
                  precision=precision, cp=cp, fsdp=fsdp, hsdp=hsdp, reshard_after_forward=reshard_after_forward, ep=ep,
                  experts=experts, top_k=top_k, expert_ffn=expert_ffn, routing=routing, cp_comm=cp_comm)
    flags = _flags("whatif", _WHATIF_FLAGS, config)
    for key, factor in (scale or {}).items():
        flags += ["--scale", f"{key}={float(factor)!r}"]
    if not fold:
        flags.append("--no-fold")
    return WhatIf(_lumos.whatif(job._native, flags, job.paths), job)


class Prediction(_Plain):
    """What ``lumos predict --json`` prints: ``iteration_ns``, ``tokens_per_s``, ``mfu``, ``hfu``,
    ``bubble_fraction``, ``breakdown``, ``memory_bytes_per_gpu``, ``stages``, ``job``, ``graph``..."""

    _fields = ("iteration_ns", "tokens_per_s", "mfu", "bubble_fraction")
    iteration_ns: int
    tokens_per_s: float
    mfu: float
    hfu: float
    bubble_fraction: float

    def to_pandas(self):
        """One row per pipeline stage."""
        return _pandas().DataFrame(self._data["stages"]).set_index("stage")


# keyword → `lumos predict` flag; booleans become on/off or a bare switch.
_PREDICT_FLAGS = {
    "model": "--model", "layers": "--layers", "hidden": "--hidden", "ffn": "--ffn", "heads": "--heads",
    "kv_heads": "--kv-heads", "seq": "--seq", "vocab": "--vocab", "tp": "--tp", "pp": "--pp", "dp": "--dp",
    "vp": "--vp", "sp": "--sp", "tp_comm_overlap": "--tp-comm-overlap",
    "overlap_param_gather": "--overlap-param-gather", "distributed_optimizer": "--distributed-optimizer", "micro_batch": "--micro-batch",
    "global_batch": "--global-batch", "schedule": "--schedule", "recompute": "--recompute", "gpu": "--gpu", "precision": "--precision",
    "profile": "--profile", "attention": "--attention", "cost_model": "--cost-model",
    "forward_only": "--forward-only", "unfold": "--unfold",
    "mtp_layers": "--mtp-layers", "routing": "--routing", "routing_from": "--routing-from",
    "experts": "--experts", "top_k": "--top-k", "expert_ffn": "--expert-ffn", "ep": "--ep", "expert_tp": "--expert-tp",
    "shared_experts": "--shared-experts", "moe_dispatcher": "--moe-dispatcher", "capacity_factor": "--capacity-factor",
    "cp": "--cp", "cp_comm": "--cp-comm", "fsdp": "--fsdp", "hsdp": "--hsdp", "reshard_after_forward": "--reshard-after-forward",
    "pipeline_layout": "--pipeline-layout", "decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers",
    "decoder_last_pipeline_num_layers": "--decoder-last-pipeline-num-layers",
}
_SWITCHES = {"unfold", "forward_only"}

# `lumos sweep`: the model and machine keywords of predict, and lists for the searched sizes.
_SWEEP_FLAGS = {
    "gpus": "--gpus", "model": "--model", "layers": "--layers", "hidden": "--hidden", "ffn": "--ffn",
    "heads": "--heads", "kv_heads": "--kv-heads", "seq": "--seq", "vocab": "--vocab", "gpu": "--gpu",
    "precision": "--precision", "profile": "--profile", "cost_model": "--cost-model",
    "tp": "--tp", "pp": "--pp", "dp": "--dp", "vp": "--vp", "micro_batch": "--micro-batch",
    "schedule": "--schedule", "recompute": "--recompute", "sp": "--sp", "tp_comm_overlap": "--tp-comm-overlap",
    "overlap_param_gather": "--overlap-param-gather", "distributed_optimizer": "--distributed-optimizer", "global_batch": "--global-batch", "memory_margin": "--memory-margin", "top": "--top", "threads": "--threads",
    "attention": "--attention", "forward_only": "--forward-only", "unfold": "--unfold", "mtp_layers": "--mtp-layers",
    "experts": "--experts", "top_k": "--top-k", "expert_ffn": "--expert-ffn", "ep": "--ep", "expert_tp": "--expert-tp",
    "shared_experts": "--shared-experts", "moe_dispatcher": "--moe-dispatcher", "capacity_factor": "--capacity-factor",
    "cp": "--cp", "cp_comm": "--cp-comm", "fsdp": "--fsdp", "hsdp": "--hsdp", "reshard_after_forward": "--reshard-after-forward",
    "pipeline_layout": "--pipeline-layout",
}


def _flags(command: str, known: Mapping[str, str], config: Mapping[str, Any]) -> List[str]:
    flags: List[str] = []
    for key, value in config.items():
        if key not in known:
            raise TypeError(f"{command}() got an unexpected keyword argument '{key}' (known: {', '.join(known)})")
        if value is None:
            continue
        flag = known[key]
        if key in _SWITCHES:
            if value:
                flags.append(flag)
            continue
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif isinstance(value, (list, tuple)):
            value = ",".join("on" if v is True else "off" if v is False else str(v) for v in value)
        flags += [flag, str(value)]
    return flags


def predict(**config: Any) -> Prediction:
    """Models one training iteration from a model description, as ``lumos predict`` does:
    ``lumos.predict(model="gpt3-175b", tp=8, pp=8, dp=16, vp=4, recompute="selective")``.
    Keywords are the command's flags with ``_`` for ``-``; ``sp`` takes a boolean, ``unfold`` and
    ``forward_only`` are switches. Raises :class:`LumosError` with the command's message for
    invalid values."""
    return Prediction(json.loads(_lumos.predict_json(_flags("predict", _PREDICT_FLAGS, config))))


class Sweep(_Plain):
    """What ``lumos sweep --json`` prints: ``problem``, ``configurations``, ``accepted``,
    ``rejected`` (counts per reason), ``results`` (every configuration with its prediction or
    rejection) and ``top`` (indices into ``results``, fastest first). ``ranked`` is the top
    results themselves, ``best`` the first of them (None when every configuration was rejected)."""

    _fields = ("configurations", "accepted")
    configurations: int
    accepted: int

    @property
    def ranked(self) -> List[Dict[str, Any]]:
        return [self._data["results"][i] for i in self._data["top"]]

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def to_pandas(self):
        """One row per configuration (rejected ones included, with their reason)."""
        return _pandas().json_normalize(self._data["results"])


def sweep(**config: Any) -> Sweep:
    """Searches the parallel configurations of a model on ``gpus`` GPUs, as ``lumos sweep``
    does: ``lumos.sweep(model="gpt3-175b", gpus=512, tp=[4, 8], recompute="selective", top=5)``.
    Lists (``tp``, ``pp``, ``dp``, ``vp``, ``micro_batch``, ``schedule``, ``recompute``, ``sp``,
    ``precision``) take a Python list or a comma-separated string. Runs with the GIL released on every core
    (``threads`` to limit); the result is the same for any thread count."""
    return Sweep(json.loads(_lumos.sweep_json(_flags("sweep", _SWEEP_FLAGS, config))))


def calibrate(paths: Union[PathLike, Iterable[PathLike]], rank: Optional[int] = None,
              output: Optional[PathLike] = None) -> Dict[str, Any]:
    """Fits the kernel-level cost profile from the traces of one run, as ``lumos calibrate``
    does, and returns it as a dict (the JSON ``lumos calibrate -o`` writes, which ``predict(
    profile=...)`` and ``sweep(profile=...)`` read). ``rank`` fits on one rank's file only;
    ``output`` also writes the profile there."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    text = _lumos.calibrate_json([os.fspath(p) for p in paths], rank)
    if output is not None:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    return json.loads(text)

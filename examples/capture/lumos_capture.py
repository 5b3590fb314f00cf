#!/usr/bin/env python3
"""lumos-capture: record PyTorch profiler (Kineto) traces the way lumos reads them best.

Wrap the training loop (three added lines)::

    import lumos_capture

    with lumos_capture.capture("traces/", steps=3) as cap:
        for batch in data:
            train_step(batch)
            cap.step()
            if cap.done:          # optional: stop looping once the trace is written
                break

or decorate the step function::

    @lumos_capture.profile_steps("traces/", steps=3)
    def train_step(batch):
        ...

Each rank writes one gzipped trace, ``traces/rank{R}.json.gz``.  What is recorded and why:

* CPU activity, plus CUDA activity when a CUDA device and a CUDA-capable profiler are there:
  lumos needs the operators, the kernel launches and the GPU kernels with their correlation ids.
* ``record_shapes=True``: ``Input Dims`` / ``Input type`` let lumos size operators and messages.
* ``enable_cuda_sync_events=True`` (through ``torch.profiler._ExperimentalConfig``) when the
  installed PyTorch has it: the ``cuda_sync`` rows tell which stream waited on which.
* A schedule of ``wait`` / ``warmup`` / ``active`` steps: the first iterations are not
  representative, and the warmup keeps profiler start-up cost out of the recorded steps.  Each
  recorded iteration is a ``ProfilerStep#N`` range, which lumos uses as the iteration.
* ``with_stack`` and ``profile_memory`` are off: stacks bloat traces many times over and lumos
  does not use them; memory events are not needed either.
* The ``distributedInfo`` PyTorch writes when ``torch.distributed`` is initialised is kept as is:
  lumos takes the rank and world size from it.  The file name carries the rank as well.

PyTorch built without Kineto (e.g. Debian's ``python3-torch``) writes a legacy trace from
``export_chrome_trace``: a bare JSON array with no categories and no shapes.  In that case this
module writes the trace itself from the profiler's results in the Kineto layout (CPU operators
and annotations only, marked with a ``lumosCapture`` entry); see ``features()``.

Works with PyTorch 1.13 and later: newer options are detected, never inferred from the version.
Run this file as a script for a self-test: ``python3 lumos_capture.py --self-test [--out DIR]``.
"""

from __future__ import annotations

import atexit
import functools
import gzip
import inspect
import json
import os
import shutil
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional

try:
    import torch
    import torch.profiler
    _TORCH_IMPORT_ERROR: Optional[BaseException] = None
except Exception as _e:  # ImportError, or a broken install
    torch = None  # type: ignore[assignment]
    _TORCH_IMPORT_ERROR = _e

__all__ = ["capture", "profile_steps", "Capture", "features", "get_rank", "get_world_size"]
__version__ = "0.1.0"


def _say(message: str, err: bool = False) -> None:
    """One line in one write, so that lines of several ranks sharing a pipe do not interleave."""
    stream = sys.stderr if err else sys.stdout
    stream.write("lumos-capture: " + message + "\n")
    stream.flush()

# Kineto marks record_function ranges (RecordScope::USER_SCOPE) as "user_annotation".
_USER_SCOPE = 7


def _require_torch() -> None:
    if torch is None:
        raise RuntimeError(f"lumos_capture needs PyTorch: import torch failed: {_TORCH_IMPORT_ERROR}")


def _dist():
    """torch.distributed when it is available and initialised, else None."""
    try:
        import torch.distributed as dist
    except Exception:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        pass
    return None


def get_rank() -> int:
    """Rank from torch.distributed when initialised, else the RANK variable, else 0."""
    dist = _dist()
    if dist is not None:
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def get_world_size() -> Optional[int]:
    """World size from torch.distributed when initialised, else WORLD_SIZE, else None."""
    dist = _dist()
    if dist is not None:
        return int(dist.get_world_size())
    try:
        return int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Feature detection (never by version string)

def _profile_parameters() -> set:
    try:
        return set(inspect.signature(torch.profiler.profile.__init__).parameters)
    except (TypeError, ValueError):
        return set()


def _kineto_available() -> bool:
    fn = getattr(torch.autograd, "kineto_available", None)
    if fn is None:
        return True  # versions without the probe always had Kineto
    try:
        return bool(fn())
    except Exception:
        return True


def _cuda_activity_available() -> bool:
    act = getattr(torch.profiler.ProfilerActivity, "CUDA", None)
    if act is None:
        return False
    try:
        if not torch.cuda.is_available():
            return False
    except Exception:
        return False
    supported = getattr(torch.profiler, "supported_activities", None)
    if supported is None:
        return True
    try:
        return act in supported()
    except Exception:
        return True


def _cuda_sync_config() -> Optional[Any]:
    """An _ExperimentalConfig with enable_cuda_sync_events=True, or None where unsupported."""
    if "experimental_config" not in _profile_parameters():
        return None
    cls = getattr(torch.profiler, "_ExperimentalConfig", None)
    if cls is None:
        cls = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if cls is None:
        return None
    try:
        return cls(enable_cuda_sync_events=True)
    except TypeError:  # older PyTorch: the keyword does not exist
        return None
    except Exception:
        return None


def features() -> Dict[str, Any]:
    """What the installed PyTorch offers the capture (for logs and bug reports)."""
    if torch is None:
        return {"torch": None, "error": str(_TORCH_IMPORT_ERROR)}
    return {
        "torch": torch.__version__,
        "kineto": _kineto_available(),
        "cuda_device": bool(torch.cuda.is_available()),
        "cuda_activity": _cuda_activity_available(),
        "experimental_config": "experimental_config" in _profile_parameters(),
        "cuda_sync_events": _cuda_sync_config() is not None,
        "distributed_initialised": _dist() is not None,
    }


# ---------------------------------------------------------------------------------------------
# Writing

def _gzip_file(src: str, dst: str) -> None:
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def _head_has(path: str, needle: bytes, limit: int = 1 << 20) -> bool:
    with open(path, "rb") as f:
        return needle in f.read(limit)


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except Exception:
        try:
            return int(value.value)
        except Exception:
            return default


def _write_kineto_layout(results: Any, out, meta: Dict[str, Any]) -> int:
    """Writes profiler results as a Kineto-layout JSON object (for PyTorch without Kineto).

    Only what the results hold: CPU operators (``cpu_op``), record_function ranges such as
    ``ProfilerStep#N`` (``user_annotation``) and, with profile_memory, memory instants.
    Returns the number of trace events written.
    """
    pid = os.getpid()
    events = list(results.events())
    try:
        base_us = int(results.trace_start_us())
    except Exception:
        base_us = 0
    rows = []
    tids = set()
    for e in events:
        name = e.name()
        tid = _int_or(e.start_thread_id(), 0)
        ts = _int_or(e.start_us(), 0)
        if name in ("[memory]", "[OutOfMemory]"):
            index = _int_or(e.device_index(), -1)
            args = {"Device Type": _int_or(e.device_type(), 0), "Device Id": index - 256 if index > 127 else index,
                    "Bytes": _int_or(e.nbytes(), 0)}
            rows.append((ts, 0, {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": pid,
                                 "tid": tid, "ts": ts, "args": args}))
            tids.add(tid)
            continue
        dur = max(0, _int_or(e.duration_us(), 0))
        cat = "user_annotation" if _int_or(e.scope(), 0) == _USER_SCOPE else "cpu_op"
        args: Dict[str, Any] = {"External id": _int_or(e.correlation_id(), 0)}
        seq = _int_or(e.sequence_nr(), -1)
        if seq >= 0:
            args["Sequence number"] = seq
            args["Fwd thread id"] = _int_or(e.fwd_thread_id(), 0)
        if meta.get("record_shapes"):
            try:
                shapes = [list(s) for s in e.shapes()]
                if shapes:
                    args["Input Dims"] = shapes
                    args["Input type"] = list(e.dtypes())
            except Exception:
                pass
        if meta.get("with_stack"):
            try:
                stack = list(e.stack())
                if stack:
                    args["Call stack"] = ";".join(stack)
            except Exception:
                pass
        rows.append((ts, -dur, {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                                "dur": dur, "args": args}))
        tids.add(tid)
    rows.sort(key=lambda r: (r[0], r[1]))

    head: Dict[str, Any] = {"schemaVersion": 1}
    dist = _dist()
    if dist is not None:  # the same fields PyTorch writes when it has Kineto
        head["distributedInfo"] = {"backend": str(dist.get_backend()), "rank": int(dist.get_rank()),
                                   "world_size": int(dist.get_world_size())}
    head["lumosCapture"] = {"writer": "lumos_capture " + __version__,
                            "reason": "PyTorch built without Kineto; CPU operators and annotations only",
                            "torch": meta.get("torch")}
    head["displayTimeUnit"] = "ms"
    text = json.dumps(head, separators=(",", ":"))
    out.write(text[:-1] + ',"traceEvents":[\n')
    first = True

    def emit(obj: Dict[str, Any]) -> None:
        nonlocal first
        out.write(("" if first else ",\n") + json.dumps(obj, separators=(",", ":")))
        first = False

    emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": base_us,
          "args": {"name": os.path.basename(sys.executable or "python")}})
    for tid in sorted(tids):
        emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": base_us,
              "args": {"name": f"thread {tid}"}})
    for _, _, obj in rows:
        emit(obj)
    out.write('\n],"traceName":' + json.dumps(meta.get("trace_name", "")) + "}\n")
    return len(rows)


class Capture:
    """Profiles ``skip_first + (wait + warmup + steps) * repeat`` calls of ``step()`` and writes
    one ``rank{R}.json.gz`` per rank (with ``repeat > 1``: ``cycle{K}/rank{R}.json.gz``).

    Attributes: ``files`` (paths written), ``done`` (all cycles written), ``steps_needed``,
    ``profiler`` (the torch.profiler.profile while running), ``errors`` (write failures).
    """

    def __init__(self, out_dir: str = "lumos_traces", steps: int = 3, *, wait: int = 1, warmup: int = 1,
                 repeat: int = 1, skip_first: int = 0, cuda: Optional[bool] = None,
                 record_shapes: bool = True, with_stack: bool = False, profile_memory: bool = False,
                 with_flops: bool = False, with_modules: bool = False, cuda_sync_events: bool = True,
                 verbose: bool = True) -> None:
        _require_torch()
        for name, value, low in (("steps", steps, 1), ("wait", wait, 0), ("warmup", warmup, 0),
                                 ("repeat", repeat, 1), ("skip_first", skip_first, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"lumos_capture: {name} must be an integer >= {low}, got {value!r}")
        self.out_dir = os.fspath(out_dir)
        self.active = steps
        self.wait = wait
        self.warmup = warmup
        self.repeat = repeat
        self.skip_first = skip_first
        self.verbose = verbose
        self.steps_needed = skip_first + (wait + warmup + steps) * repeat
        self.files: List[str] = []
        self.errors: List[str] = []
        self.profiler: Optional[Any] = None
        self.steps_taken = 0
        self._running = False
        self._finished = False

        activities = [torch.profiler.ProfilerActivity.CPU]
        cuda_ok = _cuda_activity_available()
        if cuda is None:
            cuda = cuda_ok
        elif cuda and not cuda_ok:
            warnings.warn("lumos_capture: CUDA profiling requested but not available; recording CPU only")
            cuda = False
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.cuda = bool(cuda)

        params = _profile_parameters()
        kwargs: Dict[str, Any] = {
            "activities": activities,
            "schedule": torch.profiler.schedule(wait=wait, warmup=warmup, active=steps, repeat=repeat,
                                                skip_first=skip_first),
            "on_trace_ready": self._on_trace_ready,
        }
        for key, value in (("record_shapes", record_shapes), ("with_stack", with_stack),
                           ("profile_memory", profile_memory), ("with_flops", with_flops),
                           ("with_modules", with_modules)):
            if key in params or not params:
                kwargs[key] = value
            elif value:
                warnings.warn(f"lumos_capture: this PyTorch has no profile({key}=...); ignored")
        self.cuda_sync_events = False
        if cuda and cuda_sync_events:
            config = _cuda_sync_config()
            if config is not None:
                kwargs["experimental_config"] = config
                self.cuda_sync_events = True
        self._kwargs = kwargs
        self._meta = {"record_shapes": record_shapes, "with_stack": with_stack, "torch": torch.__version__}
        self.kineto = _kineto_available()
        self._cycle = 0

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once every cycle's trace has been written (further step() calls do nothing)."""
        return self._finished or self._cycle >= self.repeat

    def start(self) -> "Capture":
        if self._running or self._finished:
            return self
        if not self.kineto and self.verbose:
            _say("this PyTorch is built without Kineto: recording CPU operators only "
                 "and writing the trace in the Kineto layout itself", err=True)
        self.profiler = torch.profiler.profile(**self._kwargs)
        self.profiler.__enter__()
        self._running = True
        atexit.register(self._at_exit)
        return self

    def step(self) -> None:
        """Marks the end of one training iteration."""
        if self._finished:
            return
        if not self._running:
            self.start()
        self.steps_taken += 1
        self.profiler.step()
        if self.done or self.steps_taken >= self.steps_needed:
            self.stop()

    def stop(self) -> List[str]:
        """Stops profiling (a partly recorded window is still written). Returns the files."""
        if self._running:
            self._running = False
            self._finished = True
            try:
                atexit.unregister(self._at_exit)
            except Exception:
                pass
            before = len(self.files)
            self.profiler.__exit__(None, None, None)
            if self.steps_taken < self.steps_needed and self.verbose:
                _say(f"stopped after {self.steps_taken} steps; the schedule needs "
                     f"{self.steps_needed} (skip_first {self.skip_first} + (wait {self.wait} + warmup "
                     f"{self.warmup} + active {self.active}) x {self.repeat}): "
                     + ("wrote a partly recorded window" if len(self.files) > before
                        else "the last window was not recorded"), err=True)
        self._finished = True
        return self.files

    def _at_exit(self) -> None:
        try:
            self.stop()
        except Exception as exc:  # interpreter shutdown: report, never raise
            _say(f"could not finish the capture at exit: {exc}", err=True)

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop()
        return False

    # -- writing -------------------------------------------------------------------------------
    def _trace_path(self) -> str:
        directory = self.out_dir if self.repeat == 1 else os.path.join(self.out_dir, f"cycle{self._cycle}")
        return os.path.join(directory, f"rank{get_rank()}.json.gz")

    def _on_trace_ready(self, prof: Any) -> None:
        path = self._trace_path()
        self._cycle += 1
        tmp_json = os.path.join(os.path.dirname(path), f".{os.path.basename(path)[:-3]}.tmp{os.getpid()}")
        tmp_gz = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
        how = "Kineto"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
            if not self.kineto and results is not None and hasattr(results, "events"):
                meta = dict(self._meta, trace_name=os.path.basename(path))
                with gzip.open(tmp_gz, "wt", encoding="utf-8", compresslevel=6) as out:
                    _write_kineto_layout(results, out, meta)
                how = "CPU only, no Kineto in this PyTorch"
            else:
                # Export plain JSON and gzip it here: every version supports a .json path, and the
                # bytes PyTorch wrote (distributedInfo included) are kept unchanged.
                prof.export_chrome_trace(tmp_json)
                if not self.kineto:
                    how = "legacy format: PyTorch without Kineto"
                elif _dist() is not None and not _head_has(tmp_json, b'"distributedInfo"'):
                    _say("warning: torch.distributed is initialised but the trace has no "
                         "distributedInfo; lumos will take the rank from the file name", err=True)
                _gzip_file(tmp_json, tmp_gz)
            os.replace(tmp_gz, path)
            self.files.append(path)
            if self.verbose:
                size = os.path.getsize(path)
                _say(f"wrote {path} (rank {get_rank()}, {size / 1024:.1f} KiB, {how})")
        except Exception as exc:
            self.errors.append(f"{path}: {exc}")
            _say(f"failed to write {path}: {exc}", err=True)
        finally:
            for tmp in (tmp_json, tmp_gz):
                try:
                    os.remove(tmp)
                except OSError:
                    pass


def capture(out_dir: str = "lumos_traces", steps: int = 3, **options: Any) -> Capture:
    """Context manager: ``with capture("traces/", steps=3) as cap: ... cap.step()``.

    Options (keywords): wait=1, warmup=1, repeat=1, skip_first=0, cuda=None (auto),
    record_shapes=True, with_stack=False, profile_memory=False, with_flops=False,
    with_modules=False, cuda_sync_events=True, verbose=True.
    """
    return Capture(out_dir, steps, **options)


def profile_steps(out_dir: Any = "lumos_traces", steps: int = 3, **options: Any) -> Callable:
    """Decorator: profiles the calls of a step function (one call = one iteration).

    ``@profile_steps("traces/", steps=3)`` or bare ``@profile_steps``.  Profiling starts at the
    first call and stops (writing the trace) after ``steps_needed`` calls; later calls run the
    function alone.  The wrapper has ``.capture`` (the Capture), ``.files`` and ``.finish()``
    (stop early, e.g. when the loop is shorter than the schedule; also done at exit).
    """
    if callable(out_dir):  # bare @profile_steps
        return profile_steps()(out_dir)

    def decorate(fn: Callable) -> Callable:
        cap = Capture(out_dir, steps, **options)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if cap.done:
                return fn(*args, **kwargs)
            cap.start()
            result = fn(*args, **kwargs)
            cap.step()
            return result

        wrapper.capture = cap  # type: ignore[attr-defined]
        wrapper.files = cap.files  # type: ignore[attr-defined]
        wrapper.finish = cap.stop  # type: ignore[attr-defined]
        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------
# Self-test / demo

def _self_test(out_dir: str, steps: int) -> int:
    feats = features()
    print("lumos-capture: features " + json.dumps(feats, sort_keys=True))
    if torch is None:
        print(f"lumos-capture: skipped, import torch failed: {_TORCH_IMPORT_ERROR}")
        return 77
    device = "cuda" if feats["cuda_device"] else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(out_dir, steps=steps) as cap:
        for _ in range(cap.steps_needed + 2):
            x = torch.randn(32, 64, device=device)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            cap.step()
    problems = list(cap.errors)
    if len(cap.files) != 1:
        problems.append(f"expected 1 file, got {cap.files}")
    for path in cap.files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            problems.append(f"{path}: not a JSON object with traceEvents")
            continue
        names = [e.get("name", "") for e in doc["traceEvents"] if isinstance(e, dict)]
        n_steps = sum(1 for n in names if n.startswith("ProfilerStep#"))
        cats = {e.get("cat") for e in doc["traceEvents"] if isinstance(e, dict)}
        print(f"lumos-capture: {path}: {len(names)} events, {n_steps} ProfilerStep ranges, "
              f"categories {sorted(c for c in cats if c)}")
        if n_steps == 0:
            problems.append(f"{path}: no ProfilerStep#N")
        if "cpu_op" not in cats:
            problems.append(f"{path}: no cpu_op events")
    for p in problems:
        print("lumos-capture: FAIL " + p)
    print("lumos-capture: self-test " + ("failed" if problems else "passed"))
    return 1 if problems else 0


def main(argv: Optional[List[str]] = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="lumos-capture self-test: profiles a tiny MLP and "
                                     "checks the written trace. As a library: see the module docstring.")
    parser.add_argument("--self-test", action="store_true", help="run the demo and check its output")
    parser.add_argument("--features", action="store_true", help="print what this PyTorch supports")
    parser.add_argument("--out", default=None, help="trace directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=3, help="active steps (default 3)")
    args = parser.parse_args(argv)
    if args.features and not args.self_test:
        print(json.dumps(features(), indent=2, sort_keys=True))
        return 0 if torch is not None else 77
    if args.out:
        return _self_test(args.out, args.steps)
    import tempfile
    with tempfile.TemporaryDirectory(prefix="lumos_capture_") as tmp:
        return _self_test(tmp, args.steps)


if __name__ == "__main__":
    sys.exit(main())

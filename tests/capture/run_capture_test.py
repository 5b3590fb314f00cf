#!/usr/bin/env python3
"""CTest driver for lumos-capture: runs examples/capture/tiny_train.py under the capture (on CPU,
or on CUDA with --device cuda) into a temporary directory, then checks the traces, `lumos inspect
--json` on them (one ProfilerStep per recorded step; `cuda_sync` rows for the synchronising calls
when the PyTorch and the run have them) and that `lumos replay --json` replays every rank.

Exit codes: 0 pass, 1 fail, 77 skipped (no Python interpreter here can import torch).

The driver itself needs no torch. The training runs with --python when given (CMake cache
variable LUMOS_CAPTURE_PYTHON), else with the first of this interpreter, `python3` on PATH and
/usr/bin/python3 that can import torch (a pyenv or venv python often lacks the distribution's
torch).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
CAPTURE_DIR = os.path.join(SOURCE_DIR, "examples", "capture")
TINY_TRAIN = os.path.join(CAPTURE_DIR, "tiny_train.py")
SKIP = 77
# CUDA runtime calls that CUPTI reports as synchronisation records (Kineto's `cuda_sync` rows).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")


def capture_features(python: str) -> dict:
    """lumos_capture.features() as the training interpreter sees it ({} when it cannot say)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import lumos_capture; "
            "print(json.dumps(lumos_capture.features()))")
    try:
        r = subprocess.run([python, "-c", code, CAPTURE_DIR], capture_output=True, text=True, timeout=300)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}


def find_python(explicit: str | None) -> tuple[str | None, str]:
    """First interpreter that imports torch, and a line saying what was tried."""
    candidates = [explicit] if explicit else [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    tried, seen = [], set()
    for c in candidates:
        if not c:
            continue
        real = os.path.realpath(c)
        if real in seen or not os.path.exists(c):
            continue
        seen.add(real)
        try:
            r = subprocess.run([c, "-c", "import torch, sys; print(torch.__version__)"], capture_output=True,
                               text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{c}: {exc}")
            continue
        if r.returncode == 0:
            return c, f"{c} (torch {r.stdout.strip()})"
        last = (r.stderr.strip().splitlines() or ["import torch failed"])[-1]
        tried.append(f"{c}: {last}")
    return None, "; ".join(tried) or "no Python interpreter found"


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        print(("  ok    " if ok else "  FAIL  ") + what)
        if not ok:
            self.failures.append(what)
        return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lumos", required=True, help="path of the lumos CLI")
    p.add_argument("--python", default="", help="interpreter with torch for the training run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the training runs; cuda is skipped (77) without a CUDA device")
    p.add_argument("--form", choices=["context", "decorator"], default="context")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--model", choices=["transformer", "mlp"], default="transformer")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--keep", default="", help="write the traces here and keep them (default: temp dir)")
    args = p.parse_args()

    python, how = find_python(args.python or None)
    if python is None:
        print(f"SKIPPED: import torch fails in every interpreter tried: {how}")
        return SKIP
    print(f"python: {how}")
    features = capture_features(python)
    print(f"features: {features or 'unknown (lumos_capture.features() failed)'}")
    if args.device == "cuda" and not features.get("cuda_device"):
        print("SKIPPED: --device cuda, but torch sees no CUDA device")
        return SKIP
    # cuda_sync rows exist only for CUDA activity recorded by a PyTorch with enable_cuda_sync_events.
    expect_sync_rows = args.device == "cuda" and bool(features.get("cuda_sync_events")) \
        and bool(features.get("cuda_activity"))

    work = args.keep or tempfile.mkdtemp(prefix="lumos_capture_test_")
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
    out = os.path.join(work, "traces")
    c = Checks()
    try:
        cmd = [python, TINY_TRAIN, "--out", out, "--device", args.device, "--form", args.form, "--model", args.model,
               "--steps", str(args.steps), "--world-size", str(args.world_size), "--threads", "1"]
        env = dict(os.environ)
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(var, None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the source tree
        print("run: " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env)
        sys.stdout.write(r.stdout)
        sys.stdout.write(r.stderr)
        if not c.check(r.returncode == 0, f"tiny_train.py exit code 0 (got {r.returncode})"):
            return 1

        world = args.world_size
        expected = sorted(f"rank{i}.json.gz" for i in range(world))
        present = sorted(os.listdir(out)) if os.path.isdir(out) else []
        c.check(present == expected, f"trace directory holds exactly {expected} (got {present})")
        wrote = [line for line in r.stdout.splitlines() if line.startswith("lumos-capture: wrote ")]
        c.check(len(wrote) == world, f"one 'lumos-capture: wrote' line per trace ({len(wrote)})")

        sync_calls: dict[str, int] = {}
        for name in present:
            path = os.path.join(out, name)
            with open(path, "rb") as f:
                c.check(f.read(2) == b"\x1f\x8b", f"{name} is gzip")
            with gzip.open(path, "rt", encoding="utf-8") as f:
                doc = json.load(f)
            if not c.check(isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list),
                           f"{name} is a JSON object with traceEvents"):
                continue
            events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
            cats = {e.get("cat") for e in events}
            sync_calls[name] = sum(1 for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in SYNC_CALLS)
            c.check("python_function" not in cats, f"{name}: no python_function events (with_stack off)")
            c.check(any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op"),
                    f"{name}: cpu_op events carry Input Dims (record_shapes on)")
            writer = doc.get("lumosCapture", {}).get("writer") if isinstance(doc.get("lumosCapture"), dict) else None
            print(f"  info  {name}: written by {writer or 'PyTorch (Kineto)'}; schemaVersion "
                  f"{doc.get('schemaVersion')}; {len(events)} events")
            if world > 1:
                info = doc.get("distributedInfo")
                c.check(isinstance(info, dict) and info.get("world_size") == world
                        and f"rank{info.get('rank')}.json.gz" == name,
                        f"{name}: distributedInfo kept with rank and world_size {world} (got {info})")

        r = subprocess.run([args.lumos, "inspect", "--json", out], capture_output=True, text=True, timeout=120)
        if not c.check(r.returncode == 0, f"lumos inspect --json exit code 0 (got {r.returncode}: {r.stderr.strip()})"):
            return 1
        summary = json.loads(r.stdout)
        ranks = summary.get("ranks", [])
        c.check(len(ranks) == world, f"lumos sees {world} rank(s) (got {len(ranks)})")
        for rk in ranks:
            tag = f"rank {rk.get('rank')}"
            by_cat = rk.get("by_category", {})
            c.check(rk.get("events", 0) > 0, f"{tag}: events > 0 ({rk.get('events')})")
            c.check(rk.get("by_category", {}).get("cpu_op", 0) > 0,
                    f"{tag}: cpu_op count > 0 ({rk.get('by_category', {}).get('cpu_op', 0)})")
            steps = [s for s in rk.get("steps", []) if s.get("name", "").startswith("ProfilerStep#")]
            c.check(any(s.get("dur_ns", 0) > 0 for s in steps),
                    f"{tag}: a ProfilerStep#N with dur_ns > 0 ({len(steps)} steps: "
                    f"{', '.join(s['name'] for s in steps)})")
            c.check(len(steps) == args.steps,
                    f"{tag}: one ProfilerStep#N per recorded step ({len(steps)} ranges, {args.steps} active steps requested)")
            calls = sync_calls.get(os.path.basename(rk.get("file", "")), 0)
            if expect_sync_rows and calls > 0:
                c.check(by_cat.get("cuda_sync", 0) > 0,
                        f"{tag}: cuda_sync rows for its {calls} synchronising CUDA call(s) (got {by_cat.get('cuda_sync', 0)})")
            elif expect_sync_rows:
                print(f"  note  {tag}: no synchronising CUDA call recorded, so no cuda_sync row to check "
                      f"({by_cat.get('cuda_sync', 0)} present)")
            else:
                print(f"  note  {tag}: cuda_sync rows not checked (device {args.device}, "
                      f"enable_cuda_sync_events {'available' if features.get('cuda_sync_events') else 'unavailable'})")
            c.check(rk.get("unknown_phase_entries", 0) == 0, f"{tag}: no unknown phase entries")
            if world > 1:
                c.check(rk.get("world_size") == world and rk.get("rank_from") == "distributedInfo",
                        f"{tag}: world_size {world} from distributedInfo (got {rk.get('world_size')}, "
                        f"{rk.get('rank_from')})")

        # The captured job replays: every rank, a ProfilerStep window, a positive measured and
        # simulated iteration.
        r = subprocess.run([args.lumos, "replay", "--json", out], capture_output=True, text=True, timeout=300)
        if c.check(r.returncode == 0, f"lumos replay --json exit code 0 (got {r.returncode}: {r.stderr.strip()})"):
            replay = json.loads(r.stdout)
            replayed = replay.get("ranks", [])
            c.check(len(replayed) == world, f"lumos replay reports {world} rank(s) (got {len(replayed)})")
            for rk in replayed:
                tag = f"replay rank {rk.get('rank')}"
                c.check(str(rk.get("step", "")).startswith("ProfilerStep#"),
                        f"{tag}: replays a ProfilerStep window (got {rk.get('step')!r})")
                c.check(rk.get("measured_ns", 0) > 0 and rk.get("simulated_ns", 0) > 0,
                        f"{tag}: measured and simulated iteration > 0 ({rk.get('measured_ns')} ns, "
                        f"{rk.get('simulated_ns')} ns)")
            c.check(replay.get("graph", {}).get("tasks", 0) > 0, "lumos replay built a graph with tasks")
    except subprocess.TimeoutExpired as exc:
        c.check(False, f"timed out: {exc}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print("PASSED" if not c.failures else f"FAILED ({len(c.failures)} checks)")
    return 0 if not c.failures else 1


if __name__ == "__main__":
    sys.exit(main())

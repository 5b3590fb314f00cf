#!/usr/bin/env python3
"""Records the real what-if pairs of tests/data/gpu/ on the GPU machine (one GPU, PyTorch).

    python3 scripts/gpu/record_pairs.py --set h100 --out DIR     # then --set h200 on an H200
    python3 scripts/gpu/record_pairs.py --set h100-repeat --out DIR   # a few again: run-to-run spread
    python3 scripts/gpu/record_pairs.py --set h200-accum --out DIR    # micro-batches per step

Runs examples/capture/gpt_train.py once per configuration of the set, each in its own process
(a failed or hung configuration costs only itself), and writes DIR/NAME/rank0.json.gz plus
DIR/manifest-SET.json: per trace the GPU, PyTorch/CUDA versions, model shape, batch, what
differs from its base, and the step times measured without the profiler.  The configurations
are one-factor changes of a base, so that each pair is one what-if (docs/validation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "capture", "gpt_train.py")

BASE = {"layers": 8, "hidden": 2048, "seq": 1024, "micro_batch": 4}
CPU_BASE = {"layers": 8, "hidden": 512, "seq": 256, "micro_batch": 1}


def cfg(name, base_name, differs, shape, **flags):
    return {"name": name, "base": base_name, "differs": differs, "shape": shape, "flags": flags}


REPEATED = ("base", "h1024", "mb1", "l16", "small-l8")


def grid(gpu: str):
    if gpu.endswith("-accum"):
        # Gradient accumulation: the micro-batches per step change (as a data-parallel or global-batch
        # change does on every rank), with a base of its own recorded in the same session.
        p = gpu[: -len("-accum")] + "-"
        b = p + "acc1"
        out = [cfg(b, None, "base of the accumulation set (as base, recorded with it)", dict(BASE, accum=1))]
        for n in (2, 4):
            out.append(cfg(f"{p}acc{n}", b, f"micro-batches per step 1 -> {n}", dict(BASE, accum=n)))
        out.append(cfg(p + "mb2-acc2", b, "micro-batch 4 -> 2, micro-batches per step 1 -> 2",
                       dict(BASE, micro_batch=2, accum=2)))
        out.append(cfg(p + "l16-acc2", b, "layers 8 -> 16, micro-batches per step 1 -> 2",
                       dict(BASE, layers=16, accum=2)))
        out.append(cfg(p + "small-acc1", None, "CPU-bound base of the accumulation set", dict(CPU_BASE, accum=1)))
        out.append(cfg(p + "small-acc2", p + "small-acc1", "micro-batches per step 1 -> 2 (CPU-bound)",
                       dict(CPU_BASE, accum=2)))
        return out
    if gpu.endswith("-repeat"):
        # The same configurations again in fresh processes: the run-to-run spread of the truth.
        g = gpu[: -len("-repeat")]
        out = []
        for c in grid(g):
            if c["name"][len(g) + 1:] in REPEATED:
                out.append(dict(c, name=c["name"] + "-r2", base=c["name"], differs="a repeat of " + c["name"]))
        return out
    p = gpu + "-"
    b = p + "base"
    out = [cfg(b, None, "base: GPT, bf16 autocast, SDPA, AdamW", BASE)]
    for k, vals in (("layers", (4, 16)), ("hidden", (1024, 4096)), ("seq", (2048,)), ("micro_batch", (1, 8))):
        for v in vals:
            short = {"layers": "l", "hidden": "h", "seq": "s", "micro_batch": "mb"}[k]
            out.append(cfg(f"{p}{short}{v}", b, f"{k} {BASE[k]} -> {v}", dict(BASE, **{k: v})))
    if gpu == "h200":
        return out
    out += [
        cfg(p + "graphs", b, "CUDA graphs (whole step captured and replayed)", BASE, cuda_graphs=True),
        cfg(p + "dupfc1", b, "forward fc1 GEMM of every layer run twice (mlp_fc1 scope)", BASE, dup_fc1=True),
        cfg(p + "cpuwait200", b, "CPU busy-wait 200 us per layer forward (cpu_wait scope)", BASE, cpu_wait_us=200),
        cfg(p + "cpuwait400", p + "cpuwait200", "CPU busy-wait 200 -> 400 us per layer forward", BASE, cpu_wait_us=400),
        cfg(p + "small-l8", None, "CPU-bound: hidden 512, seq 256, micro-batch 1", CPU_BASE),
        cfg(p + "small-l16", p + "small-l8", "layers 8 -> 16 (CPU-bound)", dict(CPU_BASE, layers=16)),
    ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=["h100", "h200", "h100-repeat", "h200-repeat", "h100-accum", "h200-accum"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated names (default: the whole set)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per configuration")
    ap.add_argument("--deadline", type=int, default=0, help="start no configuration after this many seconds")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    entries = []
    only = {s for s in a.only.split(",") if s}
    start = time.time()
    for c in grid(a.set):
        if only and c["name"] not in only:
            continue
        if a.deadline and time.time() - start > a.deadline:
            print(f"record: {c['name']} skipped: past the {a.deadline} s deadline", flush=True)
            continue
        cmd = [sys.executable, TRAIN, "--out", os.path.join(a.out, c["name"])]
        for k, v in c["shape"].items():
            cmd += ["--" + k.replace("_", "-"), str(v)]
        for k, v in c["flags"].items():
            cmd += ["--" + k.replace("_", "-")] if v is True else ["--" + k.replace("_", "-"), str(v)]
        t0 = time.time()
        print(f"record: {c['name']}: {' '.join(cmd[2:])}", flush=True)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"result"')]
            if r.returncode != 0 or not lines:
                print(f"record: {c['name']} FAILED (exit {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}", flush=True)
                continue
            res = json.loads(lines[-1])["result"]
        except subprocess.TimeoutExpired:
            print(f"record: {c['name']} timed out after {a.timeout} s", flush=True)
            continue
        res["files"] = [os.path.relpath(f, a.out) for f in res["files"]]
        entry = {"name": c["name"], "base": c["base"], "differs": c["differs"], **res}
        entries.append(entry)
        print(f"record: {c['name']} done in {time.time() - t0:.0f} s: {res['unprofiled_step_ms_median']} ms/step "
              f"unprofiled, {res['parameters'] / 1e6:.0f} M parameters", flush=True)
    with open(os.path.join(a.out, f"manifest-{a.set}.json"), "w") as f:
        json.dump(entries, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fits the profiler's host time per recorded event (include/lumos/model/profiler_cost.hpp).

The profiler's callbacks run on the host the trace was recorded on, so their cost per event is
taken as a multiple F of that host's speed as the trace shows it: the median time of an operator
that only makes a view of a tensor (`metadata_op_ns` in `lumos replay --json`). For every run of
one GPU in tests/data/gpu/manifest.json (`--fit h100`: the runs named h100-*),
`lumos replay RUN --step 1,2,3 --json --profiler-cost Fx` estimates the step without the profiler
(`job.unprofiled_ns`, the mean over the 3 recorded steps), against the run's
`unprofiled_step_ms_median`. The fit is the F with the least mean |error|, on a grid of 0.5 from
0.5 to 5, then of 0.1, 0.02 and 0.01 around the best; ties go to the smaller F. One cost is shared
by operator ranges and runtime calls: in these runs the two cannot be told apart. The fixed cost
for ranks without the measure is F times the median of the fitted runs' `metadata_op_ns`.

    python3 scripts/fit_profiler_cost.py --fit h100 [--lumos build/release/examples/lumos]
    python3 scripts/fit_profiler_cost.py --check      # the ctest: the shipped constants equal the fit

Deterministic: the same binary and traces give the same cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "gpu")
HEADER = os.path.join(ROOT, "include", "lumos", "model", "profiler_cost.hpp")
STEPS = (1, 2, 3)
SHIPPED_FIT = "h100"  # the GPU whose runs the shipped constants are fitted on


def manifest():
    return {e["name"]: e for e in json.load(open(os.path.join(DATA, "manifest.json")))["traces"]}


def replay(lumos, name, cost=None, flags=()):
    """(mean over the recorded steps of `lumos replay NAME FLAGS --json`'s job.unprofiled_ns in ms,
    job.metadata_op_ns). `cost` is given as --profiler-cost."""
    cmd = [lumos, "replay", os.path.join(DATA, name), *flags, "--step", ",".join(map(str, STEPS)), "--json"]
    if cost is not None:
        cmd += ["--profiler-cost", cost]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    docs = json.loads(r.stdout)
    return statistics.mean(d["job"]["unprofiled_ns"] / 1e6 for d in docs), docs[0]["job"]["metadata_op_ns"]


def unprofiled_ms(lumos, name, cost_us=None, flags=()):
    """The step without the profiler of `replay`, in ms, at fixed costs of `cost_us` us per event."""
    return replay(lumos, name, None if cost_us is None else f"{cost_us:.1f}", flags)[0]


def runs_of(m, gpu):
    return sorted(n for n in m if n.startswith(gpu + "-"))


def mean_error(lumos, m, names, multiple, pool, units):
    """Mean |error| over `names` at `multiple`; each run's metadata_op_ns goes into `units`."""
    got = list(pool.map(lambda n: replay(lumos, n, f"{multiple:.2f}x"), names))
    units.update((n, u) for n, (_, u) in zip(names, got))
    errs = [abs(100.0 * (p - m[n]["unprofiled_step_ms_median"]) / m[n]["unprofiled_step_ms_median"]) for n, (p, _) in zip(names, got)]
    return statistics.mean(errs)


def fit(lumos, gpu):
    """(the multiple F, a multiple of 0.01; the fixed cost per event in ns) fitted on the runs of `gpu`."""
    m = manifest()
    names = runs_of(m, gpu)
    seen, units = {}, {}
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        def score(hundredths):
            if hundredths not in seen:
                seen[hundredths] = mean_error(lumos, m, names, hundredths / 100.0, pool, units)
            return seen[hundredths]

        best = 50
        for step, reach in ((50, 450), (10, 40), (2, 8), (1, 1)):
            lo = max(step, best - reach)
            best = min(range(lo, best + reach + 1, step) if step < 50 else range(50, 501, 50), key=lambda h: (score(h), h))
    measured = sorted(u for u in units.values() if u > 0)
    unit = measured[(len(measured) - 1) // 2]
    return best / 100.0, int(best * unit / 100.0 + 0.5)


def shipped():
    """(per_op, per_runtime, per_python in ns, per_metadata_op) of `fitted_profiler_cost` in the header."""
    text = open(HEADER).read()
    got = re.search(r"fitted_profiler_cost\{\.per_op = (\d+), \.per_runtime = (\d+), \.per_python = (\d+), "
                    r"\.per_metadata_op = ([0-9.]+)\}", text)
    if not got:
        raise RuntimeError(f"{HEADER}: fitted_profiler_cost not found")
    return tuple(int(x) for x in got.groups()[:3]) + (float(got.group(4)),)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lumos", default=os.path.join(ROOT, "build", "release", "examples", "lumos"))
    ap.add_argument("--fit", choices=("h100", "h200"), default=SHIPPED_FIT, help="the GPU whose runs are fitted on")
    ap.add_argument("--check", action="store_true", help=f"the ctest: fit on {SHIPPED_FIT} and compare with the header")
    a = ap.parse_args()
    gpu = SHIPPED_FIT if a.check else a.fit
    multiple, ns = fit(a.lumos, gpu)
    print(f"fitted on the {gpu} runs: {multiple:.2f} x the metadata operator time per recorded event, "
          f"{ns / 1000:.1f} us fixed (fitted_profiler_cost{{.per_op = {ns}, .per_runtime = {ns}, .per_python = {ns}, "
          f".per_metadata_op = {multiple:.2f}}})")
    if a.check:
        have = shipped()
        if have != (ns, ns, ns, multiple):
            print(f"FAIL: include/lumos/model/profiler_cost.hpp ships {have}, the fit gives {(ns, ns, ns, multiple)}")
            return 1
        print("profiler_cost_fit: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

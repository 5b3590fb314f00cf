#!/usr/bin/env python3
"""Fits the profiler's host time per recorded event (include/lumos/model/profiler_cost.hpp).

For every run of one GPU in tests/data/gpu/manifest.json (`--fit h100`: the runs named h100-*),
`lumos replay RUN --step 1,2,3 --json --profiler-cost C` estimates the step without the profiler
(`job.unprofiled_ns`, the mean over the 3 recorded steps), against the run's
`unprofiled_step_ms_median`. The fit is the C (us per event, one cost shared by operator ranges
and runtime calls: in these runs the two cannot be told apart) with the least mean |error|, on a
grid of 0.5 us from 0 to 10 us, then of 0.1 us around the best; ties go to the smaller C.

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


def unprofiled_ms(lumos, name, cost_us=None, flags=()):
    """Mean over the recorded steps of `lumos replay NAME FLAGS --json`'s job.unprofiled_ns, in ms."""
    cmd = [lumos, "replay", os.path.join(DATA, name), *flags, "--step", ",".join(map(str, STEPS)), "--json"]
    if cost_us is not None:
        cmd += ["--profiler-cost", f"{cost_us:.1f}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    return statistics.mean(d["job"]["unprofiled_ns"] / 1e6 for d in json.loads(r.stdout))


def runs_of(m, gpu):
    return sorted(n for n in m if n.startswith(gpu + "-"))


def mean_error(lumos, m, names, cost_us, pool):
    preds = list(pool.map(lambda n: unprofiled_ms(lumos, n, cost_us), names))
    errs = [abs(100.0 * (p - m[n]["unprofiled_step_ms_median"]) / m[n]["unprofiled_step_ms_median"]) for n, p in zip(names, preds)]
    return statistics.mean(errs)


def fit(lumos, gpu):
    """The cost per event in us (a multiple of 0.1) fitted on the runs of `gpu`."""
    m = manifest()
    names = runs_of(m, gpu)
    seen = {}
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        def score(tenths):
            if tenths not in seen:
                seen[tenths] = mean_error(lumos, m, names, tenths / 10.0, pool)
            return seen[tenths]

        best = min(range(0, 101, 5), key=lambda t: (score(t), t))
        best = min(range(max(0, best - 4), best + 5), key=lambda t: (score(t), t))
    return best / 10.0


def shipped():
    """(per_op, per_runtime, per_python) of `fitted_profiler_cost` in the header, in ns."""
    text = open(HEADER).read()
    got = re.search(r"fitted_profiler_cost\{\.per_op = (\d+), \.per_runtime = (\d+), \.per_python = (\d+)\}", text)
    if not got:
        raise RuntimeError(f"{HEADER}: fitted_profiler_cost not found")
    return tuple(int(x) for x in got.groups())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lumos", default=os.path.join(ROOT, "build", "release", "examples", "lumos"))
    ap.add_argument("--fit", choices=("h100", "h200"), default=SHIPPED_FIT, help="the GPU whose runs are fitted on")
    ap.add_argument("--check", action="store_true", help=f"the ctest: fit on {SHIPPED_FIT} and compare with the header")
    a = ap.parse_args()
    gpu = SHIPPED_FIT if a.check else a.fit
    cost = fit(a.lumos, gpu)
    ns = int(round(cost * 1000))
    print(f"fitted on the {gpu} runs: {cost:.1f} us per recorded event "
          f"(fitted_profiler_cost{{.per_op = {ns}, .per_runtime = {ns}, .per_python = {ns}}})")
    if a.check:
        have = shipped()
        if have != (ns, ns, ns):
            print(f"FAIL: include/lumos/model/profiler_cost.hpp ships {have}, the fit gives {(ns, ns, ns)}")
            return 1
        print("profiler_cost_fit: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

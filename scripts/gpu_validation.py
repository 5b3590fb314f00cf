#!/usr/bin/env python3
"""Generates the real-run section of docs/validation.md: lumos's predictions against training runs
recorded on GPUs.

The truth is tests/data/gpu/ (scripts/gpu/record_pairs.py on the lent H100 and H200 machines:
one GPT-style model in plain PyTorch, one-factor changes of a base configuration, 3 recorded
steps each; manifest.json). Nothing here was produced by lumos. For every pair A -> B the
prediction from A's trace is compared with B's measured step:

* replay identity: each trace replayed unchanged (exact by construction; a check, not evidence);
* held-out steps: `lumos replay --durations-from-step M` predicts step N of the same trace;
* `--scale`: a scoped op of A made k times longer (`op:NAME=k`) against the run that did it;
* `lumos whatif A <flags of B> --json`: every ordered pair of runs of one model recorded in the same
  set (`--set` of `recorded_with`: base to child, child to base and sibling to sibling), with the
  global batch of B, and every H100 <-> H200 pair of the same configuration;
* `lumos predict --profile` (calibrated on one trace of the set) for every eager configuration.

Errors are (predicted - measured) / measured of the mean over the 3 recorded steps (a what-if is
run from each step of A). They are raw: the gates (`--check`) and the headline figures use them.
The CPU of these machines ran the same PyTorch ops up to 1.5x slower in one run than in another
(same op, same shapes; shown per pair as "CPU speed B/A", the median ratio of the durations of the
CPU ops both traces have); the last column repeats the prediction at B's CPU speed (`--scale
cpu=F`), a diagnostic that uses B's own trace and is never a gate or a headline.

    python3 scripts/gpu_validation.py [--lumos build/release/examples/lumos] [--doc docs/validation.md] [--print]
    python3 scripts/gpu_validation.py --check        # ctest real_gpu_runs
    python3 scripts/gpu_validation.py --host-per-op  # host time per launched GPU op of the host-bound runs
    python3 scripts/gpu_validation.py --host-factor  # the presets' framework factor those runs give

The generated text replaces what lies between `<!-- BEGIN generated:gpu_validation -->` and
`<!-- END generated:gpu_validation -->` in the document. Deterministic: the same binary and traces
give the same text.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import difflib
import gzip
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "gpu")
MISS = 5.0  # percent: rows beyond it are listed with their reason in the note
STEPS = (1, 2, 3)
BEGIN, END = "<!-- BEGIN generated:gpu_validation -->", "<!-- END generated:gpu_validation -->"
# The targets (issue 56) for the raw what-if errors over every table of pairs.
TARGET_MEAN, TARGET_WORST = 7.0, 20.0
MEMORY_TARGET = 8.0  # percent, mean |error| of the memory per GPU (issue 56)
# Regression gates of `--check` on raw |error| in percent, (mean, worst) per table: the values
# measured when the gate was set plus a small margin (0.5 points on the mean, 1 on the worst). They
# stop the figures from getting worse; they are not targets (the targets above are stated beside
# them in the document, met or not).
HOST_TABLE = "whatif: H100 <-> H200, target host from a calibrated profile"
GATES = {
    "held-out steps": (4.0, 20.0),
    "--scale": (3.5, 4.5),
    "whatif: one factor": (8.7, 36.1),
    "whatif: several factors": (9.3, 30.9),
    "whatif: H100 <-> H200": (13.0, 38.7),
    "whatif: every pair": (9.7, 38.7),
    HOST_TABLE: (10.4, 25.6),
    "predict --profile: held out": (11.1, 35.6),
    "predict --profile: fitted (the calibrated trace)": (3.4, 4.2),
    "memory: traced jobs": (2.0, 7.4),
    "memory: what-ifs": (1.4, 7.4),
}
# The host-bound model of the runs (hidden 512, sequence 256, micro-batch 1): whatever else differs
# between two runs, a what-if between it and the hidden-2048 GPT changes five factors of the model
# at once, so pairs across the two models are not one job's what-ifs and are left out.
HOST_BOUND_HIDDEN = 512
POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-600:]}")
    return r.stdout


def trace(name):
    return os.path.join(DATA, name)


def step_json(lumos, args):
    """`lumos ARGS --step S --json` of each recorded step (one reading of the traces for all)."""
    return json.loads(run([lumos, *args, "--step", ",".join(map(str, STEPS)), "--json"]))


_replays = {}


def replays(lumos, name):
    """`lumos replay --step S --json` of each recorded step of a trace, unchanged (read once)."""
    if name not in _replays:
        _replays[name] = step_json(lumos, ["replay", trace(name)])
    return _replays[name]


def measured_steps_ms(lumos, name):
    """Measured step of a trace (lumos's window of each ProfilerStep), in ms, per recorded step."""
    return [d["ranks"][0]["measured_ns"] / 1e6 for d in replays(lumos, name)]


_cpu_cache = {}


def cpu_ops(name):
    if name not in _cpu_cache:
        with gzip.open(os.path.join(trace(name), "rank0.json.gz"), "rt") as f:
            events = json.load(f)["traceEvents"]
        by = collections.defaultdict(list)
        for e in events:
            if e.get("cat") == "cpu_op" and e.get("ph") == "X":
                by[e["name"]].append(float(e["dur"]))
        _cpu_cache[name] = {k: statistics.median(v) for k, v in by.items() if len(v) >= 10}
    return _cpu_cache[name]


def cpu_speed(a, b):
    """Median over the CPU ops both traces have (10+ calls each) of B's median time / A's."""
    ta, tb = cpu_ops(a), cpu_ops(b)
    ratios = [tb[k] / ta[k] for k in sorted(set(ta) & set(tb)) if ta[k] > 0]
    return statistics.median(ratios) if ratios else 1.0


_memory = {}


def whatif_ms(lumos, a, flags, extra=()):
    ds = step_json(lumos, ["whatif", trace(a), *flags, *extra])
    # Memory per GPU is the same from every step (the shape's); kept per (A, flags) for the memory table.
    _memory[(a, tuple(flags))] = (ds[0]["baseline"].get("memory_bytes_per_gpu"), ds[0]["predicted"].get("memory_bytes_per_gpu"))
    return statistics.mean(d["predicted"]["iteration_ns"] / 1e6 for d in ds)


def replay_ms(lumos, a, flags):
    return statistics.mean(d["ranks"][0]["simulated_ns"] / 1e6 for d in step_json(lumos, ["replay", trace(a), *flags]))


def pct(p, m):
    return 100.0 * (p - m) / m


def recording_set(entry):
    """The `--set` a run was recorded with: the runs of one set share a session and a host."""
    found = re.search(r"--set (\S+)", entry["recorded_with"])
    return found.group(1) if found else entry["recorded_with"]


FACTORS = (("layers", "layers"), ("hidden", "hidden"), ("seq", "seq"), ("micro_batch", "micro-batch"),
           ("accum", "micro-batches per step"))


def shape_of(entry):
    s = dict(entry["shape"])
    s.setdefault("accum", 1)
    return s


def changes(sa, sb):
    """The factors that differ between two shapes (hidden carries heads and FFN with it)."""
    return [(label, sa[k], sb[k]) for k, label in FACTORS if sa[k] != sb[k]]


def whatif_flags(sa, sb):
    """`lumos whatif` flags that turn shape A into shape B, with B's global batch."""
    out = []
    for k in ("layers", "hidden", "heads", "ffn", "seq", "micro_batch"):
        if sa[k] != sb[k]:
            out += ["--" + k.replace("_", "-"), str(sb[k])]
    if (sa["micro_batch"], sa["accum"]) != (sb["micro_batch"], sb["accum"]):
        out += ["--global-batch", str(sb["micro_batch"] * sb["accum"])]
    return out


def plain(entry):
    """An eager run of the model without an injected change (no duplicated GEMM, no CPU busy-wait)."""
    return entry["mode"] == "eager" and not entry["dup_fc1"] and not entry["cpu_wait_us"]


def pair_specs(manifest):
    """Every pair A -> B: (table, change, A, B, how, flags). Within each recording set every ordered pair
    of plain runs of the same model; across the GPUs every H100 <-> H200 pair of one configuration."""
    specs = [("--scale", "a scoped op x2: CPU busy-wait per layer 200 -> 400 us", "h100-cpuwait200", "h100-cpuwait400", "replay",
              ["--scale", "op:cpu_wait=2"]),
             ("--scale", "a scoped op x2: forward fc1 GEMM run twice", "h100-base", "h100-dupfc1", "replay",
              ["--scale", "op:mlp_fc1=2"])]
    by_set = collections.defaultdict(list)
    for n in sorted(manifest):
        if plain(manifest[n]):
            by_set[recording_set(manifest[n])].append(n)
    for name in sorted(by_set):
        for a, b in itertools.permutations(by_set[name], 2):
            sa, sb = shape_of(manifest[a]), shape_of(manifest[b])
            if (sa["hidden"] == HOST_BOUND_HIDDEN) != (sb["hidden"] == HOST_BOUND_HIDDEN):
                continue
            diff = changes(sa, sb)
            if not diff:
                continue
            table = "whatif: one factor" if len(diff) == 1 else "whatif: several factors"
            label = ", ".join(f"{lab} {x} -> {y}" for lab, x, y in diff)
            if sa["hidden"] == HOST_BOUND_HIDDEN:
                label += " (host-bound model)"
            specs.append((table, label, a, b, "whatif", whatif_flags(sa, sb)))
    for n in sorted(manifest):
        other = "h200-" + n[len("h100-"):]
        if n.startswith("h100-") and other in manifest and plain(manifest[n]):
            specs.append(("whatif: H100 <-> H200", f"H100 -> H200 ({n[5:]})", n, other, "whatif", ["--gpu", "h200-sxm"]))
            specs.append(("whatif: H100 <-> H200", f"H200 -> H100 ({n[5:]})", other, n, "whatif", ["--gpu", "h100-sxm"]))
    # The target host given as a profile calibrated on the target GPU's base run: its pairs leave out
    # the base configuration, whose target run would calibrate its own prediction.
    for n in sorted(manifest):
        other = "h200-" + n[len("h100-"):]
        if n.startswith("h100-") and other in manifest and plain(manifest[n]) and n != "h100-base" and "h200-base" in manifest:
            specs.append((HOST_TABLE, f"H100 -> H200 ({n[5:]})", n, other, "whatif", ["--gpu", "h200-sxm", "--host-speed", "@h200-base"]))
            specs.append((HOST_TABLE, f"H200 -> H100 ({n[5:]})", other, n, "whatif", ["--gpu", "h100-sxm", "--host-speed", "@h100-base"]))
    return specs


_host_profiles = {}


def host_profiles(lumos, specs, tmp):
    """`lumos calibrate` of each run named `@RUN` in the specs' flags, written under `tmp`."""
    for f in sorted({f for *_, flags in specs for f in flags if f.startswith("@")}):
        _host_profiles[f] = os.path.join(tmp, f[1:] + ".json")
        run([lumos, "calibrate", trace(f[1:]), "-o", _host_profiles[f]])


def resolved(flags):
    """`flags` with each `@RUN` replaced by the path of RUN's calibrated profile."""
    return [_host_profiles.get(f, f) for f in flags]


def shown(flags):
    """`flags` as the table shows them: `@RUN` as the profile file `lumos calibrate` writes for RUN."""
    return " ".join(f[1:] + ".json" if f.startswith("@") else f for f in flags)


def what_if_rows(lumos, manifest):
    """Every pair of pair_specs: (table, change, A, B, command, predicted ms, CPU speed B/A, predicted ms
    at B's CPU speed)."""
    def one(spec):
        table, label, a, b, how, flags = spec
        speed = cpu_speed(a, b)
        if how == "whatif":
            p = whatif_ms(lumos, a, resolved(flags))
            # The target host's table states that host itself: B's CPU speed on top would count it twice.
            pn = None if table == HOST_TABLE else whatif_ms(lumos, a, resolved(flags), ["--scale", f"cpu={speed:.4f}"])
        else:
            p = replay_ms(lumos, a, flags)
            pn = replay_ms(lumos, a, flags + ["--scale", f"cpu={speed:.4f}"])
        return (table, label, a, b, f"lumos {how} A " + shown(flags), p, speed, pn)
    specs = pair_specs(manifest)
    for _, _, a, b, _, _ in specs:  # read each trace's CPU ops once, before the threads share the cache
        cpu_ops(a), cpu_ops(b)
    with tempfile.TemporaryDirectory() as tmp:
        host_profiles(lumos, specs, tmp)
        rows = list(POOL.map(one, specs))
    return rows


def summary(errs):
    """(count, mean |error|, worst |error|, within MISS) of signed errors in percent."""
    a = [abs(e) for e in errs]
    return len(a), statistics.mean(a), max(a), sum(1 for x in a if x <= MISS)


def structure_problems(lumos, manifest, names):
    """Steps that do not replay exactly, and shapes that structure discovery does not find."""
    problems = []
    for n in names:
        for s, d in zip(STEPS, replays(lumos, n)):
            r = d["ranks"][0]
            if abs(pct(r["simulated_ns"], r["measured_ns"])) > 1e-3:
                problems.append(f"{n} step {s}: replay {r['simulated_ns']} ns, measured {r['measured_ns']} ns")
    eager = [n for n in names if manifest[n]["mode"] == "eager"]
    structures = POOL.map(lambda n: json.loads(run([lumos, "inspect", "--structure", "--json", trace(n)])), eager)
    for n, found in zip(eager, structures):
        e = manifest[n]
        model, par = found["model"], found["parallel"]
        for k, v in e["shape"].items():
            key = {"micro_batch": "micro_batch_size"}.get(k, k)
            if k == "vocab":
                continue
            # micro-batches per step: the parallel layout's count (one stage)
            got = (par if k == "accum" else model).get("micro_batches" if k == "accum" else key, {}).get("value")
            if got != v:
                problems.append(f"{n}: structure discovery found {k} {got}, the run had {v}")
    return problems


def host_per_op(manifest, names):
    """(trace, GPU ops per step, GPU ms per step, unprofiled step ms, host us per launched op) of the
    host-bound runs: their unprofiled step over the GPU ops (kernels, copies, sets) one step launches."""
    rows = []
    for n in names:
        if manifest[n]["shape"]["hidden"] != HOST_BOUND_HIDDEN:
            continue
        with gzip.open(os.path.join(trace(n), "rank0.json.gz"), "rt") as f:
            ev = json.load(f)["traceEvents"]
        steps = sum(1 for e in ev if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"))
        gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
        ops = len(gpu) / steps
        gpu_ms = sum(float(e["dur"]) for e in gpu) / steps / 1e3
        u = manifest[n]["unprofiled_step_ms_median"]
        rows.append((n, ops, gpu_ms, u, u * 1e3 / ops))
    return rows


# The un-scaled host figures of the presets (model/profile.hpp, common_host), which its framework factor multiplies.
HOST_FIGURES = {"cpu.forward_op_ns": 20000, "cpu.backward_op_ns": 10000, "cpu.layer_glue_ns": 150000, "cpu.collective_ns": 30000}
PRESET_FACTOR = 2.5


def host_factor_errors(lumos, manifest, names, factor):
    """Signed errors, in percent, of `lumos predict` (the GPU's preset, its host figures times `factor`)
    against the unprofiled step of each host-bound run."""
    def one(n):
        s, gpu = manifest[n]["shape"], n.split("-")[0]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"hardware": f"{gpu}-sxm", **{k: v * factor for k, v in HOST_FIGURES.items()}}, f)
        try:
            d = json.loads(run([lumos, "predict", "--layers", str(s["layers"]), "--hidden", str(s["hidden"]), "--heads",
                                str(s["heads"]), "--ffn", str(s["ffn"]), "--seq", str(s["seq"]), "--vocab", str(s["vocab"]),
                                "--micro-batch", str(s["micro_batch"]), "--global-batch", str(s["micro_batch"] * s.get("accum", 1)),
                                "--gpu", f"{gpu}-sxm", "--profile", f.name, "--json"]))
        finally:
            os.unlink(f.name)
        u = manifest[n]["unprofiled_step_ms_median"]
        return pct(d["iteration_ns"] / 1e6, u)
    runs = [n for n in names if manifest[n]["shape"]["hidden"] == HOST_BOUND_HIDDEN]
    return list(POOL.map(one, runs))


def host_factor_fit(lumos, manifest, names):
    """The framework factor (steps of 0.1) whose host figures give the least mean |error| of `lumos predict`
    against the host-bound runs' unprofiled step: a coarse pass in steps of 0.5, then 0.1 around its best."""
    score = lambda f: statistics.mean(abs(e) for e in host_factor_errors(lumos, manifest, names, f))
    coarse = min((score(k / 2), k / 2) for k in range(2, 13))
    return min((score(round(coarse[1] + k / 10, 1)), round(coarse[1] + k / 10, 1)) for k in range(-4, 5))[1]


def runs_section(w, manifest, names, meas):
    w("## The recorded runs\n")
    w("| trace | GPU | layers | hidden | heads | seq | micro-batch | micro-batches per step | what differs | profiled step (ms) | unprofiled step (ms) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for n in names:
        e = manifest[n]
        s = e["shape"]
        w(f"| {n} | {e['gpu'].replace('NVIDIA ', '')} | {s['layers']} | {s['hidden']} | {s['heads']} | {s['seq']} | "
          f"{s['micro_batch']} | {s.get('accum', 1)} | {e['differs']} | {statistics.mean(meas[n]):.2f} | "
          f"{e['unprofiled_step_ms_median']:.2f} |")
    w("")
    w("The profiler itself slows the CPU side (per op); CPU-bound runs (small hidden, micro-batch 1, the")
    w("hidden-512 model) are up to 2x slower profiled than unprofiled, GPU-bound ones within a few percent.")
    w("lumos predicts the profiled run from a profiled trace; the unprofiled column is for reference.\n")


def host_section(w, lumos, manifest, names):
    w("## Host time per launched GPU op, without the profiler\n")
    w("For the runs whose step is bound by the host (the hidden-512 model: its GPU time per step is a small part")
    w("of it), the unprofiled step time over the GPU ops (kernels, copies, sets) one step launches is what the")
    w("framework spends per launched op: Python, dispatch, autograd and the launch call together")
    w("(`python3 scripts/gpu_validation.py --host-per-op` prints the mean). The cost presets' host figures")
    w("(`model/profile.hpp`, `common_host`: 20 us per forward op, 10 us per autograd node, 150 us of glue per")
    w("layer and 30 us per collective, times a framework factor 2.5, plus 5 us per launch) are an assumption:")
    w("the factor is fitted to one host-bound Megatron-LM run on A100 quoted in an issue, which these runs do")
    w("not reproduce (docs/model.md); they describe Megatron, not this plain PyTorch eager model.\n")
    w("| trace | GPU ops per step | GPU time per step (ms) | unprofiled step (ms) | host us per GPU op |")
    w("|---|---:|---:|---:|---:|")
    rows = host_per_op(manifest, names)
    for n, ops, gpu_ms, u, per in rows:
        w(f"| {n} | {ops:.0f} | {gpu_ms:.2f} | {u:.2f} | {per:.1f} |")
    if rows:
        w(f"\nMean {statistics.mean(r[4] for r in rows):.1f} us per launched op over {len(rows)} runs.\n")
        fit = host_factor_fit(lumos, manifest, names)
        at_fit = host_factor_errors(lumos, manifest, names, fit)
        at_preset = host_factor_errors(lumos, manifest, names, PRESET_FACTOR)
        w("The framework factor these runs give (`python3 scripts/gpu_validation.py --host-factor`: the factor, in steps")
        w("of 0.1, with the least mean |error| of `lumos predict` with the GPU's preset against their unprofiled step) is")
        w(f"**{fit:.1f}** (mean |error| {statistics.mean(map(abs, at_fit)):.1f} %, worst {max(map(abs, at_fit)):.1f} %); with "
          f"the presets' {PRESET_FACTOR} the same predictions")
        w(f"are off by {statistics.mean(map(abs, at_preset)):.1f} % on average (worst {max(map(abs, at_preset)):.1f} %). "
          f"The presets keep {PRESET_FACTOR}, an assumption (model/profile.hpp):")
        w("these runs are plain PyTorch eager on one host, not Megatron-LM, and their figure is reported, not adopted.\n")


def spread(manifest, names, meas):
    """The truth's own spread, in percent: within a run (the 3 profiled steps of one trace: (max - min) /
    mean), run to run (a repeat in a fresh process, profiled step; `repeats`: (run 1, run 2)) and the
    H200 set's repeated unprofiled step."""
    within = {n: 100.0 * (max(meas[n]) - min(meas[n])) / statistics.mean(meas[n]) for n in names}
    repeats = [(manifest[n]["base"], n) for n in names if manifest[n]["base"] and manifest[n]["differs"].startswith("a repeat of")]
    runs = [abs(pct(statistics.mean(meas[r2]), statistics.mean(meas[r1]))) for r1, r2 in repeats]
    unprof = [abs(pct(manifest[n]["repeat_unprofiled_step_ms_median"], manifest[n]["unprofiled_step_ms_median"]))
              for n in names if "repeat_unprofiled_step_ms_median" in manifest[n]]
    return within, repeats, runs, unprof


def spread_text(within, runs, unprof):
    worst = max(within, key=within.get)
    out = (f"within a run (3 profiled steps of one trace, (max - min) / mean) mean {statistics.mean(within.values()):.2f} %, "
           f"largest {within[worst]:.2f} % ({worst})")
    if runs:
        out += f"; run to run (profiled step, {len(runs)} repeats) mean {statistics.mean(runs):.2f} %, largest {max(runs):.2f} %"
    if unprof:
        out += f"; unprofiled step run to run ({len(unprof)} H200 runs) mean {statistics.mean(unprof):.2f} %, largest {max(unprof):.2f} %"
    return out


def spread_section(w, lumos, manifest, names, meas):
    within, repeats, runs, unprof = spread(manifest, names, meas)
    w("## The truth's own spread\n")
    w("How much the measured step moves on its own:\n")
    w(f"- {spread_text(within, runs, unprof).replace('; ', '.' + chr(10) + '- ')}.\n")
    w("A prediction cannot be expected to come closer to one run than the runs of one configuration come to each other.\n")
    if unprof:
        w("The accumulation set (`--set h200-accum`) was recorded twice in one session; only the first run's traces")
        w("are kept. Its unprofiled step, run 1 and run 2 (`repeat_unprofiled_step_ms_median` in the manifest):\n")
        w("| trace | run 1 (ms) | run 2 (ms) | run 2 vs 1 |")
        w("|---|---:|---:|---:|")
        for n in names:
            if "repeat_unprofiled_step_ms_median" in manifest[n]:
                u1, u2 = manifest[n]["unprofiled_step_ms_median"], manifest[n]["repeat_unprofiled_step_ms_median"]
                w(f"| {n} | {u1:.2f} | {u2:.2f} | {pct(u2, u1):+.2f} % |")
        w("")
    if repeats:
        w("The same configuration recorded again in a fresh process (`--set h100-repeat`). The GPU work is the same;")
        w("the host ran the same PyTorch ops at another speed, and CPU-bound steps (and GPU-bound ones whose profiled")
        w("host side comes close to the GPU time) moved with it. The last columns replay run 1 at run 2's CPU speed")
        w("(`lumos replay RUN1 --scale cpu=F`, F = CPU speed 2/1 as below; a diagnostic).\n")
        w("| configuration | run 1 (ms) | run 2 (ms) | run 2 vs 1 | CPU speed 2/1 | replay of run 1 at F (ms) | error vs run 2 |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for r1, r2 in repeats:
            f = cpu_speed(r1, r2)
            p = replay_ms(lumos, r1, ["--scale", f"cpu={f:.4f}"])
            m1, m2 = statistics.mean(meas[r1]), statistics.mean(meas[r2])
            w(f"| {r1} | {m1:.2f} | {m2:.2f} | {pct(m2, m1):+.2f} % | {f:.3f} | {p:.2f} | {pct(p, m2):+.2f} % |")
        w("")
    return spread_text(within, runs, unprof)


def identity_section(w, lumos, names, figures):
    w("## Replay identity and held-out steps\n")
    ident = [abs(pct(d["ranks"][0]["simulated_ns"], d["ranks"][0]["measured_ns"])) for n in names for d in replays(lumos, n)]

    def held_out(case):
        n, m = case
        steps = [s for s in STEPS if s != m]
        docs = json.loads(run([lumos, "replay", trace(n), "--step", ",".join(map(str, steps)), "--durations-from-step", str(m), "--json"]))
        return [(n, s, m, pct(d["ranks"][0]["simulated_ns"], d["ranks"][0]["measured_ns"])) for s, d in zip(steps, docs)]
    by_source = {(n, m): rows for (n, m), rows in zip([(n, m) for n in names for m in STEPS],
                                                      POOL.map(held_out, [(n, m) for n in names for m in STEPS]))}
    held = [r for n in names for s, m in itertools.permutations(STEPS, 2) for r in by_source[(n, m)] if r[1] == s]
    w(f"- Replay identity: {len(ident)} steps of {len(names)} traces, largest |error| {max(ident):.3f} % (exact by")
    w("  construction: kept slacks; a check of the reader and graph on real PyTorch 2.11 traces, not evidence).")
    n_, mean_held, worst_held, _ = summary([h[3] for h in held])
    worst = max(held, key=lambda h: abs(h[3]))
    figures["held-out steps"] = (mean_held, worst_held)
    w(f"- Held-out steps (`replay --step N --durations-from-step M`, every ordered pair of the 3 steps): {n_}")
    w(f"  predictions, mean |error| {mean_held:.2f} %, worst {worst[3]:+.2f} % ({worst[0]}, step {worst[1]} from step {worst[2]}).\n")


TABLE_TEXT = {
    "--scale": ("A scoped op made k times longer (`lumos replay A --scale op:NAME=k`), against the run that did it.",),
    "whatif: one factor": ("Pairs of one recording set whose configurations differ in one factor: base to child, child to",
                           "base and sibling to sibling (`lumos whatif A <flags of B>`, with B's global batch)."),
    "whatif: several factors": ("Pairs of one recording set whose configurations differ in more than one factor (siblings",
                                "of the base, and the accumulation sets' runs that change the micro-batch or layers too)."),
    "whatif: H100 <-> H200": ("The same configuration on the other GPU (`--gpu`); the prediction keeps the traced host.",),
    HOST_TABLE: ("The same pairs, with the target host given as a profile (`--host-speed PROFILE`: `lumos calibrate` of the",
                 "target GPU's base run, whose host entry is compared with the traces'; the base configuration is left out).",
                 "A different input from the tables above (a trace of the target machine), so not in \"every pair\"."),
}


def pairs_section(w, rows, meas, figures, spread_line):
    meas_b = {n: statistics.mean(v) for n, v in meas.items()}
    w("## What-ifs against the runs that did them\n")
    w("Errors are raw: (predicted - measured B) / measured B. \"CPU speed B/A\" and \"error at B's CPU speed\" are a")
    w("diagnostic (the prediction repeated at the target run's host speed, taken from B's own trace); they are")
    w("neither gated nor in the figures below. Runs of the hidden-512 model are paired only with each other.\n")
    every = []
    for table in TABLE_TEXT:
        mine = [r for r in rows if r[0] == table]
        if not mine:
            continue
        w(f"### {table}\n")
        w("\n".join(TABLE_TEXT[table]) + "\n")
        w("| change | A (trace) | B (truth) | command | predicted (ms) | measured B (ms) | error | CPU speed B/A | error at B's CPU speed |")
        w("|---|---|---|---|---:|---:|---:|---:|---:|")
        errs = []
        for _, label, a_, b, cmd, p, speed, pn in mine:
            e = pct(p, meas_b[b])
            errs.append(e)
            at_b = "-" if pn is None else f"{pct(pn, meas_b[b]):+.2f} %"
            w(f"| {label} | {a_} | {b} | `{cmd}` | {p:.2f} | {meas_b[b]:.2f} | {e:+.2f} % | {speed:.3f} | {at_b} |")
        if table.startswith("whatif") and table != HOST_TABLE:
            every += errs
        n_, mean, worst, within = summary(errs)
        figures[table] = (mean, worst)
        w(f"\n{n_} pairs: mean |error| {mean:.2f} %, worst {worst:.2f} %, {within} within {MISS:.0f} %.\n")
        if table == HOST_TABLE:
            pairs = {(r[2], r[3]) for r in mine}
            kept = [pct(r[5], meas_b[r[3]]) for r in rows if r[0] == "whatif: H100 <-> H200" and (r[2], r[3]) in pairs]
            n_, mean, worst, within = summary(kept)
            w(f"The same {n_} pairs with the traced host kept: mean |error| {mean:.2f} %, worst {worst:.2f} %, {within} within {MISS:.0f} %.\n")
    n_, mean, worst, within = summary(every)
    figures["whatif: every pair"] = (mean, worst)
    met = "met" if mean <= TARGET_MEAN and worst <= TARGET_WORST else "not met"
    w("### Every what-if pair\n")
    w(f"**{n_} what-if pairs (the three whatif tables): mean |error| {mean:.2f} %, worst {worst:.2f} %, {within} within")
    w(f"{MISS:.0f} %.** The issue's target, mean <= {TARGET_MEAN:.0f} % and worst <= {TARGET_WORST:.0f} %, is {met}. The truth's")
    w(f"spread beside it: {spread_line}.\n")
    misses = [r for r in rows if r[0] != HOST_TABLE and abs(pct(r[5], meas_b[r[3]])) > MISS]
    if misses:
        w(f"Pairs beyond {MISS:.0f} %, and whether the target run's CPU speed accounts for the miss (within {MISS:.0f} % at it):\n")
        for r in misses:
            e, en = pct(r[5], meas_b[r[3]]), pct(r[7], meas_b[r[3]])
            why = "the CPU speed of the runs" if abs(en) <= MISS else "not the CPU speed alone"
            w(f"- {r[1]} ({r[2]} -> {r[3]}): {e:+.2f} %; at B's CPU speed {en:+.2f} %: {why}")
        w("")


def predict_section(w, lumos, manifest, names, meas, figures):
    w("## `lumos predict --profile`, calibrated on one trace\n")
    with tempfile.TemporaryDirectory() as tmp:
        prof = {}
        for gpu in ("h100", "h200"):
            if f"{gpu}-base" in manifest:
                prof[gpu] = os.path.join(tmp, f"{gpu}.json")
                run([lumos, "calibrate", trace(f"{gpu}-base"), "-o", prof[gpu]])
        w("Profile: `lumos calibrate tests/data/gpu/GPU-base -o profile.json` (the base run of that GPU only); each eager")
        w("configuration of that GPU then `lumos predict --layers L --hidden H --heads N --ffn F --seq S --vocab 32768")
        w("--micro-batch B --global-batch B --gpu G --profile profile.json` (one GPU: no parallelism). predict models")
        w("Megatron's kernels (tied embedding, fused ops), not this plain-PyTorch model: calibrate fits the per-kernel")
        w("parameters, then the CPU dispatch per op, one factor on the memory-bound bandwidths and the optimizer bandwidth")
        w("so that the model of the traced configuration spends the traced host, memory-bound and optimizer time")
        w("(`whatif/model_fit.hpp`, docs/model.md). The base rows are fitted (the profile comes from their traces: in")
        w("sample); the other rows are held out, and the figures below keep the two apart.\n")
        w("| trace | rows | predicted (ms) | measured (ms) | error |")
        w("|---|---|---:|---:|---:|")
        fitted, held = [], []
        for n in names:
            e = manifest[n]
            gpu = n.split("-")[0]
            if not plain(e) or gpu not in prof:
                continue
            s = e["shape"]
            cmd = [lumos, "predict", "--layers", str(s["layers"]), "--hidden", str(s["hidden"]), "--heads", str(s["heads"]),
                   "--ffn", str(s["ffn"]), "--seq", str(s["seq"]), "--vocab", str(s["vocab"]), "--micro-batch", str(s["micro_batch"]),
                   "--global-batch", str(s["micro_batch"] * s.get("accum", 1)), "--gpu", f"{gpu}-sxm", "--profile", prof[gpu], "--json"]
            d = json.loads(run(cmd))
            p = d["iteration_ns"] / 1e6 if "iteration_ns" in d else d["iteration"]["time_ns"] / 1e6
            m = statistics.mean(meas[n])
            er = pct(p, m)
            is_fit = n == f"{gpu}-base"
            (fitted if is_fit else held).append(er)
            w(f"| {n} | {'fitted' if is_fit else 'held out'} | {p:.2f} | {m:.2f} | {er:+.2f} % |")
        w("")
        for key, errs, what in (("predict --profile: held out", held, "held-out configurations"),
                                ("predict --profile: fitted (the calibrated trace)", fitted, "fitted rows (the calibrated traces)")):
            if errs:
                n_, mean, worst, within = summary(errs)
                figures[key] = (mean, worst)
                w(f"- {n_} {what}: mean |error| {mean:.2f} %, worst {worst:.2f} %, {within} within {MISS:.0f} %.")
        w("")


def memory_section(w, manifest, rows, figures):
    """Per-GPU memory of each traced job (`whatif --json` "baseline") and of each what-if's prediction
    ("predicted") against the measured peak (`torch.cuda.max_memory_allocated()`, `peak_memory_bytes`)."""
    traced, pairs = {}, []
    for table, label, a, b, cmd, *_ in rows:
        if not cmd.startswith("lumos whatif") or table == HOST_TABLE:
            continue
        base, pred = _memory[(a, tuple(cmd.split(" ")[3:]))]
        traced[a] = base
        pairs.append((label, a, b, pred))
    w("## Memory per GPU\n")
    w("Measured: the peak of `torch.cuda.max_memory_allocated()` over the run (`peak_memory_bytes`). Predicted: `memory_bytes_per_gpu`")
    w("of `lumos whatif --json`, for the traced job (\"baseline\") and for each what-if (\"predicted\", against B's peak).")
    w("A PyTorch eager step with a `torch.optim` Adam optimizer is modelled by `include/lumos/model/eager_memory.hpp`: the")
    w("larger of the backward peak and the optimizer-step peak, with the data types `lumos inspect --structure` reads")
    w("(\"memory recipe\"). Nothing is fitted: every row is held out. Runs whose trace shows no recipe (CUDA graphs: the")
    w("optimizer step is replayed inside the graph) get no figure and are listed apart.\n")
    w("| run | measured (GiB) | traced job (GiB) | error |")
    w("|---|---:|---:|---:|")
    errs, none = [], []
    for a in sorted(traced):
        peak = manifest[a].get("peak_memory_bytes")
        if not peak:
            continue
        if traced[a] is None:
            none.append(a)
            continue
        e = pct(traced[a], peak)
        errs.append(e)
        w(f"| {a} | {peak / 2**30:.2f} | {traced[a] / 2**30:.2f} | {e:+.2f} % |")
    n_, mean, worst, within = summary(errs)
    figures["memory: traced jobs"] = (mean, worst)
    w(f"\n{n_} traced jobs (the A of every what-if pair): mean |error| {mean:.2f} %, worst {worst:.2f} %, {within} within {MISS:.0f} %.")
    if none:
        w(f"No figure (no memory recipe in the trace): {', '.join(none)}.")
    perrs = []
    for label, a, b, pred in pairs:
        peak = manifest[b].get("peak_memory_bytes")
        if peak and pred is not None:
            perrs.append(pct(pred, peak))
    n_, mean, worst, within = summary(perrs)
    figures["memory: what-ifs"] = (mean, worst)
    met = "met" if mean <= MEMORY_TARGET else "not met"
    w(f"{n_} what-ifs (every pair of the what-if tables whose A has a recipe): mean |error| {mean:.2f} %, worst {worst:.2f} %,")
    w(f"{within} within {MISS:.0f} %. The issue's target, mean <= {MEMORY_TARGET:.0f} %, is {met}.")
    big = sorted({(a, b) for (label, a, b, pred), e in zip([p for p in pairs if manifest[p[2]].get("peak_memory_bytes") and p[3] is not None], perrs) if abs(e) > MISS})
    if big:
        w(f"What-ifs beyond {MISS:.0f} %: " + ", ".join(f"{a} -> {b}" for a, b in big) + ".")
    w("")


def gates_section(w, figures):
    w("## Gates\n")
    w("`python3 scripts/gpu_validation.py --check` (ctest `real_gpu_runs`) regenerates this section and fails when it")
    w("differs from the document, when a trace does not replay exactly or its shape is not found, or when a table's raw")
    w("mean or worst |error| exceeds its gate. The gates are regression gates: the values measured when they were set")
    w(f"plus a small margin; they are not targets. The issue's target for the what-if tables is mean <= {TARGET_MEAN:.0f} %,")
    w(f"worst <= {TARGET_WORST:.0f} %; for the memory per GPU mean <= {MEMORY_TARGET:.0f} %.\n")
    w("| table | mean abs error | gate | worst abs error | gate | issue target |")
    w("|---|---:|---:|---:|---:|---|")
    for key, (gm, gw) in GATES.items():
        if key not in figures:
            continue
        mean, worst = figures[key]
        target = ""
        if key.startswith("whatif"):
            target = "met" if mean <= TARGET_MEAN and worst <= TARGET_WORST else "not met"
        elif key.startswith("memory"):
            target = "met" if mean <= MEMORY_TARGET else "not met"
        w(f"| {key} | {mean:.2f} % | {gm:.1f} % | {worst:.2f} % | {gw:.1f} % | {target} |")
    w("")


def generate(lumos, manifest, names):
    """The generated block of docs/validation.md and the raw (mean, worst) |error| of each table."""
    meas = dict(zip(names, POOL.map(lambda n: measured_steps_ms(lumos, n), names)))
    figures = {}
    out = []
    w = out.append
    w("Generated by `python3 scripts/gpu_validation.py` from the traces in `tests/data/gpu/` (recorded by")
    w("`scripts/gpu/record_pairs.py`; see `tests/data/gpu/README.md`). Do not edit by hand.\n")
    gpus = sorted({manifest[n]["gpu"] for n in names})
    torch_v = sorted({manifest[n]["torch"] for n in names})
    w(f"Runs: {len(names)} traces on {', '.join(gpus)}; PyTorch {', '.join(torch_v)}; one GPU each. The model is")
    w("`examples/capture/gpt_train.py` (GPT-style: learned positions, pre-LN blocks, SDPA causal attention, GELU MLP,")
    w("untied LM head, bf16 autocast, AdamW foreach, `loss.item()` per step). Measured = the mean of the 3 recorded")
    w("steps (profiled, as lumos's window of each `ProfilerStep`); a what-if is run from each step of A and averaged.\n")
    runs_section(w, manifest, names, meas)
    host_section(w, lumos, manifest, names)
    identity_section(w, lumos, names, figures)
    spread_line = spread_section(w, lumos, manifest, names, meas)
    rows = what_if_rows(lumos, manifest)
    pairs_section(w, rows, meas, figures, spread_line)
    predict_section(w, lumos, manifest, names, meas, figures)
    memory_section(w, manifest, rows, figures)
    gates_section(w, figures)
    return "\n".join(out) + "\n", figures


def block_of(text):
    b, e = text.find(BEGIN), text.find(END)
    return text[b + len(BEGIN) + 1:e] if 0 <= b < e else None


def check(lumos, manifest, names, doc):
    """The ctest: exits 1 with the reasons when a check fails."""
    problems = structure_problems(lumos, manifest, names)
    block, figures = generate(lumos, manifest, names)
    have = block_of(open(doc).read())
    if have is None:
        problems.append(f"{doc} has no {BEGIN} ... {END} block")
    elif have != block:
        diff = list(difflib.unified_diff(have.splitlines(), block.splitlines(), "document", "generated now", lineterm="", n=0))
        problems.append(f"{doc} differs from what the script generates now (run python3 scripts/gpu_validation.py):\n  " +
                        "\n  ".join(diff[:40]))
    for key, (gm, gw) in GATES.items():
        if key not in figures:
            problems.append(f"table {key}: no rows")
            continue
        mean, worst = figures[key]
        print(f"{key}: mean |error| {mean:.2f} % (gate {gm:.1f} %), worst {worst:.2f} % (gate {gw:.1f} %)")
        if mean > gm:
            problems.append(f"{key}: mean |error| {mean:.2f} % > gate {gm:.1f} %")
        if worst > gw:
            problems.append(f"{key}: worst |error| {worst:.2f} % > gate {gw:.1f} %")
    for p in problems:
        print("FAIL " + p)
    print("real_gpu_runs: " + ("failed" if problems else f"passed ({len(names)} traces)"))
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lumos", default=os.path.join(ROOT, "build", "release", "examples", "lumos"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "validation.md"))
    ap.add_argument("--print", action="store_true", help="print the generated block instead of writing it")
    ap.add_argument("--check", action="store_true",
                    help="the test (ctest real_gpu_runs): the document's block equals what the script generates, replay "
                         "identity, the shape structure discovery finds against the manifest, and each table's raw mean and "
                         "worst |error| within its regression gate")
    ap.add_argument("--host-per-op", action="store_true",
                    help="print the host time per launched GPU op of the host-bound runs (mean, us)")
    ap.add_argument("--host-factor", action="store_true",
                    help="print the presets' framework factor that the host-bound runs give (least mean |error| of predict)")
    a = ap.parse_args()
    lumos = os.path.abspath(a.lumos)
    manifest = {e["name"]: e for e in json.load(open(os.path.join(DATA, "manifest.json")))["traces"]}
    names = sorted(manifest)
    if a.host_factor:
        print(f"{host_factor_fit(lumos, manifest, names):.1f}")
        return 0
    if a.host_per_op:
        rows = host_per_op(manifest, names)
        print(f"{statistics.mean(r[4] for r in rows):.1f}")
        return 0
    if a.check:
        return check(lumos, manifest, names, a.doc)
    block, _ = generate(lumos, manifest, names)
    if a.print:
        sys.stdout.write(block)
        return 0
    text = open(a.doc).read() if os.path.exists(a.doc) else ""
    b, e = text.find(BEGIN), text.find(END)
    if 0 <= b < e:
        text = text[:b] + BEGIN + "\n" + block + text[e:]
    else:
        text = "# Validation against real training runs\n\n" + BEGIN + "\n" + block + END + "\n"
    with open(a.doc, "w") as f:
        f.write(text)
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

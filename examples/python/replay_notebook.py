"""A notebook-style tour of the lumos Python package (run it, or paste the cells into Jupyter).

    python3 examples/python/replay_notebook.py [JOB_DIR] [--report report.html]

Default job: the built-in example (examples/data/tiny_job). Cells are separated by `# %%`.
"""
# %% Load a job: one Kineto trace per rank (a directory, or a list of files)
import argparse
from pathlib import Path

import numpy as np

import lumos

ap = argparse.ArgumentParser()
ap.add_argument("job", nargs="?", default=str(Path(__file__).resolve().parents[1] / "data" / "tiny_job"))
ap.add_argument("--report", default=None, help="write the HTML report here")
args = ap.parse_args()

job = lumos.load_job(args.job)
print(job)
for rank in job.inspect()["ranks"]:
    print(f"rank {rank['rank']}: {rank['gpu_ops']} GPU ops on {rank['streams']} streams, steps {[s['name'] for s in rank['steps']]}")

# %% Replay it: measured vs simulated iteration per rank
r = lumos.replay(job)
print(r)
for rank in r.ranks:
    print(f"rank {rank.rank}: measured {rank.measured_ns / 1e6:.3f} ms, simulated {rank.simulated_ns / 1e6:.3f} ms")

# %% The 4-way breakdown as a NumPy array (rows: ranks; columns: lumos.BREAKDOWN_COLUMNS)
b = r.breakdowns()
share = b[:, :4] / b[:, :4].sum(axis=1, keepdims=True)
for rank, row in zip(r.ranks, share):
    print(f"rank {rank.rank}: " + ", ".join(f"{c[:-3]} {100 * v:.1f}%" for c, v in zip(lumos.BREAKDOWN_COLUMNS, row)))

# %% A what-if: GPU compute twice as fast
fast = lumos.replay(job, scale={"compute": 0.5})
print(f"compute x0.5: {r.simulated_ns / 1e6:.3f} ms -> {fast.simulated_ns / 1e6:.3f} ms")

# %% The graph rewritten for another configuration (`lumos whatif`): another GPU
w = lumos.whatif(job, gpu="h200-sxm")
print(w)
for c in w.changes:  # the change records: pass, subject, from, to, figures (before/after), text
    print(f"{c['pass']}: {c['text']}")
print("predicted breakdown, ns:", dict(zip(lumos.BREAKDOWN_COLUMNS, w.predicted.breakdowns()[0].tolist())))

# %% What structure discovery found in the traces (`lumos inspect --structure`), which the what-if reads
structure = job.inspect(structure=True)
print({k: structure["parallel"][k]["value"] for k in ("world", "tp", "pp", "dp")})
layers = structure["model"]["layers"]
print("layers:", "unknown" if layers["value"] is None else layers["value"], f"[{layers['source']}]")

# %% Per-task timeline of one rank (NumPy columns; to_pandas() when pandas is installed)
t = r.timeline(r.ranks[0].rank)
gpu = t.kind == t.kind_names.index("gpu_compute")
longest = np.argsort(t.end_ns - t.start_ns)[::-1]
print("longest GPU ops:", [(t.name[i], int(t.end_ns[i] - t.start_ns[i])) for i in longest if gpu[i]][:3])

# %% The critical path of the slowest rank
path = r.critical_path()
print(f"critical path of rank {path['rank']}:", {k: v for k, v in path["attribution"].items() if v})

# %% A model-driven prediction, no trace needed
p = lumos.predict(model="gpt3-175b", tp=8, pp=8, dp=8, global_batch=256)
print(f"GPT-3 175B on {p.job['gpus']} x {p.job['gpu']}: {p.iteration_ns / 1e9:.3f} s per iteration, MFU {100 * p.mfu:.1f}%")

# %% The HTML reports (what `lumos report` and `lumos whatif --report` write)
if args.report:
    print("wrote", r.report(args.report))
    print("wrote", w.report(Path(args.report).with_name("whatif-" + Path(args.report).name)))

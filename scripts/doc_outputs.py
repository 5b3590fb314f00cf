#!/usr/bin/env python3
"""Checks that every command shown with its output in README.md and docs/*.md prints that output.

    python3 scripts/doc_outputs.py [--lumos PATH] [--print] [--update]

A checked block is a fenced block whose first line starts with "$ ": each "$ " line (with "\\"
continuations) is a command, run by bash from the repository root with `lumos` (and
`./build/release/examples/lumos`) meaning the binary given; the lines after it, up to the next
command, are its expected standard output. A line "..." stands for any number of lines. Exit 1,
with a diff, when a block's output differs; --print shows what each command prints now;
--update writes the output of each command that differs into its block (its "..." lines dropped).
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))


def blocks(path):
    """(line number, [(command, expected lines)]) of each checked block of `path`."""
    lines = open(os.path.join(ROOT, path)).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and lines[i + 1].startswith("$ "):
            start, i, steps = i + 2, i + 1, []
            while not lines[i].startswith("```"):
                if lines[i].startswith("$ "):
                    cmd = lines[i][2:]
                    while cmd.endswith("\\"):
                        i += 1
                        cmd = cmd[:-1] + " " + lines[i].strip()
                    steps.append((cmd, []))
                else:
                    steps[-1][1].append(lines[i])
                i += 1
            out.append((start, steps))
        i += 1
    return out


def matches(expected, actual):
    """Whether `actual` lines equal `expected`, where a "..." line stands for any lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and actual[0] == expected[0] and matches(expected[1:], actual[1:])


def update(doc, replacements):
    """Writes each command's `actual` output in place of its `expected` lines in `doc`."""
    path = os.path.join(ROOT, doc)
    lines = open(path).read().split("\n")
    for cmd, expected, actual in replacements:
        first = cmd.split(" ")[0:3]
        at = next(i for i, l in enumerate(lines) if l.startswith("$ ") and l[2:].split(" ")[0:3] == first and
                  lines[i + 1:i + 1 + len(expected)] == expected or (l.startswith("$ ") and cmd.startswith(l[2:].rstrip("\\").rstrip())))
        while lines[at].endswith("\\"):
            at += 1
        lines[at + 1:at + 1 + len(expected)] = actual
    open(path, "w").write("\n".join(lines))
    print(f"doc_outputs: updated {doc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lumos", default=os.path.join(ROOT, "build", "release", "examples", "lumos"))
    ap.add_argument("--print", action="store_true", help="print each command's output")
    ap.add_argument("--update", action="store_true", help="write the outputs that differ into the docs")
    a = ap.parse_args()
    lumos = os.path.abspath(a.lumos)
    if not os.access(lumos, os.X_OK):
        sys.exit(f"doc_outputs: no lumos binary at {lumos} (--lumos PATH)")
    shim = tempfile.mkdtemp(prefix="lumos-doc-")
    os.symlink(lumos, os.path.join(shim, "lumos"))
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ.get("PATH", ""))
    failed = checked = skipped = 0
    shared = os.environ.get("LUMOS_TRACE_DIR") or os.path.join(ROOT, "..", "shared", "traces")
    have_shared = os.path.isdir(shared)
    if not have_shared and os.environ.get("CI") == "true":
        sys.exit(f"doc_outputs: the shared traces are missing ({shared}) and CI=true")
    for doc in DOCS:
        replacements = []  # (expected lines, actual lines) of the commands that differ
        for line, steps in blocks(doc):
            for cmd, expected in steps:
                if "../shared/traces" in cmd and not have_shared:
                    skipped += 1
                    continue
                run = re.sub(r"(^|\s)\./build/release/examples/lumos\b", r"\1lumos", cmd)
                r = subprocess.run(["bash", "-o", "pipefail", "-c", run], cwd=ROOT, env=env, capture_output=True, text=True)
                actual = r.stdout.rstrip("\n").split("\n") if r.stdout else []
                checked += 1
                if a.print:
                    print(f"== {doc}:{line}: $ {cmd}\n{r.stdout}", end="")
                if r.returncode != 0 or not matches(expected, actual):
                    failed += 1
                    print(f"doc_outputs: {doc}:{line}: `{cmd}` (exit {r.returncode}) does not print what the doc shows:")
                    sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in expected], [x + "\n" for x in actual], "doc", "now"))
                    if r.stderr:
                        print(r.stderr[-2000:])
                    replacements.append((cmd, expected, actual))
        if a.update and replacements:
            update(doc, replacements)
    print(f"doc_outputs: {checked} commands, {failed} differ" + (f"; {skipped} skipped (no shared traces)" if skipped else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

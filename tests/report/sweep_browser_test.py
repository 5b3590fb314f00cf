"""Loads a `lumos sweep --report` page in headless Chromium and checks it against the `--csv` of the
same command: no console errors and no script, one rendered point (class "config") per predicted
configuration, the Pareto table's rows exactly the configurations the CSV shows no other one
beating on both iteration time and memory per GPU, the rejection counts per reason the CSV's; a
full-page screenshot is saved as a test artifact.

Uses Selenium + chromedriver when both are installed (console log from the browser, the points
counted among the rendered elements), else the bare browser (`--dump-dom`, `--screenshot`).
Exit code 77 (CTest: skipped) without a browser, unless LUMOS_REQUIRE_BROWSER=1 (CI), where that
is a failure, as browser_test.py.

    sweep_browser_test.py --lumos build/release/examples/lumos --out DIR
"""
import argparse
import collections
import csv
import html.parser
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_test import browser_or_skip, with_browser, with_selenium  # noqa: E402

# A small space with every kind of outcome: accepted configurations of several schedules and
# memories, and rejections for divisibility, schedule and memory.
SWEEP = ["sweep", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2,4,8,16", "--pp", "1,2,4,8",
         "--vp", "1,2", "--micro-batch", "1,2,4", "--schedule", "1f1b,interleaved,gpipe", "--recompute", "none,full",
         "--sp", "off,on", "--memory-margin", "0.5", "--top", "8", "--threads", "2"]


class Page(html.parser.HTMLParser):
    """What the checks read from the DOM the browser rendered."""

    def __init__(self):
        super().__init__()
        self.points = []  # data-index of each "config" element
        self.pareto = []  # data-index of each row of table#pareto
        self.rejected = {}  # reason -> count, from table#rejected
        self.table = None
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "script":
            self.scripts += 1
        if tag == "table":
            self.table = a.get("id")
        if "config" in classes:
            self.points.append(int(a["data-index"]))
        if tag == "tr" and self.table == "pareto" and "data-index" in a:
            self.pareto.append(int(a["data-index"]))
        if tag == "tr" and self.table == "rejected" and "data-reason" in a:
            self.rejected[a["data-reason"]] = int(a["data-count"])

    def handle_endtag(self, tag):
        if tag == "table":
            self.table = None


def non_dominated(rows):
    """Indices of the rows no other row matches or beats on time and memory while beating on one."""
    front = set()
    for r in rows:
        t, m = int(r["iteration_ns"]), float(r["memory_bytes"])
        if not any(int(o["iteration_ns"]) <= t and float(o["memory_bytes"]) <= m
                   and (int(o["iteration_ns"]) < t or float(o["memory_bytes"]) < m) for o in rows):
            front.add(int(r["index"]))
    return front


def check(dom, console_errors, rows, rendered):
    page = Page()
    page.feed(dom)
    problems = []
    if console_errors:
        problems.append(f"console errors: {console_errors}")
    if page.scripts:
        problems.append("the page holds a script")
    predicted = [r for r in rows if r["status"] == "ok"]
    if not predicted or len(predicted) == len(rows):
        problems.append(f"the space should have predicted and rejected configurations: {len(predicted)} of {len(rows)}")
    if len(page.points) != len(predicted):
        problems.append(f"{len(page.points)} config points, the CSV has {len(predicted)} predicted rows")
    if sorted(page.points) != sorted(int(r["index"]) for r in predicted):
        problems.append("the points are not the CSV's predicted configurations")
    if rendered is not None and rendered != len(predicted):
        problems.append(f"{rendered} config points rendered with a size, the CSV has {len(predicted)} predicted rows")
    front = non_dominated(predicted)
    if len(page.pareto) != len(set(page.pareto)) or set(page.pareto) != front:
        problems.append(f"Pareto rows {sorted(page.pareto)}, the CSV's non-dominated rows {sorted(front)}")
    reasons = collections.Counter(r["reason"] for r in rows if r["status"] != "ok")
    if page.rejected != dict(reasons):
        problems.append(f"rejected table {page.rejected}, the CSV's {dict(reasons)}")
    print(f"sweep page: {len(page.points)} points ({rendered} rendered), {len(page.pareto)} on the Pareto front, "
          f"rejected {page.rejected}")
    return problems


# The "config" points the browser laid out with a size.
RENDERED_POINTS = ("Array.from(document.querySelectorAll('.config')).filter(e => {"
                   " const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lumos", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    browser, use_selenium = browser_or_skip("sweep_report_browser")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page, table, shot = out / "sweep.html", out / "sweep.csv", out / "sweep.png"
    subprocess.run([args.lumos, *SWEEP, "--csv", table, "--report", page], check=True, capture_output=True)
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    if use_selenium:
        dom, errors, rendered = with_selenium(browser, page.resolve().as_uri(), shot, RENDERED_POINTS)
        rendered = int(rendered)
    else:
        dom, errors = with_browser(browser, page.resolve().as_uri(), shot)
        rendered = None
    problems = check(dom, errors, rows, rendered)
    if not shot.is_file() or shot.stat().st_size < 10000:
        problems.append(f"no screenshot at {shot}")
    print(f"sweep page: screenshot {shot}")
    for p in problems:
        print("FAIL", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

"""Loads `lumos report` pages in headless Chromium: no console errors, the expected elements
(one bar row per rank or group, one timeline per drawn rank with one lane per GPU stream that
has work), and a full-page screenshot saved as a test artifact.

Uses Selenium + chromedriver when both are installed (console log from the browser), else the
bare browser (`--dump-dom`, `--screenshot`, console messages from its log). Exit code 77 (CTest:
skipped) without a browser, unless LUMOS_REQUIRE_BROWSER=1 (CI), where that is a failure.

    browser_test.py --lumos build/release/examples/lumos --out DIR JOB_DIR...
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
FLAGS = ["--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars"]
if hasattr(os, "geteuid") and os.geteuid() == 0:
    FLAGS.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class Elements(html.parser.HTMLParser):
    """What the checks count, from the DOM the browser rendered."""

    def __init__(self):
        super().__init__()
        self.timelines = {}  # rank -> GPU lanes
        self.current = None
        self.rows = {"iteration-bars": 0, "breakdown-bars": 0}
        self.svg = None
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "") or ""
        if tag == "script":
            self.scripts += 1
        if tag == "svg":
            self.svg = a.get("id")
            if "timeline" in cls.split():
                self.current = int(a["data-rank"])
                self.timelines[self.current] = 0
        if tag == "g" and "gpu-lane" in cls.split() and self.current is not None:
            self.timelines[self.current] += 1
        if tag == "g" and "rank-row" in cls.split() and self.svg in self.rows:
            self.rows[self.svg] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
            self.svg = None


def streams_with_work(report_html):
    """GPU lanes the page says it hid (none expected for these jobs) are part of the check."""
    return "lanes with the least work not drawn" not in report_html


def check_page(page, dom, console_errors, job_summary, name):
    e = Elements()
    e.feed(dom)
    problems = []
    if console_errors:
        problems.append(f"console errors: {console_errors}")
    if e.scripts:
        problems.append("the page holds a script")
    ranks = len(job_summary["ranks"])
    groups = re.search(r"(\d+) ranks in (\d+) groups", dom)
    rows = int(groups.group(2)) if groups else ranks
    for svg, count in e.rows.items():
        if count != rows:
            problems.append(f"{svg}: {count} bar rows, expected {rows}")
    if not e.timelines:
        problems.append("no timeline")
    streams = {r["rank"]: r["streams"] for r in job_summary["ranks"]}
    for rank, lanes in e.timelines.items():
        # One lane per stream: every stream of these jobs has ops inside the iteration.
        if lanes != streams[rank]:
            problems.append(f"rank {rank}: {lanes} GPU lanes, the trace has {streams[rank]} streams")
    if not streams_with_work(page):
        problems.append("lanes were hidden")
    for section in ("summary", "iteration", "breakdown", "timelines", "critical-path"):
        if f'id="{section}"' not in dom:
            problems.append(f"section {section} missing")
    print(f"{name}: {ranks} ranks, {rows} bar rows, timelines of ranks {sorted(e.timelines)} with GPU lanes "
          f"{[e.timelines[r] for r in sorted(e.timelines)]}")
    return problems


def with_selenium(browser, url, screenshot, script=None):
    """The DOM and the console errors of the page at `url` (and the value of `script`, a
    JavaScript expression run on the laid-out page, when given)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = browser
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument("--window-size=1400,1000")
    opts.add_argument("--user-data-dir=" + tempfile.mkdtemp(prefix="lumos-chromium-"))
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        driver.get(url)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, min(max(int(height), 600), 12000))
        driver.save_screenshot(str(screenshot))
        dom = driver.execute_script("return document.documentElement.outerHTML")
        value = driver.execute_script("return " + script) if script is not None else None
        errors = [m for m in driver.get_log("browser") if m.get("level") in ("SEVERE", "ERROR")]
        return (dom, errors) if script is None else (dom, errors, value)
    finally:
        driver.quit()


def with_browser(browser, url, screenshot):
    profile = tempfile.mkdtemp(prefix="lumos-chromium-")
    common = [browser, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    dump = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    subprocess.run([*common, "--window-size=1400,4000", f"--screenshot={screenshot}", url], capture_output=True, text=True,
                   timeout=120)
    # Chromium logs every console message as ":CONSOLE"; the page has no script, so any is a fault.
    errors = [line for line in dump.stderr.splitlines() if ":CONSOLE" in line]
    return dump.stdout, errors


def browser_or_skip(test):
    """The headless browser and whether Selenium drives it; without one, exits with 77 (CTest:
    skipped), or 1 under LUMOS_REQUIRE_BROWSER=1 (CI)."""
    browser = find_browser()
    if browser is None:
        print(f"{test}: skipped: no headless Chromium (Debian: apt-get install chromium chromium-driver python3-selenium)")
        sys.exit(1 if os.environ.get("LUMOS_REQUIRE_BROWSER") == "1" else 77)
    try:
        import selenium  # noqa: F401
        use_selenium = shutil.which("chromedriver") is not None
    except ImportError:
        use_selenium = False
    print(f"browser: {browser} ({'selenium + chromedriver' if use_selenium else '--dump-dom / --screenshot'})")
    return browser, use_selenium


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lumos", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("jobs", nargs="+")
    args = ap.parse_args()
    browser, use_selenium = browser_or_skip("report_browser")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failures = []
    ran = 0
    for job in args.jobs:
        path = Path(job)
        if not path.exists():
            message = f"{job}: not found"
            if os.environ.get("CI") == "true":
                failures.append(message)
            else:
                print(f"skipped: {message}")
            continue
        name = path.name
        page = out / f"{name}.html"
        subprocess.run([args.lumos, "report", job, "-o", page], check=True, capture_output=True)
        summary = json.loads(subprocess.run([args.lumos, "inspect", job, "--json"], check=True, capture_output=True, text=True).stdout)
        shot = out / f"{name}.png"
        load = with_selenium if use_selenium else with_browser
        dom, errors = load(browser, page.resolve().as_uri(), shot)
        problems = check_page(page.read_text(), dom, errors, summary, name)
        if not shot.is_file() or shot.stat().st_size < 10000:
            problems.append(f"no screenshot at {shot}")
        print(f"{name}: screenshot {shot}")
        failures += [f"{name}: {p}" for p in problems]
        ran += 1
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures or ran == 0 else 0)


if __name__ == "__main__":
    main()

"""Shared fixtures: the example job, the shared traces and the lumos CLI."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("LUMOS_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def trace_dir():
    for candidate in (os.environ.get("LUMOS_TRACE_DIR"), os.environ.get("LUMOS_DEFAULT_TRACE_DIR"), SOURCE.parent / "shared" / "traces"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def require_shared(name):
    """A shared trace directory; skipped where the traces are absent, a failure under CI=true."""
    root = trace_dir()
    path = root / name if root else None
    if path is None or not path.is_dir():
        message = f"shared trace {name} not found (set LUMOS_TRACE_DIR)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def example_job():
    return SOURCE / "examples" / "data" / "tiny_job"


@pytest.fixture(scope="session")
def megatron():
    return require_shared("astra-sim_megatron-gpt-tp8_8xA100")


@pytest.fixture(scope="session")
def cli():
    """Runs the lumos CLI and parses its --json output."""
    exe = os.environ.get("LUMOS_CLI") or shutil.which("lumos")
    if not exe:
        pytest.skip("the lumos CLI was not built (LUMOS_CLI unset)")

    def run(*args):
        out = subprocess.run([exe, *map(str, args)], check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    return run

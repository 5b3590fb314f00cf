"""Runs the pytest suite of the lumos Python package; exit code 77 (CTest: skipped) without pytest."""
import sys

try:
    import pytest
except ImportError:
    print("python_api: skipped: this Python has no pytest (Debian: apt-get install python3-pytest)")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))

"""Builds the extension module lumos._lumos with CMake (LUMOS_BUILD_PYTHON=ON), for the
interpreter running this build. Metadata lives in pyproject.toml. Needs no network: pybind11
comes from CMake's package search (Debian pybind11-dev), not from pip.

Environment: LUMOS_CMAKE_ARGS (extra CMake arguments), CMAKE_BUILD_PARALLEL_LEVEL (jobs)."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

# pip builds a wheel (and its metadata) with setuptools' bdist_wheel, which needs the `wheel`
# package; without build isolation pip does not install it, and setuptools would only say
# "invalid command 'bdist_wheel'".
if {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv):
    try:
        import wheel  # noqa: F401
    except ImportError:
        sys.exit("lumos: building the wheel needs the Python package 'wheel' for " + sys.executable +
                 ": install it (pip install wheel; Debian: apt-get install python3-wheel), or build with "
                 "build isolation (pip install .)")


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLUMOS_BUILD_PYTHON=ON", "-DLUMOS_BUILD_TESTS=OFF", "-DLUMOS_BUILD_EXAMPLES=OFF",
            "-DLUMOS_WERROR=OFF",  # a user's compiler may warn where CI's does not; CI builds with -Werror
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DLUMOS_PYTHON_OUTPUT_DIR={target_dir}",
        ]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("LUMOS_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "lumos_python"], check=True)


setup(ext_modules=[CMakeExtension("lumos._lumos")], cmdclass={"build_ext": CMakeBuild})

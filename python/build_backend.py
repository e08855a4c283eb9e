"""A PEP 517 build backend for the tessera Python package, with no build requirements.

`pip install ./python` works offline: pip's isolated build environment needs nothing from an index,
since this backend only runs the project's CMake (the `_tessera` target: pybind11 over the C API, built
with the interpreter pip runs) and writes the wheel itself (a zip with the package, the module and
its metadata). scikit-build-core does the same with more options, but it is not packaged for Debian 12
and PyPI may be out of reach.

config settings (pip install --config-settings KEY=VALUE):
  build-dir   a CMake build directory to use (an existing one of the project: only the module is built);
              default: python/build
  cmake-args  extra arguments for the CMake configure step, separated by spaces
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAME = "tessera"


def _version() -> str:
    text = open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(tessera[^)]*VERSION\s+([0-9.]+)", text)
    if not m:
        raise RuntimeError("could not read the project's version from CMakeLists.txt")
    return m.group(1)


def _tag() -> str:
    impl = "cp" + sysconfig.get_config_var("py_version_nodot")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{plat}"


def _metadata() -> str:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: tessera, an inference engine for diffusion language models\n"
            "Requires-Python: >=3.9\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _build_module(config_settings) -> str:
    cs = config_settings or {}
    build_dir = os.path.abspath(cs.get("build-dir") or os.path.join(HERE, "build"))
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DTESSERA_TESTS=OFF",
                "-DTESSERA_BENCH=OFF", f"-DPython_EXECUTABLE={sys.executable}"]
        if os.path.exists("/usr/bin/ninja"):
            args += ["-G", "Ninja"]
        args += (cs.get("cmake-args") or "").split()
        subprocess.run(args, check=True)
    subprocess.run(["cmake", "--build", build_dir, "--target", "_tessera", "-j", str(os.cpu_count() or 2)],
                   check=True)
    pkg = os.path.join(build_dir, "python", NAME)
    if not any(f.startswith("_tessera") and f.endswith(".so") for f in os.listdir(pkg)):
        raise RuntimeError(f"{pkg} has no _tessera module: pybind11 or the Python headers were not found "
                           "(apt install pybind11-dev python3-dev)")
    return pkg


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    pkg = _build_module(config_settings)
    version = _version()
    dist_info = f"{NAME}-{version}.dist-info"
    wheel_name = f"{NAME}-{version}-{_tag()}.whl"
    files = {}
    for f in sorted(os.listdir(os.path.join(HERE, NAME))):
        if f.endswith(".py"):
            files[f"{NAME}/{f}"] = open(os.path.join(HERE, NAME, f), "rb").read()
    for f in sorted(os.listdir(pkg)):
        if f.startswith("_tessera") and f.endswith(".so"):
            files[f"{NAME}/{f}"] = open(os.path.join(pkg, f), "rb").read()
    files[f"{dist_info}/METADATA"] = _metadata().encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: tessera build_backend\nRoot-Is-Purelib: false\n"
                                   f"Tag: {_tag()}\n").encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return wheel_name

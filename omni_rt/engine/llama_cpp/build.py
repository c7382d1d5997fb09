"""llama.cpp as the CPU thinker, part 1: build ``llama-server`` once from source and find the cached binary.

Part 2 is the managed process (``omni_rt.engine.llama_cpp.server.LlamaServer``), part 3 the scheduler that speaks
to it (``omni_rt.engine.llama_cpp.thinker``). This module stays free of httpx and engine imports, so
``python -m omni_rt.engine.llama_cpp build`` runs before anything else is installed.

Source: the MIT-licensed llama.cpp tree vendored in the ``llama-cpp-python`` sdist on PyPI (the only reachable
source; no binary downloads). Only the ``llama-server`` target is built (Release, static, ``-j 2``), logged to a
file, and cached in ``~/.cache/omni-rt/llama.cpp/<version>-<key>/`` where the key hashes what makes a binary
valid (source version, build flags, CPU arch and features: ``GGML_NATIVE`` uses this CPU's instructions).
A failed build leaves a ``FAILED`` marker next to its log so callers can tell "not built yet" from "cannot build".

Run ``python -m omni_rt.engine.llama_cpp build`` (``scripts/install.sh`` does) or ``... locate``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Sequence

from omni_rt.resources import cache_root

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist whose vendor/llama.cpp we build
BINARY_NAME = "llama-server"
# Static (one self-contained file to cache), no network at build time (no prebuilt web UI from a hub, no
# curl/openssl), no OpenMP (ggml's own thread pool, so ``--poll`` can stop idle spinning on shared cores).
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=OFF",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
_STAMP = "build.json"


_FAILED = "FAILED"


# ----------------------------------------------------------------------------------------------- locate/build
def _cpu_features() -> str:
    """The CPU's instruction-set flags (what a ``-march=native`` binary depends on), empty where unknown."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return ""


def build_key() -> str:
    """Hash of everything that makes a cached binary valid on this machine."""
    parts = [LLAMA_CPP_PYTHON_VERSION, *CMAKE_FLAGS, platform.system(), platform.machine(), _cpu_features()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def build_dir(root: str | os.PathLike | None = None) -> Path:
    """``<root>/<version>-<key>``; root defaults to ``$OMNI_RT_CACHE/llama.cpp`` (``~/.cache/omni-rt/llama.cpp``)."""
    base = Path(root) if root is not None else cache_root() / "llama.cpp"
    return base / f"{LLAMA_CPP_PYTHON_VERSION}-{build_key()}"


def locate_binary(root: str | os.PathLike | None = None) -> Path | None:
    """The cached ``llama-server`` if it is valid here, else None. ``OMNI_RT_LLAMA_SERVER`` names one explicitly."""
    explicit = os.environ.get("OMNI_RT_LLAMA_SERVER")
    if explicit and root is None:
        p = Path(explicit)
        return p if p.is_file() and os.access(p, os.X_OK) and _runs(p) else None
    d = build_dir(root)
    binary, stamp = d / BINARY_NAME, d / _STAMP
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return None
    try:
        if json.loads(stamp.read_text()).get("key") != build_key():
            return None
    except (OSError, ValueError):
        return None
    return binary if _runs(binary) else None


def _runs(binary: Path) -> bool:
    """``llama-server --version`` exits 0 (~50 ms): a copied cache or a changed libc/CPU cannot break serving."""
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_failed(root: str | os.PathLike | None = None) -> str | None:
    """The reason of the last failed build for this key (its marker's text), or None."""
    marker = build_dir(root) / _FAILED
    with contextlib.suppress(OSError):
        return marker.read_text().strip() or "build failed"
    return None


def _run_logged(cmd: Sequence[str], log_file, cwd: Path | None = None) -> None:
    log_file.write(f"\n$ {' '.join(map(str, cmd))}\n")
    log_file.flush()
    subprocess.run(list(map(str, cmd)), cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT, check=True)


def _fetch_source(work: Path, log_file) -> Path:
    """Download the sdist with pip (PyPI only) and extract just ``vendor/llama.cpp``."""
    _run_logged(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", work],
        log_file,
    )
    sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise RuntimeError(f"pip download left no llama_cpp_python sdist in {work}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdists[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(work, members=members, filter="data")
    return work / prefix


def build(root: str | os.PathLike | None = None, *, jobs: int = 2, force: bool = False) -> Path:
    """Build and cache ``llama-server`` (minutes, once); returns at once when the cache is valid.

    On failure writes the ``FAILED`` marker (reason + log path) and raises RuntimeError.
    """
    if not force and (found := locate_binary(root)) is not None:
        return found
    d = build_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    (d / _FAILED).unlink(missing_ok=True)
    log_path = d / "build.log"
    for tool in ("cmake", "ninja", "c++"):
        if shutil.which(tool) is None:
            reason = f"{tool} not found on PATH (apt-get install cmake ninja-build g++)"
            (d / _FAILED).write_text(reason)
            raise RuntimeError(reason)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".src-", dir=d))
    try:
        with open(log_path, "w") as lf:
            src = _fetch_source(work, lf)
            bdir = work / "build"
            _run_logged(["cmake", "-S", src, "-B", bdir, "-G", "Ninja", *CMAKE_FLAGS], lf)
            _run_logged(["cmake", "--build", bdir, "--target", BINARY_NAME, "-j", str(jobs)], lf)
            _run_logged([bdir / "bin" / BINARY_NAME, "--version"], lf)  # it runs on this CPU
            tmp = d / f".{BINARY_NAME}.tmp"
            shutil.copy2(bdir / "bin" / BINARY_NAME, tmp)
            os.replace(tmp, d / BINARY_NAME)
            stamp = {"key": build_key(), "version": LLAMA_CPP_PYTHON_VERSION, "flags": list(CMAKE_FLAGS),
                     "machine": platform.machine(), "seconds": round(time.monotonic() - t0, 1)}
            (d / _STAMP).write_text(json.dumps(stamp, indent=1))
    except (subprocess.CalledProcessError, OSError, RuntimeError, tarfile.TarError) as exc:
        (d / _FAILED).write_text(f"{exc}; see {log_path}")
        raise RuntimeError(f"llama.cpp build failed ({exc}); log: {log_path}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("built %s in %.0f s", d / BINARY_NAME, time.monotonic() - t0)
    return d / BINARY_NAME


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m omni_rt.engine.llama_cpp", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["build", "locate"])
    p.add_argument("--root", default=None, help="cache root (default ~/.cache/omni-rt/llama.cpp)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    if a.command == "locate":
        found = locate_binary(a.root)
        print(found or f"not built ({build_failed(a.root) or 'no build yet'}); expected in {build_dir(a.root)}")
        return 0 if found else 1
    t0 = time.monotonic()
    cached = locate_binary(a.root) is not None and not a.force
    if not cached:
        print(f"building llama-server from llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'s vendored llama.cpp "
              f"(once, a few minutes on 2 cores; log: {build_dir(a.root) / 'build.log'})", flush=True)
    try:
        path = build(a.root, jobs=a.jobs, force=a.force)
    except RuntimeError as exc:
        print(f"warning: {exc}; the CPU thinker falls back to PyTorch", file=sys.stderr)
        return 1
    print(f"llama-server {'cached' if cached else 'built'}: {path} ({time.monotonic() - t0:.1f} s)")
    return 0


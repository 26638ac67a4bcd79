"""The compiled CPU kernels (this folder's C++), built on first use and cached.

``load()`` returns ``torch.ops.pdserve_cpu`` (paged attention, KV store, packed linear,
RMSNorm / add+RMSNorm, rotary, SiLU·mul; docs/kernels.md) or ``None`` when they cannot be
used, after one log line saying why: no C++ compiler, the build failed, or
``PDSERVE_CPU_KERNELS=0``. Callers then take the plain-torch path.

The sources are compiled once per machine with ``torch.utils.cpp_extension`` for the widest
vector ISA torch itself uses here (``avx512``, ``avx2`` or ``default``; ``PDSERVE_CPU_ISA``
overrides), into ``$PDSERVE_KERNEL_CACHE`` or ``~/.cache/pdserve/kernels/<key>``, where the key
hashes the sources, the flags, the ISA and the torch version: a second process (or a second
test run) loads the cached library in milliseconds, and any change rebuilds it.

Libraries built ahead of time (an image's build stage: ``PDSERVE_KERNEL_CACHE=DIR python -m
kernels.cpu``) are found through ``$PDSERVE_KERNEL_PATH`` (folders separated by ``:``, read
only, searched before the cache), so a pod loads them at once and needs no compiler.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = (
    "ops.cpp",
    "decoder_layers.cpp",
    "attention.cpp",
    "gemm.cpp",
    "elementwise.cpp",
    "argmax.cpp",
    "greedy_head.cpp",
    "greedy_screen_i16.cpp",
    "pool.cpp",
)
HEADERS = (
    "kernels.h",
    "vec.h",
    "pool.h",
    "phase_timers.h",
    "tensor_args.h",
    "greedy_screen_i16.h",
)
ISA_FLAGS: dict[str, list[str]] = {
    "avx512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "default": [],
}
# GCC's generic tuning, on purpose: tuned for Zen 3 (what GCC 12 makes of -mtune=native on the
# project's Zen 4 VM) it folds a GEMM weight vector's load into the FMA of every row, six loads
# of it a k instead of one, and the decode GEMMs ran 1.35-1.65x slower (docs/benchmarks.md,
# 2026-12-08). So no -march=native or -mtune=native here.
BASE_FLAGS = ["-O3", "-pthread", "-fno-math-errno"]
DISABLE_ENV = "PDSERVE_CPU_KERNELS"
ISA_ENV = "PDSERVE_CPU_ISA"
CACHE_ENV = "PDSERVE_KERNEL_CACHE"
PATH_ENV = "PDSERVE_KERNEL_PATH"
SPIN_ENV = "PDSERVE_CPU_SPIN_US"
STALE_LOCK_S = 900.0


def detect_isa() -> str:
    """The ISA to build for: ``PDSERVE_CPU_ISA`` if set, else what torch dispatches to here."""
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced:
        if forced not in ISA_FLAGS:
            raise ValueError(f"{ISA_ENV} must be one of {', '.join(ISA_FLAGS)}; got {forced!r}")
        return forced
    capability = torch.backends.cpu.get_cpu_capability().upper()
    if capability.startswith("AVX512"):
        return "avx512"
    if capability == "AVX2":
        return "avx2"
    return "default"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdserve" / "kernels"


def prebuilt_dirs(key: str) -> list[Path]:
    """``<dir>/<key>`` for each folder of ``$PDSERVE_KERNEL_PATH``, in order."""
    return [Path(d) / key for d in os.environ.get(PATH_ENV, "").split(os.pathsep) if d]


def _is_complete(build_dir: Path, name: str) -> bool:
    return (build_dir / "complete").is_file() and (build_dir / f"{name}.so").is_file()


def is_built(key: str) -> bool:
    """The library for ``key`` is in the cache or a prebuilt folder (``load`` will not build)."""
    name = library_name(key)
    return any(_is_complete(d, name) for d in [cache_root() / key, *prebuilt_dirs(key)])


def build_key(isa: str) -> str:
    """Digest of everything the built library depends on."""
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((SOURCE_DIR / name).read_bytes())
    h.update(" ".join([*BASE_FLAGS, *ISA_FLAGS[isa]]).encode())
    h.update(torch.__version__.encode())
    return f"{isa}-{h.hexdigest()[:16]}"


def disabled_by_env() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "false", "no")


def check_spin_env() -> None:
    """``PDSERVE_CPU_SPIN_US`` (the kernels' pool: how long a waiting thread spins before it
    sleeps; kernels/cpu/pool.h) must be a number of microseconds >= 0 when set."""
    raw = os.environ.get(SPIN_ENV, "")
    if not raw:
        return
    try:
        ok = float(raw) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{SPIN_ENV} must be a number of microseconds >= 0; got {raw!r}")


def _compiler() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    return shutil.which(cxx)


def library_name(key: str) -> str:
    return f"pdserve_cpu_{key.replace('-', '_')}"


@functools.cache
def load() -> Any | None:
    """``torch.ops.pdserve_cpu`` with the kernels registered, or ``None`` (logged once)."""
    if disabled_by_env():
        logger.info("CPU kernels disabled by %s=0: using the torch path", DISABLE_ENV)
        return None
    check_spin_env()
    isa = detect_isa()
    key = build_key(isa)
    name = library_name(key)
    prebuilt = [d for d in prebuilt_dirs(key) if _is_complete(d, name)]
    if not prebuilt and _compiler() is None and not os.environ.get(ISA_ENV):
        # Nothing to build with: a narrower ISA built ahead of time still beats the torch path.
        narrower = list(ISA_FLAGS)[list(ISA_FLAGS).index(isa) + 1 :]
        for other in narrower:
            k = build_key(other)
            found = [d for d in prebuilt_dirs(k) if _is_complete(d, library_name(k))]
            if found:
                isa, key, name, prebuilt = other, k, library_name(k), found
                break
    build_dir = prebuilt[0] if prebuilt else cache_root() / key
    built = build_dir / f"{name}.so"
    t0 = time.perf_counter()
    failed = build_dir / "build-error.log"
    if _is_complete(build_dir, name):
        # Built before (ahead of time, or by this or another process) and finished: no
        # compiler or ninja needed.
        torch.ops.load_library(str(built))
    elif failed.is_file():
        # The same sources, flags and torch failed before; building again would fail again.
        logger.warning(
            "CPU kernels failed to build before (%s): using the torch path; delete %s to retry",
            failed,
            build_dir,
        )
        return None
    elif _compiler() is None:
        logger.warning(
            "no C++ compiler found (%s): CPU kernels off, using the slower torch path "
            "(install g++, e.g. `apt-get install build-essential`, to get them)",
            os.environ.get("CXX", "c++"),
        )
        return None
    else:
        try:
            _build(name, isa, build_dir)
        except Exception as e:  # a failed build must never take the engine down
            failed.write_text(f"{type(e).__name__}: {e}\n")
            logger.warning(
                "CPU kernels failed to build (compiler output in %s): using the torch path",
                failed,
            )
            return None
    ops = torch.ops.pdserve_cpu
    logger.info(
        "CPU kernels ready (%s, %s) in %.1f s from %s",
        ops.isa(),
        key,
        time.perf_counter() - t0,
        build_dir,
    )
    return ops


def _build(name: str, isa: str, build_dir: Path) -> None:
    """Compile and load the library (``cpp_extension`` locks the folder against concurrent
    builders), then mark the folder complete for the next process."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    # cpp_extension waits for as long as another builder's lock file exists; one left behind by
    # a killed build (a build takes a minute or two) would block every later start.
    lock = build_dir / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        logger.warning("removing a stale build lock %s", lock)
        lock.unlink(missing_ok=True)
    logger.info("building the CPU kernels (%s) in %s, once per machine", isa, build_dir)
    cpp_extension.load(
        name=name,
        sources=[str(SOURCE_DIR / s) for s in SOURCES],
        extra_cflags=[*BASE_FLAGS, *ISA_FLAGS[isa]],
        extra_ldflags=["-pthread"],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    (build_dir / "complete").write_text(f"{name}\n")

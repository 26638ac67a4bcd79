"""Build a benchmark's stand-alone C++ probe (``fma_peak.cpp``, ``decode_item_model.cpp``) with
the compiled CPU kernels' compiler, ISA flags and vector type (``kernels/cpu/vec.h``), once per
source, flags and compiler, into the kernels' cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path


def build_probe(source: Path) -> Path | None:
    """The binary of ``source``, built now unless the cache has it, or None without a
    compiler. Parallel builds of the same probe (test workers) each write their own file and
    rename it into place, so none sees another's half-written binary."""
    from kernels.cpu import BASE_FLAGS, ISA_FLAGS, SOURCE_DIR, cache_root, detect_isa

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    flags = [*BASE_FLAGS, *ISA_FLAGS[detect_isa()], f"-I{SOURCE_DIR}"]
    h = hashlib.sha256(source.read_bytes())
    h.update((SOURCE_DIR / "vec.h").read_bytes())
    h.update(" ".join([cxx, *flags]).encode())
    binary = cache_root() / "probes" / f"{source.stem}-{h.hexdigest()[:16]}"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
        try:
            subprocess.run([cxx, *flags, str(source), "-o", str(tmp)], check=True)
            tmp.replace(binary)
        finally:
            tmp.unlink(missing_ok=True)
    return binary

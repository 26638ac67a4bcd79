"""Running a benchmark's command line, for the benchmarks' smoke tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str, timeout_s: float = 300) -> str:
    """The standard output of ``python benchmarks/SCRIPT ARGS`` run from the repository root;
    raises CalledProcessError if it fails."""
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    ).stdout

"""Running Python code in a fresh interpreter from the repository root, for tests that need a
process of their own (what it imports at start, environment variables read once, a build)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_python(
    code: str, *args: str, timeout_s: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` (CODE dedented) with the repository on ``PYTHONPATH`` and ``env``
    added to this process's environment; its output captured as text. Never raises on failure:
    the caller checks ``returncode``."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )

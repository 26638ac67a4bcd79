"""The compiled CPU kernels for the tests: built (or loaded from the cache) once per process.

Missing kernels fail the tests instead of skipping them, unless ``PDSERVE_CPU_KERNELS=0`` asks
for the torch path: CI installs a compiler (tests/ci/install.sh), so a build failure there is a
bug, not an environment to tolerate.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernels.cpu import DISABLE_ENV, disabled_by_env, load


def cpu_ops() -> Any:
    if disabled_by_env():
        pytest.skip(f"{DISABLE_ENV}=0: compiled CPU kernels disabled")
    ops = load()
    if ops is None:
        pytest.fail("the compiled CPU kernels did not build (see the log line of kernels.cpu)")
    return ops

"""Fault tests: real router and worker processes on loopback, faults injected for real
(cancellations, SIGSTOP, SIGKILL, SIGTERM). Each test ends with every pool fully free."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_ARCHS


@pytest.fixture(scope="session")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])

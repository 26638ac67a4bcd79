"""One server per mode per test process (xdist worker) for every module that needs the
standard configuration: tests in one process run one at a time, so each may assert that the
whole KV pool is free; starting a server is the slow part of these tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TINY_ARCHS
from tests.router.server_harness import Server, start_server

MAX_MODEL_LEN = 1024
NUM_KV_BLOCKS = 64  # 64 x 16 = 1024 tokens: one request at max_model_len fills the pool


@pytest.fixture(scope="session")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture(scope="session", params=["colocated", "disaggregated"])
def server(request: pytest.FixtureRequest, llama: Path) -> Iterator[Server]:
    """Every API test runs against both modes: one engine in the router process, and router +
    prefill worker + decode worker processes with the KV moving over TCP."""
    colocated = request.param == "colocated"
    extra = [] if colocated else ["--kv-transport", "tcp"]
    s = start_server(
        llama,
        "--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN), *extra,
        colocated=colocated,
    )  # fmt: skip
    yield s
    assert s.stop() == 0, "".join(s.lines)
    assert "pdserve: stopped" in "".join(s.lines)

"""One colocated server per test process (xdist worker) for every module that needs the
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


@pytest.fixture(scope="session")
def server(llama: Path) -> Iterator[Server]:
    s = start_server(
        llama, "--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN)
    )
    yield s
    assert s.stop() == 0, "".join(s.lines)
    assert "pdserve: stopped" in "".join(s.lines)

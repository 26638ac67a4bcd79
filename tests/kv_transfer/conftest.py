from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The repository (for `kv_transfer`, `engine`, `protos`) and this folder (for `kv_harness`,
# which spawned worker processes import by name) must be importable whatever the import mode.
for path in (REPO_ROOT, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kv_harness import SPEC  # noqa: E402  (after the path set-up above)

T = TypeVar("T")
SRC_BLOCKS = 32  # blocks of the prefill side's pool in the tests


class LoopThread:
    """One event loop for the whole session, in a thread: UCX attaches its progress to a loop,
    so the tests must not create and close a loop per test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="session")
def aio() -> Iterator[LoopThread]:
    runner = LoopThread()
    yield runner
    runner.close()


@pytest.fixture
def src_pool() -> Any:
    """The prefill side's pool: ``SRC_BLOCKS`` blocks of seeded random values."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    return torch.randn(SPEC.pool_shape(SRC_BLOCKS), generator=generator)

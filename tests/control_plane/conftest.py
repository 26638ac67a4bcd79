from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_harness import RedisServer, redis_server


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as server:
        yield server

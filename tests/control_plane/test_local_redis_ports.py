"""The ports pdserve picks for the servers it starts itself (``pdserve.ports``), and the local
redis-server's start when its drawn port is taken before it binds it (a real redis-server)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
import redis

from pdserve import ports
from pdserve.local_redis import RedisServer


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = ports.ephemeral_low()
    drawn = ports.free_ports(8)
    assert len(set(drawn)) == 8
    for port in drawn:
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_drawn_port_taken_before_start_draws_another(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()  # redis-server fails to bind it and exits at once
        server.start()
        try:
            assert server.port != taken
            client = redis.Redis.from_url(server.url)
            assert client.ping()
            client.close()
        finally:
            server.stop()


def test_a_given_port_that_is_taken_fails_clearly(tmp_path: Path) -> None:
    (port,) = ports.free_ports(1)
    server = RedisServer(tmp_path, port=port)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(RuntimeError, match=f"redis-server on port {port} exited"):
            server.start()
    assert server.port == port
    server.stop()


def _draw(count: int) -> list[int]:
    return ports.free_ports(count)


def test_draws_that_run_at_once_never_hand_out_the_same_port() -> None:
    # Four processes drawing 100 ports each from a 12,000-port span would share about seven
    # ports by chance alone; the machine-wide reservation leaves them none.
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        draws = pool.map(_draw, [100] * 4)
    every = [port for drawn in draws for port in drawn]
    assert len(every) == 400
    assert len(set(every)) == 400


def test_a_reservation_holds_a_port_until_it_is_stale() -> None:
    (port,) = ports.free_ports(1)
    claim = Path(tempfile.gettempdir()) / "pdserve-ports" / str(port)
    assert claim.exists()
    with ports._Reservations() as reservations:
        assert not reservations.claim(port)
        stale = time.time() - ports.HOLD_S - 1
        os.utime(claim, (stale, stale))
        assert reservations.claim(port)  # and the claim is fresh again
        assert not reservations.claim(port)

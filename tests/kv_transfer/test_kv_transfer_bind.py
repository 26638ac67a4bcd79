"""Defect 9 of issue 12: the KV listeners bind the configured host (127.0.0.1 by default, like
every host default), never every interface of the machine."""

from __future__ import annotations

import pytest
from kv_harness import ChildDecode

from kv_transfer import is_ucx_available
from tests.sockets import is_loopback, listening_addresses


@pytest.mark.parametrize(
    "transport",
    [
        "tcp",
        pytest.param(
            "ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
        ),
    ],
)
def test_kv_receiver_listens_on_loopback_only(transport: str) -> None:
    child = ChildDecode(transport, 30.0)
    try:
        addresses = listening_addresses(child.process.pid)  # type: ignore[arg-type]
    finally:
        child.close()
    assert addresses, "the receiver listens nowhere"
    assert all(is_loopback(a) for a in addresses), addresses

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


def test_interface_of_a_host() -> None:
    from kv_transfer.netif import interface_of

    lo = interface_of("127.0.0.1")
    assert lo is not None and interface_of("localhost") == lo and interface_of("127.0.0.9") == lo
    assert interface_of("0.0.0.0") is None and interface_of("::") is None
    with pytest.raises(ValueError, match="no network interface"):
        interface_of("192.0.2.254")  # TEST-NET-1: on no interface of a test machine

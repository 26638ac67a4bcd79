"""A client's request id over gRPC, in every mode: one request per id at a time (a second one
while the first streams gets ALREADY_EXISTS naming the field, and the first is untouched), the
id is free again as soon as the first has ended, whether it finished or failed, and an id too
long or with control characters is refused naming the field."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import grpc
import pytest

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.router.server_harness import Server

pytestmark = pytest.mark.timeout(300)


def _request(rid: str, max_tokens: int) -> pb.GenerateRequest:
    params = pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return pb.GenerateRequest(
        request_id=rid, token_ids=pb.TokenIds(ids=[5, 6, 7, 8]), sampling_params=params
    )


def _tokens(msgs: Iterator[pb.GenerateResponse]) -> list[int]:
    return [t for m in msgs for t in m.token_ids]


def _cancel_then_retry(stub: pb_grpc.GenerationServiceStub, rid: str, expected: list[int]) -> None:
    """Start a long stream with ``rid``, cancel it after its first message, and send ``rid``
    again at once until it is served (ALREADY_EXISTS while the router has not seen the cancel):
    the retry's tokens are ``expected``."""
    long = stub.Generate(_request(rid, 1000), timeout=60)
    next(long)
    long.cancel()
    for _ in range(50):
        try:
            assert _tokens(stub.Generate(_request(rid, 6), timeout=60)) == expected
            return
        except grpc.RpcError as e:  # the cancel had not reached the router yet
            assert e.code() == grpc.StatusCode.ALREADY_EXISTS, e
            time.sleep(0.1)
    pytest.fail("the id stayed in flight after its request was cancelled")


def _conflicts(server: Server) -> float:
    text = server.get("/metrics", timeout=10).text
    found = re.findall(r'^pdserve_request_rejected_total\{[^}]*reason="conflict"[^}]*\} (\S+)$',
                       text, re.MULTILINE)  # fmt: skip
    return sum(float(v) for v in found)


def test_a_second_request_with_an_id_in_flight_is_refused_and_the_first_finishes(
    server: Server, stub: pb_grpc.GenerationServiceStub
) -> None:
    expected = _tokens(stub.Generate(_request("reference", 1000), timeout=120))
    assert len(expected) == 1000
    before = _conflicts(server)
    first = stub.Generate(_request("shared-id", 1000), timeout=120)
    got = list(next(first).token_ids)  # the first streams: its id is in flight
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(_request("shared-id", 4), timeout=60))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS, info.value
    assert "request_id: request 'shared-id' is already in flight" in (info.value.details() or "")
    got += _tokens(first)
    assert got == expected  # untouched by the refused one: every token, in order
    assert _conflicts(server) == before + 1
    server.wait_pool_free()


def test_an_id_is_free_again_once_its_request_ended(
    server: Server, stub: pb_grpc.GenerationServiceStub
) -> None:
    expected = _tokens(stub.Generate(_request("again", 6), timeout=60))
    for _ in range(3):
        assert _tokens(stub.Generate(_request("again", 6), timeout=60)) == expected
    # Cancelled by its client: a retry that comes after the cancel reached the router waits
    # for the request's calls to end and is served; one that overtakes the cancel itself (the
    # server has not seen it yet) is told ALREADY_EXISTS and served when it tries again.
    _cancel_then_retry(stub, "again", expected)
    server.wait_pool_free()


def test_a_retry_straight_after_its_own_cancel_is_served(
    server: Server, stub: pb_grpc.GenerationServiceStub
) -> None:
    """The client cancels a stream and at once sends the same id again, eight times: every
    retry is served with the same tokens. A retry that overtakes its own cancel (the router has
    not seen the cancel yet) is told ALREADY_EXISTS and served when it tries again."""
    expected = _tokens(stub.Generate(_request("retried", 6), timeout=60))
    for _ in range(8):
        _cancel_then_retry(stub, "retried", expected)
    server.wait_pool_free()


@pytest.mark.parametrize(
    ("rid", "message"),
    [
        ("x" * 257, "request_id is 257 characters; at most 256"),
        ("y" * 2_000_000, "request_id is 2000000 characters; at most 256"),
        ("line\nbreak", "request_id must be printable characters"),
        ("nul\x00", "request_id must be printable characters"),
    ],
    ids=["257 chars", "2M chars", "newline", "nul"],
)
def test_a_bad_request_id_is_refused_naming_it(
    server: Server, stub: pb_grpc.GenerationServiceStub, rid: str, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(_request(rid, 4), timeout=60))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert message in (info.value.details() or "")
    # the longest id allowed, printable beyond ASCII, still serves
    assert len(_tokens(stub.Generate(_request("é✓ " + "z" * 253, 4), timeout=60))) == 4
    server.wait_pool_free()

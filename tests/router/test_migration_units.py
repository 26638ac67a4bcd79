"""``router.migration`` without processes: which worker answers migrate and under which
reason, the limit, and the errors a client gets when migration is exhausted or impossible."""

from __future__ import annotations

import grpc
import pytest

from router.cluster_router import Target
from router.errors import ErrorKind, RequestError
from router.migration import Migrations, MigrationStats, WorkerFailure, failure_reason
from router.worker_errors import request_error


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


DECODE = Target("d1", "decode", "127.0.0.1:1", None)


@pytest.mark.parametrize(
    ("code", "details", "reason"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", "worker_lost"),
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", "worker_lost"),
        (grpc.StatusCode.UNAVAILABLE, "the decode worker is shutting down (draining): …", "drain"),
        (grpc.StatusCode.UNAVAILABLE, "KV transfer for x ended before completion: expired",
         "worker_error"),
        (grpc.StatusCode.UNAVAILABLE, "Stream removed", "worker_lost"),
        (grpc.StatusCode.CANCELLED, "", "worker_error"),
        (grpc.StatusCode.UNAVAILABLE, "request x failed", "worker_error"),
    ],
)  # fmt: skip
def test_lost_requests_are_worker_failures(
    code: grpc.StatusCode, details: str, reason: str
) -> None:
    e = request_error(_RpcError(code, details), DECODE)
    assert isinstance(e, WorkerFailure) and e.kind is ErrorKind.UNAVAILABLE
    assert (e.reason, e.worker_id) == (reason, "d1")
    assert failure_reason(details) == reason or code == grpc.StatusCode.CANCELLED


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorKind.BUSY),
        (grpc.StatusCode.DEADLINE_EXCEEDED, ErrorKind.TIMEOUT),
        (grpc.StatusCode.INTERNAL, ErrorKind.UNAVAILABLE),
    ],
)
def test_judged_requests_do_not_migrate(code: grpc.StatusCode, kind: ErrorKind) -> None:
    e = request_error(_RpcError(code, "no"), DECODE)
    assert isinstance(e, RequestError) and not isinstance(e, WorkerFailure) and e.kind is kind
    assert isinstance(request_error(_RpcError(grpc.StatusCode.INVALID_ARGUMENT, "x"), DECODE),
                      ValueError)  # fmt: skip


def test_the_limit_counts_by_phase_and_reason_then_names_every_failure() -> None:
    stats = MigrationStats()
    m = Migrations(2, stats)
    stall = WorkerFailure("decode worker a stalled", "stall", "a")
    m.begin(stall, "decode")
    m.begin(WorkerFailure("prefill worker p: UNAVAILABLE", "worker_lost", "p"), "prefill")
    assert stats.migrations == {("decode", "stall"): 1, ("prefill", "worker_lost"): 1}
    with pytest.raises(RequestError) as info:
        m.begin(WorkerFailure("decode worker b: UNAVAILABLE: Socket closed", "worker_lost"),
                "decode")  # fmt: skip
    e = info.value
    assert e.kind is ErrorKind.UNAVAILABLE and not isinstance(e, WorkerFailure)
    assert "migrated 2 times already (--migration-limit 2" in e.message
    assert "decode/stall, prefill/worker_lost, decode/worker_lost" in e.message
    assert stats.exhausted == 1 and m.count == 2


def test_limit_zero_fails_with_the_workers_own_error() -> None:
    stats = MigrationStats()
    stall = WorkerFailure("decode worker a stalled: no token or heartbeat for 4s", "stall")
    with pytest.raises(WorkerFailure) as info:
        Migrations(0, stats).begin(stall, "decode")
    assert info.value is stall and not stats.migrations and stats.exhausted == 1
    with pytest.raises(ValueError, match="--migration-limit"):
        Migrations(-1, stats)


def test_impossible_names_the_failure_and_why() -> None:
    stats = MigrationStats()
    m = Migrations(3, stats)
    failure = WorkerFailure("decode worker a stalled", "stall", "a")
    m.begin(failure, "decode")
    why = RequestError(ErrorKind.UNAVAILABLE, "no decode worker is available (2 known, 0 ...)")
    e = m.impossible(failure, why)
    assert e.kind is ErrorKind.UNAVAILABLE
    assert e.message == (
        "decode worker a stalled; migrating the request failed (attempt 1 of 3): "
        "no decode worker is available (2 known, 0 ...)"
    )
    assert stats.exhausted == 1

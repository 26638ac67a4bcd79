"""How the router reads a worker's gRPC failure: a ``RequestError`` for the client, or a
``WorkerFailure`` (router.migration) when another worker may take the request over."""

from __future__ import annotations

import grpc

from router.cluster_router import Target
from router.errors import ErrorKind, RequestError
from router.migration import WorkerFailure, failure_reason

# Before its first message a decode worker that answers these has not started the request.
REFUSALS = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)

# A worker that answers these has lost the request, not judged it: another may serve it.
_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)


class Refused(Exception):
    """A decode worker refused the request before starting it (the caller tries the next)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def request_error(e: grpc.aio.AioRpcError, worker: Target) -> Exception:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestError(ErrorKind.BUSY, details, retry_after_s=1.0)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestError(ErrorKind.TIMEOUT, details)
    if code == grpc.StatusCode.CANCELLED:
        return WorkerFailure(
            f"the {worker.role} worker {worker.address} cancelled it",
            "worker_error",
            worker.worker_id,
        )
    message = f"{worker.role} worker {worker.address}: {code.name}: {details}"
    if code in _LOST:
        return WorkerFailure(message, failure_reason(details), worker.worker_id)
    return RequestError(ErrorKind.UNAVAILABLE, message)

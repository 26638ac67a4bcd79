"""Request migration: when the worker serving a request fails, the request continues on
another one with no token lost or repeated.

    decode stream / prefill call fails ─▶ WorkerFailure(reason)  (stall, drain, worker_lost,
                                                                   worker_error)
        ─▶ Migrations.begin: within --migration-limit? count pdserve_migrations_total
           {phase, reason}; else UNAVAILABLE naming the reason and the attempts
        ─▶ the backend re-routes prompt + the tokens already streamed (a new decode
           reservation, a prefill worker or local prefill; the workers resume the request from
           those tokens: engine.resume) and keeps streaming into the same accumulator

Phase: ``prefill`` when the failed attempt had streamed no token yet (queued, prefilling,
transferring KV), ``decode`` after. A failure the client caused or that another worker would
repeat (bad input, an abort, a deadline) is never migrated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from router.errors import ErrorKind, RequestError

DEFAULT_MIGRATION_LIMIT = 3
REASONS = ("stall", "drain", "worker_lost", "worker_error")
PHASES = ("prefill", "decode")


class WorkerFailure(RequestError):
    """A worker failed a request it had accepted (UNAVAILABLE); migratable. ``reason``: one
    of ``REASONS``; ``worker_id``: the worker to avoid when re-routing ("" for none)."""

    def __init__(self, message: str, reason: str, worker_id: str = "") -> None:
        super().__init__(ErrorKind.UNAVAILABLE, message)
        assert reason in REASONS, reason
        self.reason = reason
        self.worker_id = worker_id


_CONNECTION_LOST = ("socket", "connect", "stream removed", "reset", "goaway", "broken pipe")


def failure_reason(details: str) -> str:
    """The reason of a worker's UNAVAILABLE/CANCELLED/UNKNOWN answer, from its message:
    ``worker_lost`` only when the connection itself went (the router then avoids the worker
    for a few seconds); a worker that answered (it lost the request's KV or lease, it
    cancelled it) is ``worker_error`` and stays routable."""
    if "shutting down" in details or "draining" in details:
        return "drain"
    lowered = details.lower()
    if "KV transfer" not in details and any(p in lowered for p in _CONNECTION_LOST):
        return "worker_lost"
    return "worker_error"


@dataclass
class MigrationStats:
    """Counts for the router's metrics (read at scrape time)."""

    migrations: Counter[tuple[str, str]] = field(default_factory=Counter)  # (phase, reason)
    exhausted: int = 0  # requests failed because the limit was reached or no worker was left


class Migrations:
    """One request's migrations: how many so far and whether another is allowed."""

    def __init__(self, limit: int, stats: MigrationStats) -> None:
        if limit < 0:
            raise ValueError(f"--migration-limit must be >= 0, got {limit}")
        self.limit = limit
        self.count = 0
        self._stats = stats
        self._history: list[str] = []

    def begin(self, failure: WorkerFailure, phase: str) -> None:
        """Allow one more migration after ``failure`` or raise the request's final error."""
        self._history.append(f"{phase}/{failure.reason}")
        if self.count >= self.limit:
            self._stats.exhausted += 1
            if self.limit == 0:
                raise failure
            raise RequestError(
                ErrorKind.UNAVAILABLE,
                f"{failure.message}; the request was migrated {self.count} times already "
                f"(--migration-limit {self.limit}; failures: {', '.join(self._history)})",
            )
        self.count += 1
        self._stats.migrations[(phase, failure.reason)] += 1

    def impossible(self, failure: WorkerFailure, why: RequestError) -> RequestError:
        """The error when no worker can take the request over (e.g. none is left)."""
        self._stats.exhausted += 1
        return RequestError(
            ErrorKind.UNAVAILABLE,
            f"{failure.message}; migrating the request failed (attempt {self.count} of "
            f"{self.limit}): {why.message}",
        )

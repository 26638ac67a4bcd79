"""The least loaded worker of each pool, ignoring caches: decode by the share of its KV blocks
in use (then active requests), prefill by queued prefill tokens (then active requests); worker
id breaks the last ties, so the ranking is a function of the candidates, not of their order.

Two things make it cheap on a 1,000-worker pool (the cluster simulator asks tens of thousands
of times a simulated hour), neither changing a ranking:

* it is built by one stable sort per key, least significant key first (worker id, then
  active requests, then the load): the order of sorting by the (load, active, id) tuple, with
  each sort's keys fetched by ``operator.attrgetter`` and compared as plain floats, ints or
  strings: no Python call per comparison;
* a pool's ranking is a function of its candidates alone, and candidates are frozen: called
  again with the very same candidate objects (the simulator's polled view hands one list to
  every decision of a poll interval), it gives the last ranking again without sorting. The
  router builds fresh candidates per request: the check fails at the first one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter, is_
from typing import Generic, TypeVar

from router.routing.policy import NoWorkerError, RouteCandidate, RouteChoice, RouteRequest

_WORKER_ID = attrgetter("worker_id")
_ACTIVE = attrgetter("num_active_requests")
_QUEUED = attrgetter("num_queued_prefill_tokens")

R = TypeVar("R")


def decode_load(c: RouteCandidate) -> float:
    return c.num_used_blocks / max(1, c.num_blocks)


def rank_decode(pool: Sequence[RouteCandidate]) -> tuple[tuple[str, float], ...]:
    """(worker id, load) by (load, active requests, worker id)."""
    by_active = sorted(pool, key=_WORKER_ID)
    by_active.sort(key=_ACTIVE)
    # decode_load, inline (a call per worker would be most of the cost)
    loads = [c.num_used_blocks / (c.num_blocks if c.num_blocks > 1 else 1) for c in by_active]
    order = sorted(range(len(loads)), key=loads.__getitem__)
    return tuple([(by_active[i].worker_id, loads[i]) for i in order])


def rank_prefill(pool: Sequence[RouteCandidate]) -> tuple[str, ...]:
    """Worker ids by (queued prefill tokens, active requests, worker id)."""
    ranked = sorted(pool, key=_WORKER_ID)
    ranked.sort(key=_ACTIVE)
    ranked.sort(key=_QUEUED)
    return tuple([c.worker_id for c in ranked])


class LastRanking(Generic[R]):
    """``rank``'s last answer, given again while it is asked about the very same candidate
    objects in the same order (the same frozen objects: the same loads)."""

    def __init__(self, rank: Callable[[Sequence[RouteCandidate]], R]) -> None:
        self._rank = rank
        self._of: tuple[RouteCandidate, ...] = ()
        self._answer: R | None = None

    def __call__(self, pool: Sequence[RouteCandidate]) -> R:
        of = self._of
        if self._answer is None or len(pool) != len(of) or not all(map(is_, pool, of)):
            self._answer = self._rank(pool)
            self._of = tuple(pool)
        return self._answer


class LeastLoadedPolicy:
    name = "least_loaded"

    def __init__(self, local_prefill_max_tokens: int = 0) -> None:
        self._local_max = local_prefill_max_tokens
        self._decode = LastRanking(rank_decode)
        self._prefill = LastRanking(rank_prefill)

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        if not decode:
            raise NoWorkerError("no decode worker is available")
        ranking = self._decode(decode)
        if not prefill or request.num_prompt_tokens <= self._local_max:
            return RouteChoice(ranking, None, "local_prefill")
        prefill_ranking = self._prefill(prefill)
        return RouteChoice(ranking, prefill_ranking[0], "load", prefill_ranking)

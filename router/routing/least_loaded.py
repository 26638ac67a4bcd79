"""The least loaded worker of each pool, ignoring caches: decode by the share of its KV blocks
in use (then active requests), prefill by queued prefill tokens (then active requests); worker
id breaks the last ties, so the ranking is a function of the candidates, not of their order.

The ranking is built by one stable sort per key, least significant key first (worker id, then
active requests, then the load): the order of sorting by the (load, active, id) tuple, with
each sort's keys fetched by ``operator.attrgetter`` and compared as plain floats, ints or
strings, so a 1,000-worker pool costs no Python call per comparison (the cluster simulator
asks tens of thousands of times a simulated hour).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from router.routing.policy import NoWorkerError, RouteCandidate, RouteChoice, RouteRequest

_WORKER_ID = attrgetter("worker_id")
_ACTIVE = attrgetter("num_active_requests")
_QUEUED = attrgetter("num_queued_prefill_tokens")


def decode_load(c: RouteCandidate) -> float:
    return c.num_used_blocks / max(1, c.num_blocks)


class LeastLoadedPolicy:
    name = "least_loaded"

    def __init__(self, local_prefill_max_tokens: int = 0) -> None:
        self._local_max = local_prefill_max_tokens

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        if not decode:
            raise NoWorkerError("no decode worker is available")
        by_active = sorted(decode, key=_WORKER_ID)
        by_active.sort(key=_ACTIVE)
        # decode_load, inline (a call per worker is most of the cost)
        loads = [c.num_used_blocks / (c.num_blocks if c.num_blocks > 1 else 1) for c in by_active]
        order = sorted(range(len(loads)), key=loads.__getitem__)
        ranking = tuple([(by_active[i].worker_id, loads[i]) for i in order])
        if not prefill or request.num_prompt_tokens <= self._local_max:
            return RouteChoice(ranking, None, "local_prefill")
        pre = sorted(prefill, key=_WORKER_ID)
        pre.sort(key=_ACTIVE)
        pre.sort(key=_QUEUED)
        prefill_ranking = tuple([c.worker_id for c in pre])
        return RouteChoice(ranking, prefill_ranking[0], "load", prefill_ranking)

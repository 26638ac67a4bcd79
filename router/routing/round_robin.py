"""Every worker in turn, whatever its load or cache: the baseline."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from operator import attrgetter

from router.routing.policy import NoWorkerError, RouteCandidate, RouteChoice, RouteRequest

_WORKER_ID = attrgetter("worker_id")  # a C-level key: no Python call per comparison


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self, local_prefill_max_tokens: int = 0) -> None:
        self._local_max = local_prefill_max_tokens
        self._decode = itertools.count()
        self._prefill = itertools.count()

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        if not decode:
            raise NoWorkerError("no decode worker is available")
        ordered = sorted(decode, key=_WORKER_ID)
        start = next(self._decode) % len(ordered)
        ranking = tuple([(c.worker_id, 0.0) for c in ordered[start:] + ordered[:start]])
        if not prefill or request.num_prompt_tokens <= self._local_max:
            return RouteChoice(ranking, None, "local_prefill")
        pre = sorted(prefill, key=_WORKER_ID)
        p = next(self._prefill) % len(pre)
        prefill_ranking = tuple([c.worker_id for c in pre[p:] + pre[:p]])
        return RouteChoice(ranking, prefill_ranking[0], "round_robin", prefill_ranking)

"""The least loaded worker of each pool, ignoring caches: decode by the share of its KV blocks
in use (then active requests), prefill by queued prefill tokens (then active requests)."""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.policy import NoWorkerError, RouteCandidate, RouteChoice, RouteRequest


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
        ranked = sorted(decode, key=lambda c: (decode_load(c), c.num_active_requests, c.worker_id))
        ranking = tuple((c.worker_id, decode_load(c)) for c in ranked)
        if not prefill or request.num_prompt_tokens <= self._local_max:
            return RouteChoice(ranking, None, "local_prefill")
        pre = sorted(
            prefill,
            key=lambda c: (c.num_queued_prefill_tokens, c.num_active_requests, c.worker_id),
        )
        order = tuple(c.worker_id for c in pre)
        return RouteChoice(ranking, order[0], "load", order)

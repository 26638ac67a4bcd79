"""KV-aware routing: the (decode, prefill) pair that minimises the work the request adds,
counting what each worker already caches, with a share cap and conditional disaggregation.

Costs, in KV blocks (B = the prompt's blocks, hit_w = leading blocks worker w caches):

    decode d         used_d + transfer_scale x (B - hit_d)              (blocks to receive)
    prefill p        prefill_load_scale x ((B - hit_p) + queued_tokens_p / block_size)
    local on d       used_d + prefill_load_scale x local_prefill_scale x (B - hit_d)

Conditional disaggregation: a decode worker is *eligible* to prefill the prompt itself when
the uncached part is short (B - hit_d <= local_prefill_max_blocks) or it holds most of the
prompt (hit_d >= local_prefill_hit_ratio x B). The cheapest decode worker prefills locally
whenever it is eligible; another eligible one does when its local cost beats the best pair.
The pair's cost is the sum (the two choices are independent, so each pool's cheapest is
taken). A worker whose active requests would exceed
``share_cap`` x its fair share of the pool is passed over while any other is not, so one hot
prefix cannot pile onto the worker that caches it. ``temperature`` > 0 samples each pool's
pick from a softmax over normalised costs (seeded), spreading near-ties; 0 takes the
cheapest, ties broken at random.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from router.routing.policy import NoWorkerError, RouteCandidate, RouteChoice, RouteRequest


class KvAwarePolicy:
    name = "kv_aware"

    def __init__(
        self,
        prefill_load_scale: float = 1.0,
        transfer_scale: float = 0.25,
        local_prefill_scale: float = 2.0,
        local_prefill_max_blocks: int = 0,
        local_prefill_hit_ratio: float = 0.75,
        share_cap: float = 1.5,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        if share_cap < 1.0:
            raise ValueError(f"share_cap must be at least 1.0, got {share_cap}")
        if temperature < 0:
            raise ValueError(f"temperature must not be negative, got {temperature}")
        self.prefill_load_scale = prefill_load_scale
        self.transfer_scale = transfer_scale
        self.local_prefill_scale = local_prefill_scale
        self.local_prefill_max_blocks = local_prefill_max_blocks
        self.local_prefill_hit_ratio = local_prefill_hit_ratio
        self.share_cap = share_cap
        self.temperature = temperature
        self._rng = random.Random(seed)

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        if not decode:
            raise NoWorkerError("no decode worker is available")
        blocks = request.num_prompt_blocks
        decode_ok = self._under_cap(decode)

        def decode_cost(c: RouteCandidate) -> float:
            return c.num_used_blocks + self.transfer_scale * (blocks - request.cached(c.worker_id))

        def prefill_cost(c: RouteCandidate) -> float:
            queued = c.num_queued_prefill_tokens / request.block_size
            return self.prefill_load_scale * (blocks - request.cached(c.worker_id) + queued)

        ranked_decode = self._rank(decode_ok, decode_cost)

        def local_ok(c: RouteCandidate) -> bool:
            hit = request.cached(c.worker_id)
            return (
                not prefill
                or blocks - hit <= self.local_prefill_max_blocks
                or (blocks > 0 and hit >= self.local_prefill_hit_ratio * blocks)
            )

        def local_cost(c: RouteCandidate) -> float:
            uncached = blocks - request.cached(c.worker_id)
            return c.num_used_blocks + self.prefill_load_scale * self.local_prefill_scale * uncached

        ranked_prefill: list[tuple[RouteCandidate, float]] = []
        if prefill:
            ranked_prefill = self._rank(self._under_cap(prefill), prefill_cost)
        local: RouteCandidate | None = None
        if local_ok(ranked_decode[0][0]):
            local = ranked_decode[0][0]  # the rule: the chosen decode worker prefills itself
        else:
            eligible = [c for c, _ in ranked_decode if local_ok(c)]
            if eligible:
                best = min(eligible, key=local_cost)
                if local_cost(best) <= ranked_decode[0][1] + ranked_prefill[0][1]:
                    local = best
        if local is not None:
            ranking = [(local.worker_id, local_cost(local))] + [
                (c.worker_id, cost) for c, cost in ranked_decode if c is not local
            ]
            return RouteChoice(tuple(ranking), None, "local_prefill")
        first_p = ranked_prefill[0][0]
        hit = request.cached(first_p.worker_id) > 0
        return RouteChoice(
            tuple((c.worker_id, cost) for c, cost in ranked_decode),
            first_p.worker_id,
            "kv_hit" if hit else "load",
            tuple(c.worker_id for c, _ in ranked_prefill),
        )

    def _under_cap(self, pool: Sequence[RouteCandidate]) -> list[RouteCandidate]:
        if len(pool) < 2:
            return list(pool)
        fair = (sum(c.num_active_requests for c in pool) + 1) / len(pool)
        ok = [c for c in pool if c.num_active_requests + 1 <= self.share_cap * fair]
        return ok or list(pool)

    def _rank(
        self, pool: Sequence[RouteCandidate], cost: Callable[[RouteCandidate], float]
    ) -> list[tuple[RouteCandidate, float]]:
        """Cheapest first; the first is sampled (temperature) or a random one of the ties."""
        scored = [(c, cost(c)) for c in pool]
        self._rng.shuffle(scored)  # ties land in random order under the stable sort
        scored.sort(key=lambda x: x[1])
        if self.temperature > 0 and len(scored) > 1:
            low, high = scored[0][1], scored[-1][1]
            span = (high - low) or 1.0
            weights = [math.exp(-(c - low) / (self.temperature * span)) for _, c in scored]
            pick = self._rng.choices(range(len(scored)), weights=weights)[0]
            scored.insert(0, scored.pop(pick))
        return scored

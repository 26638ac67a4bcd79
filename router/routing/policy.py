"""What a routing policy sees and decides.

RouteRequest   the prompt's size in blocks and how many leading blocks each worker caches
RouteCandidate one worker's load as the router sees it (report + own unreported sends)
RouteChoice    decode worker ranking (first = chosen; the rest = retries), the prefill
               worker or None (prefill on decode: no transfer), and why
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

PolicyName = Literal["kv_aware", "least_loaded", "round_robin"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)

Reason = Literal["kv_hit", "load", "local_prefill", "round_robin"]


class NoWorkerError(Exception):
    """No routable worker of the needed role."""


@dataclass(frozen=True)
class RouteCandidate:
    worker_id: str
    num_blocks: int
    num_used_blocks: int
    num_active_requests: int  # running + waiting (+ unreported sends)
    num_queued_prefill_tokens: int = 0

    @property
    def num_free_blocks(self) -> int:
        return max(0, self.num_blocks - self.num_used_blocks)


@dataclass(frozen=True)
class RouteRequest:
    num_prompt_tokens: int
    block_size: int
    cached_blocks: Mapping[str, int] = field(default_factory=dict)  # worker -> leading hits

    @property
    def num_prompt_blocks(self) -> int:
        return -(-self.num_prompt_tokens // self.block_size)

    def cached(self, worker_id: str) -> int:
        return min(self.cached_blocks.get(worker_id, 0), self.num_prompt_blocks)


@dataclass(frozen=True)
class RouteChoice:
    decode_ranking: tuple[tuple[str, float], ...]  # (worker id, cost), chosen first
    prefill_id: str | None  # None: the decode worker prefills the prompt itself
    reason: Reason
    prefill_ranking: tuple[str, ...] = ()  # the chosen prefill worker first, then retries

    @property
    def decode_id(self) -> str:
        return self.decode_ranking[0][0]


class RoutingPolicy(Protocol):
    name: str

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        """Rank ``decode`` (must not be empty: raise NoWorkerError) and pick a prefill
        worker from ``prefill`` or None. Never mutates its inputs."""
        ...


def make_policy(name: str, **options: float) -> RoutingPolicy:
    """The policy called ``name`` with its options (unknown names raise ValueError)."""
    from router.routing.kv_aware import KvAwarePolicy
    from router.routing.least_loaded import LeastLoadedPolicy
    from router.routing.round_robin import RoundRobinPolicy

    if name == "kv_aware":
        return KvAwarePolicy(**options)  # type: ignore[arg-type]
    if name == "least_loaded":
        return LeastLoadedPolicy(
            local_prefill_max_tokens=int(options.get("local_prefill_max_tokens", 0))
        )
    if name == "round_robin":
        return RoundRobinPolicy(
            local_prefill_max_tokens=int(options.get("local_prefill_max_tokens", 0))
        )
    raise ValueError(f"routing policy: unknown {name!r} (choose from {', '.join(POLICY_NAMES)})")

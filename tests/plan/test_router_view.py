"""The router's incremental view (``LoadBoard`` per pool, decode runs remembered between step
ends) hands the policy, at every decision, exactly the candidates that re-reading every
worker gives: polled (one read per interval, at its first decision), reported (that read plus
this router's sends since) and exact (a read per decision). Random clusters with shared cores
(rates change under a running lane), prefix groups, tight KV, every policy."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from pdserve.plan.engine_model import EngineModel
from pdserve.plan.router_model import RouterModel
from pdserve.plan.sim_config import SimConfig
from pdserve.plan.sim_request import SimRequest
from pdserve.plan.simulate import simulate
from router.routing import RouteCandidate, RouteChoice, RouteRequest, RoutingPolicy
from tests.plan.conftest import config_dict, make_profile


class _Recording:
    """The policy, remembering what it was handed last."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.seen: tuple[list[RouteCandidate], list[RouteCandidate]] = ([], [])

    def choose(
        self,
        request: RouteRequest,
        decode: Sequence[RouteCandidate],
        prefill: Sequence[RouteCandidate],
    ) -> RouteChoice:
        self.seen = (list(decode), list(prefill))
        return self.policy.choose(request, decode, prefill)


class _Truth:
    """One router's view as a full re-read of every worker defines it."""

    def __init__(self, pools: tuple[list[EngineModel], list[EngineModel]], queued: Any) -> None:
        self.pools = pools
        self.queued = queued
        self.epoch: int | None = None
        self.report: tuple[list[RouteCandidate], list[RouteCandidate]] = ([], [])
        self.sends: dict[str, list[int]] = {}

    def read(self, pool: list[EngineModel]) -> list[RouteCandidate]:
        return [
            RouteCandidate(
                w.name, w.pool.num_blocks, w.num_blocks_in_use, w.num_active, self.queued(w)
            )
            for w in pool
        ]

    def seen(self, c: RouteCandidate) -> RouteCandidate:
        blocks, active, tokens = self.sends.get(c.worker_id, (0, 0, 0))
        if not (blocks or active):
            return c
        return RouteCandidate(
            c.worker_id,
            c.num_blocks,
            min(c.num_blocks, c.num_used_blocks + blocks),
            c.num_active_requests + active,
            c.num_queued_prefill_tokens + tokens,
        )


@contextmanager
def checking_views() -> Iterator[dict[str, int]]:
    """Every decision's candidates are checked against ``_Truth`` (counts come back)."""
    init, choose, sent = RouterModel.__init__, RouterModel.choose, RouterModel.sent
    truths: dict[int, _Truth] = {}
    counts = {"decisions": 0, "moved": 0}

    def init_(self: RouterModel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        decode, prefill, queued = args[2], args[3], args[5]  # as Cluster passes them
        truths[id(self)] = _Truth((list(decode), list(prefill)), queued)
        self.policy = _Recording(self.policy)

    def choose_(self: RouterModel, req: SimRequest) -> RouteChoice:
        t = truths[id(self)]
        epoch = -1 if self.load_view == "exact" else int(self.loop.now / self.interval)
        if epoch < 0 or epoch != t.epoch:
            report = (t.read(t.pools[0]), t.read(t.pools[1]))
            counts["moved"] += sum(
                old != new and w.load_steady_until < math.inf
                for old, new, w in zip(t.report[0], report[0], t.pools[0], strict=False)
            )
            t.epoch, t.report, t.sends = epoch, report, {}
        want = ([t.seen(c) for c in t.report[0]], [t.seen(c) for c in t.report[1]])
        choice = choose(self, req)
        assert isinstance(self.policy, _Recording)
        assert self.policy.seen == want, (self.load_view, self.loop.now)
        counts["decisions"] += 1
        return choice

    def sent_(
        self: RouterModel, worker: EngineModel, num_blocks: int, num_prefill_tokens: int
    ) -> None:
        sent(self, worker, num_blocks, num_prefill_tokens)
        blocks, tokens = num_blocks, num_prefill_tokens
        if self.load_view == "reported":
            s = truths[id(self)].sends.setdefault(worker.name, [0, 0, 0])
            s[0] += blocks
            s[1] += 1
            s[2] += tokens

    RouterModel.__init__ = init_  # type: ignore[method-assign]
    RouterModel.choose = choose_  # type: ignore[method-assign]
    RouterModel.sent = sent_  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        RouterModel.__init__ = init  # type: ignore[method-assign]
        RouterModel.choose = choose  # type: ignore[method-assign]
        RouterModel.sent = sent  # type: ignore[method-assign]


def random_cluster(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    num_prefill, num_decode = rng.randint(1, 5), rng.randint(2, 12)
    tables: dict[str, Any] = {}
    if rng.random() < 0.5:  # some workers share a core: a lane's rate changes mid-run
        shared = rng.sample([f"decode-{i}" for i in range(num_decode)], 2)
        tables["placement"] = {"groups": [{"cores": 1.0, "workers": shared}]}
    return config_dict(
        cluster={"num_prefill": num_prefill, "num_decode": num_decode},
        router={
            "policy": rng.choice(["round_robin", "least_loaded", "kv_aware"]),
            "load_view": rng.choice(["exact", "polled", "reported"]),
            "load_interval_s": rng.choice([0.05, 0.1, 0.5]),
        },
        decode={"num_kv_blocks": rng.choice([120, 400, 1456]), "max_num_seqs": rng.choice([4, 32])},
        workload={
            "num_requests": 120,
            "prompt_len": "uniform:16:400",
            "output_len": rng.choice(["uniform:1:40", "uniform:20:200"]),
            "shared_prefix_len": rng.choice([0, 64]),
            "shared_prefix_fraction": 0.5,
            "seed": seed,
        },
        load={"kind": "open", "rates": [rng.choice([5.0, 20.0, 60.0])]},
        sim={"records": "compact"},
        **tables,
    )


def test_every_decision_sees_what_a_full_read_gives() -> None:
    total = {"decisions": 0, "moved": 0}
    with checking_views() as counts:
        for seed in range(24):
            r = simulate(SimConfig.from_dict(random_cluster(seed)), {"test-cpu": make_profile()})
            s = r.points[0].summary
            assert s.num_completed + s.num_failed == 120
    total.update(counts)
    assert total["decisions"] >= 24 * 120
    # Workers in a decode run changed their reported blocks between polls with no event of
    # theirs: the case a board re-reads without a mark.
    assert total["moved"] > 0


@pytest.mark.parametrize("view", ["exact", "polled", "reported"])
def test_the_checker_catches_a_stale_view(view: str) -> None:
    """The check is not vacuous: a board that forgets the workers in a decode run is caught."""
    from pdserve.plan import load_board

    sync = load_board.LoadBoard.sync

    def stale(self: load_board.LoadBoard[Any], now: float) -> list[Any]:
        self._heap.clear()  # forgets when the workers in a decode run are due
        return sync(self, now)

    d = random_cluster(1)
    d["router"].update(load_view=view, policy="least_loaded")
    d["load"] = {"kind": "open", "rates": [40.0]}
    load_board.LoadBoard.sync = stale  # type: ignore[method-assign]
    try:
        with checking_views(), pytest.raises(AssertionError):
            simulate(SimConfig.from_dict(d), {"test-cpu": make_profile()})
    finally:
        load_board.LoadBoard.sync = sync  # type: ignore[method-assign]

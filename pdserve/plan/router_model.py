"""The router's view of the pools, and its choice: the REAL policy objects of
``router/routing`` (``round_robin``, ``least_loaded``, ``kv_aware``), called with the same
``RouteRequest`` / ``RouteCandidate`` plain data the router builds.

How fresh the view is (``load_view``):

    exact      every decision sees every worker as it is (an ideal router)
    polled     a worker's load as of its last poll (one per ``load_interval_s``), nothing
               else: today's ``DisaggregatedBackend`` (GetLoad every 0.1 s)
    reported   the last load report plus this router's own sends since (the control plane:
               ``control_plane.cluster_view`` counts unreported sends)

A worker's view is refreshed the first time a decision needs it in each interval (no event
per worker per interval, so a 512-worker run pays nothing for workers it does not route to).
Handing the policy every worker (the default), each pool's list is a ``LoadBoard``: a poll
re-reads only the workers that did something since the last one (a worker tells its board:
``EngineModel.on_load_change``) and those in a decode run that reached a step where their
reported blocks grow (``EngineModel.load_steady_until``); the others' candidates are still
what a re-read would give. Sampled pools (``candidates``) re-read each sampled worker in
turn.

``candidates`` > 0 hands the policy a random sample of that many workers per pool (plus
every worker caching the request's prefix group) instead of the whole pool: the policies
cost O(pool) per decision (kv_aware: ~0.5 us per worker, measured here on 512), which
decides a 1,000-worker simulation's speed. The router has no such option: 0 (the default)
gives the policy every worker, as the router does (docs/planning.md, Speed).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

from pdserve.plan.engine_model import EngineModel
from pdserve.plan.events import EventLoop
from pdserve.plan.load_board import LoadBoard
from pdserve.plan.sim_request import SimRequest
from router.routing import RouteCandidate, RouteChoice, RouteRequest, RoutingPolicy

LoadView = Literal["exact", "polled", "reported"]
LOAD_VIEWS: tuple[str, ...] = ("exact", "polled", "reported")


class _View:
    """One worker as the router sees it."""

    __slots__ = (
        "board",
        "candidate",
        "epoch",
        "index",
        "key",
        "sent_active",
        "sent_blocks",
        "sent_tokens",
        "w",
    )

    def __init__(self, w: EngineModel, index: int) -> None:
        self.w = w
        self.index = index  # in its pool
        self.board: LoadBoard[RouteCandidate] | None = None  # its pool's, when not sampled
        self.epoch = -1
        self.key: tuple[int, int, int] = (-1, -1, -1)
        self.candidate = RouteCandidate(w.name, w.pool.num_blocks, 0, 0, 0)
        self.sent_blocks = self.sent_active = self.sent_tokens = 0


class RouterModel:
    def __init__(
        self,
        loop: EventLoop,
        policy: RoutingPolicy,
        decode: Sequence[EngineModel],
        prefill: Sequence[EngineModel],
        block_size: int,
        queued_tokens: Callable[[EngineModel], int],
        group_index: dict[int, dict[str, int]],
        load_view: LoadView = "polled",
        load_interval_s: float = 0.1,
        candidates: int = 0,
        seed: int = 0,
    ) -> None:
        if load_view not in LOAD_VIEWS:
            raise ValueError(f"load_view must be one of {', '.join(LOAD_VIEWS)}")
        if load_view != "exact" and load_interval_s <= 0:
            raise ValueError("load_interval_s must be > 0")
        self.loop = loop
        self.policy = policy
        self.block_size = block_size
        self.load_view = load_view
        self.interval = load_interval_s
        self.num_candidates = candidates
        self._queued = queued_tokens
        self._groups = group_index
        self._decode = [_View(w, i) for i, w in enumerate(decode)]
        self._prefill = [_View(w, i) for i, w in enumerate(prefill)]
        self._by_name = {v.w.name: v for v in self._decode + self._prefill}
        self._rng = random.Random(f"{seed}/router-sample")
        self.num_decisions = 0
        self._decode_board = self._board(self._decode)
        self._prefill_board = self._board(self._prefill)
        self._epochs = [-1, -1]  # each board's last poll

    def choose(self, req: SimRequest) -> RouteChoice:
        """The policy's choice for ``req`` (NoWorkerError from the policy propagates)."""
        self.num_decisions += 1
        cached: dict[str, int] = {}
        if req.prefix_group >= 0:
            limit = req.num_prefix_tokens // self.block_size
            for name, blocks in self._groups.get(req.prefix_group, {}).items():
                cached[name] = min(blocks, limit)
        request = RouteRequest(req.num_prompt, self.block_size, cached)
        epoch = -1 if self.load_view == "exact" else int(self.loop.now / self.interval)
        decode = self._candidates(self._decode, self._decode_board, 0, epoch, cached)
        prefill = self._candidates(self._prefill, self._prefill_board, 1, epoch, cached)
        return self.policy.choose(request, decode, prefill)

    def sent(self, worker: EngineModel, num_blocks: int, num_prefill_tokens: int) -> None:
        """This router sent a request there (the ``reported`` view counts it until the next
        report)."""
        if self.load_view != "reported":
            return
        v = self._by_name[worker.name]
        v.sent_active += 1
        v.sent_blocks += num_blocks
        v.sent_tokens += num_prefill_tokens
        if v.board is not None:
            v.board.put(v.index, self._seen(v))
            v.board.mark(v.index)  # the next poll drops the sends again

    def changed(self, worker: EngineModel) -> None:
        """Something the view reads of ``worker`` changed outside its own events (the
        prefill tokens queued there)."""
        v = self._by_name[worker.name]
        if v.board is not None:
            v.board.mark(v.index)

    # ------------------------------------------------------------------ private
    def _board(self, views: list[_View]) -> LoadBoard[RouteCandidate] | None:
        n = self.num_candidates
        if 0 < n < len(views):
            return None  # sampled: each decision reads its sample

        def read(i: int) -> tuple[RouteCandidate, float]:
            v = views[i]
            return self._poll(v), v.w.load_steady_until

        board = LoadBoard(len(views), read)
        for v in views:
            v.board = board
            v.w.on_load_change = partial(board.mark, v.index)
        return board

    def _candidates(
        self,
        views: list[_View],
        board: LoadBoard[RouteCandidate] | None,
        which: int,
        epoch: int,
        cached: dict[str, int],
    ) -> list[RouteCandidate]:
        if board is not None:
            # Nothing moves inside a poll interval: one poll per pool per interval.
            if epoch < 0 or self._epochs[which] != epoch:
                self._epochs[which] = epoch
                return board.sync(self.loop.now)
            return board.items
        picked = self._rng.sample(range(len(views)), self.num_candidates)
        pool = [views[i] for i in picked]
        if cached:
            have = {v.w.name for v in pool}
            pool += [
                self._by_name[w] for w in cached if w not in have and self._by_name[w] in views
            ]
        return [self._refresh(v, epoch) for v in pool]

    def _refresh(self, v: _View, epoch: int) -> RouteCandidate:
        """A sampled worker: polled at most once per interval."""
        if epoch >= 0 and v.epoch == epoch:
            return self._seen(v)
        v.epoch = epoch
        return self._poll(v)

    def _seen(self, v: _View) -> RouteCandidate:
        """The last poll, plus (``reported``) this router's sends since."""
        if self.load_view == "polled" or not (v.sent_active or v.sent_blocks):
            return v.candidate
        used, active, queued = v.key
        return RouteCandidate(
            v.w.name,
            v.w.pool.num_blocks,
            min(v.w.pool.num_blocks, used + v.sent_blocks),
            active + v.sent_active,
            queued + v.sent_tokens,
        )

    def _poll(self, v: _View) -> RouteCandidate:
        """The worker's load report as of now (this router's sends are in it from now on)."""
        w = v.w
        key = (w.num_blocks_in_use, w.num_active, self._queued(w))
        v.sent_active = v.sent_blocks = v.sent_tokens = 0
        if key != v.key:
            v.key = key
            v.candidate = RouteCandidate(w.name, w.pool.num_blocks, *key)
        return v.candidate

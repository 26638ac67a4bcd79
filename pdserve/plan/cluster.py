"""The simulated system: router, prefill pool, KV links, decode pool (or one colocated pool),
wired as pdserve wires them. A disaggregated request's life, as in DESIGN.md:

    arrive ─dispatch─▶ router: policy.choose ─▶ decode.reserve (between its steps; refused:
    the next decode worker of the ranking, or fail) ─▶ prefill.add (EXPORT) ─▶ chunks; each
    chunk's full blocks pushed on decode's link ─▶ prompt done: last blocks + first token
    pushed ─▶ landed: prefill releases its blocks, decode admits (first token out) ─▶ decode
    steps ─▶ finished

A policy that answers "no prefill worker" (conditional disaggregation, or colocated) sends
the request to the decode worker whole (FULL: it prefills there).
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.plan.cost_model import TransferCost
from pdserve.plan.cpu_share import CoreGroup
from pdserve.plan.engine_model import EngineModel
from pdserve.plan.events import EventLoop
from pdserve.plan.kv_pool import KvPool
from pdserve.plan.profile_format import Profile
from pdserve.plan.recorder import CompactRecorder, FullRecorder
from pdserve.plan.router_model import RouterModel
from pdserve.plan.seq import EXPORT, FULL, REMOTE, Seq
from pdserve.plan.sim_config import PoolConfig, SimConfig
from pdserve.plan.sim_request import OK, SimRequest
from pdserve.plan.transfer_model import KvLink
from router.routing import NoWorkerError, make_policy

Recorder = FullRecorder | CompactRecorder
Ranking = tuple[tuple[str, float], ...]  # RouteChoice.decode_ranking


class Cluster:
    def __init__(
        self,
        config: SimConfig,
        profiles: dict[str, Profile],
        loop: EventLoop,
        recorder: Recorder,
        burst_recorder: Recorder,
        on_done: Callable[[SimRequest], None],
    ) -> None:
        self.config = config
        self.loop = loop
        self.recorder = recorder
        self.burst_recorder = burst_recorder
        self.on_done = on_done  # the client: a closed loop sends its next request
        c = config.cluster
        self.profile = profiles[c.profile]
        self.block_size = self.profile.model.block_size
        self.bytes_per_block = self.block_size * self.profile.model.kv_bytes_per_token
        self.transfer = (
            self.profile.transfer_cost(c.transport) if c.mode != "colocated" else (TransferCost())
        )
        self.group_index: dict[int, dict[str, int]] = {}
        self._groups: dict[str, CoreGroup] = {}
        for g in config.placement:
            group = CoreGroup(loop, g.cores, ",".join(g.workers))
            for name in g.workers:
                if name in self._groups:
                    raise ValueError(f"placement: worker {name!r} is in two core groups")
                self._groups[name] = group
        self.prefill: list[EngineModel] = []
        self.decode: list[EngineModel] = []
        if c.mode == "colocated":
            self.decode = self._pool("colocated", c.num_colocated, config.colocated, profiles)
        else:
            self.prefill = self._pool("prefill", c.num_prefill, config.prefill, profiles)
            self.decode = self._pool("decode", c.num_decode, config.decode, profiles)
        known = {w.name for w in self.prefill + self.decode}
        unknown = sorted(set(self._groups) - known)
        if unknown:
            raise ValueError(f"placement: no worker named {', '.join(unknown)}")
        self.links = {w.name: KvLink(loop, self.transfer) for w in self.decode}
        self.queued_tokens: dict[str, int] = {w.name: 0 for w in self.prefill}
        r = config.router
        self.policy = make_policy(r.policy, **r.options)
        self.router = RouterModel(
            loop,
            self.policy,
            self.decode,
            self.prefill,
            self.block_size,
            lambda w: self.queued_tokens.get(w.name, 0),
            self.group_index,
            r.load_view,  # type: ignore[arg-type]
            r.load_interval_s,
            r.candidates,
            config.sim.seed,
        )
        self.dispatch_s = (
            r.dispatch_s if r.dispatch_s is not None else self.profile.overhead.dispatch_s
        )
        self.admit_s = self.profile.overhead.admit_s
        self.workers = {w.name: w for w in self.prefill + self.decode}
        self._capacity = min(w.pool.num_blocks for w in self.workers.values()) * self.block_size
        self.num_routed_local = 0
        self.num_refused = 0

    def _pool(
        self, role: str, n: int, pool: PoolConfig, profiles: dict[str, Profile]
    ) -> list[EngineModel]:
        prof = profiles[pool.profile or self.config.cluster.profile]
        if prof.model.block_size != self.block_size:
            raise ValueError(f"[{role}] profile {prof.name!r}: another block size")
        s = pool.settings
        out = []
        for i in range(n):
            name = f"{role}-{i}"
            group = self._groups.get(name) or CoreGroup(self.loop, 1.0, name)
            kv = KvPool(
                s.num_kv_blocks or prof.kv.num_blocks,
                self.block_size,
                prof.kv.num_host_blocks if s.num_host_blocks is None else s.num_host_blocks,
            )
            kv.listener = self._group_changed(name)
            rec = self.recorder
            out.append(
                EngineModel(
                    name,
                    role,
                    self.loop,
                    group.lane(),
                    prof.step,
                    prof.swap,
                    kv,
                    s,
                    self,
                    rec.sink,
                    record_tokens=rec.record_tokens,
                    fast=self.config.sim.fast,
                )
            )
        return out

    def _group_changed(self, worker: str) -> Callable[[int, int], None]:
        def changed(group: int, blocks: int) -> None:
            cached = self.group_index.setdefault(group, {})
            if blocks:
                cached[worker] = blocks
            else:
                cached.pop(worker, None)

        return changed

    # ------------------------------------------------------------------ client
    def send(self, req: SimRequest) -> None:
        """The client sends ``req`` now."""
        req.arrival_s = self.loop.now
        if self.recorder.record_tokens:
            req.token_times = []
        self.loop.after(self.dispatch_s, self._route, req)

    def _route(self, req: SimRequest) -> None:
        limit = min(self.config.decode.settings.max_model_len, self._capacity_tokens())
        if req.num_prompt >= limit:
            self._fail(
                req,
                f"prompt is {req.num_prompt} tokens; it must be shorter than "
                f"{limit} (max_model_len and the KV cache)",
            )
            return
        req.num_output = min(req.num_output, limit - req.num_prompt)
        try:
            choice = self.router.choose(req)
        except NoWorkerError as e:
            self._fail(req, str(e))
            return
        ranking = choice.decode_ranking  # (worker, cost) pairs: read as far as needed
        if choice.prefill_id is None:
            self.num_routed_local += 1
            w = self.workers[ranking[0][0]]
            req.decode_id = w.name
            self.router.sent(w, w.pool.blocks_for(req.num_prompt), 0)
            w.post(_add, (w, Seq(req, FULL)))
            return
        self._reserve((req, ranking, 0, choice.prefill_id))

    def _capacity_tokens(self) -> int:
        return self._capacity  # pools never change size

    def _reserve(self, arg: tuple[SimRequest, Ranking, int, str]) -> None:
        req, ranking, i, prefill_id = arg
        w = self.workers[ranking[i][0]]
        w.post(self._reserve_on, (w, Seq(req, REMOTE), ranking, i, prefill_id))

    def _reserve_on(self, arg: tuple[EngineModel, Seq, Ranking, int, str]) -> None:
        w, seq, ranking, i, prefill_id = arg
        req = seq.req
        if not w.reserve(seq):
            self.num_refused += 1
            if self.config.router.on_full == "next" and i + 1 < len(ranking):
                self._reserve((req, ranking, i + 1, prefill_id))
            else:
                self._fail(req, "no free KV blocks for this prompt now")
            return
        req.decode_id = w.name
        p = self.workers[prefill_id]
        req.prefill_id = p.name
        self.router.sent(w, seq.num_blocks, 0)
        self.router.sent(p, 0, req.num_prompt)
        self.queued_tokens[p.name] += req.num_prompt
        self.router.changed(p)
        export = Seq(req, EXPORT)
        export.peer = (w, seq)
        export.skipped_blocks = seq.skipped_blocks
        p.post(_add, (p, export))

    def _fail(self, req: SimRequest, error: str) -> None:
        req.fail(self.loop.now, error)
        self._done(req)

    def _done(self, req: SimRequest) -> None:
        (self.burst_recorder if req.is_burst else self.recorder).done(req)
        self.on_done(req)

    # ------------------------------------------------------------ worker hooks
    def first_token(self, worker: EngineModel, seq: Seq) -> None:
        req = seq.req
        req.first_token_s = self.loop.now
        if req.token_times is not None:
            req.token_times.append(self.loop.now)

    def chunk_done(self, worker: EngineModel, seq: Seq, num_full_blocks: int) -> None:
        new = num_full_blocks - max(seq.sent_blocks, seq.skipped_blocks)
        if new > 0:
            assert seq.peer is not None  # an EXPORT request knows its decode worker
            decode, _ = seq.peer
            self.links[decode.name].push(new * self.bytes_per_block)
            seq.sent_blocks = max(seq.sent_blocks, seq.skipped_blocks) + new

    def prompt_done(self, worker: EngineModel, seq: Seq) -> None:
        assert seq.peer is not None
        decode, dseq = seq.peer
        total = worker.pool.blocks_for(seq.req.num_prompt)
        new = total - max(seq.sent_blocks, seq.skipped_blocks)
        self.links[decode.name].push(
            max(0, new) * self.bytes_per_block, self._landed, (worker, seq, decode, dseq)
        )

    def _landed(self, arg: tuple[EngineModel, Seq, EngineModel, Seq]) -> None:
        prefill, pseq, decode, dseq = arg
        self.queued_tokens[prefill.name] -= pseq.req.num_prompt
        self.router.changed(prefill)
        prefill.post(_release, (prefill, pseq))
        if self.admit_s > 0:  # the reply's way back and decode's bookkeeping
            self.loop.after(self.admit_s, _post_admit, (decode, dseq))
        else:
            decode.post(_admit, (decode, dseq))

    def finished(self, worker: EngineModel, seq: Seq) -> None:
        req = seq.req
        req.finish_s = self.loop.now
        req.status = OK
        self._done(req)

    # ------------------------------------------------------------------ report
    def pool_of(self, role: str) -> list[EngineModel]:
        return self.prefill if role == "prefill" else self.decode


def _add(arg: tuple[EngineModel, Seq]) -> None:
    arg[0].add(arg[1])


def _admit(arg: tuple[EngineModel, Seq]) -> None:
    arg[0].admit(arg[1])


def _post_admit(arg: tuple[EngineModel, Seq]) -> None:
    arg[0].post(_admit, arg)


def _release(arg: tuple[EngineModel, Seq]) -> None:
    arg[0].release(arg[1])


__all__ = ["Cluster", "Recorder"]

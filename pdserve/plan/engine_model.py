"""One simulated worker: the engine's scheduler and step loop, as numbers and events.

It follows ``engine/scheduler.py`` step for step: running requests oldest first (a prefill
chunk or one decode token each, preempting the latest arrival when blocks run out), then
swapped requests back, then requests prefilled elsewhere, then new ones under the token
budget with chunked prefill and prefix-cache hits. Commands (a new request, a reservation, a
KV arrival, a release) run between steps, as ``engine/async_engine.py`` runs them.

Two ways to advance, with the same result:

* an **exact step** (``step_plan.plan_exact``): the scheduler's loop over every request; used
  whenever a step holds a prefill chunk, a swap or a preemption, or the budget binds;
* a **decode run** (``run_plan``): every running request is one token behind and nothing can
  join, so the next k steps are alike (each context one token longer). The run is one job of
  ``k x t(B, K) + slope x k(k-1)/2`` seconds, k = steps to the next finish or to the step
  where blocks run out; a command arriving mid-run cuts it at the end of the step in
  progress. Decoding requests carry ``computed = offset + steps``, so a run touches none of
  them: O(block size) per run, whatever the batch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from pdserve.plan.cost_model import StepCost, SwapCost
from pdserve.plan.cpu_share import Lane
from pdserve.plan.decode_run import DecodeRun
from pdserve.plan.decoding_set import DecodingSet
from pdserve.plan.events import EventLoop
from pdserve.plan.kv_pool import KvPool
from pdserve.plan.run_plan import cut_run, end_run, try_run
from pdserve.plan.seq import Seq
from pdserve.plan.worker_settings import WorkerSettings


class WorkerHooks(Protocol):
    """What a worker tells the cluster (times are the worker's step ends)."""

    def first_token(self, worker: EngineModel, seq: Seq) -> None: ...
    def prompt_done(self, worker: EngineModel, seq: Seq) -> None: ...
    def chunk_done(self, worker: EngineModel, seq: Seq, num_full_blocks: int) -> None: ...
    def finished(self, worker: EngineModel, seq: Seq) -> None: ...


class TokenSink(Protocol):
    """Where inter-token gaps go (the recorder)."""

    def gap(self, seconds: float) -> None: ...
    def gaps(self, first_s: float, last_s: float, num_steps: int, weight: int) -> None: ...


class EngineModel:
    def __init__(
        self,
        name: str,
        role: str,
        loop: EventLoop,
        lane: Lane,
        cost: StepCost,
        swap: SwapCost,
        pool: KvPool,
        settings: WorkerSettings,
        hooks: WorkerHooks,
        sink: TokenSink,
        record_tokens: bool = False,
        fast: bool = True,
    ) -> None:
        self.name = name
        self.role = role  # prefill | decode | colocated
        self.loop = loop
        self.lane = lane
        self.cost = cost
        self.swap = swap
        self.pool = pool
        self.settings = settings
        self.hooks = hooks
        self.sink = sink
        self.record_tokens = record_tokens  # append every token's time to its request
        self.fast = fast  # allow decode runs (off: every step exact; the tests compare)
        self.bs = pool.block_size
        self.running: dict[Seq, None] = {}  # insertion order = the scheduler's running list
        self.prefilling: dict[Seq, None] = {}  # running requests more than one token behind
        self.waiting: deque[Seq] = deque()
        self.ready: deque[Seq] = deque()  # REMOTE: KV arrived, not yet in the batch
        self.swapped: list[Seq] = []
        self.held: set[Seq] = set()  # EXPORT: prompt done, blocks kept for the transfer
        self.reserved: set[Seq] = set()  # REMOTE: blocks reserved, KV still arriving
        self.first_pending: list[Seq] = []  # REMOTE: admitted, first token not yet out
        # Decoding requests, in aggregate.
        self.steps = 0
        self.decoding = DecodingSet(self.bs)
        self.stale: list[Seq] = []
        # Commands and the current job.
        self._commands: list[tuple[Callable[[Any], None], Any]] = []
        self._job: str | None = None  # "step" | "run" | None (idle)
        self.t_start = 0.0
        self.chunks: list[tuple[Seq, int]] = []
        self.skipped: list[Seq] = []  # decoding requests the last exact step's budget missed
        self.current_run = DecodeRun(0, 0.0, 0.0)  # the current (or last) decode run
        self._in_wake = False
        self._boundary_in_use = 0
        # Told after anything a load report reads may have changed (the router's view), or
        # when load_steady_until may have (another worker changed this one's core share).
        self.on_load_change: Callable[[], None] | None = None
        lane.on_rate_change = self._rate_changed
        # Counters for the report.
        self.busy_s = 0.0
        self.num_steps_run = 0
        self.num_tokens_computed = 0
        self.num_preemptions = 0
        self.num_swapped_blocks = 0

    def _rate_changed(self) -> None:
        if self.on_load_change is not None:
            self.on_load_change()

    # ------------------------------------------------------------------ commands
    def post(self, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``fn(arg)`` between steps (now, if the worker is idle)."""
        self._commands.append((fn, arg))
        if self._job is None:
            if not self._in_wake:
                self._wake()
        elif self._job == "run":
            cut_run(self)  # what a report reads now is unchanged (a cut ends it sooner)

    def add(self, seq: Seq) -> None:
        """Queue a FULL or EXPORT request (call through ``post``)."""
        seq.engine_arrival = self.loop.now
        self.waiting.append(seq)

    def reserve(self, seq: Seq) -> bool:
        """REMOTE: allocate the prompt's blocks (group hits shared); False if they do not fit.
        Call through ``post``."""
        pool = self.pool
        hit = 0
        if seq.group >= 0:
            hit = min(pool.ref_group(seq.group), seq.req.num_prefix_tokens // self.bs)
            seq.group_ref = True
        need = pool.blocks_for(seq.num_tokens) - hit
        if not pool.allocate(need):
            if seq.group_ref:
                pool.unref_group(seq.group)
                seq.group_ref = False
            return False
        seq.num_blocks = need + hit
        seq.num_prefix_blocks = hit
        seq.skipped_blocks = hit
        seq.req.num_cached_tokens = hit * self.bs
        seq.engine_arrival = self.loop.now
        self.reserved.add(seq)
        return True

    def admit(self, seq: Seq) -> None:
        """REMOTE: every block arrived; the request joins the batch at the next step, and the
        first token (sampled by prefill) goes out with that step's outputs, at its end (the
        engine imports at a step's start and returns its outputs at the end, its second
        token with them). Call through ``post``."""
        from pdserve.plan.step_plan import publish_prefix

        self.reserved.discard(seq)
        seq.computed = seq.num_tokens
        publish_prefix(self, seq)  # the engine caches the arrived prompt's blocks
        seq.num_tokens += 1
        seq.num_out = 1
        self.first_pending.append(seq)
        if seq.num_out >= seq.req.num_output:
            self.free_blocks(seq, seq.num_blocks)  # finished at import; told at the step end
            return
        self.ready.append(seq)

    def _first_tokens_out(self) -> None:
        """The admitted requests' first tokens reach the step's outputs (now)."""
        pending, self.first_pending = self.first_pending, []
        for seq in pending:
            seq.last_token_s = self.loop.now
            self.hooks.first_token(self, seq)
            if seq.num_out >= seq.req.num_output:
                self.hooks.finished(self, seq)

    def release(self, seq: Seq) -> None:
        """EXPORT: the transfer is over; free the held blocks. Idempotent."""
        if seq in self.held:
            self.held.discard(seq)
            self.free_blocks(seq, seq.num_blocks)
        elif seq in self.reserved:  # REMOTE reservation given up
            self.reserved.discard(seq)
            self.free_blocks(seq, seq.num_blocks)

    def free_blocks(self, seq: Seq, num_blocks: int) -> None:
        """Give back ``num_blocks`` held blocks of ``seq``, its group's shared ones included."""
        self.pool.free(num_blocks - seq.num_prefix_blocks)
        if seq.group_ref:
            self.pool.unref_group(seq.group)
            seq.group_ref = False
        seq.num_blocks = seq.num_prefix_blocks = 0

    # --------------------------------------------------------------------- state
    @property
    def num_active(self) -> int:
        """Running + swapped + waiting, as a worker's load report counts them."""
        return len(self.running) + len(self.swapped) + len(self.waiting)

    @property
    def is_idle(self) -> bool:
        return self._job is None

    def computed_of(self, seq: Seq) -> int:
        return seq.offset + self.steps if seq.is_decoding else seq.computed

    def blocks_of(self, seq: Seq) -> int:
        return self.pool.blocks_for(seq.offset + self.steps) if seq.is_decoding else seq.num_blocks

    # -------------------------------------------------------------- decoding set
    def start_decoding(self, seq: Seq) -> None:
        """``seq`` (in running, one token behind) joins the decoding aggregate."""
        self.prefilling.pop(seq, None)
        self.decoding.add(seq, self.steps)

    def shift_decoding(self, seq: Seq, delta: int) -> None:
        """Move a decoding request's computed count by ``delta`` (``DecodingSet.shift``)."""
        self.decoding.shift(seq, delta)

    def stop_decoding(self, seq: Seq) -> None:
        """``seq`` leaves the decoding aggregate (finished, preempted); ``computed`` is set."""
        seq.computed = seq.offset + self.steps
        seq.num_blocks = self.pool.blocks_for(seq.computed)
        seq.num_out = seq.req.num_output - (seq.finish_step - self.steps)
        seq.num_tokens = seq.req.num_prompt + seq.num_out
        self.decoding.remove(seq)

    def extra_blocks(self, m: int) -> int:
        """Blocks the decoding requests need beyond what they hold to run ``m`` more steps."""
        return self.decoding.extra_blocks(m, self.steps)

    # ---------------------------------------------------------------- the loop
    def _wake(self) -> None:
        """At a step boundary (or idle): run commands, then plan and start the next job."""
        self._in_wake = True
        try:
            while self._commands:
                commands, self._commands = self._commands, []
                for fn, arg in commands:
                    fn(arg)
            self._job = None
            self._boundary_in_use = self.pool.num_in_use
            if self.fast and try_run(self):
                return
            from pdserve.plan.step_plan import plan_exact

            work = plan_exact(self)
            if work is not None:
                self.begin_job("step", work)
            elif self.first_pending:  # a step with nothing to compute returns at once
                self._first_tokens_out()
        finally:
            self._in_wake = False
            if self.on_load_change is not None:
                self.on_load_change()

    def begin_job(self, job: str, work: float) -> None:
        self._job = job
        self.t_start = self.loop.now
        self.lane.start(work, self._job_done)

    def _job_done(self) -> None:
        self.busy_s += self.loop.now - self.t_start
        if self.first_pending:  # before the step's own tokens: its gaps start here
            self._first_tokens_out()
        if self._job == "run":
            end_run(self)
        else:
            from pdserve.plan.step_plan import finish_exact

            finish_exact(self)
        self._job = None
        self._wake()

    # ------------------------------------------------------------- decode runs
    @property
    def num_blocks_in_use(self) -> int:
        """KV blocks in use as of the last step's end (what a load report says)."""
        if self._job is None:
            return self.pool.num_in_use
        if self._job == "step":
            return self._boundary_in_use  # before this step took its blocks
        run = self.current_run
        done = self.lane.work_done()
        if done >= run.until:  # nothing else moves during a run: hold it to its next change
            m = run.steps_done(done)
            run.hold(
                self.pool.num_in_use + self.extra_blocks(m),
                self.decoding.next_growth(m, self.steps),
            )
        return run.blocks

    @property
    def load_steady_until(self) -> float:
        """The time before which what a load report reads stays as it is unless
        ``on_load_change`` is told: a decode run's blocks grow at some step ends (a lower
        bound, never later than the change); infinite otherwise."""
        if self._job != "run":
            return math.inf
        return self.lane.time_at(self.current_run.until) - 1e-9

    def pop_finished(self) -> None:
        """Decoding requests whose last token came with the step just ended."""
        for seq in self.decoding.finished_by(self.steps):
            self.stop_decoding(seq)
            del self.running[seq]
            self.free_blocks(seq, seq.num_blocks)
            self.hooks.finished(self, seq)

    # --------------------------------------------------------------- invariants
    def check_integrity(self) -> None:
        """Every block has an owner and the decoding aggregate matches its members (call at
        a step boundary; tests do after every step)."""
        self.pool.check_integrity()
        self.decoding.check([s for s in self.running if s.is_decoding])
        assert set(self.prefilling) == {s for s in self.running if not s.is_decoding}
        private = sum(self.blocks_of(s) - s.num_prefix_blocks for s in self.running)
        private += sum(s.num_blocks - s.num_prefix_blocks for s in self.held)
        private += sum(s.num_blocks - s.num_prefix_blocks for s in self.reserved)
        private += sum(s.num_blocks - s.num_prefix_blocks for s in self.ready)
        assert private == self.pool.num_used, (private, self.pool.num_used)
        assert sum(s.host_blocks for s in self.swapped) == self.pool.num_host_used
        for s in self.running:
            assert self.blocks_of(s) >= self.pool.blocks_for(self.computed_of(s))
        assert not any(s.num_blocks for s in self.waiting)

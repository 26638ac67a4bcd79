"""Decode runs of a simulated worker (``engine_model``): when every running request is one
token behind and nothing can join, the next k steps are alike and run as one job.

    try_run(w)   at a step boundary: start a run (True), or leave every request where it
                 was for an exact step (``step_plan``)
    cut_run(w)   a command arrived mid-run: end it at the end of the step in progress
    end_run(w)   at the run's end: blocks, token gaps, finishes

The arithmetic of a run is ``decode_run.DecodeRun``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pdserve.plan.decode_run import DecodeRun
from pdserve.plan.seq import Seq
from pdserve.plan.step_plan import admission, prefill_budget

if TYPE_CHECKING:
    from pdserve.plan.engine_model import EngineModel


def try_run(w: EngineModel) -> bool:
    """Start a decode run if the next steps are all alike; False to plan exactly (with
    every request where it was)."""
    if w.prefilling or w.swapped or w.stale or w.first_pending:
        return False  # (an admission's step is exact: its first token goes out at its end)
    s = w.settings
    joined: list[Seq] = []
    while w.ready and len(w.running) < s.max_num_seqs:  # joins at the boundary
        seq = w.ready.popleft()  # its blocks hold the prompt: a decode needs no more
        w.running[seq] = None
        w.start_decoding(seq)
        joined.append(seq)
    b = w.decoding.count
    k = 0
    if not w.ready and 0 < b <= s.max_num_batched_tokens and b == len(w.running):
        if not (w.waiting and _can_admit_head(w, b)):
            k = w.decoding.next_finish_step() - w.steps
            # A run never evicts a cached prefix: an exact step does it when it must.
            k = w.decoding.max_steps_for(k, w.pool.num_free_uncached, w.steps)
    if k <= 0:
        for seq in reversed(joined):  # back to the ready queue, as if never taken
            _unjoin(w, seq)
        return False
    context = w.decoding.sum_offset + b * (w.steps + 1)  # every context after step 1
    first = w.cost.decode_seconds(b, context)
    slope = w.cost.decode_slope(b)
    w.current_run = DecodeRun(k, first, slope)
    w.begin_job("run", w.current_run.work(k))
    return True


def _unjoin(w: EngineModel, seq: Seq) -> None:
    w.decoding.remove(seq)
    del w.running[seq]
    w.ready.appendleft(seq)


def _can_admit_head(w: EngineModel, num_decode_tokens: int) -> bool:
    """Whether the scheduler would admit the first waiting request in the next step (it
    stays blocked through a decode run: blocks and seats only free up at a finish)."""
    s = w.settings
    if len(w.running) >= s.max_num_seqs or num_decode_tokens >= s.max_num_batched_tokens:
        return False
    budget = s.max_num_batched_tokens - num_decode_tokens
    plan = admission(w, w.waiting[0], budget, prefill_budget(s, True))
    return plan is not None and plan[2] + w.extra_blocks(1) <= w.pool.num_free


def cut_run(w: EngineModel) -> None:
    """End the run at the end of the step in progress (a command is waiting)."""
    run = w.current_run
    m = max(1, min(run.k, math.ceil(run.steps(w.lane.work_done()) - 1e-9)))
    if m == run.k:
        return
    run.k = m
    w.lane.set_total(run.work(m))


def end_run(w: EngineModel) -> None:
    run = w.current_run
    k, a, slope = run.k, run.a, run.slope
    t0, t1 = w.t_start, w.loop.now
    b = w.decoding.count
    taken = w.pool.allocate(w.extra_blocks(k))
    assert taken, "a decode run outgrew its blocks"
    work = run.work(k)
    scale = (t1 - t0) / work if work > 0 else 0.0
    w.sink.gaps(a * scale, (a + slope * (k - 1)) * scale, k, b)
    if w.record_tokens:
        ends, done = [], 0.0
        for j in range(k):
            done += a + slope * j
            ends.append(t0 + done * scale)
        ends[-1] = t1
        for seq in w.running:
            seq.req.token_times.extend(ends)  # type: ignore[union-attr]
    w.steps += k
    w.num_steps_run += k
    w.num_tokens_computed += k * b
    w.pop_finished()

"""A decode run's arithmetic (``engine_model``): k alike decode steps as one job, step j (from
0) costing ``a + slope x j`` seconds of work at full speed.

    work(m)        the work of the first m steps (m real): m a + slope m (m - 1) / 2
    steps(done)    its inverse: the steps done after ``done`` work, as a real number
    steps_done(d)  the whole steps finished (at most k), as a load report counts them

A router polls every worker in a run every 0.1 s of simulated time, and a worker's reported
blocks grow only at the steps where one of its requests needs a new block: the worker keeps
the figure (``blocks``) with the work up to which it holds (``until``), so a poll before then
costs nothing (``EngineModel.load_steady_until`` turns it into a time for the router).
"""

from __future__ import annotations

import math

STEP_EPS = 1e-9  # a step "done" within this of its end counts as done (float noise)
# ``until`` stops this far (in steps) short of the step whose end changes the figure: far more
# than the rounding error of ``steps``, so the floor cannot move before ``until``.
UNTIL_MARGIN = 1e-6


class DecodeRun:
    __slots__ = ("a", "blocks", "k", "slope", "until")

    def __init__(self, k: int, a: float, slope: float) -> None:
        self.k = k  # steps (a cut makes it smaller: ``run_plan.cut_run``)
        self.a = a  # the first step's work
        self.slope = slope  # each step's growth
        self.blocks = 0  # the worker's reported blocks, valid while work done < until
        self.until = -math.inf

    def work(self, m: float) -> float:
        return m * self.a + self.slope * m * (m - 1) / 2

    def steps(self, done: float) -> float:
        """Steps done after ``done`` work, as a real number (``work`` solved for m)."""
        a, slope = self.a, self.slope
        if slope > 0:
            h = a - slope / 2
            return (-h + math.sqrt(h * h + 2 * slope * done)) / slope
        return done / a if a > 0 else float(self.k)

    def steps_done(self, done: float) -> int:
        """Whole steps finished after ``done`` work."""
        return min(self.k, math.floor(self.steps(done) + STEP_EPS))

    def hold(self, blocks: int, next_change: int | None) -> None:
        """Keep ``blocks`` until the end of step ``next_change`` (None: the run's end)."""
        self.blocks = blocks
        if next_change is None or next_change > self.k:
            self.until = math.inf
        else:
            self.until = self.work(next_change - UNTIL_MARGIN)

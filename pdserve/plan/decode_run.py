"""A decode run's arithmetic (``engine_model``): k alike decode steps as one job, step j (from
0) costing ``a + slope x j`` seconds of work at full speed.

    work(m)        the work of the first m steps (m real): m a + slope m (m - 1) / 2
    steps(done)    its inverse: the steps done after ``done`` work, as a real number
    steps_done(d)  the whole steps finished (at most k), as a load report counts them

A router polls a worker in a run often (every 0.1 s of simulated time, for every worker in a
run at once): ``steps_done`` remembers its answer up to the work at which the next step could
end, so a poll between two step ends costs one comparison, not a square root.
"""

from __future__ import annotations

import math

_EPS = 1e-9  # a step "done" within this of its end counts as done (float noise)


class DecodeRun:
    __slots__ = ("_steps", "_until", "a", "blocks", "blocks_at", "k", "slope")

    def __init__(self, k: int, a: float, slope: float) -> None:
        self.k = k  # steps (a cut makes it smaller: ``engine_model._cut_run``)
        self.a = a  # the first step's work
        self.slope = slope  # each step's growth
        self._steps = 0  # steps_done's last answer, valid while the work is below _until
        self._until = -math.inf
        # The worker's reported blocks after ``blocks_at`` steps (its cache: -1 = none).
        self.blocks_at = -1
        self.blocks = 0

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
        """Whole steps finished after ``done`` work (``done`` never goes down in a run)."""
        if done < self._until:
            return min(self.k, self._steps)
        m = min(self.k, math.floor(self.steps(done) + _EPS))
        self._steps = m
        # Below work(m + 1 - 1e-6), steps() stays under m + 1 - _EPS by far more than its
        # rounding error: the floor cannot move.
        self._until = self.work(m + 1 - 1e-6) if m < self.k else math.inf
        return m

"""Where a worker's work runs: a lane of a core group, shared by processor sharing.

A worker hands its lane a job: ``work`` seconds of compute at full speed (a step, or a run
of decode steps). When the workers of a group that are busy need more cores than the group
has, each busy lane runs at ``cores / busy`` of full speed (the kernel's fair scheduler
between single-threaded processes pinned to the same cores); otherwise at full speed. A
lane's end time is re-planned whenever its rate changes.

A GPU (or a CPU worker with its own cores) is a group of one: it always runs at full speed.
On this project's 2-core machine, 1P2D puts the two decode workers on one core: a group of
two lanes and one core.
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.plan.events import EventLoop


class Lane:
    __slots__ = (
        "_done",
        "_end_version",
        "_group",
        "_loop",
        "_rate",
        "_t",
        "_total",
        "_work",
        "on_rate_change",
    )

    def __init__(self, loop: EventLoop, group: CoreGroup) -> None:
        self._loop = loop
        self._group = group
        self._total = 0.0  # the current job's work (0: idle)
        self._work = 0.0  # work done on it at time _t
        self._t = 0.0
        self._rate = 1.0
        self._done: Callable[[], None] | None = None
        self._end_version = 0
        # Told when another lane of the group changes this one's rate mid-job (its
        # ``time_at`` answers move).
        self.on_rate_change: Callable[[], None] | None = None
        group.lanes.append(self)

    @property
    def is_busy(self) -> bool:
        return self._done is not None

    def start(self, work: float, done: Callable[[], None]) -> None:
        """Run a job of ``work`` seconds; ``done()`` is called when it completes. The lane
        must be idle."""
        assert self._done is None, "lane is busy"
        self._total = work
        self._work = 0.0
        self._t = self._loop.now
        self._done = done
        self._group.changed(self)

    def work_done(self) -> float:
        """Work done on the current job by now."""
        return self._work + (self._loop.now - self._t) * self._rate

    def time_at(self, work: float) -> float:
        """When the current job reaches ``work`` at the rate it runs at now."""
        return self._t + (work - self._work) / self._rate

    def set_total(self, work: float) -> None:
        """Shorten (or lengthen) the current job, e.g. to end a run at a step boundary; not
        below the work already done."""
        self._settle()
        self._total = max(work, self._work)
        self._plan_end()

    def _settle(self) -> None:
        now = self._loop.now
        self._work += (now - self._t) * self._rate
        self._t = now

    def _set_rate(self, rate: float) -> None:
        if self._done is None:
            self._rate = rate
            return
        self._settle()
        self._rate = rate
        self._plan_end()
        if self.on_rate_change is not None:
            self.on_rate_change()

    def _plan_end(self) -> None:
        self._end_version += 1
        remaining = max(0.0, self._total - self._work)
        self._loop.at(self._loop.now + remaining / self._rate, self._end, self._end_version)

    def _end(self, version: int) -> None:
        if version != self._end_version or self._done is None:
            return
        done = self._done
        self._done = None
        self._total = self._work = 0.0
        self._group.changed(self)
        done()


class CoreGroup:
    """``cores`` cores shared by its lanes (``lane()`` adds one)."""

    def __init__(self, loop: EventLoop, cores: float = 1.0, name: str = "") -> None:
        if cores <= 0:
            raise ValueError(f"a core group needs cores > 0, got {cores}")
        self.loop = loop
        self.cores = cores
        self.name = name
        self.lanes: list[Lane] = []
        self._rate = 1.0

    def lane(self) -> Lane:
        return Lane(self.loop, self)

    def changed(self, who: Lane) -> None:
        if len(self.lanes) == 1:  # a dedicated lane: always full speed
            if who.is_busy:
                who._plan_end()
            return
        busy = sum(1 for lane in self.lanes if lane.is_busy)
        rate = min(1.0, self.cores / busy) if busy else 1.0
        if rate != self._rate:
            self._rate = rate
            for lane in self.lanes:
                if lane is not who:
                    lane._set_rate(rate)
        who._rate = rate
        if who.is_busy:
            who._settle()
            who._plan_end()

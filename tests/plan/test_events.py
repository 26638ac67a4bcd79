"""The event loop: time order, FIFO among equal times, past times run now, ``until``."""

from __future__ import annotations

import random

from pdserve.plan.events import EventLoop


def test_time_order_and_fifo_ties_with_a_seed() -> None:
    rng = random.Random(7)
    loop = EventLoop()
    seen: list[tuple[float, int]] = []
    times = [rng.choice([0.5, 1.0, 2.0, 3.5]) for _ in range(200)]
    for i, t in enumerate(times):
        loop.at(t, lambda arg: seen.append((loop.now, arg)), i)
    loop.run()
    assert [t for t, _ in seen] == sorted(times)
    for t in set(times):  # same time: in the order scheduled
        assert [i for u, i in seen if u == t] == [i for i, u in enumerate(times) if u == t]
    assert loop.num_events == 200 and loop.is_empty


def test_past_time_runs_now_and_callbacks_schedule_more() -> None:
    loop = EventLoop()
    log: list[str] = []

    def first(_: object) -> None:
        log.append(f"first@{loop.now}")
        loop.at(0.0, lambda _: log.append(f"past@{loop.now}"))  # in the past: runs now
        loop.after(1.5, lambda _: log.append(f"later@{loop.now}"))

    loop.at(2.0, first)
    loop.run()
    assert log == ["first@2.0", "past@2.0", "later@3.5"]


def test_run_until_stops_and_advances_the_clock() -> None:
    loop = EventLoop()
    hits: list[float] = []
    for t in (1.0, 2.0, 3.0):
        loop.at(t, lambda _: hits.append(loop.now))
    loop.run(until=2.5)
    assert hits == [1.0, 2.0] and loop.now == 2.5 and not loop.is_empty
    loop.run()
    assert hits == [1.0, 2.0, 3.0]

"""The incremental structures of a poll: ``LoadBoard`` (a list re-reading only marked and
moving entries) and ``DecodeRun.steps_done`` (remembered between step ends), each against the
plain computation it replaces, over seeded random histories."""

from __future__ import annotations

import math
import random

import pytest

from pdserve.plan.decode_run import DecodeRun
from pdserve.plan.load_board import LoadBoard


class _World:
    """n values that change at random: some with a mark (an event), some (the moving ones)
    without one."""

    def __init__(self, rng: random.Random, n: int) -> None:
        self.rng = rng
        self.values = [rng.randrange(5) for _ in range(n)]
        self.moving = [rng.random() < 0.3 for _ in range(n)]
        self.reads = 0
        self.objects: dict[tuple[int, int], tuple[int, int]] = {}

    def read(self, i: int) -> tuple[tuple[int, int], bool]:
        self.reads += 1
        # One object per (entry, value), as the router keeps its candidate while the key
        # is unchanged: an unchanged entry is the same object.
        item = self.objects.setdefault((i, self.values[i]), (i, self.values[i]))
        return item, self.moving[i]


@pytest.mark.parametrize("seed", range(6))
def test_sync_equals_a_full_read_and_handed_out_lists_never_change(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 7, 64])
    world = _World(rng, n)
    board = LoadBoard(n, world.read)
    handed: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []
    for _ in range(300):
        for _ in range(rng.randrange(4)):  # events: a change, told
            i = rng.randrange(n)
            world.values[i] = rng.randrange(5)
            world.moving[i] = rng.random() < 0.3
            board.mark(i)
        for i in range(n):  # time passes: moving entries change untold
            if world.moving[i] and rng.random() < 0.5:
                world.values[i] = rng.randrange(5)
        if rng.random() < 0.2:  # a mark with no change costs a read, changes nothing
            board.mark(rng.randrange(n))
        before = world.reads
        got = board.sync()
        assert world.reads - before <= n
        assert got == [(i, world.values[i]) for i in range(n)]
        assert board.items is got
        assert board.num_moving == sum(world.moving)
        handed.append((got, list(got)))
    for lst, copy in handed:
        assert lst == copy  # copy on write: no list handed out was changed later


def test_sync_reads_only_marked_and_moving_entries() -> None:
    world = _World(random.Random(0), 100)
    world.moving = [i < 10 for i in range(100)]
    board = LoadBoard(100, world.read)
    assert world.reads == 100
    first = board.sync()
    assert world.reads == 110  # the 10 moving ones
    board.mark(50)
    board.mark(50)
    board.sync()
    assert world.reads == 121
    world.moving = [False] * 100
    board.sync()  # they stop moving when a read says so
    board.sync()
    assert world.reads == 131
    assert board.sync() is first  # nothing changed: the same list, no copy


def test_put_sets_one_entry_copy_on_write() -> None:
    world = _World(random.Random(1), 5)
    board = LoadBoard(5, world.read)
    a = board.items
    board.put(2, (2, 99))
    assert a[2] == (2, world.values[2]) and board.items[2] == (2, 99)
    b = board.items
    board.put(3, b[3])  # the same object: nothing to copy
    assert board.items is b
    board.mark(2)
    assert board.sync()[2] == (2, world.values[2])  # a mark reads it again


@pytest.mark.parametrize("seed", range(8))
def test_steps_done_equals_the_floor_of_the_inverse_at_every_poll(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        k = rng.randint(1, 300)
        a = rng.choice([0.0, rng.uniform(1e-4, 0.5)])
        slope = rng.choice([0.0, rng.uniform(1e-8, 1e-3)])
        run = DecodeRun(k, a, slope)
        done = 0.0
        total = run.work(k)
        polls = []
        while done <= total * 1.1:
            polls.append(done)
            if rng.random() < 0.3:  # exactly at a step's end, or just around it
                m = rng.randint(0, k)
                polls += [run.work(m), math.nextafter(run.work(m), -1.0),
                          math.nextafter(run.work(m), 2.0)]
            done += rng.expovariate(1.0) * max(total, 1e-6) / rng.choice([3, 30, 300])
        for done in sorted(p for p in polls if p >= 0):
            if rng.random() < 0.05 and run.k > 1:  # a command cuts the run
                run.k = max(1, min(run.k, math.ceil(run.steps(done) - 1e-9)))
            want = min(run.k, math.floor(run.steps(done) + 1e-9))
            assert run.steps_done(done) == want, (k, a, slope, done)

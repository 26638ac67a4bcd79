"""The incremental structures of a poll, each against the plain computation it replaces, over
seeded random histories: ``LoadBoard`` (a list re-reading only marked entries and those whose
time came), ``DecodingSet.next_growth`` and ``DecodeRun`` (a run's reported blocks held to
the step where they next grow)."""

from __future__ import annotations

import math
import random

import pytest

from pdserve.plan.decode_run import DecodeRun
from pdserve.plan.decoding_set import DecodingSet
from pdserve.plan.load_board import LoadBoard
from pdserve.plan.seq import FULL, Seq
from pdserve.plan.sim_request import SimRequest


class _World:
    """n values that change at random: at an event (the board is told: ``mark``), or, for a
    timed entry, by itself from its due time on (the board is not told)."""

    def __init__(self, rng: random.Random, n: int) -> None:
        self.rng = rng
        self.now = 0.0
        self.values = [rng.randrange(5) for _ in range(n)]
        self.due = [self.new_due() for _ in range(n)]
        self.reads: list[int] = []
        self.objects: dict[tuple[int, int], tuple[int, int]] = {}

    def new_due(self) -> float:
        return self.now + self.rng.expovariate(1.0) if self.rng.random() < 0.3 else math.inf

    def read(self, i: int) -> tuple[tuple[int, int], float]:
        self.reads.append(i)
        # One object per (entry, value), as the router keeps its candidate while the key
        # is unchanged: an unchanged entry is the same object.
        item = self.objects.setdefault((i, self.values[i]), (i, self.values[i]))
        return item, self.due[i]

    def advance(self, dt: float) -> None:
        self.now += dt
        for i, due in enumerate(self.due):
            while due <= self.now:  # a timed entry changes by itself, untold
                self.values[i] = self.rng.randrange(5)
                due = self.due[i] = due + self.rng.expovariate(1.0)


@pytest.mark.parametrize("seed", range(6))
def test_sync_equals_a_full_read_and_handed_out_lists_never_change(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 7, 64])
    world = _World(rng, n)
    board = LoadBoard(n, world.read)
    handed: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []
    for _ in range(300):
        world.advance(rng.choice([0.0, 0.05, 0.5]))
        marked = set()
        for _ in range(rng.randrange(4)):  # events: a change, told
            i = rng.randrange(n)
            world.values[i] = rng.randrange(5)
            world.due[i] = world.new_due()
            board.mark(i)
            marked.add(i)
        if rng.random() < 0.2:  # a mark with no change costs a read, changes nothing
            i = rng.randrange(n)
            board.mark(i)
            marked.add(i)
        del world.reads[:]
        got = board.sync(world.now)
        assert got == [(i, world.values[i]) for i in range(n)]
        # Read: the marked ones and those due; no entry twice.
        assert len(world.reads) == len(set(world.reads))
        assert set(world.reads) - marked <= {i for i, d in enumerate(world.due) if d < math.inf}
        assert board.items is got
        assert board.num_timed == sum(d < math.inf for d in world.due)
        handed.append((got, list(got)))
    for lst, copy in handed:
        assert lst == copy  # copy on write: no list handed out was changed later


def test_sync_reads_only_what_is_marked_or_due() -> None:
    world = _World(random.Random(0), 100)
    world.due = [float(i + 1) if i < 10 else math.inf for i in range(100)]
    board = LoadBoard(100, world.read)
    assert len(world.reads) == 100
    first = board.sync(0.5)
    assert len(world.reads) == 100  # nothing due yet, nothing marked: the same list
    assert board.sync(0.5) is first
    board.mark(50)
    board.mark(50)
    board.sync(0.5)
    assert world.reads[100:] == [50]
    world.due[0] = math.inf  # entry 0 stops being timed once read
    board.sync(3.0)  # entries 0, 1, 2 are due (at 1, 2, 3)
    assert sorted(world.reads[101:]) == [0, 1, 2]
    assert board.num_timed == 9
    board.sync(3.0)  # 1 and 2 said 2 and 3 again: a time already past is read each sync
    assert sorted(world.reads[104:]) == [1, 2]
    board.sync(9.5)  # the other timed ones due by then (3..8 at 4..9), each once
    assert sorted(world.reads[106:]) == [1, 2, *range(3, 9)]


def test_put_sets_one_entry_copy_on_write() -> None:
    world = _World(random.Random(1), 5)
    world.due = [math.inf] * 5
    board = LoadBoard(5, world.read)
    a = board.items
    board.put(2, (2, 99))
    assert a[2] == (2, world.values[2]) and board.items[2] == (2, 99)
    b = board.items
    board.put(3, b[3])  # the same object: nothing to copy
    assert board.items is b
    board.mark(2)
    assert board.sync(0.0)[2] == (2, world.values[2])  # a mark reads it again


def _decoding(rng: random.Random, bs: int, steps: int) -> DecodingSet:
    d = DecodingSet(bs)
    for _ in range(rng.choice([0, 1, 2, 5])):
        seq = Seq(SimRequest(0, 0.0, rng.randint(1, 100), 1000), FULL)
        seq.computed = steps + rng.randint(0, 200)
        d.add(seq, steps)
    return d


@pytest.mark.parametrize("seed", range(8))
def test_next_growth_is_the_first_step_that_needs_another_block(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        bs, steps = rng.choice([1, 4, 16]), rng.randint(0, 50)
        d = _decoding(rng, bs, steps)
        m = rng.randint(0, 40)
        grow = d.next_growth(m, steps)
        base = d.extra_blocks(m, steps)
        later = [j for j in range(m + 1, m + 2 * bs + 2) if d.extra_blocks(j, steps) > base]
        assert grow == (later[0] if later else None)


@pytest.mark.parametrize("seed", range(8))
def test_a_runs_held_blocks_equal_the_blocks_after_the_steps_done(seed: int) -> None:
    """What ``EngineModel.num_blocks_in_use`` does in a run (hold until the next growth),
    against the direct figure at every poll: exact step ends, just around them, cuts."""
    rng = random.Random(seed)
    for _ in range(50):
        bs, steps, in_use = rng.choice([1, 4, 16]), rng.randint(0, 50), rng.randint(0, 9)
        d = _decoding(rng, bs, steps)
        k = rng.randint(1, 300)
        run = DecodeRun(
            k, rng.choice([0.0, rng.uniform(1e-4, 0.5)]), rng.choice([0.0, rng.uniform(1e-8, 1e-3)])
        )
        total = run.work(k)
        polls, done = [], 0.0
        while done <= total * 1.1:
            polls.append(done)
            if rng.random() < 0.3:
                m = rng.randint(0, k)
                w = run.work(m)
                polls += [w, math.nextafter(w, -1.0), math.nextafter(w, 2.0)]
            done += rng.expovariate(1.0) * max(total, 1e-6) / rng.choice([3, 30, 300])
        for done in sorted(p for p in polls if p >= 0):
            if rng.random() < 0.05 and run.k > 1:  # a command cuts the run
                run.k = max(1, min(run.k, math.ceil(run.steps(done) - 1e-9)))
            m = min(run.k, math.floor(run.steps(done) + 1e-9))
            if done >= run.until:
                mm = run.steps_done(done)
                run.hold(in_use + d.extra_blocks(mm, steps), d.next_growth(mm, steps))
            assert run.blocks == in_use + d.extra_blocks(m, steps), (k, run.a, done)

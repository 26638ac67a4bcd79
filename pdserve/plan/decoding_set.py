"""The decoding requests of one simulated worker, in aggregate (``engine_model``).

A decoding request is one token behind and gains one token per step, so it is stored as an
``offset`` against the worker's step count (computed = offset + steps) and never touched by a
step. The set keeps what decode runs need without visiting members: how many there are, the
sum of their offsets (the batch's total context), how many sit at each offset modulo the block
size (which of them need a new block at a given step), and a heap of their finish steps.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from pdserve.plan.seq import Seq


class DecodingSet:
    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.count = 0
        self.sum_offset = 0
        self.residues = [0] * block_size  # members by offset mod block size
        self._finish: list[tuple[int, int, Seq, int]] = []  # (step, tie, seq, epoch)
        self._tie = 0

    def add(self, seq: Seq, steps: int) -> None:
        """``seq`` (one token behind) joins at step count ``steps``."""
        seq.is_decoding = True
        seq.offset = seq.computed - steps
        seq.finish_step = steps + seq.req.num_output - seq.num_out
        self.count += 1
        self.sum_offset += seq.offset
        self.residues[seq.offset % self.bs] += 1
        self._push(seq)

    def shift(self, seq: Seq, delta: int) -> None:
        """Move a member's computed count by ``delta`` against the step count (a step it sat
        out: -1); it finishes that much later."""
        self.residues[seq.offset % self.bs] -= 1
        seq.offset += delta
        self.sum_offset += delta
        self.residues[seq.offset % self.bs] += 1
        seq.finish_step -= delta
        seq.epoch += 1
        self._push(seq)

    def remove(self, seq: Seq) -> None:
        """``seq`` leaves (its heap entry goes stale: the epoch moves on)."""
        seq.is_decoding = False
        seq.epoch += 1
        self.count -= 1
        self.sum_offset -= seq.offset
        self.residues[seq.offset % self.bs] -= 1

    def next_finish_step(self) -> int:
        """The step at which the first member finishes (the set must not be empty)."""
        fin = self._finish
        while fin and fin[0][3] != fin[0][2].epoch:
            heapq.heappop(fin)  # stale entries of requests that left
        return fin[0][0]

    def finished_by(self, steps: int) -> Iterator[Seq]:
        """Members whose last token came by step ``steps`` (the caller removes each)."""
        fin = self._finish
        while fin and fin[0][0] <= steps:
            _, _, seq, epoch = heapq.heappop(fin)
            if epoch == seq.epoch:
                yield seq

    def extra_blocks(self, m: int, steps: int) -> int:
        """Blocks the members need beyond what they hold to run ``m`` more steps."""
        bs, res = self.bs, self.residues
        extra = (m // bs) * self.count
        for j in range(1, m % bs + 1):
            extra += res[(1 - steps - j) % bs]
        return extra

    def next_growth(self, m: int, steps: int) -> int | None:
        """The first step count m' > m with ``extra_blocks(m') > extra_blocks(m)`` (None: no
        member)."""
        if not self.count:
            return None
        bs, res = self.bs, self.residues
        j = m + 1
        while not res[(1 - steps - j) % bs]:  # some residue is occupied: < bs turns
            j += 1
        return j

    def max_steps_for(self, k: int, free: int, steps: int) -> int:
        """The most steps (<= k) the members can run within ``free`` blocks."""
        bs, b, res = self.bs, self.count, self.residues
        cycles = min(k // bs, free // b) if b else k // bs
        m, used = cycles * bs, cycles * b
        while m < k:
            add = res[(1 - steps - (m + 1)) % bs]
            if used + add > free:
                break
            used += add
            m += 1
        return m

    def check(self, members: list[Seq]) -> None:
        """The aggregate matches ``members`` (every decoding request of the worker)."""
        assert len(members) == self.count
        assert sum(s.offset for s in members) == self.sum_offset
        res = [0] * self.bs
        for s in members:
            res[s.offset % self.bs] += 1
        assert res == self.residues

    def _push(self, seq: Seq) -> None:
        self._tie += 1
        heapq.heappush(self._finish, (seq.finish_step, self._tie, seq, seq.epoch))

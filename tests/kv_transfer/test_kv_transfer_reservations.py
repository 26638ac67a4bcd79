"""The decode-side reservation table, alone: plain Python, a fake clock, no I/O."""

from __future__ import annotations

import pytest

from engine.block_hash import BlockHash
from kv_transfer.reservations import (
    CompletedTransfer,
    ReleaseReason,
    ReservationTable,
    WriteGrant,
    WriteStatus,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Owner:
    def __init__(self) -> None:
        self.completed: list[CompletedTransfer] = []
        self.released: list[tuple[str, tuple[int, ...], ReleaseReason]] = []
        self.intact: dict[str, int] = {}  # request id -> num_intact_blocks of its release

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        self.completed.append(result)

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        self.released.append((request_id, block_ids, reason))
        self.intact[request_id] = num_intact_blocks


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
def table(owner: Owner, clock: Clock) -> ReservationTable:
    return ReservationTable(16, owner, bytes_per_block=10, default_lease_s=5.0, clock=clock)


def write(table: ReservationTable, rid: str, token: bytes, pairs, **kw) -> WriteGrant:
    grant = table.begin_write(rid, token, [i for i, _ in pairs], [b for _, b in pairs], "p", **kw)
    assert isinstance(grant, WriteGrant), grant
    return grant


def test_complete_after_every_expected_block_and_the_final_message(table, owner):
    token, lease = table.reserve("r", [4, 9, 2], {0: BlockHash(b"h" * 16)})
    assert lease == 5.0 and len(token) == 16
    assert table.end_write(write(table, "r", token, [(1, 9)]), ok=True) == (WriteStatus.OK, 1)
    assert not owner.completed
    grant = write(
        table, "r", token, [(2, 2)], is_last=True, first_token_id=7, first_token_logprob=-1.5
    )
    assert table.end_write(grant, ok=True) == (WriteStatus.OK, 0)
    [done] = owner.completed
    assert (done.request_id, done.block_ids, done.first_token_id) == ("r", (4, 9, 2), 7)
    assert done.num_blocks_received == 2 and done.num_bytes_received == 20
    assert "r" not in table and not owner.released
    table.check_integrity()


def test_final_message_with_missing_blocks_is_incomplete_and_reservation_stays(table, owner):
    token, _ = table.reserve("r", [1, 2])
    grant = write(table, "r", token, [(0, 1)], is_last=True)
    assert table.end_write(grant, ok=True) == (WriteStatus.INCOMPLETE, 1)
    assert "r" in table and not owner.completed
    # The missing block arriving later completes it (order-independent).
    assert table.end_write(write(table, "r", token, [(1, 2)]), ok=True) == (WriteStatus.OK, 0)
    assert len(owner.completed) == 1


def test_duplicate_write_is_idempotent_and_late_write_after_completion_is_refused(table, owner):
    token, _ = table.reserve("r", [3])
    table.end_write(write(table, "r", token, [(0, 3)]), ok=True)
    table.end_write(write(table, "r", token, [(0, 3)]), ok=True)  # duplicate: harmless
    table.end_write(write(table, "r", token, [], is_last=True), ok=True)
    assert len(owner.completed) == 1 and owner.completed[0].num_blocks_received == 1
    late = table.begin_write("r", token, [0], [3], "p")
    assert late == (WriteStatus.UNKNOWN_RESERVATION, "no live reservation for 'r'")


def test_refusals_bad_token_foreign_block_cached_block(table):
    token, _ = table.reserve("a", [1, 2], {0: BlockHash(b"x" * 16)})
    table.reserve("b", [3, 4])
    assert table.begin_write("a", b"0" * 16, [1], [2], "p")[0] == WriteStatus.BAD_TOKEN  # type: ignore[index]
    assert table.begin_write("a", token, [0], [3], "p")[0] == WriteStatus.FOREIGN_BLOCK  # type: ignore[index]
    assert table.begin_write("a", token, [0], [1], "p")[0] == WriteStatus.FOREIGN_BLOCK  # type: ignore[index]
    assert table.begin_write("a", token, [1], [1], "p")[0] == WriteStatus.FOREIGN_BLOCK  # type: ignore[index]
    assert table.begin_write("zz", token, [1], [2], "p")[0] == WriteStatus.UNKNOWN_RESERVATION  # type: ignore[index]
    table.check_integrity()


def test_release_waits_for_the_write_in_flight(table, owner):
    token, _ = table.reserve("r", [5, 6])
    grant = write(table, "r", token, [(0, 5)])
    assert table.abort("r") is True
    assert not owner.released  # bytes may still be landing in block 5
    assert table.begin_write("r", token, [1], [6], "p")[0] == WriteStatus.UNKNOWN_RESERVATION  # type: ignore[index]
    assert table.end_write(grant, ok=True)[0] == WriteStatus.UNKNOWN_RESERVATION
    assert owner.released == [("r", (5, 6), ReleaseReason.ABORTED)]
    assert table.abort("r") is False  # idempotent
    assert len(table) == 0
    table.check_integrity()


def test_a_release_reports_the_leading_blocks_whose_kv_arrived_whole(table, owner, clock):
    """The owner may keep them as cached prefix: the cached block and the written ones
    before the first block still expected or being written (a write in flight at the
    release may be torn, and so may everything after it)."""
    cached = {0: BlockHash(b"h" * 16)}
    token, _ = table.reserve("r", [4, 9, 2, 5, 7], cached, lease_s=1.0)
    table.end_write(write(table, "r", token, [(1, 9)]), ok=True)
    table.end_write(write(table, "r", token, [(3, 5)]), ok=True)  # after a gap: not intact
    grant = write(table, "r", token, [(2, 2)])
    clock.now += 1.5
    table.expire()
    table.end_write(grant, ok=True)  # landed after the release: not counted
    assert owner.released == [("r", (4, 9, 2, 5, 7), ReleaseReason.EXPIRED)]
    assert owner.intact["r"] == 2
    # Every block written: all of them are intact, even with the final message missing.
    token, _ = table.reserve("all", [1, 3])
    table.end_write(write(table, "all", token, [(0, 1), (1, 3)]), ok=True)
    table.peer_lost("p")
    assert owner.intact["all"] == 2
    table.check_integrity()


def test_a_torn_rewrite_of_a_received_block_makes_it_expected_again(table, owner):
    token, _ = table.reserve("r", [6, 8])
    table.end_write(write(table, "r", token, [(0, 6)]), ok=True)
    table.end_write(write(table, "r", token, [(0, 6)]), ok=False)  # a duplicate, torn
    table.check_integrity()  # block 6 is writable again
    table.end_write(write(table, "r", token, [(1, 8)], is_last=True), ok=True)
    assert not owner.completed  # block 0 must arrive again
    assert table.abort("r") is True
    assert owner.intact["r"] == 0
    table.check_integrity()


def test_lease_expiry_renewal_and_stalled_peers(table, owner, clock):
    token, _ = table.reserve("idle", [1], lease_s=1.0)
    token2, _ = table.reserve("busy", [2], lease_s=1.0)
    grant = write(table, "busy", token2, [(0, 2)])
    clock.now += 0.9
    assert table.renew("idle", token) is True
    assert table.renew("idle", b"wrong" * 4) is False
    clock.now += 0.5
    assert table.expire() == ["p"]  # busy expired with a write in flight from peer "p"
    assert [r[0] for r in owner.released] == []  # idle was renewed; busy waits for its write
    table.end_write(grant, ok=False)
    assert owner.released == [("busy", (2,), ReleaseReason.EXPIRED)]
    clock.now += 1.0
    assert table.next_deadline() is not None
    table.expire()
    assert [r[0] for r in owner.released] == ["busy", "idle"]
    assert table.next_deadline() is None and len(table) == 0


def test_an_aborted_reservation_s_write_in_flight_is_not_a_stall_until_its_deadline(
    table, owner, clock
):
    """A client cancel aborts a reservation while its push is on the wire: the write keeps the
    blocks until it ends, but the peer is cut only if it is still in flight at the write's
    lease deadline. (The reaper used to report every releasing reservation with a write in
    flight as stalled at its next wake, and the cut released every other reservation of that
    prefill worker as peer_lost: CI's abort_storm[ucx].)"""
    token, _ = table.reserve("cancelled", [1], lease_s=1.0)
    table.reserve("other", [2], lease_s=1.0)
    grant = write(table, "cancelled", token, [(0, 1)])
    assert table.abort("cancelled") is True
    clock.now += 0.5
    assert table.renew("other") is True
    assert table.expire() == []  # the write has until its deadline
    assert table.next_deadline() == pytest.approx(101.0)  # the reaper wakes to check it
    clock.now += 0.6
    assert table.expire() == ["p"]  # now it is stalled: cut the peer
    assert table.expire() == []  # once: the cut ends the write
    assert table.next_deadline() == pytest.approx(101.5)  # "other"'s (renewed at 100.5)
    table.end_write(grant, ok=False)
    assert owner.released == [("cancelled", (1,), ReleaseReason.ABORTED)]
    assert "other" in table
    table.check_integrity()


def test_peer_lost_releases_only_that_peers_reservations(table, owner):
    t1, _ = table.reserve("one", [1])
    table.reserve("two", [2])
    table.end_write(write(table, "one", t1, [(0, 1)]), ok=True)  # written by peer "p"
    assert table.peer_lost("p") == 1
    assert owner.released == [("one", (1,), ReleaseReason.PEER_LOST)]
    assert "two" in table


def test_reserve_validates_ids(table):
    with pytest.raises(ValueError, match="outside the pool"):
        table.reserve("r", [16])
    with pytest.raises(ValueError, match="duplicate"):
        table.reserve("r", [1, 1])
    table.reserve("r", [1, 2])
    with pytest.raises(ValueError, match="already has a reservation"):
        table.reserve("r", [3])
    with pytest.raises(ValueError, match="another reservation"):
        table.reserve("s", [2, 3])
    # A cached (shared, read-only) block may appear in several reservations.
    table.reserve("t", [1, 5], {0: BlockHash(b"c" * 16)})
    table.check_integrity()


def test_tokens_are_unguessable(table):
    tokens = {table.reserve(f"r{i}", [i])[0] for i in range(8)}
    assert len(tokens) == 8

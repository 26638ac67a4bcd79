"""KV event numbering, catch-up, snapshots and the router's index, without Redis."""

from __future__ import annotations

import pytest

from control_plane.kv_events import (
    KVEvent,
    KVEventBatch,
    KVEventKind,
    KVEventLog,
    KVIndex,
)
from engine.block_hash import BlockHash, hash_block_tokens


def hashes(n: int, seed: int = 0) -> list[BlockHash]:
    return hash_block_tokens([seed * 1000 + i for i in range(n * 4)], block_size=4)


def test_payload_round_trip_and_malformed_payload() -> None:
    h = hashes(2)
    batch = KVEventBatch(
        "w",
        3,
        7,
        (
            KVEvent(KVEventKind.STORED, h[0]),
            KVEvent(KVEventKind.CLEARED),
            KVEvent(KVEventKind.REMOVED, h[1]),
        ),
    )
    assert KVEventBatch.decode_events(batch.encode_events()) == batch.events
    assert batch.last_seq == 9
    with pytest.raises(ValueError, match="inside a block hash"):
        KVEventBatch.decode_events(batch.encode_events()[:5])
    with pytest.raises(ValueError):
        KVEventBatch.decode_events(b"x")


def test_log_numbers_events_and_keeps_the_cached_set() -> None:
    log = KVEventLog("w1", generation=1)
    h = hashes(3)
    log.record_stored(h)
    log.record_removed([h[1]])
    first = log.take_unpublished(max_events=2)
    assert first is not None and (first.first_seq, first.last_seq) == (1, 2)
    second = log.take_unpublished()
    assert second is not None and (second.first_seq, second.last_seq) == (3, 4)
    assert log.take_unpublished() is None
    snap = log.snapshot()
    assert snap.last_seq == 4 and snap.block_hashes == {h[0], h[2]}
    since = log.since(2)
    assert since is not None and since.first_seq == 3 and len(since.events) == 2
    assert log.since(4) is not None and log.since(4).events == ()  # type: ignore[union-attr]


def test_log_forgets_old_events_and_asks_for_a_snapshot() -> None:
    log = KVEventLog("w1", generation=1, keep=2)
    log.record_stored(hashes(4))
    assert log.since(0) is None  # events 1-2 are gone: only a snapshot is correct
    kept = log.since(2)
    assert kept is not None and kept.first_seq == 3


def test_new_generation_restarts_numbering() -> None:
    log = KVEventLog("w1", generation=1)
    log.record_stored(hashes(2))
    log.set_generation(2)
    log.record_stored(hashes(1, seed=5))
    batch = log.take_unpublished()
    assert batch is not None and batch.generation == 2 and batch.first_seq == 1


def test_index_applies_in_order_and_detects_gaps_and_generations() -> None:
    log = KVEventLog("w1", generation=1)
    index = KVIndex()
    index.load_snapshot(log.snapshot())
    h = hashes(4)
    log.record_stored(h[:2])
    b1 = log.take_unpublished()
    log.record_stored(h[2:])
    b2 = log.take_unpublished()
    assert b1 is not None and b2 is not None
    assert index.apply(b1)
    assert index.apply(b1)  # a duplicate is skipped, not an error
    assert index.overlap(h) == {"w1": 2}
    assert index.apply(b2)
    assert index.overlap(h) == {"w1": 4}
    log.record_removed([h[1]])
    lost = log.take_unpublished()
    log.record_stored(hashes(1, seed=9))
    after_gap = log.take_unpublished()
    assert lost is not None and after_gap is not None
    assert not index.apply(after_gap)  # event 5 was never seen
    index.load_snapshot(log.snapshot())
    assert index.overlap(h) == {"w1": 1}  # a prefix cache serves only the leading run
    other_gen = KVEventBatch("w1", 2, 1, (KVEvent(KVEventKind.CLEARED),))
    assert not index.apply(other_gen)


def test_overlap_is_per_worker_leading_run_and_remove_worker() -> None:
    index = KVIndex()
    h = hashes(5)
    for worker, held in (("a", h[:3]), ("b", h[:5]), ("c", h[1:5])):
        log = KVEventLog(worker, generation=1)
        log.record_stored(held)
        index.load_snapshot(log.snapshot())
    assert index.overlap(h) == {"a": 3, "b": 5}  # c lacks block 0: no hit at all
    assert len(index) == 12
    index.remove_worker("b")
    assert index.overlap(h) == {"a": 3}
    cleared = KVEventBatch("a", 1, 4, (KVEvent(KVEventKind.CLEARED),))
    assert index.apply(cleared)
    assert index.overlap(h) == {}
    assert len(index) == 4  # c's blocks only

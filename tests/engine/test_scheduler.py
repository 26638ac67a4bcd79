"""Scheduler: chunk boundaries, admission, preemption order and mode, swap-before-admit.
Plain Python: no torch, no model."""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_config import SchedulerConfig
from engine.scheduler_output import SchedulerOutput


def make(num_blocks: int = 64, block_size: int = 4, num_host: int = 0, **cfg: object) -> Scheduler:
    options: dict[str, object] = dict(max_num_batched_tokens=64, max_model_len=256)
    options.update(cfg)
    bm = BlockManager(num_blocks, block_size, num_host)
    return Scheduler(SchedulerConfig(**options), bm)  # type: ignore[arg-type]


def req(
    rid: str, n: int, max_tokens: int = 8, t: float = 0.0, prio: int = 0, first: int = 100
) -> Request:
    return Request(
        rid,
        list(range(first, first + n)),
        SamplingParams(max_tokens=max_tokens, temperature=0),
        arrival_time=t,
        priority=prio,
        max_total_tokens=256,
    )


def step(s: Scheduler, token: int = 7) -> SchedulerOutput:
    out = s.schedule()
    s.update_from_output(out, {x.request_id: token for x in out.scheduled if x.sample})
    s.block_manager.check_integrity()
    return out


def shape(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [
        (x.request_id, x.num_computed_tokens, x.num_scheduled_tokens, x.sample)
        for x in out.scheduled
    ]


def test_chunked_prefill_boundaries_with_budget_7() -> None:
    s = make(max_num_batched_tokens=7)
    s.add_request(req("a", 10, t=0, first=100))
    s.add_request(req("b", 5, t=1, first=200))
    assert shape(step(s)) == [("a", 0, 7, False)]
    assert shape(step(s)) == [("a", 7, 3, True), ("b", 0, 4, False)]
    assert shape(step(s)) == [("a", 10, 1, True), ("b", 4, 1, True)]
    assert shape(step(s)) == [("a", 11, 1, True), ("b", 5, 1, True)]


def test_chunked_prefill_off_waits_for_whole_prompt() -> None:
    s = make(
        num_blocks=128, max_num_batched_tokens=300, enable_chunked_prefill=False, max_model_len=300
    )
    s.add_request(req("a", 250, first=1000))
    s.add_request(req("b", 100, first=2000))
    assert shape(step(s)) == [("a", 0, 250, True)]  # b (100) does not fit the 50 left
    assert shape(step(s)) == [("a", 250, 1, True), ("b", 0, 100, True)]


def test_max_num_seqs_caps_the_batch() -> None:
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", 4, t=i, first=10 * i))
    assert [x.request_id for x in step(s).scheduled] == ["r0", "r1"]
    assert len(s.waiting) == 1


def test_prefix_hit_skips_cached_blocks_but_keeps_last_token() -> None:
    s = make(block_size=4)
    s.add_request(req("a", 8, max_tokens=1))
    step(s)  # a finishes; its 2 full blocks stay cached
    assert not s.requests
    s.add_request(req("b", 10))  # same first 8 tokens
    s.add_request(req("c", 8))  # identical prompt: the last block must be recomputed
    out = step(s)
    assert shape(out) == [("b", 8, 2, True), ("c", 4, 4, True)]
    assert s.requests["b"].num_cached_tokens == 8
    assert s.stats.num_prefix_hit_blocks == 3


def test_recompute_preemption_order_fcfs() -> None:
    s = make(num_blocks=3, block_size=4, preemption_mode="recompute")
    for i, rid in enumerate("abc"):
        s.add_request(req(rid, 4, max_tokens=10, t=i, first=10 * i))
    step(s)  # each holds one full block and has sampled one token
    out = step(s)
    # a needs a second block: the latest arrival (c) goes; b then cannot grow and preempts itself.
    assert out.preempted_request_ids == ("c", "b")
    assert shape(out) == [("a", 4, 1, True)]
    assert [r.request_id for r in s.waiting] == ["b", "c"]
    b = s.requests["b"]
    assert b.num_computed_tokens == 0 and b.status == RequestStatus.PREEMPTED
    assert s.stats.num_preemptions_recompute == 2


def test_priority_policy_preempts_lowest_priority_first() -> None:
    s = make(num_blocks=3, block_size=4, preemption_mode="recompute", policy="priority")
    s.add_request(req("a", 4, max_tokens=10, t=0, prio=5))
    s.add_request(req("b", 4, max_tokens=10, t=1, prio=0))
    s.add_request(req("c", 4, max_tokens=10, t=2, prio=1))
    assert [x.request_id for x in step(s).scheduled] == ["b", "c", "a"]  # priority order
    out = step(s)
    assert out.preempted_request_ids[0] == "a"


def test_swap_preemption_and_swap_in_before_new_admissions() -> None:
    s = make(num_blocks=3, block_size=4, num_host=8, preemption_mode="swap")
    for i, rid in enumerate("abc"):
        s.add_request(req(rid, 4, max_tokens=3, t=i, first=10 * i))
    step(s)
    out = step(s)
    assert out.preempted_request_ids == ("c", "b")
    assert out.blocks_to_swap_out == ((2, 0), (1, 1))
    assert [r.request_id for r in s.swapped] == ["c", "b"]
    s.add_request(req("d", 4, t=3))
    # a finishes after its third token; then c and b swap back in before d is admitted.
    outs = [step(s) for _ in range(2)]
    assert any(o.blocks_to_swap_in for o in outs)
    swapped_back = [rid for o in outs for rid in (x.request_id for x in o.scheduled)]
    assert "d" not in swapped_back or swapped_back.index("c") < swapped_back.index("d")
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_blocks_swapped_in == s.stats.num_blocks_swapped_out >= 2
    assert s.block_manager.is_idle()


def test_auto_mode_swaps_long_and_recomputes_short() -> None:
    s = make(
        num_blocks=9, block_size=4, num_host=16, preemption_mode="auto", swap_threshold_tokens=8
    )
    s.add_request(req("long", 12, max_tokens=20, t=0))
    s.add_request(req("short", 4, max_tokens=20, t=1))
    s.add_request(req("long2", 12, max_tokens=20, t=2))
    for _ in range(6):
        step(s)
    assert s.stats.num_preemptions > 0
    while s.has_unfinished_requests():
        step(s)
    assert s.stats.num_preemptions_swap > 0 or s.stats.num_preemptions_recompute > 0
    assert s.block_manager.is_idle()


def test_finish_request_anywhere_is_idempotent() -> None:
    s = make(num_blocks=3, block_size=4, num_host=8, preemption_mode="swap")
    for i, rid in enumerate("abcd"):
        s.add_request(req(rid, 4, max_tokens=10, t=i, first=10 * i))
    step(s)
    step(s)  # c, b swapped; d waiting; a running
    assert s.finish_request("a", RequestStatus.FINISHED_ABORTED) is not None
    assert s.finish_request("b", RequestStatus.FINISHED_ABORTED) is not None
    assert s.finish_request("d", RequestStatus.FINISHED_ABORTED) is not None
    assert s.finish_request("d", RequestStatus.FINISHED_ABORTED) is None
    out = s.schedule()
    assert set(out.finished_request_ids) == {"a", "b", "d"}
    s.finish_request("c", RequestStatus.FINISHED_ABORTED)
    assert s.block_manager.is_idle()
    s.block_manager.check_integrity()


def test_stop_conditions() -> None:
    s = make()
    r = Request(
        "a",
        [1, 2, 3],
        SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(9,)),
        eos_token_id=0,
        max_total_tokens=256,
    )
    s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {"a": 0})  # EOS before min_tokens: ignored
    assert not r.is_finished
    out = s.schedule()
    s.update_from_output(out, {"a": 9})
    assert r.status == RequestStatus.FINISHED_STOPPED and r.stop_reason == 9
    r2 = Request("b", [1, 2, 3], SamplingParams(max_tokens=100), max_total_tokens=5)
    s.add_request(r2)
    for _ in range(3):
        out = s.schedule()
        s.update_from_output(out, {"b": 4})
    assert r2.status == RequestStatus.FINISHED_LENGTH and r2.num_tokens == 5


def test_static_batching_waits_for_the_whole_batch_to_drain() -> None:
    s = make(batching="static", max_num_seqs=2)
    s.add_request(req("a", 4, max_tokens=1, t=0, first=10))
    s.add_request(req("b", 4, max_tokens=3, t=1, first=20))
    s.add_request(req("c", 4, max_tokens=1, t=2, first=30))
    assert [x.request_id for x in step(s).scheduled] == ["a", "b"]  # a finishes (1 token)
    # a's slot is free, but the batch is closed until b (its longest request) ends.
    assert [x.request_id for x in step(s).scheduled] == ["b"]
    assert [x.request_id for x in step(s).scheduled] == ["b"]  # b's third token: b finishes
    assert [x.request_id for x in step(s).scheduled] == ["c"]  # a new batch
    assert not s.has_unfinished_requests()


def test_static_batching_keeps_forming_a_batch_across_budget_bound_steps() -> None:
    s = make(batching="static", max_num_batched_tokens=6)
    for i in range(3):
        s.add_request(req(f"r{i}", 4, max_tokens=4, t=i, first=10 * i))
    assert shape(step(s)) == [("r0", 0, 4, True), ("r1", 0, 2, False)]
    # Still forming: the budget, not the batch, stopped admission; r2 joins this batch.
    assert shape(step(s)) == [("r0", 4, 1, True), ("r1", 2, 2, True), ("r2", 0, 3, False)]
    s.add_request(req("late", 4, t=9, first=90))
    assert "late" not in [x.request_id for x in step(s).scheduled]  # the batch has closed


def test_continuous_batching_admits_into_a_free_slot_at_once() -> None:
    s = make(max_num_seqs=2)
    s.add_request(req("a", 4, max_tokens=1, t=0, first=10))
    s.add_request(req("b", 4, max_tokens=3, t=1, first=20))
    s.add_request(req("c", 4, max_tokens=1, t=2, first=30))
    step(s)
    assert [x.request_id for x in step(s).scheduled] == ["b", "c"]

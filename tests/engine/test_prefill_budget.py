"""The prefill tokens of a step that also decodes (``max_prefill_tokens_with_decodes``): chunks
of every prefilling request together stay under the cap while a request decodes, a step with
nothing to decode takes the whole budget, and the cap gives way where it would starve a prompt
(chunked prefill off, static batching). Plain Python: no torch, no model."""

from __future__ import annotations

from typing import Any

import pytest

from engine.prefill_budget import PrefillBudget, any_decoding, to_compute
from engine.scheduler_config import (
    CPU_PREFILL_TOKENS_WITH_DECODES,
    SchedulerConfig,
    prefill_tokens_with_decodes,
)
from tests.engine.test_scheduler import make, req, shape, step


def test_a_step_that_decodes_prefills_at_most_the_cap() -> None:
    s = make(num_blocks=128, max_num_batched_tokens=64, max_prefill_tokens_with_decodes=10)
    s.add_request(req("d", 4, max_tokens=20, t=0, first=10))
    assert shape(step(s)) == [("d", 0, 4, True)]  # nothing decodes yet: the prompt at once
    s.add_request(req("long", 30, max_tokens=2, t=1, first=100))
    s.add_request(req("short", 8, max_tokens=2, t=2, first=200))
    # d decodes: 10 prompt tokens in all, the older prompt first.
    assert shape(step(s)) == [("d", 4, 1, True), ("long", 0, 10, False)]
    assert shape(step(s)) == [("d", 5, 1, True), ("long", 10, 10, False)]
    # long's last 10 fill the cap; short waits; then short's 8 fit beside the decodes.
    assert shape(step(s)) == [("d", 6, 1, True), ("long", 20, 10, True)]
    assert shape(step(s)) == [("d", 7, 1, True), ("long", 30, 1, True), ("short", 0, 8, True)]


def test_a_step_with_nothing_to_decode_takes_the_whole_budget() -> None:
    s = make(num_blocks=128, max_num_batched_tokens=40, max_prefill_tokens_with_decodes=10)
    s.add_request(req("a", 30, max_tokens=2, t=0, first=10))
    s.add_request(req("b", 30, max_tokens=2, t=1, first=100))
    assert shape(step(s)) == [("a", 0, 30, True), ("b", 0, 10, False)]
    # a now decodes: b's remaining 20 prefill under the cap.
    assert shape(step(s)) == [("a", 30, 1, True), ("b", 10, 10, False)]


def test_prefill_tokens_are_charged_and_refunded_decodes_are_not() -> None:
    budget = PrefillBudget(64, 10)
    prompt, decoding = req("p", 30), req("d", 4)
    decoding.num_computed_tokens = 3  # one token behind
    budget.start_step(any_decoding([prompt]))
    assert budget.left == 64  # nothing decodes
    budget.start_step(any_decoding([prompt, decoding]))
    assert budget.left == 10
    assert budget.limit(to_compute(prompt), 30) == 10
    assert budget.limit(to_compute(decoding), 1) == 1
    budget.charge(to_compute(decoding), 1)
    budget.charge(to_compute(prompt), 10)
    assert budget.left == 0 and budget.limit(to_compute(prompt), 30) == 0
    budget.refund(to_compute(prompt), 10)  # the prompt was preempted in the same step
    assert budget.left == 10


@pytest.mark.parametrize(
    "extra",
    [dict(enable_chunked_prefill=False, max_model_len=64), dict(batching="static")],
    ids=["chunked prefill off", "static batching"],
)
def test_the_cap_gives_way_where_a_prompt_could_not_be_chunked(extra: dict[str, Any]) -> None:
    s = make(num_blocks=128, max_num_batched_tokens=64, max_prefill_tokens_with_decodes=10,
             **extra)  # fmt: skip
    s.add_request(req("d", 4, max_tokens=20, t=0, first=10))
    s.add_request(req("long", 30, max_tokens=2, t=1, first=100))
    assert shape(step(s)) == [("d", 0, 4, True), ("long", 0, 30, True)]


def test_the_default_is_by_device_and_a_flag_wins() -> None:
    assert prefill_tokens_with_decodes(None, "cpu") == CPU_PREFILL_TOKENS_WITH_DECODES == 512
    assert prefill_tokens_with_decodes(None, "cuda") == 0
    assert prefill_tokens_with_decodes(0, "cpu") == 0
    assert prefill_tokens_with_decodes(2048, "cuda") == 2048
    with pytest.raises(ValueError, match="must not be negative"):
        SchedulerConfig(max_prefill_tokens_with_decodes=-1)

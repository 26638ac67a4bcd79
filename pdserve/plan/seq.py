"""A request's state inside one simulated worker (the engine's ``Request``, as numbers).

    FULL    prefill here, then decode here (colocated, or a decode worker's local prefill)
    EXPORT  prefill role: compute the prompt, sample the first token, hold the blocks until
            the transfer is over (``release``)
    REMOTE  decode role: the prompt's KV arrived; decode from the first token on

Two phases, as in the engine (one request state, no phase flag there either):

    prefilling   more than one token to compute: ``computed`` counts them
    decoding     one token behind each step: ``computed = offset + worker.steps``, so a run
                 of decode steps advances every decoding request without touching it
"""

from __future__ import annotations

from typing import Any

from pdserve.plan.sim_request import SimRequest

FULL, EXPORT, REMOTE = 0, 1, 2


class Seq:
    __slots__ = (
        "computed",
        "engine_arrival",
        "epoch",
        "finish_step",
        "group",
        "group_ref",
        "host_blocks",
        "is_decoding",
        "last_token_s",
        "mode",
        "num_blocks",
        "num_out",
        "num_prefix_blocks",
        "num_tokens",
        "offset",
        "peer",
        "published",
        "req",
        "resumed",
        "sent_blocks",
        "skipped_blocks",
        "stale",
    )

    def __init__(self, req: SimRequest, mode: int) -> None:
        self.req = req
        self.mode = mode
        self.num_tokens = req.num_prompt  # prompt + output tokens so far
        self.computed = 0  # tokens in KV (prefilling phase)
        self.num_out = 0  # output tokens produced
        self.num_blocks = 0  # blocks held, private and prefix together
        self.num_prefix_blocks = 0  # of them, the group's shared cached blocks
        self.host_blocks = 0  # swapped out
        self.group = req.prefix_group
        self.group_ref = False  # holds a reference on its group's cached blocks
        self.published = False  # its prefix blocks went to the group's cache
        self.engine_arrival = 0.0  # when this worker got it (the preemption order)
        self.is_decoding = False
        self.offset = 0  # decoding: computed - worker.steps
        self.finish_step = 0  # decoding: the worker step count at which it is done
        self.epoch = 0  # bumped when it leaves the decoding set (stale finish entries)
        self.last_token_s = 0.0
        self.stale = False  # decoding, but skipped a step: its last token is older
        self.resumed = False  # swapped back in: its next gap spans the preemption
        self.sent_blocks = 0  # EXPORT: blocks already pushed to decode
        self.skipped_blocks = 0  # EXPORT: leading blocks decode already caches
        self.peer: tuple[Any, Seq] | None = None  # EXPORT: (decode worker, its REMOTE seq)

    @property
    def arrival_s(self) -> float:
        return self.req.arrival_s

    def __repr__(self) -> str:
        phase = "decoding" if self.is_decoding else f"computed={self.computed}"
        return f"Seq({self.req.index}, mode={self.mode}, tokens={self.num_tokens}, {phase})"

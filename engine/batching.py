"""Batching policies: when the scheduler may admit waiting requests into the batch.

continuous  any step (iteration-level batching: requests join and leave every step)
static      only while a batch is being formed: from the step the previous batch fully
            drained until the batch is full, the queue is empty, or blocks run out (a
            step bound by the token budget keeps it open). The baseline continuous
            batching is benchmarked against; never a production setting.
"""

from __future__ import annotations

from typing import Protocol

from engine.scheduler_config import BatchingName


class BatchingPolicy(Protocol):
    def is_admission_open(self, num_active: int) -> bool:
        """May waiting requests be admitted this step? ``num_active``: requests holding a
        batch slot (running, swapped, or waiting for remote KV)."""
        ...

    def after_admission(self, queue_empty: bool, batch_full: bool, blocked: bool) -> None:
        """This step's admissions are over: the queue emptied, the batch filled, or a request
        could not get its blocks although the step had budget left (``blocked``)."""
        ...


class ContinuousBatching:
    def is_admission_open(self, num_active: int) -> bool:
        return True

    def after_admission(self, queue_empty: bool, batch_full: bool, blocked: bool) -> None:
        pass


class StaticBatching:
    def __init__(self) -> None:
        self._open = True

    def is_admission_open(self, num_active: int) -> bool:
        if num_active == 0:
            self._open = True  # the previous batch drained: form the next one
        return self._open

    def after_admission(self, queue_empty: bool, batch_full: bool, blocked: bool) -> None:
        if queue_empty or batch_full or blocked:
            self._open = False


def make_batching_policy(name: BatchingName) -> BatchingPolicy:
    if name == "continuous":
        return ContinuousBatching()
    if name == "static":
        return StaticBatching()
    raise ValueError(f"batching must be 'continuous' or 'static', got {name!r}")

"""What one scheduler step asks the model runner to do: plain, frozen data."""

from __future__ import annotations

from dataclasses import dataclass

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of the step.

    The runner computes ``token_ids`` at positions ``num_computed_tokens ..
    num_computed_tokens + len(token_ids) - 1``; if ``sample`` is set the last of them is the
    request's newest token and the runner samples the next one from its logits.
    """

    request_id: str
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    block_table: tuple[int, ...]
    sample: bool
    sampling_params: SamplingParams
    num_output_tokens: int  # output tokens generated so far (min_tokens, penalties)
    output_token_ids: tuple[int, ...] = ()  # only filled when sampling needs history
    prompt_token_ids: tuple[int, ...] = ()  # only filled for the repetition penalty

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]
    num_scheduled_tokens: int
    blocks_to_swap_out: tuple[tuple[int, int], ...]  # (device block, host block), before forward
    blocks_to_swap_in: tuple[tuple[int, int], ...]  # (host block, device block), before forward
    preempted_request_ids: tuple[str, ...]
    finished_request_ids: tuple[str, ...]  # left the engine since the previous step

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.blocks_to_swap_out and not self.blocks_to_swap_in

"""What the engine keeps per request beyond the scheduler's state: its detokenizer, logprobs,
timings, and how much has been handed out; it builds the per-step ``RequestOutput``."""

from __future__ import annotations

from dataclasses import dataclass

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import RequestMetrics, RequestOutput, SampledToken
from engine.request import Request
from engine.request_snapshot import RequestSnapshot


@dataclass
class TrackedRequest:
    request: Request
    prompt: str | None
    detok: IncrementalDetokenizer | None
    logprobs: list[SampledToken] | None  # None unless the request asked for logprobs
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    sent_tokens: int = 0  # output tokens already handed out

    def new_token_ids(self) -> list[int]:
        """Output tokens not handed out yet; feeds them to the detokenizer."""
        new_ids = self.request.output_token_ids[self.sent_tokens :]
        self.sent_tokens = self.request.num_output_tokens
        if self.detok is not None:
            self.detok.update(new_ids)
        return new_ids

    def snapshot(self) -> RequestSnapshot:
        """The request as plain data (``LLMEngine.snapshot``)."""
        r = self.request
        params = r.sampling_params
        num_out = r.num_generated_tokens
        detok = self.detok
        return RequestSnapshot(
            request_id=r.request_id,
            status=r.status.value,
            prompt_token_ids=tuple(r.original_prompt_token_ids),
            output_token_ids=tuple(r.generated_token_ids),
            sampling_params=params,
            priority=r.priority,
            num_computed_tokens=r.num_computed_tokens,
            num_cached_tokens=r.num_cached_tokens,
            num_preemptions=r.num_preemptions,
            remaining_max_tokens=None if params.max_tokens is None else params.max_tokens - num_out,
            remaining_min_tokens=max(0, params.min_tokens - num_out),
            seed=params.seed,
            num_sampled_tokens=num_out,
            emitted_text=detok.emitted_text if detok is not None else "",
            held_back_text=detok.text[len(detok.emitted_text) :] if detok is not None else "",
            stop_reason=r.stop_reason,
        )

    def make_output(
        self, token: SampledToken, new_ids: list[int], now: float, finished: bool
    ) -> RequestOutput:
        """This step's output: the delta since the last one plus everything so far."""
        request = self.request
        if self.first_token_time is None:
            self.first_token_time = now
        if self.logprobs is not None:
            self.logprobs.append(token)
        if self.detok is not None:
            if finished:
                self.detok.flush()
            new_text = self.detok.take_new_text(finished)
            text = self.detok.emitted_text
        else:
            new_text, text = "", ""
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.output_token_ids,
            text=text,
            new_token_ids=list(new_ids),
            new_text=new_text,
            finished=finished,
            finish_reason=request.status.value if finished else None,
            stop_reason=request.stop_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            new_logprobs=[token] if self.logprobs is not None else None,
            num_cached_tokens=request.num_cached_tokens,
            prompt=self.prompt,
            metrics=RequestMetrics(
                arrival_time=request.arrival_time,
                first_scheduled_time=self.first_scheduled_time,
                first_token_time=self.first_token_time,
                finished_time=now if finished else None,
            ),
        )

    def make_error_output(self, error: str, now: float) -> RequestOutput:
        """The final output of a request that failed before producing a token."""
        request = self.request
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.output_token_ids,
            text=self.detok.emitted_text if self.detok is not None else "",
            new_token_ids=[],
            new_text="",
            finished=True,
            finish_reason="error",
            prompt=self.prompt,
            error=error,
            metrics=RequestMetrics(
                arrival_time=request.arrival_time,
                first_scheduled_time=self.first_scheduled_time,
                first_token_time=self.first_token_time,
                finished_time=now,
            ),
        )

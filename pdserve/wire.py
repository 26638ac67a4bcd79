"""Conversions between the engine's dataclasses and the ``pdserve.v1`` proto messages.

A leaf module (engine + protos only) shared by the router and the prefill/decode workers, so
every process maps the same fields the same way.
"""

from __future__ import annotations

from engine.outputs import RequestOutput, SampledToken
from engine.resume import ResumeState
from engine.sampling_params import SamplingParams
from engine.structured.spec import KINDS, StructuredOutput
from protos.pdserve.v1 import generate_pb2 as gpb
from protos.pdserve.v1 import worker_pb2 as wpb


def sampling_params_from_proto(m: gpb.SamplingParams) -> SamplingParams:
    """Raises ValueError naming the field for an invalid value (unset optionals = defaults)."""
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=m.max_tokens if m.HasField("max_tokens") else defaults.max_tokens,
        min_tokens=m.min_tokens,
        temperature=m.temperature if m.HasField("temperature") else defaults.temperature,
        top_k=m.top_k,
        top_p=m.top_p if m.HasField("top_p") else defaults.top_p,
        seed=m.seed if m.HasField("seed") else None,
        stop=tuple(m.stop),
        stop_token_ids=tuple(m.stop_token_ids),
        ignore_eos=m.ignore_eos,
        logprobs=m.logprobs if m.HasField("logprobs") else None,
        include_stop_str_in_output=m.include_stop_str_in_output,
        skip_special_tokens=(m.skip_special_tokens if m.HasField("skip_special_tokens") else True),
        presence_penalty=m.presence_penalty,
        frequency_penalty=m.frequency_penalty,
        repetition_penalty=(
            m.repetition_penalty
            if m.HasField("repetition_penalty")
            else defaults.repetition_penalty
        ),
        logit_bias=dict(m.logit_bias),
        structured=_structured_from_proto(m),
    )


def _structured_from_proto(m: gpb.SamplingParams) -> StructuredOutput | None:
    if not m.HasField("structured"):
        return None
    kind = m.structured.kind
    if kind not in KINDS:
        raise ValueError(f"structured: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    spec = StructuredOutput(kind, m.structured.value, "structured")  # type: ignore[arg-type]
    return spec


def sampling_params_to_proto(p: SamplingParams) -> gpb.SamplingParams:
    m = gpb.SamplingParams(
        min_tokens=p.min_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        logit_bias=dict(p.logit_bias),  # type: ignore[arg-type]
    )
    if p.structured is not None:
        m.structured.kind = p.structured.kind
        m.structured.value = p.structured.value
    if p.max_tokens is not None:
        m.max_tokens = p.max_tokens
    if p.seed is not None:
        m.seed = p.seed
    if p.logprobs is not None:
        m.logprobs = p.logprobs
    return m


def resume_from_proto(has_resume: bool, m: wpb.Resume) -> ResumeState | None:
    """A worker request's resume state (None: a request from its start)."""
    if not has_resume:
        return None
    return ResumeState(m.num_generated_tokens, m.emitted_text)


def delta_to_proto(out: RequestOutput) -> gpb.GenerateResponse:
    """One step's delta of ``out`` (usage and finish fields on the final one)."""
    m = gpb.GenerateResponse(
        request_id=out.request_id,
        token_ids=out.new_token_ids,
        text=out.new_text,
        finished=out.finished,
    )
    for tok in out.new_logprobs or ():
        m.logprobs.append(
            gpb.TokenLogprob(
                token_id=tok.token_id,
                logprob=tok.logprob if tok.logprob is not None else 0.0,
                top_logprobs=[gpb.TopLogprob(token_id=t, logprob=lp) for t, lp in tok.top_logprobs],
            )
        )
    if out.finished:
        m.finish_reason = out.finish_reason or ""
        if isinstance(out.stop_reason, str):
            m.stop_str = out.stop_reason
        elif isinstance(out.stop_reason, int):
            m.stop_token_id = out.stop_reason
        m.usage.CopyFrom(
            gpb.Usage(
                prompt_tokens=len(out.prompt_token_ids),
                completion_tokens=len(out.token_ids),
                cached_tokens=out.num_cached_tokens,
            )
        )
    return m


class OutputAccumulator:
    """Rebuilds cumulative ``RequestOutput``s from a stream of proto deltas."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], prompt: str | None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.prompt = prompt
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[SampledToken] | None = None

    def add(self, m: gpb.GenerateResponse) -> RequestOutput:
        new_ids = list(m.token_ids)
        self.token_ids.extend(new_ids)
        self.text += m.text
        new_lp: list[SampledToken] | None = None
        if m.logprobs:
            new_lp = [
                SampledToken(
                    lp.token_id,
                    lp.logprob,
                    tuple((t.token_id, t.logprob) for t in lp.top_logprobs),
                )
                for lp in m.logprobs
            ]
            self.logprobs = (self.logprobs or []) + new_lp
        stop_reason: int | str | None = None
        kind = m.WhichOneof("stop_reason")
        if kind == "stop_str":
            stop_reason = m.stop_str
        elif kind == "stop_token_id":
            stop_reason = m.stop_token_id
        # A migrated request's last worker cached part of the earlier outputs too.
        cached = min(m.usage.cached_tokens, len(self.prompt_token_ids)) if m.finished else 0
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=list(self.token_ids),
            text=self.text,
            new_token_ids=new_ids,
            new_text=m.text,
            finished=m.finished,
            finish_reason=m.finish_reason or None if m.finished else None,
            stop_reason=stop_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            new_logprobs=new_lp,
            num_cached_tokens=cached,
            prompt=self.prompt,
        )

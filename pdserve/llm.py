"""The offline API: batch generation over an ``LLMEngine``, as vLLM's ``LLM`` offers it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

PromptType = str | dict[str, Any] | Sequence[int]


class LLM:
    """``LLM(model=None, **engine_options)``; options are ``EngineConfig`` fields.

    Offline, nobody watches a stream between tokens, so prefill chunks beside decodes get the
    whole step budget unless ``max_prefill_tokens_with_decodes`` is given (a server caps them
    on the CPU; vLLM, too, gives its offline ``LLM`` a larger budget than its server). On the
    issue-18 workload the cap cost 2-4% of offline throughput (docs/benchmarks.md)."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        options.setdefault("max_prefill_tokens_with_decodes", 0)
        self.engine = LLMEngine(EngineConfig(model=model, **options))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt block, so the next prompts are computed in full (as
        vLLM's ``LLM.reset_prefix_cache``). Returns False, changing nothing, while requests
        hold blocks; between ``generate`` calls none do."""
        return self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        A prompt is text, a list of token ids, or ``{"prompt": ...}`` /
        ``{"prompt_token_ids": [...]}``. ``sampling_params`` is one for all or one per prompt.
        An invalid prompt raises ValueError before anything is queued.
        """
        items = _as_prompt_list(prompts)
        if sampling_params is None:
            params_list: list[SamplingParams] = [SamplingParams()] * len(items)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise ValueError(
                    f"sampling_params: got {len(params_list)} for {len(items)} prompts"
                )
        prios = list(priority) if priority is not None else [0] * len(items)
        engine = self.engine
        ids: list[str] = []
        try:
            for item, params, prio in zip(items, params_list, prios, strict=True):
                rid = engine.new_request_id()
                text, token_ids = _split_prompt(item)
                engine.add_request(rid, text, params, token_ids, priority=prio)
                ids.append(rid)
        except Exception:
            for rid in ids:
                engine.abort_request(rid)
            raise
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req")
        pending = set(ids)
        while pending:
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    final[out.request_id] = out
                    pending.discard(out.request_id)
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[rid] for rid in ids]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, str | dict):
        return [prompts]
    seq: list[Any] = list(prompts)
    if seq and all(isinstance(x, int) for x in seq):
        return [seq]  # a single prompt given as token ids
    return seq


def _split_prompt(item: PromptType) -> tuple[str | None, list[int] | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict):
        if "prompt_token_ids" in item:
            return item.get("prompt"), list(item["prompt_token_ids"])
        if "prompt" in item:
            return item["prompt"], None
        raise ValueError("prompt dicts need a 'prompt' or 'prompt_token_ids' key")
    return None, list(item)

"""Per-request grammar matchers (llguidance) and the batch's token bitmask.

A matcher belongs to the sampler of the engine that samples the request, keyed by request id,
and is advanced with every token sampled for it. It is rebuilt whenever its count of consumed
tokens disagrees with the request's output (a request whose first token was sampled on
another worker — the disaggregated path — or one this sampler has not seen): the new matcher
replays the output so far, so grammar state never has to cross a process. Preemption (swap or
recompute) keeps the output tokens, so the matcher stays valid through it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import llguidance
import torch

from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutput

logger = logging.getLogger(__name__)

_GRAMMAR_CACHE = 128
_BITS = torch.arange(32, dtype=torch.int32)


class GrammarRow(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def output_token_ids(self) -> tuple[int, ...]: ...


@dataclass
class _State:
    matcher: Any  # llguidance.LLMatcher
    num_consumed: int


class GrammarMasks:
    """Token masks for the structured rows of a batch, over a model's vocabulary."""

    def __init__(
        self, tokenizer_path: str, vocab_size: int, eos_token_ids: Sequence[int] = ()
    ) -> None:
        self._tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: Any = None  # llguidance.LLTokenizer, built on first use
        self._grammars: OrderedDict[StructuredOutput, str] = OrderedDict()
        self._states: dict[str, _State] = {}

    def forget(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self._states.pop(rid, None)

    def bitmask(self, rows: Sequence[GrammarRow]) -> torch.Tensor | None:
        """``[len(rows), ceil(vocab / 32)]`` int32 bitmask (all bits set for unconstrained
        rows), or None when no row is structured."""
        wanted = [(i, r) for i, r in enumerate(rows) if r.params.structured is not None]
        if not wanted:
            return None
        mask = torch.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
        jobs = [(self._state(r).matcher, i) for i, r in wanted]
        # On this thread, one row after another (a few microseconds each): llguidance's
        # parallel executor would start threads that fight torch's spinning OpenMP workers
        # for the same cores (measured: 50x slower under load on 2 cores).
        # Each matcher writes its row in place, as llguidance.torch.fill_next_token_bitmask
        # does. That module is not imported: its module-level @torch.compile pulls in
        # torch._dynamo and inductor, 2.7 s of every engine process's start
        # (tests/engine/test_startup_imports.py).
        row_bytes = mask.shape[1] * mask.element_size()
        for matcher, i in jobs:
            matcher.unsafe_compute_mask_ptr(mask[i].data_ptr(), row_bytes)
        for (matcher, i), (_, r) in zip(jobs, wanted, strict=True):
            if matcher.is_error():  # cannot happen through the mask: end the output cleanly
                logger.error("grammar of %s failed: %s", r.request_id, matcher.get_error())
                mask[i] = 0
                for t in self._eos:
                    mask[i, t // 32] |= 1 << (t % 32)
        return mask

    def advance(self, rows: Sequence[GrammarRow], token_ids: Sequence[int]) -> None:
        """Feed each structured row's sampled token to its matcher."""
        for r, t in zip(rows, token_ids, strict=True):
            if r.params.structured is None:
                continue
            state = self._states.get(r.request_id)
            if state is not None:
                state.matcher.consume_token(t)
                state.num_consumed += 1

    # ---------------------------------------------------------------- private
    def _state(self, row: GrammarRow) -> _State:
        state = self._states.get(row.request_id)
        history = row.output_token_ids
        if state is None or state.num_consumed != len(history):
            assert row.params.structured is not None
            grammar = self._grammar(row.params.structured)
            matcher = llguidance.LLMatcher(self._llg_tokenizer(), grammar)
            if history:
                matcher.consume_tokens(list(history))
            state = _State(matcher, len(history))
            self._states[row.request_id] = state
        return state

    def _grammar(self, spec: StructuredOutput) -> str:
        grammar = self._grammars.get(spec)
        if grammar is None:
            grammar = spec.to_grammar()
            self._grammars[spec] = grammar
            while len(self._grammars) > _GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
        else:
            self._grammars.move_to_end(spec)
        return grammar

    def _llg_tokenizer(self) -> Any:
        if self._tokenizer is None:
            import llguidance.hf  # imports transformers: only once a grammar needs it
            from transformers import AutoTokenizer

            hf: Any = AutoTokenizer.from_pretrained(self._tokenizer_path)
            self._tokenizer = llguidance.hf.from_tokenizer(
                hf, n_vocab=self.vocab_size, eos_token=self._eos or None
            )
        return self._tokenizer


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` with every token whose bit is clear set to -inf (a new tensor)."""
    rows, vocab = logits.shape
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    allowed = bits.view(rows, -1)[:, :vocab].bool().to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))

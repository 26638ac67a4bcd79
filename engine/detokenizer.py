"""Incremental detokenization for streaming, plus stop-string handling.

Text is emitted only once it is stable: a token that ends in the middle of a UTF-8 character
(byte-level BPE splits characters across tokens) decodes to U+FFFD, so we wait for the next
token rather than emit a broken character. When stop strings are set, the last
``max(len(stop)) - 1`` characters are held back so that a stop string is never partly streamed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_CONTEXT_TOKENS = 4  # prompt tokens decoded with the output so leading spaces come out right


def raw_decode(tokenizer: Any) -> Callable[..., str] | None:
    """The Rust ``tokenizers.Tokenizer.decode`` behind ``tokenizer`` where transformers' own
    ``decode`` adds nothing to it (a fast tokenizer whose class overrides neither ``decode`` nor
    ``_decode``; called without the clean-up, as here, that wrapper only converts its argument
    and calls it): the same text, without ~4 us of Python a call (two calls a request a step).
    None for any other tokenizer."""
    try:
        import tokenizers
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return None
    cls = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
        and isinstance(backend, tokenizers.Tokenizer)
    ):
        return backend.decode  # type: ignore[no-any-return]
    return None


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tok = tokenizer
        self._raw = raw_decode(tokenizer)
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = tuple(stop)
        self._include_stop = include_stop_str_in_output
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # all stable text decoded so far (stop string handling applied)
        self._emitted = 0  # characters of ``text`` already handed out
        self.stop_string: str | None = None

    def update(self, token_ids: Sequence[int]) -> None:
        """Add newly generated tokens; sets ``stop_string`` if one appeared."""
        if self.stop_string is not None:
            return
        self._ids.extend(token_ids)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return
        delta = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        start = max(0, len(self.text) - self._hold)
        self.text += delta
        if self._stop:
            self._check_stop(start)

    def flush(self) -> None:
        """At finish: decode what is left even if it ends mid-character."""
        if self.stop_string is None and self._read_offset < len(self._ids):
            prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._ids[self._prefix_offset :])
            start = max(0, len(self.text) - self._hold)
            self.text += full[len(prefix) :]
            self._read_offset = len(self._ids)
            if self._stop:
                self._check_stop(start)

    def replay(self, token_ids: Sequence[int], emitted_text: str) -> None:
        """Catch up with an earlier run of the request (migration): decode ``token_ids``
        one at a time, as that run did, and mark ``emitted_text`` (what it handed out) as
        handed out; the rest of the text is held back as it was there. Raises ValueError
        when the text does not start with ``emitted_text``."""
        for t in token_ids:
            self.update([t])
        if self.stop_string is not None:
            raise ValueError(
                f"resume: the earlier outputs already hold the stop string {self.stop_string!r}"
            )
        if not self.text.startswith(emitted_text):
            raise ValueError(
                "resume: emitted_text is not the text of the earlier outputs "
                f"({len(emitted_text)} characters given, {len(self.text)} decoded)"
            )
        self._emitted = len(emitted_text)

    def take_new_text(self, finished: bool) -> str:
        """Text not handed out yet, minus the hold-back for stop strings unless ``finished``."""
        end = len(self.text) if finished or self.stop_string else len(self.text) - self._hold
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

    @property
    def emitted_text(self) -> str:
        """Everything ``take_new_text`` has handed out so far."""
        return self.text[: self._emitted]

    def _check_stop(self, search_from: int) -> None:
        best: tuple[int, str] | None = None
        for s in self._stop:
            i = self.text.find(s, search_from)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            self.text = self.text[: i + len(s)] if self._include_stop else self.text[:i]
            self.stop_string = s

    def _decode(self, ids: Sequence[int]) -> str:
        if self._raw is not None:
            return self._raw(
                ids if isinstance(ids, list) else list(ids), skip_special_tokens=self._skip
            )
        return str(
            self._tok.decode(
                ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False
            )
        )

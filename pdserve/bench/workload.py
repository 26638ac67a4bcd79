"""The requests of a benchmark: seeded synthetic prompts or a JSONL file of prompts.

Every random choice comes from its own stream derived from the seed, so changing one knob
(say the output lengths) leaves the others (prompt lengths, which requests share the prefix,
which are cancelled) unchanged. ``replica`` changes only the prompts' token ids: each point of
a sweep gets fresh prompts of the same shapes, so the prefix cache of one point cannot serve
the next (the shared prefix, which is meant to be cached, stays the same).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.bench.distributions import LengthDist


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    prompt_len: LengthDist
    output_len: LengthDist
    seed: int = 0
    shared_prefix_len: int = 0  # tokens of the common prefix (a "system prompt")
    shared_prefix_fraction: float = 0.0  # share of requests that start with it
    cancel_fraction: float = 0.0  # share of requests the client cancels mid-stream
    prompts_file: str | None = None  # JSONL; replaces the synthetic prompts
    token_id_low: int = 10  # synthetic token ids are drawn from [low, high)
    token_id_high: int = 500  # inside every vocabulary worth benchmarking

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        for name in ("shared_prefix_fraction", "cancel_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.shared_prefix_len < 0:
            raise ValueError("shared_prefix_len must be >= 0")
        if not 0 <= self.token_id_low < self.token_id_high:
            raise ValueError("need 0 <= token_id_low < token_id_high")


@dataclass(frozen=True)
class BenchRequest:
    """One request. Exactly one of ``prompt_token_ids`` / ``prompt_text`` is set."""

    index: int
    prompt_token_ids: tuple[int, ...] | None
    prompt_text: str | None
    max_tokens: int
    cancel_after_tokens: int | None = None  # cancel once this many tokens have streamed
    has_shared_prefix: bool = False

    @property
    def num_prompt_tokens(self) -> int | None:
        """The prompt's length when it is token ids (text prompts: the server's usage says)."""
        return None if self.prompt_token_ids is None else len(self.prompt_token_ids)


def _rng(seed: int, stream: str) -> random.Random:
    return random.Random(f"{seed}/{stream}")  # str seeds hash with sha512: stable across runs


def generate_requests(spec: WorkloadSpec, replica: int = 0) -> list[BenchRequest]:
    """The workload's requests, deterministic in ``(spec, replica)``."""
    if spec.prompts_file:
        return _from_jsonl(spec)
    len_rng, out_rng = _rng(spec.seed, "prompt_len"), _rng(spec.seed, "output_len")
    share_rng, cancel_rng = _rng(spec.seed, "prefix"), _rng(spec.seed, "cancel")
    ids_rng = _rng(spec.seed, f"ids/{replica}")
    lo, hi = spec.token_id_low, spec.token_id_high
    prefix_rng = _rng(spec.seed, "prefix_ids")
    prefix = [prefix_rng.randrange(lo, hi) for _ in range(spec.shared_prefix_len)]
    requests = []
    for i in range(spec.num_requests):
        num_prompt = spec.prompt_len.sample(len_rng)
        max_tokens = spec.output_len.sample(out_rng)
        shared = bool(prefix) and share_rng.random() < spec.shared_prefix_fraction
        # A sharing prompt keeps its sampled total length (so runs with and without sharing
        # send the same number of tokens), but always has at least one token of its own.
        head = prefix if shared else []
        num_own = max(num_prompt - len(head), 1 if shared else num_prompt)
        ids = head + [ids_rng.randrange(lo, hi) for _ in range(num_own)]
        requests.append(
            BenchRequest(
                index=i,
                prompt_token_ids=tuple(ids),
                prompt_text=None,
                max_tokens=max_tokens,
                cancel_after_tokens=_cancel_point(cancel_rng, spec.cancel_fraction, max_tokens),
                has_shared_prefix=shared,
            )
        )
    return requests


def _cancel_point(rng: random.Random, fraction: float, max_tokens: int) -> int | None:
    cancelled = rng.random() < fraction
    point = rng.randint(1, max(1, max_tokens - 1))  # drawn either way: streams stay aligned
    return point if cancelled else None


def _from_jsonl(spec: WorkloadSpec) -> list[BenchRequest]:
    """Lines ``{"prompt": "..."}`` or ``{"prompt_token_ids": [...]}``, optional ``max_tokens``
    (else drawn from the output distribution); cycled or cut to ``num_requests``."""
    assert spec.prompts_file is not None
    rows = load_jsonl(Path(spec.prompts_file))
    out_rng, cancel_rng = _rng(spec.seed, "output_len"), _rng(spec.seed, "cancel")
    requests = []
    for i in range(spec.num_requests):
        row = rows[i % len(rows)]
        max_tokens = int(row.get("max_tokens") or spec.output_len.sample(out_rng))
        ids = row.get("prompt_token_ids")
        requests.append(
            BenchRequest(
                index=i,
                prompt_token_ids=tuple(int(t) for t in ids) if ids is not None else None,
                prompt_text=None if ids is not None else str(row["prompt"]),
                max_tokens=max_tokens,
                cancel_after_tokens=_cancel_point(cancel_rng, spec.cancel_fraction, max_tokens),
            )
        )
    return requests


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """The non-empty lines of a prompts file; ValueError names the first bad line."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON: {e}") from None
        if not isinstance(row, dict) or ("prompt" not in row and "prompt_token_ids" not in row):
            raise ValueError(f"{path}:{n}: need an object with 'prompt' or 'prompt_token_ids'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


# Short, common words: most BPE vocabularies hold each (with its leading space) as one token,
# so a prompt of N ids renders to roughly N tokens on servers that only take text.
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part"
).split()


class PromptRenderer:
    """Turns token-id prompts into text for APIs that need text (chat, or ``--prompt-format
    text``): decoded with ``tokenizer`` (a Hugging Face folder or hub name) when given, else one
    common English word per id."""

    def __init__(self, tokenizer: str | None = None) -> None:
        self._tokenizer: Any = None
        if tokenizer:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def text(self, request: BenchRequest) -> str:
        if request.prompt_text is not None:
            return request.prompt_text
        ids: Sequence[int] = request.prompt_token_ids or ()
        if self._tokenizer is not None:
            return str(self._tokenizer.decode(list(ids)))
        return " ".join(_WORDS[t % len(_WORDS)] for t in ids)

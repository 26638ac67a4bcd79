"""Batched logits processing before sampling: penalties and logit bias, as tensor ops over
every row that asks for them (no per-token Python loop).

Semantics follow the references: ``repetition_penalty`` is HF's
``RepetitionPenaltyLogitsProcessor`` (every token of prompt and output: logit / p when
positive, logit * p otherwise), ``presence_penalty`` and ``frequency_penalty`` are OpenAI's
(over output tokens: ``logit -= frequency * count + presence * (count > 0)``), as vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.sampling_params import SamplingParams


class PenaltyRow(Protocol):
    @property
    def params(self) -> SamplingParams: ...
    @property
    def output_token_ids(self) -> tuple[int, ...]: ...
    @property
    def prompt_token_ids(self) -> tuple[int, ...]: ...


def apply_penalties(logits: torch.Tensor, rows: Sequence[PenaltyRow]) -> torch.Tensor:
    """Return ``logits`` (``[len(rows), vocab]``) with every row's penalties applied; the
    input is not modified. Rows without penalties are left as they are."""
    idx = [i for i, r in enumerate(rows) if r.params.has_penalties]
    if not idx:
        return logits
    logits = logits.clone()
    device, vocab = logits.device, logits.shape[1]
    sel = torch.tensor(idx, device=device)
    sub = logits[sel]
    picked = [rows[i] for i in idx]
    out_counts = _token_counts([r.output_token_ids for r in picked], vocab, device)

    rep = torch.tensor([r.params.repetition_penalty for r in picked], device=device)
    if bool((rep != 1.0).any()):
        prompt_counts = _token_counts([r.prompt_token_ids for r in picked], vocab, device)
        seen = (out_counts + prompt_counts) > 0
        rep_b = rep[:, None].to(sub.dtype)
        penalized = torch.where(sub > 0, sub / rep_b, sub * rep_b)
        sub = torch.where(seen, penalized, sub)

    freq = torch.tensor(
        [r.params.frequency_penalty for r in picked], dtype=sub.dtype, device=device
    )
    pres = torch.tensor([r.params.presence_penalty for r in picked], dtype=sub.dtype, device=device)
    counts = out_counts.to(sub.dtype)
    sub = sub - freq[:, None] * counts - pres[:, None] * (counts > 0).to(sub.dtype)
    logits[sel] = sub
    return logits


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Return ``logits`` with each row's ``logit_bias`` added (ids past the vocabulary are
    ignored: the router refuses them, the offline API cannot reach them)."""
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    vocab = logits.shape[1]
    for i, p in enumerate(params):
        for t, b in p.logit_bias:  # type: ignore[misc]
            if t < vocab:
                rows.append(i)
                cols.append(t)
                vals.append(b)
    if not rows:
        return logits
    logits = logits.clone()
    device = logits.device
    logits.index_put_(
        (torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
        torch.tensor(vals, dtype=logits.dtype, device=device),
        accumulate=True,
    )
    return logits


def _token_counts(
    histories: Sequence[Sequence[int]], vocab: int, device: torch.device
) -> torch.Tensor:
    """``[len(histories), vocab]`` int counts of each token id per row."""
    width = max((len(h) for h in histories), default=0)
    counts = torch.zeros(len(histories), vocab + 1, dtype=torch.int32, device=device)
    if width == 0:
        return counts[:, :vocab]
    padded = torch.full((len(histories), width), vocab, dtype=torch.long)
    for i, h in enumerate(histories):
        if h:
            padded[i, : len(h)] = torch.tensor(h, dtype=torch.long)
    padded = padded.clamp_(0, vocab).to(device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab]

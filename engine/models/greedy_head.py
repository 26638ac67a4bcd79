"""The packed lm_head with greedy decoding's argmax screened (CPU: AVX2 or AVX-512).

A greedy row needs only the index of its largest logit. ``GreedyLmHead.greedy`` finds it
without computing every float32 logit: ``kernels/cpu/greedy_head.cpp`` screens the vocabulary
with cheaper products (bf16 ones where the CPU has AVX512-BF16, else int16 ones summed exactly
in int32: half the weight bytes of the float32 GEMM, and more products a cycle), keeps the
panels whose proven error bound leaves them a chance, and multiplies those again with the
float32 GEMM's own kernel. The token is the one ``argmax(forward(x))`` gives, bit for bit the
same logits deciding it; a row the screen cannot answer (x not finite) gets its logits computed.

Used when the kernels' build has a screen (AVX2 or AVX-512), the lm_head has no bias, and
``PDSERVE_CPU_GREEDY_HEAD`` is not ``0`` (``bf16`` or ``int16`` picks that screen; unset or
``1``, the fastest here). It costs one 16-bit copy of the lm_head weight (half the float32
size) and three floats per vocabulary entry.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from engine.models.layers import PackedLinear

GREEDY_HEAD_ENV = "PDSERVE_CPU_GREEDY_HEAD"
logger = logging.getLogger(__name__)


class GreedyLmHead(PackedLinear):
    """A ``PackedLinear`` lm_head whose ``greedy(x)`` gives each row's argmax token."""

    def __init__(
        self,
        linear: nn.Linear,
        kernels: Any,
        packed: torch.Tensor,
        screen: Any,
        rows: torch.Tensor | None = None,
    ) -> None:
        """``screen``: ``kernels.pack_greedy_head(linear.weight)``'s (screen, norms). ``rows``:
        the weight itself where the model keeps it anyway (a tied lm_head's embedding table):
        the exact pass then reads each candidate's row instead of its whole panel."""
        super().__init__(linear, kernels, packed)
        self.screen: torch.Tensor
        self.norms: torch.Tensor
        self.register_buffer("screen", screen[0])
        self.register_buffer("norms", screen[1])
        self.rows = rows.detach() if rows is not None else None  # not a parameter of this one

    @property
    def screen_kind(self) -> str:
        """``bf16`` or ``int16``: the kind the screen was packed as (the norms' last float)."""
        return {1: "bf16", 2: "int16"}[int(self.norms[-1])]

    @classmethod
    def maybe(
        cls,
        linear: nn.Linear,
        kernels: Any,
        packed: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> PackedLinear:
        """A ``GreedyLmHead`` where it can run here, else a plain ``PackedLinear``."""
        choice = os.environ.get(GREEDY_HEAD_ENV, "1")
        if choice == "0" or linear.bias is not None or not kernels.greedy_head_supported():
            return PackedLinear(linear, kernels, packed)
        kind = "" if choice == "1" else choice
        if kind and kind not in kernels.greedy_head_screens():
            raise ValueError(
                f"{GREEDY_HEAD_ENV}={choice!r}: this CPU runs the screens "
                f"{list(kernels.greedy_head_screens())} (or 0: off, 1: the fastest)"
            )
        try:
            screen = kernels.pack_greedy_head(linear.weight.detach().contiguous(), kind)
        except RuntimeError as e:  # a weight row too large for the bound: no screen
            logger.warning("greedy lm_head screen off, float32 logits kept: %s", e)
            return PackedLinear(linear, kernels, packed)
        head = cls(linear, kernels, packed, screen, rows)
        logger.info(
            "greedy lm_head: greedy rows' tokens from its %s screen (%s=0 turns it off)",
            head.screen_kind,
            GREEDY_HEAD_ENV,
        )
        return head

    def greedy(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows]`` int64: each row's first maximal index of ``forward(x)``."""
        x2 = x.reshape(-1, self.in_features).contiguous()
        tokens: torch.Tensor = self.kernels.greedy_head(
            x2, self.screen, self.norms, self.packed, self.out_features, self.rows
        )
        missed = (tokens < 0).nonzero().flatten()
        if missed.numel():
            tokens[missed] = self.kernels.argmax(self.forward(x2.index_select(0, missed)))
        return tokens

"""The packed lm_head with greedy decoding's argmax screened in bf16 (CPU, AVX512-BF16).

A greedy row needs only the index of its largest logit. ``GreedyLmHead.greedy`` finds it
without computing every float32 logit: ``kernels/cpu/greedy_head.cpp`` screens the vocabulary
with bf16 products (half the weight bytes and half the instructions of the float32 GEMM), keeps
the panels whose proven error bound leaves them a chance, and multiplies those again with the
float32 GEMM's own kernel. The token is the one ``argmax(forward(x))`` gives, bit for bit the
same logits deciding it; a row the screen cannot answer (x not finite) gets its logits computed.

Used when the CPU and the kernels' build have AVX512-BF16, the lm_head has no bias, and
``PDSERVE_CPU_GREEDY_HEAD`` is not ``0``. It costs one bf16 copy of the lm_head weight (half the
float32 size) and one float per vocabulary entry.
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

    @classmethod
    def maybe(
        cls,
        linear: nn.Linear,
        kernels: Any,
        packed: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> PackedLinear:
        """A ``GreedyLmHead`` where it can run here, else a plain ``PackedLinear``."""
        if (
            os.environ.get(GREEDY_HEAD_ENV, "1") == "0"
            or linear.bias is not None
            or not kernels.greedy_head_supported()
        ):
            return PackedLinear(linear, kernels, packed)
        try:
            screen = kernels.pack_greedy_head(linear.weight.detach().contiguous())
        except RuntimeError as e:  # a weight row too large for the bound: no screen
            logger.warning("greedy lm_head screen off, float32 logits kept: %s", e)
            return PackedLinear(linear, kernels, packed)
        return cls(linear, kernels, packed, screen, rows)

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

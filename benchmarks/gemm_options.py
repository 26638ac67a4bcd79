"""The ways to run a float32 linear layer that ``cpu_kernels.py`` puts side by side for the
decode GEMMs (issue 18, point 2): ``F.linear``, MKL's and oneDNN's prepacked weights, pdserve's
packed GEMM, and ``torch.compile`` with inductor's weight freezing over the whole stack.

Each maker takes the weight ``[out, in]`` and the row count the call will see (the prepacked
formats are built for it) and returns ``x -> x @ W.T``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Linear = Callable[[torch.Tensor], torch.Tensor]
Maker = Callable[[torch.Tensor, int], Linear]


def f_linear(w: torch.Tensor, m: int) -> Linear:
    return lambda x: F.linear(x, w)


def mkl_packed(w: torch.Tensor, m: int) -> Linear:
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
    return lambda x: torch.ops.mkl._mkl_linear(x, packed, w, None, m)


def onednn_packed(w: torch.Tensor, m: int) -> Linear:
    packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def pdserve_packed(kernels: Any) -> Maker:
    """pdserve's packed GEMM on ``kernels`` (``kernels.cpu.load()``)."""

    def make(w: torch.Tensor, m: int) -> Linear:
        packed, n = kernels.pack_linear_weight(w), w.shape[0]
        return lambda x: kernels.linear(x, packed, n, None)

    return make


def makers(kernels: Any) -> dict[str, Maker]:
    """Every option, by the name the tables print; pdserve's when its kernels loaded."""
    found: dict[str, Maker] = {
        "F.linear": f_linear,
        "mkl packed": mkl_packed,
        "onednn packed": onednn_packed,
    }
    if kernels is not None:
        found["pdserve"] = pdserve_packed(kernels)
    return found


class _GemmStack(nn.Module):
    """Every decoder layer's GEMMs as one module (inputs taken in turn from ``xs``), so that
    inductor compiles them as one graph and, with freezing, prepacks every weight."""

    def __init__(self, weights: list[list[torch.Tensor]]) -> None:
        super().__init__()
        self.lins = nn.ModuleList(_linear_of(w) for layer in weights for w in layer)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [lin(xs[i % len(xs)]) for i, lin in enumerate(self.lins)]


def _linear_of(w: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = nn.Parameter(w, requires_grad=False)
    return lin


def inductor_frozen(
    weights: list[list[torch.Tensor]], lm_head: torch.Tensor, xs: list[torch.Tensor]
) -> tuple[Callable[[], object], Callable[[], object], float]:
    """``torch.compile`` (inductor's CPU backend, ``freezing=True``: weights folded in and
    prepacked, static shapes) over all the layers' GEMMs, layer ``i``'s ``j``-th taking
    ``xs[j]``, and over the lm_head on ``xs[0]``: a call of each, and the seconds compiling
    took."""
    import torch._inductor.config as inductor_config

    stack, head = _GemmStack(weights).eval(), _linear_of(lm_head).eval()
    with inductor_config.patch(freezing=True):
        t0 = time.perf_counter()
        compiled_stack = torch.compile(stack, dynamic=False)
        compiled_head = torch.compile(head, dynamic=False)
        compiled_stack(xs)
        compiled_head(xs[0])
        compile_s = time.perf_counter() - t0
    return (lambda: compiled_stack(xs)), (lambda: compiled_head(xs[0])), compile_s

"""The float32 linear layers' weights, packed for the compiled GEMM into one buffer.

A decode step streams every packed weight from memory once, and the GEMMs wait on that stream
(docs/benchmarks.md, 2026-12-05: one core's GEMM at decode sizes ran at 80-83% of its FMA peak
on 4 KiB pages and 96% on 2 MiB pages). Each weight packed into its own allocation would sit
on 4 KiB pages: Linux gives huge pages only when asked (transparent huge pages in ``madvise``
mode, the common default). So the layers' packed weights share one buffer, in model order: a
private mapping of its own that starts on a 2 MiB boundary and is advised for huge pages
before anything writes to it (``engine.huge_pages.huge_page_aligned``;
``PDSERVE_WEIGHT_HUGE_PAGES=0`` turns the advice off).

A weight whose every float32 value bf16 holds exactly (its lower 16 bits all zero: a bf16
checkpoint loaded in float32, as most published checkpoints are) is packed as bf16 panels
instead: half the bytes for the decode step to stream, and the same products and sums, so the
same bits, as its float32 panels (kernels/cpu/gemm.cpp). Any other weight keeps float32 panels;
``PDSERVE_BF16_EXACT_WEIGHTS=0`` keeps every weight in float32.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from engine.huge_pages import WEIGHT_HUGE_PAGES_ENV, huge_page_aligned

log = logging.getLogger(__name__)

BF16_WEIGHTS_ENV = "PDSERVE_BF16_EXACT_WEIGHTS"
_CHECK_CHUNK = 1 << 22  # elements a bf16_exact pass looks at at once (16 MiB of int32)


def bf16_panels(weights: list[torch.Tensor]) -> list[bool]:
    """For each float32 weight, whether to pack it as bf16: it is ``bf16_exact`` and
    ``PDSERVE_BF16_EXACT_WEIGHTS`` is not ``0``. Says how many it chose in one log line."""
    if os.environ.get(BF16_WEIGHTS_ENV, "1") == "0":
        return [False] * len(weights)
    chosen = [bf16_exact(w) for w in weights]
    if any(chosen):
        log.info(
            "%d of %d linear weights are bf16-exact: packed as bf16 (half the bytes, the same "
            "results; %s=0 keeps float32)",
            sum(chosen),
            len(chosen),
            BF16_WEIGHTS_ENV,
        )
    return chosen


def bf16_exact(weight: torch.Tensor) -> bool:
    """Whether bf16 holds every value of this float32 weight exactly: every value's lower 16
    bits are zero (a NaN with a payload there, or any value rounded, says no)."""
    if weight.dtype != torch.float32:
        return False
    flat = weight.detach().contiguous().view(-1).view(torch.int32)
    for start in range(0, flat.numel(), _CHECK_CHUNK):
        if bool((flat[start : start + _CHECK_CHUNK] & 0xFFFF).any()):
            return False
    return True


def packed_numel(out_features: int, in_features: int, panel_width: int) -> int:
    """Elements of a packed ``[out_features, in_features]`` weight: ``ceil(out / panel_width)``
    panels of ``in x panel_width``."""
    return -(-out_features // panel_width) * in_features * panel_width


def empty_packed_weights(
    shapes: list[tuple[int, int]], kernels: Any, bf16: list[bool] | None = None
) -> list[torch.Tensor]:
    """For each ``(out_features, in_features)``, an untouched view shaped as
    ``kernels.pack_linear_weight`` packs that weight, float32 or (where ``bf16`` says so)
    bfloat16; the views lie back to back, in the order given, each on a 64-byte boundary, in
    one buffer advised for huge pages. Fill each with ``pack_into``."""
    if not shapes:
        return []
    bf16 = bf16 or [False] * len(shapes)
    panel_width = int(kernels.pack_linear_weight(torch.zeros(1, 1)).shape[2])
    dtypes = [torch.bfloat16 if b else torch.float32 for b in bf16]
    sizes = [
        packed_numel(n, k, panel_width) * (2 if b else 4)
        for (n, k), b in zip(shapes, bf16, strict=True)
    ]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + -(-size // 64) * 64)
    buf, advised = huge_page_aligned(offsets[-1], torch.uint8, WEIGHT_HUGE_PAGES_ENV)
    log.debug(
        "packed weights: %d MiB (%d of %d weights as bf16), %d MiB advised for huge pages",
        offsets[-1] >> 20,
        sum(bf16),
        len(bf16),
        advised >> 20,
    )
    return [
        buf[offset : offset + size].view(dtype).view(-1, k, panel_width)
        for (_, k), size, offset, dtype in zip(shapes, sizes, offsets[:-1], dtypes, strict=True)
    ]


def pack_into(view: torch.Tensor, weight: torch.Tensor, kernels: Any) -> torch.Tensor:
    """Packs ``weight`` into ``view`` (one of ``empty_packed_weights``; bf16 panels when the
    view is bfloat16, which needs ``bf16_exact(weight)``) and returns the view. The packing goes
    through a temporary of the packed size: the caller releases each unpacked weight as it goes,
    so loading holds about one model, not two."""
    view.copy_(kernels.pack_linear_weight(weight.detach(), view.dtype == torch.bfloat16))
    return view

"""The float32 linear layers' weights, packed for the compiled GEMM into one buffer.

A decode step streams every packed weight from memory once, and the GEMMs wait on that stream
(docs/benchmarks.md, 2026-12-05: one core's GEMM at decode sizes ran at 80-83% of its FMA peak
on 4 KiB pages and 96% on 2 MiB pages). Each weight packed into its own allocation would sit
on 4 KiB pages: Linux gives huge pages only when asked (transparent huge pages in ``madvise``
mode, the common default). So the layers' packed weights share one buffer, in model order: a
private mapping of its own that starts on a 2 MiB boundary and is advised for huge pages
before anything writes to it (``engine.huge_pages.huge_page_aligned``;
``PDSERVE_WEIGHT_HUGE_PAGES=0`` turns the advice off).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.huge_pages import WEIGHT_HUGE_PAGES_ENV, huge_page_aligned

log = logging.getLogger(__name__)


def packed_numel(out_features: int, in_features: int, panel_width: int) -> int:
    """Floats of a packed ``[out_features, in_features]`` weight: ``ceil(out / panel_width)``
    panels of ``in x panel_width``."""
    return -(-out_features // panel_width) * in_features * panel_width


def empty_packed_weights(shapes: list[tuple[int, int]], kernels: Any) -> list[torch.Tensor]:
    """For each ``(out_features, in_features)``, an untouched view shaped as
    ``kernels.pack_linear_weight`` packs that weight; the views lie back to back, in the order
    given, in one buffer advised for huge pages. Fill each with ``pack_into``."""
    if not shapes:
        return []
    panel_width = int(kernels.pack_linear_weight(torch.zeros(1, 1)).shape[2])
    sizes = [packed_numel(n, k, panel_width) for n, k in shapes]
    buf, advised = huge_page_aligned(sum(sizes), torch.float32, WEIGHT_HUGE_PAGES_ENV)
    log.debug(
        "packed weights: %d MiB, %d MiB advised for huge pages", sum(sizes) >> 18, advised >> 20
    )
    views, offset = [], 0
    for (_, k), size in zip(shapes, sizes, strict=True):
        views.append(buf[offset : offset + size].view(-1, k, panel_width))
        offset += size
    return views


def pack_into(view: torch.Tensor, weight: torch.Tensor, kernels: Any) -> torch.Tensor:
    """Packs ``weight`` into ``view`` (one of ``empty_packed_weights``) and returns the view.
    The packing goes through a temporary of the weight's size: the caller releases each
    unpacked weight as it goes, so loading holds about one model, not two."""
    view.copy_(kernels.pack_linear_weight(weight.detach()))
    return view

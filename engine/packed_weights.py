"""The float32 linear layers' weights, packed for the compiled GEMM into one buffer.

A decode step streams every packed weight from memory once, and the GEMMs wait on that stream
(docs/benchmarks.md, 2026-12-05: one core's GEMM at decode sizes ran at 83% of its FMA peak on
4 KiB pages and 96% on 2 MiB pages). Each weight packed into its own allocation would sit on
4 KiB pages: glibc maps large buffers fresh and Linux gives them huge pages only when asked
(transparent huge pages in ``madvise`` mode, the common default). So the layers' packed weights
share one buffer, in model order, that starts on a 2 MiB boundary and is advised for huge
pages before anything writes to it (``PDSERVE_WEIGHT_HUGE_PAGES=0`` turns the advice off).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from engine.huge_pages import WEIGHT_HUGE_PAGES_ENV, huge_page_aligned

log = logging.getLogger(__name__)


def packed_numel(linear: nn.Linear, panel_width: int) -> int:
    """Floats of ``linear``'s packed weight: ``ceil(out / panel_width)`` panels of
    ``in x panel_width``."""
    panels = -(-linear.out_features // panel_width)
    return panels * linear.in_features * panel_width


def pack_into_one_buffer(linears: list[nn.Linear], kernels: Any) -> list[torch.Tensor]:
    """Each linear layer's packed weight (``kernels.pack_linear_weight``'s layout), as views of
    one buffer on huge pages where the host gives them; in the order given."""
    if not linears:
        return []
    panel_width = int(kernels.pack_linear_weight(torch.zeros(1, 1)).shape[2])
    sizes = [packed_numel(linear, panel_width) for linear in linears]
    buf, advised = huge_page_aligned(sum(sizes), torch.float32, WEIGHT_HUGE_PAGES_ENV)
    log.debug(
        "packed weights: %d MiB, %d MiB advised for huge pages", buf.numel() >> 18, advised >> 20
    )
    views, offset = [], 0
    for linear, size in zip(linears, sizes, strict=True):
        view = buf[offset : offset + size].view(-1, linear.in_features, panel_width)
        # Packed one at a time into a temporary: the largest (a tied lm_head) is ~100 MiB.
        view.copy_(kernels.pack_linear_weight(linear.weight.detach()))
        views.append(view)
        offset += size
    return views

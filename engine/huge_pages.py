"""Transparent huge pages for the CPU KV pool and the packed linear weights.

A decode step reads every running request's K/V, block by block, from places scattered over a
pool of hundreds of MB or more. On 4 KiB pages one layer's K and V of a block (24 KiB for
SmolLM2-135M's shape) spans six pages, a layer's attention call touches thousands of pages, and
the GEMMs between two calls stream enough weights to evict them all from the TLB: nearly every
page of every call is a page walk. ``madvise(MADV_HUGEPAGE)`` asks Linux to back the buffer with
2 MiB pages when it is first touched, where transparent huge pages are enabled as ``always`` or
``madvise`` (``/sys/kernel/mm/transparent_hugepage/enabled``); elsewhere it does nothing and the
pool works as before. ``PDSERVE_KV_HUGE_PAGES=0`` turns it off (a host where the kernel's
compaction for huge pages stalls first touches). Measured in docs/benchmarks.md (2026-12-04,
night).

The packed weights of the float32 linear layers (engine/packed_weights.py) stream from memory
once a decode step; on 4 KiB pages the hardware prefetchers stop at every page and each page is
a page walk, so they get the same advice, under their own switch
(``PDSERVE_WEIGHT_HUGE_PAGES=0``). Measured in docs/benchmarks.md (2026-12-05).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
HUGE_PAGES_ENV = "PDSERVE_KV_HUGE_PAGES"
WEIGHT_HUGE_PAGES_ENV = "PDSERVE_WEIGHT_HUGE_PAGES"
_MADV_HUGEPAGE = 14  # linux/mman.h


def advise_huge_pages(t: torch.Tensor, switch: str = HUGE_PAGES_ENV) -> int:
    """Advises the 2 MiB-aligned interior of ``t``'s memory for huge pages; returns the bytes
    advised (0 off Linux, off the CPU, for buffers under 2 MiB, when the environment variable
    ``switch`` is ``0`` or when madvise refuses).

    Only pages not yet touched are affected: call it on a fresh ``torch.empty``, before
    anything writes to it. Buffers above glibc's mmap threshold (at most 32 MiB), as KV pools
    are, are always fresh mappings; a smaller one may be heap memory touched before."""
    if not sys.platform.startswith("linux") or t.device.type != "cpu":
        return 0
    if os.environ.get(switch, "1") == "0":
        return 0
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    length = (end - first) // HUGE_PAGE * HUGE_PAGE
    if length <= 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(first, length, _MADV_HUGEPAGE) != 0:
        log.debug("madvise(MADV_HUGEPAGE) refused: errno %d", ctypes.get_errno())
        return 0
    return length


def huge_page_aligned(numel: int, dtype: torch.dtype, switch: str) -> tuple[torch.Tensor, int]:
    """A fresh, untouched CPU buffer of ``numel`` elements that starts on a 2 MiB boundary,
    advised for huge pages; returns it and the bytes advised (see ``advise_huge_pages``).

    On Linux it is a private anonymous mapping of its own (``mmap``), never heap memory that
    malloc hands out again already touched (on 4 KiB pages, which no advice changes): glibc
    serves requests below its mmap threshold, which grows up to 32 MiB, from the heap. The
    tensor keeps the mapping alive. The slack before the boundary is never touched, so it
    costs no memory."""
    if numel == 0:
        return torch.empty(0, dtype=dtype), 0
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not sys.platform.startswith("linux"):
        raw = torch.empty(numel + HUGE_PAGE // itemsize, dtype=dtype)
        skip = (-raw.data_ptr() % HUGE_PAGE) // itemsize
        buf = raw[skip : skip + numel]
        return buf, advise_huge_pages(buf, switch)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    mapping = mmap.mmap(-1, numel * itemsize + HUGE_PAGE, flags=flags)
    start = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    buf = torch.frombuffer(mapping, dtype=dtype, count=numel, offset=-start % HUGE_PAGE)
    return buf, advise_huge_pages(buf, switch)

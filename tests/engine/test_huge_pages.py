"""The CPU KV pool asks for transparent huge pages (engine/huge_pages.py), and Linux gives them
where THP is enabled: read back from /proc/self/smaps, not assumed."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.huge_pages import HUGE_PAGE, HUGE_PAGES_ENV, advise_huge_pages, huge_page_aligned
from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec
from engine.llm_engine import LLMEngine
from tests.conftest import TINY_ARCHS

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


def thp_mode() -> str | None:
    """The selected THP mode ('always', 'madvise', 'never'), None where the file is missing."""
    if not THP.exists():
        return None
    text = THP.read_text()
    return text[text.index("[") + 1 : text.index("]")]


def anon_huge_kib(start: int, end: int) -> int:
    """AnonHugePages (KiB) of the mappings that overlap [start, end) in /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and hi > start
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


def churn_the_heap() -> None:
    """Leaves glibc's mmap threshold raised and touched memory free in the heap, as a worker
    that has run other tests has: a buffer taken from malloc now may be that memory, on 4 KiB
    pages no advice changes (this failed a test in CI before the pools got their own maps)."""
    for _ in range(4):
        big = torch.ones(5_000_000)  # 20 MB: mapped, and its free raises the threshold
        del big
    small = [torch.ones(1_000_000) for _ in range(8)]  # 4 MB each: from the heap now
    del small


def small_pool(prefault: bool = False) -> KVCache:
    """An 8 MiB pool, made after the heap is churned: it must still be a mapping of its own."""
    churn_the_heap()
    spec = KVCacheSpec(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="float32")
    return KVCache(spec, 128, 0, torch.device("cpu"), prefault=prefault)


# madvise(2) and mincore(2) are Linux calls; elsewhere advise_huge_pages advises nothing and
# returns 0, which test_refuses_what_it_cannot_advise covers on every platform.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux system calls")


def test_refuses_what_it_cannot_advise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert advise_huge_pages(torch.empty(1000)) == 0  # under 2 MiB: no aligned interior
    assert advise_huge_pages(torch.empty(1 << 22, device="meta")) == 0  # not host memory
    monkeypatch.setenv(HUGE_PAGES_ENV, "0")  # the operator's off switch
    assert advise_huge_pages(torch.empty(1 << 22)) == 0


@linux_only
def test_advises_the_aligned_interior() -> None:
    t = torch.empty(5 * HUGE_PAGE // 4 + 123)  # 5 huge pages of bytes, start unaligned
    advised = advise_huge_pages(t)
    start = t.data_ptr()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    assert advised == (start + t.numel() * 4 - first) // HUGE_PAGE * HUGE_PAGE
    assert advised >= 4 * HUGE_PAGE


# Whether Linux hands out huge pages at all is the host kernel's setting, not pdserve's.
needs_thp = pytest.mark.skipif(
    thp_mode() not in ("always", "madvise"),
    reason="the kernel's transparent huge pages are off here ('never' or absent): madvise is "
    "accepted but no huge page is given (CI machines run 'madvise')",
)


@needs_thp
def test_kv_pool_is_backed_by_huge_pages_once_touched() -> None:
    cache = small_pool()
    pool = cache.pool
    size = pool.numel() * pool.element_size()
    assert size >= 4 * HUGE_PAGE
    assert start_is_aligned(pool) and cache.pool_huge_page_bytes == size
    start = pool.data_ptr()
    pool.zero_()  # first touch: the kernel backs the advised range with 2 MiB pages
    # (it may fall back to 4 KiB pages where it finds no free 2 MiB ones: half is the bar)
    huge = anon_huge_kib(start, start + size) * 1024
    assert huge >= cache.pool_huge_page_bytes // 2


def start_is_aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % HUGE_PAGE == 0


@linux_only
def test_huge_page_aligned_is_a_fresh_aligned_mapping() -> None:
    churn_the_heap()
    buf, advised = huge_page_aligned(3 * HUGE_PAGE // 4 + 5, torch.float32, HUGE_PAGES_ENV)
    assert start_is_aligned(buf) and buf.numel() == 3 * HUGE_PAGE // 4 + 5
    assert advised == 3 * HUGE_PAGE  # the whole 2 MiB pages inside it
    assert resident_fraction(buf) == 0.0  # untouched: never memory malloc handed out before
    view = buf[7:9]
    del buf
    view.fill_(2.0)  # a view keeps the mapping alive
    assert view.sum().item() == 4.0
    assert huge_page_aligned(0, torch.float32, HUGE_PAGES_ENV)[0].numel() == 0


def resident_fraction(t: torch.Tensor) -> float:
    """The share of ``t``'s pages that are in memory now (mincore(2): exact for the range)."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    end = t.data_ptr() + t.numel() * t.element_size()
    pages = -(-(end - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec) / pages


@linux_only
def test_a_prefaulted_pool_is_resident_from_the_start() -> None:
    cache = small_pool(prefault=True)
    assert resident_fraction(cache.pool) == 1.0
    assert not cache.pool.any()  # written with zeros


@linux_only
def test_the_engine_prefaults_its_pool_unless_told_not_to(llama: Path) -> None:
    # 64 MiB pools: fresh mappings of their own, never heap memory touched before.
    options = {
        "model": str(llama),
        "dtype": "float32",
        "device": "cpu",
        "kv_cache_memory_gb": 1 / 16,
    }
    engine = LLMEngine(EngineConfig(**options))  # type: ignore[arg-type]
    assert resident_fraction(engine.kv_cache.pool) == 1.0
    lazy = LLMEngine(EngineConfig(**options, kv_cache_prefault=False))  # type: ignore[arg-type]
    assert resident_fraction(lazy.kv_cache.pool) < 0.5  # untouched until blocks are written


def test_a_device_pool_is_left_alone() -> None:
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, dtype="float32")
    cache = KVCache(spec, num_blocks=256, num_host_blocks=0, device=torch.device("meta"))
    assert cache.pool_huge_page_bytes == 0

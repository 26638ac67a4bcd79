"""Shared pieces of the kernel benchmarks: model shape, timer, paged-cache setup, table output."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Shape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def kv_bytes_per_token(self) -> int:  # one layer's K and V for one token
        return 2 * self.num_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


class Bench:
    """Times callables, keeps the wall-clock budget, prints rows."""

    def __init__(self, device: torch.device, budget_s: float, peak_gbps: float) -> None:
        self.device = device
        self.deadline = time.monotonic() + budget_s
        self.peak_gbps = peak_gbps
        self.skipped = 0

    def out_of_time(self) -> bool:
        if time.monotonic() > self.deadline:
            self.skipped += 1
            return True
        return False

    def time_ms(self, fn: Callable[[], object]) -> float:
        """Median milliseconds; NaN (printed "nan") when the call runs out of GPU memory."""
        if self.device.type == "cuda":
            import triton.testing

            try:
                return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                return math.nan
        fn()  # --smoke-on-cpu: one warm call, one timed call
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def gbps(self, num_bytes: float, ms: float) -> float:
        return num_bytes / (ms * 1e-3) / 1e9


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on ``device``; an H100's 132 on CPU (the smoke run)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def max_err(got: object, expected: object) -> str:
    """Largest absolute difference, as a table cell: a GPU-only miscompile shows up here."""
    assert isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
    return f"{(got.float() - expected.float()).abs().max().item():.1e}"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


def kv_pool(
    shape: Shape, num_blocks: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random one-layer pool [num_blocks, 1, 2, block_size, kv_heads, head_dim], K and V views."""
    pool = torch.randn(
        num_blocks,
        1,
        2,
        shape.block_size,
        shape.num_kv_heads,
        shape.head_dim,
        device=device,
        dtype=shape.dtype,
    )
    return pool, pool[:, 0, 0], pool[:, 0, 1]


def paged_setup(
    shape: Shape, num_seqs: int, seq_len: int, pool: torch.Tensor, perm: torch.Tensor
) -> torch.Tensor:
    """Block tables giving each sequence ``seq_len`` tokens on scattered physical blocks."""
    blocks_per_seq = -(-seq_len // shape.block_size)
    needed = num_seqs * blocks_per_seq
    assert needed <= pool.shape[0], "pool too small"
    return perm[:needed].view(num_seqs, blocks_per_seq).to(torch.int32)


def paged_cache(
    shape: Shape, num_seqs: int, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool just large enough for ``num_seqs`` sequences of ``seq_len`` tokens on scattered
    blocks: returns (k_cache, v_cache, block_tables)."""
    num_blocks = num_seqs * (-(-seq_len // shape.block_size)) + 1
    pool, k_cache, v_cache = kv_pool(shape, num_blocks, device)
    perm = torch.randperm(num_blocks, device=device)
    return k_cache, v_cache, paged_setup(shape, num_seqs, seq_len, pool, perm)


def gather_dense(k_cache: torch.Tensor, block_tables: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[num_seqs, num_kv_heads, seq_len, head_dim] from the paged cache (the baseline's gather)."""
    num_seqs = block_tables.shape[0]
    dense = k_cache[block_tables.long()]  # [num_seqs, blocks, block_size, kv_heads, dim]
    dense = dense.reshape(num_seqs, -1, k_cache.shape[2], k_cache.shape[3])[:, :seq_len]
    return dense.transpose(1, 2)

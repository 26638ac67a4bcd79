"""Time the Triton kernels against torch baselines on a GPU; print markdown tables.

    python benchmarks/kernels.py [--peak-gbps 4800] [--dtype bfloat16] [--budget-s 270]

Sections (model shape from flags; defaults are Llama-3-8B's attention: 32 query heads, 8 KV
heads, head_dim 128, block size 16, bf16):

- decode sweep: GB/s of the decode kernel over tile sizes x warps at two points, to check the
  defaults (64 tokens per tile, 4 warps).
- decode: ``paged_decode_attention`` (split-KV by the engine's heuristic, and unsplit) vs
  gather + SDPA (the paged cache gathered into a dense tensor, then
  ``scaled_dot_product_attention``) and SDPA on an already dense cache (no paging: a floor a
  paged kernel can only match), for contexts 512-32k and batches 1-256. GB/s counts the K/V
  bytes the step must read; "% peak" is that over ``--peak-gbps`` (default: H200, 4.8 TB/s).
- prefill: ``paged_prefill_attention`` on chunks over existing context vs gather + SDPA with
  the causal mask; TFLOP/s from the visible (causal) query-key pairs. Plus a mixed step (one
  prefill chunk and many decodes) as one unified launch vs a prefill launch plus a decode launch.
- kv store / block copy: ``store_kv`` vs an index_put, ``copy_blocks`` vs index_select +
  index_copy; GB/s counts bytes read plus bytes written.

Timings are the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between calls).
Configs are skipped once ``--budget-s`` of wall time is spent, so the run stays under 5 minutes.
Refuses to run without a CUDA device (``--smoke-on-cpu`` runs tiny shapes in Triton's
interpreter to check the script itself; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and would shadow `kernels/`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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


def _max_err(got: object, expected: object) -> str:
    """Largest absolute difference, as a table cell: a GPU-only miscompile shows up here."""
    assert isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
    return f"{(got.float() - expected.float()).abs().max().item():.1e}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


def _paged_setup(
    shape: Shape, num_seqs: int, seq_len: int, pool: torch.Tensor, perm: torch.Tensor
) -> torch.Tensor:
    """Block tables giving each sequence ``seq_len`` tokens on scattered physical blocks."""
    blocks_per_seq = -(-seq_len // shape.block_size)
    needed = num_seqs * blocks_per_seq
    assert needed <= pool.shape[0], "pool too small"
    return perm[:needed].view(num_seqs, blocks_per_seq).to(torch.int32)


def _gather_dense(k_cache: torch.Tensor, block_tables: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[num_seqs, num_kv_heads, seq_len, head_dim] from the paged cache (the baseline's gather)."""
    num_seqs = block_tables.shape[0]
    dense = k_cache[block_tables.long()]  # [num_seqs, blocks, block_size, kv_heads, dim]
    dense = dense.reshape(num_seqs, -1, k_cache.shape[2], k_cache.shape[3])[:, :seq_len]
    return dense.transpose(1, 2)


def bench_decode(
    bench: Bench, shape: Shape, contexts: list[int], batches: list[int], max_tokens: int
) -> None:
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention

    device = bench.device
    num_sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 132
    )
    pool_tokens = max(b * c for b in batches for c in contexts if b * c <= max_tokens)
    num_blocks = pool_tokens // shape.block_size + 1
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
    k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
    perm = torch.randperm(num_blocks, device=device)
    scale = shape.head_dim**-0.5
    rows = []
    for context in contexts:
        for batch in batches:
            if batch * context > max_tokens:
                continue
            if bench.out_of_time():
                continue
            block_tables = _paged_setup(shape, batch, context, pool, perm)
            seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
            q = torch.randn(
                batch, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
            )
            splits = default_num_splits(batch, shape.num_kv_heads, context, num_sms)
            out = torch.empty_like(q)

            def triton_split(bt=block_tables, sl=seq_lens, q=q, out=out, s=splits) -> object:
                return paged_decode_attention(q, k_cache, v_cache, bt, sl, scale, s, out=out)

            def triton_nosplit(bt=block_tables, sl=seq_lens, q=q, out=out) -> object:
                return paged_decode_attention(q, k_cache, v_cache, bt, sl, scale, 1, out=out)

            def gather_sdpa(bt=block_tables, q=q, context=context) -> object:
                k = _gather_dense(k_cache, bt, context)
                v = _gather_dense(v_cache, bt, context)
                return F.scaled_dot_product_attention(
                    q.unsqueeze(2), k, v, scale=scale, enable_gqa=True
                )

            k_dense = _gather_dense(k_cache, block_tables, context).contiguous()
            v_dense = _gather_dense(v_cache, block_tables, context).contiguous()

            def dense_sdpa(q=q, k=k_dense, v=v_dense) -> object:
                return F.scaled_dot_product_attention(
                    q.unsqueeze(2), k, v, scale=scale, enable_gqa=True
                )

            expected = dense_sdpa().squeeze(2)  # type: ignore[attr-defined]
            err = max(
                float(_max_err(triton_split(), expected)),
                float(_max_err(triton_nosplit(), expected)),
            )
            kv_bytes = batch * context * shape.kv_bytes_per_token
            ms = {
                "split": bench.time_ms(triton_split),
                "nosplit": bench.time_ms(triton_nosplit),
                "gather": bench.time_ms(gather_sdpa),
                "dense": bench.time_ms(dense_sdpa),
            }
            best = min(ms["split"], ms["nosplit"])
            gbps = bench.gbps(kv_bytes, ms["split"])
            rows.append(
                [
                    str(context),
                    str(batch),
                    str(splits),
                    f"{ms['split'] * 1e3:.1f}",
                    f"{ms['nosplit'] * 1e3:.1f}",
                    f"{ms['gather'] * 1e3:.1f}",
                    f"{ms['dense'] * 1e3:.1f}",
                    f"{gbps:.0f}",
                    f"{100 * gbps / bench.peak_gbps:.0f}%",
                    f"{ms['gather'] / ms['split']:.1f}x",
                    f"{ms['dense'] / best:.2f}x",
                    f"{err:.1e}",
                ]
            )
            del k_dense, v_dense, dense_sdpa  # the closure holds the dense copies too
    _table(
        "decode attention (one token per sequence)",
        [
            "context",
            "batch",
            "splits",
            "triton us",
            "unsplit us",
            "gather+SDPA us",
            "dense SDPA us",
            "triton GB/s",
            "% peak",
            "vs gather+SDPA",
            "vs dense SDPA",
            "max err",
        ],
        rows,
    )
    del pool


def bench_decode_sweep(
    bench: Bench,
    shape: Shape,
    configs: list[tuple[int, int]],
    tile_ns: list[int],
    warps: list[int],
) -> None:
    """Decode tile size x warps at a few (batch, context) points, to check the defaults."""
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention

    device = bench.device
    num_sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 132
    )
    scale = shape.head_dim**-0.5
    rows = []
    for batch, context in configs:
        if bench.out_of_time():
            continue
        num_blocks = batch * (-(-context // shape.block_size)) + 1
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
        k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
        perm = torch.randperm(num_blocks, device=device)
        block_tables = _paged_setup(shape, batch, context, pool, perm)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype)
        out = torch.empty_like(q)
        splits = default_num_splits(batch, shape.num_kv_heads, context, num_sms)
        kv_bytes = batch * context * shape.kv_bytes_per_token
        cells = []
        for tile_n in tile_ns:
            for num_warps in warps:
                if tile_n % shape.block_size:
                    cells.append("-")
                    continue

                fn = functools.partial(
                    paged_decode_attention,
                    q,
                    k_cache,
                    v_cache,
                    block_tables,
                    seq_lens,
                    scale,
                    splits,
                    out=out,
                    tile_n=tile_n,
                    num_warps=num_warps,
                )
                cells.append(f"{bench.gbps(kv_bytes, bench.time_ms(fn)):.0f}")
        rows.append([str(batch), str(context), str(splits), *cells])
        del pool
    _table(
        "decode tile sweep: GB/s by TILE_N x num_warps (defaults: 64 x 4)",
        ["batch", "context", "splits"] + [f"{t} x {w}" for t in tile_ns for w in warps],
        rows,
    )


def bench_prefill(bench: Bench, shape: Shape, configs: list[tuple[int, int, int]]) -> None:
    from kernels.paged_prefill_attention import paged_prefill_attention

    device = bench.device
    scale = shape.head_dim**-0.5
    rows = []
    for num_seqs, context, chunk in configs:
        if bench.out_of_time():
            continue
        seq_len = context + chunk
        num_blocks = num_seqs * (-(-seq_len // shape.block_size)) + 1
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
        k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
        perm = torch.randperm(num_blocks, device=device)
        block_tables = _paged_setup(shape, num_seqs, seq_len, pool, perm)
        q = torch.randn(
            num_seqs * chunk, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
        )
        qsl = torch.arange(0, num_seqs * chunk + 1, chunk, dtype=torch.int32, device=device)
        seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
        out = torch.empty_like(q)
        # Causal mask aligned at the bottom right: row j sees keys 0 .. context + j.
        visible = (
            torch.arange(seq_len, device=device)[None, :]
            <= context + torch.arange(chunk, device=device)[:, None]
        )

        def triton_fn(
            bt=block_tables, q=q, qsl=qsl, sl=seq_lens, out=out, kc=k_cache, vc=v_cache
        ) -> object:
            return paged_prefill_attention(q, kc, vc, bt, qsl, sl, scale, out=out)

        def gather_sdpa(
            bt=block_tables,
            q=q,
            n=num_seqs,
            chunk=chunk,
            seq_len=seq_len,
            mask=visible,
            kc=k_cache,
            vc=v_cache,
            context=context,
        ) -> object:
            k = _gather_dense(kc, bt, seq_len)
            v = _gather_dense(vc, bt, seq_len)
            qd = q.view(n, chunk, shape.num_heads, shape.head_dim).transpose(1, 2)
            if context == 0:
                return F.scaled_dot_product_attention(
                    qd, k, v, scale=scale, is_causal=True, enable_gqa=True
                )
            return F.scaled_dot_product_attention(
                qd, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            )

        pairs = num_seqs * (chunk * context + chunk * (chunk + 1) // 2)
        flops = 4 * pairs * shape.num_heads * shape.head_dim
        reference = gather_sdpa()  # [seqs, heads, chunk, dim]
        assert isinstance(reference, torch.Tensor)
        err = _max_err(triton_fn(), reference.transpose(1, 2).reshape(q.shape))
        ms_t, ms_g = bench.time_ms(triton_fn), bench.time_ms(gather_sdpa)
        rows.append(
            [
                str(num_seqs),
                str(context),
                str(chunk),
                f"{ms_t * 1e3:.0f}",
                f"{ms_g * 1e3:.0f}",
                f"{flops / (ms_t * 1e-3) / 1e12:.0f}",
                f"{flops / (ms_g * 1e-3) / 1e12:.0f}",
                f"{ms_g / ms_t:.1f}x",
                err,
            ]
        )
        del pool
    _table(
        "chunked-prefill attention (new tokens over existing context)",
        [
            "seqs",
            "context",
            "chunk",
            "triton us",
            "gather+SDPA us",
            "triton TFLOP/s",
            "SDPA TFLOP/s",
            "speedup",
            "max err",
        ],
        rows,
    )


def bench_mixed(bench: Bench, shape: Shape, chunk: int, context: int, num_decodes: int) -> None:
    """One prefill chunk plus decodes: a single unified launch vs prefill + decode launches."""
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention
    from kernels.paged_prefill_attention import paged_prefill_attention

    if bench.out_of_time():
        return
    device = bench.device
    scale = shape.head_dim**-0.5
    num_seqs = 1 + num_decodes
    seq_len = context + chunk
    num_blocks = num_seqs * (-(-seq_len // shape.block_size)) + 1
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
    k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
    perm = torch.randperm(num_blocks, device=device)
    block_tables = _paged_setup(shape, num_seqs, seq_len, pool, perm)
    query_lens = [chunk] + [1] * num_decodes
    seq_lens = torch.tensor(
        [seq_len] + [context + 1] * num_decodes, dtype=torch.int32, device=device
    )
    qsl = torch.tensor(
        [0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    q = torch.randn(
        sum(query_lens), shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
    )
    out = torch.empty_like(q)
    splits = default_num_splits(num_decodes, shape.num_kv_heads, context + 1)

    def unified() -> object:
        return paged_prefill_attention(
            q, k_cache, v_cache, block_tables, qsl, seq_lens, scale, out=out
        )

    def two_launches() -> object:
        paged_prefill_attention(
            q[:chunk],
            k_cache,
            v_cache,
            block_tables[:1],
            qsl[:2],
            seq_lens[:1],
            scale,
            out=out[:chunk],
        )
        return paged_decode_attention(
            q[chunk:],
            k_cache,
            v_cache,
            block_tables[1:],
            seq_lens[1:],
            scale,
            splits,
            out=out[chunk:],
        )

    unified_out = unified()
    assert isinstance(unified_out, torch.Tensor)
    unified_out = unified_out.clone()
    two_launches()
    err = _max_err(unified_out, out)
    ms_u, ms_s = bench.time_ms(unified), bench.time_ms(two_launches)
    _table(
        f"mixed step: 1 chunk of {chunk} over {context} + {num_decodes} decodes at {context}",
        ["unified launch us", "prefill + decode launches us", "unified / two", "max diff"],
        [[f"{ms_u * 1e3:.0f}", f"{ms_s * 1e3:.0f}", f"{ms_u / ms_s:.2f}", err]],
    )
    del pool


def bench_store_and_copy(
    bench: Bench, shape: Shape, token_counts: list[int], pair_counts: list[int], num_layers: int
) -> None:
    from kernels.block_copy import copy_blocks
    from kernels.kv_store import store_kv

    device = bench.device
    max_tokens = max(token_counts)
    num_blocks = 2 * max_tokens // shape.block_size + 1
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
    k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
    rows = []
    for n in token_counts:
        if bench.out_of_time():
            continue
        slots = torch.randperm(num_blocks * shape.block_size, device=device)[:n]
        k = torch.randn(n, shape.num_kv_heads, shape.head_dim, device=device, dtype=shape.dtype)
        v = torch.randn_like(k)

        def triton_fn(k=k, v=v, slots=slots) -> object:
            store_kv(k, v, k_cache, v_cache, slots)
            return None

        def torch_fn(k=k, v=v, slots=slots) -> object:
            blk, off = slots // shape.block_size, slots % shape.block_size
            k_cache[blk, off] = k
            v_cache[blk, off] = v
            return None

        moved = 2 * n * shape.kv_bytes_per_token  # read k, v and write them
        triton_fn()
        blk, off = slots // shape.block_size, slots % shape.block_size
        exact = bool(torch.equal(k_cache[blk, off], k) and torch.equal(v_cache[blk, off], v))
        ms_t, ms_b = bench.time_ms(triton_fn), bench.time_ms(torch_fn)
        rows.append(
            [
                str(n),
                f"{ms_t * 1e3:.1f}",
                f"{ms_b * 1e3:.1f}",
                f"{bench.gbps(moved, ms_t):.0f}",
                f"{ms_b / ms_t:.1f}x",
                "yes" if exact else "NO",
            ]
        )
    _table(
        "kv store (one layer)",
        ["tokens", "triton us", "index_put us", "triton GB/s", "speedup", "exact"],
        rows,
    )
    del pool

    # Block copy over a whole block-major pool: a block holds every layer's K and V.
    block_shape = (num_layers, 2, shape.block_size, shape.num_kv_heads, shape.head_dim)
    max_pairs = max(pair_counts)
    block_pool = torch.randn(2 * max_pairs, *block_shape, device=device, dtype=shape.dtype)
    block_bytes = block_pool[0].numel() * block_pool.element_size()
    rows = []
    for n in pair_counts:
        if bench.out_of_time():
            continue
        perm = torch.randperm(2 * max_pairs, device=device)
        src, dst = perm[:n], perm[n : 2 * n]

        def triton_copy(src=src, dst=dst) -> object:
            copy_blocks(block_pool, block_pool, src, dst)
            return None

        def torch_copy(src=src, dst=dst) -> object:
            block_pool.index_copy_(0, dst, block_pool.index_select(0, src))
            return None

        triton_copy()
        exact = bool(torch.equal(block_pool[dst], block_pool[src]))
        ms_t, ms_b = bench.time_ms(triton_copy), bench.time_ms(torch_copy)
        rows.append(
            [
                str(n),
                f"{block_bytes / 2**20:.1f}",
                f"{ms_t * 1e3:.0f}",
                f"{ms_b * 1e3:.0f}",
                f"{bench.gbps(2 * n * block_bytes, ms_t):.0f}",
                f"{ms_b / ms_t:.1f}x",
                "yes" if exact else "NO",
            ]
        )
    _table(
        "block copy (copy-on-write within a pool)",
        [
            "pairs",
            "MiB/block",
            "triton us",
            "index_select+copy us",
            "triton GB/s",
            "speedup",
            "exact",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--peak-gbps",
        type=float,
        default=4800.0,
        help="peak HBM bandwidth in GB/s (default: H200, 4800)",
    )
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--num-layers", type=int, default=32, help="layers per block in the block-copy section"
    )
    parser.add_argument(
        "--max-decode-tokens",
        type=int,
        default=2**23,
        help="skip decode configs with batch x context above this",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=270.0,
        help="stop starting new configs after this many seconds",
    )
    parser.add_argument(
        "--sections",
        default="decode,sweep,prefill,mixed,store",
        help="comma-separated subset of decode,sweep,prefill,mixed,store",
    )
    parser.add_argument(
        "--smoke-on-cpu",
        action="store_true",
        help="tiny shapes in Triton's interpreter on CPU: checks the script only",
    )
    args = parser.parse_args(argv)

    if args.smoke_on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
        device = torch.device("cpu")
        contexts, batches = [64, 128], [1, 2]
        prefill = [(1, 0, 32), (2, 32, 16)]
        mixed = (16, 48, 3)
        sweep = [(2, 128)]
        tokens, pairs, layers = [4, 16], [2], 2
        shape = Shape(4, 2, 32, args.block_size, _DTYPES["float32"])
    else:
        if not torch.cuda.is_available():
            print(
                "benchmarks/kernels.py needs a CUDA GPU; none is visible here (torch "
                f"{torch.__version__}). Nothing was measured. (--smoke-on-cpu checks the "
                "script itself in Triton's interpreter; its numbers mean nothing.)",
                file=sys.stderr,
            )
            return 2
        device = torch.device("cuda")
        contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768]
        batches = [1, 16, 64, 256]
        prefill = [
            (1, 0, 512),
            (1, 0, 2048),
            (1, 0, 8192),
            (1, 4096, 512),
            (1, 16384, 2048),
            (4, 2048, 1024),
            (16, 0, 512),
        ]
        mixed = (2048, 4096, 255)
        sweep = [(16, 8192), (256, 4096)]
        tokens, pairs, layers = [1, 256, 4096, 16384], [1, 64, 512], args.num_layers
        shape = Shape(
            args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, _DTYPES[args.dtype]
        )

    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    print(f"## Triton kernels on {name}\n")
    print(
        f"torch {torch.__version__}, triton {triton.__version__}; heads {shape.num_heads}, "
        f"KV heads {shape.num_kv_heads}, head_dim {shape.head_dim}, block size "
        f"{shape.block_size}, {str(shape.dtype).removeprefix('torch.')}; peak "
        f"{args.peak_gbps:.0f} GB/s; times are medians in microseconds"
    )
    bench = Bench(device, args.budget_s, args.peak_gbps)
    start = time.monotonic()
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    with torch.inference_mode():
        if "decode" in sections:
            bench_decode(bench, shape, contexts, batches, args.max_decode_tokens)
        if "sweep" in sections:
            bench_decode_sweep(bench, shape, sweep, [32, 64, 128], [4, 8])
        if "prefill" in sections:
            bench_prefill(bench, shape, prefill)
        if "mixed" in sections:
            bench_mixed(bench, shape, *mixed)
        if "store" in sections:
            bench_store_and_copy(bench, shape, tokens, pairs, layers)
    print(
        f"\n{time.monotonic() - start:.0f} s total"
        + (f"; {bench.skipped} configs skipped (over --budget-s)" if bench.skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

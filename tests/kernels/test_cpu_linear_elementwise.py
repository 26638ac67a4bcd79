"""The compiled CPU packed linear and pointwise kernels against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.layers import RMSNorm, RotaryEmbedding, apply_rotary
from tests.kernels.cpu_ops import cpu_ops


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        (1, 576, 960),  # decode, the benchmark model's qkv
        (5, 64, 8),  # fewer output columns than one panel
        (7, 1536, 576),  # K split into blocks
        (18, 576, 3072),
        (33, 100, 37),  # nothing a multiple of anything
        (400, 96, 50),  # row blocks at prefill sizes, a partial last block
        (13, 2000, 40),  # uneven K blocks
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(m, k, n, bias):
    ops = cpu_ops()
    x, w = torch.randn(m, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    packed = ops.pack_linear_weight(w)
    got = ops.linear(x, packed, n, b)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    # float32 accumulation over k terms of size ~1: error grows like sqrt(k) ulps
    torch.testing.assert_close(got.double(), exact, atol=3e-6 * k**0.5 * 4, rtol=1e-5)


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        (800, 1000, 300),  # prefill: (row block, chunk of panels) items, row block by row block
        (18, 1000, 300),  # decode: each thread's units through its tile, written out at the end
        (24, 64, 37),  # the most rows a tile takes (AVX-512), a partial last panel
        (25, 64, 37),  # one row more: no tile
    ],
)
def test_linear_same_bits_for_any_thread_count(m, k, n):
    """However the threads share the panels (each its own run, stealing at the end) and
    wherever a unit's result waits before it reaches y, not a bit of the result changes."""
    ops = cpu_ops()
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    packed = ops.pack_linear_weight(w)
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got.append(ops.linear(x, packed, n, b))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    exact = F.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(got[0].double(), exact, atol=3e-6 * k**0.5 * 4, rtol=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_linear_rows_same_bits_in_any_batch(bf16):
    """A row's result does not depend on how many rows the call has: the call's rows are cut
    into row blocks as evenly as they go (20 rows on AVX2 as 5 + 5 + 5 + 5), and every row's
    sums are the same chain of multiply-adds whichever block it lands in. Every row count up to
    a few blocks, so every remainder and both tile and no-tile calls, plain and with SiLU, on
    float32 and bf16 panels."""
    ops = cpu_ops()
    k, n, inter = 200, 70, 32  # inter: whole panels on AVX2 and AVX-512, so one fused pass
    x, b = torch.randn(60, k), torch.randn(n)
    # bf16 panels take weights bf16 holds exactly
    w, w_gu = (torch.randn(r, k).bfloat16().float() for r in (n, 2 * inter))
    packed = ops.pack_linear_weight(w, bf16)
    packed_gu = ops.pack_linear_weight(w_gu, bf16)
    full = ops.linear(x, packed, n, b)
    full_gu = ops.linear_silu_mul(x, packed_gu, inter)
    for m in range(1, 60):
        assert torch.equal(ops.linear(x[:m], packed, n, b), full[:m]), m
        assert torch.equal(ops.linear_silu_mul(x[:m], packed_gu, inter), full_gu[:m]), m


def test_linear_strided_rows_and_bad_packing():
    ops = cpu_ops()
    w = torch.randn(20, 30)
    packed = ops.pack_linear_weight(w)
    x = torch.randn(6, 50)[:, :30]  # row stride 50
    torch.testing.assert_close(ops.linear(x, packed, 20, None), F.linear(x, w))
    with pytest.raises(RuntimeError, match="packed"):
        ops.linear(torch.randn(6, 31), packed, 20, None)
    with pytest.raises(RuntimeError, match="packed"):
        ops.linear(x, packed, 50, None)


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 17, 300])
def test_rms_norm_and_fused_add(dtype, rows):
    ops = cpu_ops()
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = torch.randn(576).to(dtype)
    x, residual = torch.randn(rows, 576).to(dtype), torch.randn(rows, 576).to(dtype)
    # The mean of squares is summed in another order than torch's: a few float32 ulps, which
    # can flip the last bit of a half-precision result (one ulp allowed there).
    ulp = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-9}[dtype]
    torch.testing.assert_close(ops.rms_norm(x, norm.weight, 1e-5), norm(x), atol=1e-5, rtol=ulp)
    stream = residual.clone()
    normed = ops.add_rms_norm(stream, x, norm.weight, 1e-5)
    assert torch.equal(stream, residual + x)  # the residual add is exact, in place
    torch.testing.assert_close(normed, norm(residual + x), atol=1e-5, rtol=ulp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 32), (2, 2, 128)])
def test_rotary_in_place_is_bit_exact(dtype, heads, kv_heads, dim):
    ops = cpu_ops()
    inv = tuple((1e4 ** (-torch.arange(0, dim, 2).float() / dim)).tolist())
    rot = RotaryEmbedding(inv, 512, 1.0)
    pos = torch.randint(0, 512, (23,))
    qkv = torch.randn(23, (heads + 2 * kv_heads) * dim).to(dtype)
    q = qkv[:, : heads * dim].view(23, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(23, kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    cos, sin = rot.lookup(pos, dtype)
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    ops.rotary_(q, k, rot.cos, rot.sin, pos)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 9, 200])
def test_silu_mul(dtype, rows):
    ops = cpu_ops()
    gate_up = (torch.randn(rows, 2 * 1536) * 4).to(dtype)
    want = F.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    tol = 1e-6 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(ops.silu_mul(gate_up), want, atol=tol, rtol=tol)


def ops_unpacked(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The [n, k] float64 weight back out of its packed panels [panels, k, nb]."""
    return packed.permute(0, 2, 1).reshape(-1, k)[:n].double()


@pytest.mark.parametrize(
    ("m", "k", "inter"),
    [
        (1, 576, 1536),  # decode, the benchmark model's MLP
        (12, 64, 32),  # one row block, one unit
        (18, 576, 1536),  # two row blocks: the second slice prefetch, gate then up
        (7, 1536, 96),  # K split into blocks
        (13, 2000, 64),  # uneven K blocks
        (400, 96, 160),  # row blocks at prefill sizes, a partial last block
        (5, 40, 24),  # gate and up panels do not line up: linear then silu_mul
        (9, 33, 1552),
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_silu_mul_is_linear_then_silu_mul(m, k, inter, threads):
    """The fused gate_up GEMM's epilogue gives the same bits as the two kernels one after the
    other (and so the engine's tokens do not depend on which of them ran)."""
    ops = cpu_ops()
    x = torch.randn(m, k)
    packed = ops.pack_linear_weight(torch.randn(2 * inter, k))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = ops.linear_silu_mul(x, packed, inter)
        want = ops.silu_mul(ops.linear(x, packed, 2 * inter, None))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, want)
    gate, up = F.linear(x.double(), ops_unpacked(packed, 2 * inter, k)).split(inter, dim=-1)
    torch.testing.assert_close(got.double(), F.silu(gate) * up, atol=1e-4 * k**0.5, rtol=1e-4)


def test_linear_silu_mul_bad_packing():
    ops = cpu_ops()
    packed = ops.pack_linear_weight(torch.randn(64, 30))
    with pytest.raises(RuntimeError, match="packed"):
        ops.linear_silu_mul(torch.randn(4, 31), packed, 32)
    with pytest.raises(RuntimeError, match="packed"):
        ops.linear_silu_mul(torch.randn(4, 30), packed, 64)

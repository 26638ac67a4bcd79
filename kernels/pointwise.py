"""A decoder layer's elementwise ops on the GPU, one launch each: RMSNorm (with the residual add
before it), rotary on q and k in place, SiLU·mul.

The torch layers (``engine/models/layers.py``) run these as about 30 small kernels a layer
(RMSNorm as pow/mean/rsqrt/mul/mul, rotary as slice/neg/cat/mul/add for q and for k, SiLU and a
mul, the residual adds). On a GPU a decode step is bound by launching them, not by running
them (docs/benchmarks.md, "Where a decode step's time goes on the GPU"). ``TritonPointwise``
offers the same four methods as the compiled CPU kernels (``torch.ops.pdserve_cpu``), so
the model takes either through ``LlamaForCausalLM.use_pointwise_kernels``; the engine checks
them against its torch layers first (``engine/models/pointwise_check.py``).

Each op rounds where HF's torch code rounds (to the activation dtype after the residual add,
after the normalisation, after each rotary product, after SiLU), computing in fp32 between.
Sums run in another order than torch's and fp32 products may fuse into FMAs, so results can
differ from the torch layers in the last bits.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

import torch
import triton
import triton.language as tl

from kernels._common import check_device, next_power_of_2


@triton.jit
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,  # [rows, dim]
    residual_ptr,  # [rows, dim]: x is added into it in place (HAS_RESIDUAL)
    weight_ptr,  # [dim]
    out_ptr,  # [rows, dim]
    stride_x,
    stride_residual,
    stride_out,
    dim,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,  # dim rounded up to a power of 2
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual_row = residual_ptr + row * stride_residual + cols
        r = tl.load(residual_row, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)  # the stream, in the dtype
        tl.store(residual_row, x, mask=mask)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, axis=0) / dim
    normed = (xf * tl.rsqrt(variance + eps)).to(x.dtype)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


@triton.jit
def _rotate(  # type: ignore[no-untyped-def]
    ptr,  # this head's first element
    c1,
    s1,
    c2,
    s2,
    d,
    half,
    mask,
):
    """HF's ``x * cos + rotate_half(x) * sin`` on one head, in place, rounding each product.
    The torch path casts the fp32 tables to the activation dtype before it multiplies."""
    x1 = tl.load(ptr + d, mask=mask, other=0.0)
    x2 = tl.load(ptr + half + d, mask=mask, other=0.0)
    dtype = x1.dtype
    c1, s1 = c1.to(dtype).to(tl.float32), s1.to(dtype).to(tl.float32)
    c2, s2 = c2.to(dtype).to(tl.float32), s2.to(dtype).to(tl.float32)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (x1f * c1).to(dtype).to(tl.float32) + (-x2f * s1).to(dtype).to(tl.float32)
    o2 = (x2f * c2).to(dtype).to(tl.float32) + (x1f * s2).to(dtype).to(tl.float32)
    tl.store(ptr + d, o1.to(dtype), mask=mask)
    tl.store(ptr + half + d, o2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(  # type: ignore[no-untyped-def]
    q_ptr,  # [tokens, q_heads, head_dim], any token/head strides
    k_ptr,  # [tokens, k_heads, head_dim]
    cos_ptr,  # [max_positions, head_dim] fp32
    sin_ptr,  # [max_positions, head_dim] fp32
    positions_ptr,  # [tokens] int64
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_table,
    num_k_heads,
    half,
    BLOCK_HALF: tl.constexpr,  # head_dim // 2 rounded up to a power of 2
):
    """Grid ``(tokens, q_heads)``: program ``(t, h)`` rotates q head ``h`` of token ``t`` and,
    when ``h < k_heads``, k head ``h`` (one launch for both)."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_HALF)
    mask = d < half
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    cos_row = cos_ptr + pos * stride_table
    sin_row = sin_ptr + pos * stride_table
    c1 = tl.load(cos_row + d, mask=mask, other=0.0)
    c2 = tl.load(cos_row + half + d, mask=mask, other=0.0)
    s1 = tl.load(sin_row + d, mask=mask, other=0.0)
    s2 = tl.load(sin_row + half + d, mask=mask, other=0.0)
    _rotate(q_ptr + tok * stride_q_tok + head * stride_q_head, c1, s1, c2, s2, d, half, mask)
    k_half = tl.where(head < num_k_heads, half, 0)  # past the k heads: nothing to rotate
    k_row = k_ptr + tok * stride_k_tok + head * stride_k_head
    _rotate(k_row, c1, s1, c2, s2, d, half, d < k_half)


@triton.jit
def _silu_mul_kernel(  # type: ignore[no-untyped-def]
    gate_up_ptr,  # [rows, 2 * inter]: gate then up
    out_ptr,  # [rows, inter]
    stride_in,
    stride_out,
    inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def _check_rows(x: torch.Tensor, name: str) -> None:
    assert x.dim() == 2 and x.stride(-1) == 1, f"{name} must be [rows, dim], rows contiguous"


def _norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    _check_rows(x, "x")
    assert weight.shape == (x.shape[1],) and weight.dtype == x.dtype and weight.is_contiguous()
    stream = x if residual is None else residual
    check_device(x, stream, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x,
            stream,
            weight,
            out,
            x.stride(0),
            stream.stride(0),
            out.stride(0),
            x.shape[1],
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=next_power_of_2(x.shape[1]),
        )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm of each row of ``x`` ``[rows, dim]`` into a new tensor."""
    return _norm(x, None, weight, eps)


def add_rms_norm(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``residual += x`` in place, then return RMSNorm of the sum (a new tensor)."""
    _check_rows(residual, "residual")
    assert residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x"
    return _norm(x, residual, weight, eps)


def rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """Rotate ``q`` ``[tokens, q_heads, dim]`` and ``k`` ``[tokens, k_heads, dim]`` in place at
    ``positions`` ``[tokens]`` (int64), reading the fp32 tables ``cos``/``sin``
    ``[max_positions, dim]``. Every position must be inside the tables (the engine's
    ``max_model_len`` is at most the model's ``max_position_embeddings``, their length)."""
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] == positions.shape[0]
    assert q.shape[2] == k.shape[2] == cos.shape[1] and q.shape[2] % 2 == 0
    assert k.shape[1] <= q.shape[1], "more k heads than q heads"
    assert q.dtype == k.dtype and q.stride(-1) == 1 and k.stride(-1) == 1
    assert cos.shape == sin.shape and cos.dtype == sin.dtype == torch.float32
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert positions.dtype == torch.int64
    check_device(q, k, cos, sin, positions)
    if q.shape[0] == 0:
        return
    half = q.shape[2] // 2
    _rotary_kernel[(q.shape[0], q.shape[1])](
        q,
        k,
        cos,
        sin,
        positions,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        k.shape[1],
        half,
        BLOCK_HALF=next_power_of_2(half),
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[rows, 2 * inter]`` (gate first), as
    ``[rows, inter]``."""
    _check_rows(gate_up, "gate_up")
    assert gate_up.shape[1] % 2 == 0, "gate_up must be [rows, 2 * inter]"
    check_device(gate_up)
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, next_power_of_2(inter))
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block
        )
    return out


class TritonPointwise:
    """The compiled CPU kernels' elementwise interface (``rms_norm``, ``add_rms_norm``,
    ``rotary_``, ``silu_mul``), on Triton: what ``LlamaForCausalLM.use_pointwise_kernels``
    takes on a GPU."""

    rms_norm = staticmethod(rms_norm)
    add_rms_norm = staticmethod(add_rms_norm)
    rotary_ = staticmethod(rotary_)
    silu_mul = staticmethod(silu_mul)

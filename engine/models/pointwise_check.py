"""Fused elementwise kernels checked against the torch layers they replace, once, at start-up.

The model runner calls ``check_pointwise`` before it gives the model GPU kernels
(``kernels.pointwise.TritonPointwise``) and keeps the torch ops when it returns a problem: a
kernel that does not compile or launch on this device, or that disagrees with the layers'
own torch arithmetic (``RMSNorm``, ``apply_rotary``, ``LlamaMLP``'s SiLU·mul) at the model's
shapes. It also compiles each kernel for those shapes before the first step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.models.layers import RMSNorm, apply_rotary

# Beyond the kernels' own last-bit differences (sums in another order, fused multiply-adds).
_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _problem(name: str, got: torch.Tensor, expected: torch.Tensor, tol: float) -> str | None:
    if torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol):
        return None
    diff = (got.float() - expected.float()).abs().max().item()
    return f"{name} differs from torch by up to {diff:.3g}"


def check_pointwise(
    kernels: Any,
    device: torch.device,
    dtype: torch.dtype,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
) -> str | None:
    """Run each of ``kernels``' four ops once at these shapes against the torch layers: None
    when all agree, else what failed or differs."""
    tol = _TOLERANCE.get(dtype, 3e-2)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    try:
        norm = RMSNorm(hidden, 1e-5).to(device=device, dtype=dtype)  # kernels None: torch
        norm.weight.data = rand(hidden)
        x, residual = rand(3, hidden), rand(3, hidden)
        expected, stream = norm.add_forward(x, residual)
        problems = [
            _problem(
                "add_rms_norm", kernels.add_rms_norm(residual, x, norm.weight, 1e-5), expected, tol
            ),
            _problem("add_rms_norm's residual", residual, stream, tol),
            _problem("rms_norm", kernels.rms_norm(stream, norm.weight, 1e-5), norm(stream), tol),
        ]
        gate_up = rand(3, 2 * inter)
        gate, up = gate_up.split(inter, dim=-1)
        problems.append(_problem("silu_mul", kernels.silu_mul(gate_up), F.silu(gate) * up, tol))
        q, k = rand(3, heads, head_dim), rand(3, kv_heads, head_dim)
        cos = torch.rand(8, head_dim, generator=gen).to(device)
        sin = torch.rand(8, head_dim, generator=gen).to(device)
        positions = torch.tensor([0, 5, 7], device=device)
        c, s = cos[positions].to(dtype)[:, None, :], sin[positions].to(dtype)[:, None, :]
        expected_q, expected_k = apply_rotary(q, c, s), apply_rotary(k, c, s)
        kernels.rotary_(q, k, cos, sin, positions)
        problems += [
            _problem("rotary q", q, expected_q, tol),
            _problem("rotary k", k, expected_k, tol),
        ]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a kernel that does not compile or launch here
        return f"{type(e).__name__}: {e}"
    found = [p for p in problems if p is not None]
    return "; ".join(found) if found else None

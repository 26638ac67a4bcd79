"""Building blocks shared by the Llama-family models, numerically matching HF's definitions.

Each block has a plain-torch forward and, once ``kernels`` is set, a fused one that does the
same arithmetic in one pass: RMSNorm with the residual add before it, rotary in place on q and
k, SiLU·mul. ``kernels`` is ``torch.ops.pdserve_cpu`` on a CPU
(``LlamaForCausalLM.use_cpu_kernels``, which also runs float32 linear layers on weights packed
once: ``PackedLinear``) or ``kernels.pointwise.TritonPointwise`` on a GPU
(``use_pointwise_kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: normalise in fp32, scale in the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernels: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dim() == 2:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(variance + self.eps)
        return self.weight * xf.to(dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``; the kernel adds into ``residual`` in place."""
        if self.kernels is not None:
            return self.kernels.add_rms_norm(residual, x, self.weight, self.eps), residual
        residual = residual + x
        return self.forward(residual), residual


class PackedLinear(nn.Module):
    """A float32 ``nn.Linear`` whose weight is packed once into the compiled GEMM's panels."""

    def __init__(self, linear: nn.Linear, kernels: Any, packed: torch.Tensor | None = None) -> None:
        """``packed``: the weight already packed (``engine.packed_weights``); packed here
        into its own allocation when None."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.kernels = kernels
        self.packed: torch.Tensor
        if packed is None:
            packed = kernels.pack_linear_weight(linear.weight.detach())
        self.register_buffer("packed", packed)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = self.kernels.linear(rows, self.packed, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


class PackedGateUpSiLU(PackedLinear):
    """The MLP's bias-free gate_up projection packed, with SiLU·mul as the GEMM's epilogue
    (``linear_silu_mul``): ``forward`` returns ``silu(gate) * up``, ``[..., out_features // 2]``,
    the same bits as the GEMM then ``silu_mul``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inter = self.out_features // 2
        rows = x.reshape(-1, self.in_features)
        return self.kernels.linear_silu_mul(rows, self.packed, inter).view(*x.shape[:-1], inter)


@dataclass(frozen=True)
class StepRotary:
    """One step's rotary embedding, applied to q and k in every layer.

    Torch path (``kernels`` None): ``cos``/``sin`` are the step's rows, ``[tokens, 1, dim]`` in
    the activation dtype. Kernel path: the whole fp32 tables ``[max_positions, dim]``, read per
    token through ``positions``.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor  # [tokens] int64
    kernels: Any = None

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated ``q`` ``[tokens, heads, dim]`` and ``k``; in place on the kernel path."""
        if self.kernels is not None:
            self.kernels.rotary_(q, k, self.cos, self.sin, self.positions)
            return q, k
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with a precomputed cos/sin table indexed by position."""

    def __init__(self, inv_freq: tuple[float, ...], max_positions: int, scaling: float) -> None:
        super().__init__()
        inv = torch.tensor(inv_freq, dtype=torch.float32)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def lookup(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``[num_tokens, 1, head_dim]``, computed once per step."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]

    def for_step(self, positions: torch.Tensor, dtype: torch.dtype, kernels: Any) -> StepRotary:
        """The step's rotary; with ``kernels`` the tables are read per token. On a CPU the
        positions are checked against the tables here; on a GPU that check would cost a device
        sync a step, and the engine's ``max_model_len`` (at most the tables' length) bounds
        them already."""
        if kernels is None:
            cos, sin = self.lookup(positions, dtype)
            return StepRotary(cos, sin, positions)
        if positions.device.type == "cpu" and positions.numel():
            if int(positions.max()) >= self.cos.shape[0]:
                raise IndexError(f"position past the rotary table ({self.cos.shape[0]} positions)")
        return StepRotary(self.cos, self.sin, positions, kernels)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x``: ``[num_tokens, num_heads, head_dim]`` (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

"""Choose the attention backend: by device unless named explicitly."""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionBackend

BACKENDS = ("torch", "triton")


def get_attention_backend(device: torch.device, name: str | None = None) -> AttentionBackend:
    """``torch`` on CPU, ``triton`` on CUDA; ``name`` overrides (raises ValueError if unknown)."""
    if name is None:
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be one of {', '.join(BACKENDS)}; got {name!r}")

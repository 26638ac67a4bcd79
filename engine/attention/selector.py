"""Choose the attention backend: by device unless named explicitly."""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionBackend

BACKENDS = ("cpu", "torch", "triton")


def get_attention_backend(device: torch.device, name: str | None = None) -> AttentionBackend:
    """On CUDA ``triton``; on CPU ``cpu`` (the compiled kernels of ``kernels/cpu``) when they
    build here, else ``torch`` (``kernels.cpu.load`` has logged why). ``name`` overrides; an
    unknown name, or ``cpu`` when the kernels are unavailable, raises ValueError."""
    if name is None:
        if device.type == "cuda":
            name = "triton"
        else:
            from kernels.cpu import load

            name = "cpu" if load() is not None else "torch"
    if name == "cpu":
        from engine.attention.cpu_backend import CpuAttentionBackend
        from kernels.cpu import load

        ops = load()
        if ops is None or device.type != "cpu":
            raise ValueError(
                "attention_backend 'cpu' needs a CPU device and the compiled CPU kernels "
                "(a C++ compiler, and PDSERVE_CPU_KERNELS not 0)"
            )
        return CpuAttentionBackend(ops)
    if name == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be one of {', '.join(BACKENDS)}; got {name!r}")

"""Helpers shared by the kernel wrappers: device checks and tile-size arithmetic."""

from __future__ import annotations

import torch


def interpreter_active() -> bool:
    """True when Triton runs kernels in its interpreter in this process.

    Triton 3.9 reads ``TRITON_INTERPRET`` in ``triton.jit``; its own ``@jit`` standard library
    (``tl.zeros``, ``tl.sum``, ``tl.cdiv``, ...) is decorated when ``triton`` is first imported,
    so the interpreter works only if the variable was set before that import. Checked here by
    looking for compiled-mode ``JITFunction`` objects in ``triton.language.standard``.
    """
    import triton.language.standard as standard
    from triton.runtime.jit import JITFunction

    return not any(isinstance(value, JITFunction) for value in vars(standard).values())


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors of a launch share one device: CUDA, or CPU with the interpreter active."""
    device = tensors[0].device
    for t in tensors[1:]:
        assert t.device == device, f"tensors on {device} and {t.device} in one kernel launch"
    if device.type != "cuda" and not interpreter_active():
        raise RuntimeError(
            f"Triton kernels need CUDA tensors (got {device}); to run them on CPU set "
            "TRITON_INTERPRET=1 before triton is first imported in the process"
        )


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())

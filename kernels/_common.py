"""``lazy_jit``: a ``triton.jit`` that decides between compiling and interpreting at first launch.

Triton reads ``TRITON_INTERPRET`` inside ``triton.jit`` itself (``knobs.runtime.interpret``, an
environment read on every access in triton 3.9), so a kernel decorated at import time is fixed
to whatever the variable said when its module was first imported. A test directory's conftest
cannot guarantee it runs before some other module imports ``kernels`` (pytest collects folders
in order, xdist workers each collect on their own). Deferring the decoration to the first launch
makes the variable count when a kernel first *runs*, which is always after every conftest has
been loaded. One compiled/interpreted object is kept per mode, so flipping the variable later
also works.

Kernels decorated with ``lazy_jit`` must not call other ``@triton.jit`` helpers (a helper would
be fixed at import time); each kernel here is self-contained.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def interpret_enabled() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET`` is true)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


class LazyKernel:
    """Wraps a kernel function; ``kernel[grid](...)`` launches it like a ``triton.jit`` object."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self._by_mode: dict[bool, Any] = {}

    def get(self) -> Any:
        """The ``triton.jit`` object for the current mode (decorated on first use)."""
        mode = interpret_enabled()
        kernel = self._by_mode.get(mode)
        if kernel is None:
            import triton

            kernel = triton.jit(self.fn)
            self._by_mode[mode] = kernel
        return kernel

    def __getitem__(self, grid: Any) -> Any:
        return self.get()[grid]


def lazy_jit(fn: Callable[..., None]) -> LazyKernel:
    """Decorator: like ``@triton.jit`` but decorated at first launch (see module docstring)."""
    return LazyKernel(fn)


def check_device(*tensors: Any) -> None:
    """Raise a clear error for a launch on non-CUDA tensors outside the interpreter."""
    if interpret_enabled():
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise RuntimeError(
                f"Triton kernels need CUDA tensors (got a tensor on {t.device}); to run them on "
                "CPU set TRITON_INTERPRET=1 before the first kernel launch"
            )


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())

"""Triton kernels for the paged KV cache: KV store, paged attention (decode and chunked
prefill), block copy; plain-torch references in ``kernels.reference``. See docs/kernels.md.

On a host without CUDA, Triton can only run kernels in its interpreter, and the interpreter
works only if ``TRITON_INTERPRET=1`` is set before ``triton`` is first imported (triton 3.9
decorates its own ``@jit`` standard library at import). So when this package is the first to
import triton on such a host and the variable is unset, it sets it here, before any kernel
module imports triton.
"""

import os
import sys

import torch

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ:
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

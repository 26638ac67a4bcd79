"""Kernel tests: Triton's interpreter on CPU tensors (compiled on a GPU when asked explicitly).

How triton 3.9 reads ``TRITON_INTERPRET``: ``triton.jit`` checks ``knobs.runtime.interpret`` (an
environment read on each access) when it decorates a function, and triton's own ``@jit``
standard library (``tl.zeros``, ``tl.sum``, ``tl.cdiv``, ...) is decorated when ``triton`` is
first imported. So the variable must be set before the first ``import triton`` in the process;
setting it later gives interpreted kernels calling compiled helpers, which fails.

This module sets it at import, before importing torch or triton (neither has been imported
by it yet). pytest imports it during collection, before any test runs, and every pytest-xdist
worker is a fresh process that imports it again. What it cannot control is a test module of
another folder, collected earlier, importing triton first (``import transformers`` does, for
one): for that, ``kernels/__init__.py`` sets the same default itself on hosts without CUDA
when it is the first to import triton, and the ``device`` fixture below checks which mode
triton actually started in and says what to do if it is the wrong one. (A root
``tests/conftest.py`` setting the variable would make this moot.) ``TRITON_INTERPRET=0`` on a
machine with CUDA runs the same tests compiled, on the GPU.
"""

import os

if os.environ.get("TRITON_INTERPRET", "").strip() != "0":
    os.environ["TRITON_INTERPRET"] = "1"  # before torch, triton or kernels are imported from here

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # "0" asks for the GPU; without one, interpret anyway

from kernels._common import interpreter_active


@pytest.fixture
def device() -> torch.device:
    """Where test tensors live: CPU under the interpreter, else the GPU."""
    if interpreter_active():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.fail(
        "triton was imported in compiled mode before tests/kernels/conftest.py set "
        "TRITON_INTERPRET=1 (another test module imported it first) and there is no GPU: "
        "run with TRITON_INTERPRET=1 in the environment"
    )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# Elements between blocks: fits in int32, but block 2 starts at 2^31, past int32's range, so
# only offsets computed in int64 reach it.
HUGE_BLOCK_STRIDE = 2**30


@pytest.fixture
def huge_pool(device: torch.device) -> torch.Tensor:
    """A 3-block fp16 pool ``[3, 1 layer, 2, 16, 2 heads, 32]`` whose block 2 sits 2^31 elements in.

    The storage is 4 GiB of address space from ``torch.empty``, but only the two blocks are
    ever written, so on CPU the test costs a few pages of memory, not gigabytes.
    """
    block_shape = (1, 2, 16, 2, 32)
    block_numel = 1 * 2 * 16 * 2 * 32
    storage = torch.empty(2 * HUGE_BLOCK_STRIDE + block_numel, dtype=torch.float16, device=device)
    strides = (HUGE_BLOCK_STRIDE, *torch.empty(block_shape).stride())
    pool = storage.as_strided((3, *block_shape), strides)
    pool.zero_()
    return pool

"""Kernel tests: Triton's interpreter on CPU tensors (or a GPU when asked for explicitly).

triton 3.9 reads ``TRITON_INTERPRET`` (``triton.knobs.runtime.interpret``, an environment read on
each access) inside ``triton.jit``. The kernels in ``kernels/`` are decorated at their first
launch, not at import (``kernels/_jit.py``), so setting the variable here is enough in every
case: this module is imported during collection, before any test runs in this process; every
pytest-xdist worker imports it itself; and it does not matter whether some other test module
imported ``kernels`` or ``triton`` first. It is set before ``triton`` or ``torch`` is imported
from here, so a launch from a kernel decorated with plain ``@triton.jit`` would be covered as
well when this conftest loads first.

``TRITON_INTERPRET=0`` on a machine with CUDA runs the same tests compiled, on the GPU.
"""

import os

if os.environ.get("TRITON_INTERPRET", "").strip() != "0":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    """Where test tensors live: CPU under the interpreter, else the GPU."""
    if os.environ["TRITON_INTERPRET"] == "1":
        return torch.device("cpu")
    return torch.device("cuda")


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

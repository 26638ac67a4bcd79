"""A byte view of a KV pool: block ``b`` is one contiguous writable span of the pool's memory.

Accepts the engine's ``kv_pool`` tensor (CPU, contiguous, shape ``spec.pool_shape(n)``) or a
numpy array of that shape; keeps a reference so the memory outlives every view handed out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.kv_cache_spec import KVCacheSpec

_NUMPY_DTYPES = {"float32": "float32", "float16": "float16"}


class PoolBuffer:
    """Byte-level access to the blocks of one KV pool."""

    def __init__(self, spec: KVCacheSpec, pool: Any) -> None:
        self.spec = spec
        self.bytes_per_block = spec.bytes_per_block
        self._owner = pool
        array = _as_uint8_array(spec, pool)
        self.num_blocks = int(array.shape[0])
        self.array = array.reshape(self.num_blocks, self.bytes_per_block)
        self._view = self.array.reshape(-1).data

    def span(self, first_block: int, num_blocks: int = 1) -> memoryview:
        """Writable bytes of blocks ``[first_block, first_block + num_blocks)``."""
        if first_block < 0 or num_blocks < 0 or first_block + num_blocks > self.num_blocks:
            raise IndexError(f"blocks [{first_block}, +{num_blocks}) outside {self.num_blocks}")
        start = first_block * self.bytes_per_block
        return self._view[start : start + num_blocks * self.bytes_per_block]

    def numpy_span(self, first_block: int, num_blocks: int = 1) -> np.ndarray:
        """The same bytes as ``span``, as a uint8 numpy array (what UCX send/recv take)."""
        if first_block < 0 or num_blocks < 0 or first_block + num_blocks > self.num_blocks:
            raise IndexError(f"blocks [{first_block}, +{num_blocks}) outside {self.num_blocks}")
        return self.array[first_block : first_block + num_blocks].reshape(-1)


def _as_uint8_array(spec: KVCacheSpec, pool: Any) -> np.ndarray:
    if isinstance(pool, np.ndarray):
        array = pool
        expected_dtype = _NUMPY_DTYPES.get(spec.dtype)
        if expected_dtype is not None and array.dtype != np.dtype(expected_dtype):
            raise ValueError(f"pool dtype {array.dtype} does not match spec dtype {spec.dtype}")
    else:
        import torch

        if not isinstance(pool, torch.Tensor):
            raise TypeError(f"pool must be a torch.Tensor or numpy array, got {type(pool)}")
        if pool.device.type != "cpu":
            raise ValueError(f"pool must be in host memory, got device {pool.device}")
        if str(pool.dtype).removeprefix("torch.") != spec.dtype:
            raise ValueError(f"pool dtype {pool.dtype} does not match spec dtype {spec.dtype}")
        if not pool.is_contiguous():
            raise ValueError("pool must be contiguous")
        array = pool.detach().view(torch.uint8).numpy()
    if array.ndim != 6 or tuple(array.shape[1:-1]) != spec.pool_shape(1)[1:-1]:
        raise ValueError(
            f"pool shape {tuple(array.shape)} is not {spec.pool_shape(array.shape[0])}"
        )
    if not array.flags["C_CONTIGUOUS"]:
        raise ValueError("pool must be contiguous")
    flat = array.reshape(array.shape[0], -1).view(np.uint8)
    if flat.shape[1] != spec.bytes_per_block:
        raise ValueError(f"pool block has {flat.shape[1]} bytes, spec says {spec.bytes_per_block}")
    if not flat.flags["WRITEABLE"]:
        raise ValueError("pool must be writable")
    return flat

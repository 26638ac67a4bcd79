"""Triton kernels for the paged KV cache: store, paged attention (decode and chunked prefill),
block copy. Each module holds one kernel and one wrapper that checks shapes, dtypes and strides;
see docs/kernels.md. Kernels are decorated at first launch (``kernels._jit``), so
``TRITON_INTERPRET=1`` set any time before the first launch runs them on CPU tensors.
"""

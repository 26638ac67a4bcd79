"""The sections of ``benchmarks/kernels.py``: one module per kernel family, shared helpers."""

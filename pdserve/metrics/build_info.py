"""``pdserve_build_info``: what each process runs, as labels on a constant 1 (Prometheus's
``*_build_info`` convention), so a dashboard shows which pods run which version during a
rollout, and which engines fell back from the compiled CPU kernels to the torch path.

Every process: ``version`` (pdserve) and ``python``. A process with an engine (workers, the
colocated router) adds ``engine_labels``: ``attention_backend`` (``cpu`` = the compiled
kernels, ``torch``, ``triton``), ``device`` and ``torch``. Torch-free: a router imports it.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Info

import pdserve

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine


def engine_labels(engine: AsyncEngine) -> dict[str, str]:
    """The build labels of a process running ``engine``."""
    import torch

    inner: Any = engine.engine
    return {
        "attention_backend": str(inner.backend.name),
        "device": str(inner.device.type),
        "torch": str(torch.__version__),
    }


class BuildInfo:
    """The process's ``pdserve_build_info`` series in ``registry``."""

    def __init__(self, registry: CollectorRegistry, role: str, model: str) -> None:
        info = Info(
            "pdserve_build",
            "What this process runs (always 1): pdserve and Python versions; with an engine, "
            "its attention backend (cpu = the compiled kernels), device and torch version.",
            ["role", "model"],
            registry=registry,
        )
        self._series = info.labels(role=role, model=model)
        self._labels = {"version": pdserve.__version__, "python": platform.python_version()}
        self._series.info(self._labels)

    def add(self, labels: dict[str, str]) -> None:
        """More labels, e.g. ``engine_labels`` of the process's engine."""
        self._labels = {**self._labels, **labels}
        self._series.info(self._labels)

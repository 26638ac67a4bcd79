"""pdserve: LLM serving with disaggregated prefill and decode.

from pdserve import LLM, SamplingParams
llm = LLM()  # the built-in demo model; or LLM(model="/path/to/hf-folder")
print(llm.generate("Hello", SamplingParams(max_tokens=8))[0].text)

The names below load on first use: ``import pdserve.wire`` (or the router, which has no
model) never imports torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spin-waiting. On a shared host
# (CI, a Kubernetes node, two workers on two cores) spinning threads lose their core at every
# parallel region's end; docs/benchmarks.md measured a 7x slower run with the default policy
# under load. An explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if TYPE_CHECKING:
    from engine.engine_config import EngineConfig
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams
    from pdserve.llm import LLM

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

_LAZY = {
    "LLM": "pdserve.llm",
    "EngineConfig": "engine.engine_config",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pdserve' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

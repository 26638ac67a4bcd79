"""pdserve: LLM serving with disaggregated prefill and decode.

from pdserve import LLM, SamplingParams
llm = LLM()  # the built-in demo model; or LLM(model="/path/to/hf-folder")
print(llm.generate("Hello", SamplingParams(max_tokens=8))[0].text)
"""

import os

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spin-waiting. On a shared host
# (CI, a Kubernetes node, two workers on two cores) spinning threads lose their core at every
# parallel region's end; docs/benchmarks.md measured a 7x slower run with the default policy
# under load. An explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.engine_config import EngineConfig
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams
    from pdserve.llm import LLM

# Loaded on first use, so tools that import no model (pdserve.plan, pdserve.bench) never load
# torch through this package.
_LAZY = {
    "LLM": "pdserve.llm",
    "EngineConfig": "engine.engine_config",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pdserve' has no attribute {name!r}")


__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

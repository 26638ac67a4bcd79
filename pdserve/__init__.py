"""pdserve: LLM serving with disaggregated prefill and decode.

from pdserve import LLM, SamplingParams
llm = LLM()  # the built-in demo model; or LLM(model="/path/to/hf-folder")
print(llm.generate("Hello", SamplingParams(max_tokens=8))[0].text)
"""

from engine.engine_config import EngineConfig
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from pdserve.llm import LLM

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

"""An engine's start imports nothing it does not use: torch._dynamo and inductor (what
``llguidance.torch``'s ``@torch.compile`` decorator pulls in, ~2.7 s of every engine process's
start on the 2-core VM) stay out of a process that built an engine and ran a grammar-constrained
request. A fresh interpreter, since the test process has imported everything already."""

from __future__ import annotations

import json
from typing import Any

from tests.child_python import run_python
from tests.conftest import TINY_ARCHS

CHILD = """
import json, sys
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutput
engine = LLMEngine(EngineConfig(model=sys.argv[1], dtype="float32", device="cpu"))
regex = StructuredOutput("regex", "[ab]+")
params = SamplingParams(temperature=0.0, max_tokens=6, structured=regex)
engine.add_request("r", prompt_token_ids=list(range(5, 20)), sampling_params=params)
out = None
while engine.has_unfinished_requests():
    for o in engine.step():
        out = o
heavy = [m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules]
print("RESULT " + json.dumps({"heavy": heavy, "text": out.text}))
"""


def test_an_engine_with_a_grammar_imports_no_compiler(model_factory: Any) -> None:
    folder = model_factory("llama", **TINY_ARCHS["llama"])
    done = run_python(CHILD, str(folder), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["heavy"] == [], result
    assert result["text"] and set(result["text"]) <= {"a", "b"}, result  # the mask applied

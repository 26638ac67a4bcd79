"""decoder_layer's phase timers (kernels/cpu/phase_timers.h): off unless
PDSERVE_CPU_PHASE_TIMERS=1 (read once per process, hence the subprocesses), and then every
phase of a fused layer is charged and ``phase_times(reset=True)`` starts them over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_ARCHS
from tests.kernels.cpu_ops import cpu_ops

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
import torch
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels.cpu import load
engine = LLMEngine(EngineConfig(model=sys.argv[1], dtype="float32", device="cpu"))
assert engine.runner.model.fused_layers
ops = load()
ops.phase_times(True)
engine.add_request("a", prompt_token_ids=list(range(5, 40)),
                   sampling_params=SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
names, seconds = ops.phase_times(True)
after_reset = ops.phase_times(False)[1]
print("RESULT " + json.dumps({"names": names, "seconds": seconds, "after_reset": after_reset}))
"""


def run_child(folder: Path, timers: str | None) -> dict[str, list]:  # type: ignore[type-arg]
    env = {k: v for k, v in os.environ.items() if k != "PDSERVE_CPU_PHASE_TIMERS"}
    env["PYTHONPATH"] = str(ROOT)
    if timers is not None:
        env["PDSERVE_CPU_PHASE_TIMERS"] = timers
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


PHASES = ["norms", "qkv", "rotary", "store_kv", "attention", "o", "gate_up", "down"]


def test_every_phase_is_charged_when_on_and_reset_clears(model_factory) -> None:  # type: ignore[no-untyped-def]
    cpu_ops()
    result = run_child(model_factory("llama", **TINY_ARCHS["llama"]), "1")
    assert result["names"] == PHASES
    assert all(s > 0 for s in result["seconds"]), result
    assert result["after_reset"] == [0.0] * len(PHASES)


@pytest.mark.parametrize("value", [None, "0"])
def test_off_by_default(model_factory, value: str | None) -> None:  # type: ignore[no-untyped-def]
    cpu_ops()
    result = run_child(model_factory("llama", **TINY_ARCHS["llama"]), value)
    assert result["seconds"] == [0.0] * len(PHASES)

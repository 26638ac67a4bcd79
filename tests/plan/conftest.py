"""Shared helpers of the planner tests: a small hand-written profile and config builders."""

from __future__ import annotations

from typing import Any

import pytest

from pdserve.plan.cost_model import StepCost, SwapCost, TransferCost
from pdserve.plan.profile_format import Device, KvCapacity, ModelInfo, Overhead, Profile


def make_profile(num_blocks: int = 1456, num_host_blocks: int = 728) -> Profile:
    """Round figures of the order this machine measures (1 core, 135M shape)."""
    return Profile(
        name="test-cpu",
        step=StepCost(
            base_s=0.045,
            per_token_s=0.0025,
            per_seq_s=0.002,
            per_sampled_s=0.001,
            per_context_token_s=2e-6,
            per_attention_pair_s=1e-7,
        ),
        transfer={"tcp": TransferCost(latency_s=0.002, bytes_per_s=1.5e9)},
        swap=SwapCost(latency_s=0.0005, per_block_s=0.0001),
        device=Device("cpu", 1),
        model=ModelInfo("test", 16, 46080),
        kv=KvCapacity(num_blocks, num_host_blocks),
        overhead=Overhead(dispatch_s=0.002, stream_s=0.001),
    )


@pytest.fixture
def profile() -> Profile:
    return make_profile()


def config_dict(**tables: dict[str, Any]) -> dict[str, Any]:
    """A simulation config: a 1P1D cluster of the test profile plus ``tables`` on top."""
    d: dict[str, Any] = {
        "cluster": {"profile": "test-cpu"},
        "workload": {
            "num_requests": 24,
            "prompt_len": "uniform:32:512",
            "output_len": "uniform:16:128",
        },
        "load": {"kind": "closed", "concurrency": [4]},
    }
    for name, values in tables.items():
        d.setdefault(name, {}).update(values)
    return d

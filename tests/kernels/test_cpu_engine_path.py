"""Which path the engine takes on CPU, and that both are exact against Hugging Face.

The HF-exactness suite (tests/engine/test_hf_exactness.py) runs on the default path, the
compiled kernels; here the plain-torch path (what a machine without a compiler gets) is held to
the same oracle, and the default path is checked to really be the kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import kernels.cpu
from engine.models.layers import PackedLinear
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, greedy, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import check_against_hf, make_engine, submit
from tests.kernels.cpu_ops import cpu_ops


def test_default_cpu_path_is_the_compiled_kernels(tiny_model: Path) -> None:
    cpu_ops()
    engine = make_engine(tiny_model)
    assert engine.backend.name == "cpu"
    model = engine.runner.model
    assert model.kernels is not None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear | PackedLinear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)  # fp32: all packed


def test_half_precision_keeps_torch_linears(model_factory) -> None:  # type: ignore[no-untyped-def]
    cpu_ops()
    folder = model_factory("llama", **TINY_ARCHS["llama"])
    engine = make_engine(folder, dtype="bfloat16")
    model = engine.runner.model
    assert engine.backend.name == "cpu" and model.kernels is not None
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    engine.add_request("a", prompt_token_ids=[5, 6, 7, 8], sampling_params=greedy(6))
    outs = run_to_completion(engine)
    assert len(outs["a"].token_ids) == 6
    assert_pool_free(engine)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_torch_path_matches_hf(model_factory, monkeypatch, arch: str) -> None:  # type: ignore[no-untyped-def]
    """No compiled kernels (as without a compiler): torch attention and torch layers, exact."""
    monkeypatch.setattr(kernels.cpu, "load", lambda: None)
    folder = model_factory(arch, **TINY_ARCHS[arch])
    engine = make_engine(folder, max_num_batched_tokens=16)
    assert engine.backend.name == "torch" and engine.runner.model.kernels is None
    prompts = random_prompts(4, engine.model_config.vocab_size, 10, 40, seed=21)
    lengths = [30, 12, 25, 8]
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(folder, prompts, lengths, outs)
    assert_pool_free(engine)


def test_cpu_backend_needs_the_kernels(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from engine.attention.selector import get_attention_backend

    monkeypatch.setattr(kernels.cpu, "load", lambda: None)
    with pytest.raises(ValueError, match="compiled CPU kernels"):
        get_attention_backend(torch.device("cpu"), "cpu")

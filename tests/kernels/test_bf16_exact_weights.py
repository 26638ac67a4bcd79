"""Weights that bf16 holds exactly (a bf16 checkpoint loaded in float32) are packed as bf16
panels: half the bytes, and the same bits as their float32 panels, so still HF-exact
(engine/packed_weights.py, kernels/cpu/gemm.cpp)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine.models.layers import PackedLinear
from engine.packed_weights import BF16_WEIGHTS_ENV, bf16_exact, empty_packed_weights, pack_into
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.engine.test_hf_exactness import assert_greedy_matches_hf
from tests.kernels.cpu_ops import cpu_ops
from tests.kernels.test_cpu_engine_path import make_engine


def bf16_valued(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).bfloat16().float()


@pytest.mark.parametrize("k", [30, 576, 1536])  # 1536: two K blocks
@pytest.mark.parametrize("n", [13, 64, 960])  # 13: one ragged panel
@pytest.mark.parametrize("m", [1, 5, 12, 13, 18, 24, 25, 200, 400])
def test_bf16_panels_give_the_float32_panels_bits(m: int, n: int, k: int) -> None:
    ops = cpu_ops()
    w, x, bias = bf16_valued(n, k, seed=m), torch.randn(m, k), torch.randn(n)
    p32, p16 = ops.pack_linear_weight(w), ops.pack_linear_weight(w, True)
    assert p16.dtype == torch.bfloat16 and p16.shape == p32.shape
    assert p16.numel() * p16.element_size() * 2 == p32.numel() * p32.element_size()
    for b in (None, bias):
        want = ops.linear(x, p32, n, b)
        assert torch.equal(ops.linear(x, p16, n, b), want)
    torch.testing.assert_close(want, torch.nn.functional.linear(x, w, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 18, 30, 300])
def test_bf16_gate_up_with_its_silu_epilogue(m: int) -> None:
    ops = cpu_ops()
    inter, k = 256, 96
    w, x = bf16_valued(2 * inter, k, seed=7), torch.randn(m, k)
    got = ops.linear_silu_mul(x, ops.pack_linear_weight(w, True), inter)
    assert torch.equal(got, ops.linear_silu_mul(x, ops.pack_linear_weight(w), inter))


def test_a_weight_bf16_does_not_hold_is_refused_and_not_chosen() -> None:
    ops = cpu_ops()
    w = bf16_valued(64, 30)
    assert bf16_exact(w)
    w[3, 17] = float(torch.tensor(w[3, 17].item()).nextafter(torch.tensor(9.0)))  # one ulp
    assert not bf16_exact(w)
    with pytest.raises(RuntimeError, match="bf16 holds exactly"):
        ops.pack_linear_weight(w, True)
    assert not bf16_exact(w.bfloat16())  # only float32 weights are packed


def test_mixed_views_lie_back_to_back_in_one_buffer() -> None:
    ops = cpu_ops()
    weights = [bf16_valued(576, 960), torch.randn(100, 37), bf16_valued(1536, 576, seed=2)]
    bf16 = [bf16_exact(w) for w in weights]
    assert bf16 == [True, False, True]
    views = empty_packed_weights([tuple(w.shape) for w in weights], ops, bf16)  # type: ignore[misc]
    packed = [pack_into(v, w, ops) for v, w in zip(views, weights, strict=True)]
    assert [p.dtype for p in packed] == [torch.bfloat16, torch.float32, torch.bfloat16]
    base = packed[0].untyped_storage().data_ptr()
    for p, w, b in zip(packed, weights, bf16, strict=True):
        assert p.untyped_storage().data_ptr() == base and p.data_ptr() % 64 == 0
        assert torch.equal(p, ops.pack_linear_weight(w, b))
    ends = [-(-(p.data_ptr() + p.numel() * p.element_size()) // 64) * 64 for p in packed[:-1]]
    assert ends == [p.data_ptr() for p in packed[1:]]


def bf16_checkpoint(model_factory: Any, arch: str) -> Path:
    return model_factory(  # type: ignore[no-any-return]
        f"{arch}-bf16-checkpoint", **TINY_ARCHS[arch], checkpoint_dtype="bfloat16"
    )


def packed_dtypes(engine: Any) -> set[torch.dtype]:
    model = engine.runner.model
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    return {m.packed.dtype for m in model.modules() if isinstance(m, PackedLinear)}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_bf16_checkpoint_in_float32_runs_on_bf16_panels_and_matches_hf(
    model_factory: Any, arch: str
) -> None:
    """Every linear (q/k/v with Qwen2's biases, the untied lm_head) packed as bf16, and greedy
    tokens still HF's (HF loads the same checkpoint in float32) through batching, chunked
    prefill and preemption by swap."""
    cpu_ops()
    folder = bf16_checkpoint(model_factory, arch)
    engine = make_engine(
        folder,
        num_kv_blocks=24,
        num_host_blocks=64,
        preemption_mode="swap",
        max_num_batched_tokens=48,
    )
    assert packed_dtypes(engine) == {torch.bfloat16}
    prompts = random_prompts(8, engine.model_config.vocab_size, 20, 50, seed=11)
    assert_greedy_matches_hf(engine, folder, prompts, [40] * 8)
    assert engine.scheduler.stats.num_preemptions_swap > 0  # 24 blocks cannot hold all 8


def test_the_switch_keeps_float32_panels_with_the_same_tokens(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_ops()
    folder = bf16_checkpoint(model_factory, "llama")
    engines = {"bf16": make_engine(folder)}
    monkeypatch.setenv(BF16_WEIGHTS_ENV, "0")
    engines["float32"] = make_engine(folder)
    assert packed_dtypes(engines["bf16"]) == {torch.bfloat16}
    assert packed_dtypes(engines["float32"]) == {torch.float32}
    prompts = random_prompts(4, engines["bf16"].model_config.vocab_size, 10, 40, seed=5)
    for engine in engines.values():
        assert_greedy_matches_hf(engine, folder, prompts, [20, 9, 30, 14])

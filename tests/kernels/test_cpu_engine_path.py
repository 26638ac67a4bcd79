"""Which path the engine takes on CPU, and that both are exact against Hugging Face.

The HF-exactness suite (tests/engine/test_hf_exactness.py) runs on the default path, the
compiled kernels; here the plain-torch path (what a machine without a compiler gets) is held to
the same oracle, and the default path is checked to really be the kernels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import kernels.cpu
from engine.llm_engine import LLMEngine
from engine.models.layers import PackedGateUpSiLU, PackedLinear
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, greedy, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import assert_greedy_matches_hf, check_against_hf, submit
from tests.engine.test_hf_exactness import make_engine as make_any_engine
from tests.kernels.cpu_ops import cpu_ops


def make_engine(folder: Path, **overrides: object) -> LLMEngine:
    """The HF-exactness suite's engine, on the CPU even where a GPU is present (the CPU path is
    what these tests are about; ``benchmarks/gpu_check.py`` runs them on a CUDA machine too)."""
    return make_any_engine(folder, device="cpu", **overrides)


def test_default_cpu_path_is_the_compiled_kernels(tiny_model: Path) -> None:
    cpu_ops()
    engine = make_engine(tiny_model)
    assert engine.backend.name == "cpu"
    model = engine.runner.model
    assert model.kernels is not None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear | PackedLinear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)  # fp32: all packed
    assert engine.runner.sampler.has_argmax_kernel  # greedy rows: the compiled argmax
    # The MLP's gate_up runs with SiLU·mul as its epilogue: the GEMM then silu_mul, same bits.
    ops = cpu_ops()
    gate_ups = [m for n, m in model.named_modules() if n.endswith(".mlp.gate_up_proj")]
    assert len(gate_ups) == len(model.layers)
    for gate_up in gate_ups:
        assert isinstance(gate_up, PackedGateUpSiLU)
        x = torch.randn(2, 3, gate_up.in_features)
        want = ops.silu_mul(ops.linear(x.view(6, -1), gate_up.packed, gate_up.out_features, None))
        assert torch.equal(gate_up(x), want.view(2, 3, -1))


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
    assert not engine.runner.sampler.has_argmax_kernel
    prompts = random_prompts(4, engine.model_config.vocab_size, 10, 40, seed=21)
    lengths = [30, 12, 25, 8]
    assert_greedy_matches_hf(engine, folder, prompts, lengths)


def test_cpu_backend_needs_the_kernels(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from engine.attention.selector import get_attention_backend

    monkeypatch.setattr(kernels.cpu, "load", lambda: None)
    with pytest.raises(ValueError, match="compiled CPU kernels"):
        get_attention_backend(torch.device("cpu"), "cpu")


@pytest.mark.parametrize(
    "arch,fused", [("llama", True), ("qwen2", True), ("mistral", True), ("qwen3", False)]
)
def test_float32_runs_each_layer_as_one_call(model_factory: Any, arch: str, fused: bool) -> None:
    """fp32 on the kernels: every layer in the one ``decoder_layers`` call (qkv bias and
    sliding windows included); Qwen3's per-head q/k norm keeps the per-kernel layer."""
    cpu_ops()
    engine = make_engine(model_factory(arch, **TINY_ARCHS[arch]))
    assert engine.runner.model.fused_layers is fused


# An MLP width that is not a multiple of the GEMM's panel width: gate_up then SiLU·mul apart.
FUSED_SHAPES = {
    **{arch: TINY_ARCHS[arch] for arch in ("llama", "qwen2", "mistral")},
    "llama-mlp-120": dict(architecture="llama", intermediate_size=120),
}


@pytest.mark.parametrize("name", sorted(FUSED_SHAPES))
def test_fused_layers_match_bit_for_bit(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The fused layers run the same kernels in the same order: every step's hidden states
    are bit-identical to the per-kernel Python layer's, through chunked prefill (mixed
    prefill + decode steps), prefix-cache hits and a sliding window; and the tokens are HF's."""
    cpu_ops()
    folder = model_factory(name, **FUSED_SHAPES[name])
    prompts = random_prompts(5, 256, 10, 60, seed=33)
    prompts.append(prompts[0][:40] + [7, 8, 9])  # a prefix-cache hit on a cached prompt
    lengths = [20, 9, 31, 14, 6, 12]

    def run(fused: bool) -> tuple[list[torch.Tensor], dict]:
        monkeypatch.setenv("PDSERVE_FUSED_LAYERS", "1" if fused else "0")
        engine = make_engine(folder, max_num_batched_tokens=32)
        model = engine.runner.model
        assert model.fused_layers is fused
        hidden: list[torch.Tensor] = []
        forward = model.forward

        def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = forward(*args, **kwargs)
            hidden.append(out.clone())
            return out

        setattr(model, "forward", recording)  # noqa: B010 (a method)
        submit(engine, prompts, lengths)
        outs = run_to_completion(engine)
        assert_pool_free(engine)
        return hidden, outs

    fused_hidden, fused_outs = run(True)
    plain_hidden, plain_outs = run(False)
    assert len(fused_hidden) == len(plain_hidden) > len(prompts)
    for i, (a, b) in enumerate(zip(fused_hidden, plain_hidden, strict=True)):
        assert torch.equal(a, b), f"step {i}: the fused layers' hidden states differ"
    assert {k: list(v.token_ids) for k, v in fused_outs.items()} == {
        k: list(v.token_ids) for k, v in plain_outs.items()
    }
    check_against_hf(folder, prompts, lengths, fused_outs)


def _one_token_step(engine: LLMEngine, stack: Any, x: torch.Tensor) -> Any:
    """``decoder_layers`` over ``stack``'s lists for one token at position 0 (slot 0, one
    request of one token)."""
    model = engine.runner.model
    rotary = model.rotary.for_step(torch.zeros(1, dtype=torch.long), x.dtype, model.kernels)
    caches = engine.kv_cache.layer_caches
    i32 = torch.int32
    return cpu_ops().decoder_layers(
        x, stack.input_norms, stack.post_norms, stack.eps, stack.qkv, stack.qkv_bias,
        stack.o, stack.o_bias, stack.gate_up, stack.down, stack.num_heads,
        stack.num_kv_heads, stack.head_dim, stack.intermediate, rotary.cos, rotary.sin,
        rotary.positions, [k for k, _ in caches], [v for _, v in caches],
        torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=i32),
        torch.tensor([0, 1], dtype=i32), torch.tensor([1], dtype=i32), 1, stack.scale,
        [0] * len(caches),
    )  # fmt: skip


def test_fused_layers_refuse_lists_of_different_lengths(model_factory: Any) -> None:
    """``decoder_layers`` takes one entry per layer in every list; a short one is an error
    naming the problem, not a read past its end."""
    engine = make_engine(model_factory("llama", **TINY_ARCHS["llama"]))
    model = engine.runner.model
    stack = model._fused
    assert stack is not None and len(stack.qkv) >= 2
    short = dataclasses.replace(stack, down=stack.down[:-1])
    with pytest.raises(RuntimeError, match="every list needs one entry per layer"):
        _one_token_step(engine, short, torch.randn(1, model.config.hidden_size))


def test_fused_layers_check_every_layer_before_running_any(model_factory: Any) -> None:
    """A bad argument of the last layer (its o projection packed for another shape) is an
    error naming it, raised before the first layer runs: x and every cache are untouched."""
    engine = make_engine(model_factory("llama", **TINY_ARCHS["llama"]))
    model = engine.runner.model
    stack = model._fused
    assert stack is not None and len(stack.o) >= 2
    bad = dataclasses.replace(stack, o=[*stack.o[:-1], stack.qkv[-1]])
    x = torch.randn(1, model.config.hidden_size)
    x_before = x.clone()
    caches = engine.kv_cache.layer_caches
    caches_before = [(k.clone(), v.clone()) for k, v in caches]
    with pytest.raises(RuntimeError, match=r"decoder_layers \(o\)"):
        _one_token_step(engine, bad, x)
    assert torch.equal(x, x_before)
    for (k, v), (k0, v0) in zip(caches, caches_before, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    _one_token_step(engine, stack, x)  # the good lists run on the same tensors
    assert not torch.equal(caches[0][0], caches_before[0][0])  # slot 0 written this time
    assert_pool_free(engine)

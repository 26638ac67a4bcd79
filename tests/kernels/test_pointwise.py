"""kernels/pointwise.py against the torch layers it replaces on a GPU (engine/models/layers.py):
RMSNorm with and without the residual add, rotary in place on strided q/k views, SiLU·mul; and
an engine running them (with the Triton attention backend) still greedy-exact against HF."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels.cpu
from engine import model_runner
from engine.model_runner import GPU_POINTWISE_ENV
from engine.models.layers import RMSNorm, RotaryEmbedding, apply_rotary
from engine.models.pointwise_check import check_pointwise
from kernels._common import interpreter_active
from kernels.pointwise import (
    TritonPointwise,
    add_rms_norm,
    rms_norm,
    rotary_,
    silu_mul,
)
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.engine.test_hf_exactness import assert_greedy_matches_hf, make_engine

# Half-precision results may differ from torch's by one rounding (sums in another order). The
# triton 3.9 interpreter converts float32 to bfloat16 by truncation, not rounding, so on CPU a
# bf16 result carries up to one more bf16 ulp per rounding step (two in SiLU·mul and rotary).
TOL = {
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 2.4e-2 if interpreter_active() else 8e-3,
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOL[expected.dtype]
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def _torch_norm(dim: int, weight: torch.Tensor) -> RMSNorm:
    norm = RMSNorm(dim, 1e-5).to(weight.device, weight.dtype)
    norm.weight.data = weight.clone()
    return norm  # kernels None: HF's arithmetic in torch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 64), (7, 576), (33, 100), (0, 64)])
def test_rms_norm(device, dtype, rows, dim):
    weight = torch.randn(dim, device=device).to(dtype)
    base = torch.randn(rows, dim + 8, device=device).to(dtype)
    x = base[:, :dim]  # row stride dim + 8
    got = rms_norm(x, weight, 1e-5)
    assert got.shape == (rows, dim) and got.dtype == dtype
    assert_close(got, _torch_norm(dim, weight)(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_adds_in_place(device, dtype):
    rows, dim = 9, 576
    weight = torch.randn(dim, device=device).to(dtype)
    x = torch.randn(rows, dim, device=device).to(dtype)
    residual = torch.randn(rows, dim, device=device).to(dtype)
    expected_stream = residual + x
    expected = _torch_norm(dim, weight)(expected_stream)
    got = add_rms_norm(residual, x, weight, 1e-5)
    if dtype == torch.bfloat16 and interpreter_active():  # truncates (see TOL)
        assert_close(residual, expected_stream)
    else:
        assert torch.equal(residual, expected_stream)  # one rounding, as torch's add
    assert_close(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
def test_rotary_in_place_on_strided_views(device, dtype, heads, kv_heads, head_dim):
    """q and k as the attention layer makes them: views into one qkv projection's output."""
    tokens, max_positions = 11, 300
    inv_freq = tuple(1.0 / (10000.0 ** (i / head_dim)) for i in range(0, head_dim, 2))
    rope = RotaryEmbedding(inv_freq, max_positions, 1.0).to(device)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    q = qkv[:, :q_size].view(tokens, heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(tokens, kv_heads, head_dim)
    v_before = qkv[:, q_size + kv_size :].clone()
    positions = torch.randint(0, max_positions, (tokens,), device=device)
    positions[0] = max_positions - 1  # the table's last row
    cos, sin = rope.lookup(positions, dtype)
    expected_q, expected_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    rotary_(q, k, rope.cos, rope.sin, positions)
    assert_close(q, expected_q)
    assert_close(k, expected_k)
    assert torch.equal(qkv[:, q_size + kv_size :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 100), (3, 2500)])
def test_silu_mul(device, dtype, rows, inter):
    gate_up = torch.randn(rows, 2 * inter, device=device).to(dtype) * 3
    gate, up = gate_up.split(inter, dim=-1)
    got = silu_mul(gate_up)
    assert got.shape == (rows, inter)
    assert_close(got, F.silu(gate) * up)


def test_rejects_mismatched_inputs(device):
    x, weight = torch.randn(4, 64, device=device), torch.ones(64, device=device)
    with pytest.raises(AssertionError, match="residual must match x"):
        add_rms_norm(torch.randn(4, 64, device=device).half(), x, weight, 1e-5)
    with pytest.raises(AssertionError, match="gate_up"):
        silu_mul(torch.randn(4, 63, device=device))
    with pytest.raises(AssertionError, match="more k heads"):
        q, k = torch.randn(2, 2, 32, device=device), torch.randn(2, 4, 32, device=device)
        table = torch.randn(8, 32, device=device)
        rotary_(q, k, table, table, torch.zeros(2, dtype=torch.int64, device=device))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_engine_on_the_pointwise_kernels_matches_hf(
    model_factory, device, monkeypatch, arch: str
) -> None:
    """The GPU path's layers (torch linears, Triton attention and Triton pointwise ops, wired
    as the model runner does on CUDA) give HF's greedy tokens; on CPU under the interpreter."""
    monkeypatch.setattr(kernels.cpu, "load", lambda: None)  # on CPU: the GPU path's torch linears
    folder: Path = model_factory(arch, **TINY_ARCHS[arch])
    engine = make_engine(
        folder, device=str(device), attention_backend="triton", max_num_batched_tokens=16
    )
    model = engine.runner.model
    model.use_pointwise_kernels(TritonPointwise())
    assert model.kernels is not None and not model.fused_layers
    assert model.layers[0].mlp.kernels is not None  # type: ignore[union-attr]
    prompts = random_prompts(3, engine.model_config.vocab_size, 10, 30, seed=12)
    assert_greedy_matches_hf(engine, folder, prompts, [6, 10, 4])


class _WrongSiluMul(TritonPointwise):
    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
        return gate * up  # no SiLU


class _BrokenRotary(TritonPointwise):
    @staticmethod
    def rotary_(*args: object) -> None:
        raise RuntimeError("no kernel image for this GPU")


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_passes_at_model_shapes(device, dtype):
    ops = TritonPointwise()
    assert check_pointwise(ops, device, dtype, 576, 9, 3, 64, 1536) is None
    assert check_pointwise(ops, device, dtype, 100, 4, 4, 32, 70) is None  # not powers of 2


def test_check_names_what_disagrees_or_fails(device):
    problem = check_pointwise(_WrongSiluMul(), device, torch.float32, 64, 2, 1, 32, 48)
    assert problem is not None and problem.startswith("silu_mul differs from torch")
    problem = check_pointwise(_BrokenRotary(), device, torch.float32, 64, 2, 1, 32, 48)
    assert problem == "RuntimeError: no kernel image for this GPU"


def test_runner_keeps_torch_ops_when_the_check_fails(model_factory, device, monkeypatch, caplog):
    """What the model runner does on CUDA at start-up, called here on an engine that started
    on the torch ops (on CPU, or on a GPU with PDSERVE_GPU_POINTWISE=0)."""
    monkeypatch.setattr(kernels.cpu, "load", lambda: None)
    monkeypatch.setenv(GPU_POINTWISE_ENV, "0")
    folder = model_factory("llama", **TINY_ARCHS["llama"])
    engine = make_engine(folder, device=str(device), attention_backend="triton")
    runner, model = engine.runner, engine.runner.model
    assert model.kernels is None
    with monkeypatch.context() as patch:
        patch.setattr(model_runner, "check_pointwise", lambda *a: "silu_mul differs from torch")
        with caplog.at_level("WARNING"):
            runner._use_triton_pointwise()
    assert model.kernels is None and "torch ops kept" in caplog.text
    runner._use_triton_pointwise()
    assert isinstance(model.kernels, TritonPointwise)

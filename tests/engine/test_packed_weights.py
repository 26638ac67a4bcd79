"""The float32 linear layers' packed weights share one buffer on huge pages
(engine/packed_weights.py): the same panels as packing each weight alone, the same outputs, and
2 MiB pages read back from /proc/self/smaps where the kernel's THP allows them."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.engine_config import EngineConfig
from engine.huge_pages import HUGE_PAGE, WEIGHT_HUGE_PAGES_ENV
from engine.llm_engine import LLMEngine
from engine.model_config import load_model_config
from engine.model_loader import load_model
from engine.models import llama as llama_module
from engine.models.layers import PackedLinear
from engine.packed_weights import empty_packed_weights, pack_into
from tests.conftest import TINY_ARCHS
from tests.engine.test_huge_pages import anon_huge_kib, churn_the_heap, needs_thp, thp_mode
from tests.kernels.cpu_ops import cpu_ops


def pack_into_one_buffer(linears: list[nn.Linear], ops: object) -> list[torch.Tensor]:
    views = empty_packed_weights([(m.out_features, m.in_features) for m in linears], ops)
    return [pack_into(v, m.weight, ops) for v, m in zip(views, linears, strict=True)]


def layers() -> list[nn.Linear]:
    """SmolLM2-135M's four decoder projections (one layer, ~14 MiB packed) and a ragged one
    whose output is not a whole number of panels."""
    torch.manual_seed(0)
    shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576), (100, 37)]
    return [nn.Linear(k, n, bias=False) for k, n in shapes]


def test_views_of_one_buffer_hold_each_weights_own_panels() -> None:
    ops = cpu_ops()
    linears = layers()
    packed = pack_into_one_buffer(linears, ops)
    base = packed[0].untyped_storage().data_ptr()
    assert packed[0].data_ptr() % HUGE_PAGE == 0  # the buffer starts on a 2 MiB boundary
    for linear, view in zip(linears, packed, strict=True):
        assert view.untyped_storage().data_ptr() == base  # one buffer
        alone = ops.pack_linear_weight(linear.weight.detach())
        assert view.shape == alone.shape and view.is_contiguous()
        assert torch.equal(view, alone)
    # In order, back to back: the step streams them in this order.
    ends = [v.data_ptr() + v.numel() * 4 for v in packed[:-1]]
    assert ends == [v.data_ptr() for v in packed[1:]]
    x = torch.randn(18, 576)
    layer = PackedLinear(linears[2], ops, packed[2])
    torch.testing.assert_close(layer(x), F.linear(x, linears[2].weight), rtol=1e-5, atol=1e-5)


@needs_thp
def test_the_buffer_is_on_huge_pages_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = cpu_ops()
    churn_the_heap()  # a ~14 MiB buffer from malloc could now be touched heap memory
    packed = pack_into_one_buffer(layers(), ops)
    start = packed[0].data_ptr()
    end = packed[-1].data_ptr() + packed[-1].numel() * 4
    assert end - start >= 6 * HUGE_PAGE
    # (Linux may fall back to 4 KiB pages where it finds no free 2 MiB ones: half is the bar)
    assert anon_huge_kib(start, end) * 1024 >= (end - start) // HUGE_PAGE * HUGE_PAGE // 2
    monkeypatch.setenv(WEIGHT_HUGE_PAGES_ENV, "0")  # the operator's off switch
    off = pack_into_one_buffer(layers(), ops)
    start = off[0].data_ptr()
    if thp_mode() == "madvise":  # under 'always' Linux gives huge pages unasked
        assert anon_huge_kib(start, start + 6 * HUGE_PAGE) == 0


def test_the_engine_packs_every_linear_into_one_buffer(model_factory) -> None:  # type: ignore[no-untyped-def]
    cpu_ops()
    folder: Path = model_factory("llama", **TINY_ARCHS["llama"])
    config = EngineConfig(
        model=str(folder), dtype="float32", device="cpu", kv_cache_memory_gb=1 / 16
    )
    model = LLMEngine(config).model
    packed = [m.packed for m in model.modules() if isinstance(m, PackedLinear)]
    assert packed and not any(isinstance(m, nn.Linear) for m in model.modules())
    assert len({p.untyped_storage().data_ptr() for p in packed}) == 1
    # In the order a step reads them: the layers' projections, then lm_head.
    assert [p.data_ptr() for p in packed] == sorted(p.data_ptr() for p in packed)


def test_each_unpacked_weight_is_released_once_packed(
    model_factory,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading holds about one model, not two: when the i-th weight is packed, the i - 1
    packed before it are already released (the tied lm_head's table stays: the embedding's)."""
    ops = cpu_ops()
    folder: Path = model_factory("llama", **TINY_ARCHS["llama"])
    model = load_model(load_model_config(folder, "float32"), torch.device("cpu"))
    weights = [
        weakref.ref(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Linear) and m.weight is not model.embed_tokens.weight
    ]
    assert len(weights) >= 4
    alive_at_each_pack: list[int] = []

    def counting_pack_into(
        view: torch.Tensor, weight: torch.Tensor, kernels: object
    ) -> torch.Tensor:
        gc.collect()
        alive_at_each_pack.append(sum(w() is not None for w in weights))
        return pack_into(view, weight, kernels)

    monkeypatch.setattr(llama_module, "pack_into", counting_pack_into)
    model.use_cpu_kernels(ops)
    gc.collect()
    assert all(w() is None for w in weights)
    n = len(weights)
    assert alive_at_each_pack[:n] == [n - i for i in range(n)]

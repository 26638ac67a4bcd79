"""A step's last layer for its sampled rows alone (engine.attention.output_rows).

The model's ``forward(out_rows=...)`` writes every row's K/V (the same bits as a step over every
row) and returns only the sampled rows' hidden states, which the fused layers and the per-kernel
Python layer compute with the same bits; against a step over every row they differ only by the
attention's order of summation (a sampled row attends as a one-query request, as decode rows do).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import kernels.cpu
from engine.attention.backend import AttentionMetadata
from engine.attention.output_rows import OutputRows, RowsAttentionBackend
from engine.llm_engine import LLMEngine
from tests.conftest import TINY_ARCHS
from tests.kernels.cpu_ops import cpu_ops
from tests.kernels.test_cpu_engine_path import FUSED_SHAPES, make_engine

# Three requests in one step: a prompt of 6 tokens, a chunk of 9 tokens after 5 cached ones
# (its prompt goes on: no token sampled), and a prompt of 4 tokens.
CONTEXTS = (0, 5, 0)
QUERIES = (6, 9, 4)
SAMPLED = (0, 2)


def step_metadata(engine: LLMEngine) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Token ids, positions and metadata of the step above, each request in blocks of its own."""
    bs = engine.kv_cache.spec.block_size
    per_request = -(-max(c + q for c, q in zip(CONTEXTS, QUERIES, strict=True)) // bs)
    tables = [[1 + r * per_request + b for b in range(per_request)] for r in range(len(QUERIES))]
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (sum(QUERIES),), generator=gen)
    positions: list[int] = []
    slots: list[int] = []
    for table, c, q in zip(tables, CONTEXTS, QUERIES, strict=True):
        for p in range(c, c + q):
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
    seq_lens = tuple(c + q for c, q in zip(CONTEXTS, QUERIES, strict=True))
    qsl = [0]
    for q in QUERIES:
        qsl.append(qsl[-1] + q)
    i32 = torch.int32
    meta = AttentionMetadata(
        num_tokens=sum(QUERIES),
        num_seqs=len(QUERIES),
        query_start_loc=torch.tensor(qsl, dtype=i32),
        query_lens=torch.tensor(QUERIES, dtype=i32),
        context_lens=torch.tensor(CONTEXTS, dtype=i32),
        seq_lens=torch.tensor(seq_lens, dtype=i32),
        block_tables=torch.tensor(tables, dtype=i32),
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        max_query_len=max(QUERIES),
        max_seq_len=max(seq_lens),
        query_lens_cpu=QUERIES,
        seq_lens_cpu=seq_lens,
    )
    return ids, torch.tensor(positions, dtype=torch.long), meta


def run_step(
    engine: LLMEngine, out_rows: OutputRows | None, seed_caches: bool = True
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The model over the step (caches first set to the same random values: the second
    request's cached context), returning its hidden states and every layer's caches."""
    runner = engine.runner
    ids, positions, meta = step_metadata(engine)
    caches = engine.kv_cache.layer_caches
    gen = torch.Generator().manual_seed(9)
    for k, v in caches:
        if seed_caches:
            k.copy_(torch.randn(k.shape, generator=gen))
            v.copy_(torch.randn(v.shape, generator=gen))
    runner.backend.prepare(meta, engine.kv_cache.spec.block_size)
    windows = runner.model_config.sliding_windows or (None,) * len(caches)
    metas = [meta if w is None else dataclasses.replace(meta, sliding_window=w) for w in windows]
    with torch.inference_mode():
        hidden = runner.model(ids, positions, caches, metas, runner.backend, out_rows)
    return hidden.clone(), [(k.clone(), v.clone()) for k, v in caches]


@pytest.mark.parametrize("name", sorted(FUSED_SHAPES))
def test_last_layer_runs_the_sampled_rows_alone(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    cpu_ops()
    folder = model_factory(name, **FUSED_SHAPES[name])

    def engine_for(fused: bool) -> LLMEngine:
        monkeypatch.setenv("PDSERVE_FUSED_LAYERS", "1" if fused else "0")
        engine = make_engine(folder)
        assert engine.runner.model.fused_layers is fused
        return engine

    fused = engine_for(True)
    _, _, meta = step_metadata(fused)
    rows = OutputRows.last_rows(meta, SAMPLED)
    assert rows.rows.tolist() == [5, 18]  # the last rows of requests 0 and 2
    assert rows.meta.seq_lens_cpu == (6, 4) and rows.meta.query_lens_cpu == (1, 1)

    every, every_caches = run_step(fused, None)
    mine, mine_caches = run_step(fused, rows)
    assert mine.shape == (2, every.shape[1])
    for (k0, v0), (k1, v1) in zip(every_caches, mine_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)  # every row's K/V, the same bits
    torch.testing.assert_close(mine, every.index_select(0, rows.rows), rtol=1e-5, atol=1e-5)

    none, none_caches = run_step(fused, OutputRows.last_rows(meta, []))
    assert none.shape == (0, every.shape[1])
    for (k0, v0), (k1, v1) in zip(every_caches, none_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)

    # The per-kernel Python layer on the cpu backend: the same rows, the same bits.
    plain = engine_for(False)
    plain_mine, plain_caches = run_step(plain, rows)
    assert torch.equal(plain_mine, mine)
    for (k0, v0), (k1, v1) in zip(mine_caches, plain_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_torch_backend_runs_the_sampled_rows_alone(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the compiled kernels (the torch backend and layers) the last layer does the
    same: every row's K/V the same bits, the sampled rows' outputs within rounding."""
    monkeypatch.setattr(kernels.cpu, "load", lambda: None)
    engine = make_engine(model_factory("mistral", **FUSED_SHAPES["mistral"]))
    assert engine.runner.backend.name == "torch" and engine.runner.model.kernels is None
    _, _, meta = step_metadata(engine)
    rows = OutputRows.last_rows(meta, SAMPLED)
    every, every_caches = run_step(engine, None)
    mine, mine_caches = run_step(engine, rows)
    for (k0, v0), (k1, v1) in zip(every_caches, mine_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    torch.testing.assert_close(mine, every.index_select(0, rows.rows), rtol=1e-5, atol=1e-5)


def test_triton_backend_runs_the_sampled_rows_alone(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Triton backend (here under the CPU interpreter, tests/kernels/conftest.py) does the
    same: every row's K/V the same bits, the sampled rows' outputs (its decode kernel's) within
    rounding of the step over every row (its prefill kernel's)."""
    pytest.importorskip("triton")
    engine = make_engine(
        model_factory("mistral", **FUSED_SHAPES["mistral"]), attention_backend="triton"
    )
    backend = engine.runner.backend
    assert backend.name == "triton" and isinstance(backend, RowsAttentionBackend)
    calls: list[int] = []
    forward_rows = backend.forward_rows

    def counted(*args: Any) -> torch.Tensor:
        calls.append(len(args[6]))  # the rows: the last layer's, once a step
        return forward_rows(*args)

    monkeypatch.setattr(backend, "forward_rows", counted)
    _, _, meta = step_metadata(engine)
    rows = OutputRows.last_rows(meta, SAMPLED)
    every, every_caches = run_step(engine, None)
    assert calls == []
    mine, mine_caches = run_step(engine, rows)
    assert calls == [2]
    assert mine.shape == (2, every.shape[1])
    for (k0, v0), (k1, v1) in zip(every_caches, mine_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    torch.testing.assert_close(mine, every.index_select(0, rows.rows), rtol=1e-5, atol=1e-5)
    none, none_caches = run_step(engine, OutputRows.last_rows(meta, []))
    assert none.shape == (0, every.shape[1])
    for (k0, v0), (k1, v1) in zip(every_caches, none_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_every_row_is_the_plain_step(model_factory: Any) -> None:
    """``out_rows`` naming every row of the step is the step over every row, bit for bit."""
    engine = make_engine(model_factory("llama", **TINY_ARCHS["llama"]))
    _, _, meta = step_metadata(engine)
    every, _ = run_step(engine, None)
    all_rows = OutputRows.last_rows(meta, [])
    all_rows = dataclasses.replace(all_rows, rows=torch.arange(meta.num_tokens))
    assert all_rows.covers(meta.num_tokens)
    same, _ = run_step(engine, all_rows)
    assert torch.equal(same, every)


@pytest.mark.parametrize(
    "rows,qsl,message",
    [
        ([1, 0], None, "ascending rows below covered"),
        ([2], None, "ascending rows below covered"),
        ([0, 1], [0, 2, 2], "one query a row"),
    ],
)
def test_decoder_layers_refuse_rows_outside_the_step(
    model_factory: Any, rows: list[int], qsl: list[int] | None, message: str
) -> None:
    """Rows out of order or past the step's own rows, or metadata giving a row more than its
    one query, are an error naming them, not a read past the batch; nothing is written."""
    engine = make_engine(model_factory("llama", **TINY_ARCHS["llama"]))
    model = engine.runner.model
    stack = model._fused
    assert stack is not None
    caches = engine.kv_cache.layer_caches
    before = [(k.clone(), v.clone()) for k, v in caches]
    x = torch.randn(2, model.config.hidden_size)
    positions = torch.tensor([0, 1])
    rotary = model.rotary.for_step(positions, x.dtype, model.kernels)
    i32 = torch.int32
    with pytest.raises(RuntimeError, match=message):
        cpu_ops().decoder_layers(
            x, stack.input_norms, stack.post_norms, stack.eps, stack.qkv, stack.qkv_bias,
            stack.o, stack.o_bias, stack.gate_up, stack.down, stack.num_heads,
            stack.num_kv_heads, stack.head_dim, stack.intermediate, rotary.cos, rotary.sin,
            rotary.positions, [k for k, _ in caches], [v for _, v in caches],
            torch.tensor([0, 1]), torch.zeros(1, 1, dtype=i32), torch.tensor([0, 2], dtype=i32),
            torch.tensor([2], dtype=i32), 2, stack.scale, [0] * len(caches),
            torch.tensor(rows), torch.zeros(len(rows), 1, dtype=i32),
            torch.arange(len(rows) + 1, dtype=i32) if qsl is None else torch.tensor(qsl, dtype=i32),
            torch.full((len(rows),), 2, dtype=i32),
        )  # fmt: skip
    for (k, v), (k0, v0) in zip(caches, before, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)

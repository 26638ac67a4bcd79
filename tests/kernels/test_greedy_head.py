"""The greedy lm_head (kernels/cpu/greedy_head.cpp) against the float32 path it replaces: the
packed ``linear`` then the compiled ``argmax``. The token must be the same on every row, from
every screen this CPU runs (bf16 with AVX512-BF16, int16 on any AVX2 or AVX-512 CPU): random
shapes (vocabularies and widths that are no multiple of a panel or a pair, widths past the
GEMM's K block, row counts past a micro-kernel's rows), exact ties (the first index wins, across
panels and threads), near ties one float32 ulp apart, all-equal logits, subnormal and very large
activations, outliers that coarsen the int16 scale, sums at the int32 limit, and bf16 panels.
Rows it cannot screen (x not finite) come back as -1, and ``GreedyLmHead`` answers them from
their logits."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from engine.models.greedy_head import GREEDY_HEAD_ENV, GreedyLmHead
from engine.models.layers import PackedLinear
from tests.kernels.cpu_ops import cpu_ops


def screen_ops() -> Any:
    ops = cpu_ops()
    if not ops.greedy_head_supported():
        pytest.skip("the kernels' build has no screen (neither AVX2 nor AVX-512): logits in fp32")
    return ops


def _reference(ops: Any, x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return ops.argmax(ops.linear(x, packed, n, None))


def _check(w: torch.Tensor, x: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """The greedy head's tokens equal the reference's, with and without W's rows."""
    ops = screen_ops()
    n = w.shape[0]
    packed = ops.pack_linear_weight(w, bf16)
    want = _reference(ops, x, packed, n)
    for kind in ops.greedy_head_screens():
        screen, norms = ops.pack_greedy_head(w, kind)
        for rows in (w, None):
            got = ops.greedy_head(x, screen, norms, packed, n, rows)
            assert torch.equal(got, want), (kind, rows is None, got, want)
    return want


@pytest.mark.parametrize(
    ("vocab", "width"),
    [(1, 9), (31, 64), (33, 7), (1000, 576), (49152, 576), (2050, 2048), (517, 1601)],
)
@pytest.mark.parametrize("rows", [1, 5, 12, 13, 18, 40])
def test_random_shapes(vocab: int, width: int, rows: int) -> None:
    g = torch.Generator().manual_seed(vocab * 31 + width * 7 + rows)
    w = torch.randn(vocab, width, generator=g) * 0.05
    x = torch.randn(rows, width, generator=g)
    _check(w, x)


def test_bf16_panels() -> None:
    """A weight bf16 holds exactly (a bf16 checkpoint run in float32) is packed as bf16 panels;
    the exact pass then reads those."""
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(3000, 576, generator=g) * 0.05).bfloat16().float()
    _check(w, torch.randn(18, 576, generator=g), bf16=True)


def test_exact_ties_take_the_first_index() -> None:
    """Rows equal to the best one, in the same panel, in other panels and at the far end (the
    other thread's half): the first wins, as torch.argmax."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4096, 96, generator=g) * 0.05
    x = torch.randn(6, 96, generator=g)
    best = [int(i) for i in (x @ w.T).argmax(dim=1)]
    for r, b in enumerate(best):
        for twin in (b ^ 1, b + 64, 4095 - r, 3 + r):
            w[twin] = w[b]
    tokens = _check(w, x)
    for r, (t, b) in enumerate(zip(tokens.tolist(), best, strict=True)):
        assert t <= min(b, b ^ 1, 3 + r)


def test_near_ties_one_ulp_apart() -> None:
    """Candidates whose float32 logits differ in the last bits: only the exact pass can tell
    them apart, and it must agree with the float32 GEMM bit for bit."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2048, 128, generator=g) * 0.05
    x = torch.randn(8, 128, generator=g)
    best = (x @ w.T).argmax(dim=1)
    for r, b in enumerate(best.tolist()):
        for j, twin in enumerate((100 + r, 1500 + r, b ^ 3)):
            w[twin] = w[b]
            w[twin, j] = torch.nextafter(w[twin, j], torch.tensor(1.0 if r % 2 else -1.0))
    _check(w, x)


def test_the_screen_s_order_is_not_trusted() -> None:
    """Rows whose bf16 rounding reverses their order: row 5 has the larger float32 logit
    (64.25 against 64.0625 with x = 1) but the smaller screened one (64 against 64.125), so
    only the error bound keeps it among the candidates."""
    k = 64
    w = torch.full((40, k), 0.5)
    w[5] = 1 + 2**-8 - 2**-20  # bf16 rounds down, to 1
    w[9, : k // 2] = 1 + 2**-8 + 2**-20  # rounds up, to 1 + 2^-7
    w[9, k // 2 :] = 1 - 2**-9 - 2**-20  # rounds down, to 1 - 2^-8
    x = torch.ones(1, k)
    assert (w.bfloat16().float() @ x.T).argmax() == 9  # the screen alone would say 9
    assert _check(w, x).tolist() == [5]


def test_all_logits_equal_and_zero_rows() -> None:
    """x = 0 makes every logit 0: every column is a candidate, and index 0 wins."""
    w = torch.randn(700, 64) * 0.05
    x = torch.zeros(3, 64)
    x[1] = torch.randn(64)
    tokens = _check(w, x)
    assert tokens[0] == 0 and tokens[2] == 0


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e-3, 1e8, 1e15])
def test_tiny_and_large_activations(scale: float) -> None:
    """Products that are subnormal in float32 (flushed by VDPBF16PS) and very large ones: the
    bound covers both."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1500, 256, generator=g) * 0.05
    _check(w, torch.randn(7, 256, generator=g) * scale)


def test_rows_that_are_not_finite_are_left_to_the_caller() -> None:
    ops = screen_ops()
    w = torch.randn(900, 64) * 0.05
    x = torch.randn(5, 64)
    x[1, 3] = float("nan")
    x[3, 0] = float("inf")
    packed = ops.pack_linear_weight(w)
    for kind in ops.greedy_head_screens():
        screen, norms = ops.pack_greedy_head(w, kind)
        got = ops.greedy_head(x, screen, norms, packed, 900, w)
        assert got[1] == -1 and got[3] == -1
        keep = torch.tensor([0, 2, 4])
        assert torch.equal(got[keep], _reference(ops, x, packed, 900)[keep])
        head = GreedyLmHead(_linear(w), ops, packed, (screen, norms))
        assert head.screen_kind == kind
        assert torch.equal(head.greedy(x), _reference(ops, x, packed, 900))  # NaN rows: first


def _linear(w: torch.Tensor, bias: bool = False) -> nn.Linear:
    linear = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        linear.weight.copy_(w)
    return linear


def test_which_lm_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen where it can run; the float32 path with a bias, a weight row too large for the
    bound, or ``PDSERVE_CPU_GREEDY_HEAD=0``."""
    ops = screen_ops()
    w = torch.randn(300, 32) * 0.05
    packed = ops.pack_linear_weight(w)
    head = GreedyLmHead.maybe(_linear(w), ops, packed)
    assert isinstance(head, GreedyLmHead)
    x = torch.randn(4, 32)
    assert torch.equal(head.greedy(x), _reference(ops, x, packed, 300))
    assert type(GreedyLmHead.maybe(_linear(w, bias=True), ops, packed)) is PackedLinear
    huge = w.clone()
    huge[7] = 2.0**70
    assert type(GreedyLmHead.maybe(_linear(huge), ops, packed)) is PackedLinear
    assert head.screen_kind == ops.greedy_head_screens()[0]  # the fastest
    for kind in ops.greedy_head_screens():
        monkeypatch.setenv(GREEDY_HEAD_ENV, kind)
        forced = GreedyLmHead.maybe(_linear(w), ops, packed)
        assert isinstance(forced, GreedyLmHead) and forced.screen_kind == kind
    monkeypatch.setenv(GREEDY_HEAD_ENV, "fp8")
    with pytest.raises(ValueError, match=f"{GREEDY_HEAD_ENV}='fp8': this CPU runs the screens"):
        GreedyLmHead.maybe(_linear(w), ops, packed)
    monkeypatch.setenv(GREEDY_HEAD_ENV, "0")
    assert type(GreedyLmHead.maybe(_linear(w), ops, packed)) is PackedLinear


def test_bad_arguments_are_clear_errors() -> None:
    ops = screen_ops()
    w = torch.randn(100, 32)
    packed = ops.pack_linear_weight(w)
    screen, norms = ops.pack_greedy_head(w)
    with pytest.raises(RuntimeError, match="pack_greedy_head"):
        ops.pack_greedy_head(w[:, :8].contiguous().half())
    with pytest.raises(RuntimeError, match="screen and norms"):
        ops.greedy_head(torch.randn(2, 32), screen[:-2], norms, packed, 100, None)
    with pytest.raises(RuntimeError, match="weight must be"):
        ops.greedy_head(torch.randn(2, 32), screen, norms, packed, 100, w[:50])
    with pytest.raises(RuntimeError, match="screen 'fp8' does not run here"):
        ops.pack_greedy_head(w, "fp8")
    unpacked = norms.clone()
    unpacked[-1] = 0  # norms that say no kind: not from pack_greedy_head
    with pytest.raises(RuntimeError, match="kind does not run here"):
        ops.greedy_head(torch.randn(2, 32), screen, unpacked, packed, 100, None)


def test_outliers_coarsen_the_int16_scale_but_not_the_answer() -> None:
    """One large weight in a row (or one large activation) sets that row's int16 scale, so
    its other values keep a few bits: the bound widens and more columns are settled exactly,
    with the same tokens."""
    g = torch.Generator().manual_seed(6)
    w = torch.randn(2000, 320, generator=g) * 0.05
    w[::7, 11] = 40.0
    x = torch.randn(9, 320, generator=g)
    x[::2, 5] = 300.0
    _check(w, x)


def test_sums_at_the_int32_limit() -> None:
    """Every weight and activation at the largest |q| (all of one sign, and alternating): the
    int32 sums reach their bound without overflowing; widths whose limit is well below 2^15."""
    for k in (7, 576, 8191):
        w = torch.ones(70, k) * 0.25
        w[1::2] *= -1
        w[5, :] = 0.2501  # the largest logit, by far less than the int16 step
        x = torch.ones(3, k)
        x[1, 1::2] = -1.0
        _check(w, x)


def test_the_int16_screen_s_order_is_not_trusted() -> None:
    """Rows whose int16 rounding reverses their order: row 9's largest weight (0.999) gives it
    a finer scale that rounds its other weights up a step, row 5's round down, so the screen
    alone would say 9; only the bound keeps row 5, the float32 answer, among the candidates."""
    k = 64
    q = min(32767, math.floor(math.sqrt((2**31 - 1) / (k + 1))))  # the kernel's limit for k
    w = torch.full((40, k), 0.01)
    w[5, 0], w[5, 1:] = 1.0, (100 + 0.49) / q
    w[9, 0], w[9, 1:] = 0.999, (100 + 0.45) / q

    def screened(row: torch.Tensor) -> float:
        scale = float(torch.tensor(float(row.abs().max()) / q, dtype=torch.float32))
        return scale * float((row / scale).round().sum())

    assert screened(w[9]) > screened(w[5]) and float(w[5].sum()) > float(w[9].sum())
    assert _check(w, torch.ones(1, k)).tolist() == [5]

"""The compiled greedy argmax (kernels/cpu/argmax.cpp) against torch.argmax(dim=-1): the same
index on every row, including ties (the first wins), NaN (counts as the maximum), rows of
-inf (a grammar mask), vocabularies that are not a multiple of the vector width, rows that are
views of a wider tensor, and enough rows to run on several threads."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.cpu_ops import cpu_ops


def _check(logits: torch.Tensor) -> None:
    got = cpu_ops().argmax(logits)
    assert got.dtype == torch.int64
    assert torch.equal(got, logits.argmax(dim=-1)), (got, logits.argmax(dim=-1))


@pytest.mark.parametrize("vocab", [1, 7, 16, 17, 31, 64, 1000, 49152, 151_937])
@pytest.mark.parametrize("rows", [1, 3, 18, 40])
def test_random_logits(vocab: int, rows: int) -> None:
    g = torch.Generator().manual_seed(vocab * 100 + rows)
    _check(torch.randn(rows, vocab, generator=g))


def test_ties_first_index_wins_in_every_lane_and_the_tail() -> None:
    vocab = 16 * 8 + 5
    x = torch.zeros(6, vocab)
    x[0, [3, 19, 130]] = 2.0  # equal maxima in different lanes and in the tail
    x[1, [20, 4]] = 2.0  # a later lane holds the earlier index
    x[2, [131, 132]] = 2.0  # only in the tail
    x[3] = 5.0  # all equal
    x[4, 0] = -0.0  # -0 and +0 are equal: the first zero wins
    x[4, 1:] = -1.0
    x[4, 2] = 0.0
    x[5] = -1.0
    x[5, 17] = 0.0
    x[5, 1] = -0.0
    _check(x)


def test_nan_counts_as_the_maximum_and_the_first_nan_wins() -> None:
    x = torch.randn(4, 1000)
    x[0, 500] = float("nan")
    x[1, [999, 10]] = float("nan")
    x[2, 998] = float("nan")  # in the tail (1000 is not a multiple of 16)
    x[2, 3] = float("inf")
    _check(x)


def test_masked_rows() -> None:
    x = torch.full((3, 300), float("-inf"))
    x[1, 250] = -1e30
    x[2, 7] = float("inf")
    _check(x)


def test_rows_that_are_views_of_a_wider_tensor() -> None:
    wide = torch.randn(18, 2 * 4096)
    _check(wide[:, :4096])
    _check(wide[::2, 100:4196])


def test_refuses_what_it_cannot_read() -> None:
    ops = cpu_ops()
    with pytest.raises(RuntimeError, match="float32"):
        ops.argmax(torch.randn(3, 10, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="rows, vocab"):
        ops.argmax(torch.randn(10))
    with pytest.raises(RuntimeError):
        ops.argmax(torch.randn(10, 3).t())  # the vocab dimension is not contiguous

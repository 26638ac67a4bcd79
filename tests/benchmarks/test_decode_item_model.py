"""benchmarks/decode_item_model.py: the four variants build, agree, and are timed."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.decode_item_model import VARIANTS, main, measure

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler"
)


def test_every_variant_agrees_with_the_kernels_way_and_is_timed() -> None:
    ns = measure(blocks=3, reps=20, rounds=2)  # raises if an output differs beyond 1e-5
    assert ns is not None
    assert list(ns) == list(VARIANTS)
    assert all(t > 0 for t in ns.values())


def test_command_line_prints_each_variant_against_the_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--blocks", "2", "--reps", "10", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "one decode item, 32 positions, one thread, medians of 1"
    assert [line.split()[0] for line in lines[1:]] == list(VARIANTS)
    assert lines[1].endswith("x1.00")

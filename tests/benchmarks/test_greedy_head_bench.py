"""benchmarks/greedy_head.py: both paths timed in one process, on a tiny model folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.greedy_head import main
from tests.kernels.test_greedy_head import screen_ops


def test_alternating_blocks_and_the_lm_head_alone(
    model_factory, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    screen_ops()
    folder: Path = model_factory("llama")
    result = main(["--model-dir", str(folder), "--seqs", "3", "--blocks", "2"])
    assert set(result) == {"greedy head", "float32 logits", "greedy", "linear + argmax"}
    assert all(v > 0 for v in result.values())
    out = capsys.readouterr().out
    assert "float32 logits / greedy head: x" in out
    assert "lm_head alone on the step's 3 rows" in out

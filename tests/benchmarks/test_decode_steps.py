"""benchmarks/decode_steps.py: one round in this checkout, on a tiny model folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.decode_steps import STEPS, main


def test_one_round_times_decode_steps(model_factory, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    folder: Path = model_factory("llama")
    rounds = main(["--rounds", "1", "--model-dir", str(folder)])
    assert list(rounds) == [str(Path(__file__).resolve().parents[2])]
    [(step_s,)] = [tuple(v) for v in rounds.values()]
    assert step_s > 0
    out = capsys.readouterr().out
    assert f"median of {STEPS} steps a round, 1 rounds" in out
    assert "x1.000 of this checkout" in out

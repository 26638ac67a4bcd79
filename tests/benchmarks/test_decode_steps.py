"""benchmarks/decode_steps.py: one round in this checkout, on a tiny model folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.decode_steps import STEPS, main
from kernels.cpu import load


def test_one_round_times_decode_steps(model_factory, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    folder: Path = model_factory("llama")
    rounds = main(["--rounds", "1", "--model-dir", str(folder)])
    assert list(rounds) == [str(Path(__file__).resolve().parents[2])]
    [(step_s,)] = [tuple(v) for v in rounds.values()]
    assert step_s > 0
    out = capsys.readouterr().out
    assert f"median of {STEPS} steps a round, 1 rounds" in out
    assert "x1.000 of this checkout" in out


def test_phases_on_a_touched_pool(model_factory, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    folder: Path = model_factory("llama")
    main(["--rounds", "1", "--model-dir", str(folder), "--phases", "--touched-pool"])
    out = capsys.readouterr().out
    assert "(pool touched before)" in out
    [line] = [x for x in out.splitlines() if x.startswith("  phases, ms a step")]
    for label in ("GEMMs", "attention", "KV store", "norms, rotary, SiLU-mul"):
        assert f"{label} " in line
    if load() is not None:  # the fused layers ran, timed by the kernels' phase timers
        gemms = float(line.split("GEMMs ")[1].split()[0])
        attention = float(line.split("attention ")[1].split()[0])
        assert gemms > 0 and attention > 0

"""benchmarks/gpu_step_profile.py on a CPU: the default path once, on a tiny model folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gpu_step_profile import main


def test_profiles_decode_steps_on_cpu(
    model_factory, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # this machine's path anywhere
    folder: Path = model_factory("llama")
    assert main(["--model-dir", str(folder), "--num-requests", "3", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{folder.name} float32 on cpu: 3 requests decoding" in out
    assert "## default path (elementwise: " in out
    row = next(line for line in out.splitlines() if line.startswith("default path "))
    fields = row.split()
    step_ms, (kernels, kernel_ms, busy) = fields[2], fields[-3:]
    assert float(step_ms.rstrip(";")) > 0
    assert (kernels, kernel_ms, busy) == ("0", "0.00", "-")  # no CUDA kernels on a CPU

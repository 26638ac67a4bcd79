"""benchmarks/gpu_check.py, the prepared GPU check: its plan and its CPU dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.gpu_check import CARRIED, download_command, plan

REPO = Path(__file__).resolve().parents[2]
STEPS = [
    "env",
    "kernel-tests",
    "hf-exact-triton",
    "offline-135m",
    "step-profile",
    "kernel-bench",
    "offline-1b",
]


def test_plan_covers_the_gpu_path_within_six_minutes() -> None:
    steps = plan("python", quick=False, wheels=None)
    assert [s.name for s in steps] == STEPS
    assert len(steps) + 1 <= 8  # a lent machine sends back 8 files: each step's log + summary
    by_name = {s.name: s for s in steps}
    assert by_name["kernel-tests"].env == {"TRITON_INTERPRET": "0"}  # compiled, not interpreted
    assert "tests/kernels" in by_name["kernel-tests"].command
    assert "tests/engine/test_hf_exactness.py" in by_name["hf-exact-triton"].command
    assert by_name["hf-exact-triton"].env["TRITON_INTERPRET"] == "0"
    assert "llama-1b" in by_name["offline-1b"].command
    for name in ("offline-135m", "offline-1b"):  # beside HF on the same card, against its floor
        command = by_name[name].command
        assert "--gpu-roofline" in command and "pdserve,hf-static" in command
        assert command[command.index("--hf-device") + 1] == "cuda"
        assert (
            command[command.index("--hf-dtype") + 1]
            == (command[command.index("--pdserve-dtype") + 1])
        )
    for s in steps:  # every script and test path the steps name exists
        for part in s.command:
            if part.startswith(("benchmarks/", "tests/")):
                assert (REPO / part).exists(), part


def test_dry_run_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert all(s["rc"] == 0 for s in summary["steps"])
    assert "collected" in (out / "kernel-tests.log").read_text()
    assert "workload: 32 requests" in (out / "offline-1b.log").read_text()


def test_refuses_a_real_run_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        return
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--dry-run" in result.stderr


def test_download_command_fetches_the_pinned_wheels_for_the_gpu_image(tmp_path: Path) -> None:
    command = download_command(tmp_path / "whl")
    pins = (REPO / "tests" / "ci" / "constraints.txt").read_text()
    for name in CARRIED:
        wanted = next(p for p in command if p.startswith(f"{name}=="))
        assert f"\n{wanted}\n" in f"\n{pins}\n"  # the version CI tests
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "--no-deps" in command and "manylinux_2_31_x86_64" in command  # llguidance's tag

"""The test run uses one known-good set: every requirement in pyproject.toml (runtime and the
test/ucx extras) has exactly one ``==`` pin in tests/ci/constraints.txt, and the suite never
binds the public default ports."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PUBLIC_DEFAULT_PORTS

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "tests" / "ci"


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match[0]).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (CI / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and not re.search(r"[<>~!,;\s]", version), line
        assert _name(name) not in pins, f"{name} pinned twice"
        pins[_name(name)] = version
    return pins


def test_every_requirement_is_pinned_exactly() -> None:
    reqs = subprocess.run(
        [sys.executable, str(CI / "requirements.py"), "test", "ucx"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    pins = _pins()
    unpinned = sorted({_name(r) for r in reqs} - pins.keys())
    assert not unpinned, f"not in tests/ci/constraints.txt (run tests/ci/lock.sh): {unpinned}"
    for tool in ("ruff", "mypy", "pytest", "pytest-xdist", "pytest-timeout", "grpcio-tools"):
        assert tool in pins


def test_torch_pin_is_the_local_cpu_wheel() -> None:
    assert _pins()["torch"] == "2.13.0"


@pytest.mark.parametrize("port", PUBLIC_DEFAULT_PORTS)
def test_public_default_ports_are_held_during_the_suite(port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            sock.bind(("127.0.0.1", port))

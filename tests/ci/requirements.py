"""pdserve's requirements as pip arguments, read from pyproject.toml (the one list of them).

    python3 tests/ci/requirements.py test ucx   # one requirement per line: torch, deps, extras
    python3 tests/ci/requirements.py --is-installed    # exit 0 when this checkout is installed
    python3 tests/ci/requirements.py --mark-installed  # record that it is (after pip install -e)

Versions come from ``tests/ci/constraints.txt`` (pip's ``-c``), not from here.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
STAMP = Path(sysconfig.get_paths()["purelib"]) / "pdserve-checkout.json"


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    reqs: list[str] = list(project["dependencies"])
    optional = project["optional-dependencies"]
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"no extra {extra!r} in pyproject.toml (have {sorted(optional)})")
        reqs += optional[extra]
    torch = [r for r in reqs if r.startswith("torch")]
    return torch + [r for r in reqs if not r.startswith("torch")]


def _fingerprint() -> dict[str, str]:
    return {
        "checkout": ROOT.as_uri(),
        "pyproject_sha256": hashlib.sha256(PYPROJECT.read_bytes()).hexdigest(),
    }


def is_installed() -> bool:
    try:
        dist = metadata.distribution("pdserve")
    except metadata.PackageNotFoundError:
        return False
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("url") != ROOT.as_uri():
        return False
    try:
        return bool(json.loads(STAMP.read_text(encoding="utf-8")) == _fingerprint())
    except (OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    if argv == ["--is-installed"]:
        return 0 if is_installed() else 1
    if argv == ["--mark-installed"]:
        STAMP.write_text(json.dumps(_fingerprint()), encoding="utf-8")
        return 0
    print("\n".join(requirements(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The committed ``*_pb2.py`` files are exactly what ``protos/generate.py`` produces now."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from protos.generate import generate  # noqa: E402


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert written, "no proto files found"
    stale = []
    for path in written:
        committed = REPO_ROOT / path.relative_to(tmp_path)
        if not committed.exists() or committed.read_bytes() != path.read_bytes():
            stale.append(str(committed.relative_to(REPO_ROOT)))
    assert not stale, f"regenerate with `python protos/generate.py`: {stale}"


def test_every_protos_folder_is_a_package() -> None:
    for folder in [
        REPO_ROOT / "protos",
        *(p.parent for p in (REPO_ROOT / "protos").rglob("*.proto")),
    ]:
        assert (folder / "__init__.py").exists(), folder

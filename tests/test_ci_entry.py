""".ci/run runs exactly the README's test command (the code block under "Run the tests")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("Run the tests") :]
    block = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL)
    assert block is not None, "no bash block after 'Run the tests' in README.md"
    lines = [ln for ln in block[1].splitlines() if ln.strip()]
    assert len(lines) == 1, f"the README's test command must be one line, got {lines}"
    return lines[0].strip()


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [ln.strip() for ln in ci if ln.strip() and not ln.lstrip().startswith("#")]
    setup = {"set -euo pipefail", 'cd "$(dirname "$0")/.."'}
    assert [c for c in commands if c not in setup] == [readme_test_command()]

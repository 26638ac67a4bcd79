"""benchmarks/ab_checkouts.py: each checkout's code runs in its own process, rounds alternate."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ab_checkouts import alternate

# Imports `which` from the checkout given as argv[1]; appends to a log so the order shows.
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import which
with open(which.LOG, "a") as f:
    f.write(which.NAME + "\\n")
print("noise")
print("RESULT " + json.dumps({"value": which.value(), "const": 1.0}))
"""


def _tree(root: Path, name: str, body: str, log: Path) -> Path:
    tree = root / name
    tree.mkdir()
    (tree / "which.py").write_text(f"NAME = {name!r}\nLOG = {str(log)!r}\n{body}\n")
    return tree


def test_alternate_takes_each_trees_own_code_and_the_median_of_its_rounds(tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    counter = tmp_path / "count"
    # Tree a reports 1, 2, 30 over its rounds: the median is 2, not the mean.
    a = _tree(
        tmp_path,
        "a",
        f"import pathlib\nP = pathlib.Path({str(counter)!r})\n"
        "def value():\n"
        "    n = int(P.read_text()) if P.exists() else 0\n"
        "    P.write_text(str(n + 1))\n"
        "    return [1.0, 2.0, 30.0][n]",
        log,
    )
    b = _tree(tmp_path, "b", "def value():\n    return 7.0", log)
    medians = alternate([a, b], CHILD, rounds=3)
    assert medians == {a: {"value": 2.0, "const": 1.0}, b: {"value": 7.0, "const": 1.0}}
    assert log.read_text().split() == ["a", "b", "b", "a", "a", "b"]


def test_a_failing_child_names_its_tree_and_shows_its_error(tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    bad = _tree(tmp_path, "bad", "def value():\n    raise ValueError('kernel missing')", log)
    with pytest.raises(RuntimeError, match=r"(?s)in .*bad failed.*kernel missing"):
        alternate([bad], CHILD, rounds=1)

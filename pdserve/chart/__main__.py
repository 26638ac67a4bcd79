"""Write the chart's generated files from the values model.

python -m pdserve.chart           # rewrite values.schema.json, values.yaml, the docs reference
python -m pdserve.chart --check   # exit 1 if one of them is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdserve.chart.schema import render_schema
from pdserve.chart.values_yaml import render_reference, render_values_yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "pdserve"
DOC = ROOT / "docs" / "kubernetes.md"
START, END = "<!-- values-reference:start -->", "<!-- values-reference:end -->"


def _with_reference(doc: str) -> str:
    head, sep, rest = doc.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC} lacks the {START} ... {END} markers")
    return f"{head}{START}\n{render_reference()}{END}{tail}"


def expected() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    return {
        CHART / "values.schema.json": render_schema(),
        CHART / "values.yaml": render_values_yaml(),
        DOC: _with_reference(DOC.read_text(encoding="utf-8")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected().items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale: {', '.join(stale)}; run python -m pdserve.chart", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write pdserve's Grafana dashboards into helm/pdserve/dashboards/ (the chart).

python -m pdserve.dashboards           # rewrite helm/pdserve/dashboards/*.json
python -m pdserve.dashboards --check   # exit 1 if a JSON file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdserve.dashboards import render

OUT = Path(__file__).resolve().parents[2] / "helm" / "pdserve" / "dashboards"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help=f"directory (default {OUT})")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python -m pdserve.dashboards", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

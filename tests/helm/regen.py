"""Rewrite the golden rendered manifests (tests/helm/golden/<example>.yaml) after a chart change:

    python -m tests.helm.regen

then read the diff: it is exactly what the change does to each example's objects.
"""

from __future__ import annotations

from tests.helm.chart import EXAMPLES, GOLDEN_DIR, manifest_text, render_example


def main() -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in EXAMPLES:
        (GOLDEN_DIR / f"{name}.yaml").write_text(manifest_text(render_example(name)))
        print(f"wrote tests/helm/golden/{name}.yaml")


if __name__ == "__main__":
    main()

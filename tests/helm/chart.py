"""The chart as tests see it: rendered by Helm's own library (helm-python-sdk bundles Helm v4's
Go SDK as a C library), split into Kubernetes objects."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "pdserve"
EXAMPLES_DIR = CHART / "examples"
EXAMPLES = sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
RELEASE, NAMESPACE = "pdserve", "llm"
# Examples whose values pass flags pdserve does not have yet (see docs/kubernetes.md).
PENDING_EXAMPLES: set[str] = set()


def example_values(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES_DIR / f"{name}.yaml").read_text()) or {})


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text (as ``helm template``; NOTES.txt included)."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)


@cache
def render_example(name: str) -> dict[str, str]:
    return render(example_values(name))


def manifest_text(rendered: dict[str, str]) -> str:
    """One YAML stream like ``helm template`` prints: ``# Source:`` headers, sorted."""
    parts = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        for doc in rendered[path].split("\n---"):
            body = "\n".join(line.rstrip() for line in doc.strip("\n-").splitlines()).strip()
            if body:
                parts.append(f"---\n# Source: {path}\n{body}\n")
    return "".join(parts)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [
        doc for doc in yaml.safe_load_all(manifest_text(rendered)) if isinstance(doc, dict) and doc
    ]


@dataclass(frozen=True)
class Container:
    workload: dict[str, Any]  # the Deployment or StatefulSet
    pod: dict[str, Any]  # its pod spec
    spec: dict[str, Any]  # the container
    init: bool

    @property
    def role(self) -> str:
        return str(self.workload["metadata"]["labels"]["app.kubernetes.io/component"])


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def containers(objs: list[dict[str, Any]]) -> Iterator[Container]:
    for w in workloads(objs):
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []):
            yield Container(w, pod, c, True)
        for c in pod["containers"]:
            yield Container(w, pod, c, False)


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def lint(values: dict[str, Any], kube_version: str = "v1.30.0") -> dict[str, Any]:
    return dict(helm.lint(str(CHART), values, strict=True, kube_version=kube_version))

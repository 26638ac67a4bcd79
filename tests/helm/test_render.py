"""Every example is linted by Helm (--strict) and rendered by Helm's library; what it renders
is valid Kubernetes 1.30 and 1.37 (kubernetes-validate --strict), its custom resources are
valid for their operators' typed models, and it matches the golden manifests."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from cloudcoil.models.keda import v1alpha1 as keda
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator
from pydantic import BaseModel

from tests.helm.chart import (
    EXAMPLES,
    GOLDEN_DIR,
    example_values,
    lint,
    manifest_text,
    objects,
    render,
    render_example,
)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest whose
# schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
CUSTOM_RESOURCES: dict[str, type[BaseModel]] = {
    "ServiceMonitor": prometheus_operator.ServiceMonitor,
    "PodMonitor": prometheus_operator.PodMonitor,
    "PrometheusRule": prometheus_operator.PrometheusRule,
    "ScaledObject": keda.ScaledObject,
}
# Image volumes (model.source image) arrived in Kubernetes 1.31: 1.30 must refuse exactly them.
NEEDS_1_31 = {"external-redis"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_helm_lint_strict(example: str) -> None:
    report = lint(example_values(example))
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert not report["errors"] and not problems, report


def test_the_examples_are_the_ones_documented() -> None:
    assert EXAMPLES == ["cpu-tiny", "external-redis", "gpu-production", "keda", "tls"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_matches_golden_manifests(example: str) -> None:
    golden = GOLDEN_DIR / f"{example}.yaml"
    assert golden.exists(), "no golden file: python -m tests.helm.regen"
    assert manifest_text(render_example(example)) == golden.read_text(), (
        f"{example} renders differently from {golden.name}: if the change is intended, run "
        "python -m tests.helm.regen and review the diff"
    )


def _validate(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_object_is_valid_kubernetes(example: str, version: str) -> None:
    checked = 0
    for obj in objects(render_example(example)):
        if obj["kind"] in CUSTOM_RESOURCES:
            continue

        if example in NEEDS_1_31 and version == "1.30.0" and obj["kind"] == "Deployment":
            with pytest.raises(kubernetes_validate.ValidationError, match="'image' was unexpected"):
                _validate(obj, version)
            pod = obj["spec"]["template"]["spec"]
            pod["volumes"] = [v for v in pod["volumes"] if "image" not in v]
        _validate(obj, version)  # raises, naming the field, when invalid
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("example", EXAMPLES)
def test_custom_resources_match_their_typed_models(example: str) -> None:
    for obj in objects(render_example(example)):
        model = CUSTOM_RESOURCES.get(obj["kind"])
        if model is None:
            continue
        parsed = model.model_validate(obj)  # types and required fields
        # The models ignore unknown keys: a key lost on the way back was not in the CRD.
        back = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
        assert back == obj, f"{obj['kind']}/{obj['metadata']['name']} has keys its CRD lacks"


def test_custom_resources_are_covered() -> None:
    kinds = {o["kind"] for e in EXAMPLES for o in objects(render_example(e))}
    assert set(CUSTOM_RESOURCES) <= kinds
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    assert {"StatefulSet", "ConfigMap", "ServiceAccount"} <= kinds


def _nulls(node: Any, path: str) -> list[str]:
    if node is None:
        return [path]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _nulls(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _nulls(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_empty_blocks_render_as_null(example: str) -> None:
    """An empty `env:` or `volumes:` renders as null, which the API server takes but a
    strategic merge or a tool reading the spec may not."""
    for obj in objects(render_example(example)):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert not _nulls(obj, where)


def test_defaults_lint_and_render_valid_kubernetes() -> None:
    """`helm install` with no values at all: the demo model, one pod per role."""
    report = lint({})
    assert not report["errors"] and all(m["severity"] < 2 for m in report["messages"]), report
    objs = objects(render({}))
    for obj in objs:
        for version in KUBE_VERSIONS:
            _validate(obj, version)
    assert sorted({o["kind"] for o in objs}) == [
        "Deployment",
        "NetworkPolicy",
        "Service",
        "ServiceAccount",
    ]

"""The chart's dashboards and rule files (helm/pdserve/), as the queries Prometheus answers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO_ROOT / "helm" / "pdserve" / "dashboards"
RULES = REPO_ROOT / "helm" / "pdserve" / "rules"
RULE_FILES = sorted(RULES.glob("*.yaml"))
RULE_TESTS = sorted((RULES / "tests").glob("*.yaml"))

# A metric selector: a pdserve metric or recording rule, with its label matchers if any.
_SELECTOR = re.compile(r"\b(pdserve[_:][A-Za-z0-9_:]*)(\{[^}]*\})?")
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


@dataclass(frozen=True)
class Query:
    where: str  # "capacity.json: KV cache usage [A]" or "alerts.yaml: PdserveX"
    expr: str
    is_alert: bool = False  # alert expressions compare to a threshold: may return nothing


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    return expr


def dashboard_queries(variables: dict[str, str]) -> list[Query]:
    out = []
    for path in dashboard_files():
        for panel in load_dashboard(path)["panels"]:
            for target in panel.get("targets", []):  # a row header has none
                where = f"{path.name}: {panel['title']} [{target['refId']}]"
                out.append(Query(where, substitute(target["expr"], variables)))
    return out


def variable_queries(variables: dict[str, str]) -> list[tuple[str, str, str]]:
    """(where, selector, label) of every ``label_values`` template variable."""
    out = []
    for path in dashboard_files():
        for var in load_dashboard(path)["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = _LABEL_VALUES.match(var["query"]["query"])
            assert m, f"{path.name}: variable {var['name']} is not label_values(...)"
            out.append(
                (f"{path.name}: ${var['name']}", substitute(m.group(1), variables), m.group(2))
            )
    return out


def rule_queries() -> list[Query]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule["alert"]
                out.append(Query(f"{path.name}: {name}", rule["expr"], "alert" in rule))
    return out


def recorded_names() -> list[str]:
    return [
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]


def selectors(expr: str) -> list[str]:
    """Every pdserve metric / recording-rule selector in ``expr``, with its matchers."""
    return sorted({m.group(0) for m in _SELECTOR.finditer(expr)})


# The labels of pdserve_build_info besides role and model (pdserve/metrics/build_info.py).
BUILD_KEYS = ("version", "python", "attention_backend", "device", "torch")


def engine_build_labels() -> dict[str, str]:
    """What pdserve_build_info says of a process with an engine on this machine's CPU, found
    independently of the code under test: the package's version, this Python, this torch,
    and the attention backend the engine's selector picks here."""
    import platform

    import torch

    import pdserve
    from engine.attention.selector import get_attention_backend

    return {
        "version": pdserve.__version__,
        "python": platform.python_version(),
        "attention_backend": get_attention_backend(torch.device("cpu")).name,
        "device": "cpu",
        "torch": torch.__version__,
    }

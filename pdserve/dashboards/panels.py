"""Shared panel model and PromQL builders for pdserve's Grafana dashboards.

Every panel query uses the template variables ``$namespace``, ``$model`` (and ``$pool``, the
engine ``role``: prefill, decode, colocated where it applies) and Grafana's
``$__rate_interval``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEL = 'namespace=~"$namespace", model=~"$model"'
POOL = SEL + ', role=~"$pool"'
RI = "$__rate_interval"
DONE = SEL + ', reason=~"stop|length"'  # finished normally


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """A Grafana row header: the panels after it, up to the next row, belong to it."""

    title: str


def quantiles(
    metric: str, sel: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> tuple[Target, ...]:
    """p50/p95/p99 of a histogram, optionally per ``by`` label."""
    group = f"le, {by}" if by else "le"
    prefix = "{{" + by + "}} " if by else ""
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"{prefix}p{int(q * 100)}",
        )
        for q in qs
    )


def mean(metric: str, sel: str, by: str) -> Target:
    return Target(
        f"sum by ({by}) (rate({metric}_sum{{{sel}}}[{RI}]))"
        f" / sum by ({by}) (rate({metric}_count{{{sel}}}[{RI}]))",
        "{{" + by + "}}",
    )


def rate(metric: str, sel: str, by: str, legend: str | None = None) -> Target:
    return Target(
        f"sum by ({by}) (rate({metric}{{{sel}}}[{RI}]))",
        legend if legend is not None else "{{" + by.replace(", ", "}} {{") + "}}",
    )

"""pdserve's Grafana dashboards (plain JSON, Grafana 10/11 schema), generated from panel tables.

One module per dashboard (``slo_overview``, ``capacity``, ``transfer``) holds its panel table
(capacity ends with the ``control_plane`` row: registry, routing, KV index);
``panels`` the shared query builders; ``grafana`` the JSON layout. ``python -m
pdserve.dashboards`` writes them to ``helm/pdserve/dashboards/*.json``.
tests/observability/test_prometheus.py evaluates each query against a Prometheus scraping live
pdserve processes: a panel that shows nothing fails it.
"""

from __future__ import annotations

import json

from pdserve.dashboards import capacity, slo_overview, transfer
from pdserve.dashboards.grafana import build
from pdserve.dashboards.panels import Panel, Row

DASHBOARDS: dict[str, tuple[str, tuple[Panel | Row, ...]]] = {
    "slo-overview": (slo_overview.TITLE, slo_overview.PANELS),
    "capacity": (capacity.TITLE, capacity.PANELS),
    "transfer": (transfer.TITLE, transfer.PANELS),
}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        f"{uid}.json": json.dumps(build(uid, title, panels), indent=2) + "\n"
        for uid, (title, panels) in DASHBOARDS.items()
    }

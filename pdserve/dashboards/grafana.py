"""Grafana 10/11 dashboard JSON (schema 39) from a tuple of :class:`Panel`."""

from __future__ import annotations

from typing import Any

from pdserve.dashboards.panels import Panel, Row

DS = {"type": "prometheus", "uid": "${datasource}"}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    q = f"label_values({query}, {label})"
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "definition": q,
        "query": {"query": q, "refId": f"var-{name}", "qryType": 1},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
    if p.extra.get("stack"):
        custom["stacking"] = {"mode": "normal", "group": "A"}
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.kind == "timeseries":
        defaults["custom"] = custom
    if "max" in p.extra:
        defaults["max"] = p.extra["max"]
        defaults["min"] = 0
    panel: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": t.expr, "legendFormat": t.legend}
            for i, t in enumerate(p.targets)
        ],
    }
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}
        }
    return panel


def _row(r: Row, pid: int, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": r.title,
        "collapsed": False,
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
        "panels": [],
    }


def build(uid: str, title: str, panels: tuple[Panel | Row, ...]) -> dict[str, Any]:
    laid_out: list[dict[str, Any]] = []
    x, y = 0, 0
    for i, p in enumerate(panels, start=1):
        if isinstance(p, Row):
            if x > 0:
                x, y = 0, y + 8
            laid_out.append(_row(p, i, y))
            y += 1
            continue
        if x + p.width > 24:
            x, y = 0, y + 8
        laid_out.append(_panel(p, i, x, y))
        x += p.width
    engine = "pdserve_engine_steps_total"
    return {
        "uid": f"pdserve-{uid}",
        "title": title,
        "tags": ["pdserve"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "namespace", engine),
                _variable("model", "model", f'{engine}{{namespace=~"$namespace"}}'),
                _variable("pool", "role", f'{engine}{{namespace=~"$namespace", model=~"$model"}}'),
            ]
        },
        "panels": laid_out,
    }

"""helm/pdserve/dashboards: the JSON ``python -m pdserve.dashboards`` makes; panels well formed."""

from __future__ import annotations

import subprocess
import sys

from tests.observability.assets import REPO_ROOT, dashboard_files, load_dashboard, selectors


def test_generated_json_is_fresh() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pdserve.dashboards", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_panels_are_well_formed() -> None:
    files = dashboard_files()
    assert {p.stem for p in files} == {"slo-overview", "capacity", "transfer"}
    uids = set()
    for path in files:
        board = load_dashboard(path)
        uids.add(board["uid"])
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "namespace", "model", "pool"} <= variables, path.name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in board["panels"]:
            where = f"{path.name}: {panel['title']}"
            if panel["type"] == "row":  # a header: the panels after it carry the queries
                assert panel["gridPos"]["w"] == 24 and not panel["panels"], where
                continue
            grid = panel["gridPos"]
            assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, where
            assert panel["datasource"]["uid"] == "${datasource}", where
            assert panel["targets"], where
            for target in panel["targets"]:
                expr = target["expr"]
                assert selectors(expr), f"{where}: reads no pdserve metric"
                assert "$namespace" in expr and "$model" in expr, f"{where}: ignores filters"
    assert len(uids) == len(files)

"""helm/pdserve/rules: promtool accepts every rule file and its unit tests pass."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.observability.assets import RULE_FILES, RULE_TESTS, rule_queries, selectors

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; CI installs it)"
)


@needs_promtool
def test_promtool_check_rules() -> None:
    assert PROMTOOL is not None
    r = subprocess.run(
        [PROMTOOL, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests() -> None:
    assert PROMTOOL is not None and RULE_TESTS
    r = subprocess.run(
        [PROMTOOL, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_and_reads_pdserve_metrics() -> None:
    tested = "".join(p.read_text() for p in RULE_TESTS)
    for q in rule_queries():
        assert selectors(q.expr), f"{q.where} reads no pdserve metric"
        if q.is_alert:
            name = q.where.split(": ")[1]
            assert f"alertname: {name}" in tested, f"{name} has no promtool test"

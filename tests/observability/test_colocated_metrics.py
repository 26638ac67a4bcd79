"""`pdserve serve --colocated`: one /metrics on the router's HTTP port carries the router's
request metrics and the in-process engine's, in valid exposition format."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TINY_ARCHS
from tests.observability.assets import engine_build_labels
from tests.router.server_harness import start_server


def test_colocated_metrics(model_factory: Any) -> None:
    model = model_factory("llama", **TINY_ARCHS["llama"])
    srv = start_server(model, "--num-kv-blocks", "64", "--slo-ttft-ms", "30000")
    try:
        for stream in (False, True):
            body = {"model": "tiny", "prompt": "hello metrics", "max_tokens": 4, "stream": stream}
            r = httpx.post(f"{srv.http_url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200
        srv.wait_pool_free()
        r = httpx.get(f"{srv.http_url}/metrics", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = list(text_string_to_metric_families(r.text))
        names = [f.name for f in families]
        assert len(names) == len(set(names)), "a metric family is exposed twice"
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
        }

        def value(name: str, **labels: str) -> float:
            key = (name, tuple(sorted({"role": "colocated", "model": "tiny", **labels}.items())))
            assert key in samples, f"{name}{labels} missing"
            return samples[key]

        assert value("pdserve_request_finished_total", reason="length") == 2
        assert value("pdserve_request_generation_tokens_total") == 8
        assert value("pdserve_engine_generation_tokens_total") == 8
        assert value("pdserve_engine_kv_blocks") == 64
        assert value("pdserve_goodput_requests_total") == 2
        assert value("pdserve_router_healthy_workers", pool="decode") == 1
        for stage in ("router_queue", "prefill_queue", "prefill_compute"):
            assert value("pdserve_request_ttft_stage_seconds_count", stage=stage) == 2
        assert any(n.startswith("process_") for n in names)
        build = [s.labels for f in families for s in f.samples if s.name == "pdserve_build_info"]
        assert build == [{"role": "colocated", "model": "tiny", **engine_build_labels()}]
    finally:
        assert srv.stop() == 0

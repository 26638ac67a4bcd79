"""``pdserve bench`` against a real ``pdserve serve --colocated`` on a tiny model: closed loop
over HTTP, open loop with cancels over HTTP, closed loop over gRPC; the JSON report's counts,
token counts per request, tokens/s > 0, the plots, and a KV pool left free."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdserve.bench.distributions import LengthDist
from pdserve.bench.workload import WorkloadSpec, generate_requests
from pdserve.cli import main
from tests.conftest import TINY_ARCHS
from tests.router.server_harness import Server, start_server

WORKLOAD = ["--prompt-len", "uniform:8:40", "--output-len", "uniform:2:12", "--seed", "5"]


@pytest.fixture(scope="module")
def server(model_factory: Any) -> Iterator[Server]:
    s = start_server(model_factory("llama", **TINY_ARCHS["llama"]), "--num-kv-blocks", "64")
    yield s
    assert s.stop() == 0, "".join(s.lines)


def bench(out: Path, *args: str) -> dict[str, Any]:
    assert main(["bench", *args, *WORKLOAD, "--out", str(out), "--no-progress"]) == 0
    return dict(json.loads((out / "results.json").read_text()))


def expected_max_tokens(num_requests: int) -> list[int]:
    spec = WorkloadSpec(
        num_requests, LengthDist.parse("uniform:8:40"), LengthDist.parse("uniform:2:12"), seed=5
    )
    return [r.max_tokens for r in generate_requests(spec)]


def test_closed_loop_http(server: Server, tmp_path: Path) -> None:
    report = bench(
        tmp_path,
        "--url", server.http_url, "--concurrency", "3", "--num-requests", "8",
        "--slo", "ttft=30s,itl=10s", "--warmup-requests", "2",
    )  # fmt: skip
    assert report["model"] == "tiny" and report["num_warmup"] == 2
    (point,) = report["points"]
    s = point["summary"]
    assert (s["num_requests"], s["num_completed"], s["num_failed"], s["num_cancelled"]) == (
        8, 8, 0, 0,
    )  # fmt: skip
    assert s["output_token_throughput"] > 0 and s["input_token_throughput"] > 0
    records = point["records"]
    assert [r["index"] for r in records] == list(range(8))
    # ignore_eos: every request generated exactly its drawn length, counted from usage.
    assert [r["num_output_tokens"] for r in records] == expected_max_tokens(8)
    assert all(r["usage_reported"] and r["finish_reason"] == "length" for r in records)
    assert s["total_output_tokens"] == sum(expected_max_tokens(8))
    assert all(8 <= r["num_prompt_tokens"] <= 40 for r in records)
    assert s["ttft_ms"]["n"] == 8 and s["num_good"] == 8 and point["is_slo_held"] is True
    assert report["capacity"] == {"kind": "closed", "value": 3}
    assert report["config"]["load"]["concurrency"] == [3]
    for png in ("latency_vs_load.png", "throughput_vs_load.png", "latency_cdf.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "[workload]" in (tmp_path / "config.toml").read_text()
    server.wait_pool_free()
    # Side by side (here: the run with itself): a table and the CDFs, nothing sent.
    cmp = tmp_path / "cmp"
    assert (
        main(
            ["bench", "--compare", str(tmp_path), str(tmp_path / "results.json"), "--out", str(cmp)]
        )
        == 0
    )
    assert (cmp / "compare_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_open_loop_http_with_cancels_sweep(server: Server, tmp_path: Path) -> None:
    report = bench(
        tmp_path,
        "--url", server.http_url, "--rate", "8,30", "--num-requests", "10",
        "--cancel-fraction", "0.4", "--api", "chat", "--no-plots",
    )  # fmt: skip
    assert [p["load"] for p in report["points"]] == [
        {"kind": "open", "value": 8.0, "max_concurrency": None},
        {"kind": "open", "value": 30.0, "max_concurrency": None},
    ]
    for point in report["points"]:
        s = point["summary"]
        assert s["num_failed"] == 0, s["errors"]
        assert s["num_completed"] + s["num_cancelled"] == 10 and s["num_cancelled"] >= 1
        assert s["output_token_throughput"] > 0 and s["request_throughput"] > 0
        cancelled = [r for r in point["records"] if r["status"] == "cancelled"]
        assert all(r["num_output_tokens"] >= 1 for r in cancelled)
    assert not (tmp_path / "latency_cdf.png").exists()
    server.wait_pool_free()  # cancelled streams freed their KV blocks


def test_closed_loop_grpc(server: Server, tmp_path: Path) -> None:
    report = bench(
        tmp_path, "--url", f"grpc://{server.grpc_address}", "--concurrency", "2",
        "--num-requests", "5", "--no-plots", "--warmup-requests", "0",
    )  # fmt: skip
    s = report["points"][0]["summary"]
    assert (s["num_completed"], s["num_failed"]) == (5, 0), s["errors"]
    assert s["total_output_tokens"] == sum(expected_max_tokens(5))
    assert s["output_token_throughput"] > 0 and s["itl_ms"]["n"] > 0
    records = report["points"][0]["records"]
    assert [r["num_output_tokens"] for r in records] == expected_max_tokens(5)
    server.wait_pool_free()


def test_open_loop_grpc_with_cancels(server: Server, tmp_path: Path) -> None:
    report = bench(
        tmp_path, "--url", f"grpc://{server.grpc_address}", "--rate", "20",
        "--num-requests", "8", "--cancel-fraction", "0.5", "--no-plots",
    )  # fmt: skip
    s = report["points"][0]["summary"]
    assert s["num_failed"] == 0, s["errors"]
    assert s["num_completed"] + s["num_cancelled"] == 8 and s["num_cancelled"] >= 1
    server.wait_pool_free()  # cancelled calls freed their KV blocks


def test_unreachable_target_fails_cleanly(tmp_path: Path) -> None:
    argv = ["bench", "--url", "http://127.0.0.1:9/v1", "--num-requests", "1", "--no-progress"]
    assert main(argv) == 1


def test_background_bursts_are_reported_apart(server: Server, tmp_path: Path) -> None:
    report = bench(
        tmp_path, "--url", server.http_url, "--concurrency", "2", "--num-requests", "6",
        "--warmup-requests", "0", "--no-plots", "--burst-size", "2", "--burst-start-s", "0",
        "--burst-interval-s", "0.2", "--burst-prompt-len", "fixed:48", "--burst-output-len", "2",
    )  # fmt: skip
    (point,) = report["points"]
    assert point["summary"]["num_completed"] == 6  # the foreground alone
    assert [r["num_output_tokens"] for r in point["records"]] == expected_max_tokens(6)
    bursts = point["bursts"]
    records = bursts["records"]
    assert len(records) >= 2 and len(records) % 2 == 0  # whole bursts of 2, the first at 0 s
    assert [r["index"] for r in records] == list(range(len(records)))
    assert all(r["status"] == "ok" for r in records), bursts["summary"]["errors"]
    assert all(r["num_prompt_tokens"] == 48 and r["num_output_tokens"] == 2 for r in records)
    assert bursts["summary"]["num_completed"] == len(records)
    starts = sorted({round(r["start_s"], 1) for r in records})
    assert starts[0] == 0.0
    server.wait_pool_free()


def test_serving_experiments_driver_reads_a_real_run(server: Server, tmp_path: Path) -> None:
    """benchmarks/serving_experiments.py: its figures come from a real results.json, its engine
    counters from the server's real /metrics, and a variant's config reruns with its server."""
    import tomllib

    from benchmarks.serving_experiments import _record_server, engine_counters, figures

    report = bench(tmp_path, "--url", server.http_url, "--concurrency", "2", "--num-requests", "4")
    f = figures(report)
    assert f["completed"] == 4 and f["failed"] == 0 and f["output_tok_s"] > 0
    assert f["ttft_p50_ms"] > 0 and f["e2e_p99_ms"] >= f["e2e_p50_ms"]
    counters = engine_counters(server.http_url.removesuffix("/v1") + "/metrics")
    assert counters["steps"] > 0 and counters["mean_batch"] >= 1
    assert {"preempt_swap", "preempt_recompute", "swapped_blocks_out"} <= set(counters)
    _record_server(tmp_path / "config.toml", "pdserve serve --colocated")
    rerun = tomllib.loads((tmp_path / "config.toml").read_text())
    assert rerun["server"]["command"] == "pdserve serve --colocated"
    assert rerun["workload"]["prompt_len"] == "uniform:8:40"
    server.wait_pool_free()

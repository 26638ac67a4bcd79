"""The real half of ``simulator_validation.py``: each deployment shape started for real on this
machine's two cores (workers pinned, ports drawn by ``pdserve.ports``), ``pdserve bench`` run
against it, every worker's ``/metrics`` scraped, the processes stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.http_ready import wait_http_ok  # noqa: E402
from pdserve.bench.metrics import Summary  # noqa: E402
from pdserve.ports import free_port  # noqa: E402

MODEL = Path.home() / ".cache" / "pdserve" / "bench" / "smollm2-135m-shape-random-fp32"

# name -> (prefill cpus, decode cpus, core groups for the simulation)
SHAPES: dict[str, tuple[list[int], list[int], list[dict[str, Any]]]] = {
    "1P1D": ([0], [1], []),
    "1P2D": ([0], [1, 1], [{"cores": 1, "workers": ["decode-0", "decode-1"]}]),
    "2P1D": ([0, 1], [1], [{"cores": 1, "workers": ["prefill-1", "decode-0"]}]),
    "colocated": ([], [0], []),
}


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _start(cmd: list[str], cpus: list[int], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(
        ["taskset", "-c", ",".join(map(str, cpus)), *cmd],
        env=_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def run_real(name: str, config_path: Path, out: Path) -> Summary:
    """Start the shape's processes, run ``pdserve bench``, stop them."""
    return run_benches(name, [(name, config_path)], out)[name]


def run_benches(name: str, benches: list[tuple[str, Path]], out: Path) -> dict[str, Summary]:
    """Start shape ``name``'s processes, run ``pdserve bench`` with each (label, config) in
    turn (results in ``out/real-LABEL``), scrape every worker's /metrics into the last
    one's folder, stop them."""
    from pdserve.launch import wait_healthy

    prefill_cpus, decode_cpus, _ = SHAPES[name]
    procs: list[subprocess.Popen[bytes]] = []
    http = free_port()
    metrics: dict[str, list[str]] = {"prefill": [], "decode": []}
    py = [sys.executable, "-m", "pdserve.cli"]
    front = ["--grpc-port", "0", "--http-port", str(http)]  # the router's (or colocated server's)
    try:
        if name == "colocated":
            serve = [*py, "serve", "--colocated", "--model", str(MODEL), *front]
            procs.append(_start(serve, decode_cpus, out / f"{name}-serve.log"))
            metrics["decode"].append(f"http://127.0.0.1:{http}/metrics")
        else:
            targets: dict[str, list[str]] = {"prefill": [], "decode": []}
            for role, cpus_list in (("decode", decode_cpus), ("prefill", prefill_cpus)):
                for i, cpu in enumerate(cpus_list):
                    port = free_port()
                    mport = free_port()
                    metrics[role].append(f"http://127.0.0.1:{mport}/metrics")
                    extra = ["--metrics-port", str(mport)]
                    if role == "decode":
                        extra += ["--kv-transport", "tcp", "--kv-port", str(free_port())]
                    else:
                        extra += ["--max-num-batched-tokens", "4096"]
                    p = _start(
                        [*py, role, "--port", str(port), "--model", str(MODEL), *extra],
                        [cpu],
                        out / f"{name}-{role}-{i}.log",
                    )
                    procs.append(p)
                    wait_healthy(f"127.0.0.1:{port}", p, 300)
                    targets[role].append(f"127.0.0.1:{port}")
            cmd = [*py, "router", "--model", str(MODEL), *front]
            for t in targets["prefill"]:
                cmd += ["--prefill", t]
            for t in targets["decode"]:
                cmd += ["--decode", t]
            procs.append(_start(cmd, [0, 1], out / f"{name}-router.log"))
        wait_http_ok(f"http://127.0.0.1:{http}/health", 300, procs[-1])
        summaries = {}
        for label, config_path in benches:
            res = out / f"real-{label}"
            subprocess.run(
                [
                    *py,
                    "bench",
                    "--url",
                    f"http://127.0.0.1:{http}/v1",
                    "--config",
                    str(config_path),
                    "--out",
                    str(res),
                ],
                env=_env(),
                check=True,
                stdout=subprocess.DEVNULL,
            )
            summaries[label] = read_summary(res / "results.json")
        from pdserve.plan.calibrate import fetch_metrics

        scraped = {role: [fetch_metrics(u) for u in urls] for role, urls in metrics.items()}
        (res / "metrics.json").write_text(json.dumps(scraped), encoding="utf-8")
        return summaries
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def read_summary(path: Path) -> Summary:
    from pdserve.bench.metrics import summarize
    from pdserve.bench.records import RequestRecord

    data = json.loads(path.read_text(encoding="utf-8"))
    p = data["points"][0]
    records = [RequestRecord.from_json(r) for r in p["records"]]
    return summarize(records, float(p["summary"]["duration_s"]), _slo())


def _slo() -> Any:
    from pdserve.bench.metrics import Slo

    return Slo()

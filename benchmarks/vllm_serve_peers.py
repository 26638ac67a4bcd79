"""Serving, side by side: vLLM's own client (``vllm bench serve``) against ``pdserve serve
--colocated``, ``pdserve serve`` (disaggregated) and vLLM-CPU's OpenAI server, one server at a
time, the same random requests for each (issue 18's serving target)::

    python benchmarks/vllm_serve_peers.py --servers pdserve-colocated,vllm,pdserve \\
        --vllm-python /work/venvs/vllm/bin/python --out /tmp/serve-peers.json

Every server serves the offline benchmark's model folder (SmolLM2-135M shape, random weights,
fp32) on loopback. The client (vLLM's ``vllm.benchmarks.serve`` run as a library in vLLM's venv,
see /work/shared/PEERS.md) sends ``--num-prompts`` random prompts of ``--input-len`` ±
``--range-ratio`` tokens with ``--output-len`` ± the same ratio output tokens, EOS ignored,
``--max-concurrency`` in flight, seed 0, to ``/v1/completions``. Each server is started, waited
for (``GET /v1/models``), measured once, and stopped (its whole process group) before the next.
The 1-minute load average is printed beside each run: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.http_ready import wait_http_ok  # noqa: E402
from benchmarks.vllm_bench_client import _CLIENT  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    add_checkpoint_dtype,
    default_model_dir,
    ensure_model_folder,
)
from pdserve.ports import free_port  # noqa: E402

SERVERS = ("pdserve-colocated", "pdserve", "vllm")
NAME = "bench-model"


def server_command(
    kind: str, model: str, port: int, vllm_python: str, kv_gib: int, extra: Sequence[str] = ()
) -> list[str]:
    if kind == "vllm":
        return [
            vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
            "--kv-cache-memory-bytes", str(kv_gib << 30), "--served-model-name", NAME,
        ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "pdserve", "serve", "--model", model, "--dtype", "float32",
        "--kv-cache-memory-gb", str(kv_gib), "--host", "127.0.0.1", "--http-port", str(port),
        "--grpc-port", "0", "--served-model-name", NAME,
    ]  # fmt: skip
    if kind == "pdserve-colocated":
        return [*cmd, "--colocated", *extra]
    return [
        *cmd, *extra, "--prefill-port", "0", "--decode-port", "0",
        "--decode-metrics-port", "-1", "--prefill-metrics-port", "-1",
    ]  # fmt: skip


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def run_client(a: argparse.Namespace, url: str, model: str, results: str, name: str) -> Any:
    argv = [
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--served-model-name", NAME, "--tokenizer", model,
        "--dataset-name", "random", "--random-input-len", str(a.input_len),
        "--random-output-len", str(a.output_len), "--random-range-ratio", str(a.range_ratio),
        "--num-prompts", str(a.num_prompts), "--max-concurrency", str(a.max_concurrency),
        "--ignore-eos", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", results, "--result-filename", f"{name}.json",
    ]  # fmt: skip
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    done = subprocess.run(
        [a.vllm_python, "-c", _CLIENT, *argv], env=env, cwd=results,
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise RuntimeError(f"vllm bench serve failed against {name}")
    return json.loads((Path(results) / f"{name}.json").read_text())


def measure(a: argparse.Namespace, kind: str, model: str, results: str) -> dict[str, Any]:
    port = free_port()
    extra = () if kind == "vllm" else shlex.split(a.pdserve_args)
    cmd = server_command(kind, model, port, a.vllm_python, a.kv_cache_gib, extra)
    log = Path(results) / f"{kind}.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/v1/models", a.ready_timeout, server, interval_s=1.0)
        load_before = os.getloadavg()[0]
        r = run_client(a, url, model, results, kind)
        load_after = os.getloadavg()[0]
    except Exception:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        stop(server)
    return {
        "server": kind,
        "command": " ".join(cmd[1:]),
        "completed": r["completed"],
        "failed": r["failed"],
        "total_output_tokens": r["total_output_tokens"],
        "output_tok_s": r["output_throughput"],
        "ttft_p50_ms": r["median_ttft_ms"],
        "tpot_p50_ms": r["median_tpot_ms"],
        "itl_p50_ms": r["median_itl_ms"],
        "itl_p99_ms": r["p99_itl_ms"],
        "duration_s": r["duration"],
        "load_1min": [round(load_before, 2), round(load_after, 2)],
        "errors": [e for e in r.get("errors", []) if e][:3],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(SERVERS), help="subset of " + ",".join(SERVERS))
    ap.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: by the next")
    add_checkpoint_dtype(ap)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--input-len", type=int, default=384)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.5, help="lengths are len x (1 ± r)")
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, help="write the results here (JSON)")
    ap.add_argument(
        "--pdserve-args",
        default="",
        help="more flags for both pdserve servers, e.g. '--max-num-batched-tokens 512'",
    )
    a = ap.parse_args()
    kinds = [s.strip() for s in a.servers.split(",") if s.strip()]
    unknown = sorted(set(kinds) - set(SERVERS))
    if unknown:
        ap.error(f"unknown servers {unknown}; choose from {', '.join(SERVERS)}")
    folder = a.model_dir or default_model_dir("smollm2-135m", a.checkpoint_dtype)
    model = str(ensure_model_folder(folder, checkpoint_dtype=a.checkpoint_dtype))
    rows = []
    with tempfile.TemporaryDirectory() as results:
        for kind in kinds:
            row = measure(a, kind, model, results)
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = next((r for r in rows if r["server"] == "vllm"), None)
    print(f"\n{'server':<18} {'ok':>6} {'tok/s':>7} {'x vLLM':>7} {'TTFT p50':>9} "
          f"{'TPOT p50':>9} {'ITL p99':>8}  load")  # fmt: skip
    for r in rows:
        ratio = f"{r['output_tok_s'] / base['output_tok_s']:.2f}" if base else "-"
        print(
            f"{r['server']:<18} {r['completed']:>3}/{a.num_prompts:<2} {r['output_tok_s']:>7.1f} "
            f"{ratio:>7} {r['ttft_p50_ms'] / 1e3:>8.1f}s {r['tpot_p50_ms']:>7.0f}ms "
            f"{r['itl_p99_ms']:>6.0f}ms  {r['load_1min'][0]:.1f}-{r['load_1min'][1]:.1f}"
        )
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Serving experiments of issue 6, each one command that runs every variant with `pdserve bench`
against a freshly started `pdserve serve`, then prints the figures side by side with ratios.

    python benchmarks/serving_experiments.py batching        --out out/batching
    python benchmarks/serving_experiments.py disaggregation  --out out/disaggregation
    python benchmarks/serving_experiments.py peers           --out out/peers
    python benchmarks/serving_experiments.py preemption      --out out/preemption
    python benchmarks/serving_experiments.py preemption-heavy --out out/preemption-heavy

- ``batching``: continuous vs static batching (``--batching static``: a new batch only after the
  previous one drained) on a high-variance output-length workload; output tokens/s ratio.
- ``disaggregation``: streaming requests in the foreground with and without background bursts
  of long prompts, against disaggregated serving (prefill pinned to core 0, decode to core 1)
  and a colocated engine on both cores; ITL/TTFT percentiles, goodput, and each mode's ITL p99
  with bursts over its ITL p99 without.
- ``peers``: pdserve (disaggregated and colocated), vLLM's CPU build and ``transformers serve``
  (continuous batching) on one workload (docs/bench/peers/: each file's own server command).
- ``preemption``: long contexts with a KV pool too small for them all, swap vs recompute.

The workloads are the TOML files in docs/bench/ (one per experiment); the server commands, which
differ between variants, are built here. Each variant's folder under ``--out`` holds the
effective config.toml (rerun one variant with ``pdserve bench --config OUT/VARIANT/config.toml``),
results.json, plots and the server's log; ``--out`` itself gets comparison CDFs and summary.json.
The model is the SmolLM2-135M-shaped random-weight Llama of offline_throughput.py, in fp32.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from benchmarks.workloads import DEFAULT_MODEL_DIR, ensure_model_folder  # noqa: E402

CONFIGS = REPO_ROOT / "docs" / "bench"
PORT = 8123  # the configs' target URL


@dataclass(frozen=True)
class Variant:
    label: str
    # After `pdserve serve --model DIR --dtype float32 ...`; None: the config's own [server]
    # command and [target] url (a peer server).
    server_args: tuple[str, ...] | None
    bench_args: tuple[str, ...] = ()  # extra `pdserve bench` flags (on top of the config)
    config: str | None = None  # a file under docs/bench/ instead of the experiment's


def _serve(model: Path, *args: str) -> str:
    base = ["pdserve", "serve", "--model", str(model), "--dtype", "float32"]
    return shlex.join([*base, "--http-port", str(PORT), "--grpc-port", "0", *args])


def _preemption_variants(num_kv_blocks: int) -> list[Variant]:
    """Swap and recompute, colocated, with a KV pool of ``num_kv_blocks`` blocks."""
    return [
        Variant(
            mode, ("--colocated", "--num-kv-blocks", str(num_kv_blocks), "--preemption-mode", mode)
        )
        for mode in ("swap", "recompute")
    ]


EXPERIMENTS: dict[str, tuple[str, list[Variant]]] = {
    "batching": (
        "batching.toml",
        [
            Variant(
                "continuous", ("--colocated", "--max-num-seqs", "32", "--batching", "continuous")
            ),
            Variant("static", ("--colocated", "--max-num-seqs", "32", "--batching", "static")),
        ],
    ),
    "disaggregation": (
        "disaggregation.toml",
        [
            Variant(
                "disagg-quiet", ("--prefill-cpus", "0", "--decode-cpus", "1"), ("--burst-size", "0")
            ),
            Variant("disagg-bursts", ("--prefill-cpus", "0", "--decode-cpus", "1")),
            Variant(
                "disagg-ucx-bursts",
                ("--prefill-cpus", "0", "--decode-cpus", "1", "--kv-transport", "ucx"),
            ),
            Variant("colocated-quiet", ("--colocated",), ("--burst-size", "0")),
            Variant("colocated-bursts", ("--colocated",)),
        ],
    ),
    "peers": (
        "peers/pdserve.toml",
        [
            Variant("pdserve", None),
            Variant("pdserve-colocated", ("--colocated", "--kv-cache-memory-gb", "2")),
            Variant("vllm", None, config="peers/vllm.toml"),
            Variant("hf-serve", None, config="peers/hf_serve.toml"),
        ],
    ),
    "preemption-heavy": ("preemption_heavy.toml", _preemption_variants(192)),
    "preemption": ("preemption.toml", _preemption_variants(256)),
}


def run_variant(
    config: Path, model: Path, v: Variant, out: Path, server_extra: list[str]
) -> tuple[dict[str, Any], dict[str, float]]:
    """Start the variant's server, run `pdserve bench` against it, scrape the server's engine
    counters (colocated: the router's /metrics carries them) before stopping it."""
    from pdserve.bench.server_launch import launched_server

    folder = out / v.label
    folder.mkdir(parents=True, exist_ok=True)
    if v.config:
        config = CONFIGS / v.config
    if v.server_args is None:
        table = tomllib.loads(config.read_text())
        server, url = table["server"]["command"], table["target"]["url"]
    else:
        server = _serve(model, *v.server_args, *server_extra)
        url = f"http://127.0.0.1:{PORT}/v1"
    bench = [
        sys.executable, "-m", "pdserve", "bench", "--config", str(config), "--url", url,
        "--out", str(folder), "--no-progress", *v.bench_args,
    ]  # fmt: skip
    (folder / "command.txt").write_text(f"{server}\n{shlex.join(bench)}\n")
    print(f"\n=== {v.label}\nserver: {server}\nbench:  {shlex.join(bench)}", flush=True)
    t = time.perf_counter()
    with launched_server(server, url, 600, folder / "server.log"):
        print(f"=== {v.label}: server ready after {time.perf_counter() - t:.0f}s", flush=True)
        rc = subprocess.run(bench, check=False).returncode
        counters = engine_counters(url.removesuffix("/v1") + "/metrics")
    print(f"=== {v.label}: exit {rc} after {time.perf_counter() - t:.0f}s", flush=True)
    (folder / "counters.json").write_text(json.dumps(counters))
    _record_server(folder / "config.toml", server)
    if rc != 0:
        raise SystemExit(f"variant {v.label} failed (exit {rc}); see {folder}")
    return dict(json.loads((folder / "results.json").read_text())), counters


def _record_server(config_file: Path, server: str) -> None:
    """Put the server command into the variant's effective config, so that
    ``pdserve bench --config OUT/VARIANT/config.toml`` reruns it whole (server included)."""
    from pdserve.bench.config import BenchConfig, to_toml

    if not config_file.exists():
        return
    config = BenchConfig.from_dict(tomllib.loads(config_file.read_text()))
    config.server.command = server
    config_file.write_text(to_toml(config), encoding="utf-8")


def engine_counters(url: str) -> dict[str, float]:
    """Steps, mean requests per step, preemptions and swapped blocks, when the endpoint has
    them (a colocated server); empty otherwise."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(url, timeout=10, trust_env=False)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}  # a peer server without Prometheus metrics
    got: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(response.text))
    except ValueError:
        return {}  # not Prometheus text
    for family in families:
        for sample in family.samples:
            n, labels = sample.name, sample.labels
            if n == "pdserve_engine_steps_total":
                got["steps"] = sample.value
            elif n == "pdserve_engine_step_requests_sum":
                got["step_requests_sum"] = sample.value
            elif n == "pdserve_engine_step_requests_count":
                got["step_requests_count"] = sample.value
            elif n == "pdserve_engine_preemptions_total":
                got[f"preempt_{labels['mode']}"] = sample.value
            elif n == "pdserve_engine_swapped_blocks_total":
                got[f"swapped_blocks_{labels['direction']}"] = sample.value
    if got.get("step_requests_count"):
        got["mean_batch"] = got.pop("step_requests_sum") / got.pop("step_requests_count")
    return got


def _p(summary: dict[str, Any], name: str, q: str) -> float:
    s = summary.get(name)
    return float("nan") if not s else float(s[q])


def figures(report: dict[str, Any]) -> dict[str, float]:
    """The headline figures of a one-point run."""
    (point,) = report["points"]
    s = point["summary"]
    f = {
        "completed": s["num_completed"],
        "failed": s["num_failed"],
        "output_tok_s": s["output_token_throughput"],
        "ttft_p50_ms": _p(s, "ttft_ms", "p50"),
        "ttft_p99_ms": _p(s, "ttft_ms", "p99"),
        "itl_p50_ms": _p(s, "itl_ms", "p50"),
        "itl_p99_ms": _p(s, "itl_ms", "p99"),
        "tpot_p50_ms": _p(s, "tpot_ms", "p50"),
        "e2e_p50_ms": _p(s, "e2e_ms", "p50"),
        "e2e_p99_ms": _p(s, "e2e_ms", "p99"),
        "goodput": float("nan") if s["goodput"] is None else s["goodput"],
        "slo_attainment": float("nan") if s["slo_attainment"] is None else s["slo_attainment"],
    }
    if point.get("bursts"):
        b = point["bursts"]["summary"]
        f["burst_requests"] = b["num_completed"]
        f["burst_ttft_p50_ms"] = _p(b, "ttft_ms", "p50")
    return f


def ratios(name: str, fig: dict[str, dict[str, float]]) -> list[str]:
    if name == "batching":
        c, s = fig["continuous"], fig["static"]
        return [f"continuous / static output tok/s: {c['output_tok_s'] / s['output_tok_s']:.2f}x"]
    if name == "disaggregation":
        lines = []
        for mode in ("disagg", "colocated"):
            q, b = fig[f"{mode}-quiet"], fig[f"{mode}-bursts"]
            lines.append(
                f"{mode}: ITL p99 with bursts / without: "
                f"{b['itl_p99_ms'] / q['itl_p99_ms']:.2f}x "
                f"({b['itl_p99_ms']:.0f} / {q['itl_p99_ms']:.0f} ms); "
                f"ITL p50 {b['itl_p50_ms'] / q['itl_p50_ms']:.2f}x; "
                f"TTFT p99 {b['ttft_p99_ms'] / q['ttft_p99_ms']:.2f}x"
            )
        d, c = fig["disagg-bursts"], fig["colocated-bursts"]
        if "disagg-ucx-bursts" in fig:
            u, q = fig["disagg-ucx-bursts"], fig["disagg-quiet"]
            lines.append(
                f"disagg over UCX: ITL p99 with bursts / without (TCP): "
                f"{u['itl_p99_ms'] / q['itl_p99_ms']:.2f}x (docs/kv_transfer.md, known problem)"
            )
        lines.append(
            "with bursts, colocated / disaggregated ITL p99: "
            f"{c['itl_p99_ms'] / d['itl_p99_ms']:.2f}x"
        )
        return lines
    if name == "peers":
        base = fig["pdserve"]
        return [
            f"{label}: output tok/s {f['output_tok_s']:.1f} = "
            f"{f['output_tok_s'] / base['output_tok_s']:.2f}x pdserve's; "
            f"TPOT p50 {f['tpot_p50_ms']:.0f} ms, TTFT p50 {f['ttft_p50_ms']:.0f} ms"
            for label, f in fig.items()
        ]
    if name.startswith("preemption"):
        sw, rc = fig["swap"], fig["recompute"]
        return [
            f"swap / recompute output tok/s: {sw['output_tok_s'] / rc['output_tok_s']:.2f}x",
            f"swap / recompute E2E p99: {sw['e2e_p99_ms'] / rc['e2e_p99_ms']:.2f}x",
        ]
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--only", help="comma-separated variant labels (default: all)")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `pdserve serve` flag for every variant (repeatable): --server-arg=--seed=1",
    )
    p.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing: summarize the results already in --out",
    )
    a = p.parse_args(argv)
    file, variants = EXPERIMENTS[a.experiment]
    if a.only:
        keep = set(a.only.split(","))
        variants = [v for v in variants if v.label in keep]
    model = ensure_model_folder(a.model_dir)
    a.out.mkdir(parents=True, exist_ok=True)
    fig: dict[str, dict[str, float]] = {}
    for v in variants:
        if a.from_results:
            folder = a.out / v.label
            report = json.loads((folder / "results.json").read_text())
            saved = folder / "counters.json"
            counters = json.loads(saved.read_text()) if saved.exists() else {}
        else:
            report, counters = run_variant(CONFIGS / file, model, v, a.out, a.server_arg)
        fig[v.label] = {**figures(report), **counters}
    cols = list(dict.fromkeys(c for f in fig.values() for c in f))
    print(f"\n{a.experiment} ({CONFIGS / file}):")
    print("variant".ljust(18) + "".join(c.rjust(16) for c in cols))
    for label, f in fig.items():
        print(label.ljust(18) + "".join(f"{f.get(c, float('nan')):16.2f}" for c in cols))
    summary_lines = (
        ratios(a.experiment, fig) if len(fig) == len(EXPERIMENTS[a.experiment][1]) else []
    )
    for line in summary_lines:
        print(line)
    (a.out / "summary.json").write_text(
        json.dumps({"experiment": a.experiment, "figures": fig, "ratios": summary_lines}, indent=1)
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pdserve",
            "bench",
            "--compare",
            *(str(a.out / v.label) for v in variants),
            "--out",
            str(a.out),
        ],
        check=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

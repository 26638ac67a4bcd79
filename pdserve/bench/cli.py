"""``pdserve bench``: flags, config merging, and the run's files."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import Progress

DESCRIPTION = """\
Benchmark a serving endpoint: any OpenAI-compatible server (--url http://HOST:PORT/v1) or
pdserve's gRPC API (--url grpc://HOST:PORT). Closed loop (--concurrency N[,N...]) or open loop
with Poisson arrivals (--rate R[,R...] requests/s); several values sweep the load and stop at
the first point that misses --slo. A run config file (--config, TOML or JSON) holds the same
settings; flags override it, and --out DIR records the effective config, every request and
the plots. See docs/bench.md."""


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_bench_parser(sub: Any) -> None:
    """Adds ``bench`` to the ``pdserve`` subcommands. Every default is None, so only the flags
    given override the config file (defaults live in ``pdserve.bench.config``)."""
    p = sub.add_parser(
        "bench",
        help="serving benchmarks against any OpenAI-compatible server or pdserve's gRPC API",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="run config file (.toml or .json)")
    t = p.add_argument_group("target")
    t.add_argument("--url", help="http://HOST:PORT/v1 (OpenAI) or grpc://HOST:PORT (pdserve)")
    t.add_argument("--api", choices=["completions", "chat"], help="OpenAI endpoint")
    t.add_argument("--model", help="model name in requests (default: the server's first)")
    t.add_argument("--api-key-env", help="environment variable holding a bearer token")
    t.add_argument("--tokenizer", help="HF tokenizer folder/name to render prompts as text")
    t.add_argument("--prompt-format", choices=["auto", "text"])
    t.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None)
    t.add_argument("--temperature", type=float)
    t.add_argument("--extra-body", type=json.loads, help="JSON object merged into each body")
    t.add_argument("--request-timeout-s", type=float)
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, help="per load point")
    w.add_argument("--prompt-len", help="fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:MAX]")
    w.add_argument("--output-len", help="same forms as --prompt-len")
    w.add_argument("--seed", type=int)
    w.add_argument("--shared-prefix-len", type=int, help="tokens of a common prefix")
    w.add_argument("--shared-prefix-fraction", type=float, help="share of requests with it")
    w.add_argument("--cancel-fraction", type=float, help="share cancelled mid-stream")
    w.add_argument("--prompts-file", help="JSONL: {prompt | prompt_token_ids, max_tokens?}")
    w.add_argument("--token-id-low", type=int)
    w.add_argument("--token-id-high", type=int)
    ld = p.add_argument_group("load")
    ld.add_argument("--concurrency", type=_ints, help="closed loop: N[,N...] in flight")
    ld.add_argument("--rate", type=_floats, help="open loop: R[,R...] requests/s (inf ok)")
    ld.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    ld.add_argument("--duration-s", type=float, help="per point: stop sending after this")
    ld.add_argument("--warmup-requests", type=int, help="unrecorded requests first")
    s = p.add_argument_group("SLO")
    s.add_argument("--slo", help="per-request targets, e.g. ttft=500ms,itl=50ms (tpot, e2e too)")
    s.add_argument("--slo-min-attainment", type=float, help="share that must meet it (0.9)")
    b = p.add_argument_group("background bursts (reported apart from the foreground)")
    b.add_argument("--burst-size", type=int, help="requests per burst (0 = no bursts)")
    b.add_argument("--burst-interval-s", type=float, help="seconds between bursts")
    b.add_argument("--burst-start-s", type=float, help="first burst, from each point's start")
    b.add_argument("--burst-prompt-len", help="bursts' prompt lengths (default fixed:1024)")
    b.add_argument("--burst-output-len", help="bursts' output lengths (default fixed:1)")
    sv = p.add_argument_group("server")
    sv.add_argument("--server-cmd", help="start this server first, stop it after")
    sv.add_argument("--server-ready-timeout-s", type=float)
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help="folder for results.json, config.toml, plots")
    o.add_argument("--no-plots", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    o.add_argument("--dry-run", action="store_true", help="print the effective config and exit")
    o.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="run nothing: tabulate these results.json files (or --out folders) side by side "
        "and, with --out, plot their CDFs in compare_cdf.png",
    )
    p.set_defaults(func=run)


def _overrides(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if a.concurrency is not None and a.rate is not None:
        raise ValueError("give --concurrency (closed loop) or --rate (open loop), not both")
    kind = "closed" if a.concurrency is not None else "open" if a.rate is not None else None
    return {
        "target": {
            "url": _normalize_url(a.url) if a.url else None,
            "api": a.api,
            "model": a.model,
            "api_key_env": a.api_key_env,
            "tokenizer": a.tokenizer,
            "prompt_format": a.prompt_format,
            "ignore_eos": a.ignore_eos,
            "temperature": a.temperature,
            "extra_body": a.extra_body,
            "request_timeout_s": a.request_timeout_s,
        },
        "workload": {
            k: getattr(a, k)
            for k in (
                "num_requests",
                "prompt_len",
                "output_len",
                "seed",
                "shared_prefix_len",
                "shared_prefix_fraction",
                "cancel_fraction",
                "prompts_file",
                "token_id_low",
                "token_id_high",
            )
        },
        "load": {
            "kind": kind,
            "concurrency": a.concurrency,
            "rates": a.rate,
            "max_concurrency": a.max_concurrency,
            "duration_s": a.duration_s,
            "warmup_requests": a.warmup_requests,
        },
        "slo": {"targets": a.slo, "min_attainment": a.slo_min_attainment},
        "bursts": {
            "size": a.burst_size,
            "interval_s": a.burst_interval_s,
            "start_s": a.burst_start_s,
            "prompt_len": a.burst_prompt_len,
            "output_len": a.burst_output_len,
        },
        "server": {"command": a.server_cmd, "ready_timeout_s": a.server_ready_timeout_s},
    }


def _normalize_url(url: str) -> str:
    """``http://h:p`` -> ``http://h:p/v1``; other URLs as given."""
    if url.startswith(("http://", "https://")) and url.rstrip("/").count("/") == 2:
        return url.rstrip("/") + "/v1"
    return url


class _RichProgress(Progress):
    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            "{task.fields[failed]} failed",
            console=console,
        )
        self._task: Any = None

    def start(self, label: str, total: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, failed=0)

    def advance(self, record: RequestRecord) -> None:
        failed = self._bar.tasks[-1].fields["failed"] + (record.status == "failed")
        self._bar.update(self._task, advance=1, failed=failed)

    def stop(self) -> None:
        self._bar.stop()


def _compare(a: argparse.Namespace, console: Any) -> int:
    from pdserve.bench.compare import compare_table, load_runs, write_compare_plot

    try:
        runs = load_runs(a.compare)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    console.print(compare_table(runs))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        console.print(f"wrote {write_compare_plot(runs, a.out / 'compare_cdf.png')}")
    return 0


def run(a: argparse.Namespace) -> int:
    from rich.console import Console

    from pdserve.bench.config import BenchConfig, load_config, merge, to_toml

    # Tables go to stdout, wide enough for the sweep table even when piped to a file.
    console = Console(width=None if sys.stdout.isatty() else 160)
    errors = Console(stderr=True)  # progress and log lines
    if a.compare:
        return _compare(a, console)
    try:
        base = load_config(a.config) if a.config else {}
        config = BenchConfig.from_dict(merge(base, _overrides(a)))
        config.validate()
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(to_toml(config))
        return 0
    from pdserve.bench.report import print_report, write_json
    from pdserve.bench.runner import run_bench
    from pdserve.bench.server_launch import launched_server

    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "config.toml").write_text(to_toml(config), encoding="utf-8")
    progress = None if a.no_progress else _RichProgress(errors)
    try:
        with launched_server(
            config.server.command,
            config.target.url,
            config.server.ready_timeout_s,
            (a.out / "server.log") if a.out else None,
        ):
            result = asyncio.run(run_bench(config, progress, log=errors.print))
    except (RuntimeError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_report(result, console)
    if a.out:
        write_json(result, a.out / "results.json")
        written = [a.out / "results.json"]
        if not a.no_plots:
            from pdserve.bench.plots import write_plots

            written += write_plots(result, a.out)
        console.print("wrote " + ", ".join(str(p) for p in written))
    failed = sum(p.summary.num_completed == 0 for p in result.points)
    return 1 if failed or not result.points else 0

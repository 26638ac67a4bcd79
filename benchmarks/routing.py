"""Routing policies on a multi-tenant workload with shared prefixes (issue 14), every policy in
one invocation against the same workers:

    python benchmarks/routing.py --out out/routing
    python benchmarks/routing.py --out out/routing-threshold --variants \\
        kv_aware,kv_aware@ratio=0.5,kv_aware@ratio=2,kv_aware@local=256

One ``redis-server``, one ``pdserve serve --prefill-workers 2 --decode-workers 2 --redis-url``
(its own router runs the first variant) and one ``pdserve router --redis-url`` per further
variant, all over the same four workers on loopback. A variant is a policy name with optional
``@ratio=R`` (``--local-prefill-hit-ratio``) and ``@local=N`` (``--local-prefill-max-tokens``):
the two thresholds of kv_aware's conditional disaggregation.

The workload: ``--tenants`` tenants, each with its own system prompt (``--prefix-len`` tokens)
followed by a user part, tenant 0 ("hot") taking ``--hot-share`` of the requests and the others
the rest evenly, Poisson arrivals at ``--rate``. The KV pools (``--num-kv-blocks``) hold only a
few tenants' prompts each, as a production pool holds a fraction of its traffic's prefixes: a
policy that scatters tenants over workers keeps evicting them. Each variant gets its own
tenants' token ids (same shapes), so no variant finds the previous one's prompts cached.

Per variant it prints TTFT p50/p99, ITL p99, output tok/s, goodput under ``--slo``, the
prefix-hit rate (prompt blocks the workers' prefix caches served over blocks looked up, from
their own counters), routing reasons, and the requests each worker took, then each figure's
ratio to the first variant. Each variant's ``pdserve bench`` output (config.toml,
results.json) is under ``--out``; ``--out``/summary.json holds everything printed.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from benchmarks.routing_cluster import (  # noqa: E402
    Process,
    machine,
    router_counters,
    start_pdserve,
    wait_idle,
    wait_routable,
    worker_counters,
)
from benchmarks.serving_experiments import figures  # noqa: E402

CLUSTER = "routing-bench"


@dataclass(frozen=True)
class Variant:
    label: str
    policy: str
    hit_ratio: float | None = None  # --local-prefill-hit-ratio
    local_tokens: int | None = None  # --local-prefill-max-tokens

    @staticmethod
    def parse(text: str) -> Variant:
        """``kv_aware``, ``kv_aware@ratio=0.5``, ``kv_aware@local=256@ratio=2``; a ``#N``
        suffix (``round_robin#2``) names a repeat of the same variant (later in the run, on
        its own router: the machine's drift shows in the two figures)."""
        policy, *opts = text.split("#")[0].split("@")
        ratio: float | None = None
        local: int | None = None
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "ratio":
                ratio = float(value)
            elif key == "local":
                local = int(value)
            else:
                raise ValueError(f"variant {text!r}: unknown option {key!r} (ratio, local)")
        return Variant(text, policy, ratio, local)

    def router_flags(self) -> list[str]:
        flags = ["--routing-policy", self.policy]
        if self.hit_ratio is not None:
            flags += ["--local-prefill-hit-ratio", str(self.hit_ratio)]
        if self.local_tokens is not None:
            flags += ["--local-prefill-max-tokens", str(self.local_tokens)]
        return flags


def tenant_prompts(a: argparse.Namespace, replica: int) -> list[dict[str, Any]]:
    """The requests in arrival order, as ``pdserve bench`` JSONL rows (token ids)."""
    lo, hi = (int(x) for x in a.prefix_len.split(":"))
    ulo, uhi = (int(x) for x in a.user_len.split(":"))
    rng = random.Random(f"{a.seed}/{replica}")
    prefixes = [
        [rng.randrange(10, a.vocab) for _ in range(rng.randint(lo, hi))] for _ in range(a.tenants)
    ]
    weights = [a.hot_share] + [(1.0 - a.hot_share) / (a.tenants - 1)] * (a.tenants - 1)
    pick = random.Random(f"{a.seed}/tenants")  # the same tenant sequence for every variant
    rows = []
    for _ in range(a.num_requests):
        tenant = pick.choices(range(a.tenants), weights)[0]
        user = [rng.randrange(10, a.vocab) for _ in range(pick.randint(ulo, uhi))]
        rows.append({"prompt_token_ids": prefixes[tenant] + user, "max_tokens": a.output_len})
    return rows


def bench_config(a: argparse.Namespace, prompts: Path, url: str) -> str:
    return f"""[target]
url = "{url}"
api = "completions"
ignore_eos = true
temperature = 0.0

[workload]
num_requests = {a.num_requests}
prompts_file = "{prompts}"
output_len = "fixed:{a.output_len}"
seed = {a.seed}

[load]
kind = "open"
rates = [{a.rate}]
warmup_requests = 0

[slo]
targets = "{a.slo}"
"""


def warm_up(a: argparse.Namespace, router: Process) -> None:
    """A few requests of their own token ids (shared with no tenant) through ``router``, so
    that no variant pays for the workers' first steps; not recorded."""
    folder = a.out / "warmup"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "bench.toml"
    config.write_text(
        f"""[target]
url = "grpc://{router.grpc}"
ignore_eos = true

[workload]
num_requests = 8
prompt_len = "uniform:64:2048"
output_len = "fixed:{a.output_len}"
seed = 12345
token_id_low = {a.vocab}
token_id_high = {a.vocab + 20}

[load]
kind = "closed"
concurrency = [4]
warmup_requests = 0
"""
    )
    bench = [sys.executable, "-m", "pdserve", "bench", "--config", str(config)]
    subprocess.run([*bench, "--out", str(folder), "--no-progress"], cwd=REPO_ROOT, check=True)


def run_variant(
    a: argparse.Namespace,
    v: Variant,
    index: int,
    router: Process,
    worker_urls: list[str],
) -> dict[str, Any]:
    folder = a.out / v.label.replace("@", "_").replace("=", "").replace("#", "_")
    folder.mkdir(parents=True, exist_ok=True)
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in tenant_prompts(a, index)))
    config = folder / "bench.toml"
    config.write_text(bench_config(a, prompts, f"grpc://{router.grpc}"))
    bench = [
        sys.executable, "-m", "pdserve", "bench", "--config", str(config),
        "--out", str(folder), "--no-progress",
    ]  # fmt: skip
    wait_idle(worker_urls)
    before_w, before_r = worker_counters(worker_urls), router_counters(router)
    print(f"\n=== {v.label}: {shlex.join(bench)}", flush=True)
    t = time.perf_counter()
    rc = subprocess.run(bench, cwd=REPO_ROOT, check=False).returncode
    print(f"=== {v.label}: exit {rc} after {time.perf_counter() - t:.0f}s", flush=True)
    if rc != 0:
        raise SystemExit(f"variant {v.label} failed; see {folder}")
    wait_idle(worker_urls)
    after_w, after_r = worker_counters(worker_urls), router_counters(router)
    report = json.loads((folder / "results.json").read_text())
    fig: dict[str, Any] = figures(report)
    query = sum(after_w[u].get("query", 0) - before_w[u].get("query", 0) for u in worker_urls)
    hit = sum(after_w[u].get("hit", 0) - before_w[u].get("hit", 0) for u in worker_urls)
    fig["block_hit_rate"] = hit / query if query else float("nan")
    computed = sum(
        after_w[u].get("prompt_computed", 0) - before_w[u].get("prompt_computed", 0)
        for u in worker_urls
    )
    fig["prompt_tokens_computed"] = computed
    sent = report["points"][0]["summary"]["total_input_tokens"]
    fig["prefix_hit_rate"] = 1.0 - computed / sent if sent else float("nan")
    deltas = {k: after_r.get(k, 0.0) - before_r.get(k, 0.0) for k in after_r}
    fig["reasons"] = {k[7:]: n for k, n in sorted(deltas.items()) if k.startswith("reason:") and n}
    fig["per_worker"] = {k: n for k, n in sorted(deltas.items()) if not k.startswith("reason:")}
    return fig


HEADLINE = (
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("itl_p99_ms", "ITL p99 ms"),
    ("output_tok_s", "out tok/s"),
    ("goodput", "goodput req/s"),
    ("slo_attainment", "SLO met"),
    ("prefix_hit_rate", "prefix hits (tokens)"),
    ("block_hit_rate", "cache lookups hit"),
    ("prompt_tokens_computed", "prompt tok computed"),
    ("completed", "completed"),
    ("failed", "failed"),
)


def print_table(fig: dict[str, dict[str, Any]]) -> list[str]:
    labels = list(fig)
    width = max(22, *(len(x) + 2 for x in labels))
    lines = ["figure".ljust(22) + "".join(x.rjust(width) for x in labels)]
    for key, name in HEADLINE:
        lines.append(name.ljust(22) + "".join(f"{fig[x][key]:{width}.3f}" for x in labels))
    base = labels[0]
    for key, name in HEADLINE[:8]:
        b = fig[base][key]
        cells = "".join(
            (f"{fig[x][key] / b:{width}.2f}" if b else "nan".rjust(width)) for x in labels
        )
        lines.append(f"{name} / {base}"[:22].ljust(22) + cells)
    for x in labels:
        lines.append(f"{x}: reasons {fig[x]['reasons']}")
        per = fig[x]["per_worker"]
        for role in ("decode", "prefill"):
            counts = {k.split(":", 1)[1]: int(n) for k, n in per.items() if k.startswith(role)}
            total = sum(counts.values()) or 1
            share = max(counts.values(), default=0) / (total / max(1, len(counts)))
            lines.append(f"  {role} requests per worker {counts} (busiest / fair: {share:.2f}x)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--variants",
        default="round_robin,least_loaded,kv_aware,round_robin#2",
        help="comma-separated; the first is the baseline of the ratios",
    )
    p.add_argument("--model", default=None, help="model folder (default: the demo model)")
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--prefix-len", default="1024:2048", help="system prompt tokens, LO:HI")
    p.add_argument("--user-len", default="32:128", help="each request's own tokens, LO:HI")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--hot-share", type=float, default=0.4)
    p.add_argument("--num-requests", type=int, default=90)
    p.add_argument("--rate", type=float, default=1.5, help="Poisson arrivals per second")
    p.add_argument("--slo", default="ttft=1s,itl=200ms", help="goodput targets (pdserve bench)")
    p.add_argument("--num-kv-blocks", type=int, default=448, help="per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--vocab",
        type=int,
        default=800,
        help="tenant prompts use token ids below this; the warm-up the 20 above it (the demo "
        "model has 832)",
    )
    a = p.parse_args(argv)
    variants = [Variant.parse(x) for x in a.variants.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    from engine.demo_model import demo_model_path
    from pdserve.local_redis import RedisServer

    model = a.model or str(demo_model_path())
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="routing-bench-redis-")))
    redis.start()
    procs: list[Process] = []
    try:
        common = ["--model", model, "--redis-url", redis.url, "--cluster-name", CLUSTER]
        serve_args = [
            "serve", *common, "--dtype", "float32",
            "--prefill-workers", "2", "--decode-workers", "2",
            "--num-kv-blocks", str(a.num_kv_blocks), "--kv-transport", "tcp",
            "--max-model-len", "4096", *variants[0].router_flags(),
        ]  # fmt: skip
        serve = start_pdserve(serve_args, a.out / "serve.log")
        procs.append(serve)
        routers = {variants[0].label: serve}
        for v in variants[1:]:
            log = a.out / f"router-{v.label.replace('#', '_')}.log"
            routers[v.label] = start_pdserve(["router", *common, *v.router_flags()], log)
            procs.append(routers[v.label])
        for router in routers.values():
            wait_routable(router, 2, 2)
        worker_urls = [line.split()[-1] for line in serve.lines if " worker: metrics " in line]
        assert len(worker_urls) == 4, worker_urls
        warm_up(a, serve)
        fig: dict[str, dict[str, Any]] = {}
        for i, v in enumerate(variants):
            fig[v.label] = run_variant(a, v, i, routers[v.label], worker_urls)
        lines = print_table(fig)
        print("\n" + "\n".join(lines))
        print(f"machine: {machine()}")
        summary = {
            "argv": sys.argv,
            "args": {k: str(x) for k, x in vars(a).items()},
            "machine": machine(),
        }
        (a.out / "summary.json").write_text(
            json.dumps({**summary, "figures": fig, "table": lines}, indent=1)
        )
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

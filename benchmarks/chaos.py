"""Chaos benchmark (issue 12, not in CI): mixed load on 2 prefill + 2 decode workers behind one
router on loopback, a random fault every ~20 s, and what every client saw at the end, with the
requests the router migrated to other workers (issue 15) from its ``pdserve_migrations_total``.
Target: 0 hung, 0 corrupted, 0 silently truncated, 0 leaked blocks, >= 99.5% completed.

    python benchmarks/chaos.py --minutes 10

The model is the tests' tiny random Llama (``engine.demo_model.make_random_model`` defaults:
hidden 64, 2 layers), fp32, built in a temporary folder. Load: ``--concurrency`` clients, each
sending one request after another (gRPC stream, HTTP stream or HTTP non-streaming, drawn at
random) from a small fixed prompt set whose uninterrupted greedy outputs are computed once with
HF ``generate`` (``tests.hf_oracle``). Faults: see ``benchmarks.chaos_faults``. Verdicts: see
``benchmarks.chaos_outcomes``. At the end the load stops, every replaced worker is up, and
every pool must become fully free (``GetLoad(check_integrity)`` and ``/metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import httpx

from benchmarks.chaos_faults import CANCEL, FaultLog, WorkerFaults
from benchmarks.chaos_outcomes import (
    API_GRPC,
    API_HTTP,
    API_HTTP_STREAM,
    Reference,
    Tally,
    Verdict,
    classify,
)
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.faults.clients import Outcome, grpc_generate, http_complete, http_stream
from tests.faults.cluster import Cluster, start_cluster
from tests.services.workers import pool_problems

HUNG_S = 120.0  # no answer within this long: hung (generous for a loaded 2-core machine)
CALL_S = HUNG_S + 60  # the clients' own bounds lie beyond it, so the deadline here decides
BROKEN = ("Traceback", "Exception in callback", "Task was destroyed but it is pending")
ROUTER_ARGS = ["--local-prefill-max-tokens", "16", "--stall-timeout-s", "5"]
WORKER_ARGS = ["--shutdown-grace-s", "3"]


def build_model(folder: Path) -> Path:
    from engine.demo_model import make_random_model, train_tokenizer

    tokenizer = train_tokenizer(folder / "tokenizer")
    return make_random_model(folder / "model", tokenizer_folder=tokenizer)


def references(model: Path, num_prompts: int, seed: int) -> list[Reference]:
    """Prompts of 5-800 tokens (log-uniform: short ones prefill on decode, the rest remote),
    8-160 tokens out, each with its uninterrupted greedy run."""
    from transformers import AutoConfig, AutoTokenizer

    from engine.detokenizer import IncrementalDetokenizer
    from tests.engine.engine_utils import random_prompts
    from tests.hf_oracle import hf_greedy

    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model)
    vocab = int(AutoConfig.from_pretrained(model).vocab_size)
    refs = []
    for i in range(num_prompts):
        length = round(5 * (800 / 5) ** rng.random())
        prompt = random_prompts(1, vocab, length, length, seed=seed * 1000 + i)[0]
        max_tokens = rng.randint(8, 160)
        ids = hf_greedy(model, prompt, max_tokens)
        detok = IncrementalDetokenizer(tokenizer, prompt)
        detok.update(ids)
        detok.flush()
        refs.append(Reference(prompt, max_tokens, ids, detok.text))
    return refs


class Load:
    """The clients, their verdicts, and the cancel bursts the fault loop asks for."""

    def __init__(self, cluster: Cluster, refs: list[Reference], seed: int) -> None:
        self.cluster, self.refs, self.rng = cluster, refs, random.Random(seed)
        self.tally, self.burst_tally = Tally(), Tally()
        self.bad: list[str] = []  # hung, corrupted, truncated: what and when
        self.fault_counts: Counter[str] = Counter()
        self.failures: list[str] = []  # failed with a clear error: when and why
        self.start = time.monotonic()

    async def run(self, stop_at: float, concurrency: int) -> None:
        async with (
            grpc.aio.insecure_channel(self.cluster.router.grpc_address) as channel,
            httpx.AsyncClient(timeout=CALL_S) as client,
        ):
            self.stub, self.client = pb_grpc.GenerationServiceStub(channel), client
            await asyncio.gather(*(self._client_loop(stop_at) for _ in range(concurrency)))

    async def _client_loop(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            ref = self.rng.choice(self.refs)
            api = self.rng.choice((API_GRPC, API_HTTP_STREAM, API_HTTP))
            out = await self._bounded(self._call(api, ref))
            self._record(self.tally, api, ref, out)

    def _call(self, api: str, ref: Reference, cancel_after: int | None = None):  # type: ignore[no-untyped-def]
        url = self.cluster.url
        if api == API_GRPC:
            return grpc_generate(self.stub, ref.prompt, ref.max_tokens, CALL_S, cancel_after)
        if api == API_HTTP_STREAM:
            return http_stream(self.client, url, ref.prompt, ref.max_tokens, cancel_after)
        return http_complete(self.client, url, ref.prompt, ref.max_tokens)

    async def _bounded(self, call) -> Outcome | None:  # type: ignore[no-untyped-def]
        """The call's outcome; ``None`` past the deadline. A dropped connection is recorded
        as what the client had by then: no finish reason, no error (a silent truncation)."""
        try:
            return await asyncio.wait_for(call, HUNG_S)  # type: ignore[no-any-return]
        except TimeoutError:
            return None
        except (httpx.TransportError, httpx.DecodingError) as e:
            self.bad.append(f"t={time.monotonic() - self.start:.1f}s connection dropped: {e!r}")
            return Outcome()

    def _record(self, tally: Tally, api: str, ref: Reference, out: Outcome | None) -> None:
        verdict = classify(out, api, ref)
        tally.add(verdict, out)
        t = time.monotonic() - self.start
        if verdict is Verdict.FAILED and out is not None:
            self.failures.append(f"t={t:.1f}s {api}: {(out.error or '')[:160]}")
        if verdict in (Verdict.HUNG, Verdict.CORRUPTED, Verdict.TRUNCATED):
            self.bad.append(
                f"t={t:.1f}s {verdict} {api} prompt_len={len(ref.prompt)} "
                f"max_tokens={ref.max_tokens}: {out}"
            )

    async def cancel_burst(self, log: FaultLog, size: int = 6) -> None:
        """Requests given up mid-stream, one way each, drawn at random."""
        kinds = [self.rng.choice(("http-close", "http-read-timeout", "grpc-cancel",
                                  "grpc-deadline")) for _ in range(size)]  # fmt: skip
        log(f"cancel burst: {', '.join(kinds)}")
        await asyncio.gather(*(self._give_up(kind) for kind in kinds))

    async def _give_up(self, kind: str) -> None:
        ref = self.rng.choice(self.refs)
        after = self.rng.randint(1, max(1, ref.max_tokens // 2))
        api = API_GRPC if kind.startswith("grpc") else API_HTTP_STREAM
        if kind == "grpc-deadline":
            seconds = self.rng.uniform(0.05, 1.5)
            out = await self._bounded(grpc_generate(self.stub, ref.prompt, ref.max_tokens, seconds))
            if out is not None and out.error and out.error.startswith("DEADLINE_EXCEEDED"):
                out.cancelled = True  # the deadline was the client's own
        elif kind == "http-read-timeout":
            timeout = httpx.Timeout(CALL_S, read=self.rng.uniform(0.05, 1.0))
            async with httpx.AsyncClient(timeout=timeout) as c:
                try:
                    out = await asyncio.wait_for(
                        http_stream(c, self.cluster.url, ref.prompt, ref.max_tokens), HUNG_S
                    )
                except httpx.ReadTimeout:
                    out = Outcome(cancelled=True)
                except TimeoutError:
                    out = None
        else:
            out = await self._bounded(self._call(api, ref, cancel_after=after))
        self._record(self.burst_tally, api, ref, out)


async def fault_loop(
    load: Load, faults: WorkerFaults, stop_at: float, period_s: float, seed: int
) -> None:
    """A fault every ``period_s`` on average (uniform in 0.75-1.25 of it), each in its own task
    so a slow restart does not delay the next; waits for all of them at the end."""
    rng = random.Random(seed + 1)
    tasks: list[asyncio.Task[None]] = []
    counts = load.fault_counts
    next_at = time.monotonic() + period_s * rng.uniform(0.5, 1.0)
    while next_at < stop_at:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        kind, worker = faults.pick(rng)
        counts[kind if worker is None else f"{kind} {worker.role}"] += 1
        if kind == CANCEL:
            tasks.append(asyncio.ensure_future(load.cancel_burst(faults.log)))
        else:
            assert worker is not None
            applied = asyncio.to_thread(faults.apply, kind, worker, random.Random(rng.random()))
            tasks.append(asyncio.ensure_future(applied))
        next_at += period_s * rng.uniform(0.75, 1.25)
    await asyncio.gather(*tasks)


def leaked_blocks(cluster: Cluster, timeout_s: float) -> tuple[int, dict[str, list[str]]]:
    """Blocks still held once the pools had ``timeout_s`` to become free, and every problem."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [w for w in cluster.workers if w.is_alive]  # a failed replacement is not
        problems = {f"{w.role} {w.target}": p for w in alive if (p := pool_problems(w))}
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    loads = [w.load() for w in alive]
    held = sum(load.num_blocks - load.num_free_blocks for load in loads)
    inflight = cluster.router.health()["num_inflight_requests"]
    if inflight:
        problems["router"] = [f"{inflight} requests in flight"]
    return held, problems


def router_migrations(cluster: Cluster) -> tuple[dict[tuple[str, str], float], float]:
    """The router's migration counters: by (phase, reason), and the requests it could not
    migrate. A request migrated twice counts twice."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{cluster.url}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    failed = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "pdserve_migrations_total" and s.value:
                counts[(s.labels["phase"], s.labels["reason"])] = s.value
            elif s.name == "pdserve_migrations_failed_total":
                failed += s.value
    return counts, failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8, help="clients sending at once")
    p.add_argument("--fault-every-s", type=float, default=20.0)
    p.add_argument("--prompts", type=int, default=12, help="distinct prompts")
    p.add_argument("--num-kv-blocks", type=int, default=1024, help="per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logs", type=Path, help="write every process's output here at the end")
    a = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="pdserve-chaos-") as tmp:
        model = build_model(Path(tmp))
        refs = references(model, a.prompts, a.seed)
        print(f"model {model} (tiny random llama), {len(refs)} prompts, references from HF")
        decode_args = ["--kv-transport", "tcp", *WORKER_ARGS]
        with start_cluster(
            model, 2, 2, ROUTER_ARGS, WORKER_ARGS, WORKER_ARGS, a.num_kv_blocks
        ) as cluster:
            log = FaultLog()
            faults = WorkerFaults(
                cluster, model, {"prefill": WORKER_ARGS, "decode": decode_args},
                a.num_kv_blocks, log,
            )  # fmt: skip
            try:
                _run(cluster, faults, refs, a)
            finally:
                if a.logs is not None:
                    retired = "".join(
                        f"--- retired {w.role} {w.target} pid {w.pid}\n{w.output()}"
                        for w in faults.retired
                    )
                    a.logs.write_text(f"{cluster.logs()}\n{retired}")
                for w in cluster.workers:  # replacements: start_cluster knows only the first
                    w.stop()


def _run(
    cluster: Cluster, faults: WorkerFaults, refs: list[Reference], a: argparse.Namespace
) -> None:
    load = Load(cluster, refs, a.seed)
    faults.log.start = load.start
    stop_at = load.start + 60 * a.minutes

    async def both() -> None:
        await asyncio.gather(
            load.run(stop_at, a.concurrency),
            fault_loop(load, faults, stop_at, a.fault_every_s, a.seed),
        )

    asyncio.run(both())
    faults.log("load stopped; waiting for every pool to be free")
    held, problems = leaked_blocks(cluster, timeout_s=60.0)
    logs = cluster.logs() + "".join(w.output() for w in faults.retired)
    broken = [line for line in logs.splitlines() if any(b in line for b in BROKEN)]

    print(f"\n## Chaos: {a.minutes:g} min, {a.concurrency} clients, 2 prefill + 2 decode")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(load.fault_counts.items()))
    print(f"faults: {load.fault_counts.total()} ({kinds}); commit {_commit()}\n")
    migrations, not_migrated = router_migrations(cluster)
    print(load.tally.table(migrated=int(sum(migrations.values()))))
    by = ", ".join(f"{phase}/{reason} {n:.0f}" for (phase, reason), n in sorted(migrations.items()))
    print(
        f"\nmigrations (the router's pdserve_migrations_total): {by or 'none'}; requests it "
        f"could not migrate (pdserve_migrations_failed_total): {not_migrated:.0f}"
    )
    print(f"\nleaked blocks at the end: {held}" + (f" — {problems}" if problems else ""))
    b = load.burst_tally.verdicts
    print(
        f"cancel bursts: {load.burst_tally.sent} requests, {b[Verdict.CANCELLED]} given up by "
        f"the client, {b[Verdict.COMPLETED]} completed first, {b[Verdict.FAILED]} failed, "
        f"{b[Verdict.HUNG]} hung, {b[Verdict.CORRUPTED]} corrupted, "
        f"{b[Verdict.TRUNCATED]} truncated"
    )
    print("failed requests by error:")
    for message, count in load.tally.errors.most_common():
        print(f"  {count:5d}  {message}")
    for line in load.failures[:40]:
        print(f"  FAILED {line}")
    for line in load.bad:
        print(f"  BAD {line}")
    print(f"broken-callback/traceback log lines: {len(broken)}")
    for line in broken[:20]:
        print(f"  {line}")


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()

"""A router over N prefill and M decode workers, every one a real process on loopback.

    with start_cluster(model, num_decode=2, router_args=["--stall-timeout-s", "2"]) as c:
        c.decode[0].pause()        # SIGSTOP; .kill(), .stop(), .resume()
        ...
        c.wait_pools_free()        # every fault test ends with this

The workers start side by side (their start-up is the slow part), then the router.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.router.server_harness import Server, start_router
from tests.services.workers import (
    WorkerProcess,
    spawn_worker,
    wait_pools_free,
    wait_started,
)


@dataclass
class Cluster:
    router: Server
    prefill: list[WorkerProcess]
    decode: list[WorkerProcess]

    @property
    def workers(self) -> list[WorkerProcess]:
        return [*self.prefill, *self.decode]

    @property
    def url(self) -> str:
        return self.router.http_url

    def router_samples(self, name: str) -> list[Sample]:
        """The router's ``/metrics`` samples called ``name`` (a counter's ends in _total)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return [
            sample
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def wait_pools_free(self, timeout_s: float = 20.0) -> None:
        """Every live worker's pool fully free (see ``tests.services.workers``), and the router
        holds no request."""
        wait_pools_free(self.workers, timeout_s)
        assert self.router.health()["num_inflight_requests"] == 0

    def logs(self) -> str:
        """Every process's output, for a failing test's message."""
        parts = [f"--- router\n{''.join(self.router.lines)}"]
        parts += [f"--- {w.role} {w.target}\n{w.output()}" for w in self.workers]
        return "\n".join(parts)


@contextmanager
def start_cluster(
    model: Path,
    num_prefill: int = 1,
    num_decode: int = 1,
    router_args: Sequence[str] = (),
    prefill_args: Sequence[str] = (),
    decode_args: Sequence[str] = (),
    num_kv_blocks: int = 128,
) -> Iterator[Cluster]:
    """Start the workers and the router; stop them all on exit (a paused one too)."""
    workers: list[WorkerProcess] = []
    router: Server | None = None
    try:
        decode_argv = ["--kv-transport", "tcp", *decode_args]  # later flags win
        for role, argv, count in (
            ("decode", decode_argv, num_decode),
            ("prefill", list(prefill_args), num_prefill),
        ):
            workers += [
                spawn_worker(role, model, *argv, num_kv_blocks=num_kv_blocks) for _ in range(count)
            ]
        for w in workers:
            wait_started(w)
        decode = [w for w in workers if w.role == "decode"]
        prefill = [w for w in workers if w.role == "prefill"]
        router = start_router(
            model, [w.target for w in decode], [w.target for w in prefill], *router_args
        )
        yield Cluster(router, prefill, decode)
    finally:
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of a streamed response: JSON objects, and "[DONE]" as a str."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def stream_tokens(events: list[Any]) -> list[str]:
    """The text pieces of a completion stream's chunks, in order."""
    return [
        e["choices"][0]["text"]
        for e in events
        if isinstance(e, dict) and e.get("choices") and "text" in e["choices"][0]
    ]

"""Issue 12's faults in the middle of a KV transfer, on the router path (real processes on
loopback: 2 prefill + 2 decode workers over TCP, and the router): the prefill worker killed
(kill -9) or stopped (SIGSTOP) while it pushes a prompt's KV, the decode worker killed or
stopped while it receives it, and the KV connections cut under it (``ss -K``). Every client
gets its whole answer, equal to Hugging Face's greedy output token for token (the request
migrates, issue 15), and afterwards every live pool is fully free: the blocks a half-done
transfer wrote on decode, and the blocks the push read on prefill, all have a way back.

"Mid-transfer" is made certain, not hoped for: the prefill workers are frozen (SIGSTOP)
before the requests go out and run in short pulses until one of them has pushed part, and not
all, of the KV of the requests the router sent it; the test checks that reservations still wait
for the rest, and only then applies the fault (to that prefill worker, or to a decode worker it
is pushing into). Prefill runs 16-token chunks so a prompt's transfer spans many steps.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.pdserve.v1 import control_pb2, control_pb2_grpc
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.faults.clients import Outcome, grpc_generate
from tests.faults.cluster import Cluster, start_cluster
from tests.faults.migration_mix import migrations
from tests.hf_oracle import hf_greedy
from tests.services.workers import WorkerProcess

STALL_S = 6.0  # decode heartbeats every ~1 s; generous for a loaded 2-core machine
LEASE_S = 3.0  # decode's lease on a reservation nobody writes to or renews
NUM_REQUESTS = 4
PROMPT_TOKENS = 800  # 50 blocks of 16, 50 prefill chunks of 16 tokens each
MAX_TOKENS = 24
BLOCK_SIZE = 16
BLOCKS_PER_PROMPT = PROMPT_TOKENS // BLOCK_SIZE
PULSE_CPU_S = 0.01  # CPU time a frozen prefill worker gets between checks...
PULSE_MAX_S = 0.5  # ...or this much wall time, whichever comes first

# What to do to the frozen worker, once the transfer is seen open.
Fault = Callable[[Cluster, WorkerProcess], None]


def _prompts(base: int, num_requests: int) -> list[list[int]]:
    """Prompts no worker has cached (``base`` differs per scenario)."""
    return [
        [3 + (base * 101 + r * 37 + i * 11) % 190 for i in range(PROMPT_TOKENS)]
        for r in range(num_requests)
    ]


def _received(w: WorkerProcess) -> float:
    """KV blocks decode worker ``w`` received so far."""
    return w.metric("pdserve_kv_transfer_blocks_total")


def _settled_received(decode: list[WorkerProcess]) -> float:
    """KV blocks the decode workers received so far, read once what the (frozen) prefill
    workers already sent has landed: the same count twice, 20 ms apart."""
    deadline = time.monotonic() + 10
    last = sum(_received(d) for d in decode)
    while True:
        time.sleep(0.02)
        now = sum(_received(d) for d in decode)
        if now == last:
            return now
        assert time.monotonic() < deadline, "decode's received-block count never settled"
        last = now


def _worker_id(w: WorkerProcess) -> str:
    """The id the worker reports to the router (ask before freezing it)."""
    with grpc.insecure_channel(w.target) as channel:
        stub = control_pb2_grpc.WorkerControlStub(channel)
        reply = stub.GetWorkerInfo(control_pb2.GetWorkerInfoRequest(), timeout=10)
        return str(reply.worker_id)


def _routed_prefill(cluster: Cluster) -> dict[str, float]:
    """Requests the router sent to each prefill worker so far, by worker id."""
    return {
        s.labels["worker_id"]: s.value
        for s in cluster.router_samples("pdserve_router_routed_requests_total")
        if s.labels["worker_role"] == "prefill"
    }


def _pulse(w: WorkerProcess) -> None:
    """Let the frozen worker ``w`` run until it has had ``PULSE_CPU_S`` of CPU (or
    ``PULSE_MAX_S`` passed), then freeze it again. Measured in CPU time, not wall time: on a
    loaded machine a worker given a fixed few milliseconds may not run at all in them, the
    freeze then lasts for many seconds, and decode's leases on the frozen worker's
    reservations run out before the fault (a CI run once saw every attempt of every request
    end "expired", none "peer_lost", so before the connections were cut)."""
    start = w.cpu_seconds()
    deadline = time.monotonic() + PULSE_MAX_S
    w.resume()
    try:
        if start is None:  # no /proc: a fixed pulse
            time.sleep(PULSE_CPU_S)
            return
        while time.monotonic() < deadline:
            time.sleep(0.001)
            ran = w.cpu_seconds()
            if ran is None or ran - start >= PULSE_CPU_S:
                return
    finally:
        w.pause()


def _open_transfers(workers: list[WorkerProcess]) -> int:
    """Prefill: transfers still open; decode: reservations still waiting for their KV."""
    return sum(w.load().num_reservations for w in workers)


@dataclass(frozen=True)
class _Before:
    """What the cluster had counted before a scenario's requests went out."""

    received: float  # KV blocks the decode workers received
    routed: dict[str, float]  # requests the router sent to each prefill worker, by worker id
    worker_ids: dict[str, str]  # prefill worker target -> its worker id

    @classmethod
    def read(cls, cluster: Cluster) -> _Before:
        return cls(
            sum(_received(d) for d in cluster.decode),
            _routed_prefill(cluster),
            {w.target: _worker_id(w) for w in cluster.prefill},
        )

    def routed_to(self, cluster: Cluster, w: WorkerProcess) -> float:
        """Requests of this scenario the router has sent to prefill worker ``w``."""
        worker_id = self.worker_ids[w.target]
        return _routed_prefill(cluster).get(worker_id, 0.0) - self.routed.get(worker_id, 0.0)


def _freeze_mid_transfer(
    cluster: Cluster, role: str, num_requests: int, before: _Before
) -> WorkerProcess:
    """Freeze (SIGSTOP) a worker of ``role`` in the middle of a transfer, and return it.

    Every prefill worker is stopped before the requests are sent (``_run``); here each runs
    in turn for a short pulse, and the blocks decode received during it are that worker's
    (the others are frozen; the count is read once it settles). The first worker to have
    pushed some, and not all, of the KV of the requests the router sent it is the producer
    (a pulse that overran can finish a worker's whole share, and a fault on it would then
    move nothing: a CI run once saw that). It stays stopped with its transfers open,
    mid-transfer for certain (a tiny model's prefill is over faster than a poll could catch
    it running), and the others run on. For ``role == "decode"`` the decode worker holding a
    reservation still waiting for KV is then stopped, and the producer runs on, pushing into
    it."""
    began = time.monotonic()
    pushed = {w.target: 0.0 for w in cluster.prefill}
    received = before.received
    producer: WorkerProcess | None = None
    pulses = 0
    while producer is None:
        for w in cluster.prefill:
            assert time.monotonic() < began + 60, f"no prefill worker caught mid-transfer: {pushed}"
            _pulse(w)
            pulses += 1
            now = _settled_received(cluster.decode)
            pushed[w.target] += now - received
            received = now
            if 0 < pushed[w.target] < before.routed_to(cluster, w) * BLOCKS_PER_PROMPT:
                producer = w
                break
    for w in cluster.prefill:
        if w is not producer:
            w.resume()
    # Shown with a failure: a freeze longer than decode's lease is the test's fault.
    print(
        f"frozen mid-transfer after {pulses} pulses, {time.monotonic() - began:.2f}s; "
        f"blocks pushed {pushed}, requests {before.routed_to(cluster, producer):.0f}",
        file=sys.stderr,
    )
    total = num_requests * BLOCKS_PER_PROMPT
    assert 0 < received - before.received < total, (received - before.received, total)
    waiting = [w for w in cluster.decode if _open_transfers([w]) > 0]
    assert waiting, "no decode worker holds a reservation still waiting for KV"
    if role == "prefill":
        return producer
    victim = waiting[0]
    victim.pause()
    producer.resume()
    return victim


def _prefill_migrations(cluster: Cluster) -> float:
    return sum(n for (phase, _), n in migrations(cluster).items() if phase == "prefill")


def _run(
    cluster: Cluster,
    model: Path,
    base: int,
    role: str,
    fault: Fault,
    num_requests: int = NUM_REQUESTS,
) -> None:
    """Send the prompts side by side, freeze a ``role`` worker mid-transfer, apply ``fault``
    to it; every client gets HF's greedy tokens, and every live pool ends fully free."""
    prompts = _prompts(base, num_requests)
    expected = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    before = _prefill_migrations(cluster)

    async def scenario() -> list[Outcome]:
        async with grpc.aio.insecure_channel(cluster.router.grpc_address) as channel:
            stub = pb_grpc.GenerationServiceStub(channel)
            counted = _Before.read(cluster)
            for w in cluster.prefill:
                w.pause()  # _freeze_mid_transfer runs them in pulses
            tasks = [asyncio.ensure_future(grpc_generate(stub, p, MAX_TOKENS)) for p in prompts]
            freeze = functools.partial(_freeze_mid_transfer, cluster, role, num_requests, counted)
            victim = await asyncio.to_thread(freeze)
            await asyncio.to_thread(fault, cluster, victim)
            return await asyncio.wait_for(asyncio.gather(*tasks), 180)

    try:
        outs = asyncio.run(scenario())
    finally:
        for w in cluster.workers:
            if w.is_alive:
                w.resume()
    for i, out in enumerate(outs):
        if out.error is not None or out.token_ids != expected[i]:
            print(cluster.logs(), file=sys.stderr)  # the processes' side of the story
        assert out.error is None and out.finish_reason == "length", (i, out)
        assert out.token_ids == expected[i], i
    try:
        cluster.wait_pools_free(timeout_s=30)
    except AssertionError:
        print(cluster.logs(), file=sys.stderr)  # who still holds what, and since when
        raise
    # The faulty attempts moved (before any token: the prefill phase of migration).
    assert _prefill_migrations(cluster) > before, migrations(cluster)


def _kill(cluster: Cluster, w: WorkerProcess) -> None:
    w.kill()


def _stay_stopped(cluster: Cluster, w: WorkerProcess) -> None:
    """Keep it stopped past decode's lease (prefill) or the router's stall timeout (decode),
    then let it run again: whatever it held for the moved requests must come back."""
    time.sleep(max(LEASE_S, STALL_S) + 4)
    w.resume()


def _cut_kv_connections(cluster: Cluster, w: WorkerProcess) -> None:
    """Close every KV connection into every decode worker (both ends see it at once), then
    let the frozen worker run again into the closed sockets."""
    for d in cluster.decode:
        port = d.load().kv_endpoint.rpartition(":")[2]
        _ss_kill("dport", "=", f":{port}")
    w.resume()


def _ss_kill(*selector: str) -> None:
    done = subprocess.run(
        ["ss", "-K", "-t", "state", "established", *selector],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr


def _can_close_sockets() -> str | None:
    """Why ``ss -K`` cannot close a TCP connection here (needs CAP_NET_ADMIN and the kernel's
    socket-destroy support), or None when it can."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        with client, accepted:
            try:
                _ss_kill("dport", "=", f":{port}")
            except (AssertionError, FileNotFoundError, subprocess.TimeoutExpired) as e:
                return f"ss -K failed: {e}"
            accepted.settimeout(2)
            try:
                accepted.recv(1)
            except OSError:
                return None
            return "ss -K left the connection open"


def _cluster(model: Path) -> AbstractContextManager[Cluster]:
    return start_cluster(
        model,
        num_prefill=2,
        num_decode=2,
        # Every prompt prefills on a prefill worker.
        router_args=[
            *("--stall-timeout-s", str(STALL_S)),
            *("--local-prefill-max-tokens", "0", "--local-prefill-hit-ratio", "2"),
        ],
        prefill_args=["--max-num-batched-tokens", str(BLOCK_SIZE)],
        decode_args=["--kv-lease-s", str(LEASE_S)],
        num_kv_blocks=1024,
    )


def _skipped_blocks(cluster: Cluster) -> float:
    """Blocks the prefill workers did not send: decode held them already."""
    return sum(
        w.metrics().get("pdserve_kv_transfer_skipped_blocks_total", 0.0)
        for w in cluster.prefill
        if w.is_alive
    )


def test_prefill_stopped_or_killed_mid_transfer(llama: Path) -> None:
    """Stopped: decode's lease on the half-written reservations expires unrenewed, the
    requests prefill again on the other prefill worker; killed: the same at once. A single
    request caught mid-transfer shows the resume: its retry goes back to the same decode
    worker, which kept the blocks that arrived whole, and only the rest travel."""
    with _cluster(llama) as cluster:
        _run(cluster, llama, base=1, role="prefill", fault=_stay_stopped)
        skipped = _skipped_blocks(cluster)
        _run(cluster, llama, base=2, role="prefill", fault=_stay_stopped, num_requests=1)
        assert _skipped_blocks(cluster) > skipped, "the retry sent every block again"
        _run(cluster, llama, base=3, role="prefill", fault=_kill)


def test_decode_stopped_or_killed_mid_transfer(llama: Path) -> None:
    """Stopped: the router sees decode stall and moves the requests to the other decode
    worker; prefill's pushes into the stopped one end by their deadline or when it runs
    again. Killed: prefill's pushes fail at once."""
    with _cluster(llama) as cluster:
        _run(cluster, llama, base=4, role="decode", fault=_stay_stopped)
        _run(cluster, llama, base=5, role="decode", fault=_kill)


def test_kv_connections_closed_mid_transfer(llama: Path) -> None:
    why = _can_close_sockets()
    if why is not None:
        pytest.skip(f"cannot close another process's TCP connection here: {why}")
    with _cluster(llama) as cluster:
        _run(cluster, llama, base=6, role="prefill", fault=_cut_kv_connections)

"""A stream stays open while its request waits silently in the queue, and one whose client is
gone is dropped: tested against a real server whose engine runs one request at a time, so a
request waits behind long ones and sends nothing until its first token.

gRPC (router/grpc_connections.py):
- a client that pings often (as grpc-go, Envoy or a load balancer's keepalive does) keeps its
  queued call and gets its tokens; with gRPC's default policy the same client is disconnected
  with GOAWAY too_many_pings (shown on a bare gRPC server with the default and pdserve's options);
- a client that stops answering (SIGSTOP: its kernel still takes the bytes, it answers no ping)
  is disconnected by the server's own pings and its queued request is cancelled before it runs;
- a connection is ended (GOAWAY) at its maximum age, 1 s here: a client's next calls open a new
  one (through a Kubernetes Service, possibly to another replica), and a call in flight, such
  as the queued one above, silent for several ages, finishes on the old one.

HTTP (router/sse.py): a queued SSE stream carries ``: keep-alive`` comments, which proxies see
as traffic and SSE clients (the openai SDK here) skip; an idle connection stays open past
uvicorn's 5 s default (``--http-keepalive-s``), so a load balancer reusing it is not answered 502;
and the server's end of every HTTP connection has TCP keepalive armed, so a client whose host
is gone is dropped (seen in the kernel's own table, /proc/net/tcp).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from router.grpc_connections import GrpcConnectionPolicy
from tests.router.server_harness import REPO_ROOT, Server, start_server

pytestmark = pytest.mark.timeout(300)

# Requests the others queue behind; each takes ~1 s on a fast 2-core machine, so a request
# queued behind them all is silent for longer than gRPC's policy lets a pinging client stay.
BLOCKER_TOKENS = 2000
BLOCKERS = 8
# A client pinging every second with nothing to send: what gRPC's default policy counts as
# abuse from the third ping on (it disconnects the client ~3 s into a silence).
EAGER_CLIENT = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


@pytest.fixture(scope="module")
def queue_server(llama: Path) -> Iterator[Server]:
    s = start_server(
        llama,
        "--num-kv-blocks", "512", "--max-model-len", "2048", "--max-num-seqs", "1",
        "--grpc-keepalive-s", "0.5", "--grpc-keepalive-timeout-s", "1.5",
        "--grpc-min-client-ping-s", "0.5", "--sse-keepalive-s", "0.3",
        "--grpc-max-connection-age-s", "1",
    )  # fmt: skip
    yield s
    assert s.stop() == 0, "".join(s.lines)


async def _start_blockers(
    server: Server, n: int
) -> tuple[httpx.AsyncClient, asyncio.Future[list[None]]]:
    """``n`` long requests: one takes the engine's one running slot, the others queue behind
    it; each is read to its end in a task."""
    client = server.async_http(timeout=120)
    body = {"prompt": [5, 6, 7], "max_tokens": BLOCKER_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip

    async def run() -> None:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for _ in r.aiter_lines():
                pass

    tasks = asyncio.gather(*(run() for _ in range(n)))
    await _wait_load(
        server,
        lambda load: load["num_running_requests"] == 1 and load["num_waiting_requests"] == n - 1,
    )
    return client, tasks


async def _wait_load(
    server: Server, ok: Callable[[dict[str, int]], bool], timeout_s: float = 60
) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        load = server.health()["load"]
        if ok(load):
            return dict(load)
        assert time.monotonic() < deadline, f"load never reached the expected state: {load}"
        await asyncio.sleep(0.02)


def test_a_queued_call_outlives_a_pinging_client(queue_server: Server) -> None:
    asyncio.run(_queued_call(queue_server))


async def _queued_call(server: Server) -> None:
    client, blockers = await _start_blockers(server, BLOCKERS)
    target = server.grpc_address
    async with grpc.aio.insecure_channel(target, options=EAGER_CLIENT) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[5, 6, 7]),
            sampling_params=pb.SamplingParams(max_tokens=8, ignore_eos=True, temperature=0),
        )
        started = time.monotonic()
        first_token_s = None
        tokens = 0
        async for response in stub.Generate(request, timeout=120):
            if first_token_s is None and response.token_ids:
                first_token_s = time.monotonic() - started
            tokens += len(response.token_ids)
    assert tokens == 8
    # The call sat silent behind the blockers for more pings than gRPC's default lets pass.
    assert first_token_s is not None and first_token_s > 5.0, first_token_s
    await blockers
    await client.aclose()
    server.wait_pool_free()


def test_a_client_that_stops_answering_is_dropped(queue_server: Server) -> None:
    asyncio.run(_frozen_client(queue_server))


async def _frozen_client(server: Server) -> None:
    generated = server.metric("pdserve_engine_generation_tokens_total")
    aborted = server.metric("pdserve_request_finished_total", reason="abort")
    # Started and connected first, it sends its request on a line from us: at once, while the
    # first blocker still runs (~1 s), so it queues behind all of them.
    frozen = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, server.grpc_address],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert frozen.stdout is not None and frozen.stdin is not None
        assert await asyncio.to_thread(frozen.stdout.readline) == "connected\n"
        client, blockers = await _start_blockers(server, BLOCKERS)
        frozen.stdin.write("go\n")
        frozen.stdin.flush()
        await _wait_load(server, lambda load: load["num_waiting_requests"] == BLOCKERS)
        frozen.send_signal(signal.SIGSTOP)
        # The server's pings go unanswered (every 0.5 s, 1.5 s to answer): the connection is
        # closed and the queued request cancelled while the blockers still run.
        deadline = time.monotonic() + 60
        while server.metric("pdserve_request_finished_total", reason="abort") == aborted:
            assert time.monotonic() < deadline, "the frozen client's request was not dropped"
            await asyncio.sleep(0.05)
        assert not blockers.done()
    finally:
        frozen.kill()
        frozen.wait()
    await blockers
    await client.aclose()
    server.wait_pool_free()
    # The dropped request never ran: only the blockers' tokens were generated.
    assert server.metric("pdserve_engine_generation_tokens_total") - generated == (
        BLOCKERS * BLOCKER_TOKENS
    )
    assert server.metric("pdserve_request_finished_total", reason="abort") == (aborted + 1)


def test_a_queued_sse_stream_carries_keepalive_comments(queue_server: Server) -> None:
    asyncio.run(_queued_sse(queue_server))


async def _queued_sse(server: Server) -> None:
    body = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    client, blockers = await _start_blockers(server, 2)
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        lines = [line async for line in r.aiter_lines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    # Behind the blockers (~2 s) every 0.3 s: a comment, then the blank line ending it.
    assert lines[:first].count(": keep-alive") >= 3, lines[:first]
    assert set(lines[:first]) == {": keep-alive", ""}
    assert lines[-2:] == ["data: [DONE]", ""]
    await blockers

    # The openai SDK reads a chat stream through its comments to the same tokens.
    messages = [{"role": "user", "content": "hi"}]
    whole = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0},
    )
    await client.aclose()
    client, blockers = await _start_blockers(server, 2)

    def sdk_stream() -> str:
        stream = server.openai().chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert await asyncio.to_thread(sdk_stream) == whole.json()["choices"][0]["message"]["content"]
    await blockers
    await client.aclose()
    server.wait_pool_free()


def test_an_idle_http_connection_outlives_uvicorn_s_default(queue_server: Server) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: pdserve\r\n\r\n"
    with queue_server.connect(timeout_s=10) as sock:
        for idle_s in (0, 6.5):  # uvicorn's own default closes it after 5 s
            time.sleep(idle_s)
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                assert chunk, f"the server closed the connection after {idle_s} s idle"
                head += chunk
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += sock.recv(4096)


class _CountingProxy:
    """A TCP forwarder to ``target`` that counts the connections made through it."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )


def test_a_connection_is_replaced_at_its_maximum_age(queue_server: Server) -> None:
    asyncio.run(_aged(queue_server))


async def _aged(server: Server) -> None:
    proxy = _CountingProxy(server.grpc_address)
    target = await proxy.start()
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(max_tokens=4, ignore_eos=True, temperature=0),
    )
    calls = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        end = time.monotonic() + 4.5
        while time.monotonic() < end:  # every call succeeds, across the connections' ends
            tokens = [t async for r in stub.Generate(request, timeout=30) for t in r.token_ids]
            assert len(tokens) == 4
            calls += 1
            await asyncio.sleep(0.1)
    await proxy.close()
    # Connections end after 0.9-1.1 s (grpc's jitter): 4.5 s of calls took at least four.
    assert proxy.connections >= 4, (proxy.connections, calls)


def _server_side_timer(http_port: int, client_port: int) -> tuple[int, int]:
    """The kernel's timer of the server's end of a loopback connection: (kind, clock ticks
    left); kind 2 is keepalive (/proc/net/tcp, IPv4)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, timer = fields[1], fields[2], fields[3], fields[5]
        if (
            int(local.split(":")[1], 16) == http_port
            and int(remote.split(":")[1], 16) == client_port
            and state == "01"  # ESTABLISHED
        ):
            kind, ticks = timer.split(":")
            return int(kind, 16), int(ticks, 16)
    raise AssertionError(f"no connection from port {client_port} to {http_port}")


def test_http_connections_have_tcp_keepalive(queue_server: Server) -> None:
    http_port = int(queue_server.http_url.rsplit(":", 1)[1])
    with queue_server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: pdserve\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # accepted and served
        kind, ticks = _server_side_timer(http_port, sock.getsockname()[1])
    assert kind == 2, f"no keepalive timer on the server's end (kind {kind})"
    assert 0 < ticks <= 60 * os.sysconf("SC_CLK_TCK")  # probes start after 60 s idle


# The frozen client: connected, it sends one Generate on a line from stdin and reads it to its
# end (it is stopped before any token).
_CLIENT = """
import sys, grpc
from protos.pdserve.v1 import generate_pb2 as pb, generate_pb2_grpc as pb_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    grpc.channel_ready_future(channel).result(timeout=60)
    print("connected", flush=True)
    sys.stdin.readline()
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in pb_grpc.GenerationServiceStub(channel).Generate(request):
        pass
"""


async def _watch(options: list[tuple[str, int]]) -> grpc.aio.AioRpcError | None:
    """Watch a bare gRPC server's health, a call that sends one message and then nothing,
    for 5 s as EAGER_CLIENT: the error that ended it, or None."""
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=EAGER_CLIENT) as ch:
            call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
            try:
                await call.read()  # SERVING, then silence while the client pings
                await asyncio.wait_for(call.read(), timeout=5)
            except TimeoutError:
                return None  # still open after 5 pings (gRPC's default cuts it after ~3 s)
            except grpc.aio.AioRpcError as e:
                return e
            raise AssertionError("Watch sent a second message")
    finally:
        await server.stop(0)


def test_grpc_default_policy_cuts_a_silent_call_pdserve_options_do_not() -> None:
    cut = asyncio.run(_watch([]))
    assert cut is not None and cut.code() == grpc.StatusCode.UNAVAILABLE
    assert "too many pings" in (cut.details() or "").lower()
    assert asyncio.run(_watch(GrpcConnectionPolicy(min_client_ping_s=0.5).server_options())) is None


def test_bad_keepalive_values_are_refused() -> None:
    with pytest.raises(ValueError, match="--grpc-keepalive-s"):
        GrpcConnectionPolicy(time_s=-1)
    with pytest.raises(ValueError, match="--grpc-min-client-ping-s"):
        GrpcConnectionPolicy(min_client_ping_s=float("nan"))
    with pytest.raises(ValueError, match="--grpc-keepalive-timeout-s"):
        GrpcConnectionPolicy(timeout_s=0)
    assert ("grpc.keepalive_time_ms", 2**31 - 1) in GrpcConnectionPolicy(time_s=0).server_options()

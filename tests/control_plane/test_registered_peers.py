"""Issue 16 with the control plane: a prefill worker in a Redis cluster connects only to the
KV endpoints of registered decode workers. A ticket naming any other endpoint is refused with
PERMISSION_DENIED before a connection is made, a registered decode worker's endpoint is
admitted, and a decode worker that left the registry is refused again."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import grpc
import pytest

from engine.sampling_params import SamplingParams
from kv_transfer.peers import PeerPolicy, RegisteredPeers
from pdserve.wire import sampling_params_to_proto
from protos.pdserve.v1 import kv_transfer_pb2 as kvpb
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from tests.conftest import TINY_ARCHS
from tests.control_plane.test_worker_processes import _members, _wait_for
from tests.redis_harness import RedisServer
from tests.services.workers import spawn_worker, wait_pools_free, wait_started


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


_CALLS = itertools.count()


def _prefill(target: str, endpoint: str) -> grpc.RpcError:
    """A ticket for ``endpoint`` with a token nobody issued: the call always fails; how it
    fails says whether the prefill worker would connect there. Each call has its own request
    id: the engine keeps a failed call's id until its transfer's abort has reached decode, so
    an id used again at once can meet "already in use"."""
    request_id = f"forged-{next(_CALLS)}"
    ticket = kvpb.KVReservation(
        request_id=request_id, endpoint=endpoint, token=b"\x01" * 16, block_ids=[0], lease_s=5.0
    )
    request = wpb.PrefillRequest(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3, 4],
        sampling_params=sampling_params_to_proto(SamplingParams(max_tokens=1)),
        reservation=ticket,
    )
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            worker_pb2_grpc.PrefillWorkerStub(channel).Prefill(request, timeout=30)
    return info.value


def test_prefill_connects_only_to_registered_decode_workers(
    llama: Path, redis: RedisServer
) -> None:
    flags = ["--redis-url", redis.url, "--cluster-name", "test", "--registry-lease-s", "2"]
    decode = spawn_worker("decode", llama, *flags, "--worker-id", "decode-a")
    prefill = spawn_worker(
        "prefill", llama, *flags, "--worker-id", "prefill-a", "--kv-peers-from-registry"
    )
    try:
        wait_started(decode)
        wait_started(prefill)
        members = _wait_for(lambda: (m := asyncio.run(_members(redis.url))) and len(m) == 2 and m)
        endpoint = members["decode-a"].kv_endpoint
        assert endpoint.startswith(("tcp://", "ucx://")), members

        stranger = _prefill(prefill.target, "tcp://127.0.0.1:9")
        assert stranger.code() == grpc.StatusCode.PERMISSION_DENIED, stranger
        assert "not a registered decode worker's" in (stranger.details() or "")

        # The registered endpoint is admitted: the worker connects, and decode refuses the
        # reservation nobody made (not the gate).
        registered = _prefill(prefill.target, endpoint)
        assert registered.code() != grpc.StatusCode.PERMISSION_DENIED, registered
        assert "reservation" in (registered.details() or ""), registered.details()

        # Gone from the registry (drained): its endpoint is refused again.
        decode.proc.terminate()
        assert decode.proc.wait(timeout=30) == 0, decode.output()
        deadline = time.monotonic() + 20
        while (code := _prefill(prefill.target, endpoint).code()) != (
            grpc.StatusCode.PERMISSION_DENIED
        ):
            assert time.monotonic() < deadline, code
            time.sleep(0.5)
        wait_pools_free([prefill])
    finally:
        decode.kill()
        prefill.stop()


def test_registered_peers_read_once_refresh_on_a_miss_keep_the_last_list_in_an_outage() -> None:
    listed: list[frozenset[str] | Exception] = [
        frozenset({"tcp://10.0.0.1:7100"}),
        frozenset({"tcp://10.0.0.1:7100", "tcp://10.0.0.2:7100"}),
        ConnectionError("redis down"),
    ]
    calls = 0

    async def list_endpoints() -> frozenset[str]:
        nonlocal calls
        result = listed[min(calls, len(listed) - 1)]
        calls += 1
        if isinstance(result, Exception):
            raise result
        return result

    async def scenario() -> None:
        nonlocal calls
        gate = RegisteredPeers(list_endpoints, PeerPolicy.parse(["10.9.0.0/16"]), max_age_s=60)
        assert await gate.admits("tcp://10.9.1.1:7100") and calls == 0  # static: no read
        # Concurrent first callers share one read (none is refused while it is under way).
        first = await asyncio.gather(*(gate.admits("tcp://10.0.0.1:7100") for _ in range(5)))
        assert all(first) and calls == 1
        assert await gate.admits("tcp://10.0.0.1:7100") and calls == 1  # fresh: no re-read
        assert await gate.admits("tcp://10.0.0.2:7100") and calls == 2  # a miss re-reads
        assert not await gate.admits("tcp://10.0.0.3:7100") and calls == 3  # outage
        assert await gate.admits("tcp://10.0.0.2:7100")  # the last list stands
        assert "not a registered decode worker's or --kv-allowed-peers" in str(
            gate.refusal("tcp://10.0.0.3:7100")
        )

    asyncio.run(scenario())

"""Disaggregated serving with real processes: a prefill worker pushes KV over TCP or UCX into
the blocks a decode worker reserved; tokens equal HF's; cancellation frees both pools."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack, aclosing
from pathlib import Path

import grpc
import pytest

from engine.sampling_params import SamplingParams
from kv_transfer import is_ucx_available
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from router.backend import GenerateRequest
from router.disaggregated_backend import DisaggregatedBackend
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy
from tests.services.workers import start_worker

TRANSPORTS = [
    "tcp",
    pytest.param(
        "ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
    ),
]


@pytest.fixture(scope="module", params=TRANSPORTS)
def cluster(request: pytest.FixtureRequest, model_factory) -> Iterator[tuple[Path, str, str]]:  # type: ignore[no-untyped-def]
    model = model_factory("llama", **TINY_ARCHS["llama"])
    with ExitStack() as stack:
        decode = stack.enter_context(start_worker("decode", model, "--kv-transport", request.param))
        prefill = stack.enter_context(
            start_worker("prefill", model, "--max-num-batched-tokens", "16")
        )
        yield model, decode, prefill


async def _free_blocks(target: str, decode: bool) -> tuple[int, int]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = (worker_pb2_grpc.DecodeWorkerStub if decode else worker_pb2_grpc.PrefillWorkerStub)(
            ch
        )
        load = await stub.GetLoad(wpb.GetLoadRequest(), timeout=5)
        return load.num_free_blocks, load.num_blocks


async def _wait_pools_free(decode: str, prefill: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        d = await _free_blocks(decode, True)
        p = await _free_blocks(prefill, False)
        if d[0] == d[1] and p[0] == p[1]:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"blocks still held: decode {d}, prefill {p}")
        await asyncio.sleep(0.1)


def test_concurrent_requests_match_hf(cluster: tuple[Path, str, str]) -> None:
    model, decode, prefill = cluster

    prompts = random_prompts(6, 800, 5, 60, seed=30)

    async def main() -> dict[str, list[int]]:
        backend = DisaggregatedBackend(str(model), [decode], [prefill], load_poll_s=0.2)
        await backend.start()

        async def one(i: int) -> list[int]:
            req = GenerateRequest(
                f"r{i}",
                SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                prompt_token_ids=prompts[i],
            )
            last = None
            async for out in backend.generate(req):
                last = out
            assert last is not None and last.finished and last.finish_reason == "length"
            return last.token_ids

        results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        await _wait_pools_free(decode, prefill)
        await backend.close()
        return {f"r{i}": r for i, r in enumerate(results)}

    res = asyncio.run(main())
    for i, p in enumerate(prompts):
        assert res[f"r{i}"] == hf_greedy(model, p, 10), f"request {i}"


def test_cancel_mid_stream_frees_both_pools(cluster: tuple[Path, str, str]) -> None:
    model, decode, prefill = cluster

    async def main() -> None:
        backend = DisaggregatedBackend(str(model), [decode], [prefill], load_poll_s=0.2)
        await backend.start()
        req = GenerateRequest(
            "c1",
            SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
            prompt_token_ids=random_prompts(1, 800, 70, 70, seed=31)[0],
        )
        async with aclosing(backend.generate(req)) as stream:
            n = 0
            async for _ in stream:
                n += 1
                if n == 3:
                    break
        await _wait_pools_free(decode, prefill)
        # Bad input comes back as ValueError naming the field; the workers keep serving.
        bad = GenerateRequest("bad", SamplingParams(), prompt_token_ids=[10**7])
        with pytest.raises(ValueError, match="prompt_token_ids"):
            async for _ in backend.generate(bad):
                pass
        ok = GenerateRequest(
            "ok", SamplingParams(temperature=0, max_tokens=3), prompt_token_ids=[5, 6, 7]
        )
        outs = [o async for o in backend.generate(ok)]
        assert outs[-1].finished and len(outs[-1].token_ids) == 3
        await _wait_pools_free(decode, prefill)
        await backend.close()

    asyncio.run(main())


def test_short_prompts_prefill_on_decode(cluster: tuple[Path, str, str]) -> None:
    """Conditional disaggregation: a prompt under the threshold never leaves the decode worker
    (no transfer is cheaper than any transfer); the tokens are the same either way."""
    model, decode, prefill = cluster
    prompt = list(range(11, 31))  # 20 tokens: one full block

    async def run(threshold: int) -> tuple[list[int], int]:
        backend = DisaggregatedBackend(
            str(model), [decode], [prefill], load_poll_s=0.2, local_prefill_max_tokens=threshold
        )
        await backend.start()
        req = GenerateRequest(
            f"short-{threshold}",
            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
            prompt_token_ids=prompt,
        )
        outs = [o async for o in backend.generate(req)]
        await _wait_pools_free(decode, prefill)
        # The router counts its decisions by reason.
        decisions = backend.cluster.stats.routing_decisions
        sent_to_prefill = sum(n for why, n in decisions.items() if why != "local_prefill")
        await backend.close()
        return outs[-1].token_ids, sent_to_prefill

    local_tokens, local_sent = asyncio.run(run(32))
    remote_tokens, remote_sent = asyncio.run(run(0))
    assert (local_sent, remote_sent) == (0, 1)
    assert local_tokens == remote_tokens == hf_greedy(model, prompt, 8)

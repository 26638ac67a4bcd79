"""Defect 0 of issue 12: a reservation lives as long as its request does.

Decode reserves a request's blocks when the request arrives; the prompt may then wait in
prefill's queue for much longer than decode's lease. Prefill renews the lease while the request
waits and computes, so a long queue is never a reason to fail; and a request that finds no free
decode blocks waits in decode's queue instead of being refused. Both queues outlast the
router's stall timeout: decode's heartbeats tell waiting from stalled.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path

import grpc

from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.engine.engine_utils import random_prompts
from tests.faults.clients import Outcome, grpc_generate
from tests.faults.cluster import start_cluster
from tests.hf_oracle import hf_greedy

LEASE_S = 1.0
# Decode heartbeats every 0.25 s here, so a 1.5 s stall timeout is generous yet shorter than the
# prefill queue below: a request that waits longer without a token must still not "stall".
HEARTBEAT = ["--heartbeat-s", "0.25"]
STALL_S = 1.5
MAX_TOKENS = 6


def _run_all(address: str, prompts: list[list[int]]) -> tuple[list[Outcome], float]:
    """Every prompt at once; the outcomes and the seconds until the last one ended."""

    async def run() -> list[Outcome]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.GenerationServiceStub(channel)
            return await asyncio.gather(*(grpc_generate(stub, p, MAX_TOKENS) for p in prompts))

    start = time.monotonic()
    outs = asyncio.run(run())
    return outs, max(o.ended_at for o in outs) - start


def _assert_all_match_hf(model: Path, prompts: list[list[int]], outs: list[Outcome]) -> None:
    errors = Counter(re.sub(r"for \S+ ", "", o.error) for o in outs if o.error is not None)
    assert not errors, f"{sum(errors.values())} of {len(prompts)} failed: {errors}"
    for i, out in enumerate(outs):
        assert out.finish_reason == "length", i
        assert out.token_ids == hf_greedy(model, prompts[i], MAX_TOKENS), f"request {i}"


def test_a_prefill_queue_longer_than_the_lease_fails_nothing(llama: Path) -> None:
    # Prefill computes 2 tokens a step: 32 prompts of 300-600 tokens are ~7,200 steps, several
    # leases even with the compiled CPU kernels on a quiet machine (4 tokens a step, ~3,600
    # steps, took only 1.36 s once all the layers ran in one call: under the 1.5 s premise),
    # while decode has room for all of them at once.
    prompts = random_prompts(32, 800, 300, 600, seed=120)
    with start_cluster(
        llama,
        router_args=["--stall-timeout-s", str(STALL_S)],
        decode_args=["--kv-lease-s", str(LEASE_S), *HEARTBEAT],
        prefill_args=["--max-num-batched-tokens", "2"],
        num_kv_blocks=2048,  # 32 x 38 blocks at most: room for all of them
    ) as cluster:
        outs, seconds = _run_all(cluster.router.grpc_address, prompts)
        _assert_all_match_hf(llama, prompts, outs)
        # The premise: the queue outlasted the lease and the stall timeout (on a 2-core VM it
        # takes several seconds).
        assert seconds > max(LEASE_S, STALL_S), f"the queue lasted only {seconds:.1f}s"
        print(f"the prefill queue lasted {seconds:.1f} s")
        cluster.wait_pools_free()


def test_requests_wait_for_decode_blocks_instead_of_failing(llama: Path) -> None:
    # Decode's 40 blocks hold 2-6 of these requests at once: the others wait for blocks.
    prompts = random_prompts(16, 800, 100, 300, seed=121)
    with start_cluster(
        llama,
        router_args=["--stall-timeout-s", str(STALL_S)],
        decode_args=["--kv-lease-s", str(LEASE_S), *HEARTBEAT],
        num_kv_blocks=40,
    ) as cluster:
        outs, _ = _run_all(cluster.router.grpc_address, prompts)
        _assert_all_match_hf(llama, prompts, outs)
        cluster.wait_pools_free()

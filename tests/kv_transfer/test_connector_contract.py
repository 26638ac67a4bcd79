"""The KV connector contract: a prefill engine exporting through ``PrefillConnector`` and a
decode engine importing through ``DecodeConnector``, over the in-process transport and over
real TCP sockets, with the same flow the workers run (tests/services run the workers
themselves as processes over gRPC). Greedy tokens equal HF; every pool ends free.

(This replaces the engine's old hand-wired prefill/decode roles test; its assertions are kept.)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.kv_connector.base import KVSave
from engine.kv_connector.params import KVTransferParams
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from kv_transfer import KVSender, create_receiver
from kv_transfer.decode_connector import DecodeConnector
from kv_transfer.prefill_connector import PrefillConnector
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy

TRANSPORTS = ["inproc", "tcp"]


def engine_with(folder: Path, connector: object, **overrides: object) -> LLMEngine:
    """An engine with the exactness suite's settings and ``connector``."""
    options: dict[str, object] = dict(
        model=str(folder),
        dtype="float32",
        num_kv_blocks=512,
        num_host_blocks=256,
        max_num_batched_tokens=256,
        max_num_seqs=64,
    )
    options.update(overrides)
    return LLMEngine(EngineConfig(**options), kv_connector=connector)  # type: ignore[arg-type]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@dataclass
class Pair:
    prefill: AsyncEngine
    decode: AsyncEngine
    pconn: PrefillConnector
    dconn: DecodeConnector
    sender: KVSender
    receiver: object

    async def generate(
        self, rid: str, prompt: list[int], params: SamplingParams, queued: object = None
    ) -> RequestOutput:
        """The disaggregated flow of one request; returns decode's final output. ``queued``:
        awaited between the export's start and the prefill (its wait in prefill's queue)."""
        ticket_f = self.dconn.expect_ticket(rid)
        stream = self.decode.generate(
            rid,
            prompt_token_ids=prompt,
            sampling_params=params,
            kv_transfer=KVTransferParams("import"),
        )
        first = asyncio.ensure_future(anext(stream))
        try:
            ticket = await ticket_f
            transfer = await self.sender.open(ticket)
            done = self.pconn.start_job(rid, transfer)
            if callable(queued):
                await queued()
            pstream = self.prefill.generate(
                rid,
                prompt_token_ids=prompt,
                sampling_params=params,
                kv_transfer=KVTransferParams("export"),
            )
            async with contextlib.aclosing(pstream):
                async for _ in pstream:
                    pass
            await done
            out = await first
            while not out.finished:
                out = await anext(stream)
            return out
        finally:
            self.dconn.forget(rid)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await stream.aclose()

    def stats_free(self) -> bool:
        return all(
            e.stats.num_free_blocks == e.stats.num_blocks
            and e.stats.num_unfinished == 0
            and e.stats.num_delayed_free == 0
            for e in (self.prefill, self.decode)
        )


async def _wait_free(pair: Pair, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pair.stats_free():
        assert loop.time() < deadline, (pair.prefill.stats, pair.decode.stats)
        await asyncio.sleep(0.02)
    for e in (pair.prefill, pair.decode):
        assert await e.call(lambda x: x.check_invariants())


@contextlib.contextmanager
def make_pair(
    aio,
    folder: Path,
    transport: str,
    lease_s: float = 30.0,
    pconn: PrefillConnector | None = None,
    **decode_overrides: object,
) -> Iterator[Pair]:
    pconn = pconn or PrefillConnector()
    dconn = DecodeConnector(16)
    pengine = engine_with(folder, pconn, max_num_batched_tokens=24)
    dengine = engine_with(folder, dconn, **decode_overrides)

    async def setup() -> Pair:
        receiver = create_receiver(
            dengine.kv_spec, dengine.kv_cache.pool, dconn, transport, default_lease_s=lease_s
        )
        await receiver.start()
        dconn.attach(receiver)
        sender = KVSender(pengine.kv_spec, pengine.kv_cache.pool)
        return Pair(AsyncEngine(pengine), AsyncEngine(dengine), pconn, dconn, sender, receiver)

    pair = aio.run(setup())
    try:
        yield pair
    finally:

        async def teardown() -> None:
            await pair.sender.close()
            await pair.receiver.close()  # type: ignore[attr-defined]

        aio.run(teardown())
        pair.prefill.shutdown()
        pair.decode.shutdown()


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokens_equal_hf_and_prefix_hits_skip_blocks(aio, model_factory, transport, arch) -> None:
    folder: Path = model_factory(arch, **TINY_ARCHS[arch])
    with make_pair(aio, folder, transport) as pair:
        vocab = 200
        shared = random_prompts(1, vocab, 32, 32, seed=20)[0]
        prompts = random_prompts(5, vocab, 5, 70, seed=21) + [shared + [7, 8, 9]]

        async def run() -> None:
            outs = await asyncio.gather(
                *(pair.generate(f"r{i}", p, greedy(12)) for i, p in enumerate(prompts))
            )
            for i, (p, out) in enumerate(zip(prompts, outs, strict=True)):
                assert out.token_ids == hf_greedy(folder, p, 12), f"request {i}"
            await _wait_free(pair)
            # A second request with the shared prefix: decode already holds its 2 full
            # blocks, so only the partial last block travels.
            before = pair.receiver.metrics.snapshot().blocks_transferred  # type: ignore[attr-defined]
            out = await pair.generate("again", shared + [10, 11], greedy(5))
            assert out.token_ids == hf_greedy(folder, shared + [10, 11], 5)
            assert out.num_cached_tokens == 32
            after = pair.receiver.metrics.snapshot().blocks_transferred  # type: ignore[attr-defined]
            assert after - before == 1
            await _wait_free(pair)

        aio.run(run(), timeout=120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_decode_queues_requests_it_has_no_room_for(aio, llama, transport) -> None:
    """12 requests of 4 blocks each into a decode pool of 16 blocks: no refusal, no failure;
    they wait for blocks in the scheduler and all complete, HF-exact."""
    with make_pair(aio, llama, transport, num_kv_blocks=16) as pair:
        prompts = random_prompts(12, 200, 40, 48, seed=5)

        async def run() -> None:
            outs = await asyncio.gather(
                *(pair.generate(f"q{i}", p, greedy(8)) for i, p in enumerate(prompts))
            )
            for p, out in zip(prompts, outs, strict=True):
                assert out.token_ids == hf_greedy(llama, p, 8)
            await _wait_free(pair)

        aio.run(run(), timeout=120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_abort_during_remote_prefill_frees_both_sides(aio, llama, transport) -> None:
    with make_pair(aio, llama, transport) as pair:
        # 13 chunks of 24 tokens: prefill runs long enough to be seen running.
        p = random_prompts(1, 200, 300, 300, seed=22)[0]

        async def run() -> None:
            task = asyncio.ensure_future(pair.generate("a", p, greedy(50)))
            deadline = time.monotonic() + 30
            while pair.prefill.stats.num_running == 0:  # until prefill is computing it
                assert not task.done(), "the request ended before its prefill was seen running"
                assert time.monotonic() < deadline, "prefill never started the request"
                await asyncio.sleep(0.001)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            # Well before the job's first renewal (a third of the 30 s lease): dropping the
            # prompt ends its export; it used to wait for that renewal to fail.
            await _wait_free(pair, timeout_s=5.0)

        aio.run(run())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_export_failure_fails_the_decode_request_cleanly(aio, llama, transport) -> None:
    """Prefill gives up part way: decode's request ends with an error output naming the
    transfer, never a hang; both pools end free."""
    with make_pair(aio, llama, transport) as pair:
        p = random_prompts(1, 200, 60, 60, seed=23)[0]

        async def run() -> None:
            ticket_f = pair.dconn.expect_ticket("f")
            stream = pair.decode.generate(
                "f",
                prompt_token_ids=p,
                sampling_params=greedy(5),
                kv_transfer=KVTransferParams("import"),
            )
            first = asyncio.ensure_future(anext(stream))
            ticket = await ticket_f
            transfer = await pair.sender.open(ticket)
            done = pair.pconn.start_job("f", transfer)
            pair.pconn.cancel_job("f")  # the router went away before prefill began
            with pytest.raises(asyncio.CancelledError):
                await done
            out = await asyncio.wait_for(first, 10)
            assert out.finished and out.finish_reason == "error"
            assert "ended before completion: aborted" in (out.error or "")
            pair.dconn.forget("f")
            await _wait_free(pair)

        aio.run(run())


class HeldPrefill(PrefillConnector):
    """Holds the prefill engine's thread (as a hung engine would) once it has handed
    ``after`` saves with blocks to the export, until ``go`` is set."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.saves = 0
        self.go = threading.Event()

    def save_kv(self, saves: Sequence[KVSave]) -> None:
        super().save_kv(saves)
        if any(s.block_ids for s in saves):
            self.saves += 1
            if self.saves == self.after:
                assert self.go.wait(30), "the test never let prefill go on"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_transfer_failed_part_way_leaves_its_whole_blocks_cached(aio, llama, transport) -> None:
    """Prefill gives up after part of the prompt's KV arrived (issue 15: a retry resumes
    from the last acknowledged block): the request fails, the blocks that arrived stay in
    decode's prefix cache, and the retry transfers only the rest; its tokens equal HF's."""
    held = HeldPrefill(after=3)  # 3 chunks of 24 tokens: 4 whole blocks of 16
    with make_pair(aio, llama, transport, pconn=held) as pair:
        p = random_prompts(1, 200, 300, 300, seed=24)[0]  # 18 whole blocks + 1 partial
        received = lambda: pair.receiver.metrics.snapshot().blocks_transferred  # type: ignore[attr-defined]  # noqa: E731

        async def run() -> None:
            base = received()
            ticket_f = pair.dconn.expect_ticket("f")
            stream = pair.decode.generate(
                "f", prompt_token_ids=p, sampling_params=greedy(5),
                kv_transfer=KVTransferParams("import"),
            )  # fmt: skip
            first = asyncio.ensure_future(anext(stream))
            transfer = await pair.sender.open(await ticket_f)
            done = pair.pconn.start_job("f", transfer)
            pstream = pair.prefill.generate(
                "f", prompt_token_ids=p, sampling_params=greedy(5),
                kv_transfer=KVTransferParams("export"),
            )  # fmt: skip
            drain = asyncio.ensure_future(pstream.__anext__())
            deadline = time.monotonic() + 30
            while received() - base < 4:
                assert time.monotonic() < deadline, received() - base
                await asyncio.sleep(0.01)
            pair.pconn.cancel_job("f")  # prefill gives up part way
            with pytest.raises(asyncio.CancelledError):
                await done
            out = await asyncio.wait_for(first, 10)
            assert out.finished and "ended before completion: aborted" in (out.error or "")
            held.go.set()
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
            await pstream.aclose()
            pair.dconn.forget("f")
            await _wait_free(pair)
            # The retry: decode holds the 4 blocks that arrived, 15 travel.
            before = received()
            again = await pair.generate("again", p, greedy(5))
            assert again.token_ids == hf_greedy(llama, p, 5)
            assert again.num_cached_tokens == 4 * 16
            assert received() - before == 19 - 4
            await _wait_free(pair)

        aio.run(run(), timeout=120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_slow_prefill_queue_outlives_the_lease(aio, llama, transport) -> None:
    """A lease of 0.4 s and a prefill queue that makes the last request wait far longer:
    the exports renew decode's lease while they wait, so nothing expires."""
    with make_pair(aio, llama, transport, lease_s=0.4) as pair:
        prompts = random_prompts(6, 200, 60, 80, seed=9)

        async def slow() -> None:
            await asyncio.sleep(1.0)  # 2.5 leases in prefill's queue

        async def run() -> None:
            outs = await asyncio.gather(
                *(pair.generate(f"s{i}", p, greedy(4), queued=slow) for i, p in enumerate(prompts))
            )
            for p, out in zip(prompts, outs, strict=True):
                assert out.token_ids == hf_greedy(llama, p, 4)
            await _wait_free(pair)

        aio.run(run(), timeout=120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_max_tokens_one_finishes_at_admission(aio, llama, transport) -> None:
    with make_pair(aio, llama, transport) as pair:
        p = random_prompts(1, 200, 20, 20, seed=23)[0]

        async def run() -> None:
            out = await pair.generate("a", p, SamplingParams(temperature=0, max_tokens=1))
            assert out.finished and out.finish_reason == "length"
            assert out.token_ids == hf_greedy(llama, p, 1)
            await _wait_free(pair)

        aio.run(run())


def test_export_requests_are_never_preempted_and_take_the_whole_prompt(llama) -> None:
    """The scheduler rule, without any transport: an export takes every prompt block at
    admission (so it never allocates again) and is never chosen as a preemption victim,
    although another request needs its blocks."""
    engine = engine_with(llama, PrefillConnector(), num_kv_blocks=12, max_num_batched_tokens=16)
    prompt = random_prompts(1, 200, 100, 100, seed=1)[0]  # 7 blocks
    export = engine.add_request(
        "export",
        prompt_token_ids=prompt,
        sampling_params=greedy(1),
        kv_transfer=KVTransferParams("export"),
    )
    engine.add_request("plain", prompt_token_ids=prompt[:60], sampling_params=greedy(40))
    engine.step()
    assert len(engine.block_manager.block_table("export")) == 7  # all of it; 16 computed
    for _ in range(80):
        engine.step()
        engine.block_manager.check_integrity()
    assert engine.scheduler.stats.num_preemptions > 0  # "plain" gave its blocks up
    assert export.num_preemptions == 0
    assert "export" in engine.scheduler.delayed_free  # finished; its transfer would read them

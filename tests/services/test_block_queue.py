"""decode_service.block_queue: requests that find no free decode blocks wait, first come first
served, and a request given up while waiting never keeps blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from decode_service.block_queue import BlockQueue
from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RemotePrefillReservation
from engine.sampling_params import SamplingParams
from tests.conftest import TINY_ARCHS

BLOCKS = 10  # of 16 tokens; each request below needs 7


@pytest.fixture()
def engine(model_factory) -> Iterator[tuple[AsyncEngine, BlockQueue]]:  # type: ignore[no-untyped-def]
    model: Path = model_factory("llama", **TINY_ARCHS["llama"])
    queue = BlockQueue()
    ae = AsyncEngine(
        LLMEngine(EngineConfig(model=str(model), dtype="float32", num_kv_blocks=BLOCKS)),
        on_step=queue.serve,
    )
    yield ae, queue
    ae.shutdown()


def _reserve(rid: str, num_tokens: int = 100):  # type: ignore[no-untyped-def]
    def reserve(e: LLMEngine) -> RemotePrefillReservation | None:
        return e.reserve_remote_prefill(
            rid,
            prompt_token_ids=[5 + (i + len(rid)) % 50 for i in range(num_tokens)],
            sampling_params=SamplingParams(max_tokens=3, ignore_eos=True),
        )

    return reserve


async def _free_blocks(ae: AsyncEngine) -> int:
    def check(e: LLMEngine) -> int:
        e.check_integrity()
        return e.block_manager.num_free_blocks

    return await ae.call(check)


def test_a_request_waits_for_blocks_then_gets_them_in_order(engine) -> None:  # type: ignore[no-untyped-def]
    ae, queue = engine

    async def main() -> None:
        await queue.reserve(ae, "a", _reserve("a"))  # 7 of 10 blocks
        b = asyncio.ensure_future(queue.reserve(ae, "b", _reserve("b")))
        c = asyncio.ensure_future(queue.reserve(ae, "c", _reserve("c")))
        await asyncio.sleep(0.05)
        d = asyncio.ensure_future(queue.reserve(ae, "d", _reserve("d", 16)))
        await asyncio.sleep(0.2)
        # "d" (one block) would fit now, but it is behind "b" and "c": first come first served.
        assert not (b.done() or c.done() or d.done()) and len(queue) == 3
        ae.abort("a")  # a reservation ends: its blocks go to the head of the queue
        assert (await asyncio.wait_for(b, 5)).request_id == "b"
        await asyncio.sleep(0.2)
        assert not c.done() and not d.done()  # 3 blocks free: not enough for "c"
        # Decoding "b" to the end frees its blocks in a step: the on_step hook serves "c", "d".
        outs = [o async for o in ae.attach("b", lambda e: [e.admit_remote_prefill("b", 7)])]
        assert outs[-1].finished
        assert (await asyncio.wait_for(c, 5)).request_id == "c"
        assert (await asyncio.wait_for(d, 5)).request_id == "d"
        ae.abort("c")
        ae.abort("d")
        await asyncio.sleep(0.05)
        assert await _free_blocks(ae) == BLOCKS

    asyncio.run(main())


def test_a_request_given_up_while_waiting_keeps_no_blocks(engine) -> None:  # type: ignore[no-untyped-def]
    ae, queue = engine

    async def main() -> None:
        await queue.reserve(ae, "a", _reserve("a"))
        waiting = asyncio.ensure_future(queue.reserve(ae, "b", _reserve("b")))
        await asyncio.sleep(0.1)
        waiting.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await waiting
        ae.abort("b")  # what the decode servicer does for a stream it gives up
        assert len(queue) == 0
        ae.abort("a")
        await asyncio.sleep(0.05)
        assert await _free_blocks(ae) == BLOCKS
        with pytest.raises(ValueError, match="prompt"):  # bad input fails at once
            await queue.reserve(ae, "bad", _reserve("bad", 10_000))

    asyncio.run(main())

"""AsyncEngine: the engine thread, streaming hand-off, aborts, errors and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.async_engine import AsyncEngine, EngineShutdownError
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import greedy, random_prompts
from tests.hf_oracle import hf_greedy


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture()
def aengine(llama: Path) -> Iterator[AsyncEngine]:
    engine = LLMEngine(
        EngineConfig(model=str(llama), dtype="float32", num_kv_blocks=64, num_host_blocks=16)
    )
    ae = AsyncEngine(engine)
    yield ae
    ae.shutdown()


async def _collect(ae: AsyncEngine, rid: str, **kwargs: object) -> list[RequestOutput]:
    return [out async for out in ae.generate(rid, **kwargs)]  # type: ignore[arg-type]


async def _wait_idle(ae: AsyncEngine, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await ae.call(lambda e: e.block_manager.is_idle() and not e.has_unfinished_requests()):
            ae.engine.block_manager.check_integrity()
            return
        await asyncio.sleep(0.01)
    raise AssertionError("engine did not go idle")


def test_concurrent_streams_equal_hf(aengine: AsyncEngine, llama: Path) -> None:
    vocab = aengine.engine.model_config.vocab_size
    prompts = random_prompts(4, vocab, 3, 20, seed=5)
    lengths = [3, 8, 5, 6]

    async def main() -> list[list[RequestOutput]]:
        return await asyncio.gather(
            *(
                _collect(aengine, f"r{i}", prompt_token_ids=p, sampling_params=greedy(n))
                for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
            )
        )

    results = asyncio.run(main())
    for p, n, outs in zip(prompts, lengths, results, strict=True):
        streamed = [t for o in outs for t in o.new_token_ids]
        assert streamed == outs[-1].token_ids == hf_greedy(llama, p, n)
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert not any(o.finished for o in outs[:-1])
        assert "".join(o.new_text for o in outs) == outs[-1].text
    assert aengine.engine.block_manager.is_idle()


def test_bad_input_raises_value_error_and_keeps_serving(aengine: AsyncEngine) -> None:
    async def main() -> list[RequestOutput]:
        with pytest.raises(ValueError, match="prompt"):
            await _collect(aengine, "bad", prompt_token_ids=[])
        with pytest.raises(ValueError, match="prompt_token_ids"):
            await _collect(aengine, "bad2", prompt_token_ids=[10**9])
        return await _collect(aengine, "good", prompt="hello there", sampling_params=greedy(2))

    outs = asyncio.run(main())
    assert outs[-1].finished and len(outs[-1].token_ids) == 2


def test_cancel_and_abort_free_blocks(aengine: AsyncEngine) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in aengine.generate(
                "cancelled", prompt_token_ids=list(range(3, 40)), sampling_params=greedy(10_000)
            ):
                started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await _wait_idle(aengine)

        # Closing the stream early (aclose) aborts the request too.
        gen = aengine.generate("closed", prompt_token_ids=[5, 6, 7], sampling_params=greedy(500))
        first = await gen.__anext__()
        assert not first.finished
        await gen.aclose()
        await _wait_idle(aengine)

    asyncio.run(main())


def test_step_error_fails_requests_and_keeps_serving(aengine: AsyncEngine) -> None:
    runner = aengine.engine.runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(sched_out):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return real(sched_out)

    runner.execute = flaky  # type: ignore[method-assign]

    async def main() -> tuple[list[RequestOutput], list[RequestOutput]]:
        failed = await _collect(
            aengine, "a", prompt_token_ids=[4, 5, 6], sampling_params=greedy(20)
        )
        ok = await _collect(aengine, "b", prompt_token_ids=[4, 5, 6], sampling_params=greedy(4))
        return failed, ok

    failed, ok = asyncio.run(main())
    assert failed[-1].finished and failed[-1].finish_reason == "error"
    assert ok[-1].finish_reason == "length" and len(ok[-1].token_ids) == 4
    assert aengine.engine.block_manager.is_idle()


def test_idle_thread_does_not_spin(aengine: AsyncEngine) -> None:
    asyncio.run(_collect(aengine, "x", prompt_token_ids=[4, 5], sampling_params=greedy(2)))
    steps = aengine.stats.num_steps
    time.sleep(0.3)
    assert aengine.stats.num_steps == steps
    assert aengine.stats.num_free_blocks == aengine.stats.num_blocks


def test_shutdown_ends_open_streams(aengine: AsyncEngine) -> None:
    async def main() -> list[RequestOutput]:
        outs: list[RequestOutput] = []
        gen = aengine.generate("long", prompt_token_ids=[4, 5, 6], sampling_params=greedy(10_000))
        outs.append(await gen.__anext__())
        await asyncio.to_thread(aengine.shutdown)
        async for out in gen:
            outs.append(out)
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert not aengine.is_running

    async def after() -> None:
        with pytest.raises(EngineShutdownError):
            await _collect(aengine, "late", prompt="hi", sampling_params=SamplingParams())

    asyncio.run(after())

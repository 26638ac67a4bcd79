"""One client request, many sequences: ``n`` > 1, ``best_of`` and batched prompts.

    prompt 0 ─▶ sequence 0 (leader) ──first output──▶ sequences 1 .. n-1 start
    prompt 1 ─▶ sequence n (leader) ──first output──▶ sequences n+1 .. 2n-1 start

A prompt's siblings start only once its leader produced a token: by then every full block of
the prompt is in the prefix cache, so each sibling computes at most its last partial block
(and one token) instead of the whole prompt — the prompt is prefilled once, and its blocks
are shared by reference count. With a seed, sequence j of a prompt samples with seed + j (as
vLLM does), so n seeded sequences equal n separate requests with those seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from engine.outputs import RequestOutput
from router.backend import GenerateRequest
from router.service import Router


@dataclass(frozen=True)
class Sequence:
    index: int  # the choice index the client sees (prompt * n + j)
    prompt_index: int
    request: GenerateRequest


def expand(prompts: list[GenerateRequest], n: int, strip_logprobs: bool = False) -> list[Sequence]:
    """``n`` sequences per prepared prompt request. Ids stay as given when there is only
    one sequence in all."""
    single = len(prompts) == 1 and n == 1
    out = []
    for p, req in enumerate(prompts):
        for j in range(n):
            params = req.sampling_params
            if params.seed is not None and j:
                params = dataclasses.replace(params, seed=(params.seed + j) % 2**64)
            rid = req.request_id if single else f"{req.request_id}-{p * n + j}"
            out.append(
                Sequence(
                    p * n + j,
                    p,
                    dataclasses.replace(req, request_id=rid, sampling_params=params),
                )
            )
    return out


async def stream_all(
    router: Router, sequences: list[Sequence], deadline: float | None
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Every sequence's outputs, interleaved as they come, tagged with the sequence's index.
    The first failure (a ``RequestError``) cancels the rest and is raised; leaving early
    aborts every sequence, before this generator's own close returns (each sequence's
    request id is free again by then)."""
    if len(sequences) == 1:
        seq = sequences[0]
        async with contextlib.aclosing(router.stream(seq.request, deadline)) as outputs:
            async for out in outputs:
                yield seq.index, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []
    followers: dict[int, list[Sequence]] = {}
    leaders: list[Sequence] = []
    for seq in sequences:
        if seq.prompt_index in followers:
            followers[seq.prompt_index].append(seq)
        else:
            followers[seq.prompt_index] = []
            leaders.append(seq)

    def start(seq: Sequence, lead: bool) -> None:
        tasks.append(asyncio.ensure_future(pump(seq, lead)))

    async def pump(seq: Sequence, lead: bool) -> None:
        first = True
        try:
            async with contextlib.aclosing(router.stream(seq.request, deadline)) as outputs:
                async for out in outputs:
                    queue.put_nowait((seq.index, out, None))
                    if lead and first:
                        for f in followers[seq.prompt_index]:
                            start(f, False)
                    first = False
            queue.put_nowait((seq.index, None, None))
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            queue.put_nowait((seq.index, None, e))

    for seq in leaders:
        start(seq, True)
    remaining = len(sequences)
    try:
        while remaining:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is None:
                remaining -= 1
                continue
            yield index, item
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)


def best_of(
    finals: dict[int, RequestOutput], sequences: list[Sequence], n: int, keep_logprobs: bool
) -> dict[int, RequestOutput]:
    """Per prompt, the ``n`` finished sequences with the highest cumulative logprob,
    re-indexed ``prompt * n + rank``."""
    chosen: dict[int, RequestOutput] = {}
    by_prompt: dict[int, list[RequestOutput]] = {}
    for seq in sequences:
        by_prompt.setdefault(seq.prompt_index, []).append(finals[seq.index])
    for p, outs in by_prompt.items():
        ranked = sorted(outs, key=lambda o: o.cumulative_logprob or 0.0, reverse=True)
        for rank, out in enumerate(ranked[:n]):
            chosen[p * n + rank] = (
                out if keep_logprobs else dataclasses.replace(out, logprobs=None, new_logprobs=None)
            )
    return chosen

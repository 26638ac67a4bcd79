"""The router's pieces without a server: admission, request bodies, error mapping, proto
conversion, response formatting, and the Router flow over a fake ``Backend`` (the contract a
disaggregated backend must keep: closing the stream early aborts the request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from engine.outputs import RequestOutput, SampledToken
from engine.sampling_params import SamplingParams
from pdserve.wire import delta_to_proto as response_from_output
from pdserve.wire import sampling_params_from_proto
from protos.pdserve.v1 import generate_pb2 as pb
from router.admission import Admission, AdmissionRejected
from router.backend import Backend, GenerateRequest, Load, ModelInfo
from router.errors import ErrorKind, RequestError, invalid_argument
from router.openai_format import ChatFormatter, CompletionFormatter
from router.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.service import Router
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions


def test_admission_bounds_and_release_is_idempotent() -> None:
    a = Admission(2, retry_after_s=3)
    s1, s2 = a.acquire(), a.acquire()
    with pytest.raises(AdmissionRejected) as info:
        a.acquire()
    assert info.value.retry_after_s == 3 and a.num_rejected == 1
    s1.release()
    s1.release()
    assert a.num_inflight == 1
    with a.acquire():
        assert a.num_inflight == 2
    s2.release()
    assert a.num_inflight == 0
    with pytest.raises(ValueError, match="max_queue"):
        Admission(0)


def test_request_bodies_map_to_sampling_params() -> None:
    c = CompletionRequest.model_validate(
        {"prompt": "hi", "max_tokens": 5, "temperature": 0, "top_k": 3, "stop": "x",
         "stop_token_ids": [7], "ignore_eos": True, "min_tokens": 1, "logprobs": 2}
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown_field"):  # never silently ignored (issue 19)
        CompletionRequest.model_validate({"prompt": "hi", "unknown_field": 1})
    assert c.sampling_params() == SamplingParams(
        max_tokens=5, temperature=0.0, top_k=3, stop=("x",), stop_token_ids=(7,),
        ignore_eos=True, min_tokens=1, logprobs=2,
    )  # fmt: skip
    assert c.prompts() == ["hi"]
    assert CompletionRequest.model_validate({"prompt": [[1, 2]]}).prompts() == [[1, 2]]
    assert CompletionRequest.model_validate({"prompt": ["a", "b"]}).prompts() == ["a", "b"]
    assert CompletionRequest.model_validate({"prompt": [1, 2]}).prompts() == [[1, 2]]
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
         "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3}
    )  # fmt: skip
    assert chat.sampling_params().max_tokens == 4 and chat.sampling_params().logprobs == 3
    assert chat.sampling_params().temperature == 1.0  # OpenAI's default, not greedy
    assert chat.messages[0].as_template_input() == {"role": "user", "content": "a"}
    for missing in ({"role": "user"}, {"role": "system", "content": None}):
        with pytest.raises(ValueError, match="content"):  # issue 12 defect 8
            ChatCompletionRequest.model_validate({"messages": [missing]})
    with pytest.raises(ValueError, match=r"^top_logprobs"):
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}
        ).sampling_params()


def test_value_errors_name_their_field() -> None:
    assert invalid_argument(ValueError("top_p must be in (0, 1]")).param == "top_p"
    assert invalid_argument(ValueError("prompt_token_ids must be ...")).param == "prompt"
    assert invalid_argument(ValueError("prompt is 9 tokens"), "messages").param == "messages"
    e = invalid_argument(ValueError("something else entirely"))
    assert e.kind is ErrorKind.INVALID and e.param is None


def test_proto_sampling_params_defaults_match_the_engine() -> None:
    assert sampling_params_from_proto(pb.SamplingParams()) == SamplingParams()
    sp = sampling_params_from_proto(
        pb.SamplingParams(max_tokens=3, temperature=0.0, top_p=0.5, seed=0, logprobs=0,
                          skip_special_tokens=False, stop=["a"], stop_token_ids=[1])
    )  # fmt: skip
    assert sp == SamplingParams(
        max_tokens=3, temperature=0.0, top_p=0.5, seed=0, logprobs=0, skip_special_tokens=False,
        stop=("a",), stop_token_ids=(1,),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^max_tokens"):
        sampling_params_from_proto(pb.SamplingParams(max_tokens=0))


def _output(
    new: list[int], done: bool, reason: str | None = None, text: str = "", so_far: int = 0
) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt_token_ids=[1, 2, 3],
        token_ids=list(range(so_far)) + new,
        text=text,
        new_token_ids=new,
        new_text=text,
        finished=done,
        finish_reason=reason,
        stop_reason=9 if reason == "stop" else None,
        new_logprobs=[SampledToken(t, -0.5, ((t, -0.5), (0, -1.0))) for t in new],
        logprobs=[SampledToken(t, -0.5, ((t, -0.5),)) for t in new],
    )


def test_response_formatting() -> None:
    msg = response_from_output(_output([4], True, "stop", "d", so_far=2))
    assert list(msg.token_ids) == [4] and msg.finished and msg.finish_reason == "stop"
    assert msg.stop_token_id == 9 and msg.usage.prompt_tokens == 3
    assert msg.usage.completion_tokens == 3
    assert msg.logprobs[0].top_logprobs[1].token_id == 0
    partial = response_from_output(_output([4], False, text="x"))
    assert not partial.HasField("usage") and partial.finish_reason == ""

    def strings(ids: Sequence[int]) -> list[str]:
        return [f"<{i}>" for i in ids]

    chat = ChatFormatter("id", "m", strings)
    first = chat.chunk(0, _output([4], False, text="a"))
    assert first is not None and first["choices"][0]["delta"] == {"role": "assistant",
                                                                  "content": "a"}  # fmt: skip
    lp = first["choices"][0]["logprobs"]["content"][0]
    assert lp["token"] == "<4>" and lp["bytes"] == list(b"<4>") and len(lp["top_logprobs"]) == 2
    last = chat.chunk(0, _output([], True, "length"))
    assert last is not None and last["choices"][0]["finish_reason"] == "length"
    comp = CompletionFormatter("id", "m", strings).response(
        {0: _output([4, 5], True, "length", "ab")}
    )
    assert comp["choices"][0]["text"] == "ab"
    assert comp["choices"][0]["logprobs"]["text_offset"] == [0, 3]
    assert comp["usage"]["total_tokens"] == 5


class FakeBackend:
    """A Backend that emits one token every ``delay_s`` and records what happened."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.closed_early: list[str] = []

    async def start(self) -> None:
        return None

    def model_info(self) -> ModelInfo:
        return ModelInfo("fake", "llama", "float32", 64, 100, 16)

    def load(self) -> Load:
        return Load(8, 8, 0, 0)

    def is_healthy(self) -> bool:
        return True

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        if request.sampling_params.seed == 666:
            raise ValueError("seed: unlucky")
        n = request.sampling_params.max_tokens or 1
        done = False
        try:
            for i in range(n):
                await asyncio.sleep(self.delay_s)
                done = i == n - 1
                yield _output([i], done, "length" if done else None, so_far=i)
        finally:
            if not done:
                self.closed_early.append(request.request_id)

    def abort(self, request_id: str) -> None:
        return None

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 100 for c in text]

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return [str(t) for t in token_ids]

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        return self.tokenize("".join(m["content"] for m in messages))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "".join(self.token_strings(token_ids))

    async def close(self) -> None:
        return None


def test_router_flow_over_a_fake_backend() -> None:
    backend = FakeBackend()
    checked: Backend = backend  # the fake satisfies the protocol (mypy checks this line)
    router = Router(checked, Admission(4))

    with pytest.raises(RequestError) as info:
        asyncio.run(router.prepare(SamplingParams(), prompt="x" * 64))
    assert info.value.param == "prompt" and "max_model_len" in info.value.message
    with pytest.raises(RequestError) as info:
        asyncio.run(router.prepare(SamplingParams(), messages=[{"role": "user", "content": ""}]))
    assert info.value.param == "messages"
    with pytest.raises(RequestError) as info:
        router.check_model("other")
    assert info.value.kind is ErrorKind.NOT_FOUND
    router.check_model("")
    router.check_model("fake")

    async def main() -> None:
        req = await router.prepare(SamplingParams(max_tokens=3), prompt="abc", request_id="ok")
        outs = [o async for o in router.stream(req, router.deadline(10))]
        assert [o.new_token_ids for o in outs] == [[0], [1], [2]] and outs[-1].finished

        slow = await router.prepare(SamplingParams(max_tokens=60), prompt="abc", request_id="slow")
        with pytest.raises(RequestError) as timeout:
            async for _ in router.stream(slow, router.deadline(0.05)):
                pass
        assert timeout.value.kind is ErrorKind.TIMEOUT

        bad = await router.prepare(SamplingParams(seed=666), prompt="abc", request_id="bad")
        with pytest.raises(RequestError) as invalid:
            async for _ in router.stream(bad, None):
                pass
        assert invalid.value.kind is ErrorKind.INVALID and invalid.value.param == "seed"

        gone = await router.prepare(SamplingParams(max_tokens=60), prompt="abc", request_id="gone")

        async def consume() -> None:
            async for _ in router.stream(gone, None):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert backend.closed_early == ["slow", "gone"]


def test_drain_refuses_new_requests_and_fails_unfinished_ones_at_the_grace() -> None:
    backend = FakeBackend(delay_s=0.01)
    router = Router(backend, Admission(4))

    async def main() -> None:
        quick = await router.prepare(SamplingParams(max_tokens=3), prompt="abc", request_id="quick")
        slow = await router.prepare(SamplingParams(max_tokens=60), prompt="abc", request_id="slow")
        waiting = await router.prepare(SamplingParams(max_tokens=60), prompt="abc", request_id="w")

        async def run(req: GenerateRequest, deadline: float | None) -> list[Any]:
            with router.admit():
                outs: list[Any] = []
                try:
                    async for o in router.stream(req, deadline):
                        outs.append(o)
                except RequestError as e:
                    outs.append(e)
                return outs

        tasks = [
            asyncio.ensure_future(run(quick, None)),
            asyncio.ensure_future(run(slow, None)),
            asyncio.ensure_future(run(waiting, router.deadline(30))),  # its own deadline later
        ]
        await asyncio.sleep(0.005)  # every stream waits for its first token
        router.begin_drain(0.2)
        with pytest.raises(RequestError) as refused:
            router.admit()
        assert refused.value.kind is ErrorKind.UNAVAILABLE
        start = asyncio.get_running_loop().time()
        quick_outs, slow_outs, waiting_outs = await asyncio.gather(*tasks)
        assert asyncio.get_running_loop().time() - start < 2.0
        assert quick_outs[-1].finished  # done within the grace
        for outs in (slow_outs, waiting_outs):
            error = outs[-1]
            assert isinstance(error, RequestError) and error.kind is ErrorKind.UNAVAILABLE
            assert "shutting down" in error.message
        assert await router.wait_idle(1.0)

    asyncio.run(main())
    assert sorted(backend.closed_early) == ["slow", "w"]

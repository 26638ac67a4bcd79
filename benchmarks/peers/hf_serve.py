"""Run `transformers serve` (Hugging Face's own OpenAI-compatible server) for `pdserve bench`.

Usage, from the repository root (arguments are exactly those of `transformers serve`):

    env PYTHONPATH=/work/hf-extra python benchmarks/peers/hf_serve.py MODEL_DIR \
        --continuous-batching --device cpu --dtype float32 \
        --cb-block-size 256 --cb-num-blocks 160 --cb-max-batch-tokens 512 \
        --host 127.0.0.1 --port 8203

It is the stock CLI (`transformers.cli.transformers.app`, the `Serve` command) with one
protocol shim: transformers 5.24's streamed `/v1/completions` and `/v1/chat/completions` end
after the last chunk without the OpenAI terminator `data: [DONE]`, and `pdserve bench` counts a
stream without it as failed (a dropped stream). The shim appends that one line after the
handler's own SSE generator has finished; everything else (model loading, continuous batching,
tokenization, usage report) is transformers' code, unchanged.

`transformers serve` always loads with `device_map=...`, which needs `accelerate`; it is not in
the project's Python, so it is installed on the side (`pip install --no-deps --target
/work/hf-extra accelerate==1.15.0`) and put on PYTHONPATH only for this process.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

DONE = "data: [DONE]\n\n"


def _with_done(streaming: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a handler's ``_streaming`` so its StreamingResponse ends with ``data: [DONE]``."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        response = streaming(self, *args, **kwargs)
        inner: AsyncIterator[Any] = response.body_iterator

        async def body() -> AsyncIterator[Any]:
            try:
                async for part in inner:
                    yield part
                yield DONE
            finally:  # a client disconnect closes us: close the handler's generator (it cancels)
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    await aclose()

        response.body_iterator = body()
        return response

    return wrapper


def install_done_shim() -> None:
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler

    for handler in (CompletionHandler, ChatCompletionHandler):
        handler._streaming = _with_done(handler._streaming)  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    try:
        import accelerate  # noqa: F401  (transformers serve passes device_map)
    except ImportError:
        sys.exit(
            "hf_serve: `accelerate` is missing; run `pip install --no-deps --target "
            "/work/hf-extra accelerate==1.15.0` and start with `env PYTHONPATH=/work/hf-extra`"
        )
    install_done_shim()
    from transformers.cli.transformers import app

    app(args=["serve", *argv], prog_name="transformers")


if __name__ == "__main__":
    main(sys.argv[1:])

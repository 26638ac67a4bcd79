"""vLLM's ``/tokenize`` and ``/detokenize``: the same bodies and answers its clients expect.

``/tokenize`` takes ``{"prompt": ...}`` (``add_special_tokens`` defaults to true) or
``{"messages": [...]}`` (the chat template, generation prompt appended; ``tools`` too) and
answers ``{"count", "max_model_len", "tokens", "token_strs"}``; ``/detokenize`` takes
``{"tokens": [...]}`` and answers ``{"prompt"}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from router.errors import ErrorKind, RequestError
from router.http_body import error_response, parse_body
from router.openai_protocol import ChatMessage, ChatTemplateFields
from router.openai_tools import ChatTool, template_tools
from router.service import Router


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Strict, ChatTemplateFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class _AnyTokenize(_Strict):
    """Either form, told apart by ``messages``."""

    model_config = ConfigDict(strict=True, extra="allow")


def add_tokenize_routes(app: FastAPI, router: Router) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        try:
            raw = await parse_body(request, _AnyTokenize, router)
            obj: dict[str, Any] = raw.model_dump()
            body: TokenizeCompletionRequest | TokenizeChatRequest
            if "messages" in obj:
                body = _validate(TokenizeChatRequest, obj)
            else:
                body = _validate(TokenizeCompletionRequest, obj)
            router.check_model(body.model)
            ids = await _tokenize(router, body)
        except RequestError as e:
            return error_response(e)
        strs = router.backend.token_strings(ids) if body.return_token_strs else None
        info = router.backend.model_info()
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": info.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        try:
            body = await parse_body(request, DetokenizeRequest, router)
            router.check_model(body.model)
            text = await router.detokenize(body.tokens)
        except RequestError as e:
            return error_response(e)
        return JSONResponse({"prompt": text})


def _validate(model: type[_Strict], obj: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"]
        param = str(loc[0]) if loc else None
        raise RequestError(
            ErrorKind.INVALID, f"{'.'.join(map(str, loc))}: {first['msg']}", param
        ) from None


async def _tokenize(
    router: Router, body: TokenizeCompletionRequest | TokenizeChatRequest
) -> list[int]:
    if isinstance(body, TokenizeCompletionRequest):
        return await router.prompts.tokenize(body.prompt, "prompt", body.add_special_tokens)
    messages = [m.as_template_input() for m in body.messages]
    return await router.prompts.chat(messages, template_tools(body.tools), body.template_options())

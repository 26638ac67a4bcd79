"""Response bodies as pydantic models, for ``/openapi.json`` only: the handlers build plain
dicts (``openai_format``), and the schemathesis test checks every answer against these."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from router.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.openapi_doc import Operation
from router.tokenize_api import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None


class CompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: str
    function: FunctionCall


class ToolCallDelta(ToolCallOut):
    index: int


class ChatResponseMessage(BaseModel):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` event of a chat stream (the stream ends with ``data: [DONE]``)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: str
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str
    load: dict[str, Any]
    num_inflight_requests: int
    max_inflight_requests: int
    num_rejected_requests: int


_SSE = "text/event-stream"
OPERATIONS: dict[str, Operation] = {
    "/v1/completions": Operation(
        "post",
        CompletionRequest,
        {"application/json": CompletionResponse, _SSE: CompletionResponse},
    ),
    "/v1/chat/completions": Operation(
        "post",
        ChatCompletionRequest,
        {"application/json": ChatCompletionResponse, _SSE: ChatCompletionChunk},
    ),
    "/tokenize": Operation(
        "post",
        TokenizeCompletionRequest,
        {"application/json": TokenizeResponse},
        alternatives=(TokenizeChatRequest,),
    ),
    "/detokenize": Operation("post", DetokenizeRequest, {"application/json": DetokenizeResponse}),
    "/v1/models": Operation("get", None, {"application/json": ModelList}, errors=()),
    "/v1/models/{model}": Operation("get", None, {"application/json": ModelCard}, errors=(404,)),
    "/health": Operation("get", None, {"application/json": Health}, errors=(503,)),
}

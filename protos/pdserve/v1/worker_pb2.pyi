# ruff: noqa
from protos.pdserve.v1 import generate_pb2 as _generate_pb2
from protos.pdserve.v1 import kv_transfer_pb2 as _kv_transfer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerGenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "priority", "local_prefill_max_tokens", "resume")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILL_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling_params: _generate_pb2.SamplingParams
    priority: int
    local_prefill_max_tokens: int
    resume: Resume
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling_params: _Optional[_Union[_generate_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., local_prefill_max_tokens: _Optional[int] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("num_generated_tokens", "emitted_text")
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EMITTED_TEXT_FIELD_NUMBER: _ClassVar[int]
    num_generated_tokens: int
    emitted_text: str
    def __init__(self, num_generated_tokens: _Optional[int] = ..., emitted_text: _Optional[str] = ...) -> None: ...

class DecodeMessage(_message.Message):
    __slots__ = ("reservation", "local_prefill", "output", "heartbeat")
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    reservation: _kv_transfer_pb2.KVReservation
    local_prefill: bool
    output: _generate_pb2.GenerateResponse
    heartbeat: bool
    def __init__(self, reservation: _Optional[_Union[_kv_transfer_pb2.KVReservation, _Mapping]] = ..., local_prefill: _Optional[bool] = ..., output: _Optional[_Union[_generate_pb2.GenerateResponse, _Mapping]] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "priority", "reservation", "resume")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling_params: _generate_pb2.SamplingParams
    priority: int
    reservation: _kv_transfer_pb2.KVReservation
    resume: Resume
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling_params: _Optional[_Union[_generate_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., reservation: _Optional[_Union[_kv_transfer_pb2.KVReservation, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "first_token_logprob", "num_cached_tokens", "num_blocks_sent", "num_blocks_skipped", "prefill_seconds", "first_token_top_logprobs")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_SENT_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    first_token_logprob: float
    num_cached_tokens: int
    num_blocks_sent: int
    num_blocks_skipped: int
    prefill_seconds: float
    first_token_top_logprobs: _containers.RepeatedCompositeFieldContainer[_generate_pb2.TopLogprob]
    def __init__(self, first_token_id: _Optional[int] = ..., first_token_logprob: _Optional[float] = ..., num_cached_tokens: _Optional[int] = ..., num_blocks_sent: _Optional[int] = ..., num_blocks_skipped: _Optional[int] = ..., prefill_seconds: _Optional[float] = ..., first_token_top_logprobs: _Optional[_Iterable[_Union[_generate_pb2.TopLogprob, _Mapping]]] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ("check_integrity",)
    CHECK_INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    check_integrity: bool
    def __init__(self, check_integrity: _Optional[bool] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("role", "num_blocks", "num_free_blocks", "num_running_requests", "num_waiting_requests", "num_queued_prefill_tokens", "kv_endpoint", "transport", "num_reservations", "draining", "integrity_checked", "integrity_error")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    NUM_RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_CHECKED_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_ERROR_FIELD_NUMBER: _ClassVar[int]
    role: str
    num_blocks: int
    num_free_blocks: int
    num_running_requests: int
    num_waiting_requests: int
    num_queued_prefill_tokens: int
    kv_endpoint: str
    transport: str
    num_reservations: int
    draining: bool
    integrity_checked: bool
    integrity_error: str
    def __init__(self, role: _Optional[str] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_running_requests: _Optional[int] = ..., num_waiting_requests: _Optional[int] = ..., num_queued_prefill_tokens: _Optional[int] = ..., kv_endpoint: _Optional[str] = ..., transport: _Optional[str] = ..., num_reservations: _Optional[int] = ..., draining: _Optional[bool] = ..., integrity_checked: _Optional[bool] = ..., integrity_error: _Optional[str] = ...) -> None: ...

# ruff: noqa
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_STATUS_UNSPECIFIED: _ClassVar[KVStatus]
    KV_STATUS_OK: _ClassVar[KVStatus]
    KV_STATUS_INCOMPATIBLE: _ClassVar[KVStatus]
    KV_STATUS_UNKNOWN_RESERVATION: _ClassVar[KVStatus]
    KV_STATUS_BAD_TOKEN: _ClassVar[KVStatus]
    KV_STATUS_FOREIGN_BLOCK: _ClassVar[KVStatus]
    KV_STATUS_BAD_REQUEST: _ClassVar[KVStatus]
    KV_STATUS_INCOMPLETE: _ClassVar[KVStatus]
KV_STATUS_UNSPECIFIED: KVStatus
KV_STATUS_OK: KVStatus
KV_STATUS_INCOMPATIBLE: KVStatus
KV_STATUS_UNKNOWN_RESERVATION: KVStatus
KV_STATUS_BAD_TOKEN: KVStatus
KV_STATUS_FOREIGN_BLOCK: KVStatus
KV_STATUS_BAD_REQUEST: KVStatus
KV_STATUS_INCOMPLETE: KVStatus

class KVCompatibility(_message.Message):
    __slots__ = ("protocol_version", "spec_fingerprint", "model_id", "dtype", "num_layers", "num_kv_heads", "head_dim", "block_size", "kv_layout")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    spec_fingerprint: str
    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    kv_layout: str
    def __init__(self, protocol_version: _Optional[int] = ..., spec_fingerprint: _Optional[str] = ..., model_id: _Optional[str] = ..., dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., kv_layout: _Optional[str] = ...) -> None: ...

class CachedBlock(_message.Message):
    __slots__ = ("block_index", "block_hash")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    block_hash: bytes
    def __init__(self, block_index: _Optional[int] = ..., block_hash: _Optional[bytes] = ...) -> None: ...

class KVReservation(_message.Message):
    __slots__ = ("request_id", "endpoint", "token", "block_ids", "cached_blocks", "lease_s", "compatibility")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    endpoint: str
    token: bytes
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    cached_blocks: _containers.RepeatedCompositeFieldContainer[CachedBlock]
    lease_s: float
    compatibility: KVCompatibility
    def __init__(self, request_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., token: _Optional[bytes] = ..., block_ids: _Optional[_Iterable[int]] = ..., cached_blocks: _Optional[_Iterable[_Union[CachedBlock, _Mapping]]] = ..., lease_s: _Optional[float] = ..., compatibility: _Optional[_Union[KVCompatibility, _Mapping]] = ...) -> None: ...

class KVHello(_message.Message):
    __slots__ = ("compatibility", "sender_id", "reply_address")
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    compatibility: KVCompatibility
    sender_id: int
    reply_address: bytes
    def __init__(self, compatibility: _Optional[_Union[KVCompatibility, _Mapping]] = ..., sender_id: _Optional[int] = ..., reply_address: _Optional[bytes] = ...) -> None: ...

class KVHelloReply(_message.Message):
    __slots__ = ("status", "error", "compatibility")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    status: KVStatus
    error: str
    compatibility: KVCompatibility
    def __init__(self, status: _Optional[_Union[KVStatus, str]] = ..., error: _Optional[str] = ..., compatibility: _Optional[_Union[KVCompatibility, _Mapping]] = ...) -> None: ...

class KVPush(_message.Message):
    __slots__ = ("request_id", "token", "block_indices", "block_ids", "payload_bytes", "segment_blocks", "payload_tag", "is_last", "first_token_id", "first_token_logprob")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_TAG_FIELD_NUMBER: _ClassVar[int]
    IS_LAST_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: bytes
    block_indices: _containers.RepeatedScalarFieldContainer[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    payload_bytes: int
    segment_blocks: _containers.RepeatedScalarFieldContainer[int]
    payload_tag: int
    is_last: bool
    first_token_id: int
    first_token_logprob: float
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[bytes] = ..., block_indices: _Optional[_Iterable[int]] = ..., block_ids: _Optional[_Iterable[int]] = ..., payload_bytes: _Optional[int] = ..., segment_blocks: _Optional[_Iterable[int]] = ..., payload_tag: _Optional[int] = ..., is_last: _Optional[bool] = ..., first_token_id: _Optional[int] = ..., first_token_logprob: _Optional[float] = ...) -> None: ...

class KVRenew(_message.Message):
    __slots__ = ("request_id", "token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: bytes
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[bytes] = ...) -> None: ...

class KVAbort(_message.Message):
    __slots__ = ("request_id", "token", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: bytes
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class KVAck(_message.Message):
    __slots__ = ("status", "error", "num_missing_blocks", "ready")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_MISSING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    status: KVStatus
    error: str
    num_missing_blocks: int
    ready: bool
    def __init__(self, status: _Optional[_Union[KVStatus, str]] = ..., error: _Optional[str] = ..., num_missing_blocks: _Optional[int] = ..., ready: _Optional[bool] = ...) -> None: ...

class KVFrame(_message.Message):
    __slots__ = ("seq", "sender_id", "hello", "hello_reply", "push", "renew", "abort", "ack")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HELLO_REPLY_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sender_id: int
    hello: KVHello
    hello_reply: KVHelloReply
    push: KVPush
    renew: KVRenew
    abort: KVAbort
    ack: KVAck
    def __init__(self, seq: _Optional[int] = ..., sender_id: _Optional[int] = ..., hello: _Optional[_Union[KVHello, _Mapping]] = ..., hello_reply: _Optional[_Union[KVHelloReply, _Mapping]] = ..., push: _Optional[_Union[KVPush, _Mapping]] = ..., renew: _Optional[_Union[KVRenew, _Mapping]] = ..., abort: _Optional[_Union[KVAbort, _Mapping]] = ..., ack: _Optional[_Union[KVAck, _Mapping]] = ...) -> None: ...

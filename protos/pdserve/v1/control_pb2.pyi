# ruff: noqa
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetWorkerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfoReply(_message.Message):
    __slots__ = ("worker_id", "role", "epoch", "grpc_address", "kv_endpoint", "transport", "state", "model", "architecture", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim", "num_blocks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    epoch: int
    grpc_address: str
    kv_endpoint: str
    transport: str
    state: str
    model: str
    architecture: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., grpc_address: _Optional[str] = ..., kv_endpoint: _Optional[str] = ..., transport: _Optional[str] = ..., state: _Optional[str] = ..., model: _Optional[str] = ..., architecture: _Optional[str] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class GetLoadReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("epoch", "seq", "num_blocks", "num_free_blocks", "num_running_requests", "num_waiting_requests", "num_queued_prefill_tokens", "step_time_s")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    num_blocks: int
    num_free_blocks: int
    num_running_requests: int
    num_waiting_requests: int
    num_queued_prefill_tokens: int
    step_time_s: float
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_running_requests: _Optional[int] = ..., num_waiting_requests: _Optional[int] = ..., num_queued_prefill_tokens: _Optional[int] = ..., step_time_s: _Optional[float] = ...) -> None: ...

class GetKVSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVSnapshotReply(_message.Message):
    __slots__ = ("worker_id", "generation", "last_seq", "block_hashes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    generation: int
    last_seq: int
    block_hashes: bytes
    def __init__(self, worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., last_seq: _Optional[int] = ..., block_hashes: _Optional[bytes] = ...) -> None: ...

class GetKVEventsRequest(_message.Message):
    __slots__ = ("generation", "after_seq")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    generation: int
    after_seq: int
    def __init__(self, generation: _Optional[int] = ..., after_seq: _Optional[int] = ...) -> None: ...

class KVEventsReply(_message.Message):
    __slots__ = ("snapshot_needed", "generation", "first_seq", "events")
    SNAPSHOT_NEEDED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    snapshot_needed: bool
    generation: int
    first_seq: int
    events: bytes
    def __init__(self, snapshot_needed: _Optional[bool] = ..., generation: _Optional[int] = ..., first_seq: _Optional[int] = ..., events: _Optional[bytes] = ...) -> None: ...

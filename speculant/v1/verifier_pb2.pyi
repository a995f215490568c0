from speculant.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("session_id", "prompt_token_ids", "temperature", "seed", "sampling", "top_logprobs", "constraint")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    temperature: float
    seed: int
    sampling: _common_pb2.SamplingControls
    top_logprobs: int
    constraint: _common_pb2.Constraint
    def __init__(self, session_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingControls, _Mapping]] = ..., top_logprobs: _Optional[int] = ..., constraint: _Optional[_Union[_common_pb2.Constraint, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("session_id", "token_id", "logprobs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_id: int
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, session_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "draft_token_ids", "draft_distributions", "draft_parents")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PARENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_distributions: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    draft_parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., draft_distributions: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., draft_parents: _Optional[_Iterable[int]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("accepted_count", "token_ids", "accepted_draft_indices", "logprobs", "forward_seconds", "batch_rows")
    ACCEPTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_INDICES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    accepted_count: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    accepted_draft_indices: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    forward_seconds: float
    batch_rows: int
    def __init__(self, accepted_count: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., accepted_draft_indices: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., forward_seconds: _Optional[float] = ..., batch_rows: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("prefill", "verify")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    prefill: PrefillRequest
    verify: VerifyRequest
    def __init__(self, prefill: _Optional[_Union[PrefillRequest, _Mapping]] = ..., verify: _Optional[_Union[VerifyRequest, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("prefill", "verify")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    prefill: PrefillResponse
    verify: VerifyResponse
    def __init__(self, prefill: _Optional[_Union[PrefillResponse, _Mapping]] = ..., verify: _Optional[_Union[VerifyResponse, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model_name", "tokenizer_name", "tokenizer_fingerprint", "vocab_size", "eos_token_ids", "max_context_length", "device", "dtype", "verify_cost_seconds")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_context_length: int
    device: str
    dtype: str
    verify_cost_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, model_name: _Optional[str] = ..., tokenizer_name: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_context_length: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., verify_cost_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("live_sessions", "sessions_created", "sessions_released", "sessions_expired", "forward_passes", "draft_tokens", "accepted_tokens")
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_CREATED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_RELEASED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    live_sessions: int
    sessions_created: int
    sessions_released: int
    sessions_expired: int
    forward_passes: int
    draft_tokens: int
    accepted_tokens: int
    def __init__(self, live_sessions: _Optional[int] = ..., sessions_created: _Optional[int] = ..., sessions_released: _Optional[int] = ..., sessions_expired: _Optional[int] = ..., forward_passes: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ...) -> None: ...

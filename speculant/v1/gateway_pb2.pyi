from speculant.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_MAX_TOKENS: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_MAX_TOKENS: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CONTEXT_LENGTH: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_tokens", "temperature", "seed", "stop", "draft", "sampling", "top_logprobs", "prompt_token_ids", "constraint", "graph")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_tokens: int
    temperature: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    draft: _common_pb2.DraftOptions
    sampling: _common_pb2.SamplingControls
    top_logprobs: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    constraint: _common_pb2.Constraint
    graph: str
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., draft: _Optional[_Union[_common_pb2.DraftOptions, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingControls, _Mapping]] = ..., top_logprobs: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., constraint: _Optional[_Union[_common_pb2.Constraint, _Mapping]] = ..., graph: _Optional[str] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("rounds", "draft_tokens", "accepted_tokens", "acceptance_rate", "accepted_by_position", "drafted_by_position", "tokens_per_second", "tokens_per_round", "prompt_tokens", "generated_tokens", "total_seconds", "draft_seconds", "verify_seconds", "other_seconds", "draft_failures", "accepted_from_graph", "accepted_from_overlay", "accepted_from_both", "wasted_draft_tokens", "unverified_draft_tokens", "rounds_without_draft", "accepted_from_grammar", "round_times")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_BY_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_BY_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OTHER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FROM_GRAPH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FROM_OVERLAY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FROM_BOTH_FIELD_NUMBER: _ClassVar[int]
    WASTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_WITHOUT_DRAFT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FROM_GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    ROUND_TIMES_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    accepted_by_position: _containers.RepeatedScalarFieldContainer[int]
    drafted_by_position: _containers.RepeatedScalarFieldContainer[int]
    tokens_per_second: float
    tokens_per_round: float
    prompt_tokens: int
    generated_tokens: int
    total_seconds: float
    draft_seconds: float
    verify_seconds: float
    other_seconds: float
    draft_failures: int
    accepted_from_graph: int
    accepted_from_overlay: int
    accepted_from_both: int
    wasted_draft_tokens: int
    unverified_draft_tokens: int
    rounds_without_draft: int
    accepted_from_grammar: int
    round_times: RoundTimes
    def __init__(self, rounds: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., accepted_by_position: _Optional[_Iterable[int]] = ..., drafted_by_position: _Optional[_Iterable[int]] = ..., tokens_per_second: _Optional[float] = ..., tokens_per_round: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., total_seconds: _Optional[float] = ..., draft_seconds: _Optional[float] = ..., verify_seconds: _Optional[float] = ..., other_seconds: _Optional[float] = ..., draft_failures: _Optional[int] = ..., accepted_from_graph: _Optional[int] = ..., accepted_from_overlay: _Optional[int] = ..., accepted_from_both: _Optional[int] = ..., wasted_draft_tokens: _Optional[int] = ..., unverified_draft_tokens: _Optional[int] = ..., rounds_without_draft: _Optional[int] = ..., accepted_from_grammar: _Optional[int] = ..., round_times: _Optional[_Union[RoundTimes, _Mapping]] = ...) -> None: ...

class RoundTimes(_message.Message):
    __slots__ = ("round", "draft", "draft_hop", "sizer", "forward", "verify_hop", "gateway")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_HOP_FIELD_NUMBER: _ClassVar[int]
    SIZER_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    VERIFY_HOP_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    round: _containers.RepeatedScalarFieldContainer[float]
    draft: _containers.RepeatedScalarFieldContainer[float]
    draft_hop: _containers.RepeatedScalarFieldContainer[float]
    sizer: _containers.RepeatedScalarFieldContainer[float]
    forward: _containers.RepeatedScalarFieldContainer[float]
    verify_hop: _containers.RepeatedScalarFieldContainer[float]
    gateway: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, round: _Optional[_Iterable[float]] = ..., draft: _Optional[_Iterable[float]] = ..., draft_hop: _Optional[_Iterable[float]] = ..., sizer: _Optional[_Iterable[float]] = ..., forward: _Optional[_Iterable[float]] = ..., verify_hop: _Optional[_Iterable[float]] = ..., gateway: _Optional[_Iterable[float]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stats: GenerationStats
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("text_delta", "token_ids", "finish_reason", "stats", "logprobs")
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text_delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stats: GenerationStats
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, text_delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_STRATEGY_UNSPECIFIED: _ClassVar[DraftStrategy]
    DRAFT_STRATEGY_GREEDY: _ClassVar[DraftStrategy]
    DRAFT_STRATEGY_SAMPLING: _ClassVar[DraftStrategy]
DRAFT_STRATEGY_UNSPECIFIED: DraftStrategy
DRAFT_STRATEGY_GREEDY: DraftStrategy
DRAFT_STRATEGY_SAMPLING: DraftStrategy

class SparseDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class SamplingControls(_message.Message):
    __slots__ = ("top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "grammar")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: Choice
    grammar: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choice, _Mapping]] = ..., grammar: _Optional[str] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top_token_ids", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class DraftOptions(_message.Message):
    __slots__ = ("k", "strategy", "attentive_mix", "order_bias", "mix_temperature", "reliability_weight", "entropy_penalty", "mixing", "escape_weight", "overlay_weight", "tree_nodes", "draft_size")
    K_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ATTENTIVE_MIX_FIELD_NUMBER: _ClassVar[int]
    ORDER_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIX_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    RELIABILITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIXING_FIELD_NUMBER: _ClassVar[int]
    ESCAPE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OVERLAY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SIZE_FIELD_NUMBER: _ClassVar[int]
    k: int
    strategy: DraftStrategy
    attentive_mix: bool
    order_bias: float
    mix_temperature: float
    reliability_weight: float
    entropy_penalty: float
    mixing: str
    escape_weight: float
    overlay_weight: float
    tree_nodes: int
    draft_size: str
    def __init__(self, k: _Optional[int] = ..., strategy: _Optional[_Union[DraftStrategy, str]] = ..., attentive_mix: _Optional[bool] = ..., order_bias: _Optional[float] = ..., mix_temperature: _Optional[float] = ..., reliability_weight: _Optional[float] = ..., entropy_penalty: _Optional[float] = ..., mixing: _Optional[str] = ..., escape_weight: _Optional[float] = ..., overlay_weight: _Optional[float] = ..., tree_nodes: _Optional[int] = ..., draft_size: _Optional[str] = ...) -> None: ...

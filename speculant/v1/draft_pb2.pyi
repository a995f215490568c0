from speculant.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("context_token_ids", "k", "strategy", "attentive_mix", "order_bias", "mix_temperature", "reliability_weight", "entropy_penalty", "seed", "mixing", "escape_weight", "overlay_weight", "tree_nodes", "request_id", "graph", "tenant", "graph_id")
    CONTEXT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ATTENTIVE_MIX_FIELD_NUMBER: _ClassVar[int]
    ORDER_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIX_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    RELIABILITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIXING_FIELD_NUMBER: _ClassVar[int]
    ESCAPE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OVERLAY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    context_token_ids: _containers.RepeatedScalarFieldContainer[int]
    k: int
    strategy: _common_pb2.DraftStrategy
    attentive_mix: bool
    order_bias: float
    mix_temperature: float
    reliability_weight: float
    entropy_penalty: float
    seed: int
    mixing: str
    escape_weight: float
    overlay_weight: float
    tree_nodes: int
    request_id: str
    graph: str
    tenant: str
    graph_id: str
    def __init__(self, context_token_ids: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., strategy: _Optional[_Union[_common_pb2.DraftStrategy, str]] = ..., attentive_mix: _Optional[bool] = ..., order_bias: _Optional[float] = ..., mix_temperature: _Optional[float] = ..., reliability_weight: _Optional[float] = ..., entropy_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., mixing: _Optional[str] = ..., escape_weight: _Optional[float] = ..., overlay_weight: _Optional[float] = ..., tree_nodes: _Optional[int] = ..., request_id: _Optional[str] = ..., graph: _Optional[str] = ..., tenant: _Optional[str] = ..., graph_id: _Optional[str] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("draft_token_ids", "distributions", "matched_orders", "draft_sources", "draft_parents", "draft_path_probs", "draft_seconds", "graph_id")
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_ORDERS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SOURCES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PARENTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PATH_PROBS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    distributions: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    matched_orders: _containers.RepeatedScalarFieldContainer[int]
    draft_sources: _containers.RepeatedScalarFieldContainer[str]
    draft_parents: _containers.RepeatedScalarFieldContainer[int]
    draft_path_probs: _containers.RepeatedScalarFieldContainer[float]
    draft_seconds: float
    graph_id: str
    def __init__(self, draft_token_ids: _Optional[_Iterable[int]] = ..., distributions: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., matched_orders: _Optional[_Iterable[int]] = ..., draft_sources: _Optional[_Iterable[str]] = ..., draft_parents: _Optional[_Iterable[int]] = ..., draft_path_probs: _Optional[_Iterable[float]] = ..., draft_seconds: _Optional[float] = ..., graph_id: _Optional[str] = ...) -> None: ...

class LearnRequest(_message.Message):
    __slots__ = ("token_ids", "generation_id", "persist", "graph", "tenant")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    generation_id: str
    persist: bool
    graph: str
    tenant: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., generation_id: _Optional[str] = ..., persist: _Optional[bool] = ..., graph: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class LiveLayerStats(_message.Message):
    __slots__ = ("documents", "tokens", "contexts", "estimated_bytes", "max_bytes", "learned_documents", "forgotten_documents", "weight")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEARNED_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    documents: int
    tokens: int
    contexts: int
    estimated_bytes: int
    max_bytes: int
    learned_documents: int
    forgotten_documents: int
    weight: float
    def __init__(self, documents: _Optional[int] = ..., tokens: _Optional[int] = ..., contexts: _Optional[int] = ..., estimated_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., learned_documents: _Optional[int] = ..., forgotten_documents: _Optional[int] = ..., weight: _Optional[float] = ...) -> None: ...

class LearnResponse(_message.Message):
    __slots__ = ("learning", "learned_tokens", "persisted", "live")
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    LEARNED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    learning: bool
    learned_tokens: int
    persisted: bool
    live: LiveLayerStats
    def __init__(self, learning: _Optional[bool] = ..., learned_tokens: _Optional[int] = ..., persisted: _Optional[bool] = ..., live: _Optional[_Union[LiveLayerStats, _Mapping]] = ...) -> None: ...

class GetGraphInfoRequest(_message.Message):
    __slots__ = ("graph",)
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    graph: str
    def __init__(self, graph: _Optional[str] = ...) -> None: ...

class OrderStats(_message.Message):
    __slots__ = ("order", "contexts", "ngrams", "total_count")
    ORDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    NGRAMS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    order: int
    contexts: int
    ngrams: int
    total_count: int
    def __init__(self, order: _Optional[int] = ..., contexts: _Optional[int] = ..., ngrams: _Optional[int] = ..., total_count: _Optional[int] = ...) -> None: ...

class GetGraphInfoResponse(_message.Message):
    __slots__ = ("format_version", "max_order", "tokenizer_name", "tokenizer_fingerprint", "vocab_size", "corpus_documents", "corpus_tokens", "orders", "build_params_json", "built_at", "graph_path", "graph_version", "live", "context_window", "name", "graph_names", "graph_bytes", "resident_bytes", "graph_id")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_ORDER_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CORPUS_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CORPUS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    BUILD_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    BUILT_AT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_PATH_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAMES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    max_order: int
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    corpus_documents: int
    corpus_tokens: int
    orders: _containers.RepeatedCompositeFieldContainer[OrderStats]
    build_params_json: str
    built_at: str
    graph_path: str
    graph_version: int
    live: LiveLayerStats
    context_window: int
    name: str
    graph_names: _containers.RepeatedScalarFieldContainer[str]
    graph_bytes: int
    resident_bytes: int
    graph_id: str
    def __init__(self, format_version: _Optional[int] = ..., max_order: _Optional[int] = ..., tokenizer_name: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ..., corpus_documents: _Optional[int] = ..., corpus_tokens: _Optional[int] = ..., orders: _Optional[_Iterable[_Union[OrderStats, _Mapping]]] = ..., build_params_json: _Optional[str] = ..., built_at: _Optional[str] = ..., graph_path: _Optional[str] = ..., graph_version: _Optional[int] = ..., live: _Optional[_Union[LiveLayerStats, _Mapping]] = ..., context_window: _Optional[int] = ..., name: _Optional[str] = ..., graph_names: _Optional[_Iterable[str]] = ..., graph_bytes: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., graph_id: _Optional[str] = ...) -> None: ...

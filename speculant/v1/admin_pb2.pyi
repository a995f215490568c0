from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GraphStatus(_message.Message):
    __slots__ = ("name", "path", "is_default", "tokens", "bytes", "resident_bytes", "graph_version", "graph_id", "max_order", "tokenizer_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ORDER_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    is_default: bool
    tokens: int
    bytes: int
    resident_bytes: int
    graph_version: int
    graph_id: str
    max_order: int
    tokenizer_name: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., is_default: _Optional[bool] = ..., tokens: _Optional[int] = ..., bytes: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., graph_version: _Optional[int] = ..., graph_id: _Optional[str] = ..., max_order: _Optional[int] = ..., tokenizer_name: _Optional[str] = ...) -> None: ...

class AddGraphRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class AddGraphResponse(_message.Message):
    __slots__ = ("graph", "replaced")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    graph: GraphStatus
    replaced: bool
    def __init__(self, graph: _Optional[_Union[GraphStatus, _Mapping]] = ..., replaced: _Optional[bool] = ...) -> None: ...

class RemoveGraphRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveGraphResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGraphsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGraphsResponse(_message.Message):
    __slots__ = ("graphs",)
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    graphs: _containers.RepeatedCompositeFieldContainer[GraphStatus]
    def __init__(self, graphs: _Optional[_Iterable[_Union[GraphStatus, _Mapping]]] = ...) -> None: ...

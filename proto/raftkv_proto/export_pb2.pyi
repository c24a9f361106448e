from raftkv_proto import kv_pb2 as _kv_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BeginExportRequest(_message.Message):
    __slots__ = ("prefix", "start", "end", "partitions", "ttl_ms")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    start: bytes
    end: bytes
    partitions: int
    ttl_ms: int
    def __init__(self, prefix: _Optional[bytes] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., partitions: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class BeginExportResponse(_message.Message):
    __slots__ = ("export_id", "index", "term", "cluster_id", "split_points", "start", "end", "key_count", "ttl_ms", "revision")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SPLIT_POINTS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    KEY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    index: int
    term: int
    cluster_id: str
    split_points: _containers.RepeatedScalarFieldContainer[bytes]
    start: bytes
    end: bytes
    key_count: int
    ttl_ms: int
    revision: int
    def __init__(self, export_id: _Optional[str] = ..., index: _Optional[int] = ..., term: _Optional[int] = ..., cluster_id: _Optional[str] = ..., split_points: _Optional[_Iterable[bytes]] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., key_count: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class ReadExportRequest(_message.Message):
    __slots__ = ("export_id", "start", "end", "batch_size")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    start: bytes
    end: bytes
    batch_size: int
    def __init__(self, export_id: _Optional[str] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., batch_size: _Optional[int] = ...) -> None: ...

class ExportBatch(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_kv_pb2.KeyValue]
    def __init__(self, items: _Optional[_Iterable[_Union[_kv_pb2.KeyValue, _Mapping]]] = ...) -> None: ...

class EndExportRequest(_message.Message):
    __slots__ = ("export_id",)
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    def __init__(self, export_id: _Optional[str] = ...) -> None: ...

class EndExportResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

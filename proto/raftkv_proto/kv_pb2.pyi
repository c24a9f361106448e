from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINEARIZABLE: _ClassVar[Consistency]
    LEASE: _ClassVar[Consistency]
    STALE: _ClassVar[Consistency]
LINEARIZABLE: Consistency
LEASE: Consistency
STALE: Consistency

class WriteHeader(_message.Message):
    __slots__ = ("client_id", "seq")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    seq: int
    def __init__(self, client_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class RegisterClientRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RegisterClientResponse(_message.Message):
    __slots__ = ("client_id", "index")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    index: int
    def __init__(self, client_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("key", "value", "header")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    header: WriteHeader
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., header: _Optional[_Union[WriteHeader, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("index",)
    INDEX_FIELD_NUMBER: _ClassVar[int]
    index: int
    def __init__(self, index: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "consistency")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    consistency: Consistency
    def __init__(self, key: _Optional[bytes] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "value", "index")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    index: int
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., index: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("key", "header")
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    header: WriteHeader
    def __init__(self, key: _Optional[bytes] = ..., header: _Optional[_Union[WriteHeader, _Mapping]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("existed", "index")
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    index: int
    def __init__(self, existed: _Optional[bool] = ..., index: _Optional[int] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("prefix", "start", "end", "limit", "consistency")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    start: bytes
    end: bytes
    limit: int
    consistency: Consistency
    def __init__(self, prefix: _Optional[bytes] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("items", "more", "index")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[KeyValue]
    more: bool
    index: int
    def __init__(self, items: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., more: _Optional[bool] = ..., index: _Optional[int] = ...) -> None: ...

class MovePrefix(_message.Message):
    __slots__ = ("source", "target")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    source: bytes
    target: bytes
    def __init__(self, source: _Optional[bytes] = ..., target: _Optional[bytes] = ...) -> None: ...

class Op(_message.Message):
    __slots__ = ("put", "delete", "delete_prefix", "move_prefix")
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    DELETE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MOVE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    put: KeyValue
    delete: bytes
    delete_prefix: bytes
    move_prefix: MovePrefix
    def __init__(self, put: _Optional[_Union[KeyValue, _Mapping]] = ..., delete: _Optional[bytes] = ..., delete_prefix: _Optional[bytes] = ..., move_prefix: _Optional[_Union[MovePrefix, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("ops", "header")
    OPS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    header: WriteHeader
    def __init__(self, ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ..., header: _Optional[_Union[WriteHeader, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("index", "existed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    index: int
    existed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, index: _Optional[int] = ..., existed: _Optional[_Iterable[bool]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("id", "role", "term", "leader", "commit_index", "applied_index", "snapshot_index", "peers", "cluster_id", "last_index", "leader_address", "log_size_bytes", "state_size_bytes", "address", "log_begin_index", "log_begin_term", "rejoining", "disk_full", "max_request_bytes", "pipeline_requests_held", "pipeline_reply_bytes_held", "corrupt", "state_checks")
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_BEGIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOG_BEGIN_TERM_FIELD_NUMBER: _ClassVar[int]
    REJOINING_FIELD_NUMBER: _ClassVar[int]
    DISK_FULL_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_REQUESTS_HELD_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_REPLY_BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    STATE_CHECKS_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: str
    term: int
    leader: str
    commit_index: int
    applied_index: int
    snapshot_index: int
    peers: _containers.ScalarMap[str, int]
    cluster_id: str
    last_index: int
    leader_address: str
    log_size_bytes: int
    state_size_bytes: int
    address: str
    log_begin_index: int
    log_begin_term: int
    rejoining: bool
    disk_full: bool
    max_request_bytes: int
    pipeline_requests_held: int
    pipeline_reply_bytes_held: int
    corrupt: str
    state_checks: _containers.RepeatedCompositeFieldContainer[StateCheck]
    def __init__(self, id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., peers: _Optional[_Mapping[str, int]] = ..., cluster_id: _Optional[str] = ..., last_index: _Optional[int] = ..., leader_address: _Optional[str] = ..., log_size_bytes: _Optional[int] = ..., state_size_bytes: _Optional[int] = ..., address: _Optional[str] = ..., log_begin_index: _Optional[int] = ..., log_begin_term: _Optional[int] = ..., rejoining: _Optional[bool] = ..., disk_full: _Optional[bool] = ..., max_request_bytes: _Optional[int] = ..., pipeline_requests_held: _Optional[int] = ..., pipeline_reply_bytes_held: _Optional[int] = ..., corrupt: _Optional[str] = ..., state_checks: _Optional[_Iterable[_Union[StateCheck, _Mapping]]] = ...) -> None: ...

class StateCheck(_message.Message):
    __slots__ = ("index", "sha256")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    index: int
    sha256: str
    def __init__(self, index: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotFileChunk(_message.Message):
    __slots__ = ("manifest_json", "total_size", "sha256", "offset", "data", "done")
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    manifest_json: bytes
    total_size: int
    sha256: str
    offset: int
    data: bytes
    done: bool
    def __init__(self, manifest_json: _Optional[bytes] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ...) -> None: ...

class Registration(_message.Message):
    __slots__ = ("secret",)
    SECRET_FIELD_NUMBER: _ClassVar[int]
    secret: bytes
    def __init__(self, secret: _Optional[bytes] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("header", "ops", "registration", "check_state")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    CHECK_STATE_FIELD_NUMBER: _ClassVar[int]
    header: WriteHeader
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    registration: Registration
    check_state: bool
    def __init__(self, header: _Optional[_Union[WriteHeader, _Mapping]] = ..., ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ..., registration: _Optional[_Union[Registration, _Mapping]] = ..., check_state: _Optional[bool] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, existed: _Optional[_Iterable[bool]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("timeout_ms", "put", "get", "delete")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    put: PutRequest
    get: GetRequest
    delete: DeleteRequest
    def __init__(self, timeout_ms: _Optional[int] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("kind", "message", "leader_id", "leader_address")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    leader_id: str
    leader_address: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...

class StreamReply(_message.Message):
    __slots__ = ("put", "get", "delete", "error")
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    put: PutResponse
    get: GetResponse
    delete: DeleteResponse
    error: StreamError
    def __init__(self, put: _Optional[_Union[PutResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ..., delete: _Optional[_Union[DeleteResponse, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class TaggedRequest(_message.Message):
    __slots__ = ("tag", "request")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    tag: int
    request: StreamRequest
    def __init__(self, tag: _Optional[int] = ..., request: _Optional[_Union[StreamRequest, _Mapping]] = ...) -> None: ...

class TaggedReply(_message.Message):
    __slots__ = ("tag", "reply")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    tag: int
    reply: StreamReply
    def __init__(self, tag: _Optional[int] = ..., reply: _Optional[_Union[StreamReply, _Mapping]] = ...) -> None: ...

class PipelineRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[TaggedRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[TaggedRequest, _Mapping]]] = ...) -> None: ...

class PipelineReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[TaggedReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[TaggedReply, _Mapping]]] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORMAL: _ClassVar[EntryType]
    NOOP: _ClassVar[EntryType]

class PushType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPEND: _ClassVar[PushType]
    COMPARE: _ClassVar[PushType]
    TRUNCATE: _ClassVar[PushType]
    COMMIT: _ClassVar[PushType]

class PushCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[PushCode]
    INCONSISTENT: _ClassVar[PushCode]
    STALE_TERM: _ClassVar[PushCode]
    REFUSED: _ClassVar[PushCode]
NORMAL: EntryType
NOOP: EntryType
APPEND: PushType
COMPARE: PushType
TRUNCATE: PushType
COMMIT: PushType
SUCCESS: PushCode
INCONSISTENT: PushCode
STALE_TERM: PushCode
REFUSED: PushCode

class Entry(_message.Message):
    __slots__ = ("index", "term", "type", "payload")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    type: EntryType
    payload: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., type: _Optional[_Union[EntryType, str]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("last_log_index", "last_log_term", "pre_vote")
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    last_log_index: int
    last_log_term: int
    pre_vote: bool
    def __init__(self, last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("granted", "pre_vote")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    pre_vote: bool
    def __init__(self, granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("commit_index", "seq")
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    commit_index: int
    seq: int
    def __init__(self, commit_index: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("success", "seq", "end_index")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    success: bool
    seq: int
    end_index: int
    def __init__(self, success: _Optional[bool] = ..., seq: _Optional[int] = ..., end_index: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("type", "pre_index", "pre_term", "entries", "commit_index", "truncate_index", "truncate_term", "packed_entries")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRE_TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TERM_FIELD_NUMBER: _ClassVar[int]
    PACKED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    type: PushType
    pre_index: int
    pre_term: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit_index: int
    truncate_index: int
    truncate_term: int
    packed_entries: bytes
    def __init__(self, type: _Optional[_Union[PushType, str]] = ..., pre_index: _Optional[int] = ..., pre_term: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit_index: _Optional[int] = ..., truncate_index: _Optional[int] = ..., truncate_term: _Optional[int] = ..., packed_entries: _Optional[bytes] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("type", "code", "pre_index", "index", "end_index", "x_term", "x_index")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    PRE_INDEX_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    X_TERM_FIELD_NUMBER: _ClassVar[int]
    X_INDEX_FIELD_NUMBER: _ClassVar[int]
    type: PushType
    code: PushCode
    pre_index: int
    index: int
    end_index: int
    x_term: int
    x_index: int
    def __init__(self, type: _Optional[_Union[PushType, str]] = ..., code: _Optional[_Union[PushCode, str]] = ..., pre_index: _Optional[int] = ..., index: _Optional[int] = ..., end_index: _Optional[int] = ..., x_term: _Optional[int] = ..., x_index: _Optional[int] = ...) -> None: ...

class SnapshotMeta(_message.Message):
    __slots__ = ("index", "term", "members")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class InstallSnapshotRequest(_message.Message):
    __slots__ = ("meta",)
    META_FIELD_NUMBER: _ClassVar[int]
    meta: SnapshotMeta
    def __init__(self, meta: _Optional[_Union[SnapshotMeta, _Mapping]] = ...) -> None: ...

class InstallSnapshotResponse(_message.Message):
    __slots__ = ("success", "index", "end_index")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    success: bool
    index: int
    end_index: int
    def __init__(self, success: _Optional[bool] = ..., index: _Optional[int] = ..., end_index: _Optional[int] = ...) -> None: ...

class PeerMessage(_message.Message):
    __slots__ = ("src", "dst", "term", "vote_request", "vote_response", "heartbeat_request", "heartbeat_response", "push_request", "push_response", "install_snapshot_request", "install_snapshot_response")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    VOTE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    VOTE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PUSH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    PUSH_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INSTALL_SNAPSHOT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    INSTALL_SNAPSHOT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    term: int
    vote_request: VoteRequest
    vote_response: VoteResponse
    heartbeat_request: HeartbeatRequest
    heartbeat_response: HeartbeatResponse
    push_request: PushRequest
    push_response: PushResponse
    install_snapshot_request: InstallSnapshotRequest
    install_snapshot_response: InstallSnapshotResponse
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., term: _Optional[int] = ..., vote_request: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., heartbeat_request: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., heartbeat_response: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., push_request: _Optional[_Union[PushRequest, _Mapping]] = ..., push_response: _Optional[_Union[PushResponse, _Mapping]] = ..., install_snapshot_request: _Optional[_Union[InstallSnapshotRequest, _Mapping]] = ..., install_snapshot_response: _Optional[_Union[InstallSnapshotResponse, _Mapping]] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("cluster_id", "from_id", "messages")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    from_id: str
    messages: _containers.RepeatedCompositeFieldContainer[PeerMessage]
    def __init__(self, cluster_id: _Optional[str] = ..., from_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[PeerMessage, _Mapping]]] = ...) -> None: ...

class SendAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("cluster_id", "from_id", "term", "meta", "total_size", "sha256", "offset", "data", "done")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    from_id: str
    term: int
    meta: SnapshotMeta
    total_size: int
    sha256: str
    offset: int
    data: bytes
    done: bool
    def __init__(self, cluster_id: _Optional[str] = ..., from_id: _Optional[str] = ..., term: _Optional[int] = ..., meta: _Optional[_Union[SnapshotMeta, _Mapping]] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ...) -> None: ...

class SnapshotAck(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("cluster_id", "from_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    from_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., from_id: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("message_port", "packed_entries")
    MESSAGE_PORT_FIELD_NUMBER: _ClassVar[int]
    PACKED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    message_port: int
    packed_entries: bool
    def __init__(self, message_port: _Optional[int] = ..., packed_entries: _Optional[bool] = ...) -> None: ...

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
    CONFIG: _ClassVar[EntryType]

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

class Purpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURPOSE_UNSPECIFIED: _ClassVar[Purpose]
    MESSAGES: _ClassVar[Purpose]
    SNAPSHOT: _ClassVar[Purpose]
    PROBE: _ClassVar[Purpose]
NORMAL: EntryType
NOOP: EntryType
CONFIG: EntryType
APPEND: PushType
COMPARE: PushType
TRUNCATE: PushType
COMMIT: PushType
SUCCESS: PushCode
INCONSISTENT: PushCode
STALE_TERM: PushCode
REFUSED: PushCode
PURPOSE_UNSPECIFIED: Purpose
MESSAGES: Purpose
SNAPSHOT: Purpose
PROBE: Purpose

class VoteRequest(_message.Message):
    __slots__ = ("last_log_index", "last_log_term", "pre_vote", "transfer")
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    last_log_index: int
    last_log_term: int
    pre_vote: bool
    transfer: bool
    def __init__(self, last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ..., transfer: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("type", "pre_index", "pre_term", "entries", "commit_index", "truncate_index", "truncate_term")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRE_TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TERM_FIELD_NUMBER: _ClassVar[int]
    type: PushType
    pre_index: int
    pre_term: int
    entries: bytes
    commit_index: int
    truncate_index: int
    truncate_term: int
    def __init__(self, type: _Optional[_Union[PushType, str]] = ..., pre_index: _Optional[int] = ..., pre_term: _Optional[int] = ..., entries: _Optional[bytes] = ..., commit_index: _Optional[int] = ..., truncate_index: _Optional[int] = ..., truncate_term: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("index", "term", "membership")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    membership: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., membership: _Optional[bytes] = ...) -> None: ...

class TimeoutNowRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

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
    __slots__ = ("src", "dst", "term", "vote_request", "vote_response", "heartbeat_request", "heartbeat_response", "push_request", "push_response", "install_snapshot_request", "install_snapshot_response", "timeout_now_request")
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
    TIMEOUT_NOW_REQUEST_FIELD_NUMBER: _ClassVar[int]
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
    timeout_now_request: TimeoutNowRequest
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., term: _Optional[int] = ..., vote_request: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., heartbeat_request: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., heartbeat_response: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., push_request: _Optional[_Union[PushRequest, _Mapping]] = ..., push_response: _Optional[_Union[PushResponse, _Mapping]] = ..., install_snapshot_request: _Optional[_Union[InstallSnapshotRequest, _Mapping]] = ..., install_snapshot_response: _Optional[_Union[InstallSnapshotResponse, _Mapping]] = ..., timeout_now_request: _Optional[_Union[TimeoutNowRequest, _Mapping]] = ...) -> None: ...

class PeerHello(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "client_address", "purpose", "ack_within_ms", "peer_address", "client_http_address")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    ACK_WITHIN_MS_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    from_id: str
    to_id: str
    client_address: str
    purpose: Purpose
    ack_within_ms: int
    peer_address: str
    client_http_address: str
    def __init__(self, cluster_id: _Optional[str] = ..., from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., client_address: _Optional[str] = ..., purpose: _Optional[_Union[Purpose, str]] = ..., ack_within_ms: _Optional[int] = ..., peer_address: _Optional[str] = ..., client_http_address: _Optional[str] = ...) -> None: ...

class PeerHelloReply(_message.Message):
    __slots__ = ("refusal", "node_id", "client_address", "term", "last_log_term", "last_log_index", "acks", "removed", "client_http_address")
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    refusal: str
    node_id: str
    client_address: str
    term: int
    last_log_term: int
    last_log_index: int
    acks: bool
    removed: bool
    client_http_address: str
    def __init__(self, refusal: _Optional[str] = ..., node_id: _Optional[str] = ..., client_address: _Optional[str] = ..., term: _Optional[int] = ..., last_log_term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., acks: _Optional[bool] = ..., removed: _Optional[bool] = ..., client_http_address: _Optional[str] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PeerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PeerMessage, _Mapping]]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SnapshotHeader(_message.Message):
    __slots__ = ("term", "meta", "total_size", "sha256")
    TERM_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    term: int
    meta: SnapshotMeta
    total_size: int
    sha256: str
    def __init__(self, term: _Optional[int] = ..., meta: _Optional[_Union[SnapshotMeta, _Mapping]] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("offset", "data", "done")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    done: bool
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ...) -> None: ...

class SnapshotAck(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

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

class AlarmType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[AlarmType]
    NOSPACE: _ClassVar[AlarmType]
    CORRUPT: _ClassVar[AlarmType]

class AuthAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUTH_ACTION_UNSPECIFIED: _ClassVar[AuthAction]
    AUTH_ENABLE: _ClassVar[AuthAction]
    AUTH_DISABLE: _ClassVar[AuthAction]
    AUTH_STATUS: _ClassVar[AuthAction]
    USER_ADD: _ClassVar[AuthAction]
    USER_DELETE: _ClassVar[AuthAction]
    USER_GET: _ClassVar[AuthAction]
    USER_LIST: _ClassVar[AuthAction]
    USER_CHANGE_PASSWORD: _ClassVar[AuthAction]
    USER_GRANT_ROLE: _ClassVar[AuthAction]
    USER_REVOKE_ROLE: _ClassVar[AuthAction]
    ROLE_ADD: _ClassVar[AuthAction]
    ROLE_DELETE: _ClassVar[AuthAction]
    ROLE_GET: _ClassVar[AuthAction]
    ROLE_LIST: _ClassVar[AuthAction]
    ROLE_GRANT_PERMISSION: _ClassVar[AuthAction]
    ROLE_REVOKE_PERMISSION: _ClassVar[AuthAction]
LINEARIZABLE: Consistency
LEASE: Consistency
STALE: Consistency
NONE: AlarmType
NOSPACE: AlarmType
CORRUPT: AlarmType
AUTH_ACTION_UNSPECIFIED: AuthAction
AUTH_ENABLE: AuthAction
AUTH_DISABLE: AuthAction
AUTH_STATUS: AuthAction
USER_ADD: AuthAction
USER_DELETE: AuthAction
USER_GET: AuthAction
USER_LIST: AuthAction
USER_CHANGE_PASSWORD: AuthAction
USER_GRANT_ROLE: AuthAction
USER_REVOKE_ROLE: AuthAction
ROLE_ADD: AuthAction
ROLE_DELETE: AuthAction
ROLE_GET: AuthAction
ROLE_LIST: AuthAction
ROLE_GRANT_PERMISSION: AuthAction
ROLE_REVOKE_PERMISSION: AuthAction

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
    __slots__ = ("prefix", "start", "end", "limit", "consistency", "keys_only")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    start: bytes
    end: bytes
    limit: int
    consistency: Consistency
    keys_only: bool
    def __init__(self, prefix: _Optional[bytes] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., keys_only: _Optional[bool] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("items", "more", "index")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[KeyValue]
    more: bool
    index: int
    def __init__(self, items: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., more: _Optional[bool] = ..., index: _Optional[int] = ...) -> None: ...

class ChangesRequest(_message.Message):
    __slots__ = ("start_revision", "end_revision", "key", "prefix", "start", "end", "limit", "prev_kv", "start_sub")
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    END_REVISION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    START_SUB_FIELD_NUMBER: _ClassVar[int]
    start_revision: int
    end_revision: int
    key: bytes
    prefix: bytes
    start: bytes
    end: bytes
    limit: int
    prev_kv: bool
    start_sub: int
    def __init__(self, start_revision: _Optional[int] = ..., end_revision: _Optional[int] = ..., key: _Optional[bytes] = ..., prefix: _Optional[bytes] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ..., prev_kv: _Optional[bool] = ..., start_sub: _Optional[int] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("type", "key", "value", "revision", "create_revision", "version", "prev_value")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PUT: _ClassVar[Change.Type]
        DELETE: _ClassVar[Change.Type]
    PUT: Change.Type
    DELETE: Change.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREV_VALUE_FIELD_NUMBER: _ClassVar[int]
    type: Change.Type
    key: bytes
    value: bytes
    revision: int
    create_revision: int
    version: int
    prev_value: bytes
    def __init__(self, type: _Optional[_Union[Change.Type, str]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., revision: _Optional[int] = ..., create_revision: _Optional[int] = ..., version: _Optional[int] = ..., prev_value: _Optional[bytes] = ...) -> None: ...

class ChangesResponse(_message.Message):
    __slots__ = ("changes", "revision", "compacted_revision", "more", "next_revision", "next_sub", "end_revision")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    NEXT_REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SUB_FIELD_NUMBER: _ClassVar[int]
    END_REVISION_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    revision: int
    compacted_revision: int
    more: bool
    next_revision: int
    next_sub: int
    end_revision: int
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., revision: _Optional[int] = ..., compacted_revision: _Optional[int] = ..., more: _Optional[bool] = ..., next_revision: _Optional[int] = ..., next_sub: _Optional[int] = ..., end_revision: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("id", "role", "term", "leader", "commit_index", "applied_index", "snapshot_index", "peers", "cluster_id", "last_index", "leader_address", "log_size_bytes", "state_size_bytes", "address", "log_begin_index", "log_begin_term", "rejoining", "disk_full", "max_request_bytes", "pipeline_requests_held", "pipeline_reply_bytes_held", "corrupt", "state_checks", "nospace", "alarms", "unhealthy", "voters", "learners")
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
    NOSPACE_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
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
    nospace: str
    alarms: _containers.RepeatedCompositeFieldContainer[AlarmMember]
    unhealthy: str
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., peers: _Optional[_Mapping[str, int]] = ..., cluster_id: _Optional[str] = ..., last_index: _Optional[int] = ..., leader_address: _Optional[str] = ..., log_size_bytes: _Optional[int] = ..., state_size_bytes: _Optional[int] = ..., address: _Optional[str] = ..., log_begin_index: _Optional[int] = ..., log_begin_term: _Optional[int] = ..., rejoining: _Optional[bool] = ..., disk_full: _Optional[bool] = ..., max_request_bytes: _Optional[int] = ..., pipeline_requests_held: _Optional[int] = ..., pipeline_reply_bytes_held: _Optional[int] = ..., corrupt: _Optional[str] = ..., state_checks: _Optional[_Iterable[_Union[StateCheck, _Mapping]]] = ..., nospace: _Optional[str] = ..., alarms: _Optional[_Iterable[_Union[AlarmMember, _Mapping]]] = ..., unhealthy: _Optional[str] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("secret", "user")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    secret: bytes
    user: str
    def __init__(self, secret: _Optional[bytes] = ..., user: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("header", "ops", "registration", "check_state", "auth", "user", "alarm", "etcd_txn", "compact", "lease")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    CHECK_STATE_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ALARM_FIELD_NUMBER: _ClassVar[int]
    ETCD_TXN_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    header: WriteHeader
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    registration: Registration
    check_state: bool
    auth: AuthCommand
    user: str
    alarm: AlarmCommand
    etcd_txn: EtcdTxn
    compact: int
    lease: LeaseCommand
    def __init__(self, header: _Optional[_Union[WriteHeader, _Mapping]] = ..., ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ..., registration: _Optional[_Union[Registration, _Mapping]] = ..., check_state: _Optional[bool] = ..., auth: _Optional[_Union[AuthCommand, _Mapping]] = ..., user: _Optional[str] = ..., alarm: _Optional[_Union[AlarmCommand, _Mapping]] = ..., etcd_txn: _Optional[_Union[EtcdTxn, _Mapping]] = ..., compact: _Optional[int] = ..., lease: _Optional[_Union[LeaseCommand, _Mapping]] = ...) -> None: ...

class EtcdTxn(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: bytes
    def __init__(self, request: _Optional[bytes] = ...) -> None: ...

class LeaseCommand(_message.Message):
    __slots__ = ("grant_id", "ttl", "revoke_id", "checkpoints")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    REVOKE_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    grant_id: int
    ttl: int
    revoke_id: int
    checkpoints: _containers.RepeatedCompositeFieldContainer[LeaseCheckpoint]
    def __init__(self, grant_id: _Optional[int] = ..., ttl: _Optional[int] = ..., revoke_id: _Optional[int] = ..., checkpoints: _Optional[_Iterable[_Union[LeaseCheckpoint, _Mapping]]] = ...) -> None: ...

class LeaseCheckpoint(_message.Message):
    __slots__ = ("id", "remaining_ttl")
    ID_FIELD_NUMBER: _ClassVar[int]
    REMAINING_TTL_FIELD_NUMBER: _ClassVar[int]
    id: int
    remaining_ttl: int
    def __init__(self, id: _Optional[int] = ..., remaining_ttl: _Optional[int] = ...) -> None: ...

class AlarmMember(_message.Message):
    __slots__ = ("member_id", "alarm")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ALARM_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    alarm: AlarmType
    def __init__(self, member_id: _Optional[str] = ..., alarm: _Optional[_Union[AlarmType, str]] = ...) -> None: ...

class AlarmCommand(_message.Message):
    __slots__ = ("activate", "member")
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    activate: bool
    member: AlarmMember
    def __init__(self, activate: _Optional[bool] = ..., member: _Optional[_Union[AlarmMember, _Mapping]] = ...) -> None: ...

class AlarmRequest(_message.Message):
    __slots__ = ("action", "member_id", "alarm")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GET: _ClassVar[AlarmRequest.Action]
        ACTIVATE: _ClassVar[AlarmRequest.Action]
        DEACTIVATE: _ClassVar[AlarmRequest.Action]
    GET: AlarmRequest.Action
    ACTIVATE: AlarmRequest.Action
    DEACTIVATE: AlarmRequest.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ALARM_FIELD_NUMBER: _ClassVar[int]
    action: AlarmRequest.Action
    member_id: str
    alarm: AlarmType
    def __init__(self, action: _Optional[_Union[AlarmRequest.Action, str]] = ..., member_id: _Optional[str] = ..., alarm: _Optional[_Union[AlarmType, str]] = ...) -> None: ...

class AlarmResponse(_message.Message):
    __slots__ = ("alarms",)
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    alarms: _containers.RepeatedCompositeFieldContainer[AlarmMember]
    def __init__(self, alarms: _Optional[_Iterable[_Union[AlarmMember, _Mapping]]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("existed", "refusal_kind", "refusal", "revision", "etcd_txn_response", "lease_id", "lease_ttl")
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_KIND_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ETCD_TXN_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    existed: _containers.RepeatedScalarFieldContainer[bool]
    refusal_kind: str
    refusal: str
    revision: int
    etcd_txn_response: bytes
    lease_id: int
    lease_ttl: int
    def __init__(self, existed: _Optional[_Iterable[bool]] = ..., refusal_kind: _Optional[str] = ..., refusal: _Optional[str] = ..., revision: _Optional[int] = ..., etcd_txn_response: _Optional[bytes] = ..., lease_id: _Optional[int] = ..., lease_ttl: _Optional[int] = ...) -> None: ...

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

class Permission(_message.Message):
    __slots__ = ("perm_type", "key", "range_end")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        READ: _ClassVar[Permission.Type]
        WRITE: _ClassVar[Permission.Type]
        READWRITE: _ClassVar[Permission.Type]
    READ: Permission.Type
    WRITE: Permission.Type
    READWRITE: Permission.Type
    PERM_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    perm_type: Permission.Type
    key: bytes
    range_end: bytes
    def __init__(self, perm_type: _Optional[_Union[Permission.Type, str]] = ..., key: _Optional[bytes] = ..., range_end: _Optional[bytes] = ...) -> None: ...

class AuthCommand(_message.Message):
    __slots__ = ("action", "user", "role", "salt", "password_hash", "permission", "signing_key")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_FIELD_NUMBER: _ClassVar[int]
    action: AuthAction
    user: str
    role: str
    salt: bytes
    password_hash: bytes
    permission: Permission
    signing_key: bytes
    def __init__(self, action: _Optional[_Union[AuthAction, str]] = ..., user: _Optional[str] = ..., role: _Optional[str] = ..., salt: _Optional[bytes] = ..., password_hash: _Optional[bytes] = ..., permission: _Optional[_Union[Permission, _Mapping]] = ..., signing_key: _Optional[bytes] = ...) -> None: ...

class StoredUser(_message.Message):
    __slots__ = ("name", "salt", "password_hash", "roles", "generation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    salt: bytes
    password_hash: bytes
    roles: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    def __init__(self, name: _Optional[str] = ..., salt: _Optional[bytes] = ..., password_hash: _Optional[bytes] = ..., roles: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ...) -> None: ...

class StoredRole(_message.Message):
    __slots__ = ("name", "permissions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    permissions: _containers.RepeatedCompositeFieldContainer[Permission]
    def __init__(self, name: _Optional[str] = ..., permissions: _Optional[_Iterable[_Union[Permission, _Mapping]]] = ...) -> None: ...

class AuthAdminRequest(_message.Message):
    __slots__ = ("action", "user", "role", "password", "permission")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    action: AuthAction
    user: str
    role: str
    password: str
    permission: Permission
    def __init__(self, action: _Optional[_Union[AuthAction, str]] = ..., user: _Optional[str] = ..., role: _Optional[str] = ..., password: _Optional[str] = ..., permission: _Optional[_Union[Permission, _Mapping]] = ...) -> None: ...

class AuthUser(_message.Message):
    __slots__ = ("name", "roles")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class AuthRole(_message.Message):
    __slots__ = ("name", "permissions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    permissions: _containers.RepeatedCompositeFieldContainer[Permission]
    def __init__(self, name: _Optional[str] = ..., permissions: _Optional[_Iterable[_Union[Permission, _Mapping]]] = ...) -> None: ...

class AuthAdminResponse(_message.Message):
    __slots__ = ("index", "enabled", "users", "roles")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    index: int
    enabled: bool
    users: _containers.RepeatedCompositeFieldContainer[AuthUser]
    roles: _containers.RepeatedCompositeFieldContainer[AuthRole]
    def __init__(self, index: _Optional[int] = ..., enabled: _Optional[bool] = ..., users: _Optional[_Iterable[_Union[AuthUser, _Mapping]]] = ..., roles: _Optional[_Iterable[_Union[AuthRole, _Mapping]]] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("name", "password")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    password: str
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

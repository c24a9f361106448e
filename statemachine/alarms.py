"""The cluster's alarms, as etcd keeps them (etcd server/etcdserver/api/v3alarm): which member
raised which alarm (NOSPACE, CORRUPT), replicated through the log so every member lists the same.

They live in the named database ``alarms`` of the state machine's LMDB environment, one record per
raised alarm (key: the alarm type as one byte, then the member id; value: empty), so snapshots,
restores and restarts carry them like the other tables. An AlarmCommand raises (activate) or
clears (deactivate) one; a deactivation with alarm NONE and no member clears every alarm (etcdctl's
`alarm disarm`). Applying is total: raising a raised alarm or clearing an absent one changes
nothing. `AlarmHolder` publishes the set after each applied batch that changed it; the client
service tests `AlarmHolder.nospace` and `.corrupt` on every write, plain attributes.

While a CORRUPT alarm is raised every member refuses writes, as etcd's corrupt applier does: a
key write, a Compact, a lease grant or revoke is refused when applied (`refuses_writes`), the same
on every replica; reads, alarms, auth and keep-alives go on."""
from __future__ import annotations

from dataclasses import dataclass

import lmdb

from raftkv_proto import kv_pb2

ALARMS_DB_NAME = b"alarms"

# etcd's message for a write refused while NOSPACE is raised (etcdserver: ErrNoSpace).
NO_SPACE = "etcdserver: mvcc: database space exceeded"
# etcd's message for a write refused while CORRUPT is raised (etcdserver: ErrCorrupt).
CORRUPT_CLUSTER = "etcdserver: corrupt cluster"

NOSPACE, CORRUPT = kv_pb2.NOSPACE, kv_pb2.CORRUPT


@dataclass(frozen=True, slots=True, order=True)
class Alarm:
    member_id: str
    alarm: int  # kv_pb2.AlarmType

    @property
    def name(self) -> str:
        return kv_pb2.AlarmType.Name(self.alarm)

    def to_proto(self) -> kv_pb2.AlarmMember:
        return kv_pb2.AlarmMember(member_id=self.member_id, alarm=self.alarm)  # type: ignore[arg-type]


class AlarmHolder:
    """Where the state machine publishes the raised alarms, shared with the client service (the
    state machine is reopened after a snapshot install; the holder stays)."""

    __slots__ = ("alarms", "nospace", "corrupt")

    def __init__(self) -> None:
        self.alarms: frozenset[Alarm] = frozenset()
        self.nospace = False
        self.corrupt = False

    def publish(self, alarms: frozenset[Alarm]) -> None:
        self.alarms = alarms
        self.nospace = any(a.alarm == NOSPACE for a in alarms)
        self.corrupt = refuses_writes(alarms)

    def listed(self) -> list[Alarm]:
        return sorted(self.alarms)


def _key(alarm: Alarm) -> bytes:
    return bytes([alarm.alarm]) + alarm.member_id.encode()


def load_alarms(txn: lmdb.Transaction, db: lmdb._Database) -> frozenset[Alarm]:
    """The alarms as `txn` sees them."""
    return frozenset(Alarm(key[1:].decode(), key[0]) for key, _ in txn.cursor(db=db).iternext())


def apply_alarm(txn: lmdb.Transaction, db: lmdb._Database, alarms: frozenset[Alarm],
                command: kv_pb2.AlarmCommand) -> frozenset[Alarm]:
    """Apply one AlarmCommand inside `txn`; the alarms after it."""
    target = Alarm(command.member.member_id, command.member.alarm)
    if command.activate:
        if target.alarm == kv_pb2.NONE or not target.member_id:
            return alarms  # nothing to raise (refused before proposing; total here)
        txn.put(_key(target), b"", db=db)
        return alarms | {target}
    cleared = {a for a in alarms if (not target.member_id or a.member_id == target.member_id)
               and (target.alarm == kv_pb2.NONE or a.alarm == target.alarm)}
    for alarm in cleared:
        txn.delete(_key(alarm), db=db)
    return alarms - cleared


def encode_alarm(activate: bool, member_id: str, alarm: int) -> bytes:
    """The entry payload that raises or clears `member_id`'s `alarm` (NONE and "": every alarm)."""
    member = kv_pb2.AlarmMember(member_id=member_id, alarm=alarm)  # type: ignore[arg-type]
    return kv_pb2.Command(alarm=kv_pb2.AlarmCommand(activate=activate, member=member)).SerializeToString()


def refuses_writes(alarms: frozenset[Alarm]) -> bool:
    """Whether `alarms` put the cluster in etcd's corrupt mode (writes refused)."""
    return any(a.alarm == CORRUPT for a in alarms)

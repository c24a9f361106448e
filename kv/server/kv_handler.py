"""The layer of operations under every face: `KVHandler` takes protobuf requests (check them,
propose or wait on the read barrier, read the state machine) and raises kv.errors, taking no gRPC
context. The native gRPC face is KVServicer (kv_service.py), etcd's is kv/server/etcd_services.py
(through EtcdFace), and the embedded API calls it directly, so a local caller gets the same
semantics without a gRPC hop. It holds what every face shares: the request checks
(`checks`), who calls and what they may do (`gate`), the refusals (`_no_space`, and through
kv/server/node_calls.py the node's and the applied command's)."""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TypeVar


from kv import errors
from raftkv_proto import etcd_rpc_pb2 as etcd_pb
from raftkv_proto import kv_pb2
from raftkv_proto.wire import scan_items
from raft.node.node import RaftNode
from statemachine.commands import (
    SESSION_SECRET_BYTES,
    delete_op,
    encode_command,
    encode_compaction,
    encode_etcd_txn,
    encode_registration,
    put_op,
    session_id,
)
from statemachine.etcd_txn import EtcdRefusal, serializable, txn_spans
from statemachine.auth_state import AuthRefusal, permission_range, prefix_range
from statemachine.errors import CorruptStateError, InvalidCommandError
from kv.server.auth_gate import AuthGate
from kv.server.health import member_health
from kv.server.watch_hub import WatchHub
from kv.server.node_calls import TIMEOUT_MESSAGE, node_call, propose_command, read_barrier
from kv.server.reply_budget import NoRoom, ReplyBudget
from kv.server.request_checks import RequestChecks
from kv.server.state_check import CorruptionAlarm
from raft.node.worker_thread import WorkerThread
from raft.node.ports import SnapshotInfo
from statemachine.apply_batch import ApplyOutcome
from statemachine.kv_state import KVStateMachine
from statemachine.etcd_txn import COMPACTED as COMPACTED_MESSAGE
from statemachine.mvcc import Change, CompactedError
from statemachine.range_read import Allow
from statemachine.alarms import CORRUPT_CLUSTER, NO_SPACE, encode_alarm

T = TypeVar("T")
R = TypeVar("R")
# How a face says when a reply's call has ended: it calls its argument then (gRPC's
# context.add_done_callback), so the reply's bytes stay counted until they are sent.
Sent = Callable[[Callable[[], None]], None]

log = logging.getLogger(__name__)

DEFAULT_SCAN_LIMIT = 1000
MAX_SCAN_LIMIT = 10_000
# A scan page also stops once its keys and values reach this many bytes (its first pair always
# comes), with `more` set: a scan of large values costs the node a few MiB per page, not the
# whole range, and a page stays far inside the 64 MiB send limit. Clients continue from the last key.
SCAN_PAGE_BYTES = 4 << 20
# A page of KV.Changes: at most this many changes (DEFAULT when the request names no limit) and
# about SCAN_PAGE_BYTES of keys and values, cut between revisions. A page reads the store a window
# of revisions at a time, sized from what the previous window held, and stops after
# CHANGES_SCAN_REVISIONS revisions even when none of them touched the range (the client asks on).
DEFAULT_CHANGES_LIMIT = 10_000
MAX_CHANGES_LIMIT = 100_000
CHANGES_PAGE_BYTES = SCAN_PAGE_BYTES
CHANGES_SCAN_REVISIONS = 200_000
_FIRST_WINDOW, _MAX_WINDOW = 64, 20_000
_CHANGE_OVERHEAD_BYTES = 32  # a change's revisions and framing, beside its key and values

# What a write may still do while NOSPACE is raised (etcd: reads and deletes).
_FREEING_OPS = ("delete", "delete_prefix")

_CONSISTENCY = {kv_pb2.LINEARIZABLE: "linearizable", kv_pb2.LEASE: "lease", kv_pb2.STALE: "stale"}


class KVHandler:
    """Each request's work starts in a `begin_*` call, which validates it, hands it to the node
    and returns a future of the reply, or raises a kv.errors error at once. No task runs per
    request: the node's own future completes the reply through a callback, which is what lets a
    pipeline keep hundreds of requests in flight cheaply. The `async` methods await the same.

    `user` is who makes a request while auth is on (the servicer resolved it: AuthGate), None
    while it is off: a read is checked here, a write here and again by every replica at apply
    (its command carries the user), so a permission revoked before the write commits holds."""

    def __init__(self, node: RaftNode, fsm: KVStateMachine, alarm: CorruptionAlarm | None = None,
                 state_checks: Callable[[], list[kv_pb2.StateCheck]] = list) -> None:
        self.node = node
        self.fsm = fsm
        self._alarm = alarm or CorruptionAlarm(node)
        self._state_checks = state_checks
        self.auth = fsm.auth  # the AuthHolder the state machine publishes into
        self.gate = AuthGate(fsm.auth)  # who calls and what they may do: every face asks this one
        self.alarms = fsm.alarms  # the AlarmHolder likewise: puts are refused while NOSPACE is raised
        self.checks = RequestChecks(node.config.limits)  # every face's: the etcd face uses these too
        # The change feed (started and stopped with the node's servers): etcd's Watch follows it,
        # and KV.Changes waits on it for the revisions it pages through.
        self.watches = WatchHub(node, fsm)
        self.replies = ReplyBudget()  # the bytes of large replies held at once
        # Reads too large for the loop (ranges, read-only txns, scans, change pages) run here, one
        # after another: on threads of their own, concurrent lists fought over the GIL and cost
        # each member about three times the CPU (decision 0073).
        self.reads = WorkerThread("raftkv-reads")

    async def close(self) -> None:
        """After the servers stopped: finish the reads handed over, end their thread."""
        await self.reads.close()

    # ---- writes ------------------------------------------------------------------------------

    def begin_put(self, request: kv_pb2.PutRequest, timeout: float | None = None,
                  user: str | None = None) -> asyncio.Future[kv_pb2.PutResponse]:
        self.checks.put(request.key, request.value)
        return self._begin_write([put_op(request.key, request.value)], request.header, timeout,
                                 lambda outcome: kv_pb2.PutResponse(index=outcome.index), user)

    def begin_delete(self, request: kv_pb2.DeleteRequest, timeout: float | None = None,
                     user: str | None = None) -> asyncio.Future[kv_pb2.DeleteResponse]:
        self.checks.key(request.key)
        return self._begin_write([delete_op(request.key)], request.header, timeout,
                                 lambda outcome: kv_pb2.DeleteResponse(existed=bool(outcome.result.existed[0]),
                                                                       index=outcome.index), user)

    async def put(self, request: kv_pb2.PutRequest, timeout: float | None = None,
                  user: str | None = None) -> kv_pb2.PutResponse:
        return await self.begin_put(request, timeout, user)

    async def delete(self, request: kv_pb2.DeleteRequest, timeout: float | None = None,
                     user: str | None = None) -> kv_pb2.DeleteResponse:
        return await self.begin_delete(request, timeout, user)

    async def batch(self, request: kv_pb2.BatchRequest, timeout: float | None = None,
                    user: str | None = None) -> kv_pb2.BatchResponse:
        ops = list(request.ops)
        self.checks.ops(ops)
        return await self._begin_write(ops, request.header, timeout, lambda outcome: kv_pb2.BatchResponse(
            index=outcome.index, existed=list(outcome.result.existed)), user)

    def _begin_write(self, ops: list[kv_pb2.Op], header: kv_pb2.WriteHeader, timeout: float | None,
                     reply: Callable[[ApplyOutcome], R], user: str | None = None) -> asyncio.Future[R]:
        """Propose already validated ops as one Command; a future of `reply(outcome)`. A bad
        header is refused here, before it reaches the log (every replica would refuse to apply it),
        and so is a write `user` may not make."""
        self.checks.header(header)
        self._check_writable()
        if self.alarms.nospace and not all(op.WhichOneof("op") in _FREEING_OPS for op in ops):
            raise self._no_space()
        if user is not None:
            _refuse(self.auth.view.write_refusal(user, ops))
        payload = encode_command(ops, header.client_id, header.seq, user)
        return propose_command(self.node, payload, timeout, header, then=reply)

    async def register_client(self, request: kv_pb2.RegisterClientRequest, timeout: float | None = None,
                              user: str | None = None) -> kv_pb2.RegisterClientResponse:
        """Open a client session (the Raft thesis, 6.3): append a registration entry with a secret
        chosen here; the client id is the entry's index and that secret, so no one can use an id
        the cluster did not issue to them. While auth is on the session is `user`'s alone."""
        secret = secrets.token_bytes(SESSION_SECRET_BYTES)
        outcome = await propose_command(self.node, encode_registration(secret, user), timeout)
        log.debug("client session %d registered for %r", outcome.index, request.name)
        return kv_pb2.RegisterClientResponse(client_id=session_id(outcome.index, secret), index=outcome.index)

    # ---- etcd's writes (the etcd face's Put, DeleteRange, Txn and Compact) ----------------------

    async def txn(self, request: etcd_pb.TxnRequest, timeout: float | None = None,
                  user: str | None = None) -> etcd_pb.TxnResponse:
        """An etcd transaction through the log, on the leader (a Put or a DeleteRange travels as a
        transaction of one op), with a native write's refusals: no space, no permission. The
        face has checked it (RequestChecks.etcd_txn)."""
        self._check_writable()
        if self.alarms.nospace and _puts_anything(request):
            raise self._no_space()
        if user is not None:
            _refuse(self.auth.view.spans_refusal(user, *txn_spans(request)))
        outcome = await propose_command(self.node, encode_etcd_txn(request.SerializeToString(), user), timeout)
        return etcd_pb.TxnResponse.FromString(outcome.result.etcd_txn_response)

    async def range(self, request: etcd_pb.RangeRequest, timeout: float | None = None,
                    user: str | None = None, sent: Sent | None = None) -> etcd_pb.RangeResponse:
        """etcd's Range on this member: after a ReadIndex round unless serializable (the face sends
        a linearizable one to the leader); its header carries only the revision. A range of keys
        is measured before its values are read and held against the member's reply budget until
        `sent` says its call has ended (kv/server/reply_budget.py; None: as this returns)."""
        if user is not None:
            self.gate.check_read(user, permission_range(request.key, request.range_end))
        level = "stale" if request.serializable else "linearizable"
        await read_barrier(self.node, level, timeout)
        try:
            if request.range_end:
                return await self._budgeted(lambda allow: self.fsm.etcd_range(request, allow), timeout, sent)
            return self.fsm.etcd_range(request)  # one key: a lookup or two, cheaper than a thread's hand-off
        except EtcdRefusal as refusal:
            raise errors.of_kind(refusal.kind, str(refusal)) from None

    async def read_txn(self, request: etcd_pb.TxnRequest, timeout: float | None = None,
                       user: str | None = None, sent: Sent | None = None) -> etcd_pb.TxnResponse:
        """A read-only etcd transaction (etcd_txn.read_only) served as a read by this member, as
        etcd serves it: after a ReadIndex round unless every range is serializable, never through
        the log (where every member would run it). Its ranges together are one reply against the
        budget, as `range`'s."""
        if user is not None:
            _refuse(self.auth.view.spans_refusal(user, *txn_spans(request)))
        level = "stale" if serializable(request) else "linearizable"
        await read_barrier(self.node, level, timeout)
        try:
            return await self._budgeted(lambda allow: self.fsm.etcd_read_txn(request, allow), timeout, sent)
        except EtcdRefusal as refusal:
            raise errors.of_kind(refusal.kind, str(refusal)) from None

    async def _budgeted(self, read: Callable[[Allow], R], timeout: float | None, sent: Sent | None) -> R:
        """`read(allow)` on the member's read thread, its reply measured and taken from the member's budget
        (or refused as too large) before it is built; with no room, wait for some and read again
        (a new read: what it measures is what it builds). The bytes come back when `sent` calls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            grant = self.replies.grant()
            try:
                reply = await self.reads.run(read, grant)
            except NoRoom as no_room:
                grant.release()
                await self.replies.wait_room(no_room.size, None if deadline is None else deadline - time.monotonic())
                continue
            except BaseException:
                grant.release()
                raise
            if sent is None:
                grant.release()
            else:
                sent(grant.release)
            return reply

    async def compact(self, revision: int, timeout: float | None = None, user: str | None = None) -> int:
        """etcd's Compact through the log (root only while auth is on: checked at apply); the
        store's revision after it. At revision 0 or below (a command cannot name it) it compacts
        nothing, as etcd's, which refuses it once anything was compacted."""
        self._check_writable()
        if revision <= 0:
            self.gate.check_root(user)
            if self.fsm.compacted_revision:
                raise errors.RevisionError(COMPACTED_MESSAGE)
            return self.fsm.revision
        outcome = await propose_command(self.node, encode_compaction(revision, user), timeout)
        return outcome.result.revision

    def _check_writable(self) -> None:
        """Refuse a write while a CORRUPT alarm is raised, before it is proposed (every replica
        refuses it at apply too, statemachine/alarms.py)."""
        if self.alarms.corrupt:
            raise errors.CorruptClusterError(CORRUPT_CLUSTER)

    def _no_space(self) -> errors.DiskFullError:
        """etcd's refusal while NOSPACE is raised (reads and deletes go on), for every face."""
        members = ", ".join(a.member_id for a in self.alarms.listed() if a.name == "NOSPACE")
        return errors.DiskFullError(f"{NO_SPACE}: a NOSPACE alarm is raised (member {members}); reads and "
                                    "deletes go on; free space, then `raftkv alarm disarm`")

    # ---- alarms ------------------------------------------------------------------------------

    async def alarm(self, request: kv_pb2.AlarmRequest, timeout: float | None = None,
                    user: str | None = None) -> kv_pb2.AlarmResponse:
        """etcd's Maintenance.Alarm: GET lists the raised alarms as this member applied them;
        ACTIVATE and DEACTIVATE (root only while auth is on) go through the log, then list."""
        if request.action != kv_pb2.AlarmRequest.GET:
            self.gate.check_root(user)
            activate = request.action == kv_pb2.AlarmRequest.ACTIVATE
            if activate and (request.alarm == kv_pb2.NONE or not request.member_id):
                raise errors.InvalidArgumentError("raising an alarm needs a member id and an alarm type")
            payload = encode_alarm(activate, request.member_id, request.alarm)
            await propose_command(self.node, payload, timeout, within_reserve=True)
        return kv_pb2.AlarmResponse(alarms=[a.to_proto() for a in self.alarms.listed()])

    def nospace(self) -> str:
        """Why this member wants a NOSPACE alarm now, or "" (kv/server/alarm_watch.py)."""
        short = self.node.disk_space.short_of_space()
        if short is not None:
            return short
        storage = self.node.config.storage
        quota = storage.quota_backend_bytes or storage.state_max_bytes
        in_use = self.fsm.in_use_bytes()
        if in_use >= quota:
            return (f"node {self.node.id}: its state uses {in_use} bytes, over the quota of {quota} "
                    "(--quota-backend-bytes)")
        return ""

    # ---- reads -------------------------------------------------------------------------------

    def begin_get(self, request: kv_pb2.GetRequest, timeout: float | None = None,
                  user: str | None = None) -> asyncio.Future[kv_pb2.GetResponse]:
        self.checks.key(request.key)
        if user is not None:
            self.gate.check_read(user, permission_range(request.key, b""))
        return self._begin_barrier(request.consistency, timeout, lambda _: self._read(request.key))

    async def get(self, request: kv_pb2.GetRequest, timeout: float | None = None,
                  user: str | None = None) -> kv_pb2.GetResponse:
        return await self.begin_get(request, timeout, user)

    def _read(self, key: bytes) -> kv_pb2.GetResponse:
        index = self.node.applied_index  # read after the barrier: the value is at least this fresh
        try:
            value = self.fsm.get(key)
        except CorruptStateError as e:
            raise self._refused_as_corrupt(e) from None
        return kv_pb2.GetResponse(found=value is not None, value=value or b"", index=index)

    def _refused_as_corrupt(self, e: CorruptStateError) -> errors.UnavailableError:
        """A value that fails its checksum is never served: the member raises its alarm and stops
        serving, and the read is refused as UNAVAILABLE (a client goes to another member). (A
        try/except, not a context manager: a get is on the hot path.)"""
        return errors.UnavailableError(self._alarm.raise_(str(e)))

    async def scan(self, request: kv_pb2.ScanRequest, timeout: float | None = None,
                   user: str | None = None) -> bytes:
        """A page of the range: the ScanResponse's wire bytes (raftkv_proto/wire.py), which the
        gRPC service sends as they are and kv.embedded parses."""
        if request.prefix and (request.start or request.end):
            raise errors.InvalidArgumentError("give either prefix or start/end, not both")
        if user is not None:
            self.gate.check_read(user, prefix_range(request.prefix) if request.prefix
                            else (request.start, request.end or None))
        limit = min(request.limit or DEFAULT_SCAN_LIMIT, MAX_SCAN_LIMIT)
        await self._begin_barrier(request.consistency, timeout, lambda _: None)
        index = self.node.applied_index
        try:
            if request.prefix:
                items, more = await self.reads.run(self.fsm.scan_prefix, request.prefix, limit, SCAN_PAGE_BYTES,
                                                   request.keys_only)
            else:
                items, more = await self.reads.run(self.fsm.scan, request.start, request.end or None, limit,
                                                   SCAN_PAGE_BYTES, request.keys_only)
        except InvalidCommandError as e:  # a start past the key limit
            raise errors.InvalidArgumentError(str(e)) from None
        except CorruptStateError as e:
            raise self._refused_as_corrupt(e) from None
        return b"".join((*scan_items(items), kv_pb2.ScanResponse(more=more, index=index).SerializeToString()))

    async def changes(self, request: kv_pb2.ChangesRequest, timeout: float | None = None,
                      user: str | None = None) -> kv_pb2.ChangesResponse:
        """KV.Changes: a page of the changes of revisions start_revision..end_revision to the
        request's keys, from this member's state once it has applied end_revision (waiting for it
        up to half of `timeout`, then TIMEOUT: the client tries another member). Cut by the limit and CHANGES_PAGE_BYTES between revisions; a revision
        alone over the page is split by its changes' subs (next_sub)."""
        lo, hi = _changes_range(request)
        first, last = request.start_revision, request.end_revision
        if first < 1:
            raise errors.InvalidArgumentError(f"start_revision must be at least 1, got {first}")
        if last < 0:
            raise errors.InvalidArgumentError(f"end_revision must be 0 (now) or a revision, got {last}")
        if user is not None:
            self.gate.check_read(user, (lo, hi))
        limit = min(request.limit or DEFAULT_CHANGES_LIMIT, MAX_CHANGES_LIMIT)
        if last:
            # Half the call's time at most: a member that lags (cut off, say) leaves its client
            # the other half to ask another member.
            await self._revision_applied(last, None if timeout is None else timeout / 2)
        else:
            last = self.fsm.revision
        changes: list[Change] = []
        more, next_revision, next_sub = False, 0, 0
        if first <= last:
            try:
                changes, more, next_revision, next_sub = await self.reads.run(
                    self._changes_page, first, request.start_sub, last, lo, hi, request.prev_kv, limit)
            except CompactedError:
                raise self._compacted(first) from None
            except CorruptStateError as e:
                raise self._refused_as_corrupt(e) from None
        return kv_pb2.ChangesResponse(
            changes=[_change_proto(c, request.prev_kv) for c in changes], revision=self.fsm.revision,
            compacted_revision=self.fsm.compacted_revision, more=more, next_revision=next_revision,
            next_sub=next_sub, end_revision=last)

    def _compacted(self, revision: int) -> errors.RevisionError:
        oldest = max(self.fsm.compacted_revision, 1)
        return errors.RevisionError(f"{COMPACTED_MESSAGE} (revision {revision} was asked for; the oldest available "
                                    f"revision is {oldest})")

    async def _revision_applied(self, revision: int, timeout: float | None) -> None:
        """Return once this member's change feed has reached `revision`; TimeoutError after `timeout`."""
        try:
            await asyncio.wait_for(self.watches.reached(revision), timeout)
        except asyncio.TimeoutError:
            raise errors.TimeoutError(
                f"this member has not reached revision {revision} within {timeout:.3f}s (it is at "
                f"{self.watches.revision}); another member may have") from None

    def _changes_page(self, first: int, first_sub: int, last: int, lo: bytes, hi: bytes | None, with_prev: bool,
                      limit: int) -> tuple[list[Change], bool, int, int]:
        """(changes, more, next revision, next sub) of one page, read from the store a window
        of revisions at a time (in a worker thread)."""
        out: list[Change] = []
        size = 0
        revision, window = first, _FIRST_WINDOW
        while revision <= last:
            if revision - first >= CHANGES_SCAN_REVISIONS:
                return out, True, revision, 0
            upto = min(last, revision + window - 1)
            read = self.fsm.changes(revision, upto, lo, hi, with_prev)
            if first_sub and revision == first:
                read = [c for c in read if c.kv.mod_revision != first or c.kv.mod_sub >= first_sub]
            read_bytes = 0
            i = 0
            while i < len(read):
                at = read[i].kv.mod_revision
                j, group_bytes = i, 0
                while j < len(read) and read[j].kv.mod_revision == at:
                    group_bytes += _change_bytes(read[j])
                    j += 1
                read_bytes += group_bytes
                if len(out) + (j - i) <= limit and size + group_bytes <= CHANGES_PAGE_BYTES:
                    out.extend(read[i:j])
                    size += group_bytes
                    i = j
                    continue
                if out:  # the page ends before this revision
                    return out, True, at, 0
                # This revision alone is over a page: as much of it as fits (at least one change).
                k = i
                while k < j and (k == i or (k - i < limit and size + _change_bytes(read[k]) <= CHANGES_PAGE_BYTES)):
                    size += _change_bytes(read[k])
                    k += 1
                out.extend(read[i:k])
                if k < j:
                    return out, True, at, read[k].kv.mod_sub
                i = k
            spanned = upto - revision + 1
            revision = upto + 1
            # The next window: about what the page has room for, at this window's density.
            per_revision_bytes = read_bytes / spanned
            per_revision_changes = len(read) / spanned
            room = min((CHANGES_PAGE_BYTES - size) / per_revision_bytes if per_revision_bytes else _MAX_WINDOW,
                       (limit - len(out)) / per_revision_changes if per_revision_changes else _MAX_WINDOW)
            window = max(1, min(_MAX_WINDOW, window * 8, int(room * 1.1) + 1))
        return out, False, 0, 0

    def _begin_barrier(self, consistency: int, timeout: float | None, then: Callable[[int], R]) -> asyncio.Future[R]:
        level = _CONSISTENCY.get(consistency)
        if level is None:
            raise errors.InvalidArgumentError(f"unknown consistency {consistency}; use LINEARIZABLE, LEASE or STALE")
        return read_barrier(self.node, level, timeout, then)

    # ---- snapshots ---------------------------------------------------------------------------

    async def save_snapshot(self, timeout: float | None = None, user: str | None = None) -> SnapshotInfo:
        """A snapshot holding everything committed before this call (linearizable: confirmed by a
        ReadIndex round on the leader), taken now if the newest one is older. Root only (auth on)."""
        self.gate.check_root(user)
        index = await read_barrier(self.node, "linearizable", timeout)
        return await node_call(self.node, lambda: self.node.take_snapshot(at_least=index), timeout, TIMEOUT_MESSAGE)

    # ---- status ------------------------------------------------------------------------------

    def status(self) -> kv_pb2.StatusResponse:
        s = self.node.status()
        return kv_pb2.StatusResponse(
            id=s["id"], role=s["role"], term=s["term"], leader=s["leader"] or "",
            commit_index=s["commit_index"], applied_index=s["applied_index"], snapshot_index=s["snapshot_index"],
            peers=s["peers"], cluster_id=s["cluster_id"], last_index=s["last_index"],
            leader_address=s["leader_address"] or "", log_size_bytes=s["log_size_bytes"],
            state_size_bytes=self.fsm.size_bytes(), address=self.node.transport.client_address(self.node.id) or "",
            log_begin_index=s["log_begin_index"], log_begin_term=s["log_begin_term"], rejoining=s["rejoining"],
            disk_full=s["disk_full"], corrupt=self._alarm.reason or "", state_checks=self._state_checks(),
            max_request_bytes=self.node.config.limits.max_request_bytes, nospace=self.nospace(),
            alarms=[a.to_proto() for a in self.alarms.listed()],
            unhealthy=member_health(self.node, self.alarms).reason, voters=s["voters"], learners=s["learners"])


def _changes_range(request: kv_pb2.ChangesRequest) -> tuple[bytes, bytes | None]:
    """The keys [lo, hi) (hi None: to the last key) of a Changes request."""
    given = [name for name in ("key", "prefix") if getattr(request, name)]
    if request.start or request.end:
        given.append("start/end")
    if len(given) > 1:
        raise errors.InvalidArgumentError(f"give one of key, prefix or start/end, not {' and '.join(given)}")
    if request.key:
        return request.key, request.key + b"\0"
    if request.prefix:
        return prefix_range(request.prefix)
    if request.end and request.end <= request.start:
        raise errors.InvalidArgumentError("the range's end must be after its start")
    return request.start, request.end or None


def _change_bytes(change: Change) -> int:
    kv = change.kv
    return len(kv.key) + len(kv.value) + (len(change.prev.value) if change.prev is not None else 0) + \
        _CHANGE_OVERHEAD_BYTES


def _change_proto(change: Change, with_prev: bool) -> kv_pb2.Change:
    kv = change.kv
    if kv.tombstone:
        out = kv_pb2.Change(type=kv_pb2.Change.DELETE, key=kv.key, revision=kv.mod_revision)
    else:
        out = kv_pb2.Change(type=kv_pb2.Change.PUT, key=kv.key, value=kv.value, revision=kv.mod_revision,
                            create_revision=kv.create_revision, version=kv.version)
    if with_prev and change.prev is not None:
        out.prev_value = change.prev.value
    return out


def _refuse(denied: AuthRefusal | None) -> None:
    """A write or read the auth state refused, as kv.errors' error."""
    if denied is not None:
        raise errors.of_kind(denied.kind, str(denied))


def _puts_anything(txn: etcd_pb.TxnRequest) -> bool:
    """Whether any branch of `txn` may put (etcd refuses such requests while NOSPACE is raised)."""
    for op in (*txn.success, *txn.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put" or (kind == "request_txn" and _puts_anything(op.request_txn)):
            return True
    return False

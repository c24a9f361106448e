"""Locks and leader elections on leases, transactions and watches, with the key layout and the
algorithm of etcd's clientv3/concurrency (3.4), so `etcdctl lock NAME` / `etcdctl elect NAME` and a
Python service using these contend for the same lock and the same election.

    from kv.concurrency import Lock, Election
    with Lock(client, "jobs/nightly") as held:   # blocks until this process holds it
        held.revision                            # a fencing token: rises with every new holder
        ...
    election = Election(client, "scheduler")
    election.campaign(b"node-a")                 # blocks until node-a leads
    election.leader()                            # b"node-a"
    election.resign()

Each participant writes one key, NAME/<its lease id in hex>, on its session's lease; the key
created first holds the lock (leads). A waiter watches only the key created just before its own,
for its deletion (no herd). A holder that dies takes its key with its lease, within the lease's
TTL, and the next waiter goes on. The holder's fencing revision is its key's create revision:
a store that checks it (a compare on it, or a larger-than check) refuses a holder that lost the
lock unknowingly."""
from __future__ import annotations

import threading
from collections.abc import Iterator
import time
from types import TracebackType
from typing import TYPE_CHECKING

from kv.client.key_like import KeyLike, to_bytes
from kv.client.txn import Compare, CreateRevision, Op, delete, get, put

if TYPE_CHECKING:
    from kv.client.client import Client
    from kv.client.lease import Lease
    from kv.client.revisions import TxnResult

# etcd's default session TTL (concurrency.NewSession).
DEFAULT_TTL_S = 60


class Session:
    """A lease kept alive for the locks and elections made with it (etcd's concurrency.Session)."""

    def __init__(self, client: Client, ttl: int = DEFAULT_TTL_S) -> None:
        self.client = client
        self.lease: Lease = client.lease(ttl)

    @property
    def lease_id(self) -> int:
        return self.lease.id

    def close(self) -> None:
        """Revoke the lease: every lock held and every campaign made with it ends."""
        self.lease.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Lock:
    """etcd's concurrency.Mutex. Without a session it makes one of its own (closed on release)."""

    def __init__(self, client: Client, name: KeyLike, session: Session | None = None, ttl: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._prefix = to_bytes(name) + b"/"
        self._session = session
        self._own_session = session is None
        self._ttl = ttl
        self.key: bytes | None = None
        self.revision = 0  # the fencing revision while held: this holder's key's create revision

    def acquire(self, timeout: float | None = None) -> Lock:
        """Block until held (TimeoutError after `timeout` seconds, the lock not taken)."""
        if self._session is None:
            self._session = Session(self._client, self._ttl)
        session = self._session
        key = participant_key(self._prefix, session.lease_id)
        result = self._client.txn(*lock_ops(self._prefix, key, session.lease_id))
        self.key = key
        self.revision, behind = lock_position(result)
        if behind:
            try:
                wait_deletes(self._client, self._prefix, self.revision - 1, timeout)
            except BaseException:
                self.release()
                raise
        return self

    def release(self) -> None:
        if self.key is not None:
            self._client.delete(self.key)
            self.key = None
        if self._own_session and self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class Election:
    """etcd's concurrency.Election."""

    def __init__(self, client: Client, name: KeyLike, session: Session | None = None, ttl: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._prefix = to_bytes(name) + b"/"
        self._session = session or Session(client, ttl)
        self.key: bytes | None = None
        self.revision = 0  # the leader key's create revision while campaigning or leading

    def campaign(self, value: KeyLike, timeout: float | None = None) -> None:
        """Block until this participant leads with `value`."""
        session = self._session
        key = participant_key(self._prefix, session.lease_id)
        data = to_bytes(value, "value")
        result = self._client.txn(*campaign_ops(key, data, session.lease_id))
        self.key, self.revision = key, result.revision
        if not result.succeeded:
            kept = result.responses[0][0]
            self.revision = kept.create_revision
            if kept.value != data:
                self.proclaim(data)
        try:
            wait_deletes(self._client, self._prefix, self.revision - 1, timeout)
        except BaseException:
            self.resign()
            raise

    def proclaim(self, value: KeyLike) -> None:
        """A new value from the leader, without another election (ElectionError if it is not)."""
        if self.key is None:
            raise ElectionError("not the leader of this election")
        result = self._client.txn(*proclaim_ops(self.key, self.revision, value, self._session.lease_id))
        if not result.succeeded:
            self.key = None
            raise ElectionError("not the leader of this election")

    def resign(self) -> None:
        """Stop leading (or campaigning): the next participant leads."""
        if self.key is not None:
            self._client.txn(*resign_ops(self.key, self.revision))
            self.key = None

    def leader(self) -> bytes | None:
        """The leader's value now, None when nobody leads."""
        kvs, _ = self._client.get_range(self._prefix, sort_by="create", limit=1)
        return kvs[0].value if kvs else None

    def observe(self) -> Iterator[bytes]:
        """The leader's value now, then each time it changes (a new leader, or a proclaim), as
        etcd's Observe: an endless iterator (break out of it to stop)."""
        last: bytes | None = None
        while True:
            kvs, revision = self._client.get_range(self._prefix, sort_by="create", limit=1)
            if kvs and kvs[0].value != last:
                last = kvs[0].value
                yield last
            with self._client.watch(prefix=self._prefix, start_revision=revision + 1) as changes:
                next(iter(changes))  # any change under the election's prefix: look again

    def close(self) -> None:
        self.resign()
        self._session.close()


class ElectionError(Exception):
    """A proclaim by a participant that does not lead (etcd's ErrElectionNotLeader)."""


# The transactions of the algorithm, without their I/O (shared with kv.aio.concurrency). Each is
# (compare, success, failure) for Client.txn.

Ops = tuple[list[Compare], list[Op], list[Op]]


def participant_key(prefix: bytes, lease_id: int) -> bytes:
    """A participant's key: NAME/<its session's lease id in hex>."""
    return prefix + b"%x" % lease_id


def lock_ops(prefix: bytes, key: bytes, lease_id: int) -> Ops:
    """etcd's Mutex.tryAcquire: create `key` on the lease unless it exists (then read it), and
    read the key created first under `prefix`, the holder's."""
    return ([CreateRevision(key) == 0], [put(key, b"", lease=lease_id), get(prefix, first_created=True)],
            [get(key), get(prefix, first_created=True)])


def lock_position(result: TxnResult) -> tuple[int, bool]:
    """After lock_ops: (the create revision of this participant's key, whether a key created
    before it holds the lock)."""
    revision = result.revision if result.succeeded else result.responses[0][0].create_revision
    owner = result.responses[1]
    return revision, bool(owner) and owner[0].create_revision != revision


def campaign_ops(key: bytes, data: bytes, lease_id: int) -> Ops:
    """etcd's Election.Campaign: create `key` with `data` on the lease unless it exists (then read it)."""
    return [CreateRevision(key) == 0], [put(key, data, lease=lease_id)], [get(key)]


def proclaim_ops(key: bytes, revision: int, value: KeyLike, lease_id: int) -> Ops:
    """A new value under the leader's key, if it is still the one created at `revision`."""
    return [CreateRevision(key) == revision], [put(key, value, lease=lease_id)], []


def resign_ops(key: bytes, revision: int) -> Ops:
    """Delete the participant's key, if it is still the one created at `revision`."""
    return [CreateRevision(key) == revision], [delete(key)], []


def wait_deletes(client: Client, prefix: bytes, max_create_revision: int, timeout: float | None = None) -> None:
    """Return once every key under `prefix` created at or before `max_create_revision` is gone,
    watching only the newest of them each time (etcd's waitDeletes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        kvs, revision = client.get_range(prefix, sort_by="create", descending=True, limit=1,
                                         max_create_revision=max_create_revision)
        if not kvs:
            return
        _wait_delete(client, kvs[0].key, revision, deadline)


def _wait_delete(client: Client, key: bytes, revision: int, deadline: float | None) -> None:
    """Return once `key` is deleted at `revision` or later (TimeoutError at `deadline`)."""
    with client.watch(key=key, start_revision=revision) as watch:
        timer = None
        if deadline is not None:
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), watch.close)  # ends the iteration
            timer.start()
        try:
            for event in watch:
                if event.type == "DELETE":
                    return
        finally:
            if timer is not None:
                timer.cancel()
    raise TimeoutError("the lock or election was not won within the timeout")

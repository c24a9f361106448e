"""The change feed on kv.Client: every change of a revision range to a key range, in revision
order, from any member (KV.Changes). Mixed into Client as Revisions is.

    with Client(["127.0.0.1:7001"]) as c:
        for change in c.changes(start_revision=2, prefix="user/", prev_kv=True):
            change.type, change.key, change.value, change.revision, change.prev_value

The history through a revision the store has reached never changes (until it is compacted), so
the pages of one call may come from different members: a page that fails on one (a leader killed,
a member lagging) is asked of another, and the iterator goes on where it was. A start below the
compacted revision raises kv.errors.RevisionError naming the oldest available revision.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kv.client.key_like import KeyLike, to_bytes
from raftkv_proto import kv_pb2

PUT, DELETE = "put", "delete"
_TYPES = {kv_pb2.Change.PUT: PUT, kv_pb2.Change.DELETE: DELETE}


@dataclass(frozen=True, slots=True)
class Change:
    """One change: a put (the value written, the key's create revision and version after it) or a
    delete (empty value, create_revision and version 0). prev_value: with prev_kv, the value it
    replaced (None when the key did not exist)."""

    type: str  # "put" or "delete"
    key: bytes
    value: bytes
    revision: int
    create_revision: int
    version: int
    prev_value: bytes | None = None

    @classmethod
    def of(cls, change: kv_pb2.Change) -> Change:
        return cls(_TYPES[change.type], change.key, change.value, change.revision, change.create_revision,
                   change.version, change.prev_value if change.HasField("prev_value") else None)


class Changes:
    """Mixed into kv.Client: what these calls use of it."""

    _call: Callable[..., Any]
    revision: Callable[[], int]  # kv.client.revisions.Revisions'

    def changes(self, start_revision: int, end_revision: int | None = None, key: KeyLike | None = None,
                prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
                limit: int = 0, prev_kv: bool = False) -> Iterator[Change]:
        """Every change of revisions start_revision..end_revision (None: through the store's
        revision now, read linearizably) to `key`, to the keys starting with `prefix`, or to those
        in [start, end) (none of them: every key), in revision order, over as many pages as it
        takes (`limit`: changes per page, 0: the server's default)."""
        for page in self.change_pages(start_revision, end_revision, key, prefix, start, end, limit, prev_kv):
            for change in page.changes:
                yield Change.of(change)

    def change_pages(self, start_revision: int, end_revision: int | None = None, key: KeyLike | None = None,
                     prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
                     limit: int = 0, prev_kv: bool = False) -> Iterator[kv_pb2.ChangesResponse]:
        """`changes` a page at a time, as the server sends them (kv_pb2.ChangesResponse: its
        `changes`, the serving member's `revision` and `compacted_revision`)."""
        request = changes_request(start_revision, end_revision, key, prefix, start, end, limit, prev_kv)
        if end_revision is None:
            request.end_revision = self.revision()
        while request.start_revision <= request.end_revision:
            page: kv_pb2.ChangesResponse = self._call(lambda stub: stub.Changes, request)
            yield page
            if not page.more:
                return
            request.start_revision, request.start_sub = page.next_revision, page.next_sub

    def oldest_revision(self) -> int:
        """The oldest revision whose changes the store still keeps: its compacted revision, or 1
        when it never compacted (the first change of a store is at revision 2)."""
        now = self.revision()
        page: kv_pb2.ChangesResponse = self._call(
            lambda stub: stub.Changes, kv_pb2.ChangesRequest(start_revision=now, end_revision=now, key=b"\0", limit=1))
        return max(page.compacted_revision, 1)


def changes_request(start_revision: int, end_revision: int | None, key: KeyLike | None, prefix: KeyLike | None,
                    start: KeyLike | None, end: KeyLike | None, limit: int, prev_kv: bool) -> kv_pb2.ChangesRequest:
    """A Changes request for the first page (end_revision None: 0, the caller fills it in)."""
    if sum(x is not None for x in (key, prefix)) + (start is not None or end is not None) > 1:
        raise ValueError("give one of key, prefix or start/end")
    if start_revision < 1:
        raise ValueError(f"start_revision must be at least 1, got {start_revision}")
    if limit < 0:
        raise ValueError("limit must be 0 (the server's default) or more")
    request = kv_pb2.ChangesRequest(start_revision=start_revision, end_revision=end_revision or 0, limit=limit,
                                    prev_kv=prev_kv)
    if key is not None:
        request.key = to_bytes(key)
    elif prefix is not None:
        request.prefix = to_bytes(prefix, "prefix")
    else:
        request.start = to_bytes(start, "start") if start is not None else b""
        request.end = to_bytes(end, "end") if end is not None else b""
    return request

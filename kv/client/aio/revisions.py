"""Revisions, transactions and the change feed on kv.aio.Client: kv.Client's calls of
kv/client/revisions.py and kv/client/changes.py, awaited, with their requests and answers. Mixed
into the Client as on kv.Client. etcd's calls (get_kv ... compact) travel as etcd's KV requests on
the same connection and, like etcd's, are applied at least once."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from kv.client.changes import Change, changes_request
from kv.client.key_like import KeyLike
from kv.client.revisions import (
    KeyValue,
    TxnResult,
    compare_and_swap_ops,
    first_kv,
    get_kv_request,
    get_range_request,
    put_if_absent_ops,
    revision_request,
    scan_at_request,
    txn_request,
    txn_result,
)
from kv.client.txn import Compare, Op
from raftkv_proto import etcd_rpc_pb2 as pb_etcd
from raftkv_proto import kv_pb2


class Revisions:
    """Mixed into kv.aio.Client: what these calls use of it."""

    _call: Callable[..., Any]

    async def get_kv(self, key: KeyLike, revision: int | None = None,
                     consistency: str = "linearizable") -> KeyValue | None:
        """`key` with its revisions and version, as of `revision` (None: now); None when absent."""
        return first_kv(await self._range(get_kv_request(key, revision, consistency)))

    async def revision(self) -> int:
        """The store's revision now."""
        return (await self._range(revision_request())).header.revision

    async def scan_at(self, revision: int, prefix: KeyLike | None = None, start: KeyLike | None = None,
                      end: KeyLike | None = None, limit: int = 100, consistency: str = "linearizable",
                      keys_only: bool = False) -> list[KeyValue]:
        """The keys (with their revisions) as they were at `revision`; at most `limit` (0: all)."""
        response = await self._range(scan_at_request(revision, prefix, start, end, limit, consistency, keys_only))
        return [KeyValue.of(kv) for kv in response.kvs]

    async def get_range(self, prefix: KeyLike, sort_by: str = "key", descending: bool = False, limit: int = 0,
                        max_create_revision: int = 0,
                        consistency: str = "linearizable") -> tuple[list[KeyValue], int]:
        """etcd's Get with options on the keys starting with `prefix` (kv.Client.get_range)."""
        response = await self._range(get_range_request(prefix, sort_by, descending, limit, max_create_revision,
                                                       consistency))
        return [KeyValue.of(kv) for kv in response.kvs], response.header.revision

    async def txn(self, compare: Sequence[Compare] = (), success: Sequence[Op] = (),
                  failure: Sequence[Op] = ()) -> TxnResult:
        """etcd's transaction (kv.txn builds compares and ops): applied at least once, as etcd's."""
        return txn_result(await self._call(lambda stub: stub.etcd.Txn, txn_request(compare, success, failure)))

    async def compare_and_swap(self, key: KeyLike, expected: KeyLike, new: KeyLike) -> bool:
        """Write `new` under `key` if its value is `expected` now; whether it did."""
        return (await self.txn(*compare_and_swap_ops(key, expected, new))).succeeded

    async def put_if_absent(self, key: KeyLike, value: KeyLike) -> bool:
        """Write `value` under `key` if the key does not exist; whether it did."""
        return (await self.txn(*put_if_absent_ops(key, value))).succeeded

    async def compact(self, revision: int) -> None:
        """Drop the history below `revision` (etcd's Compact)."""
        await self._call(lambda stub: stub.etcd.Compact, pb_etcd.CompactionRequest(revision=revision))

    async def _range(self, request: pb_etcd.RangeRequest) -> pb_etcd.RangeResponse:
        return await self._call(lambda stub: stub.etcd.Range, request)


class Changes:
    """Mixed into kv.aio.Client: what these calls use of it."""

    _call: Callable[..., Any]
    revision: Callable[[], Any]  # Revisions'


    async def changes(self, start_revision: int, end_revision: int | None = None, key: KeyLike | None = None,
                      prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
                      limit: int = 0, prev_kv: bool = False) -> AsyncIterator[Change]:
        """Every change of revisions start_revision..end_revision (None: through the store's
        revision now) to a key, a prefix or [start, end), in revision order (kv.Client.changes)."""
        async for page in self.change_pages(start_revision, end_revision, key, prefix, start, end, limit, prev_kv):
            for change in page.changes:
                yield Change.of(change)

    async def change_pages(self, start_revision: int, end_revision: int | None = None, key: KeyLike | None = None,
                           prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
                           limit: int = 0, prev_kv: bool = False) -> AsyncIterator[kv_pb2.ChangesResponse]:
        """`changes` a page at a time, as the server sends them."""
        request = changes_request(start_revision, end_revision, key, prefix, start, end, limit, prev_kv)
        if end_revision is None:
            request.end_revision = await self.revision()
        while request.start_revision <= request.end_revision:
            page: kv_pb2.ChangesResponse = await self._call(lambda stub: stub.Changes, request)
            yield page
            if not page.more:
                return
            request.start_revision, request.start_sub = page.next_revision, page.next_sub

    async def oldest_revision(self) -> int:
        """The oldest revision whose changes the store still keeps (kv.Client.oldest_revision)."""
        now = await self.revision()
        page = await self._call(lambda stub: stub.Changes,
                                kv_pb2.ChangesRequest(start_revision=now, end_revision=now, key=b"\0", limit=1))
        return max(page.compacted_revision, 1)

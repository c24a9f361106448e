"""KV.Changes on a real single node (kv/server/kv_handler.py): pages cut between revisions by the
limit and the byte budget (a revision split only when it alone is over a page), every change once
across pages, key ranges, prev values, deletes, the wait for end_revision, compaction's refusal
and the read permission check."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kv import errors
from kv.server import kv_handler
from kv.server.kv_handler import KVHandler
from raftkv_proto import kv_pb2
from statemachine.commands import delete_op, encode_command, encode_compaction, put_op
from tests.unit.test_node import WAIT_S, Single, run


async def write(node, ops: list[kv_pb2.Op]) -> int:  # type: ignore[no-untyped-def]
    """Apply `ops` as one command; the store's revision after it."""
    outcome = await node.propose(encode_command(ops))
    return outcome.result.revision


async def all_pages(handler: KVHandler, **request: object) -> list[kv_pb2.ChangesResponse]:
    pages = []
    req = kv_pb2.ChangesRequest(**request)  # type: ignore[arg-type]
    while True:
        page = await handler.changes(req, WAIT_S)
        pages.append(page)
        if not page.more:
            return pages
        req.start_revision, req.start_sub = page.next_revision, page.next_sub


def flat(pages: list[kv_pb2.ChangesResponse]) -> list[tuple[int, int, bytes, bytes]]:
    return [(c.revision, c.type, c.key, c.value) for p in pages for c in p.changes]


def page_bytes(changes) -> int:  # type: ignore[no-untyped-def]
    return sum(len(c.key) + len(c.value) + len(c.prev_value) + 32 for c in changes)


def test_pages_are_cut_between_revisions_by_limit_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_handler, "CHANGES_PAGE_BYTES", 2_000)

    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            handler.watches.start()  # the change feed KV.Changes waits on
            first = single.fsm.revision + 1
            sizes = [1, 3, 2, 7, 1, 4, 2, 5, 3, 1, 6, 2] * 4
            for n, size in enumerate(sizes):  # revisions of 1..7 changes of ~140 bytes (a revision < 2,000)
                await write(node, [put_op(b"k/%02d/%d" % (n, i), b"v" * 100) for i in range(size)]
                            + [put_op(b"other/%02d" % n, b"x")])  # outside the prefix
            last = single.fsm.revision
            whole = [(c.kv.mod_revision, c.kv.key) for c in single.fsm.changes(first, last, b"k/", b"k0")]
            assert len(whole) == sum(sizes)
            for limit in (7, 9, 20, 0):
                pages = await all_pages(handler, start_revision=first, end_revision=last, prefix=b"k/", limit=limit)
                assert [(r, k) for r, _, k, _ in flat(pages)] == whole
                assert len(pages) > 1 and not pages[-1].more
                for page, following in zip(pages, pages[1:]):
                    assert page.more and page.next_sub == 0  # never split: every revision fits a page
                    assert page.changes[-1].revision < following.changes[0].revision == page.next_revision
                    # Cut as late as it could: the next revision would not have fit.
                    extra = [c for c in following.changes if c.revision == following.changes[0].revision]
                    assert len(page.changes) + len(extra) > (limit or kv_handler.DEFAULT_CHANGES_LIMIT) or \
                        page_bytes(page.changes) + page_bytes(extra) > 2_000
                    assert len(page.changes) <= (limit or kv_handler.DEFAULT_CHANGES_LIMIT)
                    assert page_bytes(page.changes) <= 2_000

    run(main)


def test_a_revision_larger_than_a_page_is_split_by_its_changes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_handler, "CHANGES_PAGE_BYTES", 2_000)

    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            handler.watches.start()  # the change feed KV.Changes waits on
            first = await write(node, [put_op(b"a", b"1")])
            big = await write(node, [put_op(b"b/%03d" % i, b"v" * 300) for i in range(20)])  # ~6.6 KB
            await write(node, [put_op(b"c", b"2"), delete_op(b"a")])
            last = single.fsm.revision
            pages = await all_pages(handler, start_revision=first, end_revision=last)
            got = flat(pages)
            assert [(r, k) for r, _, k, _ in got] == [(c.kv.mod_revision, c.kv.key) for c in single.fsm.changes(first, last)]
            # The first page ends before the big revision; its last part shares a page with the next.
            assert [len(p.changes) for p in pages] == [1, 5, 5, 5, 7]
            assert [(p.next_revision, p.next_sub) for p in pages[:-1]] == [(big, 0), (big, 5), (big, 10), (big, 15)]
            assert got[-1] == (last, kv_pb2.Change.DELETE, b"a", b"")

    run(main)


def test_key_ranges_prev_values_and_deletes(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            handler.watches.start()  # the change feed KV.Changes waits on
            r1 = await write(node, [put_op(b"p/a", b"1"), put_op(b"q", b"x")])
            r2 = await write(node, [put_op(b"p/a", b"2")])
            r3 = await write(node, [delete_op(b"p/a"), put_op(b"p/b", b"3")])
            page = await handler.changes(kv_pb2.ChangesRequest(start_revision=r1, end_revision=r3, prefix=b"p/",
                                                               prev_kv=True), WAIT_S)
            got = [(c.revision, c.type, c.key, c.value, c.create_revision, c.version,
                    c.prev_value if c.HasField("prev_value") else None) for c in page.changes]
            assert got == [(r1, kv_pb2.Change.PUT, b"p/a", b"1", r1, 1, None),
                           (r2, kv_pb2.Change.PUT, b"p/a", b"2", r1, 2, b"1"),
                           (r3, kv_pb2.Change.DELETE, b"p/a", b"", 0, 0, b"2"),
                           (r3, kv_pb2.Change.PUT, b"p/b", b"3", r3, 1, None)]
            assert (page.more, page.revision, page.compacted_revision) == (False, r3, 0)
            one = await handler.changes(kv_pb2.ChangesRequest(start_revision=1, key=b"q"), WAIT_S)
            assert [(c.key, c.value) for c in one.changes] == [(b"q", b"x")] and one.end_revision == r3
            ranged = await handler.changes(kv_pb2.ChangesRequest(start_revision=1, start=b"p/b", end=b"r"), WAIT_S)
            assert [c.key for c in ranged.changes] == [b"q", b"p/b"]  # revision order
            assert not (await handler.changes(kv_pb2.ChangesRequest(start_revision=r3 + 1), WAIT_S)).changes
            for bad in (kv_pb2.ChangesRequest(start_revision=0),
                        kv_pb2.ChangesRequest(start_revision=1, key=b"a", prefix=b"p"),
                        kv_pb2.ChangesRequest(start_revision=1, start=b"b", end=b"a")):
                with pytest.raises(errors.InvalidArgumentError):
                    await handler.changes(bad, WAIT_S)
            with pytest.raises(errors.PermissionDeniedError):  # a user with no role may read nothing
                await handler.changes(kv_pb2.ChangesRequest(start_revision=1, prefix=b"p/"), WAIT_S, user="nobody")

    run(main)


def test_a_page_waits_for_its_end_revision_and_a_compacted_start_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        single = Single(tmp_path)
        async with single as node:
            handler = KVHandler(node, single.fsm)
            handler.watches.start()  # the change feed KV.Changes waits on
            now = await write(node, [put_op(b"k", b"1")])
            waiting = asyncio.ensure_future(handler.changes(
                kv_pb2.ChangesRequest(start_revision=now, end_revision=now + 2), WAIT_S))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await write(node, [put_op(b"k", b"2")])
            await write(node, [put_op(b"k", b"3")])
            page = await waiting
            assert [c.value for c in page.changes] == [b"1", b"2", b"3"] and page.end_revision == now + 2
            with pytest.raises(errors.TimeoutError, match="has not reached revision"):
                await handler.changes(kv_pb2.ChangesRequest(start_revision=1, end_revision=now + 10), 0.4)
            assert not (await node.propose(encode_compaction(now + 1))).result.refusal
            with pytest.raises(errors.RevisionError) as refused:
                await handler.changes(kv_pb2.ChangesRequest(start_revision=now), WAIT_S)
            assert str(refused.value) == ("etcdserver: mvcc: required revision has been compacted (revision "
                                          f"{now} was asked for; the oldest available revision is {now + 1})")
            kept = await handler.changes(kv_pb2.ChangesRequest(start_revision=now + 1), WAIT_S)
            assert [c.value for c in kept.changes] == [b"2", b"3"] and kept.compacted_revision == now + 1

    run(main)

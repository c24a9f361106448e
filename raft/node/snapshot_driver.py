"""The snapshot lifecycle of one node: take one every N applied entries (in the background:
applying goes on) and compact the log behind it; stream the newest to a follower the core says
needs it; receive one from the leader, verify it and offer it to the core; install it when the
core's Ready says so.

Everything blocking runs on the node's worker threads (ports.Offload): the state machine's copy
and the log's compaction never hold the event loop."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from raft.core.messages import InstallSnapshotRequest, InstallSnapshotResponse
from raft.core.types import SnapshotMeta
from raft.node.ports import Chunks, SnapshotHost, SnapshotInfo

if TYPE_CHECKING:
    from raft.node.node import RaftNode

log = logging.getLogger(__name__)


class SnapshotDriver:
    def __init__(self, node: RaftNode, host: SnapshotHost | None) -> None:
        self._node = node
        self._host = host
        self.newest: SnapshotInfo | None = host.newest() if host else None
        self._taking: asyncio.Task[SnapshotInfo] | None = None
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._wanted: dict[str, int] = {}  # peer -> term of a send asked for mid-stream
        self._received: tuple[SnapshotMeta, Path] | None = None
        self.bytes_since = 0  # applied payload since the newest snapshot

    def tasks(self) -> list[asyncio.Task]:  # type: ignore[type-arg]
        """What runs in the background (the node cancels these when it stops)."""
        return [*self._streams.values(), *([self._taking] if self._taking is not None else [])]

    # ---- taking ------------------------------------------------------------------------------

    def maybe_take(self) -> None:
        """Start a snapshot once enough was applied since the newest."""
        if self._host is None or self._taking is not None:
            return
        config, base = self._node.config, self.newest.index if self.newest else 0
        if (self._node.applied_index - base >= config.storage.snapshot_threshold
                or self.bytes_since >= config.storage.snapshot_threshold_bytes):
            self._taking = asyncio.create_task(self._take(), name=f"raft-snapshot-{self._node.id}")

    async def take(self, at_least: int = 0) -> SnapshotInfo:
        """A snapshot that includes at least index `at_least` (taken now if the newest does not)."""
        if self._host is None:
            raise RuntimeError("this node keeps no snapshots")
        while True:
            if self.newest is not None and self.newest.index >= max(at_least, 1):
                return self.newest
            if self._taking is None:
                self._taking = asyncio.create_task(self._take(), name=f"raft-snapshot-{self._node.id}")
            info = await asyncio.shield(self._taking)
            if info.index >= at_least:
                return info

    async def _take(self) -> SnapshotInfo:
        assert self._host is not None
        node = self._node
        try:
            info = await node.workers.snapshot.run(self._host.take)
            self.newest, self.bytes_since = info, 0
            await node.workers.log.run(self._compact_log, self._compaction_point(info))
            if not self._streams:  # never delete a file that is being streamed
                await node.workers.snapshot.run(self._host.prune)
            log.info("node %s took a snapshot at index %d; log now begins after %d", node.id, info.index,
                     node.log.before_begin()[0])
            return info
        except Exception:
            log.exception("node %s failed to take a snapshot", node.id)
            raise
        finally:
            self._taking = None

    def _compaction_point(self, info: SnapshotInfo) -> int:
        """Keep a tail behind the snapshot so a slightly slow follower needs no install, and (up
        to as much again) what live followers still lack: a lazy follower trails by up to
        lazy_push_ms, which under a fast writer can be more than a short tail."""
        trailing = self._node.config.storage.trailing_entries
        upto = info.index - trailing
        floor = self._node.core.replicating_floor()
        if floor is not None:
            upto = max(min(upto, floor), info.index - 2 * trailing)
        return upto

    def _compact_log(self, upto: int) -> None:
        """(log thread) Drop log entries through `upto`, if the log still holds them."""
        store = self._node.log
        if upto > store.before_begin()[0] and store.term(upto) is not None:
            store.compact(upto)

    # ---- sending -----------------------------------------------------------------------------

    def send(self, peer: str, term: int) -> None:
        """Ready.snapshot_sends: stream the newest snapshot to `peer`."""
        if self._host is None:
            log.error("peer %s needs a snapshot, but this node keeps none", peer)
            return
        if peer in self._streams:
            # The follower may already have answered the running stream (its reply travels on
            # its own link) and need a newer snapshot: send again as soon as this one ends.
            self._wanted[peer] = term
            return
        self._streams[peer] = asyncio.create_task(self._stream(peer, term), name=f"raft-snapshot-to-{peer}")

    async def _stream(self, peer: str, term: int) -> None:
        """The follower's core answers through the normal messages once it installed the
        snapshot; a failed stream is reported to our core right away."""
        node = self._node
        ok, why = False, ""
        try:
            info = await self._sendable()
            meta = SnapshotMeta(info.index, info.term, info.membership)
            rate = node.config.tuning.snapshot_bandwidth_bytes_per_s
            timeout = 60.0 + (info.file_size / rate if rate else 0.0)
            log.info("node %s sending snapshot at index %d (%d bytes) to %s", node.id, info.index, info.file_size, peer)
            started = time.perf_counter()
            ok, why = await node.transport.send_snapshot(peer, term, meta, info, self._throttled_chunks(info), timeout)
            if ok:
                node.stats.snapshots_sent += 1
                node.stats.snapshot_sent_bytes += info.file_size
                node.stats.snapshot_send_seconds.observe(time.perf_counter() - started)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            why = str(e)
        finally:
            self._streams.pop(peer, None)
            wanted = self._wanted.pop(peer, None)
            if wanted is not None and node.running:
                self.send(peer, wanted)
        if not ok:
            log.warning("node %s could not send a snapshot to %s: %s", node.id, peer, why)
            node.step([InstallSnapshotResponse(peer, node.id, term, success=False)])

    async def _sendable(self) -> SnapshotInfo:
        """The newest snapshot, verified, and covering the log's start (the follower goes on from
        the log after it); a damaged one is set aside and a fresh one taken."""
        assert self._host is not None
        while True:
            info = await self.take(at_least=self._node.log.before_begin()[0])
            if await self._node.workers.snapshot_io.run(self._host.verify, info):
                return info
            if self.newest == info:
                self.newest = None  # set aside: the next take makes a fresh one

    async def _throttled_chunks(self, info: SnapshotInfo) -> AsyncIterator[tuple[int, bytes, bool]]:
        """The file in chunks, read off the loop, paced to the configured bandwidth so a large
        install neither starves heartbeats nor floods the link."""
        assert self._host is not None
        config = self._node.config
        chunks = self._host.chunks(info, config.tuning.snapshot_chunk_bytes)
        rate = config.tuning.snapshot_bandwidth_bytes_per_s
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while (chunk := await self._node.workers.snapshot_io.run(next, chunks, None)) is not None:
            yield chunk
            sent += len(chunk[1])
            if rate and (ahead := sent / rate - (loop.time() - start)) > 0:
                await asyncio.sleep(ahead)

    # ---- receiving ---------------------------------------------------------------------------

    async def receive(self, leader: str, term: int, meta: SnapshotMeta, total_size: int, sha256: str,
                      chunks: Chunks) -> tuple[bool, str]:
        """Write a snapshot streamed by the leader to a temporary file, verify its size and
        checksum, then offer it to the core, which decides (by term and commit index) whether to
        install it. Nothing is held in memory beyond one chunk."""
        if self._host is None:
            return False, "this node takes no snapshots"
        io = self._node.workers.snapshot_io
        receiver = await io.run(self._host.receiver, f"snapshot from {leader}")
        try:
            async for offset, data, done in chunks:
                await io.run(receiver.feed, offset, data)
                if done:
                    path = await io.run(receiver.finish, total_size, sha256)
                    self._offer(leader, term, meta, path)
                    return True, ""
            raise ValueError("the snapshot stream ended before its last chunk")
        except Exception as e:  # corrupt or misordered data: the leader retries
            await io.run(receiver.abort)
            log.warning("node %s refused a snapshot from %s: %s", self._node.id, leader, e)
            return False, str(e)

    def _offer(self, leader: str, term: int, meta: SnapshotMeta, path: Path) -> None:
        if self._received is not None:
            self._received[1].unlink(missing_ok=True)
        self._received = (meta, path)
        self._node.step([InstallSnapshotRequest(leader, self._node.id, term, meta=meta)])

    async def install(self, meta: SnapshotMeta) -> None:
        """Ready.snapshot: swap the state machine to the received snapshot, then reset the log to
        begin after it (a crash between the two is repaired at start: raft/node/recovery.py)."""
        assert self._host is not None
        node, received = self._node, self._received
        if received is None or (received[0].index, received[0].term) != (meta.index, meta.term):
            raise RuntimeError(f"the core installs snapshot {meta} but no such file was received")
        self._received = None
        started = time.perf_counter()
        info = await node.workers.apply.run(self._host.install, received[1])
        await node.workers.log.run(node.log.reset_to_snapshot, info.index, info.term)
        self.newest, self.bytes_since = info, 0
        node.stats.snapshots_installed += 1
        node.stats.snapshot_installed_bytes += info.file_size
        node.stats.snapshot_install_seconds.observe(time.perf_counter() - started)
        log.info("node %s installed a snapshot at index %d (term %d)", node.id, info.index, info.term)

"""The narrow interfaces the driver is built on, as hashicorp/raft's FSM, SnapshotStore and
Transport: production implementations live in raft/log, raft/transport and kv/server; the
simulator (tests/sim) has in-memory ones, so the very same driver runs under simulated faults.

The log store's interface is raft.core.log_store.LogStore (the core reads it too)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Collection, Iterator, Mapping, Protocol, Sequence

from raft.core.messages import Message
from raft.core.types import Entry, SnapshotMeta

# Milliseconds of a monotonic clock: what the core is told the time is.
Clock = Callable[[], int]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class StateMachine(Protocol):
    """Where committed entries go. The KV state machine (kv/server/replaceable_state.py) is the
    production one."""

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied (durably enough that a restart resumes after it)."""
        ...

    @property
    def applied_term(self) -> int:
        """Term of the entry at applied_index (0 when none was applied)."""
        ...

    @property
    def membership(self) -> bytes:
        """The configuration of the last CONFIG entry applied (raft/core/membership.py's
        encoding; b"" when none was): what the node restarts with."""
        ...

    def apply(self, entries: Sequence[Entry]) -> list[object]:
        """Apply committed entries in order, NOOPs and CONFIGs included (they move applied_index). Returns one
        result per entry applied, handed to the proposer of that entry: all of them, or the first
        few when it ends the batch early (the KV state machine does at a state check marker); the
        driver hands it the rest again. May block (a worker thread)."""
        ...

    def in_proportion(self, entries: Sequence[Entry]) -> bool:
        """Whether applying `entries` costs in proportion to their size (no command that acts on
        whatever a range of keys holds). Only such entries, and few and small, are applied on the
        driver's event loop; any other apply runs on the apply thread, beside the heartbeats."""
        ...


class DiskSpace(Protocol):
    """The space left where the node keeps its data."""

    def free_bytes(self) -> int:
        """Bytes still free for the node's files on their file system."""
        ...


@dataclass(frozen=True, slots=True)
class ClientAddresses:
    """Where clients reach a member, as it advertises them to its peers: its gRPC client port
    (host:port) and its etcd JSON gateway (host:port; empty when it serves none)."""

    grpc: str
    http: str = ""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    index: int
    term: int
    path: Path
    file_size: int  # bytes of the whole snapshot file (what a stream carries)
    sha256: str  # of the payload, as the manifest records it (what a receiver verifies)
    membership: bytes = b""  # the configuration in force at `index` (SnapshotMeta.membership)


class SnapshotReceiving(Protocol):
    def feed(self, offset: int, data: bytes) -> None: ...
    def finish(self, expected_size: int, expected_sha256: str) -> Path: ...
    def abort(self) -> None: ...


class SnapshotHost(Protocol):
    """Snapshots of the state machine (hashicorp/raft's SnapshotStore and FSM.Restore in one).
    Every method may block (disk, LMDB): the driver calls them from worker threads."""

    def newest(self) -> SnapshotInfo | None:
        """The newest complete snapshot on disk."""
        ...

    def take(self) -> SnapshotInfo:
        """Snapshot the state machine at its applied index, without stopping it applying, and
        make sure the state machine itself is on disk at least that far (so the log may be
        compacted up to the snapshot)."""
        ...

    def receiver(self, source: str) -> SnapshotReceiving:
        """Where a snapshot streamed from the leader is written and verified."""
        ...

    def install(self, verified_file: Path) -> SnapshotInfo:
        """Replace the state machine's contents by the snapshot's (atomically: a crash leaves
        either the old or the new state) and keep the file as the newest snapshot."""
        ...

    def check(self) -> None:
        """(At start) Verify the newest snapshot, setting damaged ones aside until one verifies."""
        ...

    def verify(self, info: SnapshotInfo) -> bool:
        """Check the file against its manifest (its payload's sha256); a damaged one is set aside,
        no longer the newest, and False returned."""
        ...

    def restore(self, info: SnapshotInfo) -> None:
        """Replace the state machine's contents by those of a snapshot already kept here (at
        start, when the state lost what the log no longer holds)."""
        ...

    def chunks(self, info: SnapshotInfo, chunk_size: int) -> Iterator[tuple[int, bytes, bool]]:
        """The snapshot file as (offset, data, done) pieces."""
        ...

    def prune(self) -> None:
        """Drop snapshot files no longer needed."""
        ...


# What a snapshot stream carries: (offset, data, done) pieces of the file.
Chunks = AsyncIterator[tuple[int, bytes, bool]]


class Inbound(Protocol):
    """What a transport hands to its node (RaftNode implements it). Called on the node's loop."""

    def step(self, messages: Sequence[Message]) -> None:
        """Messages from a peer, already checked (cluster, sender, addressee)."""
        ...

    def peer_unreachable(self, peer: str) -> None:
        """The connection to `peer` was refused or reset: its process is most likely gone."""
        ...

    async def receive_snapshot(self, leader: str, term: int, meta: SnapshotMeta, total_size: int,
                               sha256: str, chunks: Chunks) -> tuple[bool, str]:
        """A snapshot streamed by `leader`; (installed-or-offered, why not)."""
        ...

    def removed_from_cluster(self, why: str) -> None:
        """A peer refused this node as a member removed from the cluster."""
        ...


class PeerTransport(Protocol):
    """How a node reaches its peers. `send` never blocks: it queues, and drops what cannot be
    delivered (Raft resends what still matters)."""

    async def start(self, inbound: Inbound) -> None:
        """Start taking the peers' connections and hand what arrives to `inbound`."""
        ...

    def send(self, messages: Sequence[Message]) -> None: ...

    async def send_snapshot(self, peer: str, term: int, meta: SnapshotMeta, info: SnapshotInfo,
                            chunks: Chunks, timeout_s: float) -> tuple[bool, str]:
        """Stream a snapshot file to `peer`; (accepted, why not)."""
        ...

    def reconfigure(self, addresses: Mapping[str, str], removed: Collection[str]) -> None:
        """The configuration changed: reach each member at its address (adding links for new
        ones), and refuse the members seen removed."""
        ...

    def client_address(self, member: str) -> str | None:
        """The address `member` advertises to clients, when known."""
        ...

    def client_http_address(self, member: str) -> str | None:
        """The address of `member`'s etcd JSON gateway, when it serves one and it is known."""
        ...

    async def probe(self) -> dict[str, tuple[int, int, int]]:
        """Ask every peer for its term and the end of its log: member -> (term, last log term,
        last log index) of those that answered (raft/node/joining.py)."""
        ...

    async def close(self) -> None: ...


class RejoinRecord(Protocol):
    """Where a node that lost its data keeps, durably, that it rejoins and its rejoin floor (the
    log end a candidate must reach for its vote) until it has caught up (raft/node/joining.py)."""

    def load(self) -> tuple[int, int] | None: ...

    def save(self, floor: tuple[int, int] | None) -> None:
        """Record `floor` (None: caught up, no longer rejoining), durably before returning."""
        ...


class Offload(Protocol):
    """Runs blocking calls (log compaction, large applies, snapshot files) off the event loop, in
    the order they were handed over. Production: raft/node/worker_thread.py; the simulator runs
    them on its virtual clock."""

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]: ...

    async def close(self) -> None:
        """Finish what was handed over, then stop."""
        ...

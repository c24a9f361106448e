"""The worker threads of one node, by job: each runs its calls in order, off the event loop."""
from __future__ import annotations

from dataclasses import dataclass

from raft.node.ports import Offload
from raft.node.worker_thread import WorkerThread


@dataclass(frozen=True, slots=True)
class Workers:
    log: Offload  # log compaction and resets (the loop itself writes the log: ready_handler.py)
    apply: Offload  # large applies and snapshot installs
    snapshot: Offload  # taking and pruning snapshots (seconds for a large state)
    snapshot_io: Offload  # reading and writing the chunks of snapshot streams

    @classmethod
    def threads(cls, node_id: str) -> Workers:
        return cls(*(WorkerThread(f"raft-{job}-{node_id}") for job in ("log", "apply", "snapshot", "snapshot-io")))

    async def close(self) -> None:
        for worker in (self.log, self.apply, self.snapshot, self.snapshot_io):
            await worker.close()

"""Outbox: what the core's inputs produced for the driver, kept until ready() takes it into a
Ready (ready.py says how the driver handles each part). The core and its parts (election.py,
leadership.py) add to it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from raft.core.messages import HeartbeatResponse, Message
from raft.core.ready import DroppedProposals, FailedRead, Ready, SnapshotSend


@dataclass(slots=True)
class Outbox:
    messages: list[Message] = field(default_factory=list)  # sent only after the Ready's write
    leader_messages: list[Message] = field(default_factory=list)  # may leave before it
    snapshot_sends: list[SnapshotSend] = field(default_factory=list)
    failed_proposals: list[DroppedProposals] = field(default_factory=list)
    failed_reads: list[FailedRead] = field(default_factory=list)

    def send(self, outgoing: Iterable[Message | SnapshotSend]) -> None:
        """A leader's output (dispatcher.py's Outgoing): messages, and snapshots to stream."""
        for item in outgoing:
            if isinstance(item, SnapshotSend):
                self.snapshot_sends.append(item)
            else:
                self.leader_messages.append(item)

    def take_early(self, answers: bool) -> list[Message]:
        """The leader's messages, and with `answers` the answers to heartbeats
        (RaftCore.take_early_messages): taken out of the next Ready."""
        early, self.leader_messages = self.leader_messages, []
        if answers and self.messages:
            kept: list[Message] = []
            for m in self.messages:
                (early if isinstance(m, HeartbeatResponse) else kept).append(m)
            self.messages = kept
        return early

    def pending(self) -> bool:
        return bool(self.messages or self.leader_messages or self.snapshot_sends or self.failed_proposals
                    or self.failed_reads)

    def take_into(self, rd: Ready) -> None:
        rd.leader_messages, self.leader_messages = self.leader_messages, []
        rd.messages, self.messages = self.messages, []
        rd.failed_reads, self.failed_reads = self.failed_reads, []
        rd.failed_proposals, self.failed_proposals = self.failed_proposals, []
        rd.snapshot_sends, self.snapshot_sends = self.snapshot_sends, []

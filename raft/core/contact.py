"""What a leader knows of its contact with its followers: its heartbeat rounds (numbered, with
the time each was sent), which round each follower acknowledged last, and when each last answered
anything. From that follow the three things a leader must know about its own authority:

- a read round is confirmed once a majority (the leader included) acknowledged it (ReadIndex);
- the lease holds while a majority acknowledged a heartbeat sent less than lease_ms ago;
- check-quorum: a leader that has not heard from a majority for an election timeout steps down.

Pure bookkeeping on the core's clock; the leadership (leadership.py) sends the heartbeats."""
from __future__ import annotations

from typing import Sequence

from raft.core.node_state import NEVER

# Heartbeat send times kept, per leader term: acknowledgements of older rounds no longer date a lease.
_SENT_KEPT = 1000


class FollowerContact:
    def __init__(self, peers: Sequence[str], need: int, now: int) -> None:
        """`peers`: the voters other than the leader; `need`: how many of them a majority needs
        beside the leader (all of a majority when the leader itself is no voter)."""
        self._peers = tuple(peers)
        self._need = need
        self.since = now  # when this leadership began
        self.seq = 0  # the newest round sent
        self._sent_at: dict[int, int] = {}
        self._acked: dict[str, int] = {p: 0 for p in peers}  # newest round each follower acknowledged
        self._heard: dict[str, int] = {}  # any answer in this term
        self._ack_sent: dict[str, int] = {}  # send time of the newest heartbeat each acknowledged

    def reconfigure(self, peers: Sequence[str], need: int) -> None:
        """A new configuration: what is known of the voters that stay is kept."""
        self._peers = tuple(peers)
        self._need = need
        for p in self._peers:
            self._acked.setdefault(p, 0)

    def new_round(self, now: int) -> int:
        self.seq += 1
        self._sent_at[self.seq] = now
        self._sent_at.pop(self.seq - _SENT_KEPT, None)
        return self.seq

    def heard_from(self, peer: str, now: int) -> None:
        self._heard[peer] = now

    def discount(self, held: int) -> None:
        """The leader was stalled `held` ms beyond a heartbeat interval (stall.py):
        its check-quorum does not count them against its followers. Leases keep their own times."""
        for peer in self._heard:
            self._heard[peer] += held

    def acknowledged(self, peer: str, seq: int) -> bool:
        """`peer` acknowledged round `seq`; True when that is newer than what it acknowledged before."""
        if seq <= self._acked.get(peer, 0):
            return False
        self._acked[peer] = seq
        sent = self._sent_at.get(seq)
        if sent is not None:
            self._ack_sent[peer] = max(self._ack_sent.get(peer, NEVER), sent)
        return True

    def confirmed_round(self) -> int:
        """The newest round a majority acknowledged (0: none)."""
        if self._need == 0:
            return self.seq
        return sorted((self._acked.get(p, 0) for p in self._peers), reverse=True)[self._need - 1]

    def read_round_peers(self) -> list[str]:
        """The followers a read round asks: as many as a majority needs, those that acknowledged
        the newest rounds."""
        return sorted(self._peers, key=lambda p: self._acked.get(p, 0), reverse=True)[:self._need]

    def lease_valid(self, now: int, lease_ms: int) -> bool:
        if self._need == 0:
            return True
        sent = sorted((self._ack_sent.get(p, NEVER) for p in self._peers), reverse=True)
        return now < sent[self._need - 1] + lease_ms

    def quorum_active(self, now: int, timeout_ms: int) -> bool:
        """Heard from a majority within `timeout_ms` (or leading for less than that)."""
        if now - self.since < timeout_ms:
            return True
        heard = sum(1 for p in self._peers if now - self._heard.get(p, NEVER) < timeout_ms)
        return heard >= self._need

    def live(self, peer: str, now: int, timeout_ms: int) -> bool:
        """`peer` answered anything within `timeout_ms`."""
        return now - self._heard.get(peer, NEVER) < timeout_ms

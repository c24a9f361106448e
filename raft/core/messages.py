"""Messages between cores. The transport maps them to and from raft.proto; the simulator passes
them as they are. Every message carries the sender's term: the receiver refuses requests from a
stale term and steps down on a higher one."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from raft.core.types import Entry, SnapshotMeta


class PushType(enum.IntEnum):
    """DLedger's push request types (the dispatcher's states that send something)."""

    APPEND = 0
    COMPARE = 1
    TRUNCATE = 2
    COMMIT = 3


class PushCode(enum.IntEnum):
    SUCCESS = 0
    INCONSISTENT = 1  # the follower's log does not match at pre_index (see end_index / x_term)
    STALE_TERM = 2  # the request's term is older than the receiver's
    REFUSED = 3  # a request the follower must not obey (e.g. truncate at or below its commit)


@dataclass(slots=True)
class Message:
    src: str
    dst: str
    term: int


@dataclass(slots=True)
class VoteRequest(Message):
    last_log_index: int = 0
    last_log_term: int = 0
    # A pre-vote asks "would you vote for me at `term`?" without anyone changing term.
    pre_vote: bool = False
    # The candidate stands because its leader handed it leadership (TimeoutNowRequest): voters
    # that heard from that leader a moment ago vote anyway (Raft thesis §3.10).
    transfer: bool = False


@dataclass(slots=True)
class VoteResponse(Message):
    granted: bool = False
    pre_vote: bool = False


@dataclass(slots=True)
class TimeoutNowRequest(Message):
    """A leader hands its leadership to a follower whose log it has brought up to its own end:
    stand at once, without a pre-vote (Raft thesis §3.10)."""


@dataclass(slots=True)
class HeartbeatRequest(Message):
    commit_index: int = 0
    # Sequence of the leader's heartbeat round; echoed back so one round confirms waiting reads.
    seq: int = 0


@dataclass(slots=True)
class HeartbeatResponse(Message):
    success: bool = False
    seq: int = 0
    end_index: int = 0


@dataclass(slots=True)
class PushRequest(Message):
    type: PushType = PushType.APPEND
    # APPEND: entries follow (pre_index, pre_term). COMPARE: does the follower hold (pre_index, pre_term)?
    pre_index: int = 0
    pre_term: int = 0
    entries: list[Entry] = field(default_factory=list)
    commit_index: int = 0
    # TRUNCATE: drop the follower's suffix from truncate_index, but only if its entry there has a
    # term other than truncate_term (the leader's term at that index, 0 if the leader has none)
    # and other than the request's term. So a duplicated or delayed TRUNCATE never removes an
    # entry the leader holds.
    truncate_index: int = 0
    truncate_term: int = 0


@dataclass(slots=True)
class PushResponse(Message):
    type: PushType = PushType.APPEND
    code: PushCode = PushCode.SUCCESS
    # The request's pre_index, and for APPEND the last index the follower now holds from it.
    pre_index: int = 0
    index: int = 0
    # The follower's last log index, on every response.
    end_index: int = 0
    # Fast backup on a COMPARE / APPEND mismatch: the follower's term at pre_index (x_term) and
    # the first index of that term in its log (x_index). x_term == 0 means the follower's log
    # ends before pre_index, and end_index says where.
    x_term: int = 0
    x_index: int = 0


@dataclass(slots=True)
class InstallSnapshotRequest(Message):
    """Tells a follower that a snapshot is ready to install. The bytes travel outside the core
    (streamed in chunks by the driver, which steps this once the file is received and verified)."""

    meta: SnapshotMeta = field(default_factory=lambda: SnapshotMeta(0, 0))


@dataclass(slots=True)
class InstallSnapshotResponse(Message):
    success: bool = False
    index: int = 0
    end_index: int = 0


def refusal_of_stale(msg: Message, me: str, term: int, end_index: int) -> Message | None:
    """The answer to a request from an older term: our term, so its sender steps down (None for
    a message that is no request)."""
    if isinstance(msg, VoteRequest):
        return VoteResponse(me, msg.src, term, granted=False, pre_vote=msg.pre_vote)
    if isinstance(msg, HeartbeatRequest):
        return HeartbeatResponse(me, msg.src, term, success=False, seq=msg.seq, end_index=end_index)
    if isinstance(msg, PushRequest):
        return PushResponse(me, msg.src, term, type=msg.type, code=PushCode.STALE_TERM, pre_index=msg.pre_index,
                            end_index=end_index)
    if isinstance(msg, InstallSnapshotRequest):
        return InstallSnapshotResponse(me, msg.src, term, success=False)
    return None

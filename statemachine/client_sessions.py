"""Client sessions: how a write is applied exactly once however often a client retries it.

Client sessions (the Raft thesis, 6.3): a client registers (KV.RegisterClient), the leader
appends a registration entry carrying a random secret it chose, and the session's id is that
entry's index; the client id a write carries is ``commands.session_id(index, secret)``. A write
whose client id names no live session - never registered, expired, or with another secret - is
answered `unknown_session` and changes nothing, so no client can write under an id it was not
issued.

At most once: a command whose header (client_id, seq) was already applied returns the recorded
result and changes nothing. Per session the results of the last `session_window` sequence numbers
are kept, so a client may have up to that many writes in flight and they may commit in any order;
a seq at or below ``highest_seq - session_window`` can no longer be checked and is answered
"expired" without being applied.

Users: while auth is on (statemachine/auth_state.py) a session belongs to the authenticated user
that registered it, as that user is then: its owner is the name and the user's generation
(`owner`), so a user deleted and added again under the same name, or given another password,
owns none of the sessions before (they are unknown to it: its client registers again). A write
by another user on it is refused (OTHER_USER, PERMISSION_DENIED to the client); a session
registered while auth was off belongs to nobody, and is unknown to every user once auth is on (so
a client registers again, as after an expiry).

Expiry: a session unused for more than `session_ttl_entries` log entries is forgotten, and a
registration that makes more than `max_sessions` sessions forgets the least recently used one
(smallest last-used index). Every rule depends only on the log (indexes and sequence numbers,
never wall time), so every replica keeps and drops the same sessions.

The sessions live in three named databases of the state machine's LMDB environment
(statemachine/kv_state.py), written in the same transaction as the data they guard:

- ``sessions``        session id (its registration index) -> (highest seq applied, index of the
                      entry that last used it, secret, the user that registered it)
- ``session_results`` (session id, seq) -> the CommandResult recorded for that write
- ``session_expiry``  (last-used index, session id) -> b"", the order in which sessions go stale

Every integer is a big-endian u64, so LMDB's byte order is numeric order: a session's results
are contiguous and ordered by seq, and the expiry table iterates least recently used first.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import lmdb

from raftkv_proto import kv_pb2
from statemachine.commands import SESSION_SECRET_BYTES, parse_session_id

# The session tables (module docstring), in the order the state machine opens them.
SESSION_DB_NAMES = (b"sessions", b"session_results", b"session_expiry")
# Client sessions kept at most (module docstring). Not a setting: every replica must apply the
# same rule.
MAX_SESSIONS = 100_000

_U64 = struct.Struct(">Q")
_SESSION = struct.Struct(">QQ")  # (highest seq applied, last-used index), then the secret
_PAIR = struct.Struct(">QQ")  # result keys (session id, seq) and expiry keys (last-used index, session id)


@dataclass(frozen=True, slots=True)
class SessionStats:
    clients: int
    results: int


@dataclass(frozen=True, slots=True)
class SessionTables:
    """The LMDB handles of the three session databases of one environment."""

    sessions: lmdb._Database
    results: lmdb._Database
    expiry: lmdb._Database

    def stats(self, txn: lmdb.Transaction) -> SessionStats:
        """How many sessions and recorded results `txn` sees."""
        return SessionStats(clients=int(txn.stat(self.sessions)["entries"]),
                            results=int(txn.stat(self.results)["entries"]))


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """The expiry rules (module docstring); replicas must agree on them."""

    window: int = 1024
    ttl_entries: int = 1_000_000
    max_sessions: int = MAX_SESSIONS

    def __post_init__(self) -> None:
        if self.window < 1 or self.ttl_entries < 1 or self.max_sessions < 1:
            raise ValueError("session_window, session_ttl_entries and max_sessions must be at least 1")


class Verdict(enum.Enum):
    """What a session decides about a tracked write (ClientSessions.check)."""

    APPLY = enum.auto()            # new seq within the window: apply it, then `record` the result
    DUPLICATE = enum.auto()        # applied before: answer with the recorded result, change nothing
    EXPIRED = enum.auto()          # older than the window: its result is unknown, change nothing
    UNKNOWN_SESSION = enum.auto()  # no live session with that id and secret: change nothing
    OTHER_USER = enum.auto()       # auth on: another user's session; change nothing


@dataclass(slots=True)
class _Session:
    max_seq: int
    last_used: int
    secret: bytes
    user: bytes = b""  # UTF-8; empty: registered while auth was off


@dataclass(frozen=True, slots=True)
class _Pending:
    """A write checked as APPLY: what `record` needs to finish it without looking it up again."""

    sid: int
    seq: int
    index: int
    session: _Session


@dataclass(frozen=True, slots=True)
class SessionCheck:
    verdict: Verdict
    recorded: kv_pb2.CommandResult | None = None  # DUPLICATE: the result the write had then
    pending: _Pending | None = None  # APPLY: handed back to ClientSessions.record


# The verdicts that carry nothing, shared: a refused write allocates nothing here.
_UNKNOWN = SessionCheck(Verdict.UNKNOWN_SESSION)
_EXPIRED = SessionCheck(Verdict.EXPIRED)
_OTHER_USER = SessionCheck(Verdict.OTHER_USER)


# Between a session owner's name and its generation (a user name holds no NUL).
_GENERATION_MARK = b"\0"


def owner(user: str, generation: int) -> str:
    """The owner of the sessions `user` registers while it has `generation` (auth_state's: a
    delete and add, or a password change, gives the name a new one)."""
    return f"{user}\0{generation}"


class ClientSessions:
    """The session tables as seen by one write transaction of `apply`. Every decision depends on
    the entry's index, never on which batch the entry came in, so replicas agree."""

    def __init__(self, txn: lmdb.Transaction, tables: SessionTables, limits: SessionLimits) -> None:
        self._txn = txn
        self._tables = tables
        self._limits = limits

    def register(self, index: int, secret: bytes, user: str = "") -> None:
        """Open the session registered by the entry at `index` for `user` (empty: auth is off);
        past `max_sessions`, forget the least recently used ones."""
        self._save(index, None, _Session(0, index, secret, user.encode()))
        extra = int(self._txn.stat(self._tables.sessions)["entries"]) - self._limits.max_sessions
        if extra > 0:
            cursor = self._txn.cursor(db=self._tables.expiry)
            oldest = [key for key, _ in zip(cursor.iternext(values=False), range(extra))]
            for key in oldest:
                last_used, sid = _PAIR.unpack(key)
                self._drop(sid, last_used)

    def check(self, client_id: str, seq: int, index: int, user: str | None = None) -> SessionCheck:
        """Decide the write (client_id, seq) of the entry at `index`, made by the session owner
        `user` (`owner`; None: auth is off, any session will do). Every verdict but APPLY is final: DUPLICATE and EXPIRED
        already count as a use of the session, UNKNOWN_SESSION and OTHER_USER touch none. After
        APPLY the caller applies the write, then hands the check and result to `record`."""
        parsed = parse_session_id(client_id)
        session = None if parsed is None else self._load(parsed[0], index)
        if parsed is None or session is None or session.secret != parsed[1]:
            # Not a live session of this id's holder: the write is refused, and a guessed id
            # does not keep someone else's session alive either.
            return _UNKNOWN
        if user is not None and session.user != user.encode():
            # Someone else's session: refused without touching it. One of nobody's (registered
            # while auth was off), or of an earlier user of this name, is unknown instead, so its
            # client registers a session of its own.
            name = session.user.partition(_GENERATION_MARK)[0]
            return _OTHER_USER if name and name != user.encode().partition(_GENERATION_MARK)[0] else _UNKNOWN
        sid = parsed[0]
        if seq + self._limits.window <= session.max_seq:
            self._save(sid, session, _Session(session.max_seq, index, session.secret, session.user))
            return _EXPIRED
        recorded = self._txn.get(_PAIR.pack(sid, seq), db=self._tables.results)
        if recorded is not None:
            self._save(sid, session, _Session(session.max_seq, index, session.secret, session.user))
            return SessionCheck(Verdict.DUPLICATE, recorded=kv_pb2.CommandResult.FromString(recorded))
        return SessionCheck(Verdict.APPLY, pending=_Pending(sid, seq, index, session))

    def record(self, check: SessionCheck, result: kv_pb2.CommandResult) -> None:
        """Keep the result of a write `check` admitted, and slide the session's window past it."""
        if check.pending is None:
            raise ValueError(f"only an admitted write is recorded, not a {check.verdict.name} one")
        write, session = check.pending, check.pending.session
        self._txn.put(_PAIR.pack(write.sid, write.seq), result.SerializeToString(), db=self._tables.results)
        max_seq = max(write.seq, session.max_seq)
        self._save(write.sid, session, _Session(max_seq, write.index, session.secret, session.user))
        if max_seq > session.max_seq:
            self._forget_results(write.sid, below=max_seq - self._limits.window + 1)

    def drop_stale(self, last_index: int) -> None:
        """Physically drop the sessions no entry after `last_index` can see any more. Which sessions
        are visible is decided per entry in `_load`; this only reclaims space, so it may run once
        per batch without making replicas with different batch sizes diverge."""
        cursor = self._txn.cursor(db=self._tables.expiry)
        stale: list[tuple[int, int]] = []
        for key in cursor.iternext(values=False):
            last_used, sid = _PAIR.unpack(key)
            if last_index - last_used <= self._limits.ttl_entries:
                break
            stale.append((sid, last_used))
        for sid, last_used in stale:
            self._drop(sid, last_used)

    # ---- the tables ------------------------------------------------------------------------

    def _load(self, sid: int, index: int) -> _Session | None:
        """Session `sid` as seen by the entry at `index`; None if there is none, or if it went
        unused for more than the TTL (then it is dropped here, as on every replica)."""
        raw = self._txn.get(_U64.pack(sid), db=self._tables.sessions)
        if raw is None:
            return None
        secret_end = _SESSION.size + SESSION_SECRET_BYTES
        session = _Session(*_SESSION.unpack_from(raw), raw[_SESSION.size:secret_end], raw[secret_end:])
        if index - session.last_used > self._limits.ttl_entries:
            self._drop(sid, session.last_used)
            return None
        return session

    def _save(self, sid: int, old: _Session | None, new: _Session) -> None:
        if old is not None:
            self._txn.delete(_PAIR.pack(old.last_used, sid), db=self._tables.expiry)
        self._txn.put(_PAIR.pack(new.last_used, sid), b"", db=self._tables.expiry)
        self._txn.put(_U64.pack(sid), _SESSION.pack(new.max_seq, new.last_used) + new.secret + new.user,
                      db=self._tables.sessions)

    def _forget_results(self, sid: int, below: int | None = None) -> None:
        """Delete the session's recorded results with seq < `below` (all of them if None)."""
        prefix = _U64.pack(sid)
        cursor = self._txn.cursor(db=self._tables.results)
        found = cursor.set_range(prefix)
        while found:
            key = cursor.key()
            if not key.startswith(prefix) or (below is not None and _PAIR.unpack(key)[1] >= below):
                break
            found = cursor.delete()

    def _drop(self, sid: int, last_used: int) -> None:
        self._forget_results(sid)
        self._txn.delete(_PAIR.pack(last_used, sid), db=self._tables.expiry)
        self._txn.delete(_U64.pack(sid), db=self._tables.sessions)

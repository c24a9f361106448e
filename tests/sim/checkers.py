"""Raft's safety properties, checked incrementally as the simulation runs.

The simulated disk reports every durable write, apply, snapshot and install, the cluster every
served read, and the cluster calls `after_step` once per step. Each check is cheap enough to run on every step of thousands of
schedules; `check_durability` and `check_logs_match` are the O(log) ones, run at crashes and at
the end of a schedule."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from raft.core import Entry, EntryType, HardState, MemoryLogStore, Role, SnapshotMeta
from raft.core.membership import Membership
from raft.core.quorum import majority

if TYPE_CHECKING:
    from tests.sim.disk import State
    from tests.sim.node import ServedRead, SimNode


class SimViolation(AssertionError):
    def __init__(self, checker: str, detail: str) -> None:
        self.checker = checker
        super().__init__(f"[{checker}] {detail}")


@dataclass(frozen=True)
class _LoggedEntry:
    type: EntryType
    payload: bytes
    prev_term: int | None


@dataclass
class SafetyChecker:
    # Election safety: term -> the one node that led it.
    leaders: dict[int, str] = field(default_factory=dict)
    # Log matching, incrementally: every (index, term) ever written anywhere names one entry and one
    # predecessor term. By induction two logs agreeing at (i, t) then agree on everything before.
    logged: dict[tuple[int, int], _LoggedEntry] = field(default_factory=dict)
    # "Committed" = applied by some node. index -> entry, and the state digest right after it.
    committed: dict[int, Entry] = field(default_factory=dict)
    digest_at: dict[int, tuple[int, str]] = field(default_factory=dict)
    max_committed: int = 0
    # Per node: (incarnation, applied index) as the checker last saw it; disk hard state.
    applied: dict[str, tuple[int, int]] = field(default_factory=dict)
    hard: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    # Per node: the core (a restart, or a rebuild after a full disk, makes a new one) and the
    # highest commit index it was seen with: commitIndex is volatile, but never goes back in a core.
    commit_seen: dict[str, tuple[object, int]] = field(default_factory=dict)
    leaders_checked: set[tuple[int, str]] = field(default_factory=set)
    read_bound: dict[object, int] = field(default_factory=dict)
    reads_served: int = 0
    # The cluster's nodes, once it registers them: an entry must be on a quorum of their disks
    # the moment it is first applied (a leader commits only what a majority has on disk).
    nodes: list["SimNode"] = field(default_factory=list)
    # Membership (decision 0064). The voters the cluster started with (None: every node the
    # checker is given is a voter, for checkers made by hand); the latest committed configuration
    # (index of its CONFIG entry, its voters); the voters of every CONFIG entry ever written to a
    # disk after it, committed or not ((index, term) -> voters): a leader counts its commits in
    # the latest configuration of its log, which may be one of those.
    initial_voters: frozenset[str] | None = None
    committed_config: tuple[int, frozenset[str]] | None = None
    logged_configs: dict[tuple[int, int], frozenset[str]] = field(default_factory=dict)
    # The highest commit index any core was seen with, and the term of its entry (the overlap
    # check's line between the configurations that can still elect a leader and those that cannot).
    top_commit: tuple[int, int] = (0, 0)
    overlap_checks: int = 0

    # --- seeding (scenarios write logs straight into the store) ---

    def register_log(self, node_id: str, log: MemoryLogStore) -> None:
        lo, hi = log.before_begin()[0] + 1, log.last_index()
        self._register_entries(node_id, log, log.entries(lo, hi + 1) if hi >= lo else [])
        hs = log.hard_state()
        self.hard[node_id] = (hs.term, hs.voted_for)

    def _register_entries(self, node_id: str, log: MemoryLogStore, entries: Iterable[Entry]) -> None:
        for e in entries:
            prev = log.term(e.index - 1)
            if prev is not None and prev > e.term:
                raise SimViolation("log matching", f"{node_id}: term goes down at {e.index}: {prev} -> {e.term}")
            rec = _LoggedEntry(e.type, e.payload, prev)
            if e.type is EntryType.CONFIG and (self.committed_config is None or e.index > self.committed_config[0]):
                self.logged_configs[(e.index, e.term)] = frozenset(Membership.decode(e.payload).voters)
            old = self.logged.setdefault((e.index, e.term), rec)
            if old != rec:
                raise SimViolation("log matching", f"{node_id}: two different entries at (index {e.index}, term "
                                   f"{e.term}): {old} vs {rec}")

    # --- driver hooks ---

    def on_start(self, node: "SimNode") -> None:
        self.applied[node.id] = (node.incarnation, node.applied)
        self.commit_seen.pop(node.id, None)

    def before_persist(self, node: "SimNode", truncate_from: int | None, entries: Sequence[Entry]) -> None:
        """A truncation must never remove a committed entry from a disk (unless the same write
        puts it back unchanged)."""
        if truncate_from is None:
            return
        rewritten = {(e.index, e.term) for e in entries}
        for i in range(truncate_from, min(node.log.last_index(), self.max_committed) + 1):
            c = self.committed.get(i)
            if c is not None and node.log.term(i) == c.term and (i, c.term) not in rewritten:
                raise SimViolation("durability", f"{node.id}: truncates committed entry {i} (term {c.term})")

    def on_persist(self, node: "SimNode", hard_state: HardState | None, entries: Sequence[Entry]) -> None:
        if hard_state is not None:
            term, vote = self.hard.get(node.id, (0, None))
            hs = hard_state
            if hs.term < term:
                raise SimViolation("hard state", f"{node.id}: term on disk went back {term} -> {hs.term}")
            if hs.term == term and vote is not None and hs.voted_for != vote:
                raise SimViolation("election safety", f"{node.id}: voted twice in term {term}: {vote}, {hs.voted_for}")
            self.hard[node.id] = (hs.term, hs.voted_for)
        self._register_entries(node.id, node.log, entries)

    def on_apply(self, node: "SimNode", e: Entry, state: "State") -> None:
        inc, last = self.applied.get(node.id, (node.incarnation, 0))
        if inc == node.incarnation and e.index != last + 1:
            raise SimViolation("state machine safety", f"{node.id}: applied {e.index} right after {last}")
        self.applied[node.id] = (node.incarnation, e.index)
        c = self.committed.get(e.index)
        digest = (int(state["_n"]), str(state["_digest"]))  # type: ignore[call-overload]
        if c is None:
            self.committed[e.index] = e
            self.digest_at[e.index] = digest
            self.max_committed = max(self.max_committed, e.index)
            if e.type is EntryType.CONFIG and (self.committed_config is None or e.index > self.committed_config[0]):
                self.committed_config = (e.index, frozenset(Membership.decode(e.payload).voters))
                self.logged_configs = {k: v for k, v in self.logged_configs.items() if k[0] > e.index}
            if self.nodes:
                self._check_on_a_quorum(e.index, e, self.nodes)
            return
        if (c.term, c.type, c.payload) != (e.term, e.type, e.payload):
            raise SimViolation("state machine safety", f"{node.id} applied {e} at {e.index}, another node {c}")
        if self.digest_at.get(e.index) != digest:
            raise SimViolation("state machine safety", f"{node.id}: state after {e.index} differs from other nodes'")

    def on_install(self, node: "SimNode", meta: SnapshotMeta, data: "State") -> None:
        inc, last = self.applied.get(node.id, (node.incarnation, 0))
        if inc == node.incarnation and meta.index < last:
            raise SimViolation("state machine safety", f"{node.id}: snapshot {meta.index} would take applied back from {last}")
        self.on_snapshot(node, meta, data)
        self.applied[node.id] = (node.incarnation, meta.index)

    def on_snapshot(self, node: "SimNode", meta: SnapshotMeta, state: "State") -> None:
        c = self.committed.get(meta.index)
        if c is not None and c.term != meta.term:
            raise SimViolation("state machine safety", f"{node.id}: snapshot at {meta.index} has term {meta.term}, "
                               f"committed entry has {c.term}")
        want = self.digest_at.get(meta.index)
        got = (int(state["_n"]), str(state["_digest"]))  # type: ignore[call-overload]
        if want is not None and want != got:
            raise SimViolation("state machine safety", f"{node.id}: snapshot at {meta.index} holds another state")

    def on_read_registered(self, ctx: object, nodes: Iterable["SimNode"]) -> None:
        """A linearizable read must reflect everything committed before it was asked."""
        bound = self.max_committed
        for n in nodes:
            if n.core is not None:
                bound = max(bound, n.core.commit_index)
        self.read_bound[ctx] = bound

    def on_read_served(self, r: "ServedRead") -> None:
        self.reads_served += 1
        if r.applied < r.index:
            raise SimViolation("read index", f"{r.node} served read {r.ctx!r} at applied {r.applied} < index {r.index}")
        bound = self.read_bound.get(r.ctx, 0)
        if r.index < bound:
            raise SimViolation("read index", f"{r.node} served read {r.ctx!r} at index {r.index}, but {bound} "
                               "was committed before it was asked (stale leader?)")

    # --- per step ---

    def after_step(self, nodes: Iterable["SimNode"]) -> None:
        nodes = list(nodes)
        for n in nodes:
            core = n.core
            if core is None:
                continue
            commit = core.commit_index
            if commit > self.top_commit[0]:
                term = core.log.term(commit)
                if term is not None:
                    self.top_commit = (commit, term)
            seen_core, seen = self.commit_seen.get(n.id, (core, 0))
            if seen_core is core and commit < seen:
                raise SimViolation("commit index", f"{n.id}: commit index went back {seen} -> {commit}")
            self.commit_seen[n.id] = (core, commit)
            if core.role != Role.LEADER:
                continue
            term = core.term
            who = self.leaders.setdefault(term, n.id)
            if who != n.id:
                raise SimViolation("election safety", f"two leaders in term {term}: {who} and {n.id}")
            if (term, n.id) not in self.leaders_checked:
                self.leaders_checked.add((term, n.id))
                self._check_leader_complete(n, term)
        self.check_overlap(nodes)

    def check_overlap(self, nodes: Sequence["SimNode"]) -> None:
        """No two disjoint majorities: any two voter sets that may still elect a leader must
        share a member of some majority of each.

        Two voter sets A and B admit disjoint majorities iff a majority of A and a majority of B
        fit into A ∪ B without a shared member. The best try takes A's majority from A - B first
        and B's from B - A first; what each still needs comes from A ∩ B. So they are disjoint
        possible iff  max(0, maj(A) - |A - B|) + max(0, maj(B) - |B - A|) <= |A ∩ B|
        (maj(X) = |X| // 2 + 1); `disjoint_majorities` says that. One voter added or removed
        never allows it (the sum is |A ∩ B| + 1); two at once may ({1,2,3} and {1,2,3,4,5}: {1,2}
        and {3,4,5}).

        Which voter sets: those in force (RaftCore.membership) on the nodes that are up and
        could still be elected, those whose log holds the highest entry any core knew as
        committed (`top_commit`; a snapshot past it holds it too). A node lacking a committed
        entry can never win an election (leader completeness), and may hold an older
        configuration by any number of changes: a voter cut off while the others changed the
        members twice, a removed one never told, or an uncommitted change of a deposed leader
        that a later leader's log has superseded (that is Raft, not a violation: the voters
        holding the newer entries refuse it their votes). On logs that do hold it, the rule that
        a leader changes the configuration only once its latest one is committed and it has
        committed an entry of its term leaves at most one configuration after the committed one
        (that of the newest term), one change from it: a violation here is a second change
        before the first committed, or a deposed leader's change left in force beside a new one
        (Ongaro's 2015 bug)."""
        top, top_term = self.top_commit
        seen: list[tuple[str, Mapping[str, str]]] = []
        for n in nodes:
            core = n.core
            if core is None or not core.membership.voters:
                continue
            log = core.log
            if top > 0 and log.before_begin()[0] < top and log.term(top) != top_term:
                continue  # lacks a committed entry: it cannot be elected
            voters = core.membership.voters
            if any(v == voters for _, v in seen):
                continue
            for other, v in seen:
                if disjoint_majorities(set(voters), set(v)):
                    raise SimViolation("membership overlap", f"{n.id} has voters {sorted(voters)}, {other} has "
                                       f"{sorted(v)}: two disjoint majorities could elect two leaders")
            seen.append((n.id, voters))
        self.overlap_checks += len(seen) > 1

    def _check_leader_complete(self, n: "SimNode", term: int) -> None:
        log = n.log
        begin, last = log.before_begin()[0], log.last_index()
        if self.max_committed > last:
            raise SimViolation("leader completeness", f"{n.id} leads term {term} with log end {last}, "
                               f"but {self.max_committed} is committed")
        for i in range(begin + 1, self.max_committed + 1):
            c = self.committed.get(i)
            if c is not None and log.term(i) != c.term:
                raise SimViolation("leader completeness", f"{n.id} leads term {term} without committed entry {i}")

    # --- whole-cluster checks (O(log)) ---

    def check_durability(self, nodes: list["SimNode"]) -> None:
        """Every committed entry is on a quorum of disks (log, snapshot, or the state machine as last
        synced), so no election can lose it. A node whose disk was lost counts with them until it
        has caught up: it votes for no one until then, so no election can lose an entry through it
        either. (A rotten snapshot is set aside; the state it was taken from still holds what it
        covered, and a fresh snapshot is taken from it when one is needed.)"""
        for i, c in self.committed.items():
            self._check_on_a_quorum(i, c, nodes)

    def voter_sets(self, nodes: Sequence["SimNode"]) -> list[frozenset[str]]:
        """The voter sets a leader may have counted a commit in: the latest committed
        configuration (the initial one before any), and every configuration written to a disk
        after it (a leader counts in the latest of its log from the moment it is appended)."""
        if self.committed_config is not None:
            first = self.committed_config[1]
        else:
            first = self.initial_voters if self.initial_voters is not None else frozenset(n.id for n in nodes)
        return [first, *(v for v in set(self.logged_configs.values()) if v != first)]

    def _check_on_a_quorum(self, i: int, c: Entry, nodes: list["SimNode"]) -> None:
        """On a majority of the voters of one of `voter_sets` (with membership fixed: of all the
        nodes). Every committed entry is on a majority of the configuration it was committed in,
        and everything before the latest committed configuration's entry on a majority of it."""
        holding: set[str] = set()
        for n in nodes:
            snap = n.snapshot.meta.index if n.snapshot else 0
            synced_state = n.disk.fsm.durable[1]
            if max(snap, synced_state) >= i or n.log.term(i) == c.term or n.disk.replaced:
                holding.add(n.id)
        sets = self.voter_sets(nodes)
        if any(len(holding & voters) >= majority(len(voters)) for voters in sets):
            return
        raise SimViolation("durability", f"committed entry {i} (term {c.term}) is on {len(holding)} disks only "
                           f"({sorted(holding)}; voters {[sorted(v) for v in sets]})")

    def check_logs_match(self, nodes: list["SimNode"]) -> None:
        """The full log matching property, pairwise."""
        for a_idx, a in enumerate(nodes):
            for b in nodes[a_idx + 1:]:
                _check_pair(a, b)


def disjoint_majorities(a: set[str], b: set[str]) -> bool:
    """Whether some majority of voter set `a` and some majority of `b` share no member (see
    SafetyChecker.check_overlap for the derivation)."""
    both = len(a & b)
    return max(0, majority(len(a)) - (len(a) - both)) + max(0, majority(len(b)) - (len(b) - both)) <= both


def _check_pair(a: "SimNode", b: "SimNode") -> None:
    lo = max(a.log.before_begin()[0], b.log.before_begin()[0]) + 1
    hi = min(a.log.last_index(), b.log.last_index())
    if hi < lo:
        return
    ea, eb = a.log.entries(lo, hi + 1), b.log.entries(lo, hi + 1)
    top = -1
    for k in range(len(ea)):
        if ea[k].term == eb[k].term:
            top = k
    for k in range(top + 1):
        if ea[k] != eb[k]:
            raise SimViolation("log matching", f"{a.id} and {b.id} agree at index {ea[top].index} "
                               f"(term {ea[top].term}) but differ at {ea[k].index}: {ea[k]} vs {eb[k]}")

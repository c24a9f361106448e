"""The faults a robustness run injects into its three members while the traffic runs, each one
drawn from the run's random generator (which member, how long), each followed by a wait until the
cluster has a leader and acknowledges writes again:

- kill: SIGKILL a member (the leader or a follower), restart it once the others agree on a leader;
- pause: SIGSTOP a member for 2 to 4 election timeouts, then SIGCONT;
- partition: cut the leader off from both peers (tests/faults/proxy.py blackholes its links; its
  clients still reach it), until the majority has elected another and moved on, then heal;
- wipe: SIGKILL a follower, delete its data directory, start it again as itself (the recovery
  recipe of docs/operations.md); it rejoins and is caught up from the leader;
- replace-follower, replace-leader: a member added (a learner, started empty, promoted in sync)
  and an old follower, or the leader, removed, in either order (member_changes.py).

The kinds that `mixed` draws from are FAULTS; the replacements are the `members` scenario's alone
(a member that joined is not behind the proxies that a partition needs)."""
from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.faults.cluster import FaultCluster
from tests.integration.cluster import wait_until
from tests.robustness.member_changes import MemberChanges

KILL, PAUSE, PARTITION, WIPE = "kill", "pause", "partition", "wipe"
FAULTS = (KILL, PAUSE, PARTITION, WIPE)
REPLACE_FOLLOWER, REPLACE_LEADER = "replace-follower", "replace-leader"
ELECTION_TIMEOUT_S = 0.5  # FAST_TIMING's
RECOVERY_S = 60.0


@dataclass
class Injector:
    cluster: FaultCluster
    rng: random.Random
    progress_since: Callable[[int], bool]  # has a write called after this time been acknowledged?
    members: MemberChanges
    log: Callable[[str], None] = print

    def inject(self, fault: str) -> None:
        {KILL: self.kill, PAUSE: self.pause, PARTITION: self.partition, WIPE: self.wipe,
         REPLACE_FOLLOWER: lambda: self.members.replace(leader=False),
         REPLACE_LEADER: lambda: self.members.replace(leader=True)}[fault]()
        self.wait_progress()

    def _pick(self, followers_only: bool = False) -> tuple[str, str]:
        """A member (the leader or a follower, as the dice say) and the leader."""
        leader = self.cluster.wait_for_leader(timeout=RECOVERY_S)
        followers = [n for n in self.cluster.nodes if n != leader]
        if followers_only or self.rng.random() < 0.5:
            return self.rng.choice(followers), leader
        return leader, leader

    def kill(self) -> None:
        victim, _ = self._pick()
        self.log(f"fault: SIGKILL {victim}")
        self.cluster.kill(victim)
        self.cluster.wait_for_leader(among=[n for n in self.cluster.nodes if n != victim], timeout=RECOVERY_S)
        self.cluster.start_node(victim)

    def pause(self) -> None:
        victim, _ = self._pick()
        seconds = self.rng.uniform(2, 4) * ELECTION_TIMEOUT_S
        self.log(f"fault: SIGSTOP {victim} for {seconds:.1f} s")
        self.cluster.pause(victim)
        time.sleep(seconds)  # the fault is the pause's length: there is no event to wait for
        self.cluster.resume(victim)

    def partition(self) -> None:
        leader = self.cluster.wait_for_leader(timeout=RECOVERY_S)
        term = self.cluster.status(leader)["term"]
        self.log(f"fault: leader {leader} cut off from its peers")
        self.cluster.network.isolate(leader)
        self.cluster.wait_for_leader(among=[n for n in self.cluster.nodes if n != leader], not_in_term=term,
                                     timeout=RECOVERY_S)
        self.wait_writes()  # the majority moves on while the old leader is cut off
        self.cluster.network.heal()

    def wipe(self) -> None:
        victim, _ = self._pick(followers_only=True)
        self.log(f"fault: {victim} killed, its data directory deleted, started again")
        self.cluster.kill(victim)
        shutil.rmtree(self.cluster.nodes[victim].spec.data_dir)
        self.cluster.start_node(victim)

        # What the cluster held once the member was back; under traffic the leader's commit index
        # moves on, so the member is caught up when it has applied this much.
        target = self.cluster.status(self.cluster.wait_for_leader(timeout=RECOVERY_S))["commit_index"]

        def caught_up() -> bool:
            mine = self.cluster.status(victim)
            return not mine.get("rejoining", True) and mine.get("applied_index", -1) >= target
        wait_until(f"the wiped {victim} to rejoin and apply index {target}", caught_up, RECOVERY_S)

    def wait_progress(self) -> None:
        """Every member agrees on a leader, and writes are acknowledged again."""
        self.cluster.wait_for_leader(timeout=RECOVERY_S)
        self.wait_writes()

    def wait_writes(self) -> None:
        since = time.monotonic_ns()
        wait_until("a write acknowledged after the fault", lambda: self.progress_since(since), RECOVERY_S)

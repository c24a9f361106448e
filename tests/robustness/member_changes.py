"""Membership changes a robustness run makes while its traffic runs, as an operator makes them:
through etcd's Cluster service (MemberAdd, MemberPromote, MemberRemove) on any member that runs,
a follower forwarding them to the leader.

A replacement adds a member and removes another, in the order the seed draws:

- add: a learner under a new name (ids are never used again), named in the MemberAdd (raftkv's
  client) or nameless (etcdctl: the member takes its name when it starts), started empty with
  `serve --join`; promoted once it is in sync (MemberPromote is refused until then, as etcd's);
  its endpoint joins the clients' and the watches' (Endpoints), and `joined` is told (the run
  opens watches on it);
- remove: a follower of the old members, or the leader (its leadership moves to another voter);
  the removed member's process exits with code 78 (EXIT_REMOVED); it leaves `cluster.nodes` for
  `departed`, so that nothing starts it again, and its endpoint stays with the clients (it refuses).

A change whose answer was lost may have been made: each step looks at the member list first and
asks again only for what it does not show yet (a refusal is retried the same way, until the
deadline).

A member added to a FaultCluster is not behind its proxies: its peers reach it at its own peer
port, and it reaches them at the addresses the member it joined through lists. So a partition
of a member that joined is not possible; the `members` scenario has no partitions."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv.client.members import MEMBER_NAME_KEY
from kv.tools.serve_command import EXIT_REMOVED
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from raftkv_proto.member_ids import member_number
from tests.faults.cluster import FaultCluster
from tests.integration.cluster import NodeProcess, wait_until
from tests.robustness.endpoints import Endpoints

CALL_TIMEOUT_S = 10.0
CHANGE_S = 60.0


@dataclass
class MemberChanges:
    cluster: FaultCluster
    endpoints: Endpoints
    rng: random.Random
    joined: Callable[[str], None] = lambda member: None  # a member added and promoted
    log: Callable[[str], None] = print
    departed: dict[str, NodeProcess] = field(default_factory=dict)  # removed members, their processes ended
    _calls: int = 0

    def replace(self, leader: bool) -> None:
        """Add a member and remove the leader (`leader`) or an old follower, in the drawn order."""
        if self.rng.random() < 0.5:
            added = self.add()
            self.remove(self._victim(leader, spare=added))
        else:
            self.remove(self._victim(leader, spare=None))
            self.add()

    def _victim(self, leader: bool, spare: str | None) -> str:
        current = self.cluster.wait_for_leader(timeout=CHANGE_S)
        followers = sorted(m for m in self.cluster.nodes if m not in (current, spare))
        draw = self.rng.random()  # drawn either way, one draw: the later choices stay the seed's
        victim = current if leader else followers[int(draw * len(followers))]
        self.log(f"member change: remove {victim} ({'the leader' if leader else f'a follower of leader {current}'})")
        return victim

    # ---- add and promote -----------------------------------------------------------------------

    def add(self) -> str:
        name = f"n{len(self.cluster.nodes) + len(self.departed) + 1}"
        named = self.rng.random() < 0.5
        node = self.cluster.joining_member(name, join=self.cluster.running_ids())
        peer_url = f"http://{node.peer_address}"
        self.log(f"member change: add {name} as a learner ({'named' if named else 'nameless'}) at {peer_url}")

        def added() -> bool:
            if not any(peer_url in m.peerURLs for m in self._members()):
                metadata = ((MEMBER_NAME_KEY, name),) if named else ()
                self._call("MemberAdd", pb.MemberAddRequest(peerURLs=[peer_url], isLearner=True), metadata)
            return True
        wait_until(f"{name} added as a learner", added, CHANGE_S)
        node.start()
        self.endpoints.add(name, self.cluster.etcd_channel(name))

        def promoted() -> bool:
            node.check_alive()  # a member that could not join fails the run at once, with its log
            if not any(m.name == name and not m.isLearner for m in self._members()):
                self._call("MemberPromote", pb.MemberPromoteRequest(ID=member_number(name)))  # refused until in sync
            return True
        wait_until(f"{name} in sync and promoted", promoted, CHANGE_S)
        self.log(f"member change: {name} promoted")
        self.joined(name)
        return name

    # ---- remove --------------------------------------------------------------------------------

    def remove(self, victim: str) -> None:
        node = self.cluster.nodes[victim]
        number = member_number(victim)

        def removed() -> bool:
            if any(m.ID == number for m in self._members(besides=victim)):
                self._call("MemberRemove", pb.MemberRemoveRequest(ID=number), besides=victim)
            return True
        wait_until(f"{victim} removed", removed, CHANGE_S)
        code = node.wait_exit(CHANGE_S)
        assert code == EXIT_REMOVED, f"{victim} exited with code {code}, not {EXIT_REMOVED}:\n{node.log_tail()}"
        self.departed[victim] = self.cluster.nodes.pop(victim)

    # ---- etcd's Cluster service ----------------------------------------------------------------

    def _members(self, besides: str | None = None) -> list[pb.Member]:
        return list(self._call("MemberList", pb.MemberListRequest(), besides=besides).members)

    def _call(self, method: str, request: Any, metadata: tuple[tuple[str, str], ...] = (),
              besides: str | None = None) -> Any:
        """One Cluster call on a running member (each call on the next one; never on `besides`).
        A refusal or a lost answer raises: the step's probe looks again."""
        running = [m for m in self.cluster.running_ids() if m != besides]
        self._calls += 1
        stub = etcd_rpc_pb2_grpc.ClusterStub(self.endpoints.channel(running[self._calls % len(running)]))
        return getattr(stub, method)(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

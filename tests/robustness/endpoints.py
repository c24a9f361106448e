"""Where a run's clients and watches reach the members: an etcd channel to every member that ever
belonged to the cluster, in the order they joined it. A member added while the traffic runs is
added here, and every client and watch moving on after a failure may go to it; a removed member
stays, as in the endpoint list of a client configured before its removal: its endpoint refuses
(its process has exited), and whoever tries it moves on to the next."""
from __future__ import annotations

import threading

import grpc


class Endpoints:
    """The members' channels, in the order they joined; safe to read while the injector adds one."""

    def __init__(self, channels: dict[str, grpc.Channel]) -> None:
        self._channels = dict(channels)
        self._lock = threading.Lock()

    def add(self, member: str, channel: grpc.Channel) -> None:
        with self._lock:
            assert member not in self._channels, f"{member} has an endpoint already"
            self._channels[member] = channel

    def members(self) -> list[str]:
        with self._lock:
            return list(self._channels)

    def channel(self, member: str) -> grpc.Channel:
        with self._lock:
            return self._channels[member]

    def after(self, member: str) -> str:
        """The member whose endpoint comes after `member`'s (the first after the last)."""
        members = self.members()
        return members[(members.index(member) + 1) % len(members)]

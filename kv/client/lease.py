"""Leases on kv.Client: keys that vanish when their owner stops renewing them (etcd's Lease API).

    with client.lease(ttl=10) as lease:              # granted, then kept alive in the background
        client.put("service/a", "10.0.0.1:80", lease=lease.id)
        ...                                          # the key lives while this process does
    # leaving the block revokes the lease: its keys go at once, in one revision

If the process dies, keep-alives stop and the leader revokes the lease within its TTL (plus an
election timeout when the leader dies too): the keys go. `lease.alive` turns False when a
keep-alive finds the lease gone (it expired while this process could not reach the cluster)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from kv.errors import NotFoundError
from raftkv_proto import etcd_rpc_pb2 as pb

# A lease is renewed every third of its TTL, as etcd's clients do.
RENEW_FRACTION = 3


class Lease:
    """A granted lease kept alive by a background thread until closed (then revoked)."""

    def __init__(self, lease_id: int, ttl: int, keep_alive: Callable[[int], int], revoke: Callable[[int], None]) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.alive = True
        self._keep_alive = keep_alive
        self._revoke = revoke
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"raftkv-lease-{lease_id:x}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / RENEW_FRACTION):
            try:
                if self._keep_alive(self.id) == 0:
                    self.alive = False  # expired while unreachable, or revoked elsewhere
                    return
            except Exception:  # noqa: BLE001 - no member reachable now: the next round tries again
                continue

    def close(self, revoke: bool = True) -> None:
        """Stop renewing; with `revoke`, revoke the lease now (its keys go at once)."""
        self._stop.set()
        self._thread.join()
        if revoke and self.alive:
            try:
                self._revoke(self.id)
            except NotFoundError:
                pass  # gone already: an earlier attempt of this revoke was applied, or it expired
            self.alive = False

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Leases:
    """Mixed into kv.Client: etcd's lease calls, on its connections and retries."""

    _call: Callable[..., Any]

    def lease_grant(self, ttl: int, lease_id: int = 0) -> tuple[int, int]:
        """A new lease of at least `ttl` seconds (the cluster raises it to its minimum, 1.5
        election timeouts); (its id, its TTL)."""
        response = self._call(lambda stub: stub.etcd_lease.LeaseGrant, pb.LeaseGrantRequest(TTL=ttl, ID=lease_id))
        return response.ID, response.TTL

    def lease_revoke(self, lease_id: int) -> None:
        """Revoke the lease: its keys are deleted at once, in one revision."""
        self._call(lambda stub: stub.etcd_lease.LeaseRevoke, pb.LeaseRevokeRequest(ID=lease_id))

    def lease_keep_alive(self, lease_id: int) -> int:
        """Renew the lease once; its TTL, 0 when it no longer exists."""
        def once(stub: Any) -> Callable[..., Any]:
            def call(request: pb.LeaseKeepAliveRequest, **kwargs: Any) -> pb.LeaseKeepAliveResponse:
                return next(iter(stub.etcd_lease.LeaseKeepAlive(iter([request]), **kwargs)))
            return call
        return self._call(once, pb.LeaseKeepAliveRequest(ID=lease_id)).TTL

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> dict[str, Any]:
        """{"id", "ttl" (seconds left; -1: no such lease), "granted_ttl", "keys" (with `keys`)}."""
        return time_to_live_dict(self._call(lambda stub: stub.etcd_lease.LeaseTimeToLive,
                                            pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys)))

    def leases(self) -> list[int]:
        """The ids of every lease the cluster holds."""
        return [status.ID for status in self._call(lambda stub: stub.etcd_lease.LeaseLeases,
                                                   pb.LeaseLeasesRequest()).leases]

    def lease(self, ttl: int) -> Lease:
        """A lease kept alive in the background until closed (a context manager), then revoked."""
        lease_id, granted = self.lease_grant(ttl)
        return Lease(lease_id, granted, self.lease_keep_alive, self.lease_revoke)


def time_to_live_dict(response: pb.LeaseTimeToLiveResponse) -> dict[str, Any]:
    """What lease_time_to_live returns (shared with kv.aio.Client)."""
    return {"id": response.ID, "ttl": response.TTL, "granted_ttl": response.grantedTTL, "keys": list(response.keys)}

"""The stores a program that speaks etcd's HTTP/JSON gateway talks to (etcd3gw, Patroni): three
real etcd 3.4 members, each serving the gateway on its client URL, or three raftkv members, each
with the gateway on --listen-client-http-urls. A test names the kind; everything else it does
through the members' HTTP URLs, the same for both: who leads (Maintenance.Status as JSON), SIGKILL
a member, start it again."""
from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kv.tools.cluster_up import child_env, free_ports, release_ports
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until
from tests.integration.real_etcd import ETCD, NEEDS_ETCD, EtcdCluster

GATEWAY_FLAG = "--listen-client-http-urls"
HTTP_TIMEOUT_S = 5.0
KINDS = ("etcd", "raftkv")


def post_json(url: str, path: str, body: dict[str, Any], timeout: float = HTTP_TIMEOUT_S) -> dict[str, Any]:
    """One unary gateway call: POST `body` as JSON to `url` + `path`, the answer parsed (an HTTP
    error raises urllib's HTTPError, its body etcd's {"error", "message", "code"})."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class GatewayStore:
    """Three members as an HTTP client of etcd's gateway sees them, by position 0..2."""

    kind: str
    urls: list[str]  # each member's gateway, http://127.0.0.1:PORT
    kill: Callable[[int], None]  # SIGKILL one member
    start: Callable[[int], object]  # start a killed member again, on its data
    log_tails: Callable[[], str]

    @property
    def hosts(self) -> list[str]:
        """host:port of each member's gateway (Patroni's `etcd3: hosts`)."""
        return [url.removeprefix("http://") for url in self.urls]

    def leader(self) -> int | None:
        """The member that says it leads (its status's leader is its own id), or None."""
        for i, url in enumerate(self.urls):
            try:
                status = post_json(url, "/v3/maintenance/status", {}, timeout=1.0)
            except OSError:  # killed, or not serving yet
                continue
            if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                return i
        return None

    def wait_for_leader(self, timeout: float = 30.0) -> int:
        return wait_until(f"a leader among the {self.kind} members", lambda: self._leader_plus_one(), timeout) - 1

    def _leader_plus_one(self) -> int | None:
        leader = self.leader()
        return None if leader is None else leader + 1  # member 0 must count as found


@functools.cache
def raftkv_has_gateway() -> bool:
    """Whether this tree's `raftkv serve` takes the gateway's flag."""
    done = subprocess.run([sys.executable, "-m", "kv", "serve", "--help"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    return GATEWAY_FLAG in done.stdout


def skip_without(kind: str) -> None:
    if kind == "etcd" and ETCD is None:
        pytest.skip(NEEDS_ETCD)
    if kind == "raftkv" and not raftkv_has_gateway():
        pytest.skip(f"this tree's `raftkv serve` has no {GATEWAY_FLAG} (etcd's JSON gateway)")


@contextlib.contextmanager
def gateway_store(kind: str, base: Path) -> Iterator[GatewayStore]:
    """Three members of `kind` ("etcd" or "raftkv") under `base`, with a leader; all killed at the
    end, their log tails printed when the block failed."""
    skip_without(kind)
    opened = _open_etcd(base) if kind == "etcd" else _open_raftkv(base)
    with opened as store:
        try:
            store.wait_for_leader()
            yield store
        except BaseException:
            print(store.log_tails())
            raise


@contextlib.contextmanager
def _open_etcd(base: Path) -> Iterator[GatewayStore]:
    cluster = EtcdCluster(base).start()
    try:
        yield GatewayStore("etcd", cluster.client_urls, lambda i: cluster.members[i].kill(),
                           lambda i: cluster.members[i].start(), cluster.log_tails)
    finally:
        cluster.close()


@contextlib.contextmanager
def _open_raftkv(base: Path) -> Iterator[GatewayStore]:
    ports = free_ports(3)
    urls = {f"n{i + 1}": f"http://127.0.0.1:{port}" for i, port in enumerate(ports)}
    cluster = Cluster(base, 3, FAST_TIMING, node_args=lambda node_id: (GATEWAY_FLAG, urls[node_id])).start()
    names = list(urls)
    try:
        yield GatewayStore("raftkv", list(urls.values()), lambda i: cluster.kill(names[i]),
                           lambda i: cluster.start_node(names[i]), cluster.log_tails)
    finally:
        cluster.close()
        release_ports(ports)

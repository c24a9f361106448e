"""etcd's HTTP/JSON gateway (--listen-client-http-urls) on real processes: the same HTTP requests
sent to a real etcd 3.4 (its client URL) and to a raftkv member's gateway, the answers compared
field by field once the member-specific header fields (cluster_id, member_id, raft_term) are gone:
status, content type, body. Both stores get the same requests in the same order, so revisions
agree. The few parts that differ by design are named where they are left out of a comparison
(docs/etcd-compatibility.md, "The JSON gateway").

Then, on raftkv alone: a write through a follower's gateway (forwarded to the leader by the
servicers the gRPC port uses), etcdctl through the gateway's URL (HTTP/2 relayed to the gRPC
port), and the gateway over TLS with the client port's certificates."""
from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kv.tools.certs import DEFAULT_HOSTS, ensure_ca, issue
from kv.tools.cluster_up import child_env, free_ports
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until
from tests.integration.test_etcd_differential import (etcd_and_raftkv, etcdctl, etcdctl_env,
                                                      without_member_fields)
from tests.integration.real_etcd import ETCDCTL, needs_etcd

pytestmark = [
    pytest.mark.integration,
    needs_etcd,
]

TIMEOUT_S = 10.0
LEASE = "7777"  # granted with this ID on both stores, so that the answers agree


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)

    def compared(self) -> dict[str, Any]:
        """What both stores must agree on: status, content type, and the body (parsed JSON without
        member fields, or the text)."""
        body: Any = self.text
        if self.content_type == "application/json":
            body = without_member_fields(json.loads(self.text)) if self.text.strip() else ""
        return {"status": self.status, "type": self.content_type, "body": body}


def call(address: str, path: str, body: Any = None, method: str = "POST", headers: dict[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> Reply:
    """One request on a connection of its own; a dict body is sent as JSON, a str as it is."""
    host, port = address.rsplit(":", 1)
    connection = (http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT_S, context=context) if context
                  else http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S))
    try:
        data = json.dumps(body) if isinstance(body, dict) else body
        connection.request(method, path, body=data, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, response.getheader("Content-Type", ""), response.read().decode())
    finally:
        connection.close()


@dataclass(frozen=True)
class Pair:
    etcd: str  # host:port of etcd's client URL
    gateway: str  # host:port of raftkv's gateway

    def both(self, path: str, body: Any = None, method: str = "POST",
             headers: dict[str, str] | None = None) -> tuple[Reply, Reply]:
        return call(self.etcd, path, body, method, headers), call(self.gateway, path, body, method, headers)

    def same(self, path: str, body: Any = None, method: str = "POST",
             headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Send to both; assert they answer alike; raftkv's answer, parsed."""
        theirs, ours = self.both(path, body, method, headers)
        assert ours.compared() == theirs.compared(), f"{method} {path} {body}"
        return ours.compared()["body"]


def gateway_args(ports: dict[str, int]) -> Any:
    return lambda node_id: ("--listen-client-http-urls", f"http://127.0.0.1:{ports[node_id]}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    ports = {"n1": free_ports(1)[0]}
    with etcd_and_raftkv(tmp_path_factory.mktemp("gateway"), node_args=gateway_args(ports)) as (etcd, _):
        yield Pair(etcd.endpoint, f"127.0.0.1:{ports['n1']}")


# ---- the same requests to both -------------------------------------------------------------------

def test_puts_and_ranges_answer_as_etcds(pair: Pair) -> None:
    pair.same("/v3/kv/put", {"key": b64("foo"), "value": b64("bar")})
    assert pair.same("/v3/kv/put", {"key": b64("foo"), "value": b64("baz"), "prev_kv": True})["prev_kv"]["value"] == b64("bar")
    pair.same("/v3/kv/range", {"key": b64("foo")})
    pair.same("/v3/kv/range", {"key": b64("nothing")})
    for name in ("a", "b", "c"):
        pair.same("/v3/kv/put", {"key": b64(f"p/{name}"), "value": b64(name * 3)})
    prefix = {"key": b64("p/"), "range_end": b64("p0")}
    assert pair.same("/v3/kv/range", {**prefix, "limit": 2})["more"] is True
    pair.same("/v3/kv/range", {**prefix, "keysOnly": True})  # lowerCamel in: etcd takes it too
    assert pair.same("/v3beta/kv/range", {**prefix, "count_only": True})["count"] == "3"
    pair.same("/v3/kv/range", {**prefix, "sort_order": "DESCEND", "sort_target": "MOD", "unknown": 1})
    pair.same("/v3/kv/deleterange", {**prefix, "prev_kv": True})


def test_txns_with_revision_compares_answer_as_etcds(pair: Pair) -> None:
    key = b64("leader")
    pair.same("/v3/lease/grant", {"ID": LEASE, "TTL": 60})
    # Patroni's shapes: take the key if nobody holds it; update it only at the revision read.
    take = {"compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": b64("me"), "lease": LEASE}}],
            "failure": [{"request_range": {"key": key}}]}
    assert pair.same("/v3/kv/txn", take)["succeeded"] is True
    lost = pair.same("/v3/kv/txn", take)
    assert "succeeded" not in lost and lost["responses"][0]["response_range"]["count"] == "1"
    revision = lost["responses"][0]["response_range"]["kvs"][0]["mod_revision"]
    update = {"compare": [{"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": revision}],
              "success": [{"requestPut": {"key": key, "value": b64("me again"), "lease": LEASE}}]}
    assert pair.same("/v3/kv/txn", update)["succeeded"] is True
    assert "succeeded" not in pair.same("/v3/kv/txn", update)  # the revision moved on
    pair.same("/v3/kv/deleterange", {"key": key})
    pair.same("/v3/lease/revoke", {"ID": LEASE})


def test_leases_answer_as_etcds(pair: Pair) -> None:
    lease = "8888"
    pair.same("/v3/lease/grant", {"ID": lease, "TTL": 60})
    pair.same("/v3/kv/put", {"key": b64("leased"), "value": b64("v"), "lease": lease})
    theirs, ours = pair.both("/v3/lease/keepalive", {"ID": lease})  # a stream: one request, then the end
    assert ours.compared() == theirs.compared()
    assert [json.loads(line)["result"]["TTL"] for line in ours.text.splitlines()] == ["60"]
    theirs, ours = pair.both("/v3/kv/lease/timetolive", {"ID": lease, "keys": True})
    for reply in (theirs, ours):
        assert 0 < int(reply.json()["TTL"]) <= 60
    assert without_member_fields({**ours.json(), "TTL": "t"}) == without_member_fields({**theirs.json(), "TTL": "t"})
    pair.same("/v3/lease/leases", {})
    pair.same("/v3/kv/lease/revoke", {"ID": lease})
    pair.same("/v3/lease/revoke", {"ID": lease})  # gone: etcd's 404
    pair.same("/v3/lease/timetolive", {"ID": lease})  # TTL -1
    pair.same("/v3/kv/put", {"key": b64("leased"), "value": b64("v"), "lease": lease})


class WatchStream:
    """A POST /v3/watch with its requests as the body, as Patroni sends it, whose answer is then
    read line by line while the watch stays open. (etcd's Go server answers an HTTP/1.1 request
    once its body has been read: a body still being sent gets no answer yet.)"""

    def __init__(self, address: str, requests: list[dict[str, Any]]) -> None:
        host, port = address.rsplit(":", 1)
        self._connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        self._connection.request("POST", "/v3/watch", body="".join(json.dumps(r) for r in requests))
        self._response = self._connection.getresponse()
        assert self._response.status == 200

    def next(self) -> dict[str, Any]:
        return without_member_fields(json.loads(self._response.readline()))

    def close(self) -> None:
        self._connection.close()


def test_a_watch_stream_answers_as_etcds(pair: Pair) -> None:
    key = b64("w")
    requests = [{"create_request": {"key": key, "prev_kv": True}},
                {"create_request": {"key": key, "watch_id": 3, "filters": ["NOPUT"]}},
                {"create_request": {"key": key, "watch_id": 3}},  # taken: refused
                {"progress_request": {}}]
    streams = [WatchStream(pair.etcd, requests), WatchStream(pair.gateway, requests)]
    try:
        seen: list[list[dict[str, Any]]] = [[stream.next() for _ in range(4)] for stream in streams]
        for value in ("1", "2"):
            pair.same("/v3/kv/put", {"key": key, "value": b64(value)})
        pair.same("/v3/kv/deleterange", {"key": key})
        for stream, lines in zip(streams, seen):
            lines.extend(stream.next() for _ in range(4))  # 2 puts to watch 0, the delete to both
        # The delete goes to both watches, in either order (in etcd too).
        theirs, ours = ([*lines[:6], *sorted(lines[6:], key=json.dumps)] for lines in seen)
        assert ours == theirs
        assert [sorted(line["result"]) for line in ours] == [
            ["created", "header"], ["created", "header", "watch_id"],
            ["cancel_reason", "canceled", "created", "header", "watch_id"], ["header", "watch_id"],
            ["events", "header"], ["events", "header"], ["events", "header"], ["events", "header", "watch_id"]]
    finally:
        for stream in streams:
            stream.close()


def test_members_maintenance_and_hash_answer_as_etcds(pair: Pair) -> None:
    theirs, ours = pair.both("/v3/cluster/member/list", {})
    # Names, ids and URLs are each store's own; the shape is etcd's.
    assert ours.status == theirs.status == 200
    assert sorted(ours.json()) == sorted(theirs.json()) == ["header", "members"]
    assert sorted(ours.json()["members"][0]) == sorted(theirs.json()["members"][0]) == [
        "ID", "clientURLs", "name", "peerURLs"]
    # Asked through the gateway, a member's client URL is its gateway's (Patroni takes its hosts from it).
    assert ours.json()["members"][0]["clientURLs"] == [f"http://{pair.gateway}"]
    theirs, ours = pair.both("/v3/maintenance/status", {})
    assert sorted(ours.json()) == sorted(theirs.json())  # the sizes and indexes are each store's own
    pair.same("/v3/maintenance/alarm", {})
    pair.same("/v3/maintenance/alarm", {"action": "GET"})
    theirs, ours = pair.both("/v3/maintenance/hash", {})  # Hash, not HashKV: etcd's first binding
    assert ours.status == theirs.status and sorted(ours.json()) == sorted(theirs.json())


def test_refusals_answer_as_etcds(pair: Pair) -> None:
    pair.same("/v3/kv/nope", {})  # 404 Not Found, grpc-gateway's text
    pair.same("/v3alpha/kv/range", {"key": b64("foo")})  # etcd 3.4 serves no /v3alpha/
    pair.same("/v3/kv/range", method="GET")  # 405
    pair.same("/v3/kv/range", "")  # an empty request: "key is not provided"
    pair.same("/v3/kv/range", "null")
    pair.same("/v3/kv/put", {"key": b64("k" * 2_000_000), "value": ""})  # "request is too large"
    pair.same("/v3/kv/put", {"key": b64("c"), "value": b64("1")})
    revision = pair.same("/v3/kv/put", {"key": b64("c"), "value": b64("2")})["header"]["revision"]
    pair.same("/v3/kv/compaction", {"revision": revision})
    pair.same("/v3/kv/range", {"key": b64("c"), "revision": int(revision) - 1})  # compacted
    pair.same("/v3/kv/compaction", {"revision": revision})  # compacted already
    pair.same("/v3/kv/range", {"key": b64("c"), "revision": "100000"})  # a future revision
    # A body that is not JSON: the same status and code; the message is each parser's own.
    theirs, ours = pair.both("/v3/kv/range", "{bad")
    assert (ours.status, ours.json()["code"]) == (theirs.status, theirs.json()["code"]) == (400, 3)
    assert sorted(ours.json()) == sorted(theirs.json()) == ["code", "error", "message"]
    theirs, ours = pair.both("/v3/watch", "{bad")  # a stream's first request: grpc-gateway's Unknown
    assert (ours.status, ours.json()["code"]) == (theirs.status, theirs.json()["code"]) == (500, 2)


def test_version_health_and_metrics_are_served_as_etcds(pair: Pair) -> None:
    theirs, ours = pair.both("/version", method="GET")
    assert ours.status == theirs.status == 200
    assert ours.json()["etcdcluster"] == theirs.json()["etcdcluster"] == "3.4.0"
    assert ours.json()["etcdserver"].startswith("3.4.") and theirs.json()["etcdserver"].startswith("3.4.")
    theirs, ours = pair.both("/health", method="GET")
    assert ours.status == theirs.status == 200 and ours.json()["health"] == theirs.json()["health"] == "true"
    theirs, ours = pair.both("/metrics", method="GET")
    assert ours.status == theirs.status == 200
    for reply in (ours, theirs):  # what `etcdctl check datascale` reads
        assert reply.content_type.startswith("text/plain") and "\nprocess_resident_memory_bytes " in reply.text


def test_auth_through_the_gateway_answers_as_etcds(pair: Pair) -> None:
    """Last in the module: it turns auth on and off again on both."""
    pair.same("/v3/auth/authenticate", {"name": "nobody", "password": "x"})
    pair.same("/v3/auth/user/add", {"name": "root", "password": "pw"})
    pair.same("/v3/auth/role/add", {"name": "root"})
    pair.same("/v3/auth/user/grant", {"user": "root", "role": "root"})
    pair.same("/v3/auth/enable", {})
    tokens: list[str] = []
    try:
        pair.same("/v3/kv/range", {"key": b64("foo")})  # no token: "user name is empty"
        pair.same("/v3/auth/authenticate", {"name": "root", "password": "wrong"})
        tokens = [call(address, "/v3/auth/authenticate", {"name": "root", "password": "pw"}).json()["token"]
                  for address in (pair.etcd, pair.gateway)]
        replies = [call(address, "/v3/kv/range", {"key": b64("foo")}, headers={"Authorization": token})
                   for address, token in zip((pair.etcd, pair.gateway), tokens)]
        assert replies[1].compared() == replies[0].compared() and replies[1].status == 200
    finally:
        for address, token in zip((pair.etcd, pair.gateway), tokens):
            assert call(address, "/v3/auth/disable", {}, headers={"Authorization": token}).status == 200


# ---- raftkv alone ------------------------------------------------------------------------------

def test_a_write_through_a_followers_gateway_is_forwarded_to_the_leader(tmp_path: Path) -> None:
    ports = dict(zip(("n1", "n2", "n3"), free_ports(3)))
    cluster = Cluster(tmp_path, 3, FAST_TIMING, node_args=gateway_args(ports))
    cluster.ports.extend(ports.values())
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        follower = next(n for n in ports if n != leader)
        put = call(f"127.0.0.1:{ports[follower]}", "/v3/kv/put", {"key": b64("fw"), "value": b64("1")})
        assert put.status == 200, put.text
        read = call(f"127.0.0.1:{ports[leader]}", "/v3/kv/range", {"key": b64("fw")})
        assert read.json()["kvs"][0]["value"] == b64("1")
        assert read.json()["header"]["revision"] == put.json()["header"]["revision"]
        # A lease kept alive through the follower: its keep-alive stream goes on to the leader.
        follower_gateway = f"127.0.0.1:{ports[follower]}"
        assert call(follower_gateway, "/v3/lease/grant", {"ID": "99", "TTL": 30}).status == 200
        kept = call(follower_gateway, "/v3/lease/keepalive", {"ID": "99"})
        assert [json.loads(line)["result"]["TTL"] for line in kept.text.splitlines()] == ["30"]
        # Patroni replaces its hosts with the clientURLs it is given: through any gateway, gateways'.
        gateways = {name: [f"http://127.0.0.1:{port}"] for name, port in ports.items()}
        wait_until("every member's gateway URL listed", lambda: {
            m["name"]: m.get("clientURLs") for m in call(f"127.0.0.1:{ports[follower]}", "/v3/cluster/member/list",
                                                           {}).json()["members"]} == gateways or None)
        # So do the answers to member changes, which the follower forwards to the leader's gRPC port.
        added = call(follower_gateway, "/v3/cluster/member/add",
                     {"peerURLs": [f"http://127.0.0.1:{free_ports(1)[0]}"], "isLearner": True})
        assert added.status == 200, added.text
        listed = {m.get("name"): m.get("clientURLs") for m in added.json()["members"]}
        assert listed == {**gateways, None: None}, listed  # the learner: unstarted, no name, no URL
        removed = call(follower_gateway, "/v3/cluster/member/remove", {"ID": added.json()["member"]["ID"]})
        assert removed.status == 200, removed.text
        assert {m["name"]: m.get("clientURLs") for m in removed.json()["members"]} == gateways
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()


def test_etcdctl_reaches_the_grpc_port_through_the_gateways_url(pair: Pair) -> None:
    endpoint = f"http://{pair.gateway}"
    assert etcdctl(endpoint, ("put", "relayed", "yes")).code == 0
    got = etcdctl(endpoint, ("get", "relayed", "--print-value-only"))
    assert (got.code, got.stdout) == (0, "yes\n")


def test_etcdctl_check_datascale_passes_through_the_gateways_url(pair: Pair) -> None:
    assert ETCDCTL is not None
    done = subprocess.run([ETCDCTL, f"--endpoints=http://{pair.gateway}", "check", "datascale", "--load=s"],
                          capture_output=True, text=True, env=etcdctl_env(), timeout=120)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    """A CA, n1's member certificate, and a client context that trusts the CA and presents alice's."""
    directory = tmp_path_factory.mktemp("certs")
    ca = ensure_ca(directory)
    issue(directory, "n1", DEFAULT_HOSTS, server=True)
    alice = issue(directory, "alice", server=False)
    context = ssl.create_default_context(cafile=str(ca.cert))
    context.load_cert_chain(alice.cert, alice.key)
    return directory, context


def test_an_https_gateway_serves_with_the_client_ports_certificates(tmp_path: Path,
                                                                    certs: tuple[Path, ssl.SSLContext]) -> None:
    directory, context = certs
    port = free_ports(1)[0]
    tls = ("--cert-file", str(directory / "n1.pem"), "--key-file", str(directory / "n1-key.pem"),
           "--trusted-ca-file", str(directory / "ca.pem"), "--client-cert-auth",
           "--listen-client-http-urls", f"https://127.0.0.1:{port}")
    cluster = Cluster(tmp_path, 1, (*FAST_TIMING, *tls))
    cluster.ports.append(port)
    address = f"127.0.0.1:{port}"
    try:
        cluster.start()
        reply = wait_until("the https gateway answering",
                           lambda: _answered(address, context) or None)
        assert reply.status == 200 and reply.json()["header"]["revision"] == "1"
        without_certificate = ssl.create_default_context(cafile=str(directory / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError)):  # --client-cert-auth: a certificate or nothing
            call(address, "/v3/kv/range", {"key": b64("x")}, context=without_certificate)
        with pytest.raises((http.client.HTTPException, ConnectionError)):  # plaintext to a TLS port
            call(address, "/v3/kv/range", {"key": b64("x")})
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.close()


def _answered(address: str, context: ssl.SSLContext) -> Reply | None:
    try:
        reply = call(address, "/v3/kv/range", {"key": b64("x")}, context=context)
    except (ConnectionError, OSError):
        return None
    return reply if reply.status == 200 else None


def test_the_flag_refuses_https_without_the_client_ports_tls(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kv.tools.cli", "serve", "--id", "n1", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path),
                           "--listen-client-http-urls", "https://127.0.0.1:0"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode != 0 and "--listen-client-http-urls" in done.stderr and "--cert-file" in done.stderr


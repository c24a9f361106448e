"""Metrics, health and alarms on real node processes (docs/operations.md): /metrics parses with
Prometheus' own parser and its counters move as they should, /health and gRPC's health service
follow a member cut from its quorum and back, every member times its round trips to each peer
(etcd_network_peer_round_trip_time_seconds{To}), NOSPACE (through --quota-backend-bytes) is raised
on every member, refuses puts, and clears with a disarm; --log-format json lines parse."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from kv.errors import DiskFullError
from tests.integration.cluster import FAST_TIMING, Cluster, wait_until

pytestmark = pytest.mark.integration

PUTS = 20


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(cluster: Cluster, node_id: str) -> dict[str, float]:
    """Every sample of the member's /metrics, by name (labels joined in), parsed by prometheus_client."""
    status, text = http_get(f"{cluster.metrics_url(node_id)}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def health(cluster: Cluster, node_id: str) -> tuple[int, dict[str, str]]:
    status, body = http_get(f"{cluster.metrics_url(node_id)}/health")
    return status, json.loads(body)


def grpc_health(cluster: Cluster, node_id: str, service: str = "") -> int:
    with grpc.insecure_channel(cluster.nodes[node_id].address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
    return reply.status


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("observed"), 3, (*FAST_TIMING, "--log-format", "json"),
                      metrics=True).start()
    try:
        cluster.wait_for_leader()
        yield cluster
    finally:
        cluster.close()


def test_metrics_parse_and_proposals_committed_rise_by_at_least_the_puts(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    before = scrape(cluster, leader)
    client = cluster.client()
    for i in range(PUTS):
        client.put(f"m/{i}", "v")
    after = scrape(cluster, leader)
    # The commit index: the puts, plus the client's registration and any no-op or state check marker.
    assert after["etcd_server_proposals_committed_total"] >= before["etcd_server_proposals_committed_total"] + PUTS
    assert after["etcd_server_proposals_applied_total"] >= before["etcd_server_proposals_applied_total"] + PUTS
    assert after["etcd_server_is_leader"] == 1 and after["etcd_server_has_leader"] == 1
    assert after["etcd_disk_wal_fsync_duration_seconds_count"] > before["etcd_disk_wal_fsync_duration_seconds_count"]
    assert after["etcd_debugging_mvcc_keys_total"] >= PUTS
    assert after["etcd_mvcc_db_total_size_in_bytes"] > 0
    assert after["raftkv_stream_requests_total{kind=put}"] >= PUTS  # the client's puts go on a stream
    assert after["raftkv_client_sessions"] >= 1
    assert after["grpc_server_handled_total{grpc_code=OK,grpc_method=Stream.Put,grpc_service=raftkv.kv.KV}"] >= PUTS
    assert after["grpc_server_handling_seconds_count{grpc_method=Stream.Put,grpc_service=raftkv.kv.KV}"] >= PUTS
    followers = [n for n in cluster.nodes if n != leader]
    assert all(scrape(cluster, n)["etcd_server_is_leader"] == 0 for n in followers)


RTT = "etcd_network_peer_round_trip_time_seconds"
# etcd's buckets for it (rafthttp/metrics.go: ExponentialBuckets(0.0001, 2, 16)), as Prometheus writes them.
RTT_BUCKETS = [repr(0.0001 * 2 ** i) for i in range(16)] + ["+Inf"]


def round_trips(cluster: Cluster, node_id: str) -> dict[str, tuple[float, float]]:
    """Peer -> (count, sum) of the member's timed round trips to it; the buckets checked on the way."""
    samples = scrape(cluster, node_id)
    found = {}
    for peer in cluster.nodes:
        if peer == node_id:
            continue
        count, total = samples[f"{RTT}_count{{To={peer}}}"], samples[f"{RTT}_sum{{To={peer}}}"]
        buckets = [samples[f"{RTT}_bucket{{To={peer},le={le}}}"] for le in RTT_BUCKETS]
        assert buckets == sorted(buckets) and buckets[-1] == count  # cumulative, +Inf holds them all
        assert (total > 0) == (count > 0)
        found[peer] = (count, total)
    assert not any(key.startswith(f"{RTT}_count{{To={node_id}}}") for key in samples)  # not to itself
    return found


def test_each_member_times_a_round_trip_to_each_peer_every_few_seconds(cluster: Cluster) -> None:
    """etcd_network_peer_round_trip_time_seconds{To=peer} on every member, for each other member,
    its count growing as the member probes its peers (every 5 s) and each round trip well under a
    second on loopback."""
    cluster.wait_for_leader()
    before = {node_id: round_trips(cluster, node_id) for node_id in cluster.nodes}
    for node_id, peers in before.items():
        assert sorted(peers) == sorted(n for n in cluster.nodes if n != node_id)
        for peer, (count, _) in peers.items():
            grown = wait_until(f"{node_id} times a round trip to {peer}",
                               lambda: (now := round_trips(cluster, node_id)[peer])[0] > count and now)
            assert 0 < grown[1] / grown[0] < 1.0


def test_health_endpoints_and_the_grpc_health_service_say_serving(cluster: Cluster) -> None:
    def readings(node_id: str) -> list[object]:
        return [health(cluster, node_id), http_get(f"{cluster.metrics_url(node_id)}/livez")[0],
                http_get(f"{cluster.metrics_url(node_id)}/readyz"),
                *(grpc_health(cluster, node_id, service) for service in ("", "raftkv")),
                cluster.status(node_id)["unhealthy"]]

    serving = health_pb2.HealthCheckResponse.SERVING
    healthy = [(200, {"health": "true", "reason": ""}), 200, (200, "ok\n"), serving, serving, None]
    for node_id in cluster.nodes:
        # Taken together: a member is healthy while it heard from its leader lately, and one late
        # heartbeat on a busy machine turns it unhealthy for a moment.
        wait_until(f"{node_id} healthy by every reading", lambda: readings(node_id) == healthy)
    with pytest.raises(grpc.RpcError) as refused:
        grpc_health(cluster, "n1", "no-such-service")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_json_log_lines_parse_with_member_and_term(cluster: Cluster) -> None:
    lines = [line for line in cluster.nodes["n1"].log_path.read_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "member", "logger", "message"} <= r.keys() for r in records)
    assert all(r["member"] == "n1" for r in records)
    assert any("term" in r for r in records)


def test_leader_changes_rise_by_one_on_a_survivor_after_the_leader_is_killed(cluster: Cluster) -> None:
    old = cluster.wait_for_leader()
    term = cluster.status(old)["term"]
    survivor = next(n for n in cluster.nodes if n != old)
    before = scrape(cluster, survivor)["etcd_server_leader_changes_seen_total"]
    cluster.kill(old)
    try:
        new_leader = cluster.wait_for_leader(not_in_term=term)
        seen = wait_until("the survivor counts the new leader",
                          lambda: (v := scrape(cluster, survivor)["etcd_server_leader_changes_seen_total"]) > before
                          and v)
        # One change for each leader it followed since: one, unless a busy machine caused a second
        # election meanwhile (a leader a term; a split vote's terms have none).
        assert 1 <= seen - before <= cluster.status(new_leader)["term"] - term
    finally:
        cluster.start_node(old)
    cluster.wait_for_leader()


def test_a_member_cut_from_its_quorum_turns_unhealthy_and_healthy_again(cluster: Cluster) -> None:
    cluster.wait_for_leader()
    alone, *others = list(cluster.nodes)
    for node_id in others:
        cluster.kill(node_id)
    try:
        status, body = wait_until("the lone member unhealthy", lambda: (h := health(cluster, alone))[0] == 503 and h)
        assert body == {"health": "false", "reason": "RAFT NO LEADER"}
        assert http_get(f"{cluster.metrics_url(alone)}/readyz")[0] == 503
        assert http_get(f"{cluster.metrics_url(alone)}/livez")[0] == 200  # the process still serves
        assert grpc_health(cluster, alone) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert scrape(cluster, alone)["etcd_server_health_failures_total"] >= 1
    finally:
        for node_id in others:
            cluster.start_node(node_id)
    wait_until("the member healthy again", lambda: health(cluster, alone)[0] == 200)
    assert grpc_health(cluster, alone) == health_pb2.HealthCheckResponse.SERVING


# ---- NOSPACE through --quota-backend-bytes -----------------------------------------------------

QUOTA = 256 << 10
VALUE = "q" * 40_000


def test_a_full_quota_raises_nospace_on_every_member_puts_are_refused_and_a_disarm_resumes_them(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "quota", 3, (*FAST_TIMING, "--quota-backend-bytes", str(QUOTA)), metrics=True).start()
    try:
        cluster.wait_for_leader()
        client = cluster.client(timeout=5.0)
        # Up to 400 kB: past the quota. The leader's alarm watch looks once a second and raises
        # NOSPACE as soon as the state is over the quota, which may be before the last of these
        # puts (a loaded machine): from then on they are refused, as they must be. Not before the
        # state can be over the quota, though: after 5 puts (200 kB) it holds 56 pages of 4 kB,
        # under 64; the 6th takes it over.
        written: list[str] = []
        for key in (f"big/{i}" for i in range(10)):
            try:
                client.put(key, VALUE)
            except DiskFullError:
                break
            written.append(key)
        assert len(written) >= QUOTA // len(VALUE), f"NOSPACE refused a put after only {len(written)} of 40 kB"
        everyone = {(member, "NOSPACE") for member in cluster.nodes}

        def all_listed(node_id: str) -> list[dict[str, str]] | None:
            alarms = cluster.status(node_id)["alarms"]
            return alarms if {(a["member_id"], a["alarm"]) for a in alarms} == everyone else None

        for node_id in cluster.nodes:  # replicated: every member lists it, for every member over quota
            # Each member's alarm comes from the first round of the leader's watch that finds that
            # member over the quota: not the same round for a member that applies the puts later.
            alarms = wait_until(f"{node_id} to list NOSPACE for every member", lambda: all_listed(node_id))
            assert health(cluster, node_id)[1]["reason"].startswith("ALARM NOSPACE")
            assert http_get(f"{cluster.metrics_url(node_id)}/health?exclude=NOSPACE")[0] == 200  # as etcd's
            assert scrape(cluster, node_id)[f"raftkv_alarm{{alarm=NOSPACE,member_id={alarms[0]['member_id']}}}"] == 1
        assert client.alarm_list() == cluster.status("n1")["alarms"]
        with pytest.raises(DiskFullError, match="database space exceeded"):
            client.put("refused", "x")
        assert client.get(written[0]) == VALUE.encode()  # reads go on
        client.alarm_disarm()
        wait_until("NOSPACE raised again: the state is still over quota", lambda: cluster.status("n1")["alarms"])
        for key in written:  # deletes go on; with the compaction after them, as etcd's, they free pages
            client.delete(key)
        client.compact(client.revision())
        wait_until("no member over quota", lambda: not any(s["nospace"] for s in cluster.statuses().values()))
        assert client.alarm_disarm() == []
        client.put("after", "1")
        assert client.get("after") == b"1"
    finally:
        cluster.close()

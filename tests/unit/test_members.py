"""The pure parts of the membership RPCs (kv/server/etcd_cluster.py) and kv.Client's member
calls (kv/client/members.py): peer URLs, etcd ids, the strict reconfiguration check."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from kv.client.members import member_dict
from kv.server.etcd_checks import EtcdError
from kv.tools.cluster_commands import status_rows
from kv.server.etcd_cluster import NOT_ENOUGH_STARTED, _check_in_sync, _check_quorum, peer_address_of
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.member_ids import member_number


@pytest.mark.parametrize("urls, address", [
    (["http://127.0.0.1:7101"], "127.0.0.1:7101"),
    (["https://db-4.example:7101/"], "db-4.example:7101"),
    (["10.0.0.4:7101"], "10.0.0.4:7101"),
    (["http://[::1]:7101"], "[::1]:7101"),
])
def test_a_peer_url_gives_its_host_and_port(urls: list[str], address: str) -> None:
    assert peer_address_of(urls) == address


@pytest.mark.parametrize("urls", [[], ["http://127.0.0.1"], ["ftp://h:1"], ["http://h:0"], ["http://h:70000"],
                                  ["http://:7101"], ["http://a:1", "http://b:2"]])
def test_a_bad_peer_url_is_etcds_invalid_urls(urls: list[str]) -> None:
    with pytest.raises(EtcdError, match="etcdserver: given member URLs are invalid") as refused:
        peer_address_of(urls)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("voters_after, started, allow_second, accepted", [
    (4, 3, False, True),   # a voter added to three started ones
    (4, 2, False, False),  # ... to three of which one is down
    (2, 1, True, True),    # etcd lets a one-member cluster add its second
    (2, 1, False, False),  # ... but not remove down to one unstarted and the leader
    (2, 2, False, True),
    (3, 2, False, True),
])
def test_the_strict_check_wants_a_started_majority_after_the_change(voters_after: int, started: int,
                                                                    allow_second: bool, accepted: bool) -> None:
    face: Any = strict(True)
    if accepted:
        _check_quorum(face, voters_after, started, allow_second)
    else:
        with pytest.raises(EtcdError) as refused:
            _check_quorum(face, voters_after, started, allow_second)
        assert refused.value is NOT_ENOUGH_STARTED


def strict(check: bool) -> Any:
    return SimpleNamespace(node=SimpleNamespace(config=SimpleNamespace(strict_reconfig_check=check)))


def test_the_strict_check_is_off_with_strict_reconfig_check_false() -> None:
    _check_quorum(strict(False), 4, 2)  # refused above when strict


@pytest.mark.parametrize("match, last, ready", [(90, 100, True), (89, 100, False), (0, 5, False), (0, 0, True)])
def test_a_learner_is_in_sync_at_90_percent_of_the_leaders_log(match: int, last: int, ready: bool) -> None:
    status = SimpleNamespace(peers={"n4": match}, last_index=last)
    face: Any = SimpleNamespace(node=SimpleNamespace(core=SimpleNamespace(status=lambda: status)))
    if ready:
        _check_in_sync(face, "n4")
    else:
        with pytest.raises(EtcdError, match="which is in sync with leader$"):
            _check_in_sync(face, "n4")


def test_a_member_as_the_client_returns_it() -> None:
    member = pb.Member(ID=member_number("n4"), name="n4", isLearner=True, peerURLs=["http://127.0.0.1:7104"])
    assert member_dict(member) == {"id": "n4", "member_id": member_number("n4"), "learner": True,
                                   "peer_address": "127.0.0.1:7104", "client_address": None,
                                   "peer_urls": ["http://127.0.0.1:7104"], "client_urls": []}


def test_the_status_table_names_a_learner_by_its_role() -> None:
    base = {"term": 3, "leader": "n1", "commit_index": 9, "applied_index": 9, "snapshot_index": 0,
            "voters": ["n1", "n2"], "learners": ["n4"]}
    header, rows = status_rows([{**base, "address": "a:1", "id": "n1", "role": "leader"},
                                {**base, "address": "a:4", "id": "n4", "role": "follower"}])
    role = header.index("ROLE")
    assert [row[role] for row in rows] == ["leader", "learner"]

"""etcd3gw (OpenStack's etcd client, the one tooz uses; it speaks etcd's HTTP/JSON gateway) drives
three raftkv members through a follower's gateway, and the same calls drive three etcd 3.4
members: get (values, and with metadata: the JSON key-values as the gateway writes them), put,
create, delete, get_prefix, get_all, delete_prefix, replace, a transaction of its raw JSON, a
lease (keys attached, ttl, refresh, revoke), watch and watch_prefix (events arrive as the
gateway's JSON; cancel ends them), watch_once from a past revision, and locks (acquire, contended, refresh, release).
What both must answer alike is compared whole; member ids, lease ids and remaining TTLs are
checked on each for their shape.

etcd3gw speaks no protobuf, so it runs in the test's process. CI installs it (pyproject's `test`
extra): there a missing client fails the test; elsewhere it is skipped."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest

from tests.integration.gateway_stores import KINDS, GatewayStore, gateway_store
from tests.integration.installed import module_missing, require
from tests.integration.test_etcd_differential import without_member_fields

pytestmark = pytest.mark.integration

EVENT_WAIT_S = 10.0
CALL_TIMEOUT_S = 10


@pytest.fixture(scope="module", autouse=True)
def etcd3gw_installed() -> None:
    require(module_missing("etcd3gw", "etcd3gw"))


def take(events: Iterator[Any], cancel: Callable[[], None], count: int) -> list[Any]:
    """The next `count` events of a watch's iterator, within EVENT_WAIT_S (else the watch is
    canceled, which ends the iterator, and the test fails saying so)."""
    with ThreadPoolExecutor(1) as pool:
        arrived = pool.submit(lambda: [next(events) for _ in range(count)])
        try:
            return arrived.result(timeout=EVENT_WAIT_S)
        except FutureTimeout:
            cancel()
            raise AssertionError(f"{count} watch events did not arrive within {EVENT_WAIT_S:.0f}s") from None


def text(value: Any) -> Any:
    """etcd3gw's answers with bytes (keys, values) as str, for comparing and printing."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):
        return {k: text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [text(v) for v in value]
    return value


def kv_calls(client: Any, same: dict[str, Any]) -> None:
    same["put"] = client.put("kv/a", "1")
    client.put("kv/a", "2")
    client.put("kv/b", "3")
    client.put("kv/c", "4")
    client.put("other", "5")
    same["get"] = text(client.get("kv/a"))
    same["get_metadata"] = text(client.get("kv/a", metadata=True))
    same["get_missing"] = client.get("kv/none")
    same["get_prefix"] = text(client.get_prefix("kv/"))
    same["get_prefix_descending"] = text(client.get_prefix("kv/", sort_order="descend", sort_target="key"))
    same["get_all"] = text(client.get_all())
    same["create_new"] = client.create("kv/d", "6")
    same["create_there"] = client.create("kv/d", "7")
    same["replace_matching"] = client.replace("kv/a", "2", "8")
    same["replace_stale"] = client.replace("kv/a", "2", "9")
    same["delete"] = client.delete("kv/b")
    same["delete_missing"] = client.delete("kv/b")
    same["delete_prefix"] = client.delete_prefix("kv/")
    same["delete_prefix_nothing"] = client.delete_prefix("kv/")
    same["after_delete_prefix"] = client.get_prefix("kv/")


def txn_calls(client: Any, same: dict[str, Any]) -> None:
    from etcd3gw.utils import _encode  # etcd3gw's own base64 of keys and values

    client.put("tx/k", "v")
    (_, meta), = client.get("tx/k", metadata=True)
    txn = {"compare": [{"key": _encode("tx/k"), "result": "EQUAL", "target": "MOD",
                        "mod_revision": meta["mod_revision"]},
                       {"key": _encode("tx/k"), "result": "GREATER", "target": "VERSION", "version": 0}],
           "success": [{"request_put": {"key": _encode("tx/k"), "value": _encode("w"), "prev_kv": True}},
                       {"request_range": {"key": _encode("tx/"), "range_end": _encode("tx0")}}],
           "failure": [{"request_delete_range": {"key": _encode("tx/k")}}]}
    same["txn_success"] = without_member_fields(client.transaction(txn))
    same["txn_failure"] = without_member_fields(client.transaction(txn))  # the mod revision moved


def lease_calls(client: Any, same: dict[str, Any], own: dict[str, Any]) -> None:
    lease = client.lease(ttl=30)
    own["lease_id"] = lease.id
    client.put("lease/a", "1", lease=lease)
    client.put("lease/b", "2", lease=lease)
    own["lease_ttl"] = lease.ttl()
    same["lease_refresh"] = lease.refresh()
    same["lease_keys"] = sorted(text(lease.keys()))
    (_, meta), = client.get("lease/a", metadata=True)
    same["lease_of_key"] = int(meta["lease"]) == lease.id
    same["lease_revoke"] = lease.revoke()
    same["lease_after_revoke"] = {"keys": client.get_prefix("lease/"), "ttl": lease.ttl(), "refresh": lease.refresh()}


def watch_calls(client: Any, same: dict[str, Any]) -> None:
    start = int(client.status()["header"]["revision"]) + 1
    key_events, cancel_key = client.watch("watch/a", start_revision=start)
    prefix_events, cancel_prefix = client.watch_prefix("watch/", start_revision=start)
    client.put("watch/a", "1")
    client.put("watch/b", "2")
    client.delete("watch/a")
    same["watch_key"] = text(take(key_events, cancel_key, 2))
    same["watch_prefix"] = text(take(prefix_events, cancel_prefix, 3))
    cancel_key()
    cancel_prefix()
    same["watch_after_cancel"] = [list(key_events), list(prefix_events)]  # canceled: both ended
    # From a past revision: the history comes first. (Not watch_prefix_once: etcd3gw 2.7 encodes its
    # range end twice, and the range it asks for holds no key, whatever the store.)
    same["watch_once_history"] = text(client.watch_once("watch/b", timeout=EVENT_WAIT_S, start_revision=start))


def lock_calls(client: Any, same: dict[str, Any]) -> None:
    first = client.lock("the-lock", ttl=30)
    second = client.lock("the-lock", ttl=30)
    same["lock_acquire"] = first.acquire()
    same["lock_contended"] = second.acquire()
    same["lock_is_acquired"] = [first.is_acquired(), second.is_acquired()]
    same["lock_refresh"] = first.refresh()
    same["lock_release_by_other"] = second.release()
    same["lock_release"] = first.release()
    same["lock_acquire_after_release"] = second.acquire()
    same["lock_is_acquired_after"] = [first.is_acquired(), second.is_acquired()]
    same["lock_release_second"] = second.release()
    same["lock_keys_at_last"] = client.get_prefix("/locks/")


def calls(url: str) -> dict[str, dict[str, Any]]:
    """etcd3gw's operations against the gateway at `url`: {"same": ..., "own": ...}."""
    import etcd3gw

    host, port = url.removeprefix("http://").rsplit(":", 1)
    client = etcd3gw.client(host=host, port=int(port), timeout=CALL_TIMEOUT_S)
    same: dict[str, Any] = {}
    own: dict[str, Any] = {"members": client.members(), "status": client.status()}
    kv_calls(client, same)
    txn_calls(client, same)
    lease_calls(client, same, own)
    watch_calls(client, same)
    lock_calls(client, same)
    return {"same": same, "own": own}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, Any]]]:
    """kind -> etcd3gw's calls' answers through a follower of that store, each store started and
    driven once, when a test first asks for it."""
    found: dict[str, dict[str, Any]] = {}

    def of(kind: str) -> dict[str, Any]:
        if kind not in found:
            with gateway_store(kind, tmp_path_factory.mktemp(f"etcd3gw-{kind}")) as store:
                found[kind] = {**calls(store.urls[follower(store)]), "store": store}
        return found[kind]
    yield of


def follower(store: GatewayStore) -> int:
    return (store.wait_for_leader() + 1) % len(store.urls)


@pytest.mark.parametrize("kind", KINDS)
def test_etcd3gw_operations(kind: str, answers: Callable[[str], dict[str, Any]]) -> None:
    """The answers each store gives, checked one by one (etcd's prove the expectations right)."""
    got = answers(kind)
    same, own, store = got["same"], got["own"], got["store"]
    # kv
    assert same["put"] is True and same["get"] == ["2"]
    ((value, meta),) = same["get_metadata"]
    assert value == "2" and meta["key"] == "kv/a" and meta["version"] == "2"
    assert int(meta["mod_revision"]) == int(meta["create_revision"]) + 1  # int64 as JSON strings
    assert same["get_missing"] == []
    assert [v for v, _ in same["get_prefix"]] == ["2", "3", "4"]
    assert [m["key"] for _, m in same["get_prefix_descending"]] == ["kv/c", "kv/b", "kv/a"]
    assert [m["key"] for _, m in same["get_all"]] == ["kv/a", "kv/b", "kv/c", "other"]
    assert (same["create_new"], same["create_there"]) == (True, False)
    assert (same["replace_matching"], same["replace_stale"]) == (True, False)
    # A delete that deletes nothing: "deleted" left out of the JSON (a zero), which etcd3gw reads as False.
    assert (same["delete"], same["delete_missing"]) == (True, False)
    assert (same["delete_prefix"], same["delete_prefix_nothing"]) == (True, False)
    assert same["after_delete_prefix"] == []
    # txn
    assert same["txn_success"]["succeeded"] is True
    put, ranged = same["txn_success"]["responses"]
    assert put["response_put"]["prev_kv"]["value"] == "dg=="  # base64 of "v"
    assert [kv["key"] for kv in ranged["response_range"]["kvs"]] == ["dHgvaw=="]  # base64 of "tx/k"
    assert "succeeded" not in same["txn_failure"]  # false: left out
    assert same["txn_failure"]["responses"] == [{"response_delete_range": {"header": same["txn_failure"]["header"],
                                                                          "deleted": "1"}}]
    # lease
    assert isinstance(own["lease_id"], int) and 0 < own["lease_ttl"] <= 30
    assert same["lease_refresh"] == 30 and same["lease_keys"] == ["lease/a", "lease/b"]
    assert same["lease_of_key"] is True and same["lease_revoke"] is True
    assert same["lease_after_revoke"] == {"keys": [], "ttl": -1, "refresh": -1}
    # watch: PUT is the zero of the event type, left out
    assert [(e.get("type", "PUT"), e["kv"]["key"]) for e in same["watch_key"]] == [("PUT", "watch/a"),
                                                                                  ("DELETE", "watch/a")]
    assert [(e.get("type", "PUT"), e["kv"]["key"], e["kv"].get("value")) for e in same["watch_prefix"]] == [
        ("PUT", "watch/a", "1"), ("PUT", "watch/b", "2"), ("DELETE", "watch/a", None)]
    assert same["watch_after_cancel"] == [[], []]
    assert same["watch_once_history"]["kv"]["key"] == "watch/b"
    # lock
    assert (same["lock_acquire"], same["lock_contended"]) == (True, False)
    assert same["lock_is_acquired"] == [True, False] and same["lock_refresh"] == 30
    assert (same["lock_release_by_other"], same["lock_release"]) == (False, True)
    assert same["lock_acquire_after_release"] is True and same["lock_is_acquired_after"] == [False, True]
    assert same["lock_release_second"] is True and same["lock_keys_at_last"] == []
    # members and status: the gateways' URLs are the client URLs listed
    assert len(own["members"]) == 3
    assert {url for member in own["members"] for url in member["clientURLs"]} == set(store.urls)
    assert own["status"]["leader"] in {member["ID"] for member in own["members"]}


def test_raftkv_answers_etcd3gw_as_etcd_does(answers: Callable[[str], dict[str, Any]]) -> None:
    ours, theirs = answers("raftkv")["same"], answers("etcd")["same"]
    differing = [f"{name}:\n  etcd   {theirs[name]}\n  raftkv {ours.get(name)}"
                 for name in theirs if theirs[name] != ours.get(name)]
    assert not differing, "\n".join(differing)
    assert ours.keys() == theirs.keys()

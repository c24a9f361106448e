"""Restoring a data directory from a snapshot, inspecting a file, and installing a snapshot into a
follower's state directory (with crashes injected between its steps)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapshot.install as install
from raft.core import Entry, EntryType, Membership
from raft.log import WalLogStore, open_log_store
from raft.node.cluster_id import resolve_cluster_id
from snapshot import RestoreRefusedError, SnapshotCorruptError, SnapshotManifest, SnapshotStore
from snapshot.install import install_into_state, recover_state_dir
from kv.server.restore import restore
from snapshot.inspection import inspect
from statemachine import KVStateMachine
from tests.unit.test_snapshot import MAP_SIZE, apply_in_batches, make_entries

PEERS = {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"}


@pytest.fixture
def source(tmp_path: Path) -> Iterator[tuple[Path, SnapshotManifest, str]]:
    """A snapshot file of 2500 applied entries, its manifest, and the source state's hash."""
    with KVStateMachine(tmp_path / "source", map_size=MAP_SIZE) as sm:
        apply_in_batches(sm, make_entries(2500, term=4))
        store = SnapshotStore(tmp_path / "snapshots")
        manifest = store.create(sm, sorted(PEERS), "c-old")
        yield store.path_for(manifest), manifest, sm.state_hash()


def truncated_copy(path: Path, to: Path) -> Path:
    to.write_bytes(path.read_bytes()[:-10])
    return to


# ---- restore ---------------------------------------------------------------------------------------

def test_restore_makes_a_data_dir_at_the_snapshot(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    file, manifest, source_hash = source
    data_dir = tmp_path / "restored" / "n2"
    cluster_id = restore(file, data_dir, "n2", PEERS)
    assert cluster_id.startswith("c-") and cluster_id != manifest.cluster_id
    assert (data_dir / "cluster_id").read_text().strip() == cluster_id
    # What the node does on start: the stored id wins and is not re-derived from the peers.
    assert resolve_cluster_id(data_dir, None, PEERS) == cluster_id
    with open_log_store(data_dir) as log:
        assert isinstance(log, WalLogStore)
        assert log.before_begin() == (manifest.index, manifest.term) == (2500, 4)
        assert log.last_index() == manifest.index
        assert log.term(manifest.index) == manifest.term
        assert log.hard_state().term == manifest.term and log.hard_state().voted_for is None
    with KVStateMachine(data_dir / "state", map_size=MAP_SIZE) as sm:
        assert (sm.applied_index, sm.applied_term) == (manifest.index, manifest.term)
        assert sm.state_hash() == source_hash
        assert sm.count() == manifest.key_count


def test_a_restored_cluster_has_the_members_it_is_restored_for(tmp_path: Path) -> None:
    """The snapshot records the configuration of the cluster it was taken from; the restored
    state records the new cluster's (else its members, named in no configuration, never stand)."""
    old = Membership.of_voters({"a": "10.0.0.1:7101", "b": "10.0.0.2:7101", "c": "10.0.0.3:7101"})
    with KVStateMachine(tmp_path / "source", map_size=MAP_SIZE) as sm:
        sm.apply([Entry(1, 1, EntryType.CONFIG, old.encode())])
        store = SnapshotStore(tmp_path / "snapshots")
        manifest = store.create(sm, [], "c-old")
    assert Membership.decode(manifest.membership.encode()) == old
    restore(store.path_for(manifest), tmp_path / "n1", "n1", PEERS)
    with KVStateMachine(tmp_path / "n1" / "state", map_size=MAP_SIZE) as sm:
        assert Membership.decode(sm.membership) == Membership.of_voters(PEERS)


def test_every_member_restored_with_one_cluster_id_agrees(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    file, _, _ = source
    ids = {restore(file, tmp_path / node, node, PEERS, cluster_id="c-restored") for node in PEERS}
    assert ids == {"c-restored"}
    # Without an id each restore makes up its own, so members restored apart would refuse each other.
    assert restore(file, tmp_path / "a", "n1", PEERS) != restore(file, tmp_path / "b", "n1", PEERS)


def test_restore_refuses_a_non_empty_dir(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    file, _, _ = source
    data_dir = tmp_path / "n1"
    data_dir.mkdir()
    (data_dir / "cluster_id").write_text("c-someone-else\n")
    with pytest.raises(RestoreRefusedError, match=f"data directory {data_dir} is not empty"):
        restore(file, data_dir, "n1", PEERS)
    assert [p.name for p in data_dir.iterdir()] == ["cluster_id"]
    assert (data_dir / "cluster_id").read_text() == "c-someone-else\n"


def test_restore_refuses_a_node_outside_the_peers(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    with pytest.raises(RestoreRefusedError, match="'n9' is not one of the peers"):
        restore(source[0], tmp_path / "n9", "n9", PEERS)
    assert not (tmp_path / "n9").exists()


def test_restore_of_a_damaged_file_leaves_the_dir_as_found(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    damaged = truncated_copy(source[0], tmp_path / "damaged.snap")
    with pytest.raises(SnapshotCorruptError, match="truncated"):
        restore(damaged, tmp_path / "new", "n1", PEERS)
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotCorruptError, match="truncated"):
        restore(damaged, tmp_path / "empty", "n1", PEERS)
    assert list((tmp_path / "empty").iterdir()) == []


# ---- inspect ---------------------------------------------------------------------------------------

def test_inspect_reports_manifest_keys_and_checksum(source: tuple[Path, SnapshotManifest, str]) -> None:
    file, manifest, _ = source
    report = inspect(file)
    assert report["manifest"] == manifest.to_dict()
    assert report["checksum_ok"] is True and report["error"] is None
    assert report["key_count"] == manifest.key_count and report["key_count_matches"] is True
    assert report["key_count"] > 1000 and report["revision"] > 1000  # the data and its revision travel in the file


def test_inspect_reports_a_damaged_payload(tmp_path: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    damaged = truncated_copy(source[0], tmp_path / "damaged.snap")
    report = inspect(damaged)
    assert report["manifest"]["index"] == source[1].index
    assert report["checksum_ok"] is False and report["key_count"] is None
    assert "truncated" in report["error"] and str(damaged) in report["error"]


# ---- install into a follower's state ---------------------------------------------------------------

@pytest.fixture
def follower_state(tmp_path: Path) -> Path:
    """A follower's state directory with an older, different state."""
    state_dir = tmp_path / "follower" / "state"
    with KVStateMachine(state_dir, map_size=MAP_SIZE) as sm:
        apply_in_batches(sm, make_entries(100, term=1, keys=10))
    return state_dir


def assert_is_snapshot_state(state_dir: Path, manifest: SnapshotManifest, source_hash: str) -> None:
    with KVStateMachine(state_dir, map_size=MAP_SIZE) as sm:
        assert sm.applied_index == manifest.index and sm.state_hash() == source_hash
    assert sorted(p.name for p in state_dir.parent.iterdir()) == [state_dir.name]


def test_install_replaces_the_state(follower_state: Path, source: tuple[Path, SnapshotManifest, str]) -> None:
    file, manifest, source_hash = source
    assert install_into_state(file, follower_state) == manifest
    assert_is_snapshot_state(follower_state, manifest, source_hash)


def test_install_of_a_damaged_file_leaves_the_state(tmp_path: Path, follower_state: Path,
                                                    source: tuple[Path, SnapshotManifest, str]) -> None:
    damaged = tmp_path / "damaged.snap"
    data = bytearray(source[0].read_bytes())
    data[-50] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptError, match="checksum mismatch"):
        install_into_state(damaged, follower_state)
    with KVStateMachine(follower_state, map_size=MAP_SIZE) as sm:
        assert sm.applied_index == 100
    assert sorted(p.name for p in follower_state.parent.iterdir()) == ["state"]


class SimulatedCrash(Exception):
    pass


def crash_on_rename(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    """Make the `call`-th os.rename of install_into_state "crash" the process: nothing after it runs."""
    real = os.rename
    calls = [0]

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls[0] += 1
        if calls[0] == call:
            raise SimulatedCrash(f"crash before renaming {src} to {dst}")
        real(src, dst)

    monkeypatch.setattr(install.os, "rename", rename)


def test_crash_between_the_renames_rolls_forward(monkeypatch: pytest.MonkeyPatch, follower_state: Path,
                                                 source: tuple[Path, SnapshotManifest, str]) -> None:
    file, manifest, source_hash = source
    crash_on_rename(monkeypatch, call=2)  # old state is aside, the new one not yet in place
    with pytest.raises(SimulatedCrash):
        install_into_state(file, follower_state)
    monkeypatch.undo()
    assert not follower_state.exists()
    assert install.old_dir(follower_state).exists() and install.incoming_dir(follower_state).exists()
    recover_state_dir(follower_state)
    assert_is_snapshot_state(follower_state, manifest, source_hash)


def test_crash_before_the_swap_keeps_the_old_state(monkeypatch: pytest.MonkeyPatch, follower_state: Path,
                                                   source: tuple[Path, SnapshotManifest, str]) -> None:
    crash_on_rename(monkeypatch, call=1)
    with pytest.raises(SimulatedCrash):
        install_into_state(source[0], follower_state)
    monkeypatch.undo()
    recover_state_dir(follower_state)
    with KVStateMachine(follower_state, map_size=MAP_SIZE) as sm:
        assert sm.applied_index == 100
    assert sorted(p.name for p in follower_state.parent.iterdir()) == ["state"]


def test_partial_incoming_with_no_state_is_dropped(tmp_path: Path) -> None:
    state_dir = tmp_path / "node" / "state"
    incoming = install.incoming_dir(state_dir)
    incoming.mkdir(parents=True)
    (incoming / "data.mdb").write_bytes(b"half")
    recover_state_dir(state_dir)
    assert not state_dir.exists() and not incoming.exists()


def test_old_state_is_put_back_when_nothing_new_is_there(tmp_path: Path, follower_state: Path) -> None:
    os.rename(follower_state, install.old_dir(follower_state))
    recover_state_dir(follower_state)
    with KVStateMachine(follower_state, map_size=MAP_SIZE) as sm:
        assert sm.applied_index == 100


def test_recover_after_a_completed_swap_removes_the_old_dir(monkeypatch: pytest.MonkeyPatch, follower_state: Path,
                                                            source: tuple[Path, SnapshotManifest, str]) -> None:
    file, manifest, source_hash = source
    def crash(*args: object, **kwargs: object) -> None:
        raise SimulatedCrash("crash before the old state is removed")

    monkeypatch.setattr(install.shutil, "rmtree", crash)
    with pytest.raises(SimulatedCrash):
        install_into_state(file, follower_state)
    monkeypatch.undo()
    assert install.old_dir(follower_state).exists()
    recover_state_dir(follower_state)
    assert_is_snapshot_state(follower_state, manifest, source_hash)

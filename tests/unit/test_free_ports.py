"""kv.tools.cluster_up.free_ports: the ports local clusters, the integration tests and the fault suite listen on."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kv.tools import cluster_up
from kv.tools.cluster_up import FIRST_PICKED_PORT, free_ports


def test_ports_differ_are_free_and_lie_below_the_ephemeral_range() -> None:
    ports = free_ports(12)
    assert len(set(ports)) == 12
    floor = cluster_up._ephemeral_floor()
    if floor is not None:  # Linux: where the kernel never hands a port out for port 0
        assert all(FIRST_PICKED_PORT <= p < floor for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.skipif(cluster_up._ephemeral_floor() is None, reason="the kernel's ephemeral range is Linux's")
def test_without_room_below_the_range_the_kernel_chooses(tmp_path: Path, monkeypatch) -> None:
    real_floor = cluster_up._ephemeral_floor()
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text(f"{FIRST_PICKED_PORT + 10}\t60999\n")  # room for no more than 10 ports
    monkeypatch.setattr(cluster_up, "EPHEMERAL_RANGE_FILE", ranges)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(p >= real_floor for p in ports)  # the kernel's own picks

"""kv.tools.cluster_up.free_ports: the ports local clusters, the integration tests and the fault suite listen on."""
from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kv.tools import cluster_up
from kv.tools.cluster_up import (
    FIRST_PICKED_PORT, MEMBER_PORT_OFFSETS, child_env, free_port_block, free_ports, port_block, release_ports,
)


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


def trying_first(port: int, monkeypatch) -> None:
    """free_ports tries `port` before its random picks."""
    sample = random.sample
    monkeypatch.setattr(random, "sample", lambda population, k: [port, *sample(population, k)])


# Holds the reservation of one port free_ports handed it until its stdin closes.
_HOLDER = """
import sys
from kv.tools.cluster_up import free_ports
print(free_ports(1)[0], flush=True)
sys.stdin.read()
"""


@contextmanager
def another_process_holding_a_port() -> Iterator[int]:
    """Another test run on the same machine, holding the reservation of the port it yields (its
    member may bind it seconds later) until the block ends; then it exits, and the kernel drops
    its reservation."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=child_env(), text=True)
    try:
        yield int(holder.stdout.readline())  # type: ignore[union-attr]
    finally:
        holder.communicate("", timeout=60)


@pytest.mark.skipif(cluster_up._ephemeral_floor() is None, reason="the kernel's ephemeral range is Linux's")
def test_a_port_another_process_was_handed_is_not_handed_out_until_that_process_ends(monkeypatch) -> None:
    with another_process_holding_a_port() as theirs:
        trying_first(theirs, monkeypatch)
        (mine,) = free_ports(1)
        assert mine != theirs
        release_ports([mine])
    assert free_ports(1) == [theirs]  # that process ended
    release_ports([theirs])


@pytest.mark.skipif(cluster_up._ephemeral_floor() is None, reason="the kernel's ephemeral range is Linux's")
def test_a_port_is_handed_out_once_until_it_is_released(monkeypatch) -> None:
    (port,) = free_ports(1)
    trying_first(port, monkeypatch)
    (other,) = free_ports(1)
    assert other != port  # still reserved: a stopped member of ours may bind it again
    release_ports([port, other])
    assert free_ports(1) == [port]
    release_ports([port])


@pytest.mark.skipif(cluster_up._ephemeral_floor() is None, reason="the kernel's ephemeral range is Linux's")
def test_a_port_block_is_free_reserved_and_misses_a_port_another_process_holds(monkeypatch) -> None:
    # `cluster up --base-port` in a test: its ports must not collide with another suite's members.
    with another_process_holding_a_port() as theirs:
        top = cluster_up._ephemeral_floor() - max(MEMBER_PORT_OFFSETS) - 3  # type: ignore[operator]
        blocked = next(theirs - offset for offset in MEMBER_PORT_OFFSETS if FIRST_PICKED_PORT <= theirs - offset < top)
        trying_first(blocked, monkeypatch)  # the first base tried is one whose block holds their port
        base = free_port_block(3, MEMBER_PORT_OFFSETS)
        ports = port_block(base, 3, MEMBER_PORT_OFFSETS)
        assert base != blocked and theirs not in ports and len(set(ports)) == 3 * len(MEMBER_PORT_OFFSETS)
        for port in ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        trying_first(ports[0], monkeypatch)
        (other,) = free_ports(1)
        assert other != ports[0]  # reserved for the block's taker until released
        release_ports([*ports, other])

"""Speaking a member's peer port by hand (raft/transport/peer_protocol.py), for tests that must
send what a real member never would."""
from __future__ import annotations

import socket
import struct

from raftkv_proto import raft_pb2
from raft.node.ports import ClientAddresses
from raft.transport.frames import frame
from raft.transport.peer_protocol import MESSAGES, hello
from tests.integration.cluster import Cluster


def connect(cluster: Cluster, node_id: str) -> socket.socket:
    host, _, port = cluster.nodes[node_id].peer_address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=5)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """recv may return part of what was sent; b"" (closed) before n bytes fails the test."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes:
    (length,) = struct.unpack(">I", recv_exactly(sock, 4))
    assert length < 64 << 10, f"a frame of {length} bytes"
    return recv_exactly(sock, length)


def assert_closed(sock: socket.socket) -> None:
    """The node closed the connection after its last frame (a timeout here fails the test)."""
    assert sock.recv(1) == b"", "the node kept the connection open"


def hello_frame(cluster_id: str, from_id: str, to_id: str, purpose: int = MESSAGES) -> bytes:
    """A hello that tells no client address, so the node keeps the one the real member told."""
    return frame(hello(cluster_id, from_id, to_id, ClientAddresses(""), purpose).SerializeToString())


def say_hello(sock: socket.socket, cluster_id: str, from_id: str, to_id: str,
              purpose: int = MESSAGES) -> raft_pb2.PeerHelloReply:
    sock.sendall(hello_frame(cluster_id, from_id, to_id, purpose))
    return raft_pb2.PeerHelloReply.FromString(read_frame(sock))


def heartbeat_batch(from_id: str, to: str, term: int) -> bytes:
    """A frame of one heartbeat from a far higher term: accepted, it would depose the leader."""
    message = raft_pb2.PeerMessage(src=from_id, dst=to, term=term,
                                   heartbeat_request=raft_pb2.HeartbeatRequest(commit_index=0, seq=1))
    return frame(raft_pb2.MessageBatch(messages=[message]).SerializeToString())

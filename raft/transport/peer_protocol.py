"""The wire protocol on a member's peer port, and the checks each side makes.

Length-prefixed frames (raft/transport/frames.py) on TCP, or on TLS when the members run with
--peer-cert-file (raft/transport/peer_tls.py: the handshake, and the check that each side's
certificate names the member it claims to be, come before the hello), each frame one serialized
message of raft.proto. A dialer opens a connection for one purpose:

    dialer                                          listener
    PeerHello(cluster_id, from_id, to_id,  ------>  checks the cluster id, that from_id is a member
              client_address, purpose)              and that to_id is itself
                                           <------  PeerHelloReply(refusal) and close, or
                                                    PeerHelloReply(node_id, client_address)
    MESSAGES: MessageBatch, MessageBatch, ... --->  each message from from_id to to_id, delivered
                                           <------  (if the hello's ack_within_ms asked, and the reply
                                                    said acks) an empty frame within ack_within_ms of
                                                    each batch received: all up to it arrived
                                           <------  (only on a bad batch, or when a newer MESSAGES
                                                    connection from from_id is accepted) Refusal,
                                                    and close
    SNAPSHOT: SnapshotHeader, SnapshotChunk ... ->  handed to the node chunk by chunk
                                           <------  SnapshotAck, and close
    PROBE: nothing more; the reply (which tells the listener's term and the end of its log) was
    the answer, and the listener closes. A rejoining member asks it (raft/node/joining.py), and
    every member asks each peer every few seconds to time the hello's round trip
    (etcd_network_peer_round_trip_time_seconds, raft/transport/peer_links.py)

The dialer sends nothing after its hello until the answer comes. Both sides tell their advertised
client address in the handshake: that is how a node learns what to put in not-leader hints and
status for the other members (raft.node.ports.PeerTransport.client_address).

Why plain TCP and not gRPC: every gRPC message crosses gRPC's poller thread and the event loop at
both ends. Two Python processes exchange a gRPC stream message in about 0.30 ms and a TCP frame on
uvloop in about 0.06 ms; a replicated write waits for two such messages, a linearizable read's
round for two more."""
from __future__ import annotations

import socket
from collections.abc import Collection

from google.protobuf.message import DecodeError

from raft.node.ports import ClientAddresses
from raftkv_proto import raft_pb2

MESSAGES = raft_pb2.MESSAGES
SNAPSHOT = raft_pb2.SNAPSHOT
PROBE = raft_pb2.PROBE
PURPOSES = {MESSAGES: "messages", SNAPSHOT: "snapshot", PROBE: "probe"}

# Largest frame after an accepted hello: a push carries up to max_batch_bytes of entries (1 MiB
# by default), a batch may hold several pushes, a snapshot chunk is snapshot_chunk_bytes.
MAX_FRAME_BYTES = 64 << 20
# Largest hello, and largest answer a dialer reads: a connection not yet known to come from a
# member cannot make the node buffer more than this.
MAX_HELLO_BYTES = 64 << 10

# A connection whose peer vanished without a FIN or RST (host down, cable out) is dropped after
# about this long: TCP keepalive probes an idle one, TCP_USER_TIMEOUT bounds unacknowledged data.
DEAD_PEER_TIMEOUT_S = 5

# What an HTTP/2 client (gRPC) sends first: a client pointed at a peer port by mistake.
_HTTP2_PREFACE = b"PRI * HTTP/2.0"
# The first bytes of a TLS record: its type (alert 21, handshake 22) and major version 3.
_TLS_RECORD_TYPES = (21, 22)


class PeerRefused(Exception):
    """Why a connection, or what came on it, was refused: a reason a person can act on."""


def configure_peer_socket(sock: socket.socket | None) -> None:
    """No Nagle delay (asyncio sets TCP_NODELAY already; said here so it never depends on that),
    and a dead peer noticed within DEAD_PEER_TIMEOUT_S where the platform allows."""
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", DEAD_PEER_TIMEOUT_S - 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2),
                        ("TCP_USER_TIMEOUT", DEAD_PEER_TIMEOUT_S * 1000)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def hello(cluster_id: str, from_id: str, to_id: str, client: ClientAddresses, purpose: int,
          peer_address: str = "") -> raft_pb2.PeerHello:
    return raft_pb2.PeerHello(cluster_id=cluster_id, from_id=from_id, to_id=to_id, client_address=client.grpc,
                              client_http_address=client.http, purpose=purpose,
                              peer_address=peer_address)  # type: ignore[arg-type]


def not_a_peer(received: bytes, why: str) -> str:
    """The refusal of a connection whose first bytes (`received`) are no hello: `why`, or what a
    gRPC client that was given a peer address needs to hear."""
    if received.startswith(_HTTP2_PREFACE):
        return ("this is a raftkv peer port and a gRPC client connected to it: clients connect to a "
                "member's client address (--listen / --advertise-client)")
    if looks_like_tls(received):
        return ("this member's peer port speaks plaintext and a TLS client connected to it: give every "
                "member --peer-cert-file, or none")
    return why


def looks_like_tls(received: bytes) -> bool:
    """Whether the bytes start as a TLS record does (a ClientHello, or an alert)."""
    return len(received) >= 3 and received[0] in _TLS_RECORD_TYPES and received[1] == 3


def parse_hello(body: bytes) -> raft_pb2.PeerHello:
    try:
        return raft_pb2.PeerHello.FromString(body)
    except DecodeError as e:
        raise PeerRefused(f"malformed hello: {e}") from None


class RemovedMember(PeerRefused):
    """The dialer was removed from the cluster: it should stop (PeerHelloReply.removed)."""


def check_hello(h: raft_pb2.PeerHello, cluster_id: str, node_id: str, removed: Collection[str]) -> None:
    """PeerRefused unless `h` comes from our cluster, meant for us, for a purpose, from a member
    not removed (RemovedMember). A member id this node does not know yet is taken at its word:
    its configuration may lag the cluster's (the cluster id, and with TLS the certificate, say
    who may connect)."""
    if h.cluster_id != cluster_id:
        raise PeerRefused(f"wrong cluster id: got {h.cluster_id!r}, this cluster is {cluster_id!r}")
    if not h.from_id:
        raise PeerRefused("a hello with no member id")
    if h.from_id in removed:
        raise RemovedMember(f"{h.from_id} was removed from this cluster: it is no member any more "
                            f"(stop it; to bring it back, add it again under a new id with an empty data directory)")
    if h.to_id != node_id:
        raise PeerRefused(f"message for {h.to_id!r} reached {node_id!r}: check --peers addresses")
    if h.from_id == node_id:
        raise PeerRefused(f"a connection from {node_id!r} to itself: do two members run with id {node_id!r}?")
    if h.purpose not in PURPOSES:
        raise PeerRefused(f"a hello for no known purpose ({h.purpose})")


def check_reply(reply_body: bytes, to_id: str, address: str) -> raft_pb2.PeerHelloReply:
    """The listener's answer to our hello; PeerRefused with its reason when it refused us, or
    when what came back is not an answer from `to_id`."""
    try:
        reply = raft_pb2.PeerHelloReply.FromString(reply_body)
    except DecodeError:
        reply = None
    if reply is None or not (reply.refusal or reply.node_id):
        raise PeerRefused(f"{address} does not answer as a raftkv peer: is it {to_id}'s peer address "
                          f"(--listen-peer), not its client one?")
    if reply.refusal:
        raise (RemovedMember if reply.removed else PeerRefused)(reply.refusal)
    if reply.node_id != to_id:
        raise PeerRefused(f"{address} answers as {reply.node_id!r}, not {to_id!r}: check --peers addresses")
    return reply

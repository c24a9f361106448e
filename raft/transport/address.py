"""Network addresses as the command line writes them: "host:port", "[v6]:port"."""
from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host as written, port). ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad address {address!r}: expected host:port")
    return host, int(port)


def socket_host(host: str) -> str | None:
    """A host as written ("[::1]", "", "0.0.0.0") as socket calls take it: no brackets, and None
    (every interface) for an empty one."""
    return host.strip("[]") or None


# A member started alone (no --peers, no --listen-peer) takes peers, once it has any, on its client
# port + this (7001 -> 7101), as `raftkv cluster up` lays members out.
LONE_PEER_PORT_OFFSET = 100

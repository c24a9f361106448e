"""The metrics listener (`--listen-metrics-urls http://HOST:PORT`, etcd's flag): a small HTTP/1.1
server on the node's own event loop, so a scrape reads the node between two of its steps and needs
no thread or lock. It serves

- GET /metrics   Prometheus' text format (kv/server/metrics.py);
- GET /health    etcd's JSON, {"health":"true","reason":""}, status 200, or "false" with the reason
                 and 503 (kv/server/health.py's rule); ?exclude=NOSPACE (repeatable) leaves that
                 alarm type out, as etcd's;
- GET /readyz    Kubernetes' readiness probe: the same rule; "ok" (200) or the reason (503);
- GET /livez     Kubernetes' liveness probe: "ok" (200) whenever the process answers at all.

One request per connection (Connection: close): probes and scrapes come every few seconds."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from kv.server.health import Health
from kv.server.metrics import HealthCounts

log = logging.getLogger(__name__)

# A request line and headers larger than this are refused (no probe sends that much).
MAX_REQUEST_BYTES = 16 << 10
READ_TIMEOUT_S = 5.0


def parse_metrics_urls(urls: str) -> list[tuple[str, int]]:
    """`--listen-metrics-urls`: comma-separated http://HOST:PORT; (host, port) of each. Raises
    ValueError on anything else (https is not offered: put a TLS proxy in front)."""
    listeners = []
    for url in filter(None, (u.strip() for u in urls.split(","))):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
            raise ValueError(f"listen_metrics_urls: {url!r} is not http://HOST:PORT")
        listeners.append((parts.hostname, parts.port))
    return listeners


@dataclass(slots=True)
class _Reply:
    status: int
    content_type: str
    body: bytes


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 503: "Service Unavailable"}


class HttpEndpoints:
    def __init__(self, listeners: list[tuple[str, int]], registry: CollectorRegistry,
                 health: Callable[[frozenset[str]], Health],
                 counts: HealthCounts) -> None:
        self._listeners = listeners
        self._registry = registry
        self._health = health
        self._counts = counts
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        for host, port in self._listeners:
            try:
                self._servers.append(await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST_BYTES))
            except OSError as e:
                await self.stop()
                raise OSError(e.errno, f"cannot serve metrics on {host}:{port} (--listen-metrics-urls): "
                                       f"{e.strerror}") from None

    @property
    def addresses(self) -> list[str]:
        """host:port of each listener (the bound port, when 0 was asked)."""
        return [f"{s.sockets[0].getsockname()[0]}:{s.sockets[0].getsockname()[1]}" for s in self._servers]

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            reply = self._route(head.split(b"\r\n", 1)[0].decode("latin-1"))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        writer.write(f"HTTP/1.1 {reply.status} {_REASONS[reply.status]}\r\nContent-Type: {reply.content_type}\r\n"
                     f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n".encode() + reply.body)
        try:
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _route(self, request_line: str) -> _Reply:
        words = request_line.split(" ")
        if len(words) != 3:
            return _Reply(400, "text/plain", b"bad request\n")
        method, target, _ = words
        if method != "GET":
            return _Reply(405, "text/plain", b"only GET\n")
        parts = urlsplit(target)
        path, exclude = parts.path, frozenset(parse_qs(parts.query).get("exclude", ()))
        if path == "/metrics":
            return _Reply(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        if path == "/health":
            return self._health_json(exclude)
        if path == "/readyz":
            health = self._health(exclude)
            return _Reply(200 if health.healthy else 503, "text/plain",
                          b"ok\n" if health.healthy else f"{health.reason}\n".encode())
        if path == "/livez":
            return _Reply(200, "text/plain", b"ok\n")
        return _Reply(404, "text/plain", b"not found: /metrics, /health, /readyz, /livez\n")

    def _health_json(self, exclude: frozenset[str]) -> _Reply:
        health = self._health(exclude)
        if health.healthy:
            self._counts.success += 1
        else:
            self._counts.failures += 1
        body = json.dumps({"health": "true" if health.healthy else "false", "reason": health.reason})
        return _Reply(200 if health.healthy else 503, "application/json", body.encode())
